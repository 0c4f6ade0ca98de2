"""Attacks on what survives a crash and on what is bounded, made as a failing host and a hostile
but authorised client would, on real servers: ``kill -9``, torn files (a commit log, a segment or
the consumers' file cut at a random byte; an owner file left empty), a file system that is full
when the server comes back (a real tmpfs), a client that stops reading mid-replay.

The state a crash inside a sink commit leaves is made exactly: the commit runs for real, the
server is killed, then its files are put back the way they were at a chosen instant of the commit
(its ``begin`` whole in the commit log, its ``done`` torn off at a random byte, its frames cut off
the segment at a random byte, its staged part files still there), as a ``kill -9`` or a power cut
at that instant would leave them. Timing a kill into that window is left to
``test_server_crash.py``; here the instant is chosen, so every run tests it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from aeron_spark.connector.client import StreamClient
from aeron_spark.connector.errors import ConnectorError, ErrorCode
from aeron_spark.connector.server.testing import (
    authorizing_server,
    client_for,
    client_key,
    messages_of,
    server_process,
)
from aeron_spark.transport.archive.testing import MountUnavailable, fill, small_tmpfs
from connector.tests.test_server_dir_lock import _cli_server
from connector.tests.test_server_full_disk import STREAM, msgs, replayed
from connector.tests.test_server_memory import _memory_kib
from connector.tests.test_server_ownership import EVIL, ROWS, _client, _refused

MIB = 1024 * 1024
SINK = "attack-sink"


@pytest.fixture
def tmpfs() -> Iterator[str]:
    try:
        with small_tmpfs(8 * MIB) as path:
            yield path
    except MountUnavailable as exc:
        pytest.skip(str(exc))


def _log_records(directory: str) -> list[tuple[int, int, dict[str, Any]]]:
    """``(offset, end, record)`` of each whole record of the server's commit log."""
    with open(os.path.join(directory, "sink", "commit.log"), "rb") as fh:
        data = fh.read()
    out, offset = [], 0
    while offset + 8 <= len(data):
        length, _crc = struct.unpack_from("<II", data, offset)
        end = offset + 8 + length
        if end > len(data):
            break
        out.append((offset, end, msgpack.unpackb(data[offset + 8 : end], raw=False)))
        offset = end
    return out


def _batch_dir(directory: str, batch_id: int) -> str:
    return os.path.join(directory, "sink", "staged", SINK.encode().hex(), str(batch_id))


def _tear_into_commit(directory: str, batch_id: int, rng: random.Random) -> None:
    """Make ``directory`` what a crash inside ``batch_id``'s commit leaves: its ``done`` record
    torn off the commit log at a random byte, its frames cut off the recording at a random byte
    at least 256 KiB before their end (so a resumed commit has pages to write)."""
    records = _log_records(directory)
    (begin,) = [r for o, e, r in records if r["t"] == "begin" and r["batch_id"] == batch_id]
    ((done_at, done_end, done),) = [
        (o, e, r) for o, e, r in records if r["t"] == "done" and r["batch_id"] == batch_id
    ]
    assert done_end == records[-1][1], "the commit under attack is the log's last record"
    with open(os.path.join(directory, "sink", "commit.log"), "r+b") as fh:
        fh.truncate(rng.randrange(done_at, done_end))
    start, end = begin["start_position"], done["end_position"]
    assert end - start > 512 * 1024, "the batch is too small to cut into"
    rec_dir = os.path.join(directory, "recordings", str(begin["recording_id"]))
    (segment,) = [n for n in os.listdir(rec_dir) if n.endswith(".seg")]
    base = int(segment[:-4])
    with open(os.path.join(rec_dir, segment), "r+b") as fh:
        fh.truncate(rng.randrange(start, end - 256 * 1024) - base)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_a_commit_interrupted_by_a_crash_does_not_keep_a_server_on_a_full_disk_from_starting(
    tmpfs: str, tmp_path: Path, seed: int
) -> None:
    """README: "a commit interrupted by the kill is completed by the restarted server before it
    serves anyone" and "a server restarted on a full disk starts, serves what was recorded and
    refuses appends". Both at once: the host crashed inside a commit and the disk is full when
    the server comes back. Before, completing the commit failed with ENOSPC and the server did
    not start at all (exit 1), serving nothing, not even the batches committed before. Now the
    commit it cannot complete is cut off and cancelled like any commit a full disk fails (its
    client was never told it committed): the server starts, serves batch 0, refuses the retry
    of batch 1 with STORAGE_FULL, and commits it once when space is freed, also across a
    restart."""
    rng = random.Random(seed)
    rows0, rows1 = msgs(0, 200), msgs(200, 1500)  # batch 1: ~1.5 MB of frames
    saved = str(tmp_path / "staged-1")
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
        part0 = client.stage(SINK, 0, 0, 0, STREAM, rows0, local=False)
        client.commit(SINK, 0, STREAM, [part0])
        part1 = client.stage(SINK, 1, 0, 0, STREAM, rows1, local=False)
        shutil.copytree(_batch_dir(tmpfs, 1), saved)  # what the commit deletes once done
        assert client.commit(SINK, 1, STREAM, [part1])["count"] == len(rows1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    _tear_into_commit(tmpfs, 1, rng)
    shutil.copytree(saved, _batch_dir(tmpfs, 1))  # part files stay until the commit is done
    filler = fill(tmpfs)
    try:
        with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
            assert replayed(client, "sink:") == rows0  # nothing of the interrupted commit
            assert client.last_committed_batch(SINK) == 0
            with pytest.raises(ConnectorError) as refused:
                client.commit(SINK, 1, STREAM, [part1])  # the client's retry, disk still full
            assert refused.value.code == ErrorCode.STORAGE_FULL
            os.unlink(filler)
            filler = ""
            assert client.commit(SINK, 1, STREAM, [part1])["count"] == len(rows1)
            assert client.commit(SINK, 1, STREAM, [part1])["count"] == len(rows1)  # a repeat
            assert replayed(client, "sink:") == rows0 + rows1
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    finally:
        if filler:
            os.unlink(filler)
    with server_process(tmpfs) as (_proc, endpoint), client_for(endpoint) as client:
        assert replayed(client, "sink:") == rows0 + rows1
        assert client.last_committed_batch(SINK) == 1


@pytest.mark.slow
def test_a_commit_interrupted_by_a_crash_whose_parts_are_gone_does_not_keep_the_server_down(
    tmpfs: str,
) -> None:
    """A ``begin`` whose staged parts are gone when the server restarts: the parts of a commit
    that failed on a full disk are kept for its retry, but the client (Spark's abort of the failed
    job) may delete them, and the cancel record of that failed commit stays unwritten while the
    disk is full; a crash then leaves the ``begin`` to resume without its parts. Before, recovery
    raised STAGED_DATA_MISSING and the server never started. Now that commit is cancelled: the
    server starts, serves what was committed, refuses the stale commit message coded, and the
    batch staged again commits once."""
    rng = random.Random(3)
    rows0, rows1 = msgs(0, 200), msgs(200, 1500)
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
        part0 = client.stage(SINK, 0, 0, 0, STREAM, rows0, local=False)
        client.commit(SINK, 0, STREAM, [part0])
        part1 = client.stage(SINK, 1, 0, 0, STREAM, rows1, local=False)
        client.commit(SINK, 1, STREAM, [part1])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    _tear_into_commit(tmpfs, 1, rng)  # and its parts are not put back
    with server_process(tmpfs) as (_proc, endpoint), client_for(endpoint) as client:
        assert replayed(client, "sink:") == rows0
        assert client.last_committed_batch(SINK) == 0
        with pytest.raises(ConnectorError) as missing:
            client.commit(SINK, 1, STREAM, [part1])
        assert missing.value.code == ErrorCode.STAGED_DATA_MISSING
        again = client.stage(SINK, 1, 0, 1, STREAM, rows1, local=False)
        assert client.commit(SINK, 1, STREAM, [again])["count"] == len(rows1)
        assert replayed(client, "sink:") == rows0 + rows1


def test_a_batch_owner_file_left_empty_by_a_crash_is_claimed_by_the_next_stager(
    tmp_path: Path,
) -> None:
    """Ownership (README, security model: a batch belongs to the client key that staged its first
    part, "created exclusively and fsynced"). The owner file was created empty (``O_EXCL``), then
    written: a crash between the two leaves it empty, and an empty owner file meant "nobody", for
    good: the victim's retried stage did not claim the batch (the file existed), so any other
    listed key could stage rows into it and, committing it first, take the whole sink id. Now a
    batch whose owner file is empty is claimed by the next stager (the file is written whole
    under another name and renamed in)."""
    victim, victim_key = client_key(tmp_path, "victim")
    attacker, attacker_key = client_key(tmp_path, "attacker")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{victim_key} victim read=10 write=10\n{attacker_key} attacker read=10 write=10\n"
    )
    sink = "fresh-query@0123456789abcdef"
    # what the crash left: the victim's first stage of batch 0 created its owner file, then died
    batch_dir = tmp_path / "srv" / "sink" / "staged" / sink.encode().hex() / "0"
    batch_dir.mkdir(parents=True)
    (batch_dir / "owner").write_bytes(b"")
    with authorizing_server(tmp_path, keys) as server:
        with _client(server, victim) as v, _client(server, attacker) as a:
            staged = v.stage(sink, 0, 0, 0, 10, ROWS, local=False)  # the task's retry
            _refused(lambda: a.stage(sink, 0, 1, 0, 10, EVIL, local=False), "stage")
            _refused(lambda: a.commit(sink, 0, 10, [staged]), "commit")
            assert v.commit(sink, 0, 10, [staged])["count"] == len(ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4, 5])
def test_a_torn_consumers_file_stops_the_server_with_an_error_naming_it(
    tmp_path: Path, seed: int
) -> None:
    """``consumers.msgpack`` (the consumers' positions retention honours) was replaced without an
    fsync before the rename, so a power cut could leave the new name on an empty or torn file
    (it is now fsynced, and its directory). Such a file (here cut at a random byte) stopped the
    server with a msgpack traceback; now it exits 1 with an error naming the file and what to
    do (a server that started without it would let retention purge what those consumers
    hold)."""
    directory = str(tmp_path / "srv")
    with server_process(directory) as (proc, endpoint), client_for(endpoint) as client:
        end = client.publish(STREAM, msgs(0, 20))
        (rec,) = client.list_recordings([STREAM])
        for i in range(5):
            client.consumer_commit(f"query-{i}", [STREAM], {rec.recording_id: end})
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    path = os.path.join(directory, "consumers.msgpack")
    with open(path, "r+b") as fh:
        fh.truncate(random.Random(seed).randrange(os.path.getsize(path)))
    refused = _cli_server(directory)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr
    assert f"consumers' positions file {path} is damaged" in refused.stderr, refused.stderr


def _replay_bytes(client: StreamClient) -> int:
    return int(client.stats()["counters"]["replay_bytes"])


@pytest.mark.slow
def test_a_client_that_stops_reading_mid_replay_costs_the_server_a_bounded_amount(
    tmp_path: Path,
) -> None:
    """Held (no change): a client that starts replaying a 48 MiB recording, takes one block and
    reads no more. The server sends what the session's flow control lets through, then waits
    (it pumps a replay only when the session's queue is empty): its resident memory stays
    within a few MiB of where it was, and another client is served meanwhile."""
    directory = str(tmp_path / "srv")
    rows = [b"r%07d-" % i + b"z" * 1000 for i in range(48_000)]
    with server_process(directory) as (proc, endpoint):
        with client_for(endpoint) as writer:
            for i in range(0, len(rows), 4000):
                writer.publish(STREAM, rows[i : i + 4000])
            (rec,) = writer.list_recordings([STREAM])
        with client_for(endpoint) as stalled, client_for(endpoint) as other:
            blocks = stalled.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            next(blocks)
            before = _memory_kib(proc.pid)
            sent, deadline = -1, time.monotonic() + 120
            while sent != _replay_bytes(other):  # until the server stopped sending
                assert time.monotonic() < deadline, "the server kept sending to a stalled reader"
                sent = _replay_bytes(other)
                time.sleep(1.0)
            assert sent < rec.recorded_position - rec.start_position  # held back, not all sent
            end = other.publish(STREAM + 1, [b"x" * 100] * 100)  # another client is served
            (mine,) = other.list_recordings([STREAM + 1])
            got = messages_of(
                other.replay(mine.recording_id, mine.start_position, end),
                mine.initial_term_id,
                mine.term_length,
            )
            assert len(got) == 100
            after = _memory_kib(proc.pid)
            assert after["VmRSS"] - before["VmRSS"] < 16 * 1024, (before, after, sent)
            blocks.close()
