"""The archive sink's classes against the real Aeron Archive (``ArchivingMediaDriver`` from the
pinned aeron-all jar, started by the fixture on a free loopback port, stopped in a ``finally``).

Staging, the driver's once-only append between BEGIN/END markers, a commit repeated, a driver
killed (-9) after its BEGIN reached the archive and the recovery run that truncates the torn
append, an abort, failed attempts' staging recordings purged, read-committed through the archive
source, and a small Java replay (``AeronArchive`` + ``FragmentAssembler``) that reads every row
once from the target recording, skipping markers by ``header.reservedValue()``. Skips without
Java only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from aeron_spark.connector.archive_markers import BEGIN, MARKER_RESERVED_VALUE, read_tail
from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.options import (
    ArchiveSinkOptions,
    parse_archive_sink_options,
    parse_archive_source_options,
)
from aeron_spark.connector.source import AeronBatchReader
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.transport.archive.client import ArchiveUnknownRecordingError
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]
ARCHIVE_ID = 2121


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aeron_peer.JavaArchive]:
    aeron_peer.require_java()
    directory = tmp_path_factory.mktemp("java-archive-sink")
    with aeron_peer.JavaArchive(directory / "archive", free_udp_port(), ARCHIVE_ID) as peer:
        yield peer


def _options(archive: aeron_peer.JavaArchive, stream_id: int, **extra: str) -> ArchiveSinkOptions:
    return parse_archive_sink_options(
        {
            "archive": archive.control_channel,
            "channel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            "streamId": str(stream_id),
            "sinkId": f"sink-{stream_id}",
            "timeoutMs": "30000",
            **extra,
        }
    )


def _stage(o: ArchiveSinkOptions, batch: int, partition: int, rows: list[bytes], **kw: object):  # type: ignore[no-untyped-def]
    columns: dict[str, pa.Array] = {"value": pa.array(rows, pa.binary())}
    if "reserved" in kw:
        columns["reserved_value"] = pa.array(kw["reserved"], pa.int64())
    staged = archive_sink.stage(o, "id", batch, iter([pa.record_batch(columns)]))
    return dataclasses.replace(staged, partition=partition)


def _read(archive: aeron_peer.JavaArchive, stream_id: int) -> list[tuple[bytes, int]]:
    """(value, reserved value) of every row the archive source reads of the stream."""
    src = parse_archive_source_options({"archive": archive.control_channel, "streamId": stream_id})
    reader = AeronBatchReader(src, None)
    out = []
    for part in reader.partitions():
        for batch in reader.read(part):
            out.extend(
                zip(
                    batch.column("value").to_pylist(),
                    batch.column("reserved_value").to_pylist(),
                    strict=True,
                )
            )
    return out


def _commit(o: ArchiveSinkOptions, batch: int, parts: list) -> archive_sink.CommitStats:  # type: ignore[type-arg]
    return archive_sink.commit_batch(o, "id", batch, parts)


def test_batches_append_once_and_read_back_byte_for_byte(archive: aeron_peer.JavaArchive) -> None:
    o = _options(archive, 2201)
    rows = [os.urandom(1 + (i * 37) % 3000) for i in range(900)]  # some fragmented (mtu 1408)
    reserved = [i * 3 for i in range(900)]
    parts = [
        _stage(o, 0, p, rows[p * 300 : p * 300 + 300], reserved=reserved[p * 300 :][:300])
        for p in (2, 0, 1)
    ]
    stats = _commit(o, 0, parts)
    assert (stats.appended_rows, stats.appended_parts, stats.purged_staging) == (900, 3, 3)
    assert _read(archive, 2201) == list(zip(rows, reserved, strict=True))  # partition order
    # The same batch committed again (a restart before Spark's commit log): nothing appended,
    # the new attempt's staging purged.
    again = _commit(o, 0, [_stage(o, 0, 0, rows[:5])])
    assert (again.skipped_duplicate, again.appended_rows, again.purged_staging) == (1, 0, 1)
    # A failed attempt's staging recording (no commit names it) is purged by the next commit.
    orphan = _stage(o, 1, 0, [b"never committed"])
    stats = _commit(o, 1, [_stage(o, 1, 0, [b"batch one"])])
    assert stats.appended_rows == 1 and stats.purged_orphans == 1
    # An abort purges what its messages name; nothing reaches the target.
    aborted = _stage(o, 2, 0, [b"aborted"])
    archive_sink.abort_batch(o, "id", 2, [aborted])
    with archive_sink.connect(o.connect) as client:
        for rid in (orphan.recording_id, aborted.recording_id):
            assert client.list_recording(rid) is None
    got = _read(archive, 2201)
    assert [v for v, _ in got] == rows + [b"batch one"]
    # A row carrying the marker's reserved value is refused (readers skip markers by it).
    with pytest.raises(Exception, match="marker value"):
        _stage(o, 3, 0, [b"x"], reserved=[MARKER_RESERVED_VALUE])


def test_blocks_split_at_small_target_terms_and_a_wider_staging_mtu(
    archive: aeron_peer.JavaArchive,
) -> None:
    """The append re-publishes staged frames in blocks (``offer_block``): with 64 KiB target
    terms most blocks end at a term end and the message that does not fit goes singly (padding
    the term); a later batch staged with an mtu wider than the target's goes singly (the target
    re-fragments). Every row reads back once, byte for byte, in partition order."""
    o = _options(archive, 2202)
    small = dataclasses.replace(o, term_length=1 << 16)  # of the new target and staging
    rows = [os.urandom((i * 7919) % 6000) for i in range(600)]  # 0..6 KB, up to 5 fragments
    reserved = [i - 300 for i in range(600)]
    parts = [
        _stage(small, 0, p, rows[p * 200 : p * 200 + 200], reserved=reserved[p * 200 :][:200])
        for p in (1, 0, 2)
    ]
    stats = _commit(small, 0, parts)
    assert stats.appended_rows == 600
    assert stats.relayed_blocks > 0 and 0 < stats.relayed_singly < 600
    assert stats.relayed_blocks + stats.relayed_singly < 300  # blocks, not messages
    wide = dataclasses.replace(small, mtu=4096)
    more = [os.urandom(3000 + i) for i in range(50)]  # one 4096-mtu frame each, 3 at 1408
    stats = _commit(wide, 1, [_stage(wide, 1, 0, more)])
    assert (stats.appended_rows, stats.relayed_singly) == (50, 50)
    # rows of one length: framed at once (numpy) by the tasks, cut by arithmetic by the driver
    fixed = [os.urandom(100) for _ in range(3000)]
    stats = _commit(
        small,
        2,
        [
            _stage(small, 2, 0, fixed[:1500], reserved=list(range(1500))),
            _stage(small, 2, 1, fixed[1500:]),
        ],
    )
    assert stats.appended_rows == 3000 and 0 < stats.relayed_singly < 20
    with archive_sink.connect(o.connect) as client:
        target = archive_sink.ArchiveCommitter(o, "id", client).target()
        assert target is not None and target.term_buffer_length == 1 << 16
        assert target.mtu_length == 1408
    got = _read(archive, 2202)
    assert got == (
        list(zip(rows, reserved, strict=True))
        + [(m, 0) for m in more]
        + [(m, i if i < 1500 else 0) for i, m in enumerate(fixed)]
    )


def _replay_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("archive-sink-replay-")]


def test_parts_replayed_ahead_in_order_and_a_failed_replay_commits_nothing(
    archive: aeron_peer.JavaArchive,
) -> None:
    """The commit replays the staging recordings ahead of the append (a few at a time, each
    on a thread and control session of its own) and still appends them in partition order;
    a staging recording that cannot be replayed (purged here) fails the commit with the
    archive's error (as SERVER_UNAVAILABLE), stops every replay, leaves the batch invisible to
    committed-only readers, and the re-commit cuts the torn append back and appends the batch
    once."""
    o = _options(archive, 2231)
    rows = [[b"b0-p%d-%04d" % (p, i) for i in range(300)] for p in range(5)]
    parts = [_stage(o, 0, p, rows[p]) for p in (3, 1, 4, 0, 2)]  # any order, as Spark's
    stats = _commit(o, 0, parts)
    assert (stats.appended_parts, stats.appended_rows) == (5, 1500)
    first = [r for part in rows for r in part]
    assert [v for v, _ in _read(archive, 2231)] == first
    assert _replay_threads() == []

    more = [[b"b1-p%d-%04d" % (p, i) for i in range(200)] for p in range(5)]
    staged = [_stage(o, 1, p, more[p]) for p in range(5)]
    with archive_sink.connect(o.connect) as client:  # partition 3's staging is gone
        assert archive_sink._stop_and_purge(client, staged[3].recording_id)
    with pytest.raises(ServerUnavailableError) as failed:
        _commit(o, 1, staged)
    assert isinstance(failed.value.__cause__, ArchiveUnknownRecordingError)
    assert _replay_threads() == []
    assert [v for v, _ in _read(archive, 2231)] == first  # committed only: none of batch 1
    stats = _commit(o, 1, [_stage(o, 1, p, more[p]) for p in range(5)])
    assert stats.truncated_bytes > 0 and stats.appended_rows == 1000
    assert [v for v, _ in _read(archive, 2231)] == first + [r for part in more for r in part]


_KILL_AFTER_BEGIN = """
import os, signal, sys, dataclasses, pickle
from aeron_spark.connector.stores.archive import sink as archive_sink
o, parts = pickle.loads(bytes.fromhex(sys.argv[1]))
with archive_sink.connect(o.connect) as client:
    committer = archive_sink.ArchiveCommitter(o, "id", client)
    append = archive_sink.Append(committer, committer.stopped_target(), 7, len(parts))
    append.begin()
    append.write_part(parts[0])
    archive_sink._wait_recorded(client, append.recording_id, append.position, "the torn part")
    print("BEGIN", append.begin_position, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_driver_killed_mid_append_is_truncated_and_redone(archive: aeron_peer.JavaArchive) -> None:
    """kill -9 of the driver after its BEGIN and a part reached the archive (before END and
    Spark's commit log): readers see only committed rows; the recovery run truncates the torn
    append back to its BEGIN and appends the batch once."""
    import pickle

    o = _options(archive, 2211)
    first = [b"committed-%d" % i for i in range(50)]
    _commit(o, 6, [_stage(o, 6, 0, first)])
    rows = [b"batch7-%04d" % i for i in range(400)]
    parts = [_stage(o, 7, p, rows[p * 200 : p * 200 + 200]) for p in (0, 1)]
    done = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_BEGIN, pickle.dumps((o, parts)).hex()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr.decode()
    begin_at = int(done.stdout.split()[1])
    with archive_sink.connect(o.connect) as client:
        committer = archive_sink.ArchiveCommitter(o, "id", client)
        d = committer.stopped_target()
        assert d is not None and d.stop_position > begin_at
        tail = read_tail(client, d.recording_id, 0, d.stop_position, d.term_buffer_length)
        assert tail.torn and tail.last is not None and tail.last.kind == BEGIN
        assert tail.committed_end == begin_at
    assert [v for v, _ in _read(archive, 2211)] == first  # read-committed: not the torn part
    stats = _commit(o, 7, parts)  # the recovery run: Spark commits batch 7 again
    assert stats.truncated_bytes > 0 and stats.appended_rows == 400
    assert [v for v, _ in _read(archive, 2211)] == first + rows
    assert _commit(o, 7, [_stage(o, 7, 0, rows[:3])]).skipped_duplicate == 1
    assert [v for v, _ in _read(archive, 2211)] == first + rows


_JAVA_REPLAY = """
import io.aeron.Aeron;
import io.aeron.FragmentAssembler;
import io.aeron.Image;
import io.aeron.Subscription;
import io.aeron.archive.client.AeronArchive;
import java.util.HexFormat;

public class SinkReplay
{
    static final long MARKER = %dL;
    static int rows = 0;
    static int markers = 0;

    public static void main(final String[] args) throws Exception
    {
        final long recordingId = Long.parseLong(args[2]);
        final String replayChannel = args[3];
        try (Aeron aeron = Aeron.connect(new Aeron.Context().aeronDirectoryName(args[0]));
            AeronArchive archive = AeronArchive.connect(new AeronArchive.Context()
                .aeron(aeron)
                .controlRequestChannel(args[1])
                .controlResponseChannel("aeron:udp?endpoint=127.0.0.1:0")))
        {
            final long start = archive.getStartPosition(recordingId);
            final long stop = archive.getStopPosition(recordingId);
            final FragmentAssembler assembler = new FragmentAssembler(
                (buffer, offset, length, header) ->
            {
                if (header.reservedValue() == MARKER)
                {
                    markers++;
                    return;
                }
                final byte[] bytes = new byte[length];
                buffer.getBytes(offset, bytes);
                rows++;
                System.out.println("ROW " + HexFormat.of().formatHex(bytes));
            });
            try (Subscription sub = aeron.addSubscription(replayChannel, 4242))
            {
                final long replaySession = archive.startReplay(
                    recordingId, start, stop - start, replayChannel, 4242);
                final long deadline = System.currentTimeMillis() + 60_000;
                Image image = null;
                while (image == null || image.position() < stop)
                {
                    if (System.currentTimeMillis() > deadline)
                    {
                        throw new IllegalStateException("replay timed out");
                    }
                    if (image == null)
                    {
                        image = sub.imageBySessionId((int)replaySession);
                    }
                    if (image == null || image.poll(assembler, 100) == 0)
                    {
                        Thread.sleep(1);
                    }
                }
            }
            System.out.println("DONE rows=" + rows + " markers=" + markers);
        }
    }
}
"""


def test_a_java_replay_reads_every_row_once_skipping_markers(
    archive: aeron_peer.JavaArchive, tmp_path: Path
) -> None:
    o = _options(archive, 2221)
    batches = [[b"j%d-%03d" % (b, i) + b"." * (i % 2000) for i in range(120)] for b in range(3)]
    for b, rows in enumerate(batches):
        _commit(o, b, [_stage(o, b, p, rows[p * 60 : p * 60 + 60]) for p in (0, 1)])
    with archive_sink.connect(o.connect) as client:
        target = archive_sink.ArchiveCommitter(o, "id", client).target()
    assert target is not None
    classes = aeron_peer.compile_java(
        _JAVA_REPLAY % MARKER_RESERVED_VALUE, "SinkReplay", tmp_path / "java"
    )
    java = aeron_peer.java_argv(
        "SinkReplay",
        {},
        classpath=[classes],
        args=[
            archive.aeron_dir,
            archive.control_channel,
            str(target.recording_id),
            f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
        ],
    )
    done = subprocess.run(java, capture_output=True, timeout=120, check=False, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    rows = [bytes.fromhex(line[4:]) for line in lines if line.startswith("ROW ")]
    assert rows == [r for rows in batches for r in rows]
    assert lines[-1] == f"DONE rows={len(rows)} markers=6"


def test_min_messages_per_trigger_holds_back_a_batch_in_archive_mode(
    archive: aeron_peer.JavaArchive,
) -> None:
    """Issue 29: archive mode took ``minMessagesPerTrigger`` and never used it (its reader's
    default limit and ``latestOffset`` ignored it). Now the one reader applies it to either
    store: fewer messages than the minimum make no batch until ``maxTriggerDelayMs`` passed."""
    from pyspark.sql.streaming.datasource import ReadMinRows

    from aeron_spark.connector.source import AeronStreamReader, decode_offset

    o = _options(archive, 2207)
    _commit(o, 0, [_stage(o, 0, 0, [b"a", b"b", b"c"])])  # 3 messages committed

    def reader(delay: str) -> AeronStreamReader:
        return AeronStreamReader(
            parse_archive_source_options(
                {
                    "archive": archive.control_channel,
                    "streamId": "2207",
                    "minMessagesPerTrigger": "5",
                    "maxTriggerDelayMs": delay,
                }
            )
        )

    waiting = reader("1h")
    limit = waiting.getDefaultReadLimit()
    assert isinstance(limit, ReadMinRows) and limit.min_rows == 5
    start = waiting.initialOffset()
    assert waiting.latestOffset(start, limit) == start  # 3 < 5: no batch yet
    (key,) = decode_offset(start)
    assert decode_offset(waiting.reportLatestOffset() or {})[key] > decode_offset(start)[key]
    # maxTriggerDelayMs passed: the 3 go
    impatient = reader("0")
    moved = impatient.latestOffset(start, impatient.getDefaultReadLimit())
    assert decode_offset(moved)[key] > decode_offset(start)[key]
    _commit(o, 1, [_stage(o, 1, 0, [b"d", b"e", b"f"])])  # now 6 >= 5
    end = waiting.latestOffset(start, limit)
    assert decode_offset(end)[key] > decode_offset(moved)[key]
    rows = [r for p in waiting.partitions(start, end) for b in waiting.read(p) for r in b["value"]]
    assert [r.as_py() for r in rows] == [b"a", b"b", b"c", b"d", b"e", b"f"]
