"""The driver directory's ``ipc`` folder (where IPC log buffers live) goes with the last driver
that used it: a driver that used IPC removes it on close when it is empty, and the default
driver directory too (``/dev/shm/aeron-spark-<user>``: every run left both behind, empty).

Several processes share the directory, so a folder one removes may be in use by another a moment
later: a publisher creating its log buffer makes the folder again, and a driver whose inotify
watch of the folder saw it go watches the new one (it used to say ``broken`` and poll every
20 ms for good: an idle server woke a hundred times a second once another process closed)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.driver.driver import DIRECTORY_ENV

# a process that uses IPC with the default driver directory, then closes its driver
_USES_IPC = """
import sys, time
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
stream = int(sys.argv[1])
with Driver(DriverConfig()) as driver:
    sub = driver.add_subscription("aeron:ipc", stream)
    pub = driver.add_publication("aeron:ipc?term-length=64k", stream)
    got = []
    assembler = FragmentAssembler(lambda payload, header: got.append(bytes(payload)))
    for _ in range(10_000):
        if pub.offer(b"hello") > 0:
            break
        time.sleep(0.01)
    for _ in range(10_000):
        sub.poll(assembler, 10)
        if got:
            break
        time.sleep(0.01)
    assert got == [b"hello"], got
    pub.close()
    sub.close()
print("done", flush=True)
"""


@pytest.fixture
def base() -> Iterator[Path]:
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ["TMPDIR"])
    path = root / f"aeron-spark-test-ipcdir-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(directory: Path, stream: int) -> None:
    env = dict(os.environ, **{DIRECTORY_ENV: str(directory)})
    done = subprocess.run(
        [sys.executable, "-c", _USES_IPC, str(stream)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_process_that_used_ipc_and_closed_leaves_no_directory(base: Path) -> None:
    directory = base / "aeron-spark-user"
    _run(directory, 41)
    # main: the empty ``ipc`` folder (and so the directory) stayed
    assert not directory.exists(), sorted(str(p) for p in directory.rglob("*"))


def test_a_configured_directory_stays_its_empty_ipc_folder_goes(base: Path) -> None:
    with Driver(DriverConfig(directory=base, write_counters_file=False)) as driver:
        pub = driver.add_publication("aeron:ipc?term-length=64k", 42)
        assert (base / "ipc").is_dir()
        pub.close()
    assert base.is_dir()  # a directory the application named is not removed
    assert not (base / "ipc").exists()  # main: it stayed, empty


def test_a_live_drivers_watch_follows_the_ipc_folder_when_another_process_removes_it(
    base: Path,
) -> None:
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda payload, header: got.append(bytes(payload)))
    with Driver(DriverConfig(directory=base, write_counters_file=False)) as watching:
        sub = watching.add_subscription("aeron:ipc", 43)
        watch = watching._ipc_watch
        assert watch is not None, "no inotify on this machine"
        # another process uses IPC in the same directory and closes: the folder is empty, and
        # that driver removes it; or anything else does (a clean-up of /dev/shm), as here
        _run(base, 44)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(base / "ipc")
        wait_for(
            lambda: (base / "ipc").is_dir() or watch.broken,
            "the watching driver to make its folder again",
        )
        # main: the watch lost its folder, and the subscriptions polled every 20 ms for good
        assert not watch.broken, "the watch lost its folder: the subscriptions poll for good"
        with Driver(DriverConfig(directory=base, write_counters_file=False)) as publishing:
            pub = publishing.add_publication("aeron:ipc?term-length=64k", 43)

            def delivered() -> bool:
                if not got:
                    pub.offer(b"after")
                    sub.poll(assembler, 10)
                return bool(got)

            wait_for(delivered, "the subscription to find the new publisher")
            assert got[0] == b"after"
            assert not watch.broken
            pub.close()
        sub.close()


def test_a_stream_server_process_stopped_leaves_nothing_in_its_driver_directory(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ``aeron-spark server`` process (its handshake listens over IPC too: a reply log
    buffer in the folder while it runs), stopped with SIGTERM: its driver directory is gone."""
    from aeron_spark.connector.server.testing import server_process

    directory = base / "aeron-spark-user"
    # the server process's only (a client here would make this process's shared driver there)
    monkeypatch.setenv(DIRECTORY_ENV, str(directory))
    with server_process(str(tmp_path / "srv")) as (proc, _endpoint):
        assert (directory / "ipc").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    # main: the empty ``ipc`` folder stayed
    assert not directory.exists(), sorted(str(p) for p in directory.rglob("*"))


# a driver process with an IPC subscription, answering on stdin: "state" (its watch), "read"
# (the first message of its subscription, within a bounded wait)
_WATCHING = """
import json, sys, time
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
driver = Driver(DriverConfig(directory=sys.argv[1], write_counters_file=False))
sub = driver.add_subscription("aeron:ipc", int(sys.argv[2]))
watch = driver._ipc_watch
got = []
assembler = FragmentAssembler(lambda payload, header: got.append(bytes(payload)))
print(json.dumps({"watch": watch is not None}), flush=True)
for line in sys.stdin:
    if line.strip() == "state":
        state = {
            "broken": watch.broken,
            "generation": watch.generation,
            "overflows": getattr(watch, "overflows", None),
            "counted": driver.counters.snapshot().get("ipc_watch_overflows"),
        }
        print(json.dumps(state), flush=True)
    elif line.strip() == "read":
        deadline = time.monotonic() + 60.0
        while not got and time.monotonic() < deadline:
            sub.poll(assembler, 10)
            sub.wait(0.05)
        print(json.dumps({"got": [g.decode() for g in got]}), flush=True)
driver.close()
"""


def _ask(proc: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()  # the child answers each command (bounded by its own waits)
    assert line, f"the watching driver ended: {proc.stderr.read() if proc.stderr else ''}"
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_an_ipc_watch_whose_queue_overflowed_is_watched_anew_and_counted(base: Path) -> None:
    """More files came in the IPC directory than the kernel queues for a watch that is not read
    (``fs.inotify.max_queued_events``; the driver process stopped meanwhile, as a busy or
    descheduled one is): the watch gets ``IN_Q_OVERFLOW``. It said ``broken`` for good, and
    the driver's IPC subscriptions polled the directory every 20 ms from then on; now the
    overflow is counted, the watch is armed again and its generation moved (the subscriptions
    scan once: what came meanwhile is found), and it wakes them for the next file."""
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    folder = base / "ipc"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WATCHING, str(base), "47"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("watch") is True, "no inotify watch in the driver process"
        before = _ask(proc, "state")
        os.kill(proc.pid, signal.SIGSTOP)  # its events queue in the kernel, unread
        try:
            for i in range(queued + 256):  # more than the queue holds: an overflow
                path = folder / f"flood-{i}"
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
                os.unlink(path)
        finally:
            os.kill(proc.pid, signal.SIGCONT)

        def overflow_seen() -> bool:
            state = _ask(proc, "state")
            return bool(state["broken"] or state["overflows"])

        wait_for(overflow_seen, "the driver to read its watch's overflow")
        after = _ask(proc, "state")
        # main: {"broken": true, "overflows": null}: its subscriptions polled for good
        assert not after["broken"], "the overflowed watch said broken: the subscriptions poll"
        assert after["overflows"] == 1 and after["counted"] == 1, after
        assert after["generation"] > before["generation"]  # the subscriptions rescan
        # the watch is live again: a new publisher's log file wakes the subscription
        with Driver(DriverConfig(directory=base, write_counters_file=False)) as publishing:
            pub = publishing.add_publication("aeron:ipc?term-length=64k", 47)
            wait_for(lambda: _ask(proc, "state")["generation"] > after["generation"], "an event")
            wait_for(lambda: pub.offer(b"after-overflow") > 0, "the publication to offer")
            assert _ask(proc, "read") == {"got": ["after-overflow"]}
            final = _ask(proc, "state")
            assert not final["broken"] and final["overflows"] == 1
            pub.close()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
