"""Attacks on the commit log's record-by-record reading (fifteenth session): one corrupt record in
the middle of ``commit.log`` (a flipped bit on the disk, a bad sector) with acknowledged sink
commits after it.

The log is read at open until the first record that does not read, and cut there: that is the
torn tail a crash leaves (a record is appended and fsynced whole, so only the last one can be
torn). A record that does not read with whole records after it is not a torn tail: cutting there
dropped every acknowledged commit after it (the sink's committed batches forgotten, its rows cut
from the recording as past the visible end). The server now refuses to start with a coded error
naming the file and the byte, and leaves the log as it was (the operator restores it)."""

from __future__ import annotations

import errno
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aeron_spark.connector.errors import CommitLogCorruptError
from aeron_spark.connector.server.commitlog import CommitLog, _encode
from aeron_spark.connector.server.testing import client_for, messages_of, server_process

STREAM = 10
_HEADER = struct.Struct("<II")


def _records(path: Path) -> list[tuple[int, int]]:
    """(offset, length of body) of each record of a commit log file."""
    data = path.read_bytes()
    out = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, _crc = _HEADER.unpack_from(data, pos)
        out.append((pos, length))
        pos += _HEADER.size + length
    return out


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x40]))


def _sink_rows(client) -> list[bytes]:  # type: ignore[no-untyped-def]
    out: list[bytes] = []
    for rec in client.list_recordings([STREAM]):
        if rec.source.startswith("sink:") and rec.recorded_position > rec.start_position:
            blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            out += [m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)]
    return out


def _start_refused(directory: Path) -> str:
    """Start a server on ``directory``; what it said once it exited. Fails (after stopping it)
    if it started serving."""
    code = (
        "import sys; from aeron_spark.connector.server import server_main; "
        "sys.exit(server_main(sys.argv[1:]))"
    )
    out = directory.parent / "server.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--dir", str(directory), "--port", "0"]
            + ["--no-encryption"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None:
            said = out.read_text()
            # main: the server cut the log at the bad record and served without batches 0-2
            assert "listening on" not in said, "started over a commit log it cannot read whole"
            assert time.monotonic() < deadline, "the server neither started nor exited"
            time.sleep(0.1)
        assert proc.returncode != 0
        return out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        out.unlink()


def test_a_corrupt_record_in_the_middle_of_the_commit_log_loses_no_acknowledged_commit(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "server"
    rows = [[b"batch%d-row%d" % (b, i) for i in range(20)] for b in range(3)]
    with server_process(str(directory)) as (proc, endpoint), client_for(endpoint) as client:
        for batch, payloads in enumerate(rows):
            staged = client.stage("sink-a", batch, 0, 0, STREAM, payloads, local=False)
            client.commit("sink-a", batch, STREAM, [staged])  # acknowledged
        assert client.last_committed_batch("sink-a") == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    log = directory / "sink" / "commit.log"
    records = _records(log)
    assert len(records) == 6  # begin and done of each batch
    offset, length = records[1]  # batch 0's done: a bit of its body flipped
    _flip(log, offset + _HEADER.size + length // 2)
    before = log.read_bytes()

    said = _start_refused(directory)
    assert "COMMIT_LOG_CORRUPT" in said and "commit.log" in said, said[-2000:]
    assert f"byte {offset}" in said, said[-2000:]
    assert log.read_bytes() == before  # nothing cut, nothing rewritten

    # the operator repairs the record (here: flips the bit back): everything is there
    _flip(log, offset + _HEADER.size + length // 2)
    with server_process(str(directory)) as (_proc, endpoint), client_for(endpoint) as client:
        assert client.last_committed_batch("sink-a") == 2
        assert _sink_rows(client) == [row for batch in rows for row in batch]


def test_a_torn_tail_is_still_cut_at_open(tmp_path: Path) -> None:
    """What a crash leaves (the last record incomplete, or whole but unreadable with nothing
    after it) is still cut at open, as before."""
    path = tmp_path / "commit.log"
    log = CommitLog(str(path))
    for i in range(3):
        log.append({"t": "done", "sink_id": "s", "batch_id": i})
    whole = log.size
    log.close()
    with open(path, "ab") as fh:
        fh.write(b"\x40\x00\x00\x00\x01\x02\x03\x04partial")
    again = CommitLog(str(path))
    assert [r["batch_id"] for r in again.records] == [0, 1, 2]
    assert again.torn_bytes_truncated == len(b"\x40\x00\x00\x00\x01\x02\x03\x04partial")
    again.close()
    assert path.stat().st_size == whole
    # the last record whole but its body damaged (a crash between the length and the body
    # reaching the disk): a torn tail too
    offset, length = _records(path)[-1]
    _flip(path, offset + _HEADER.size + 1)
    third = CommitLog(str(path))
    assert [r["batch_id"] for r in third.records] == [0, 1]
    third.close()


def test_a_damaged_length_in_the_middle_is_found_and_refused(tmp_path: Path) -> None:
    """The damaged bytes are a record's length (so where the next record begins is not known):
    the records after it are still found, and the log is refused and left whole."""
    path = tmp_path / "commit.log"
    log = CommitLog(str(path))
    for i in range(5):
        log.append({"t": "done", "sink_id": "s", "batch_id": i, "pad": "x" * (i * 37)})
    log.close()
    offset, _length = _records(path)[2]
    _flip(path, offset + 2)  # its length now far past the end of the file
    before = path.read_bytes()
    with pytest.raises(CommitLogCorruptError) as refused:
        CommitLog(str(path))
    assert refused.value.details["offset"] == offset
    assert path.read_bytes() == before


_COMPACTING_CHILD = """
import sys, time
from aeron_spark.connector.server.commitlog import CommitLog
log = CommitLog(sys.argv[1])
seen = [0]
def keep(record):
    seen[0] += 1
    if seen[0] == int(sys.argv[2]):
        print("compacting", flush=True)  # the parent kills this process now
        time.sleep(600)
    return record if record["batch_id"] % 2 else None
log.compact(keep)
print("compacted", flush=True)
"""


def test_a_kill_mid_compaction_leaves_the_old_log_whole(tmp_path: Path) -> None:
    """``kill -9`` of a process in the middle of a compaction (its temporary file half
    written, 64 KiB chunks already out): the log opens with every record it had, and the next
    compaction overwrites the leftover temporary file."""
    path = tmp_path / "commit.log"
    # what 3,000 appends write (each append fsyncs: seconds on a loaded disk)
    path.write_bytes(
        b"".join(
            _encode({"t": "done", "sink_id": "s", "batch_id": i, "pad": "p" * 40})
            for i in range(3000)
        )
    )
    before = path.read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", _COMPACTING_CHILD, str(path), "2500"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "compacting"
        assert (tmp_path / "commit.log.compact").stat().st_size > 0  # chunks already written
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(30)
    assert path.read_bytes() == before
    again = CommitLog(str(path))
    assert [r["batch_id"] for r in again.records] == list(range(3000))
    again.compact(lambda r: r if r["batch_id"] % 2 else None)
    again.close()
    compacted = CommitLog(str(path))
    compacted.close()
    assert [r["batch_id"] for r in compacted.records] == list(range(1, 3000, 2))
    assert not (tmp_path / "commit.log.compact").exists()


def test_a_record_damaged_while_the_log_is_open_makes_compaction_refuse_and_keep_the_log(
    tmp_path: Path,
) -> None:
    """A record damaged under a running server (its log open): compaction refuses with EIO
    (counted), the log stays as it was and takes appends; the next open refuses it whole."""
    path = tmp_path / "commit.log"
    log = CommitLog(str(path))
    for i in range(6):
        log.append({"t": "done", "sink_id": "s", "batch_id": i})
    offset, length = _records(path)[2]
    _flip(path, offset + _HEADER.size + length // 2)
    with pytest.raises(OSError) as refused:
        log.compact(lambda r: r)
    assert refused.value.errno == errno.EIO and log.compaction_failures == 1
    log.append({"t": "done", "sink_id": "s", "batch_id": 6})
    log.close()
    assert len(_records(path)) == 7
    assert not (tmp_path / "commit.log.compact").exists()
    with pytest.raises(CommitLogCorruptError):
        CommitLog(str(path))
