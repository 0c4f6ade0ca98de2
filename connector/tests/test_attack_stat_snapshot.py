"""Attacks on the server's directory and its stat snapshot (issue 31 item 4 split the snapshot
into ``stat.json`` and ``stat-recordings.json``), against real server processes.

* A torn pair: the server replaces the recordings' file, then ``stat.json``. A reader that
  opened ``stat.json`` before and the recordings after (or a server that failed or stopped
  between its two replaces) paired two snapshots silently: a recording its streams did not
  count. Both files now carry the snapshot's generation; a reader reads again until they agree,
  and says so if they never do.
* A directory another user can write: the server followed a symlink planted where it creates
  ``server.lock`` (truncated, then its pid written) and ``stat.json.tmp`` (overwritten with
  JSON): any file the server's user may write was destroyed. It now refuses such a directory.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.connector.server.stat import read_snapshot, render
from aeron_spark.connector.server.testing import client_for, server_process


def _agreeing(directory: str, recordings: int) -> dict[str, Any]:
    """The snapshot once it lists ``recordings`` recordings (bounded wait)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            snapshot = read_snapshot(directory)
        except Exception:  # noqa: BLE001 - not written yet
            snapshot = {}
        if len(snapshot.get("recordings", ())) == recordings:
            return snapshot
        assert time.monotonic() < deadline, f"the snapshot never listed {recordings} recordings"
        time.sleep(0.1)


def _counted(snapshot: dict[str, Any]) -> dict[int, int]:
    return {s["stream_id"]: s["recordings"] for s in snapshot["streams"]}


def _listed(snapshot: dict[str, Any]) -> dict[int, int]:
    return dict(collections.Counter(r["stream_id"] for r in snapshot["recordings"]))


def test_a_reader_never_pairs_stat_json_with_another_snapshots_recordings(
    tmp_path: Path,
) -> None:
    """The server is stopped (SIGSTOP) with the files as a reader finds them between the
    server's two replaces: the recordings of the newer snapshot (two recordings), stat.json of
    the older (one). Before: read_snapshot returned both, stream 8's recording counted by no
    stream. Now the reader reads again for a while, then marks the snapshot (stale, both
    generations) rather than pairing them; once the pair agrees it reads them as one."""
    directory = str(tmp_path / "srv")
    stat_path = os.path.join(directory, "stat.json")
    os.mkdir(directory, 0o755)
    leftover = os.path.join(directory, "stat-recordings.json.k1ll3d.tmp")  # a killed server's
    with open(leftover, "w") as fh:
        fh.write("[")
    with server_process(directory) as (proc, endpoint):
        with client_for(endpoint) as client:
            client.publish(7, [b"first"])
            older = _agreeing(directory, 1)
            assert _counted(older) == _listed(older) == {7: 1}
            with open(stat_path, "rb") as fh:
                older_text = fh.read()
            client.publish(8, [b"second"])
            newer = _agreeing(directory, 2)
            assert _counted(newer) == _listed(newer) == {7: 1, 8: 1}
            assert not os.path.exists(leftover)
            # readable by whom it was before (mkstemp makes 0600): as open() makes a file
            plain = os.path.join(str(tmp_path), "plain")
            open(plain, "w").close()
            assert os.stat(stat_path).st_mode == os.stat(plain).st_mode
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with open(stat_path, "rb") as fh:
                newer_text = fh.read()
            # the window: recordings replaced, stat.json not yet
            tmp = stat_path + ".test"
            with open(tmp, "wb") as fh:
                fh.write(older_text)
            os.replace(tmp, stat_path)
            torn = read_snapshot(directory)
            assert torn.get("recordings_mismatch") or _counted(torn) == _listed(torn), (
                f"a torn pair read as one snapshot: streams count {_counted(torn)}, "
                f"recordings list {_listed(torn)}"
            )
            assert torn["stale"] is True
            assert "another snapshot" in render(torn)
            # the server's next replace of stat.json: the pair agrees again
            with open(tmp, "wb") as fh:
                fh.write(newer_text)
            os.replace(tmp, stat_path)
            whole = read_snapshot(directory)
            assert "recordings_mismatch" not in whole
            assert _counted(whole) == _listed(whole) == {7: 1, 8: 1}
        finally:
            os.kill(proc.pid, signal.SIGCONT)


def test_a_server_refuses_a_directory_another_user_can_write(tmp_path: Path) -> None:
    """A data directory writable by every user (as one pre-created in /tmp by someone else)
    with symlinks planted where the server creates its lock and its stat snapshot's temporary
    file. Before: the server started, truncated the victim file and wrote its pid into it (the
    lock), then JSON (stat.json). Now it exits at start with code 1 (DirectoryUnsafeError)
    naming the directory, the victim untouched."""
    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, 0o777)
    if os.geteuid() == 0:
        os.chown(directory, 65534, 65534)  # nobody's: as a directory another user made
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.symlink(victim, directory / "server.lock")
    os.symlink(victim, directory / "stat.json.tmp")
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aeron_spark.cli", "server", "--dir", str(directory)]
            + ["--port", "0", "--no-encryption"],
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and victim.read_bytes() == b"precious\n":
            assert time.monotonic() < deadline, "the server neither exited nor wrote"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    assert victim.read_bytes() == b"precious\n", (
        f"the server wrote through a planted symlink: {victim.read_bytes()[:80]!r}"
    )
    assert proc.returncode == 1
    text = log_path.read_text()
    assert "is not safe" in text and str(directory) in text, text[-2000:]
    assert not (directory / "stat.json").exists()


_READER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from aeron_spark.connector.server.stat import read_snapshot
try:
    read_snapshot(sys.argv[1])
except Exception as exc:  # the coded refusal
    print(type(exc).__name__, exc)
    sys.exit(3)
"""


@pytest.mark.parametrize("planted", ["stat.json -> /dev/zero", "stat.json fifo", "recordings"])
def test_a_reader_takes_only_regular_snapshot_files(tmp_path: Path, planted: str) -> None:
    """The server's user can write its directory; whoever runs ``aeron-spark stat --dir``
    (an operator, root) read what it found there. Before: a ``stat.json`` (or recordings file)
    linked to ``/dev/zero`` was read until the reader ran out of memory, and a FIFO made it wait
    for good. Now each is refused at once with SERVER_UNAVAILABLE naming the file."""
    directory = tmp_path / "srv"
    directory.mkdir()
    if planted == "stat.json -> /dev/zero":
        os.symlink("/dev/zero", directory / "stat.json")
    elif planted == "stat.json fifo":
        os.mkfifo(directory / "stat.json")
    else:
        (directory / "stat.json").write_text(
            json.dumps({"recordings_file": "stat-recordings.json", "written_at_s": time.time()})
        )
        os.symlink("/dev/zero", directory / "stat-recordings.json")
    done = subprocess.run(
        [sys.executable, "-c", _READER, str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, (done.returncode, done.stdout[-500:], done.stderr[-1500:])
    assert done.stdout.startswith("ServerUnavailableError")
    assert "stat" in done.stdout
