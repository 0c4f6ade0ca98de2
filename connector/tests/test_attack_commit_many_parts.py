"""``kill -9`` inside the commit of a batch of many parts over two streams (a sink routing rows
by a ``stream_id`` column), and again while the restarted server completes it.

What must hold: after each restart the batch is either committed whole (every part, both
streams) or not at all, never some parts or one stream; the driver's retry of the commit (what
Spark's commit does on a new session) returns the commit and appends nothing, so every row is in
its stream exactly once, parts in partition order.

The kill lands for real: a commit of 16 parts (about 50 MB of frames) runs in a thread, and the
server is killed once the commit's ``begin`` is in the commit log and before its ``done``; the
restarted server is killed again once the sink recordings hold part of the batch anew, before
the recovery's ``done``. A kill that lands outside its window (a fast disk) is retried.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from aeron_spark.connector.server.testing import client_for, messages_of
from aeron_spark.transport.testing import sweep_dead
from connector.tests.test_server_crash import _commit_log, _wait_inside_commit

SINK = "many-parts"
STREAMS = (41, 42)
PARTS = 16
ROWS = 1500  # per part: ~1.5 MB of frames
# The committing client's timeout, waited out after the kill before its ServerUnavailableError
# (the staging client's 10 s before): the commit's ``begin`` is in the log within milliseconds
# of the request, and the kill follows it.
COMMITTER_TIMEOUT_S = 4
_CODE = (
    "import sys; from aeron_spark.connector.server import server_main; "
    "sys.exit(server_main(sys.argv[1:]))"
)


def _rows(stream_id: int, part: int) -> list[bytes]:
    return [b"s%d-p%02d-%05d-" % (stream_id, part, i) + b"r" * 1000 for i in range(ROWS)]


def _start(directory: str, log_path: str) -> subprocess.Popen[bytes]:
    """The server in a process of its own, its output appended to ``log_path``."""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CODE, "--dir", directory, "--port", "0", "--no-encryption"],
            stdout=log,
            stderr=log,
            env=dict(os.environ),
        )
    return proc


def _endpoint(proc: subprocess.Popen[bytes], log_path: str, skip: int) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log_path) as fh:
            lines = fh.read().splitlines()[skip:]
        for line in lines:
            if "listening on" in line:
                return line.split("listening on ")[1].split()[0]
        time.sleep(0.05)
    raise AssertionError(f"the server did not start (exit {proc.poll()})")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    sweep_dead()


def _kinds(directory: str, batch: int) -> list[str]:
    return [r["t"] for r in _commit_log(directory) if r.get("batch_id") == batch]


def _sink_bytes(directory: str) -> int:
    root = os.path.join(directory, "recordings")
    total = 0
    for name in os.listdir(root) if os.path.isdir(root) else ():
        if not name.isdigit():  # a spare (spare-<n>, empty) or the id mark (next_id.msgpack)
            continue
        for entry in os.scandir(os.path.join(root, name)):
            if entry.name.endswith(".seg"):
                total += entry.stat().st_size
    return total


def _streams(endpoint: str) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {s: [] for s in STREAMS}
    with client_for(endpoint, timeout_s=60) as c:
        for rec in sorted(c.list_recordings(list(STREAMS)), key=lambda r: r.recording_id):
            if rec.recorded_position > rec.start_position:
                blocks = c.replay(rec.recording_id, rec.start_position, rec.recorded_position)
                got = messages_of(blocks, rec.initial_term_id, rec.term_length)
                out[rec.stream_id] += [m.payload for m in got]
    return out


@pytest.mark.slow
def test_kill_9_inside_a_many_part_commit_and_inside_its_recovery_commits_it_once(
    tmp_path,
) -> None:
    directory = str(tmp_path / "srv")
    log_path = str(tmp_path / "server.log")
    expected: dict[int, list[bytes]] = {s: [] for s in STREAMS}
    batch = 0
    staged: list[dict] = []
    for _attempt in range(5):
        batch += 1
        with open(log_path) if os.path.exists(log_path) else open(os.devnull) as fh:
            skip = len(fh.read().splitlines())
        proc = _start(directory, log_path)
        errors: list[BaseException] = []
        try:
            endpoint = _endpoint(proc, log_path, skip)
            with (
                client_for(endpoint, timeout_s=10) as c,
                client_for(endpoint, timeout_s=COMMITTER_TIMEOUT_S) as committing,
            ):
                staged = [
                    c.stage(SINK, batch, part, 0, stream_id, _rows(stream_id, part), local=False)
                    for part in range(PARTS // 2)
                    for stream_id in STREAMS
                ]

                def commit(c=committing, batch=batch, staged=staged, bad=errors) -> None:
                    try:
                        c.commit(SINK, batch, None, staged)
                    except BaseException as exc:  # a lost server, judged below
                        bad.append(exc)

                base = _sink_bytes(directory)  # the committed end: the batch is written past it
                committer = threading.Thread(target=commit)
                committer.start()
                try:
                    _wait_inside_commit(directory, batch, committer)
                finally:
                    _kill(proc)
                    committer.join(120)
        finally:
            _kill(proc)
        if _kinds(directory, batch) == ["begin"]:
            break  # the kill landed inside the commit
        for part in range(PARTS // 2):  # committed before the kill: counted in, try again
            for stream_id in STREAMS:
                expected[stream_id] += _rows(stream_id, part)
    else:
        pytest.fail("no kill landed inside a commit in 5 attempts")
    assert not committer.is_alive()
    for part in range(PARTS // 2):
        for stream_id in STREAMS:
            expected[stream_id] += _rows(stream_id, part)

    # the restarted server completes the commit before it listens: kill it half-way through
    for _attempt in range(5):
        with open(log_path) as fh:
            skip = len(fh.read().splitlines())
        proc = _start(directory, log_path)
        try:
            deadline = time.monotonic() + 120
            while _kinds(directory, batch)[-1] == "begin" and proc.poll() is None:
                if _sink_bytes(directory) > base + 8 * 1024 * 1024:
                    break  # rewriting the batch's frames (recovery cut its old ones first)
                assert time.monotonic() < deadline, "the recovery never progressed"
                time.sleep(0.005)
        finally:
            _kill(proc)
        if _kinds(directory, batch)[-1] == "begin":
            break
    else:
        pytest.fail("no kill landed inside the recovery's completion in 5 attempts")
    # one more start, and the driver's retry of the commit
    with open(log_path) as fh:
        skip = len(fh.read().splitlines())
    proc = _start(directory, log_path)
    try:
        endpoint = _endpoint(proc, log_path, skip)
        kinds = _kinds(directory, batch)
        assert kinds[-1] == "done", kinds  # completed before serving anyone
        seen = _streams(endpoint)
        assert seen == expected, {s: (len(seen[s]), len(expected[s])) for s in STREAMS}
        with client_for(endpoint, timeout_s=60) as c:
            again = c.commit(SINK, batch, None, staged)
            assert again["count"] == PARTS * ROWS, again
            assert c.last_committed_batch(SINK) == batch
        assert _streams(endpoint) == expected  # the retry appended nothing
    finally:
        _kill(proc)
