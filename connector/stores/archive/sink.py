"""An Aeron Archive as a :class:`~aeron_spark.connector.stores.SinkStore`: exactly-once appends
into a real Aeron Archive.

``df.write/writeStream.format("aeron").option("archive", "aeron:udp?endpoint=host:8010")
.option("channel", "aeron:udp?endpoint=host:40456").option("streamId", 1001)
.option("sinkId", "orders")`` appends each batch's rows once to the sink's **target
recording** of the stream (``docs/aeron-archive.md`` has the whole design and its failure cases):

1. **Tasks stage.** Each task attempt starts a recording of its own (``startRecording`` with
   auto-stop on the staging channel, its own session id) and publishes its rows there through
   the project's UDP publication, in any payload format of the server sink; it waits until the
   archive has recorded all of it and returns (recording id, stop position, rows) as its commit
   message. A retried or speculative attempt makes another staging recording.
2. **The driver appends once.** ``commit`` reads the target's tail: an END marker of this
   (sink, batch) means the batch is in already (a commit repeated after a restart): nothing is
   appended. A BEGIN without END (a driver that died mid-append) is cut off with
   ``truncateRecording`` back to where that append began. Then it extends the target
   (``extendRecording``; a publication continuing the target's term geometry: initial term id,
   term id and offset of its stop position, term length and MTU) with a BEGIN marker, every
   committed staging recording's messages in partition order (replayed ahead of the append on
   threads of their own, :class:`_Prefetch`, and re-published with their reserved values), an
   END marker; waits until recorded, stops the recording, and purges the
   staging recordings (the committed ones, and every stopped one of this sink left by a failed
   attempt of this or an earlier batch). The first commit creates the target
   (``startRecording``; its channel's ``alias`` names the sink).
3. ``abort`` purges the staging recordings its messages name.

Readers honour read-committed (:mod:`.archive_markers`): the archive source stops at the last
END marker of a target and drops marker frames.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import random
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from aeron_spark.connector.archive_markers import (
    BEGIN,
    DIGEST_BYTES,
    END,
    MARKER_RESERVED_VALUE,
    OPENING_BATCH,
    STAGING_ALIAS_PREFIX,
    Marker,
    Tail,
    end_at,
    frames,
    is_sink_target,
    read_tail,
    sink_hash,
    target_alias,
)
from aeron_spark.connector.errors import NotEnoughReplicasError, ServerUnavailableError
from aeron_spark.connector.formats_sbe import encode_task
from aeron_spark.connector.options import ArchiveConnect, ArchiveSinkOptions, sink_on_archive
from aeron_spark.connector.stores.archive import health
from aeron_spark.connector.stores.archive.replicas import (
    REPLICA_FAILURES,
    Replicas,
    describe,
    elect,
    sink_recording,
)
from aeron_spark.connector.stores.archive.source import connect
from aeron_spark.connector.stores.tasks import sink_payloads, task_attempt
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import ChannelConfig, ChannelError, TransportError
from aeron_spark.transport.archive.client import (
    ArchiveClient,
    ArchiveClientError,
    ArchiveResponseError,
    ArchiveUnknownRecordingError,
    RecordingDescriptor,
    RecordingSignal,
)
from aeron_spark.transport.protocol.frames import (
    DATA_HEADER,
    DATA_HEADER_LENGTH,
    DataFlags,
    FrameType,
    uniform_run,
)
from aeron_spark.transport.protocol.logbuffer import is_reserved_session_id

log = logging.getLogger("aeron_spark.connector.archive_sink")
# Waits on the archive poll from 2 ms, doubling to 20 ms: each poll is one control request, and
# a wait usually ends within a few of the archive's duty cycles.
_POLL_S = 0.002
_POLL_MAX_S = 0.02


def _session_id() -> int:
    while True:
        sid = random.getrandbits(32) - 2**31
        if not is_reserved_session_id(sid):
            return sid


def _wait_recorded(client: ArchiveClient, recording_id: int, position: int, what: str) -> None:
    """Until the archive has recorded ``recording_id`` up to ``position`` (bounded)."""
    timeout = client.config.timeout_s
    deadline = time.monotonic() + timeout
    delay = _POLL_S
    while True:
        recorded = client.recording_position(recording_id)
        if recorded < 0:  # stopped meanwhile
            recorded = client.stop_position(recording_id)
        if recorded >= position:
            return
        if time.monotonic() > deadline:
            raise ServerUnavailableError(
                f"archive sink: the archive recorded {what} (recording {recording_id}) only to "
                f"{recorded} of {position} within {timeout:g} s"
            )
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)


def _wait_stopped(client: ArchiveClient, recording_id: int) -> int:
    """The stop position of ``recording_id`` once it is stopped (bounded)."""
    timeout = client.config.timeout_s
    deadline = time.monotonic() + timeout
    delay = _POLL_S
    while True:
        stop = client.stop_position(recording_id)
        if stop >= 0:
            return stop
        if time.monotonic() > deadline:
            raise ServerUnavailableError(
                f"archive sink: recording {recording_id} did not stop within {timeout:g} s"
            )
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)


def _stop_and_purge(client: ArchiveClient, recording_id: int) -> bool:
    """Stop (if still active) and purge a staging recording; False if it was gone already."""
    try:
        if client.stop_position(recording_id) < 0:
            client.stop_recording_by_identity(recording_id)
            _wait_stopped(client, recording_id)
        client.purge_recording(recording_id)
        return True
    except ArchiveUnknownRecordingError:
        return False


# ------------------------------------------------------------------ publishing in blocks


class _Blocks:
    """Publishes messages a block of frames at a time (``Publication.offer_block``: one copy
    into the term and one wake of the sender per block, not per message): the task's rows,
    framed here (:meth:`add`), and the driver's staged frames, copied as recorded with their
    ids and offsets rewritten to the target's (:meth:`feed`).

    A block holds whole messages and ends before the end of the publication's current term; a
    message that does not fit what is left of the term (or needs fragmenting, or has a
    fragment longer than the publication's mtu) goes through an ordinary ``offer`` of its
    payload, which pads the term and carries on in the next one, exactly as it would have been
    appended. PAD frames of a staging recording are dropped (the target pads its own terms).
    """

    BLOCK_BYTES = 64 * 1024  # a block in flight while the next one is gathered

    def __init__(self, pub: Any, timeout_s: float, digest: Any = None) -> None:
        """``digest``: a hashlib object fed every block and single message as offered (the
        batch's digest in its END marker)."""
        self.pub = pub
        self.timeout_s = timeout_s
        self.digest = digest
        self.term_length = int(pub.term_length)
        self.mtu = int(pub.mtu)
        self.max_payload = int(pub.max_payload_length)
        self.out = bytearray()
        self.room = self._room()
        self.partial: bytearray | None = None  # the frames of a fragmented message so far
        self.messages = 0
        self.blocks = 0
        self.singly = 0

    def _room(self) -> int:
        """Bytes left in the target's current term (a full term: the whole next one)."""
        return self.term_length - (int(self.pub.position) & (self.term_length - 1))

    def add_many(self, payloads: list[bytes], reserved: list[int] | None) -> None:
        """Messages (and their reserved values, None: 0); when all have one length that needs
        no fragmenting (fixed-size rows), framed at once with numpy and cut into blocks by
        arithmetic."""
        n = len(payloads)
        length = len(payloads[0]) if payloads else 0
        if (
            n >= _UNIFORM_MIN_FRAMES
            and 0 < length <= self.max_payload
            and all(len(p) == length for p in payloads)
        ):
            aligned = (length + DATA_HEADER_LENGTH + 31) & -32
            framed = np.zeros((n, aligned), dtype=np.uint8)
            head = _header(length + DATA_HEADER_LENGTH, 0, _UNFRAGMENTED, _TYPE_DATA, 0, 0, 0, 0, 0)
            framed[:, :DATA_HEADER_LENGTH] = np.frombuffer(head, dtype=np.uint8)
            body = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(n, length)
            framed[:, DATA_HEADER_LENGTH : DATA_HEADER_LENGTH + length] = body
            if reserved is not None:
                framed.view("<i8")[:, 3] = reserved  # header bytes 24..32
            self._feed_run(memoryview(framed.reshape(-1).data), aligned)
            return
        for k, payload in enumerate(payloads):
            self.add(payload, 0 if reserved is None else reserved[k])

    def add(self, payload: bytes | bytearray | memoryview, rv: int) -> None:
        """One message, framed unfragmented into the block (header ids are the publication's
        once offered)."""
        length = len(payload)
        if length > self.max_payload:
            self._single(payload, rv)
            return
        aligned = (length + DATA_HEADER_LENGTH + 31) & -32
        out = self.out
        if len(out) + aligned > min(self.room, self.BLOCK_BYTES):
            self.flush()
            if aligned > self.room:
                self._single(payload, rv)
                return
        out += _header(length + DATA_HEADER_LENGTH, 0, _UNFRAGMENTED, _TYPE_DATA, 0, 0, 0, 0, rv)
        out += payload
        pad = aligned - DATA_HEADER_LENGTH - length
        if pad:
            out += _ZEROS[:pad]
        self.messages += 1

    def _single(self, payload: bytes | bytearray | memoryview, rv: int) -> None:
        self.flush()
        if self.digest is not None:
            self.digest.update(rv.to_bytes(8, "little", signed=True))
            self.digest.update(payload)
        self.pub.offer_blocking(payload, reserved_value=rv, timeout_s=self.timeout_s)
        self.singly += 1
        self.messages += 1
        self.room = self._room()

    def feed(self, data: bytes | memoryview, recording_id: int) -> None:
        """A replayed block of whole recorded frames (PAD frames dropped). A frame with the
        markers' reserved value is refused: the tasks never stage one (``_payloads``), so it was
        injected into the staging stream, and relayed it would be a BEGIN or END of the
        injector's making in the target (a forged epoch elected, torn rows made visible)."""
        view = memoryview(data)
        aligned = _uniform_frames(view, self.mtu) if self.partial is None else 0
        if aligned:
            rvs = np.frombuffer(view, dtype="<i8").reshape(-1, aligned // 8)[:, 3]
            if (rvs == MARKER_RESERVED_VALUE).any():
                raise _staged_marker(recording_id)
            self._feed_run(view, aligned)
            return
        covered = 0
        for at, aligned, length, flags, ftype in frames(view):
            covered = at + aligned
            if covered > len(view):
                break
            if ftype == _TYPE_PAD:
                continue
            if _rv_at(view, at + 24)[0] == MARKER_RESERVED_VALUE:
                raise _staged_marker(recording_id)
            frame = view[at:covered]
            whole = flags & _BEGIN_END == _BEGIN_END
            if whole and self.partial is None:
                self._message(frame, length > self.mtu)
                continue
            if flags & _FLAG_BEGIN and not whole and self.partial is None:
                self.partial = bytearray(frame)
            elif self.partial is not None and not flags & _FLAG_BEGIN:
                self.partial += frame
            else:
                raise ServerUnavailableError(
                    f"archive sink: staging recording {recording_id} holds a broken fragmented "
                    "message"
                )
            if flags & _FLAG_END:
                message, self.partial = self.partial, None
                self._message(memoryview(message), _longest_frame(message) > self.mtu)
        if covered != len(view):
            raise ServerUnavailableError(
                f"archive sink: a replay block of staging recording {recording_id} does not end "
                f"on a frame ({covered} of {len(view)} bytes)"
            )

    def _feed_run(self, view: memoryview, aligned: int) -> None:
        """Frames all of one length, each a whole message: sliced into blocks by arithmetic
        (no step per message)."""
        at, size = 0, len(view)
        while at < size:
            take = (min(self.room, self.BLOCK_BYTES) - len(self.out)) // aligned * aligned
            if take <= 0:
                if self.out:
                    self.flush()
                else:  # not even one fits the rest of the term: offered singly, pads it
                    self._single(*_payload_of(view[at : at + aligned]))
                    at += aligned
                continue
            take = min(take, size - at)
            self.out += view[at : at + take]
            self.messages += take // aligned
            at += take

    def _message(self, frames_: memoryview, oversize: bool) -> None:
        n = len(frames_)
        if len(self.out) + n > min(self.room, self.BLOCK_BYTES):
            self.flush()
        if oversize or n > self.room:  # even an empty block would not take it
            self._single(*_payload_of(frames_))
            return
        self.out += frames_
        self.messages += 1

    def flush(self) -> None:
        if self.out:
            if self.digest is not None:
                self.digest.update(self.out)
            self.pub.offer_block_blocking(self.out, timeout_s=self.timeout_s)
            self.blocks += 1
            self.out.clear()
        self.room = self._room()

    def finish(self, recording_id: int) -> None:
        if self.partial is not None:
            raise ServerUnavailableError(
                f"archive sink: staging recording {recording_id} ends inside a fragmented message"
            )
        self.flush()


def _staged_marker(recording_id: int) -> ServerUnavailableError:
    return ServerUnavailableError(
        f"archive sink: staging recording {recording_id} holds a frame with the markers' "
        f"reserved value {MARKER_RESERVED_VALUE:#x}, which the sink's tasks never stage "
        "(injected into the staging stream?): not relayed, the commit fails"
    )


_rv_at = struct.Struct("<q").unpack_from
_FLAG_BEGIN, _FLAG_END, _TYPE_PAD = int(DataFlags.BEGIN), int(DataFlags.END), int(FrameType.PAD)
_BEGIN_END = _UNFRAGMENTED = _FLAG_BEGIN | _FLAG_END
_TYPE_DATA = int(FrameType.DATA)
_header = DATA_HEADER.pack
_ZEROS = bytes(32)


_UNIFORM_MIN_FRAMES = 16  # below this numpy's fixed cost is more than a step per frame


def _uniform_frames(view: memoryview, mtu: int) -> int:
    """The aligned frame length if ``view`` is only unfragmented DATA frames of one length (at
    most ``mtu``): fixed-size rows, the common case; else 0."""
    size = len(view)
    if size < 32 * _UNIFORM_MIN_FRAMES:
        return 0
    first = int.from_bytes(view[0:4], "little", signed=True)
    aligned = (first + 31) & -32
    if first < DATA_HEADER_LENGTH or first > mtu or size % aligned:
        return 0
    return aligned if uniform_run(view, 0, first) == size // aligned else 0


def _longest_frame(data: bytearray) -> int:
    return max(length for _at, _aligned, length, _flags, _type in frames(data))


def _payload_of(data: memoryview) -> tuple[bytes, int]:
    """The payload and reserved value of one message's whole frames."""
    rv = int.from_bytes(data[24:32], "little", signed=True)
    return b"".join(data[at + 32 : at + length] for at, _a, length, _f, _t in frames(data)), rv


# ------------------------------------------------------------------ tasks: staging


@dataclass
class ArchiveStaged(WriterCommitMessage):
    """One task attempt's staging recording (``recording_id`` -1: the task had no rows)."""

    partition: int = 0
    attempt: int = 0
    recording_id: int = -1
    stop_position: int = 0
    rows: int = 0
    initial_term_id: int = 0
    term_length: int = 0
    extra: dict = field(default_factory=dict)
    archive: str = ""  # the control channel of the archive it is staged on ("": ``archive``)


def _staging_alias(identity: str, batch: int) -> str:
    return f"{STAGING_ALIAS_PREFIX}{sink_hash(identity)}-{batch}"


def _payloads(
    o: ArchiveSinkOptions, iterator: Iterator[pa.RecordBatch]
) -> Iterator[tuple[list[bytes], list[int] | None]]:
    """(payloads, reserved values or None) of each non-empty Arrow batch, in the sink's
    format."""
    s = o.sink
    if s.sbe is not None:
        chunk: list[bytes] = []
        for payload in encode_task(iterator, s.sbe):
            chunk.append(payload)
            if len(chunk) == 4096:
                yield chunk, None
                chunk = []
        if chunk:
            yield chunk, None
        return
    for batch in iterator:
        payloads, reserved = sink_payloads(batch, s.format, s.compression)
        if reserved is not None and MARKER_RESERVED_VALUE in reserved:
            raise ConfigurationError(
                "reserved_value",
                MARKER_RESERVED_VALUE,
                "a reserved value other than the archive sink's marker value "
                f"{MARKER_RESERVED_VALUE:#x}",
            )
        if payloads:
            yield payloads, reserved


def _staging_archive(o: ArchiveSinkOptions) -> tuple[ArchiveClient, ArchiveSinkOptions]:
    """A session with the first archive that answers, ``archive`` first, then the replicas in
    order (a task stages beside a dead primary), and the options on it. Without replicas the
    connect waits ``timeoutMs``; with them, an archive whose port is closed is refused at once,
    one that answers nothing costs at most ``health.PROBE_S``, and one that failed lately in
    this process ``health.RECHECK_S`` (given ``PROBE_S`` again when none other answers; see
    :mod:`.health`)."""
    if not o.replicas:
        return connect(o.connect), o
    options = [sink_on_archive(o, k) for k in range(1 + len(o.replicas))]
    failed = [on for on in options if health.is_failed(on.connect.control_channel)]
    tries = [(on, health.RECHECK_S if on in failed else health.PROBE_S) for on in options]
    tries += [(on, health.PROBE_S) for on in failed]  # when none answered
    for n, (on, probe_s) in enumerate(tries):
        channel = on.connect.control_channel
        if n < len(options) and on in failed:
            health.count_recheck()  # a marked archive probed (RECHECK_S) in its order
        try:
            client = health.connect(on.connect, probe_s)
        except REPLICA_FAILURES as exc:
            health.mark_failed(channel)
            if n == len(tries) - 1:
                raise
            log.warning(
                "archive sink staging: %s: %s; trying the next replica", channel, describe(exc)
            )
            continue
        health.mark_ok(channel)
        return client, on
    raise AssertionError("unreachable")


def stage(
    o: ArchiveSinkOptions, identity: str, batch: int, iterator: Iterator[pa.RecordBatch]
) -> ArchiveStaged:
    """Publish this task's rows to a staging recording of its own (see the module docstring)."""
    partition, attempt = task_attempt()
    rows = _payloads(o, iterator)
    first = next(rows, None)
    if first is None:
        return ArchiveStaged(partition, attempt)
    client, on = _staging_archive(o)
    timeout = o.sink.settings.timeout_s
    sid = _session_id()
    params = f"session-id={sid}|alias={_staging_alias(identity, batch)}"
    record_channel = f"{on.staging_channel}|{params}"
    with client:
        sub_id = client.start_recording(record_channel, o.staging_stream_id, auto_stop=True)
        pub = None
        recording_id = -1
        try:
            pub = client.driver.add_publication(
                f"{record_channel}|term-length={o.term_length}|mtu={o.mtu}", o.staging_stream_id
            )
            if not pub.wait_until_connected(timeout):
                raise ServerUnavailableError(
                    f"archive sink: the archive did not subscribe to {on.staging_channel} "
                    f"within {timeout:g} s"
                )
            recording_id = client.wait_for_signal(
                lambda e: e.subscription_id == sub_id and e.signal == RecordingSignal.START
            ).recording_id
            blocks = _Blocks(pub, timeout)
            blocks.add_many(*first)
            for payloads, reserved in rows:
                blocks.add_many(payloads, reserved)
            blocks.finish(-1)
            count = blocks.messages
            end = pub.position
            _wait_recorded(client, recording_id, end, f"task {partition}'s rows")
            return ArchiveStaged(
                partition,
                attempt,
                recording_id,
                end,
                count,
                pub.initial_term_id,
                o.term_length,
                archive="" if on is o else on.connect.control_channel,
            )
        except TransportError as exc:
            raise ServerUnavailableError(f"archive sink staging: {exc}") from exc
        except BaseException:
            if recording_id < 0:  # no recording yet: do not leave the subscription behind
                try:
                    client.stop_recording_subscription(sub_id)
                except ArchiveClientError:
                    pass
            raise
        finally:
            if pub is not None:
                pub.close()


# ------------------------------------------------------------------ driver: the append


def _on_endpoint(client: ArchiveClient, channel: str, stream_id: int) -> list[RecordingDescriptor]:
    """Recordings of ``stream_id`` whose channel has exactly ``channel``'s endpoint."""
    endpoint = ChannelConfig.from_uri(channel).endpoint
    out = []
    for d in client.list_recordings_for_uri("endpoint=", stream_id):
        try:
            if ChannelConfig.from_uri(d.stripped_channel).endpoint == endpoint:
                out.append(d)
        except ChannelError:
            continue  # a channel this transport cannot parse is not one of ours
    return out


@dataclass
class CommitStats:
    """What one commit did (logged; a counter for everything skipped, cut or purged)."""

    appended_rows: int = 0
    appended_parts: int = 0
    relayed_blocks: int = 0  # offer_block calls re-publishing staged frames
    relayed_singly: int = 0  # staged messages re-offered one by one (term end, wider mtu)
    skipped_duplicate: int = 0
    truncated_bytes: int = 0
    purged_staging: int = 0
    purged_orphans: int = 0
    unpurged_staging: int = 0  # staging recordings left on an archive lost after the commit
    target_recording_id: int = -1
    begin_position: int = -1
    end_position: int = -1
    replicas_in_sync: int = 0  # replicas holding the batch's END (the primary not counted)
    replicas_repaired: int = 0  # copies cut back or purged before being brought up to date
    replicas_failed: int = 0  # replicas not in sync with the batch (unreachable, failed)
    replications_stopped: int = 0  # replications given up on (timeoutMs) and stopped
    epoch: int = 0  # the sink's epoch the batch was written under (0: none, no replicas)
    epochs_opened: int = 0  # epoch openings appended (a new primary, or a set not in step)


class ArchiveCommitter:
    """The driver's side: find the sink's target recording, recover its tail, append a batch
    once. One instance per commit call (it holds a control session)."""

    def __init__(
        self,
        o: ArchiveSinkOptions,
        identity: str,
        client: ArchiveClient,
        promoted: bool = False,
        epoch: int | None = None,
        owner: int = 0,
        opens_epoch: bool = False,
    ) -> None:
        """``promoted``: ``client`` is a replica's (its copy of the target found by the sink's
        alias alone: the copy keeps the primary's channel). ``epoch`` / ``owner`` /
        ``opens_epoch``: what the sink's election decided (:class:`Election`); ``epoch`` None:
        the target's last END's epoch and owner, without an election (one archive, or tests)."""
        self.o = o
        self.identity = identity  # in the markers: sinkId scoped to the query's checkpoint
        self.client = client
        self.promoted = promoted
        self.epoch = epoch
        self.owner = owner
        self.opens_epoch = opens_epoch
        self.alias = target_alias(o.sink.sink_id or identity)  # the target: by sinkId
        self._staging: dict[str, ArchiveClient] = {}  # sessions with the other archives

    def staging_connect(self, part: ArchiveStaged) -> ArchiveConnect:
        """How to reach the archive ``part`` is staged on."""
        if part.archive in ("", self.o.connect.control_channel):
            if not part.archive and self.promoted:
                return self.o.replicas[0]  # ``archive`` (first of a promoted's)
            return self.o.connect
        for c in self.o.replicas:
            if c.control_channel == part.archive:
                return c
        raise ServerUnavailableError(
            f"archive sink: partition {part.partition} was staged on {part.archive}, not an "
            "archive of this sink"
        )

    def staging_client(self, part: ArchiveStaged) -> ArchiveClient:
        """A session with the archive ``part`` is staged on."""
        c = self.staging_connect(part)
        return self.client if c is self.o.connect else self._other(c)

    def _other(self, c: ArchiveConnect) -> ArchiveClient:
        client = self._staging.get(c.control_channel)
        if client is None:
            client = self._staging[c.control_channel] = health.connect(c)
        return client

    def close(self) -> None:
        for client in self._staging.values():
            client.close()
        self._staging.clear()

    # ---------------------------------------------------------- the target

    def target(self) -> RecordingDescriptor | None:
        """The sink's target recording: the newest recording of the stream on the sink's
        channel whose original channel carries the sink's alias."""
        if self.promoted:
            return sink_recording(self.client, self.alias, self.o.sink.stream_id)
        found = [
            d
            for d in _on_endpoint(self.client, self.o.channel, self.o.sink.stream_id)
            if f"alias={self.alias}" in d.original_channel and is_sink_target(d.original_channel)
        ]
        return max(found, key=lambda d: d.recording_id) if found else None

    def stopped_target(self) -> RecordingDescriptor | None:
        d = self.target()
        if d is None:
            return None
        if d.is_active:  # an append of a driver that died: stop what it recorded
            log.warning(
                "archive sink %s: target %d still active; stopping it",
                self.identity,
                d.recording_id,
            )
            self.client.stop_recording_by_identity(d.recording_id)
            _wait_stopped(self.client, d.recording_id)
            d = self.client.list_recording(d.recording_id)
        return d

    def tail(self, d: RecordingDescriptor) -> Tail:
        end = (
            d.stop_position
            if d.stop_position >= 0
            else self.client.recording_position(d.recording_id)
        )
        return read_tail(self.client, d.recording_id, d.start_position, end, d.term_buffer_length)

    # ---------------------------------------------------------- commit

    def commit(
        self,
        batch: int,
        parts: list[ArchiveStaged],
        stats: CommitStats | None = None,
        replicas: Replicas | None = None,
    ) -> CommitStats:
        """Append the batch once; with ``replicas``, complete only when the batch's END is on
        ``minInSyncReplicas - 1`` of them too (:mod:`.replicas`), else NOT_ENOUGH_REPLICAS with
        the batch cut off again."""
        stats = stats or CommitStats()
        staged = sorted((p for p in parts if p.recording_id >= 0), key=lambda p: p.partition)
        if replicas is not None:
            self.require_replicas(batch, replicas)
        d = self.stopped_target()
        ends: dict[int, Marker] = {}  # the primary's END markers known, by their end
        tail: Tail | None = None  # the target's tail while nothing cut or appended since
        if d is not None:
            stats.target_recording_id = d.recording_id
            tail = self.tail(d)
            if self.epoch is None:  # no election: go on with the target's
                last = tail.last
                self.epoch, self.owner = (0, 0) if last is None else (last.epoch, last.owner)
            if tail.last is not None and tail.last.kind == END:
                ends[tail.last.end_position] = tail.last
            if tail.torn:
                assert tail.last is not None
                cut = tail.last.begin_position
                log.warning(
                    "archive sink %s: recording %d ends in an append of batch %d that never "
                    "finished; truncating [%d, %d)",
                    self.identity,
                    d.recording_id,
                    tail.last.batch,
                    cut,
                    tail.end,
                )
                self.client.truncate_recording(d.recording_id, cut)
                stats.truncated_bytes += tail.end - cut
                d = self.client.list_recording(d.recording_id)
                assert d is not None
                tail = None
        if replicas is not None and self.opens_epoch:
            d, tail = self.open_epoch(batch, replicas, d, stats, ends), None
        stats.epoch = self.epoch or 0
        if d is not None:
            last = self.last_batch_end(d, tail)
            if last is not None and last.identity == self.identity and last.batch == batch:
                log.info(
                    "archive sink %s: batch %d is in recording %d already; nothing appended",
                    self.identity,
                    batch,
                    d.recording_id,
                )
                stats.skipped_duplicate += 1
                if replicas is not None:  # a commit repeated: the batch still needs its copies
                    self.replicate(
                        batch, replicas, d, last.begin_position, stats, ends, repeated=True
                    )
                self.purge(batch, parts, stats)
                return stats
        base = -1 if d is None else d.stop_position
        append = Append(self, d, batch, len(staged))
        prefetch = _Prefetch(self, staged)  # replaying while the append opens and publishes
        try:
            append.begin()
            for k, part in enumerate(staged):
                stats.appended_rows += append.write_part(part, stats, prefetch.blocks(k))
                stats.appended_parts += 1
            append.end(stats.appended_rows)
            stats.target_recording_id = append.recording_id
            stats.begin_position, stats.end_position = append.begin_position, append.position
        finally:
            prefetch.close()
            append.close()
        if replicas is not None:
            appended = self.client.list_recording(append.recording_id)
            assert appended is not None
            if append.end_marker is not None:
                ends[append.end_marker.end_position] = append.end_marker
            self.replicate(batch, replicas, appended, append.begin_position, stats, ends, base)
        self.purge(batch, parts, stats)
        return stats

    def last_batch_end(self, d: RecordingDescriptor, tail: Tail | None = None) -> Marker | None:
        """The END of the last batch of the stopped target ``d`` (epoch openings passed over:
        each begins where the END before it ends); None when there is none. ``tail``: ``d``'s,
        read already."""
        tail = tail or self.tail(d)
        last = tail.last if tail.last is not None and tail.last.kind == END else None
        term = d.term_buffer_length
        while last is not None and last.opens_epoch:
            at = last.begin_position
            last = end_at(self.client, d.recording_id, d.start_position, at, term, at)
        return last

    def open_epoch(
        self,
        batch: int,
        replicas: Replicas,
        d: RecordingDescriptor | None,
        stats: CommitStats,
        ends: dict[int, Marker],
    ) -> RecordingDescriptor:
        """Append the opening of this commit's epoch (no rows) and bring ``minInSyncReplicas``
        archives to it before any batch is written under it (Raft's no-op entry of a new term):
        a later election reaches one of them, sees the epoch and goes above it. Too few copies:
        cut off again and NOT_ENOUGH_REPLICAS (nothing of the batch written)."""
        base = -1 if d is None else d.stop_position
        append = Append(self, d, OPENING_BATCH, 0)
        try:
            append.begin()
            append.end(0)
        finally:
            append.close()
        appended = self.client.list_recording(append.recording_id)
        assert appended is not None and append.end_marker is not None
        ends[append.end_marker.end_position] = append.end_marker
        stats.epochs_opened += 1
        stats.target_recording_id = appended.recording_id
        log.info(
            "archive sink %s: epoch %d opened at %d of recording %d",
            self.identity,
            self.epoch,
            append.begin_position,
            appended.recording_id,
        )
        self.replicate(batch, replicas, appended, append.begin_position, stats, ends, base)
        return appended

    # ---------------------------------------------------------- replicas

    def require_replicas(self, batch: int, replicas: Replicas) -> None:
        """Before anything is appended: enough replicas answer (Kafka's NOT_ENOUGH_REPLICAS
        before the append), else the coded error and nothing written."""
        reachable = replicas.connect()
        if reachable < replicas.required:
            raise self._not_enough(batch, replicas, 1 + reachable, replicas.unreachable(), "")

    def replicate(
        self,
        batch: int,
        replicas: Replicas,
        d: RecordingDescriptor,
        begin: int,
        stats: CommitStats,
        ends: dict[int, Marker] | None = None,
        base: int | None = None,
        repeated: bool = False,
    ) -> None:
        """The stopped target ``d`` (the batch in ``[begin, stop)``) copied to every reachable
        replica; too few in sync: the batch cut off the primary and those copies, and
        NOT_ENOUGH_REPLICAS (nothing acknowledged; committed-only readers stop before it).

        ``repeated``: the batch was found committed on the primary (its END there before this
        commit), so an earlier commit may have acknowledged it (a batch write run again with
        its batchId, a driver that died before Spark logged the commit): it is never cut off,
        only NOT_ENOUGH_REPLICAS is raised. ``ends``: the primary's END markers known (by
        their end position): a copy ending there must end with the same marker (digest
        included), else it is repaired."""
        end = d.stop_position
        outcomes = replicas.sync(d, begin if base is None else base, end, ends)
        good = [o for o in outcomes if o.in_sync]
        stats.replications_stopped = replicas.stopped_replications
        stats.replicas_in_sync = len(good)
        stats.replicas_repaired += sum(bool(o.repaired) for o in outcomes)
        stats.replicas_failed = len(outcomes) - len(good)
        if len(good) >= replicas.required:
            return
        if repeated:
            failed = {o.control_channel: o.reason for o in outcomes if not o.in_sync}
            raise self._not_enough(
                batch,
                replicas,
                1 + len(good),
                failed,
                f" (it was committed before, at [{begin}, {end}): kept)",
            )
        log.warning(
            "archive sink %s: batch %d on %d replica(s) of the %d needed; cutting recording %d "
            "back to %d",
            self.identity,
            batch,
            len(good),
            replicas.required,
            d.recording_id,
            begin,
        )
        undone = f" (its append [{begin}, {end}) was undone)"
        try:
            self.client.truncate_recording(d.recording_id, begin)
            stats.truncated_bytes += end - begin
        except REPLICA_FAILURES as exc:
            # The primary was lost after its END (killed, cut off): the batch stays on it,
            # unacknowledged. The next commit's election repairs it: promoted elsewhere, the
            # old primary is cut back to the last END it shares with the new one when it is
            # back; or, back first and furthest, it is the primary again and its END of this
            # batch makes the repeated commit append nothing (a batch's rows are the same
            # every time Spark runs it).
            undone = (
                f" (its append [{begin}, {end}) could not be undone on the primary: "
                f"{describe(exc)}; the next commit repairs it)"
            )
        replicas.undo(good, begin)
        failed = {o.control_channel: o.reason for o in outcomes if not o.in_sync}
        raise self._not_enough(batch, replicas, 1 + len(good), failed, undone)

    def _not_enough(
        self, batch: int, replicas: Replicas, in_sync: int, failed: dict[str, str], undone: str
    ) -> NotEnoughReplicasError:
        required = self.o.min_insync_replicas
        why = "; ".join(f"{channel}: {reason}" for channel, reason in failed.items())
        return NotEnoughReplicasError(
            f"archive sink {self.identity}: batch {batch} not committed: minInSyncReplicas="
            f"{required} but only {in_sync} archive(s) (the primary included) can hold it"
            f"{undone}; {why}",
            required=required,
            in_sync=in_sync,
            failed=failed,
            batch=batch,
        )

    def purge(self, batch: int | None, parts: list[ArchiveStaged], stats: CommitStats) -> None:
        """Purge the staging recordings ``parts`` name, and (``batch`` not None) every stopped
        staging recording of this sink of batches up to ``batch`` (failed attempts).

        Best effort: the batch is committed (and, with replicas, on enough archives) before
        this runs, so an archive lost meanwhile (the primary killed or cut off after its
        replicas copied the batch) fails nothing; what it holds is counted
        (``unpurged_staging``) and purged by a later commit on it."""
        named: set[int] = set()
        lost: set[str] = set()  # archives that failed once: not waited for again
        for part in sorted(parts, key=lambda p: p.recording_id):
            if part.recording_id < 0:
                continue
            where = part.archive or self.o.connect.control_channel
            if where in lost:
                stats.unpurged_staging += 1
                continue
            try:
                client = self.staging_client(part)
                if client is self.client:
                    named.add(part.recording_id)
                if _stop_and_purge(client, part.recording_id):
                    stats.purged_staging += 1
            except REPLICA_FAILURES as exc:  # that archive is gone: purged when it is back
                lost.add(where)
                stats.unpurged_staging += 1
                log.warning(
                    "archive sink %s: staging recording %d on %s not purged: %s",
                    self.identity,
                    part.recording_id,
                    where,
                    describe(exc),
                )
        if batch is None or self.o.connect.control_channel in lost:
            return
        prefix = f"alias={STAGING_ALIAS_PREFIX}{sink_hash(self.identity)}-"
        try:
            staged = _on_endpoint(self.client, self.o.staging_channel, self.o.staging_stream_id)
        except REPLICA_FAILURES as exc:
            log.warning("archive sink %s: staging not swept: %s", self.identity, describe(exc))
            return
        for d in staged:
            if d.recording_id in named or not d.original_channel.count(prefix):
                continue
            tail = d.original_channel.split(prefix, 1)[1].split("|", 1)[0]
            try:
                of_batch = int(tail)
            except ValueError:
                continue
            if d.is_active or of_batch > batch:
                continue  # a straggler still running, or a later batch's: a later commit
            try:
                self.client.purge_recording(d.recording_id)
                stats.purged_orphans += 1
            except ArchiveResponseError as exc:  # the archive refused this one
                log.info("archive sink: staging recording %d not purged: %s", d.recording_id, exc)
            except REPLICA_FAILURES as exc:  # the archive is gone: a later commit sweeps
                log.warning("archive sink %s: staging not swept: %s", self.identity, describe(exc))
                return


class Append:
    """One append of a batch to the target (creating it on the first commit): BEGIN, parts,
    END, each step usable on its own (tests kill a driver between steps)."""

    def __init__(
        self, c: ArchiveCommitter, d: RecordingDescriptor | None, batch: int, partitions: int
    ) -> None:
        self.c = c
        self.d = d
        self.batch = batch
        self.partitions = partitions
        self.pub: Any = None
        self.sub_id = -1
        self.recording_id = d.recording_id if d is not None else -1
        self.begin_position = -1
        # the batch's frames as offered, for its END marker (a retry of the batch with its rows
        # in another order differs there only)
        self.digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
        self.end_marker: Marker | None = None  # the END written, with its position

    @property
    def position(self) -> int:
        return int(self.pub.position) if self.pub is not None else -1

    def _open(self) -> None:
        c, o = self.c, self.c.o
        client, timeout = c.client, o.sink.settings.timeout_s
        sid = _session_id()
        record = f"{o.channel}|session-id={sid}|alias={c.alias}"
        if self.d is None:
            self.sub_id = client.start_recording(record, o.sink.stream_id, auto_stop=True)
            pub_channel = f"{record}|term-length={o.term_length}|mtu={o.mtu}"
            signal = RecordingSignal.START
        else:
            d = self.d
            p = d.stop_position
            shift = d.term_buffer_length.bit_length() - 1
            term_id = (d.initial_term_id + (p >> shift) + 2**31) % 2**32 - 2**31
            self.sub_id = client.extend_recording(
                d.recording_id, record, o.sink.stream_id, auto_stop=True
            )
            pub_channel = (
                f"{record}|term-length={d.term_buffer_length}|mtu={d.mtu_length}"
                f"|init-term-id={d.initial_term_id}|term-id={term_id}"
                f"|term-offset={p & (d.term_buffer_length - 1)}"
            )
            signal = RecordingSignal.EXTEND
        try:
            self.pub = client.driver.add_publication(pub_channel, o.sink.stream_id)
            if not self.pub.wait_until_connected(timeout):
                raise ServerUnavailableError(
                    f"archive sink: the archive did not subscribe to {o.channel} within "
                    f"{timeout:g} s"
                )
            event = client.wait_for_signal(
                lambda e: e.subscription_id == self.sub_id and e.signal == signal
            )
        except BaseException:
            try:
                client.stop_recording_subscription(self.sub_id)
            except ArchiveClientError:
                pass
            raise
        self.recording_id = event.recording_id

    def _offer(self, payload: bytes | bytearray | memoryview, rv: int) -> None:
        assert self.pub is not None
        try:
            self.pub.offer_blocking(
                payload, reserved_value=rv, timeout_s=self.c.o.sink.settings.timeout_s
            )
        except TransportError as exc:
            raise ServerUnavailableError(f"archive sink append: {exc}") from exc

    def _marker(self, kind: int, rows: int) -> None:
        digest = self.digest.digest() if kind == END else b""
        m = Marker(
            kind,
            self.c.identity,
            self.batch,
            self.partitions,
            self.begin_position,
            rows,
            digest=digest,
            insync=self.c.o.min_insync_replicas,
            epoch=self.c.epoch or 0,
            owner=self.c.owner if self.c.epoch else 0,
            opens_epoch=self.batch == OPENING_BATCH,
        )
        payload = m.encode()
        self._offer(payload, MARKER_RESERVED_VALUE)
        if kind == END:  # where it went: a term too full for it was padded first
            end = self.position
            aligned = (DATA_HEADER_LENGTH + len(payload) + 31) & -32
            self.end_marker = replace(m, position=end - aligned, end_position=end)

    def begin(self) -> None:
        self._open()
        assert self.pub is not None
        self.begin_position = self.pub.position
        self._marker(BEGIN, 0)

    def write_part(
        self,
        part: ArchiveStaged,
        stats: CommitStats | None = None,
        replayed: Iterator[bytes] | None = None,
    ) -> int:
        """Re-publish one staging recording's messages, in blocks of whole frames
        (:class:`_Blocks`); their count. ``replayed``: its frames replayed already
        (:class:`_Prefetch`), else replayed here."""
        assert self.pub is not None
        relay = _Blocks(self.pub, self.c.o.sink.settings.timeout_s, self.digest)
        try:
            if replayed is None:
                staged = self.c.staging_client(part)
                replayed = (b.data for b in staged.replay(part.recording_id, 0, part.stop_position))
            for data in replayed:
                relay.feed(data, part.recording_id)
            relay.finish(part.recording_id)
        except TransportError as exc:
            raise ServerUnavailableError(f"archive sink append: {exc}") from exc
        if stats is not None:
            stats.relayed_blocks += relay.blocks
            stats.relayed_singly += relay.singly
        if relay.messages != part.rows:
            raise ServerUnavailableError(
                f"archive sink: staging recording {part.recording_id} of partition "
                f"{part.partition} holds {relay.messages} messages, not the {part.rows} the task "
                "wrote"
            )
        return relay.messages

    def end(self, rows: int) -> None:
        self._marker(END, rows)
        client = self.c.client
        _wait_recorded(client, self.recording_id, self.position, "the append")
        client.stop_recording_subscription(self.sub_id)
        self.sub_id = -1
        _wait_stopped(client, self.recording_id)

    def close(self) -> None:
        if self.sub_id >= 0:  # failed mid-way: stop recording (the next commit truncates)
            try:
                self.c.client.stop_recording_subscription(self.sub_id)
            except ArchiveClientError:
                pass
            self.sub_id = -1
        if self.pub is not None:
            self.pub.close()
            self.pub = None


_DONE = object()


class _Prefetch:
    """The committed staging recordings replayed ahead of the append, in partition order: a
    thread with a control session of its own per recording (at most :attr:`AHEAD` started and
    not yet published, each holding at most :attr:`QUEUED` blocks of :attr:`BLOCK` bytes), so
    the archive replays the next parts while the driver opens the target and publishes the
    current one (replaying in the append's thread, each replay waited on the target's flow
    control and the target on the replay). :meth:`blocks` yields a part's frames in order,
    raising what its replay raised; :meth:`close` stops every replay still running."""

    AHEAD = 3
    QUEUED = 32
    BLOCK = 256 * 1024

    def __init__(self, c: ArchiveCommitter, parts: list[ArchiveStaged]) -> None:
        self.c = c
        self.parts = parts
        self.timeout_s = c.o.sink.settings.timeout_s
        self.stopping = threading.Event()
        self.queues: list[queue.Queue[Any]] = []
        self.threads: list[threading.Thread] = []
        self._start_up_to(self.AHEAD)

    def _start_up_to(self, n: int) -> None:
        while len(self.queues) < min(n, len(self.parts)):
            part = self.parts[len(self.queues)]
            q: queue.Queue[Any] = queue.Queue(self.QUEUED)
            t = threading.Thread(
                target=self._replay,
                args=(part, q),
                name=f"archive-sink-replay-{part.recording_id}",
                daemon=True,
            )
            self.queues.append(q)
            self.threads.append(t)
            t.start()

    def _replay(self, part: ArchiveStaged, q: queue.Queue[Any]) -> None:
        try:
            with connect(self.c.staging_connect(part)) as client:
                for b in client.replay(
                    part.recording_id, 0, part.stop_position, block_bytes=self.BLOCK
                ):
                    if not self._put(q, b.data):
                        return
            self._put(q, _DONE)
        except BaseException as exc:  # handed to the append's thread
            self._put(q, exc)

    def _put(self, q: queue.Queue[Any], item: object) -> bool:
        while not self.stopping.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def blocks(self, k: int) -> Iterator[bytes]:
        self._start_up_to(k + self.AHEAD)
        q = self.queues[k]
        while True:
            try:  # the replay fails by itself after timeout_s without progress
                item = q.get(timeout=2 * self.timeout_s + 5)
            except queue.Empty:
                raise ServerUnavailableError(
                    f"archive sink: the replay of staging recording "
                    f"{self.parts[k].recording_id} gave nothing for {2 * self.timeout_s + 5:g} s"
                ) from None
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(self.timeout_s + 5)


def commit_batch(o: ArchiveSinkOptions, identity: str, batch: int, messages: list) -> CommitStats:
    parts = [m for m in messages if isinstance(m, ArchiveStaged)]
    if not o.replicas:
        with connect(o.connect) as client:
            stats = ArchiveCommitter(o, identity, client).commit(batch, parts)
        log.info("archive sink %s: batch %d: %s", identity, batch, stats)
        return stats
    election = elect(o, target_alias(o.sink.sink_id or identity))
    k = election.chosen
    po = sink_on_archive(o, k)
    chosen = election.clients[k]
    assert chosen is not None
    others = [c for i, c in enumerate(election.clients) if i != k]
    errors = [e for i, e in enumerate(election.errors) if i != k]
    committer = ArchiveCommitter(
        po,
        identity,
        chosen,
        promoted=k != 0,
        epoch=election.epoch,
        owner=election.owner,
        opens_epoch=election.opens_epoch,
    )
    try:
        with Replicas(po, identity, others, errors) as replicas:
            stats = committer.commit(batch, parts, replicas=replicas)
    finally:
        committer.close()
        chosen.close()
    log.info("archive sink %s: batch %d: %s", identity, batch, stats)
    return stats


def abort_batch(o: ArchiveSinkOptions, identity: str, batch: int, messages: list) -> None:
    parts = [m for m in messages if isinstance(m, ArchiveStaged)]
    stats = CommitStats()
    if not o.replicas:
        with connect(o.connect) as client:
            ArchiveCommitter(o, identity, client).purge(None, parts, stats)
    else:  # parts may be staged on several archives, some gone: each purged where it is
        for archive in sorted({p.archive for p in parts if p.recording_id >= 0}):
            c = replace(o.connect, control_channel=archive) if archive else o.connect
            try:
                with health.connect(c) as client:
                    for p in parts:
                        if p.archive == archive and p.recording_id >= 0:
                            stats.purged_staging += _stop_and_purge(client, p.recording_id)
            except REPLICA_FAILURES as exc:
                log.warning(
                    "archive sink %s: batch %d: staging on %s not purged (the next commit "
                    "that reaches it does): %s",
                    identity,
                    batch,
                    c.control_channel,
                    describe(exc),
                )
    log.warning("archive sink %s: batch %d aborted: %s", identity, batch, stats)


# ------------------------------------------------------------------ the store


@dataclass(frozen=True, slots=True)
class ArchiveSink:
    """The sink's side of one Aeron Archive: stage, commit and abort as above."""

    options: ArchiveSinkOptions
    name = "archive"

    def stage(self, identity: str, batch_id: int, rows: Iterator[pa.RecordBatch]) -> ArchiveStaged:
        return stage(self.options, identity, batch_id, rows)

    def commit(self, identity: str, batch_id: int, messages: list, repeated: str | None) -> None:
        """A repeated commit appends nothing: the target's END marker of the batch says so."""
        commit_batch(self.options, identity, batch_id, messages)

    def abort(self, identity: str, batch_id: int, messages: list) -> None:
        abort_batch(self.options, identity, batch_id, messages)


__all__ = [
    "Append",
    "ArchiveCommitter",
    "ArchiveSink",
    "ArchiveStaged",
    "CommitStats",
    "abort_batch",
    "commit_batch",
    "connect",
    "stage",
]
