"""The media driver's front: owns sockets, agents and threads; hands out publications and
subscriptions. What the driver knows lives in its conductor (:mod:`.conductor`, sans-I/O).

Threading modes (``DriverConfig.threading_mode``):

* ``"shared"`` (default): conductor, sender and receiver agents on one background thread;
* ``"dedicated"``: one thread per agent;
* ``"invoker"``: no thread; the caller steps everything with :meth:`Driver.do_work` (and may
  sleep in :meth:`Driver.idle`). Tests and the benchmark use it: no thread hand-off at all.

``aeron:udp`` channels are served here; ``aeron:ipc`` channels are handed to
:mod:`aeron_spark.transport.ipc` (its objects are stepped by the conductor);
``aeron-spy:aeron:udp?...`` subscriptions read local network publications' logs in-process.
"""

from __future__ import annotations

import getpass
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aeron_spark.transport import ipc
from aeron_spark.transport.counters import Counters, SystemCounters, sweep_counter_files
from aeron_spark.transport.driver.agents import Agent, AgentRunner, DedicatedBudget
from aeron_spark.transport.driver.client import (
    Image,
    NetworkPublicationLog,
    Publication,
    Subscription,
    network_publication,
    network_subscription,
)
from aeron_spark.transport.driver.conductor import DriverConductor, ImageLimits
from aeron_spark.transport.driver.endpoint import (
    AmplificationLedger,
    UdpEndpoint,
    claim_port,
    destination_address,
    port_taken,
)
from aeron_spark.transport.errors import (
    ChannelError,
    ClosedError,
    DirectoryUnsafeError,
    DriverError,
    LocalProtocolError,
    PortInUseError,
)
from aeron_spark.transport.ipc import logfile as ipc_logfile
from aeron_spark.transport.ipc.watch import DirectoryWatch, open_watch
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS
from aeron_spark.transport.protocol.heartbeat import IDLE_HEARTBEAT_INTERVAL_MAX_NS
from aeron_spark.transport.protocol.image import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    SM_IDLE_INTERVAL_MAX_NS,
)
from aeron_spark.transport.protocol.logbuffer import (
    MAX_UDP_PAYLOAD_LENGTH,
    RESERVED_SESSION_ID_HIGH,
    RESERVED_SESSION_ID_LOW,
    TERM_MAX_LENGTH,
    check_mtu,
    check_term_length,
)
from aeron_spark.transport.uri import ChannelConfig, Endpoint, parse_endpoint

log = logging.getLogger(__name__)

ThreadingMode = Literal["shared", "dedicated", "invoker"]
DEFAULT_SOCKET_BUFFER_LENGTH = 2 * 1024 * 1024


# Names the default driver directory (as Aeron's AERON_DIR): a test run gives its processes one
# of their own, so it can tell what they left in /dev/shm (the root conftest.py)
DIRECTORY_ENV = "AERON_SPARK_DIR"


def default_directory() -> Path:
    """``$AERON_SPARK_DIR`` if set, else ``/dev/shm/aeron-spark-<user>`` where /dev/shm exists,
    else under the temp directory."""
    named = os.environ.get(DIRECTORY_ENV)
    if named:
        return Path(named)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"aeron-spark-{user}"


def check_directory(path: Path, default: bool) -> None:
    """Refuse (:class:`DirectoryUnsafeError`) a driver directory another user may write: any
    writable by every user, and the default one (:func:`default_directory`) unless it is this
    user's or root's. The default's name is known in advance and ``/dev/shm`` lets anyone make
    it first: whoever owns it may replace the IPC log files in it (its messages then read as
    the stream's) or plant symlinks where the driver writes. A directory named explicitly may
    belong to another user on purpose (a group sharing one), as long as not everyone may write
    to it."""
    st = os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_mode & stat.S_IWOTH:
        raise DirectoryUnsafeError(
            str(path), st.st_uid, mode, f"every user may write to it (mode {mode:04o})"
        )
    if default and st.st_uid not in (os.geteuid(), 0):
        raise DirectoryUnsafeError(
            str(path),
            st.st_uid,
            mode,
            f"it is the default directory of this user but owned by uid {st.st_uid} "
            f"(this process runs as uid {os.geteuid()}): another user made it first",
        )


# The shortest image liveness timeout a driver takes: twice the longest idle heartbeat interval
# a channel may ask (2 s), so an idle image hears at least two heartbeats before it times out
MIN_IMAGE_LIVENESS_TIMEOUT_NS = 2 * IDLE_HEARTBEAT_INTERVAL_MAX_NS
# The shortest publication connection timeout a driver takes: twice the longest interval between
# the status messages of an idle image (1 s), so a live receiver is never dropped for one SM lost
MIN_PUBLICATION_CONNECTION_TIMEOUT_NS = 2 * SM_IDLE_INTERVAL_MAX_NS


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """Settings of one driver; units in the names. ``loss`` injects receive-side loss (tests)."""

    threading_mode: ThreadingMode = "shared"
    directory: Path | None = None
    socket_buffer_length: int = DEFAULT_SOCKET_BUFFER_LENGTH
    counters_interval_ns: int = 1_000_000_000
    write_counters_file: bool = True
    retransmit_linger_ns: int = 10_000_000  # NAKs for a range just resent are ignored this long
    ipc_liveness_timeout_ns: int = 10_000_000_000  # an IPC peer silent this long is gone
    # A UDP image that receives nothing (data, heartbeat, pad) this long is gone (Aeron's
    # aeron.image.liveness.timeout, 10 s); at least MIN_IMAGE_LIVENESS_TIMEOUT_NS.
    image_liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS
    # A UDP publication's receiver whose last status message is older than this is gone; with
    # none left the publication is not connected (Aeron's aeron.publication.connection.timeout,
    # 5 s); at least MIN_PUBLICATION_CONNECTION_TIMEOUT_NS.
    publication_connection_timeout_ns: int = CONNECTION_TIMEOUT_NS
    # Largest term length / mtu a SETUP may ask of our UDP subscriptions (each subscription may
    # lower them: max-term-length / max-mtu); bigger SETUPs are dropped and counted.
    max_image_term_length: int = TERM_MAX_LENGTH
    max_image_mtu: int = MAX_UDP_PAYLOAD_LENGTH
    # Images one UDP subscription takes at once: in all, from one sender (address and port),
    # from one IP address or IPv6 /64 (0: no limit; channels may lower them: max-images,
    # max-images-per-source, max-images-per-address); SETUPs past them are counted.
    max_images: int = 0
    max_images_per_source: int = 0
    max_images_per_address: int = 0
    loss: Any = None  # a transport.api.MediaHook, e.g. transport.testing.LossConfig (tests)
    # Send a publication's runs of equal datagrams in one sendmsg each (UDP GSO, Linux 4.18+)
    # where the kernel offers it; False sends every datagram with its own sendto.
    udp_gso: bool = True
    # Take the kernel's coalesced receives (UDP GRO, Linux 5.0+): one recvmsg for a run of
    # equal datagrams of one sender, handed on one datagram at a time as the sender cut them.
    udp_gro: bool = False

    def __post_init__(self) -> None:
        if self.directory is not None and not isinstance(self.directory, Path):
            if not isinstance(self.directory, str):
                raise ChannelError("directory", self.directory, "a path (str or pathlib.Path)")
            object.__setattr__(self, "directory", Path(self.directory))
        if self.threading_mode not in ("shared", "dedicated", "invoker"):
            raise ChannelError(
                "threading_mode", self.threading_mode, "shared, dedicated or invoker"
            )
        if self.socket_buffer_length < 0:
            raise ChannelError(
                "socket_buffer_length", self.socket_buffer_length, "a byte count >= 0"
            )
        if self.ipc_liveness_timeout_ns <= 0:
            raise ChannelError(
                "ipc_liveness_timeout_ns", self.ipc_liveness_timeout_ns, "a positive duration"
            )
        timeout = self.image_liveness_timeout_ns
        if (
            not isinstance(timeout, int)
            or isinstance(timeout, bool)
            or timeout < MIN_IMAGE_LIVENESS_TIMEOUT_NS
        ):
            raise ChannelError(
                "image_liveness_timeout_ns",
                timeout,
                f"whole nanoseconds, at least {MIN_IMAGE_LIVENESS_TIMEOUT_NS} (twice the "
                "longest idle-heartbeat-interval a channel may ask: an idle image must outlive "
                "one lost heartbeat)",
            )
        timeout = self.publication_connection_timeout_ns
        if (
            not isinstance(timeout, int)
            or isinstance(timeout, bool)
            or timeout < MIN_PUBLICATION_CONNECTION_TIMEOUT_NS
        ):
            raise ChannelError(
                "publication_connection_timeout_ns",
                timeout,
                f"whole nanoseconds, at least {MIN_PUBLICATION_CONNECTION_TIMEOUT_NS} (twice the "
                "longest interval between an idle image's status messages: a live receiver must "
                "outlive one lost status message)",
            )
        if self.retransmit_linger_ns < 0:
            raise ChannelError("retransmit_linger_ns", self.retransmit_linger_ns, "a duration >= 0")
        if self.counters_interval_ns <= 0:
            raise ChannelError(
                "counters_interval_ns", self.counters_interval_ns, "a positive duration"
            )
        for name in ("udp_gso", "udp_gro"):
            if not isinstance(getattr(self, name), bool):
                raise ChannelError(name, getattr(self, name), "True or False")
        check_term_length(self.max_image_term_length, "max_image_term_length")
        check_mtu(self.max_image_mtu, "max_image_mtu")
        for name in ("max_images", "max_images_per_source", "max_images_per_address"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ChannelError(name, getattr(self, name), "a count >= 0 (0: no limit)")

    @property
    def resolved_directory(self) -> Path:
        return self.directory if self.directory is not None else default_directory()

    @property
    def directory_is_default(self) -> bool:
        """The directory is :func:`default_directory`'s guess, not one the user named."""
        return self.directory is None and not os.environ.get(DIRECTORY_ENV)


class Driver:
    """An in-process Aeron media driver with the client API on top.

    This is the front: it parses channels, reads the clock, opens sockets and IPC files and runs
    the agents (threads or ``do_work``); what the driver knows (publications, subscriptions,
    endpoints, timers) is its :class:`~.conductor.DriverConductor`, driven with ``now_ns``.
    """

    def __init__(self, config: DriverConfig | None = None) -> None:
        self.config = config or DriverConfig()
        self.directory = self.config.resolved_directory
        self.system_counters = SystemCounters()
        self.amplification: AmplificationLedger | None = None
        self._lock = threading.RLock()
        cfg = self.config
        self._conductor = DriverConductor(
            self.system_counters,
            self._open_endpoint,
            image_limits=ImageLimits(
                cfg.max_image_term_length,
                cfg.max_image_mtu,
                cfg.max_images,
                cfg.max_images_per_source,
                cfg.max_images_per_address,
                cfg.image_liveness_timeout_ns,
            ),
            retransmit_linger_ns=cfg.retransmit_linger_ns,
            counters_interval_ns=cfg.counters_interval_ns,
            publication_connection_timeout_ns=cfg.publication_connection_timeout_ns,
            on_tick=self._on_tick,
            wake_sender=self.wake_sender,
            wake_receiver=self.wake_receiver,
            wake_conductor=self._wake_conductor,
        )
        self._sender = self._conductor.sender
        self._receiver = self._conductor.receiver
        self._runners: list[AgentRunner] = []
        self._sender_runner: AgentRunner | None = None
        self._receiver_runner: AgentRunner | None = None
        self._started = False
        self._closed = False
        self._ipc_watch: DirectoryWatch | None = None
        self._ipc_watch_tried = False
        self._directory_checked = False  # check_directory passed (the directory is ours)
        self._directory_unsafe = False  # it failed: no counters file is written there
        self._ipc_used = False  # made an IPC publication or subscription (its folder is ours)
        self.errors: list[BaseException] = []
        self.counters = Counters(
            self.system_counters, self._conductor.stream_positions, self._conductor.totals
        )

    @property
    def _publications(self) -> list[Publication]:
        """The open network publications (the conductor's list)."""
        return self._conductor.publications

    @property
    def _subscriptions(self) -> list[Subscription]:
        """The open network and spy subscriptions (the conductor's list)."""
        return self._conductor.subscriptions

    # ------------------------------------------------------------------ lifecycle

    @property
    def is_invoker(self) -> bool:
        return self.config.threading_mode == "invoker"

    def _sweep(self) -> None:
        """Remove what dead processes left in the driver directory (their IPC log buffers,
        ~200 KB each in /dev/shm, and counters files): a Spark worker ends with ``os._exit`` and
        a killed server closes nothing. Best effort, counted (``stale_files_removed``)."""
        try:
            removed = ipc_logfile.sweep(
                self.directory, time.monotonic_ns(), self.config.ipc_liveness_timeout_ns
            )
            removed += sweep_counter_files(self.directory)
        except OSError as exc:  # a directory we may not read: nothing swept, nothing broken
            log.debug("sweeping %s failed: %s", self.directory, exc)
            return
        self.system_counters.stale_files_removed += len(removed)

    def _ensure_directory(self) -> Path:
        """The driver directory, made if missing (never writable by others) and checked
        (:func:`check_directory`) before the driver first reads or writes anything in it."""
        if not self._directory_checked:
            # again if a closing driver of another process removed it meanwhile (empty)
            ipc_logfile.make_folder(self.directory, mode=0o755)
            check_directory(self.directory, self.config.directory_is_default)
            self._directory_checked = True
        return self.directory

    def start(self) -> Driver:
        with self._lock:
            if self._closed:
                raise ClosedError("driver is closed")
            if self._started:
                return self
            self._started = True
            if self.directory.is_dir():  # else made (and checked) when first written
                self._ensure_directory()
            self._sweep()
            mode = self.config.threading_mode
            agents: tuple[Agent, ...] = (self._conductor, self._sender, self._receiver)
            if mode == "dedicated":
                self._runners = [
                    AgentRunner(f"aeron-{n}", [a], self.record_error)
                    for n, a in zip(("conductor", "sender", "receiver"), agents, strict=True)
                ]
                self._sender_runner, self._receiver_runner = self._runners[1], self._runners[2]
            else:
                runner = AgentRunner("aeron-driver", agents, self.record_error)
                self._runners = [runner]
                self._sender_runner = self._receiver_runner = runner
            if mode != "invoker":
                for runner in self._runners:
                    runner.start()
        return self

    def close(self) -> None:
        """Close every publication and subscription, stop the agents, release sockets."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pubs, subs = list(self._publications), list(self._subscriptions)
        for sub in subs:
            sub.close()
        for pub in pubs:
            pub.close()
        if self._started:
            # Give EOS a moment to go out (bounded), then stop.
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline and self._sender.endpoints:
                if self.is_invoker:
                    self.do_work()
                    self.idle(0.01)
                else:
                    time.sleep(0.01)
        for runner in self._runners:
            runner.stop()
            runner.close()
        self._conductor.release_all(self.record_error)
        if self.config.write_counters_file:
            try:
                self.counters.file_path(self.directory).unlink(missing_ok=True)
            except OSError:
                pass
        self._remove_empty_folders()

    def _remove_empty_folders(self) -> None:
        """What the driver made in its directory goes with it when nobody else needs it: the
        ``ipc`` folder when this driver used IPC and the folder is empty (another process's log
        buffer keeps it; a publisher makes it again, a watching driver follows it: see
        ``ipc/watch.py``), then the default directory when empty (a directory the application
        named stays). Every run left an empty ``/dev/shm/aeron-spark-<user>/ipc``."""
        folders = [ipc_logfile.ipc_directory(self.directory)] if self._ipc_used else []
        if self.config.directory is None:
            folders.append(self.directory)
        for folder in folders:
            try:
                os.rmdir(folder)
            except OSError:  # not empty (another process's files), gone already, not ours
                pass

    def __enter__(self) -> Driver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def do_work(self, now_ns: int | None = None, poll: bool = True) -> int:
        """Step every agent once (invoker mode); returns the work done. Without ``poll``
        sockets are read only if the last :meth:`idle` found them readable (a step to send
        what was just offered: what arrived meanwhile is read by the next step)."""
        if not self._started:
            self.start()
        if self.config.threading_mode != "invoker":  # no property call: a step a datagram
            raise LocalProtocolError(
                "do_work() is for threading_mode='invoker'; the driver has threads"
            )
        return self._runners[0].do_work(now_ns, poll)

    def idle(self, timeout_s: float, ready: Callable[[], bool] | None = None) -> bool:
        """Invoker mode: sleep until a socket is readable, the next deadline (<= timeout_s), a
        :meth:`wake` or, asked once the driver counts as asleep, ``ready()`` is true (another
        thread that makes it true then calls :meth:`wake`: never a wake-up lost between).
        True when it returned at once for ``ready()``."""
        if self.config.threading_mode == "invoker" and self._runners:
            return self._runners[0].idle(timeout_s, ready)
        time.sleep(timeout_s)
        return False

    def wake(self) -> None:
        """Invoker mode: end the invoker's :meth:`idle` now (any thread; one byte a sleep at
        most, nothing while it is not asleep). Threaded modes: wake the driver's thread."""
        runner = self._runners[0] if self._runners else None
        if runner is not None:
            runner.wake()

    def has_work(self) -> bool:
        """Invoker mode: an agent has work now (a publication kicked by an offer, datagrams of
        a coalesced receive left): :meth:`idle` would return at once."""
        runner = self._runners[0] if self._runners else None
        return runner is not None and runner.has_work()

    @property
    def step_again(self) -> bool:
        """Invoker mode: the last :meth:`do_work` did work its agents report through nothing
        :meth:`idle` waits on (IPC resources): step again before sleeping."""
        return bool(self._runners) and self._runners[0].restep

    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called (a closed driver adds nothing more)."""
        return self._closed

    # ------------------------------------------------------------------ for the media
    # What the UDP media (driver/client.py: a publication's log, a subscription's media) asks of
    # the driver that runs it.

    def record_error(self, exc: BaseException) -> None:
        """Count an error (a user callback's, an agent's) and keep the first 100."""
        self.system_counters.errors += 1
        if len(self.errors) < 100:
            self.errors.append(exc)

    def wake_sender(self, *, even_if_awake: bool = False) -> None:
        """Wake the sender agent if it sleeps (something was appended); ``even_if_awake``: make
        its next idle return at once too (a refused SETUP request may be answered now)."""
        runner = self._sender_runner
        if runner is not None and (even_if_awake or runner.sleeping):
            runner.wake()

    def wake_receiver(self) -> None:
        """Wake the receiver agent if it sleeps (a subscriber's window moved: time for an SM)."""
        runner = self._receiver_runner
        if runner is not None and runner.sleeping:
            runner.wake()

    def _wake_conductor(self) -> None:
        runner = self._runners[0] if self._runners else None
        if runner is not None and runner.sleeping:
            runner.wake()

    def _on_tick(self, now_ns: int) -> None:
        if self.config.write_counters_file and not self._directory_unsafe:
            try:
                self.counters.write(self._ensure_directory())
            except DirectoryUnsafeError as exc:  # made by another user since the start
                self._directory_unsafe = True  # reported once; nothing written there
                self.record_error(exc)
            except OSError as exc:
                self.record_error(exc)

    # ------------------------------------------------------------------ publications

    def add_publication(self, channel: str, stream_id: int, exclusive: bool = True) -> Publication:
        """A publication on ``aeron:udp?endpoint=host:port|...`` (or ``aeron:ipc``)."""
        config = ChannelConfig.from_uri(channel)
        _check_stream_id(stream_id)
        if not self._started:
            self.start()
        if self._closed:
            raise ClosedError("driver is closed")
        if config.spy:
            raise ChannelError(
                "channel", channel, "a publication channel (aeron-spy: is for subscriptions)"
            )
        if config.media == "ipc":
            return self._add_ipc_publication(config, stream_id, exclusive)
        dynamic = config.control is not None and config.control_mode in ("", "dynamic")
        manual = config.control_mode == "manual"
        if config.endpoint is None and not (dynamic or manual):
            raise ChannelError("endpoint", "", "an endpoint=host:port for a UDP publication")
        destination = None
        if config.endpoint is not None and not dynamic and not manual:
            destination = destination_address(config.endpoint)
        return self._conductor.add_network_publication(
            config,
            stream_id,
            time.monotonic_ns(),
            lambda state, ep: network_publication(self, state, channel, exclusive, ep),
            destination,
        )

    def trust_host(self, host: str, session_ids: Iterable[int]) -> None:
        """``host`` completed a handshake whose streams have ``session_ids``: their frames to it
        are no longer bounded by what it sent (see ``max-amplification``); every other stream to
        it still is. Each call is undone by one :meth:`distrust_host` with the same ids."""
        if self.amplification is not None:
            self.amplification.trust(host, session_ids)

    def distrust_host(self, host: str, session_ids: Iterable[int]) -> None:
        if self.amplification is not None:
            self.amplification.distrust(host, session_ids)

    def dedicate_socket(
        self,
        peer: Image | Publication,
        budget: DedicatedBudget | None = None,
        tags: tuple[tuple[str, Any], ...] = (),
    ) -> Any:
        """Give a UDP peer a socket of its own on our side, connected to it, when our socket
        was opened by a channel with ``dedicated-sources=N`` (``SO_REUSEPORT``): for an
        ``Image``, its sender (address and port) on the subscription's socket; for a
        ``Publication`` with one destination, that receiver (whose SMs and NAKs arrive) on the
        publication's socket. The kernel then hands that socket every datagram of the peer, so
        a flood of the shared socket (a public port) does not overflow them (see
        ``agents.ReceiveEndpoint``). Nothing changes on the wire. Meant for a peer that proved
        itself (a handshake server's session): a spoofer gets none. Returns a handle for
        :meth:`release_socket` (call it once), or None when not given (no such channel, IPC,
        not one destination, at ``N`` peers, past ``budget`` in all or under one of ``tags``, no
        descriptor: ``dedicated_sockets_refused``). ``budget``: a :class:`DedicatedBudget`
        several endpoints share (a socket's tags are given back with it when it closes)."""
        if self._closed:
            return None
        if isinstance(peer, Image):
            registration = getattr(peer.subscription, "registration", None)
            address = peer.source_address
            if not isinstance(registration, tuple) or address is None:
                return None
            return self._conductor.dedicate_source(registration[0], address, budget, tags)
        destinations = peer.destinations if peer.channel.startswith("aeron:udp") else []
        if len(destinations) != 1:
            return None
        ep = self._conductor.send_endpoint_of(peer.state)
        if ep is None:
            return None
        return self._conductor.dedicate_source(ep, destinations[0], budget, tags)

    def release_socket(self, handle: Any) -> None:
        """Undo one :meth:`dedicate_socket` (its handle; the socket lingers a second for the
        peer's next session, then closes)."""
        if handle is not None:
            self._conductor.release_source(handle, time.monotonic_ns())

    def _open_endpoint(
        self, bind: Endpoint, config: ChannelConfig, connect_to: Any = None
    ) -> UdpEndpoint:
        buffer = self.config.socket_buffer_length
        loss = None
        if self.config.loss is not None:
            loss = self.config.loss.receive_hook(self.system_counters)
        reuse_port = bool(config.dedicated_sources)
        claim = None
        if reuse_port and connect_to is None and bind.port != 0:
            # SO_REUSEPORT would share a port another such socket of ours holds (a second
            # server on the same port): refused as a plain socket's bind is. The claim makes
            # check and bind one step (two servers starting together both passed the check)
            claim = claim_port(bind)
            if port_taken(bind):
                if claim is not None:
                    claim.close()
                raise PortInUseError(bind.host, bind.port)
        try:
            udp = UdpEndpoint(
                bind,
                self.system_counters,
                so_rcvbuf=max(config.so_rcvbuf, buffer),
                so_sndbuf=max(config.so_sndbuf, buffer),
                loss=loss,
                reuse_port=reuse_port,
                connect_to=connect_to,
                gso=self.config.udp_gso,
                gro=self.config.udp_gro,
            )
        except BaseException:
            if claim is not None:
                claim.close()
            raise
        udp.port_claim = claim
        if config.max_amplification:
            # the driver's guarded sockets share one ledger: what an address sent to one
            # (a HELLO on the port) is its credit on the other (replies from port + 1)
            if self.amplification is None:
                self.amplification = AmplificationLedger(config.max_amplification)
            udp.ledger = self.amplification
        return udp

    def add_publication_destination(self, pub: NetworkPublicationLog, endpoint: str) -> None:
        """Manual multi-destination-cast: ``pub`` also sends to ``endpoint``."""
        address = destination_address(parse_endpoint("endpoint", endpoint, allow_port_zero=False))
        self._conductor.add_destination(pub.state, address, time.monotonic_ns())

    def close_publication(self, pub: NetworkPublicationLog) -> None:
        """The client closed ``pub``: the sender drains, lingers and frees it."""
        self._conductor.close_publication(pub, time.monotonic_ns())

    # ------------------------------------------------------------------ subscriptions

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], object] | None = None,
        on_unavailable_image: Callable[[Image], object] | None = None,
        *,
        admit_source: Callable[[str], bool] | None = None,
    ) -> Subscription:
        """A subscription on ``aeron:udp?endpoint=host:port|...``, ``aeron:ipc``, ``aeron-spy:``.

        ``admit_source`` (UDP only): asked once per sender host (the address a SETUP came from,
        as the socket reports it); a SETUP from a host it refuses makes no image and is counted
        (``setups_source_refused``), and that host's DATA elicits no SETUP."""
        config = ChannelConfig.from_uri(channel)
        _check_stream_id(stream_id)
        if admit_source is not None and (config.media == "ipc" or config.spy):
            raise ChannelError("admit_source", channel, "a UDP channel (senders have addresses)")
        if not self._started:
            self.start()
        if self._closed:
            raise ClosedError("driver is closed")
        if config.media == "ipc":
            return self._add_ipc_subscription(
                config, stream_id, on_available_image, on_unavailable_image
            )
        sub = network_subscription(
            self, channel, stream_id, on_available_image, on_unavailable_image
        )
        if config.spy:
            self._conductor.add_spy_subscription(sub, config, time.monotonic_ns())
            return sub
        if config.endpoint is None:
            raise ChannelError("endpoint", "", "an endpoint=host:port to bind the subscription to")
        control = destination_address(config.control) if config.control is not None else None
        self._conductor.add_network_subscription(sub, config, control, admit_source)
        return sub

    def close_subscription(self, sub: Subscription) -> None:
        """The client closed ``sub``: its images go, its endpoint when it was the last."""
        self._conductor.close_subscription(sub, time.monotonic_ns())

    # ------------------------------------------------------------------ IPC

    def _ipc_module(self) -> Any:
        if not hasattr(ipc, "add_publication") or not hasattr(ipc, "add_subscription"):
            raise DriverError(
                "aeron:ipc channels are not implemented yet (transport.ipc has no "
                "add_publication/add_subscription)"
            )
        return ipc

    def _add_ipc_publication(
        self, config: ChannelConfig, stream_id: int, exclusive: bool
    ) -> Publication:
        ipc = self._ipc_module()
        self._ensure_directory()
        self._ipc_used = True
        ipc_logfile.make_folder(self.directory)
        resource = ipc.add_publication(
            config,
            stream_id,
            directory=self.directory,
            exclusive=exclusive,
            liveness_timeout_ns=self.config.ipc_liveness_timeout_ns,
        )
        self._conductor.add_ipc(resource)
        return resource

    def _add_ipc_subscription(
        self,
        config: ChannelConfig,
        stream_id: int,
        on_available_image: Any,
        on_unavailable_image: Any,
    ) -> Any:
        ipc = self._ipc_module()
        self._ensure_directory()
        self._ipc_used = True
        ipc_logfile.make_folder(self.directory)
        with self._lock:
            if not self._ipc_watch_tried:
                # one inotify watch of the IPC directory for the driver: an idle subscription
                # sleeps until a log file comes (invoker mode too: idle() selects on it, and a
                # server stepping its driver would otherwise wake every 10 ms for an IPC poll)
                self._ipc_watch_tried = True
                self._ipc_watch = open_watch(
                    ipc_logfile.ipc_directory(self.directory), self.system_counters
                )
                if self._ipc_watch is not None:
                    self._conductor.watch_ipc(self._ipc_watch)
        resource = ipc.add_subscription(
            config,
            stream_id,
            directory=self.directory,
            on_available_image=on_available_image,
            on_unavailable_image=on_unavailable_image,
            liveness_timeout_ns=self.config.ipc_liveness_timeout_ns,
            watch=self._ipc_watch,
        )
        self._conductor.add_ipc(resource)
        return resource


def _check_stream_id(stream_id: int) -> None:
    if not isinstance(stream_id, int) or not -(2**31) <= stream_id < 2**31:
        raise ChannelError("stream_id", stream_id, "a 32-bit integer")


__all__ = [
    "Driver",
    "DriverConfig",
    "RESERVED_SESSION_ID_HIGH",
    "RESERVED_SESSION_ID_LOW",
    "DIRECTORY_ENV",
    "default_directory",
]
