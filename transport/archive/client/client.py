"""The Aeron Archive client over the project's transport: the thin I/O around
:class:`~.session.ControlSession`.

    with ArchiveClient.connect("aeron:udp?endpoint=archive-host:8010") as archive:
        for r in archive.list_recordings_for_uri("aeron:udp", 1001):
            ...
        for block in archive.replay(r.recording_id, r.start_position, r.stop_position):
            ...  # raw DATA frames, exactly [start, stop)

Requests go out on a publication to the archive's control request channel; responses come back
on a subscription of ours (``response_channel``, by default a UDP endpoint on the local address
that routes to the archive, port chosen by the OS) that the archive publishes to. Every wait is
bounded by ``timeout_s`` (an unanswered request, a replay without progress) and sleeps on the
subscription, never spins; keep-alives go out while a call waits. One client is for one thread.

Without a ``driver`` the client uses one in-process driver per process (:func:`process_driver`),
shared by every client of the process (a Spark Python worker reuses it between tasks).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client import codecs
from aeron_spark.transport.archive.client.credentials import ArchiveCredentials
from aeron_spark.transport.archive.client.errors import (
    ArchiveClientError,
    ArchiveReplayError,
    ArchiveReplicationError,
    ArchiveResponseError,
    ArchiveSessionClosedError,
    ArchiveTimeoutError,
    ArchiveUnknownReplicationError,
)
from aeron_spark.transport.archive.client.session import (
    ControlConfig,
    ControlSession,
    Pending,
    RecordingDescriptor,
    RecordingSignal,
    ReplicationStatus,
    SignalEvent,
)
from aeron_spark.transport.driver.driver import Driver, DriverConfig
from aeron_spark.transport.errors import OfferError
from aeron_spark.transport.protocol.frames import SESSION_ID_OFFSET, STREAM_ID_OFFSET
from aeron_spark.transport.protocol.term import FragmentAssembler, Header
from aeron_spark.transport.uri import ChannelConfig

DEFAULT_CONTROL_STREAM_ID = 10
DEFAULT_RESPONSE_STREAM_ID = 20
DEFAULT_REPLAY_STREAM_ID = 1101
# The receiver window a replay subscription advertises (its SMs' ``rcv-wnd``). A replay is a bulk
# transfer from a sender we do not schedule: with the transport's default 128 KiB window the
# archive runs out of window after ~90 datagrams and waits for our next SM, so every delay of
# our receiver thread (a GIL hand-off, a busy CPU) or of the archive's idle sleep stops the
# replay. 1 MiB fits the driver's default 2 MiB socket buffer (the window is capped at what the
# socket holds, and at half the recording's term length).
DEFAULT_REPLAY_WINDOW = 1 << 20
MIN_REPLAY_WINDOW = 64 * 1024
MAX_REPLAY_WINDOW = 64 << 20
LIST_PAGE = 1000  # descriptors asked for per listing request
_NS = 1_000_000_000
_SESSION_ID_AT = SESSION_ID_OFFSET  # in a DATA frame header
_STREAM_ID_AT = STREAM_ID_OFFSET
_PATCH_AT_ONCE = 16  # frames of one length from which patch_frames uses numpy

_driver_lock = threading.Lock()
_driver: tuple[int, Driver] | None = None


def process_driver() -> Driver:
    """This process's in-process driver for archive clients (started on first use, closed at
    exit; a forked child gets its own)."""
    global _driver
    with _driver_lock:
        if _driver is not None and _driver[0] == os.getpid():
            return _driver[1]
        # A name only: the driver makes its directory when a channel needs files (IPC, which
        # archive clients do not use), so a process that ends without running atexit (Spark's
        # Python workers end with os._exit, a killed peer) leaves nothing in the temporary
        # directory. 64 random bits: nobody else can create it first.
        pid = os.getpid()
        directory = os.path.join(
            tempfile.gettempdir(), f"aeron-archive-client-{pid}-{secrets.token_hex(8)}"
        )
        driver = Driver(DriverConfig(directory=Path(directory), write_counters_file=False)).start()
        _driver = (pid, driver)
        atexit.register(_close_process_driver, driver, directory, pid)
        return driver


def _close_process_driver(driver: Driver, directory: str, pid: int) -> None:
    """At exit: close the driver and remove its directory if a channel made one (a forked
    child that exits normally runs its parent's atexit handlers: it leaves them alone)."""
    if os.getpid() != pid:
        return
    try:
        driver.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def local_address_towards(host: str, port: int) -> str:
    """The local IP address the kernel would send from to reach ``host:port`` (no packet is
    sent: a UDP socket is connected, then asked for its name)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port or 9))
            return str(s.getsockname()[0])
        except OSError:
            return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def _endpoint_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class ArchiveClientConfig:
    """Where the archive is and how long to wait for it (validated)."""

    control_channel: str
    control_stream_id: int = DEFAULT_CONTROL_STREAM_ID
    response_host: str | None = None  # our address the archive sends to (None: found)
    response_stream_id: int = DEFAULT_RESPONSE_STREAM_ID
    timeout_s: float = 10.0
    keepalive_interval_s: float = 1.0
    # how long connect() waits for the archive (None: timeout_s); a set of replicas probes each
    # archive for less than a request may take, so a dead one costs little
    connect_timeout_s: float | None = None
    # a replay whose archive sends nothing at all (no data, none of the heartbeats its driver
    # sends an idle publication every 100 ms) this long fails then, not after timeout_s: its
    # driver is gone or cut off, while a slow archive still sends heartbeats (None: off)
    silence_timeout_s: float | None = None
    replay_window: int = DEFAULT_REPLAY_WINDOW  # bytes; see DEFAULT_REPLAY_WINDOW
    # for an archive that authenticates (bytes / str are taken as the encoded credentials);
    # left out of repr, and never put in an error or a log
    credentials: ArchiveCredentials | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "credentials", ArchiveCredentials.of(self.credentials))
        config = ChannelConfig.from_uri(self.control_channel)  # raises ChannelError
        if config.media != "udp" or config.endpoint is None:
            raise ConfigurationError(
                "archive",
                self.control_channel,
                "the archive's UDP control request channel, e.g. aeron:udp?endpoint=host:8010",
            )
        if not isinstance(self.timeout_s, int | float) or self.timeout_s <= 0:
            raise ConfigurationError("timeout_s", self.timeout_s, "a positive number of seconds")
        if self.connect_timeout_s is not None and (
            not isinstance(self.connect_timeout_s, int | float) or self.connect_timeout_s <= 0
        ):
            raise ConfigurationError(
                "connect_timeout_s", self.connect_timeout_s, "a positive number of seconds"
            )
        if self.silence_timeout_s is not None and (
            not isinstance(self.silence_timeout_s, int | float) or self.silence_timeout_s <= 0
        ):
            raise ConfigurationError(
                "silence_timeout_s", self.silence_timeout_s, "a positive number of seconds"
            )
        if not isinstance(self.keepalive_interval_s, int | float) or self.keepalive_interval_s <= 0:
            raise ConfigurationError(
                "keepalive_interval_s", self.keepalive_interval_s, "a positive number of seconds"
            )
        if (
            not isinstance(self.replay_window, int)
            or isinstance(self.replay_window, bool)
            or not MIN_REPLAY_WINDOW <= self.replay_window <= MAX_REPLAY_WINDOW
        ):
            raise ConfigurationError(
                "replay_window",
                self.replay_window,
                f"a byte count from {MIN_REPLAY_WINDOW} to {MAX_REPLAY_WINDOW}",
            )

    def replay_subscription_channel(self, host: str, port: int) -> str:
        """The channel a replay is received on: ``host:port`` with the replay window (and a
        socket receive buffer at least as large, so a window's burst is not dropped)."""
        window = self.replay_window
        return (
            f"aeron:udp?endpoint={_endpoint_text(host, port)}|rcv-wnd={window}|so-rcvbuf={window}"
        )

    @property
    def archive_address(self) -> tuple[str, int]:
        endpoint = ChannelConfig.from_uri(self.control_channel).endpoint
        assert endpoint is not None
        return endpoint.host, endpoint.port

    def local_host(self) -> str:
        return self.response_host or local_address_towards(*self.archive_address)


@dataclass(frozen=True, slots=True)
class ReplicationParams:
    """How a replication runs (Java's ``ReplicationParams``; -1 / "" are "not set").

    * ``stop_position``: replicate up to here (a frame boundary), not to the source's end;
    * ``dst_recording_id``: extend this stopped recording of the destination archive (it
      must be a prefix of the source: the replay starts at its stop position) instead of making
      a new one;
    * ``live_destination``: for an active source recorded from a multi-destination channel, the
      destination channel on which the destination archive joins the live stream once the
      replay has caught up (MERGE signal); the replay then stops;
    * ``channel_tag_id`` / ``subscription_tag_id``: tags of the destination's recording
      subscription (multi-destination, manual control);
    * ``replication_channel``: the channel the source replays to (default: the destination
      archive's ``aeron.archive.replication.channel``);
    * ``src_response_channel``: the response channel the destination archive uses as a client
      of the source;
    * ``file_io_max_length``, ``replication_session_id``: as Java's;
    * ``credentials``: what the destination archive sends when it connects to a source that
      authenticates (no challenge: the archive's replication cannot answer one). Never in repr.
    """

    stop_position: int = codecs.NULL_VALUE
    dst_recording_id: int = codecs.NULL_VALUE
    live_destination: str = ""
    replication_channel: str = ""
    channel_tag_id: int = codecs.NULL_VALUE
    subscription_tag_id: int = codecs.NULL_VALUE
    file_io_max_length: int = codecs.NULL_VALUE
    replication_session_id: int = codecs.NULL_VALUE
    src_response_channel: str = ""
    credentials: ArchiveCredentials | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "credentials", ArchiveCredentials.of(self.credentials))
        for name in ("stop_position", "dst_recording_id", "channel_tag_id", "subscription_tag_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ConfigurationError(name, value, "an int64 >= 0, or -1 for none")
        for name in ("file_io_max_length", "replication_session_id"):
            value = getattr(self, name)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not -(1 << 31) <= value < 1 << 31
            ):
                raise ConfigurationError(name, value, "an int32, or -1 for none")
        for name in ("live_destination", "replication_channel", "src_response_channel"):
            value = getattr(self, name)
            if not isinstance(value, str) or value and not value.startswith("aeron:"):
                raise ConfigurationError(name, value, 'an aeron: channel URI, or "" for none')


@dataclass(frozen=True, slots=True)
class ReplayedBlock:
    """Whole raw DATA frames of a replay covering ``[position, end_position)``."""

    position: int
    data: bytes
    end_position: int


class ArchiveClient:
    """A connected control session (see the module docstring). Use :meth:`connect`."""

    def __init__(self, config: ArchiveClientConfig, driver: Driver | None = None) -> None:
        self.config = config
        self.driver = driver or process_driver()
        self._host = config.local_host()
        self._response_sub = self.driver.add_subscription(
            f"aeron:udp?endpoint={_endpoint_text(self._host, 0)}", config.response_stream_id
        )
        port = self._response_sub.local_endpoints[0][1]
        self.response_channel = f"aeron:udp?endpoint={_endpoint_text(self._host, port)}"
        self.session = ControlSession(
            ControlConfig(
                self.response_channel,
                config.response_stream_id,
                message_timeout_ns=int(config.timeout_s * _NS),
                keepalive_interval_ns=int(config.keepalive_interval_s * _NS),
                credentials=config.credentials,
            )
        )
        self._assembler = FragmentAssembler(self._on_fragment)
        self._publication: Any = None
        self._response_image: Any = None
        self._closed = False

    # -------------------------------------------------------------- lifecycle

    @classmethod
    def connect(
        cls,
        control_channel: str | ArchiveClientConfig,
        driver: Driver | None = None,
        **settings: Any,
    ) -> ArchiveClient:
        """Connect to the archive whose control request channel is ``control_channel``."""
        config = (
            control_channel
            if isinstance(control_channel, ArchiveClientConfig)
            else ArchiveClientConfig(control_channel, **settings)
        )
        client = cls(config, driver)
        try:
            client._connect()
        except BaseException:
            client.close()
            raise
        return client

    def _connect(self) -> None:
        cfg = self.config
        wait_s = cfg.timeout_s if cfg.connect_timeout_s is None else cfg.connect_timeout_s
        deadline = time.monotonic() + wait_s
        self._publication = self.driver.add_publication(cfg.control_channel, cfg.control_stream_id)
        if not self._publication.wait_until_connected(wait_s):
            raise ArchiveTimeoutError(
                f"no archive answered on {cfg.control_channel} (stream {cfg.control_stream_id}) "
                f"within {wait_s} s",
                timeout_ms=int(wait_s * 1000),
            )
        self._offer(self.session.connect(time.monotonic_ns()))
        while not self.session.connect_result():
            self._service(deadline)
            if time.monotonic() > deadline + wait_s:  # belt and braces
                raise ArchiveTimeoutError(
                    "the archive did not answer the connect", timeout_ms=int(wait_s * 1000)
                )

    def close(self) -> None:
        """Close the control session (best effort) and release the publication and
        subscription. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            data = self.session.close()
            if data is not None and self._publication is not None:
                self._publication.offer(data)
        finally:
            if self._publication is not None:
                self._publication.close()
            self._response_sub.close()

    def __enter__(self) -> ArchiveClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def control_session_id(self) -> int:
        return self.session.control_session_id

    @property
    def archive_version(self) -> int:
        return self.session.archive_version

    # -------------------------------------------------------------- I/O

    def _offer(self, data: bytes) -> None:
        try:
            self._publication.offer_blocking(data, timeout_s=self.config.timeout_s)
        except OfferError as exc:
            self.session.lost(f"requests cannot reach the archive ({exc})")
            raise ArchiveSessionClosedError(
                f"cannot send to the archive at {self.config.control_channel}: {exc}"
            ) from exc

    def _on_fragment(self, payload: memoryview, header: Header) -> None:
        self.session.on_message(payload, time.monotonic_ns())

    def _send_outbox(self) -> None:
        for data in self.session.take_outbox():
            self._offer(data)

    def _service(self, deadline: float) -> None:
        """One round: poll responses, keep-alive and time-outs, then sleep until something
        arrives or the next deadline; raises :class:`ArchiveTimeoutError` past ``deadline``."""
        if self._response_sub.poll(self._assembler, 64):
            self._send_outbox()
            return
        now_ns = time.monotonic_ns()
        keepalive = self.session.on_tick(now_ns)
        if keepalive is not None:
            self._offer(keepalive)
        self._check_response_image()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.session.on_tick(time.monotonic_ns() + int(self.config.timeout_s * _NS) + 1)
            return
        wake = (self.session.next_deadline_ns() - now_ns) / _NS
        self._response_sub.wait(max(0.001, min(remaining, wake, 0.25)))

    def _check_response_image(self) -> None:
        images = self._response_sub.images
        if self._response_image is None:
            if images:
                self._response_image = images[0]
            return
        if self._response_image.is_closed and not images:
            self.session.lost("lost: the archive's response stream went away")

    def _check_silence(self, what: str) -> None:
        """With ``silence_timeout_s``: raise :class:`ArchiveTimeoutError` once the archive's
        response stream has carried nothing, not even a heartbeat, that long (its driver is gone
        or cut off; a busy archive's driver still sends heartbeats)."""
        silence = self.config.silence_timeout_s
        image = self._response_image
        if silence is None or image is None:
            return
        last = image.last_packet_ns
        if last is None:
            return
        quiet_s = (time.monotonic_ns() - last) / _NS
        if quiet_s > silence:
            raise ArchiveTimeoutError(
                f"{what} got no answer: the archive sent nothing, not even a heartbeat, for "
                f"{quiet_s:.1f} s",
                timeout_ms=int(silence * 1000),
            )

    def _await(self, pending: Pending) -> Any:
        deadline = time.monotonic() + self.config.timeout_s
        silent = self.config.silence_timeout_s is not None
        while not pending.done and pending.error is None:
            self._service(deadline)
            if silent and not pending.done and pending.error is None:
                self._check_silence(pending.name)
            if time.monotonic() > deadline + self.config.timeout_s:  # belt and braces
                raise ArchiveTimeoutError(
                    f"{pending.name} got no answer", timeout_ms=int(self.config.timeout_s * 1000)
                )
        return pending.value()

    def _call(self, name: str, *, kind: str = "single", count: int = 0, **fields: Any) -> Any:
        if self._closed:
            raise ArchiveSessionClosedError(f"cannot send {name}: the client is closed")
        pending, data = self.session.request(
            name, time.monotonic_ns(), kind=kind, count=count, **fields
        )
        self._offer(data)
        return self._await(pending)

    def keep_alive(self) -> None:
        """Send a keep-alive now (calls that wait send them by themselves)."""
        self._offer(self.session.keepalive(time.monotonic_ns()))

    def poll(self) -> int:
        """Read what the archive sent (signals), send a keep-alive if due; never blocks."""
        count = self._response_sub.poll(self._assembler, 64)
        self._send_outbox()
        keepalive = self.session.on_tick(time.monotonic_ns())
        if keepalive is not None:
            self._offer(keepalive)
        self._check_response_image()
        return count

    # -------------------------------------------------------------- queries

    def archive_id(self) -> int:
        return int(self._call("ArchiveIdRequest"))

    def list_recordings(
        self, from_recording_id: int = 0, count: int | None = None
    ) -> list[RecordingDescriptor]:
        """Descriptors of recordings from ``from_recording_id`` on (all when ``count`` is
        None), in recording id order."""
        return self._pages("ListRecordingsRequest", from_recording_id, count)

    def list_recordings_for_uri(
        self,
        channel_fragment: str,
        stream_id: int,
        from_recording_id: int = 0,
        count: int | None = None,
    ) -> list[RecordingDescriptor]:
        """Recordings of ``stream_id`` whose (stripped) channel contains ``channel_fragment``."""
        return self._pages(
            "ListRecordingsForUriRequest",
            from_recording_id,
            count,
            streamId=stream_id,
            channel=channel_fragment,
        )

    def _pages(self, name: str, start: int, count: int | None, **fields: Any) -> list:
        out: list[RecordingDescriptor] = []
        next_id = start
        while count is None or len(out) < count:
            ask = LIST_PAGE if count is None else min(LIST_PAGE, count - len(out))
            page = self._call(
                name, kind="listing", count=ask, fromRecordingId=next_id, recordCount=ask, **fields
            )
            out.extend(page)
            if len(page) < ask:
                break
            next_id = page[-1].recording_id + 1
        return out

    def list_recording(self, recording_id: int) -> RecordingDescriptor | None:
        """One recording's descriptor, or None when the archive has no such recording."""
        return self._call("ListRecordingRequest", kind="one", recordingId=recording_id)

    def recording_position(self, recording_id: int) -> int:
        """Position recorded so far of an active recording; -1 when it is not active."""
        return int(self._call("RecordingPositionRequest", recordingId=recording_id))

    def stop_position(self, recording_id: int) -> int:
        """Where a stopped recording ends; -1 while it is active."""
        return int(self._call("StopPositionRequest", recordingId=recording_id))

    def max_recorded_position(self, recording_id: int) -> int:
        """The recording's end: its recorded position if active, its stop position if not."""
        return int(self._call("MaxRecordedPositionRequest", recordingId=recording_id))

    def start_position(self, recording_id: int) -> int:
        """The first position of the recording still held (moves up with purges)."""
        return int(self._call("StartPositionRequest", recordingId=recording_id))

    # -------------------------------------------------------------- recording

    def start_recording(
        self, channel: str, stream_id: int, *, local: bool = False, auto_stop: bool = False
    ) -> int:
        """Record ``channel``/``stream_id`` (a remote publication unless ``local``); the
        recording subscription's id. The recording itself is announced by a START signal."""
        return int(
            self._call(
                "StartRecordingRequest2",
                streamId=stream_id,
                sourceLocation=codecs.LOCAL if local else codecs.REMOTE,
                autoStop=int(auto_stop),
                channel=channel,
            )
        )

    def stop_recording(self, channel: str, stream_id: int) -> None:
        self._call("StopRecordingRequest", streamId=stream_id, channel=channel)

    def stop_recording_subscription(self, subscription_id: int) -> None:
        self._call("StopRecordingSubscriptionRequest", subscriptionId=subscription_id)

    def stop_recording_by_identity(self, recording_id: int) -> bool:
        """Stop the active recording ``recording_id``; False if it was not active."""
        return bool(self._call("StopRecordingByIdentityRequest", recordingId=recording_id))

    def extend_recording(
        self,
        recording_id: int,
        channel: str,
        stream_id: int,
        *,
        local: bool = False,
        auto_stop: bool = False,
    ) -> int:
        """Append what ``channel``/``stream_id`` brings to the stopped recording
        ``recording_id`` (the publication must continue its positions); subscription id."""
        return int(
            self._call(
                "ExtendRecordingRequest2",
                recordingId=recording_id,
                streamId=stream_id,
                sourceLocation=codecs.LOCAL if local else codecs.REMOTE,
                autoStop=int(auto_stop),
                channel=channel,
            )
        )

    def truncate_recording(self, recording_id: int, position: int) -> None:
        """Cut a stopped recording back to ``position`` (a frame boundary)."""
        self._call("TruncateRecordingRequest", recordingId=recording_id, position=position)

    def purge_recording(self, recording_id: int) -> None:
        """Delete a stopped recording and its files."""
        self._call("PurgeRecordingRequest", recordingId=recording_id)

    def purge_segments(self, recording_id: int, new_start_position: int) -> int:
        """Delete the segment files below ``new_start_position`` (a segment boundary); the
        number of segments deleted."""
        return int(
            self._call(
                "PurgeSegmentsRequest",
                recordingId=recording_id,
                newStartPosition=new_start_position,
            )
        )

    # -------------------------------------------------------------- signals

    def poll_signals(self) -> list[SignalEvent]:
        """Recording signals received so far (and not yet returned)."""
        self.poll()
        out = list(self.session.signals)
        self.session.signals.clear()
        return out

    def wait_for_signal(
        self, match: Callable[[SignalEvent], bool], timeout_s: float | None = None
    ) -> SignalEvent:
        """The first signal ``match`` accepts (earlier ones are dropped from the queue)."""
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while True:
            while self.session.signals:
                event = self.session.signals.popleft()
                if match(event):
                    return event
            if time.monotonic() >= deadline:
                raise ArchiveTimeoutError(
                    f"no matching recording signal within {timeout} s",
                    timeout_ms=int(timeout * 1000),
                )
            self._service(deadline)

    # -------------------------------------------------------------- replication

    def replicate(
        self,
        src_recording_id: int,
        src_control_channel: str,
        src_control_stream_id: int = DEFAULT_CONTROL_STREAM_ID,
        params: ReplicationParams | None = None,
    ) -> int:
        """Ask this archive to replicate recording ``src_recording_id`` of the archive whose
        control request channel is ``src_control_channel`` (this archive connects to it, as a
        client of its own); the replication id. Progress comes as recording signals with that id
        as their correlation id (REPLICATE names the new destination recording, EXTEND when
        its recording starts, SYNC when caught up with a stopped source, MERGE when joined with
        the live stream, STOP, REPLICATE_END when over); a failure comes as an error the archive
        sends later. Both are collected per replication: :meth:`replication`,
        :meth:`wait_for_replication`."""
        p = params or ReplicationParams()
        replication_id = int(
            self._call(
                "ReplicateRequest2",
                srcRecordingId=src_recording_id,
                dstRecordingId=p.dst_recording_id,
                stopPosition=p.stop_position,
                channelTagId=p.channel_tag_id,
                subscriptionTagId=p.subscription_tag_id,
                srcControlStreamId=src_control_stream_id,
                fileIoMaxLength=p.file_io_max_length,
                replicationSessionId=p.replication_session_id,
                srcControlChannel=src_control_channel,
                liveDestination=p.live_destination,
                replicationChannel=p.replication_channel,
                encodedCredentials=b"" if p.credentials is None else p.credentials.encoded,
                srcResponseChannel=p.src_response_channel,
            )
        )
        self.session.counters["replications_started"] += 1
        return replication_id

    def stop_replication(self, replication_id: int) -> None:
        """Stop a replication; :class:`ArchiveUnknownReplicationError` if there is none with
        that id (never started, or already over)."""
        self._call("StopReplicationRequest", replicationId=replication_id)

    def try_stop_replication(self, replication_id: int) -> bool:
        """Stop a replication: True if it was running, False if there was none to stop."""
        try:
            self.stop_replication(replication_id)
        except ArchiveUnknownReplicationError:
            return False
        return True

    def replication(self, replication_id: int) -> ReplicationStatus | None:
        """What the archive said so far about a replication this client started (a copy), or
        None for an id it did not start."""
        self.poll()
        status = self.session.replications.get(replication_id)
        return None if status is None else status.snapshot()

    def wait_for_replication(
        self,
        replication_id: int,
        *signals: RecordingSignal,
        timeout_s: float | None = None,
    ) -> ReplicationStatus:
        """Wait until one of ``signals`` came for the replication (any of them since it
        started: nothing is consumed); its status. The archive's error for it raises that,
        even once the awaited signal came
        (:class:`ArchiveResponseError` with the archive's code); a replication that ended
        (REPLICATE_END) without any of ``signals`` raises :class:`ArchiveReplicationError`
        (but STOP is waited for after REPLICATE_END when a recording began: it may come after);
        nothing within ``timeout_s`` (default: the client's) :class:`ArchiveTimeoutError`."""
        if not signals:
            raise ConfigurationError("signals", signals, "at least one RecordingSignal")
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        names = "/".join(getattr(s, "name", str(s)) for s in signals)
        while True:
            status = self.session.replications.get(replication_id)
            if status is None:
                raise ArchiveReplicationError(
                    f"replication {replication_id} was not started by this client",
                    replication_id=replication_id,
                )
            if status.error is not None:  # a failed replication raises, whatever was awaited
                raise status.error
            if status.seen(*signals):
                return status.snapshot()
            seen = [getattr(s, "name", str(s)) for s in status.signals]
            # The copy's STOP may follow REPLICATE_END: the archive stops the recording it
            # began (EXTEND) on a later duty cycle.
            stop_to_come = RecordingSignal.STOP in signals and status.seen(RecordingSignal.EXTEND)
            if status.ended and not stop_to_come:
                raise ArchiveReplicationError(
                    f"replication {replication_id} ended without {names} (signals: {seen})",
                    replication_id=replication_id,
                    signals=seen,
                )
            if time.monotonic() >= deadline:
                raise ArchiveTimeoutError(
                    f"replication {replication_id}: no {names} within {timeout} s "
                    f"(signals so far: {seen})",
                    timeout_ms=int(timeout * 1000),
                    replication_id=replication_id,
                )
            self._service(deadline)

    def poll_errors(self) -> list[ArchiveResponseError]:
        """Errors the archive sent that no request waited for (a replication failing, an
        answer that came after its request timed out), not yet returned."""
        self.poll()
        out = list(self.session.errors)
        self.session.errors.clear()
        return out

    # -------------------------------------------------------------- replay

    def start_replay(
        self,
        recording_id: int,
        position: int,
        length: int | None,
        replay_channel: str,
        replay_stream_id: int,
    ) -> int:
        """Replay ``length`` bytes of the recording from ``position`` (None: open-ended, the
        replay follows an active recording as it grows) to ``replay_channel``; the replay
        session id (its low 32 bits are the replay image's session id)."""
        return int(
            self._call(
                "ReplayRequest",
                recordingId=recording_id,
                position=position,
                length=codecs.LENGTH_TO_END if length is None else length,
                replayStreamId=replay_stream_id,
                fileIoMaxLength=codecs.NULL_VALUE,
                replayToken=codecs.NULL_VALUE,
                replayChannel=replay_channel,
            )
        )

    def stop_replay(self, replay_session_id: int) -> None:
        self._call("StopReplayRequest", replaySessionId=replay_session_id)

    def stop_all_replays(self, recording_id: int = codecs.NULL_VALUE) -> None:
        self._call("StopAllReplaysRequest", recordingId=recording_id)

    def replay(
        self,
        recording_id: int,
        start: int,
        end: int,
        *,
        session_id: int | None = None,
        stream_id: int | None = None,
        replay_stream_id: int = DEFAULT_REPLAY_STREAM_ID,
        block_bytes: int = 1 << 20,
    ) -> Generator[ReplayedBlock, None, None]:
        """The raw frames of ``[start, end)`` of the recording, by a bounded replay to a
        subscription of our own (its own port, so its own replay session): each block is a copy
        of whole frames as recorded, with the replay's session and stream ids written back to
        the recording's ``session_id`` and ``stream_id`` when given (so a re-read holds the same
        bytes). Fails with
        :class:`ArchiveTimeoutError` when the replay makes no progress for ``timeout_s``."""
        if end <= start:
            return
        sub = self.driver.add_subscription(
            self.config.replay_subscription_channel(self._host, 0), replay_stream_id
        )
        replay_session = None
        finished = False
        try:
            port = sub.local_endpoints[0][1]
            channel = f"aeron:udp?endpoint={_endpoint_text(self._host, port)}"
            replay_session = self.start_replay(
                recording_id, start, end - start, channel, replay_stream_id
            )
            image_session = _int32(replay_session)
            image = self._await_image(sub, image_session, recording_id)
            yield from self._read_image(
                image, sub, recording_id, start, end, session_id, stream_id, block_bytes
            )
            finished = True
        finally:
            sub.close()
            if (
                replay_session is not None
                and not finished
                and not self._closed
                and self.session.state.value == "connected"
            ):
                try:
                    self.stop_replay(replay_session)
                except ArchiveClientError:
                    pass  # it may have ended by itself

    def _await_image(self, sub: Any, image_session: int, recording_id: int) -> Any:
        deadline = time.monotonic() + self.config.timeout_s
        while True:
            image = sub.image_by_session_id(image_session)
            if image is not None:
                return image
            self.poll()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ArchiveTimeoutError(
                    f"the replay of recording {recording_id} did not reach "
                    f"{sub.local_endpoints} within {self.config.timeout_s} s",
                    timeout_ms=int(self.config.timeout_s * 1000),
                    recording_id=recording_id,
                )
            sub.wait(min(remaining, 0.1))

    def _read_image(
        self,
        image: Any,
        sub: Any,
        recording_id: int,
        start: int,
        end: int,
        session_id: int | None,
        stream_id: int | None,
        block_bytes: int,
    ) -> Generator[ReplayedBlock, None, None]:
        if image.position != start:
            raise ArchiveClientError(
                f"the replay of recording {recording_id} began at {image.position}, not {start}",
                recording_id=recording_id,
            )
        blocks: list[ReplayedBlock] = []

        def on_block(term: memoryview, offset: int, length: int, _sid: int, _tid: int) -> None:
            data = bytearray(term[offset : offset + length])
            patch_frames(data, session_id, stream_id)
            position = image.position
            blocks.append(ReplayedBlock(position, bytes(data), position + length))

        timeout = self.config.timeout_s
        silence = self.config.silence_timeout_s
        silence_ns = None if silence is None else int(silence * _NS)
        deadline = time.monotonic() + timeout
        next_service = time.monotonic() + 0.1
        while image.position < end:
            got = image.block_poll(on_block, min(block_bytes, end - image.position))
            if blocks:
                yield from blocks
                blocks.clear()
            if got:
                now = time.monotonic()
                deadline = now + timeout
                if now >= next_service:  # keep the control session alive on a long replay
                    next_service = now + 0.1
                    self.poll()
                continue
            if (
                image.is_closed
                or image.is_end_of_stream
                and image.position < end
                and not sub.has_data()
            ):
                raise ArchiveReplayError(
                    f"the replay of recording {recording_id} ended at {image.position}, before "
                    f"{end}",
                    recording_id=recording_id,
                    position=image.position,
                )
            self.poll()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ArchiveTimeoutError(
                    f"the replay of recording {recording_id} stalled at {image.position} (of "
                    f"[{start}, {end})) for {timeout} s",
                    timeout_ms=int(timeout * 1000),
                    recording_id=recording_id,
                    position=image.position,
                )
            last = image.last_packet_ns
            if silence_ns is not None and last is not None:
                quiet_ns = time.monotonic_ns() - last
                if quiet_ns > silence_ns:
                    raise ArchiveTimeoutError(
                        f"the replay of recording {recording_id} stalled at {image.position} "
                        f"(of [{start}, {end})): the archive sent nothing, not even a heartbeat, "
                        f"for {quiet_ns / _NS:.1f} s",
                        timeout_ms=int(silence_ns / 1_000_000),
                        recording_id=recording_id,
                        position=image.position,
                    )
                remaining = min(remaining, (silence_ns - quiet_ns) / _NS + 0.01)
            sub.wait(max(0.001, min(remaining, 0.25)))


def patch_frames(data: bytearray, session_id: int | None, stream_id: int | None) -> None:
    """Write ``session_id`` and ``stream_id`` (None: leave it) into the header of every frame of
    ``data``, whole frames as a replay delivers them (a PAD frame may end them). A block of
    frames of one length (fixed-size messages, the common case) is written with numpy at once
    (from 16 frames on: below, numpy's fixed cost is more than a Python step per frame, ~3 us
    per message)."""
    patches = [
        (at, value)
        for at, value in ((_SESSION_ID_AT, session_id), (_STREAM_ID_AT, stream_id))
        if value is not None
    ]
    length = len(data)
    if not patches or length < 32:
        return
    first = struct.unpack_from("<i", data, 0)[0]
    aligned = (first + 31) & -32
    if first >= 32 and length % aligned == 0 and length // aligned >= _PATCH_AT_ONCE:
        rows = np.frombuffer(data, dtype="<i4").reshape(-1, aligned // 4)
        if (rows[:, 0] == first).all():
            for at, value in patches:
                rows[:, at // 4] = value
            return
    packed = [(at, struct.pack("<i", value)) for at, value in patches]
    at = 0
    while at < length:
        frame = struct.unpack_from("<i", data, at)[0]
        for field_at, value_bytes in packed:
            data[at + field_at : at + field_at + 4] = value_bytes
        at += (frame + 31) & -32 if frame > 0 else length


def _int32(value: int) -> int:
    low = value & 0xFFFFFFFF
    return low - (1 << 32) if low >= 1 << 31 else low


__all__ = [
    "ArchiveClient",
    "ArchiveClientConfig",
    "ReplayedBlock",
    "ReplicationParams",
    "local_address_towards",
    "patch_frames",
    "process_driver",
]
