"""What the server core reads and writes: recordings, replays, publishers, sink writers, ingest.

:class:`ArchiveStore` implements the core's ``Store`` protocol and the committer's
``SinkRecordings`` protocol on top of
:class:`~aeron_spark.transport.archive.RecordingStore`.

Visibility rule: for a sink recording the readable end is the end of its last *committed* batch
(``set_visible``), never the raw recorded end, so readers never see half a commit. Every other
recording is readable up to its recorded end.

Ingest: a subscription on ``config.ingest_channel`` per ingest stream id; every image (one plain
Aeron publisher session) becomes one recording from its first message on, fed with
``Image.block_poll`` (raw frames as the publisher wrote them, PAD frames included), stopped when
the image goes away at the end of its last whole message (see
:mod:`~aeron_spark.transport.archive.recorder`). Over UDP the
subscription makes images only for sender hosts that pass the server's ``deny`` / ``allow`` and
``ingest_allow`` (``ServerConfig.ingest_source_filter``): another host's SETUP makes no image and
is counted by the transport (``setups_source_refused``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from aeron_spark.connector.errors import (
    ConnectorError,
    PositionOutOfRangeError,
    ServerError,
)
from aeron_spark.connector.server.catalog import Catalog
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.server.resources import (
    SpaceGuard,
    file_cache_capacity,
    nofile_limits,
    spare_open_budget,
)
from aeron_spark.connector.server.scan import scan
from aeron_spark.connector.server.stat import replace_text
from aeron_spark.transport.archive import Recorder, Recording, RecordingStore
from aeron_spark.transport.archive import UnknownRecordingError as ArchiveUnknownRecording
from aeron_spark.transport.protocol.logbuffer import LogGeometry, is_reserved_session_id

LOCAL_READ_TOKEN = "local-read.token"

log = logging.getLogger(__name__)


def _write_token(path: str, token: str) -> None:
    """``token`` into ``path`` through a temporary file of a name nobody can have prepared
    (``stat.replace_text``: ``mkstemp``, never through a symlink, never opening a FIFO). Was a
    plain open of ``path + ".tmp"``: a FIFO put there hung the start for good, a symlink there
    was followed and the file it named overwritten. Temporary files a killed server left (and
    whatever sits at the old fixed name) are removed first: the caller holds the directory."""
    directory, name = os.path.split(path)
    for left in os.listdir(directory):
        if left.startswith(name + ".") and left.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, left))  # a link or FIFO itself, not its target
    replace_text(path, token)


def _random_session_id() -> int:
    while True:
        session_id = random.getrandbits(32) - 2**31
        if not is_reserved_session_id(session_id):
            return session_id


class ReplayCursor:
    """Reads ``[position, end)`` (``end=None``: follow the live end) of one recording."""

    def __init__(self, store: ArchiveStore, rec: Recording, start: int, end: int | None) -> None:
        self._store = store
        self._rec = rec
        self.position = start
        self.end = end
        self._closed = False

    def read(self, max_bytes: int, now_ns: int) -> tuple[int, int, int, bytes] | None:
        limit = self._store.visible_end(self._rec)
        if self.end is not None:
            limit = min(limit, self.end)
        if self.position >= limit:
            return None
        start = self.position
        end, frames, ts = self._rec.read(start, max_bytes, limit)
        if end == start:  # below the readable end there is always a whole frame to read
            raise ServerError(
                f"recording {self._rec.d.recording_id}: no complete frame at {start} although "
                f"the recording is readable to {limit} (damaged segment file?)"
            )
        self.position = end
        return start, end, ts, frames

    @property
    def done(self) -> bool:
        if self.end is not None:
            return self.position >= self.end
        stop = self._store.stop_position(self._rec)
        return stop is not None and self.position >= stop

    def close(self) -> None:
        self._closed = True


class _Publisher:
    """A session's publications into one stream: one recording, framed by the server."""

    def __init__(self, store: ArchiveStore, rec: Recording) -> None:
        self._store = store
        self.rec = rec
        self.recording_id = rec.d.recording_id
        geometry = LogGeometry(rec.d.term_length, rec.d.mtu, rec.d.initial_term_id)
        # publish() writes each block out before the next is framed: the framer may reuse memory,
        # and a large payload (a view into the request it came in) is written as it is beside
        # its frame headers (os.pwritev), never copied into a block (issue 31 item 5)
        self._framer = Framer(
            geometry, rec.d.session_id, rec.d.stream_id, rec.recorded_position, reuse_blocks=True
        )
        # the acknowledged end, durable before each answer: recovery cuts what lies past it
        rec.acknowledge(rec.recorded_position)

    def publish(
        self,
        payloads: Sequence[bytes | memoryview],
        reserved_values: Sequence[int] | None,
        now_ns: int,
    ) -> int:
        """Frame and append ``payloads``; the recorded end after them.

        All or nothing: when an append fails (disk full, I/O error, no descriptor) the blocks
        this call already appended are cut off again and the framer goes back to the recorded
        end, so the error is the only answer, nothing of the call is on disk, and the session's
        next publish continues at the same position."""
        # every payload's length checked before anything is written (the longest suffices)
        self._framer.check(max(map(len, payloads), default=0))
        self._store.space.check("publish")
        timestamp_ns = self._store.clock()
        start = self.rec.recorded_position
        try:
            for position, block in self._framer.frame_gathered(payloads, reserved_values):
                self.rec.append(block, position, timestamp_ns)
            if self._store.config.fsync:
                self.rec.force()
            self.rec.acknowledge(self.rec.recorded_position)
        except BaseException:
            self.rec.rollback(start)
            self._framer.position = start
            with contextlib.suppress(OSError):  # it may have been written before a failed fsync
                self.rec.acknowledge(start)
            raise
        return self.rec.recorded_position

    def close(self, now_ns: int) -> None:
        self.rec.stop(self._store.clock())


class _SinkWriter:
    def __init__(self, rec: Recording, clock: Any) -> None:
        self.rec = rec
        self._clock = clock
        self.recording_id = rec.d.recording_id
        self.session_id = rec.d.session_id
        self.stream_id = rec.d.stream_id
        self.geometry = LogGeometry(rec.d.term_length, rec.d.mtu, rec.d.initial_term_id)

    @property
    def recorded_position(self) -> int:
        return self.rec.recorded_position

    def append(self, block: bytes | bytearray | memoryview, position: int, now_ns: int) -> None:
        self.rec.append(block, position, self._clock())

    def rollback(self, position: int) -> None:
        self.rec.rollback(position)

    def force(self) -> None:
        self.rec.force()


class ArchiveStore:
    def __init__(self, config: ServerConfig, driver: Any) -> None:
        self.config = config
        self.driver = driver
        # recordings carry wall-clock (epoch) timestamps: position_at answers Spark's
        # startingTimestamp; the now_ns the core passes around is monotonic (leases only)
        self.clock = time.time_ns
        self.space = SpaceGuard(config.directory, config.min_free_bytes)
        soft = nofile_limits()[0]
        max_open = config.max_open_files or file_cache_capacity(soft)
        self.recordings = RecordingStore(
            config.directory, config.fsync, max_open, spare_open_budget(soft, max_open)
        )
        self.ingest_held_back = 0  # ingest passes skipped below the free-space watermark
        # proves to a client that it sees this directory (local reads and sink writes)
        self.local_token: dict[str, str] | None = None
        self._token_path = os.path.join(os.path.abspath(config.directory), LOCAL_READ_TOKEN)
        if config.local_reads or config.local_writes:
            self.local_token = {"token_path": self._token_path, "token": secrets.token_hex(16)}
            try:
                _write_token(self._token_path, self.local_token["token"])
            except OSError as exc:  # a full disk: start anyway, every read over its session
                log.warning(
                    "local reads and writes are off: cannot write %s: %s", self._token_path, exc
                )
                self.local_token = None
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._token_path)
        self._visible: dict[int, int] = {}
        self._sink_writers: dict[tuple[int, str], _SinkWriter] = {}
        self._recorders: list[Recorder] = []
        self.ingest_polled = False  # ingest media that cannot wake the loop: it polls them
        self.catalog = Catalog(
            self.recordings.recordings, self._info, self._is_live, config.allowed_stream_ids
        )
        # the last message boundary found in a recording the server did not frame (ingest):
        # positions() scans on from there, never from the start again
        self._boundaries: dict[int, int] = {}
        self._finished_rows: dict[int, list[Any]] = {}  # positions() of finished recordings
        self.message_end_scanned_bytes = 0  # what positions() had to scan (new ingest data only)

    def _is_live(self, rec: Recording) -> bool:
        """May it still change by itself (not stopped, a sink's, its stop file pending)?"""
        return rec.stop_position is None or rec.stop_pending or rec.d.source.startswith("sink:")

    # --- reading ------------------------------------------------------------------------------

    def visible_end(self, rec: Recording) -> int:
        cap = self._visible.get(rec.d.recording_id)
        if rec.d.source.startswith("sink:"):
            return cap if cap is not None else rec.d.start_position
        return rec.recorded_position

    def stop_position(self, rec: Recording) -> int | None:
        if rec.d.source.startswith("sink:"):
            return None
        return rec.stop_position

    def recording_gone(self, recording_id: int) -> bool:
        """Nothing of ``recording_id`` is left nor will be: no such recording (its directory
        deleted), or a finished one purged to its end (a consumer's position of it holds
        nothing: dropped from the consumers' file)."""
        rec = self.recordings.recordings.get(recording_id)
        if rec is None:
            return True
        stop = self.stop_position(rec)
        return stop is not None and rec.purged_position >= stop

    def _info(self, rec: Recording) -> dict[str, Any]:
        d = rec.d
        visible = self.visible_end(rec)
        return {
            "recording_id": d.recording_id,
            "stream_id": d.stream_id,
            "session_id": d.session_id,
            "source": d.source,
            "start_position": d.start_position,
            "stop_position": self.stop_position(rec),
            "recorded_position": visible,
            # where a reader may stop: an ingest recording's end may be inside a message still
            # coming in (a source that read to it failed: test_attack_ingest_reads.py)
            "message_end": self.message_end(rec, visible, rec.purged_position),
            "purged_position": rec.purged_position,
            "start_timestamp_ns": d.start_timestamp_ns,
            "term_length": d.term_length,
            "mtu": d.mtu,
            "initial_term_id": d.initial_term_id,
        }

    def list_recordings(self, stream_ids: set[int] | None) -> list[dict[str, Any]]:
        return [self._info(rec) for rec in self.catalog.recordings(stream_ids)]

    def streams(self) -> list[dict[str, Any]]:
        """Per stream: recordings, active ones, bytes (``list_streams``), from the catalog's
        totals (the live recordings re-read, not every one: issue 31 item 4)."""
        return self.catalog.current_streams()

    def recording_info(self, recording_id: int) -> dict[str, Any]:
        return self._info(self.recordings.get(recording_id))

    def stream_of(self, recording_id: int) -> int:
        stream_id = self.catalog.stream_of(recording_id)
        if stream_id is None:
            self.recordings.get(recording_id)  # raises the archive's unknown recording error
            raise AssertionError("unreachable")  # pragma: no cover
        return stream_id

    def positions(self, stream_ids: set[int] | None) -> list[list[Any]]:
        """Per recording of ``stream_ids`` (None: all), from the catalog, never scanning what
        was scanned before: ``[recording_id, stream_id, start_position, purged_position,
        recorded_position, message_end, stop_position]``. ``message_end`` is the last message
        boundary at or below the readable end: the readable end itself for a recording the
        server framed (publish, sink commits: whole messages only); for an ingest recording
        (frames as a publisher sent them, a fragmented message maybe cut at the end) found by
        scanning on from the boundary found before."""
        out = []
        finished = self._finished_rows
        for rec in self.catalog.recordings(stream_ids):
            row = finished.get(rec.d.recording_id)
            if row is not None and row[3] == rec.purged_position:
                out.append(row)  # finished: changes only when purged
                continue
            d = rec.d
            ended = not self._is_live(rec)  # asked first: once ended, what is read is final
            visible = self.visible_end(rec)
            purged = rec.purged_position
            row = [
                d.recording_id,
                d.stream_id,
                d.start_position,
                purged,
                visible,
                self.message_end(rec, visible, purged),
                self.stop_position(rec),
            ]
            if ended:
                finished[d.recording_id] = row
            out.append(row)
        return out

    def message_end(self, rec: Recording, visible: int, purged: int) -> int:
        source = rec.d.source
        if source.startswith(("session:", "sink:")):
            return visible  # framed by the server: whole messages only
        rid = rec.d.recording_id
        known = max(self._boundaries.get(rid, rec.d.start_position), purged)
        if known >= visible:
            return min(known, visible)
        found = scan(ReplayCursor(self, rec, known, visible), known)["end"]
        self.message_end_scanned_bytes += visible - known
        self._boundaries[rid] = found
        return int(found)

    def position_at(self, recording_id: int, timestamp_ns: int) -> int:
        """The first message boundary recorded at or after ``timestamp_ns``. The time index
        names the starts of appends: whole messages where the server framed them, but where a
        block of an ingest image began, which may be inside a message: then the next message's
        start (the message there has its first position's time, before ``timestamp_ns``)."""
        rec = self.recordings.get(recording_id)
        visible = self.visible_end(rec)
        at = min(rec.position_at(timestamp_ns), visible)
        if rec.d.source.startswith(("session:", "sink:")):
            return at
        limit = self.message_end(rec, visible, rec.purged_position)
        return limit if at >= limit else rec.next_message_start(at, limit)

    def open_replay(self, recording_id: int, start: int, end: int | None) -> ReplayCursor:
        rec = self.recordings.get(recording_id)
        visible = self.visible_end(rec)
        if end is not None:
            if end < start:
                raise PositionOutOfRangeError(
                    f"recording {recording_id}: replay end {end} is before its start {start}",
                    position=end,
                    start_position=start,
                    end_position=visible,
                )
            rec.check_position(end, visible, "replay end")
        rec.check_position(start, visible, "replay start")
        return ReplayCursor(self, rec, start, end)

    def local_read(self, recording_id: int, start: int, end: int) -> dict[str, Any] | None:
        """Where a client that sees this directory reads ``[start, end)`` itself (checked like
        a replay: frame boundaries within what is visible, not purged); None when local reads
        are off."""
        self.open_replay(recording_id, start, end).close()
        if not self.config.local_reads or self.local_token is None:
            return None
        rec = self.recordings.get(recording_id)
        return {"directory": os.path.abspath(rec.directory), **self.local_token}

    def purge(self, recording_id: int, position: int, now_ns: int) -> int:
        rec = self.recordings.get(recording_id)
        try:
            return rec.purge(min(position, self.visible_end(rec)))
        finally:
            self.catalog.touch(recording_id)  # a stopped recording changes only so

    # --- writing ------------------------------------------------------------------------------

    def _create(self, stream_id: int, source: str, now_ns: int) -> Recording:
        initial_term_id = random.getrandbits(32) - 2**31
        return self.recordings.create(
            stream_id,
            _random_session_id(),
            source,
            initial_term_id,
            initial_term_id,
            0,
            self.config.term_length_for(stream_id),
            self.config.mtu_for(stream_id),
            self.clock(),
        )

    def open_publisher(self, stream_id: int, source: str, now_ns: int) -> _Publisher:
        self.space.check("publish")
        rec = self._create(stream_id, source, now_ns)
        try:
            return _Publisher(self, rec)
        except BaseException:  # its acked file could not be written: no publisher holds it
            rec.stop(self.clock())
            raise

    def expect_publishers(self, count: int) -> None:
        """``count`` sessions may still open a publisher (they have not published yet): keep as
        many empty recording directories ready, made off the loop, so each first publish
        renames one instead of creating five files on the loop (issue 31 item 1: ~1.2 ms of
        file-system CPU a recording on the project's machine; 2,048 sessions starting to
        publish at once stalled every session for seconds)."""
        self.recordings.spares.want(count)

    def check_space(self, what: str) -> None:
        """Raise the coded STORAGE_FULL error below the free-space watermark."""
        self.space.check(what)

    def resource_error(self, exc: OSError, what: str) -> ConnectorError | None:
        """The coded error (STORAGE_FULL, TOO_MANY_OPEN_FILES) of an I/O failure, or None."""
        return self.space.error_for(exc, what)

    def sink_writer(self, stream_id: int, sink_id: str, now_ns: int) -> _SinkWriter:
        key = (stream_id, sink_id)
        writer = self._sink_writers.get(key)
        if writer is None:
            source = f"sink:{sink_id}"
            for rec in self.recordings.recordings.values():
                if rec.d.source == source and rec.d.stream_id == stream_id:
                    writer = self._resume(rec)
            if writer is None:
                writer = _SinkWriter(self._create(stream_id, source, now_ns), self.clock)
                self._visible[writer.recording_id] = writer.rec.d.start_position
            self._sink_writers[key] = writer
        return writer

    def _resume(self, rec: Recording) -> _SinkWriter:
        rec.reopen()
        return _SinkWriter(rec, self.clock)

    def resume_writer(self, recording_id: int, now_ns: int) -> _SinkWriter | None:
        try:
            rec = self.recordings.get(recording_id)
        except ArchiveUnknownRecording:
            return None
        key = (rec.d.stream_id, rec.d.source[len("sink:") :])
        writer = self._sink_writers.get(key) or self._resume(rec)
        self._sink_writers[key] = writer
        return writer

    def set_visible(self, recording_id: int, position: int) -> None:
        self._visible[recording_id] = position

    def cut_sink_tails(self, visible: dict[int, int]) -> int:
        """Cut every sink recording back to its visible end (``visible``, else its start: no
        commit of it was done); the bytes cut. At recovery, before any commit is resumed."""
        cut = 0
        for rec in list(self.recordings.recordings.values()):
            if not rec.d.source.startswith("sink:"):
                continue
            end = max(visible.get(rec.d.recording_id, rec.d.start_position), rec.d.start_position)
            if rec.recorded_position <= end:
                continue
            log.warning(
                "sink recording %d: cutting %d bytes past its committed end %d (no commit's)",
                rec.d.recording_id,
                rec.recorded_position - end,
                end,
            )
            cut += rec.recorded_position - end
            rec.reopen()
            rec.rollback(end)
        return cut

    # --- ingest -------------------------------------------------------------------------------

    def start_ingest(self, wake: Callable[[], object] | None = None) -> None:
        """Subscribe to the ingest channel's streams; ``wake`` (the loop's) is called when one
        has data or images come or go (UDP: over IPC the loop polls, ``ingest_polled``)."""
        channel = self.config.ingest_channel
        if channel is None:
            return
        self.ingest_polled = wake is None or channel.startswith("aeron:ipc")
        admits = self.config.ingest_source_filter()
        if admits is None and not channel.startswith("aeron:ipc"):
            log.warning(
                "the ingest channel %s records any sender that reaches it (no --allow, --deny "
                "or --ingest-allow)",
                channel,
            )
        for stream_id in self.config.ingest_stream_ids:
            subscription = self.driver.add_subscription(channel, stream_id, admit_source=admits)
            add_listener = getattr(subscription, "add_listener", None)
            if wake is not None and add_listener is not None:
                add_listener(wake)
            else:
                self.ingest_polled = True
            self._recorders.append(
                Recorder(self.recordings, subscription, source="ingest", clock=self.clock)
            )

    def record_ingest(self, now_ns: int) -> int:
        if not self._recorders:
            return 0
        if self.space.below_watermark():  # the images keep it: publishers are held back
            self.ingest_held_back += 1
            return 0
        return sum(recorder.do_work(now_ns) for recorder in self._recorders)

    @property
    def ingest_images(self) -> int:
        return sum(r.images_recorded for r in self._recorders)

    @property
    def ingest_bytes(self) -> int:
        return sum(r.bytes_recorded for r in self._recorders)

    # --- housekeeping -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "recordings": len(self.recordings.recordings),
            "ingest_images": self.ingest_images,
            "ingest_bytes": self.ingest_bytes,
            "ingest_append_failures": sum(r.append_failures for r in self._recorders),
            "ingest_held_back": self.ingest_held_back,
            "message_end_scanned_bytes": self.message_end_scanned_bytes,
            "torn_bytes_cut": self.recordings.torn_bytes_cut,
            # files named like recordings found at start (skipped, their ids never issued)
            "stray_recording_files": len(self.recordings.stray_files),
            # complete frames past publish recordings' acknowledged ends cut at recovery
            "publish_tail_bytes_cut": self.recordings.unacknowledged_bytes_cut,
            # ingest: a message a crash or a dead publisher left incomplete at a recording's
            # end, cut (at recovery or when its image went away), and the first fragments of an
            # image that joined inside a message (its recording starts at its first message)
            "ingest_tail_bytes_cut": self.recordings.incomplete_tail_bytes_cut
            + sum(r.tail_bytes_cut for r in self._recorders),
            "ingest_head_bytes_skipped": sum(r.head_bytes_skipped for r in self._recorders),
            **self.recordings.files.stats(),
            # empty recording directories made ahead, off the loop (expect_publishers)
            **self.recordings.spares.stats(),
            **self.catalog.counters(),  # over live recordings (stopped ones' are kept)
        }

    def housekeeping(self) -> None:
        """Retry what a full disk held back (stop files of finished recordings)."""
        self.recordings.persist_stops()

    def close(self, now_ns: int = 0) -> None:
        for recorder in self._recorders:
            recorder.close()  # drains what the images already hold
        self.recordings.close(self.clock())


__all__ = ["ArchiveStore", "ReplayCursor"]
