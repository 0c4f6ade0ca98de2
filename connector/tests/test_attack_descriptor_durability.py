"""With ``--fsync`` a recording's directory is durable before anything in it is acknowledged.

A power cut keeps only what was fsynced. A new recording is a directory ``recordings/<id>``
made for it, its descriptor ``meta.msgpack`` inside. With ``--fsync`` the server fsynced the
descriptor and the recording's own directory before the first append, but never the directory
``recordings`` that holds the new directory's name: a power cut after the first publish was
acknowledged could lose the recording's name, and with it the whole recording (its descriptor,
its acknowledged messages), on a file system that does not order a new directory's entry
before its files (POSIX promises nothing else). Likewise a new segment file (the first, and one
every 64 MiB): its data was fsynced before the answer, its name in the recording's directory
never. The answer (Aeron's too): fsync the parent after creating a file or directory in it.

A power cut cannot be made for a test; what the server asks of the kernel can be seen: the
server runs under ``strace`` (its real system calls, with the paths of their descriptors and
wall-clock times): the fsync of ``recordings`` must come after the ``mkdir`` of the new
recording, and one of the recording's directory after its segment file was created, both
before the client has its acknowledgement.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.client import StreamClient
from aeron_spark.connector.server.testing import client_for
from aeron_spark.transport.testing import sweep_dead

STREAM = 21
_CODE = (
    "import sys; from aeron_spark.connector.server import server_main; "
    "sys.exit(server_main(sys.argv[1:]))"
)
# a call another thread interrupted is printed "<unfinished ...>" (its start time and arguments;
# the result on a later "resumed" line): one line per call either way (CI missed such a mkdir).
# strace pads the pid to 5 columns: a pid under 10000 is followed by two spaces (no line of a
# low-pid server matched, and its test failed with "no mkdir traced")
_LINE = re.compile(r"^(\d+)\s+(\d+\.\d+) (\w+)\((.*)(?:\) = (-?\d+)| <unfinished \.\.\.>)")


def _traced_server(
    directory: str,
    trace: str,
    log_path: str,
    calls: str,
) -> subprocess.Popen[bytes]:
    argv = [
        "strace",
        "-f",
        "-y",
        "-ttt",
        "-e",
        f"trace={calls}",
        "-o",
        trace,
        sys.executable,
        "-c",
        _CODE,
        "--dir",
        directory,
        "--port",
        "0",
        "--no-encryption",
        "--fsync",
    ]
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log, env=dict(os.environ))


def _endpoint(proc: subprocess.Popen[bytes], log_path: str) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log_path) as fh:
            for line in fh.read().splitlines():
                if "listening on" in line:
                    return line.split("listening on ")[1].split()[0]
        time.sleep(0.1)
    with open(log_path) as fh:
        raise AssertionError(f"the server did not start (exit {proc.poll()}): {fh.read()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the traced server (strace's child), then reap strace, which ends with it."""
    children_file = f"/proc/{proc.pid}/task/{proc.pid}/children"
    if proc.poll() is None and os.path.exists(children_file):
        with open(children_file) as fh:
            for pid in fh.read().split():
                os.kill(int(pid), signal.SIGKILL)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    sweep_dead()


@contextlib.contextmanager
def _traced_client(tmp_path: Path, calls: str) -> Iterator[StreamClient]:
    """A client of a server (``--fsync``, its directory ``tmp_path/srv``) running under strace,
    which writes the ``calls`` it traces to ``tmp_path/strace.log`` (read them with
    :func:`_calls` once this exits: the server is killed and strace reaped by then)."""
    log_path = str(tmp_path / "server.log")
    proc = _traced_server(str(tmp_path / "srv"), str(tmp_path / "strace.log"), log_path, calls)
    try:
        endpoint = _endpoint(proc, log_path)
        with client_for(endpoint, timeout_s=120) as c:
            yield c
    finally:
        _stop(proc)


def _calls(tmp_path: Path) -> list[tuple[float, str, str]]:
    """(wall time, call, arguments) of each call :func:`_traced_client` traced, an interrupted
    one at its start."""
    calls = []
    with open(tmp_path / "strace.log") as fh:
        for line in fh:
            found = _LINE.match(line)
            if found:
                calls.append((float(found.group(2)), found.group(3), found.group(4)))
    return calls


def _made(calls: list[tuple[float, str, str]], path: str) -> float:
    """When directory ``path`` was made (its first mkdir traced)."""
    at = [t for t, name, args in calls if name.startswith("mkdir") and f'"{path}"' in args]
    assert at, f"no mkdir of {path} traced"
    return at[0]


def _synced_after(calls: list[tuple[float, str, str]], path: str, after: float) -> list[float]:
    """When ``path`` was fsynced (or fdatasynced) after ``after``."""
    return [
        t
        for t, name, args in calls
        if name in ("fsync", "fdatasync") and args.endswith(f"<{path}>") and t > after
    ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_new_recordings_name_is_fsynced_before_its_first_publish_is_acknowledged(
    tmp_path,
) -> None:
    """The recording a first publish creates is a spare directory renamed in (issue 31 item 1:
    made ahead, off the loop, its files fsynced in it before it is handed out), or, with no
    spare ready, made by a ``mkdir``: either way ``recordings`` is fsynced after the new name
    appears, and the directory holding the new segment file after that file's creation, both
    before the publish is acknowledged. The client waits for the server's spare, so the spare's
    path is the one traced (the mkdir path is the store's fallback)."""
    traced = "mkdir,mkdirat,open,openat,fsync,fdatasync,rename,renameat,renameat2"
    with _traced_client(tmp_path, traced) as c:
        deadline = time.monotonic() + 120
        while c.stats()["store"]["spare_recordings_ready"] < 1:
            assert time.monotonic() < deadline, "no spare recording directory was made"
            time.sleep(0.05)
        c.publish(STREAM, [b"first"])
        acknowledged = time.time()
        (rec,) = c.list_recordings([STREAM])
    root = os.path.realpath(os.path.join(tmp_path / "srv", "recordings"))
    made = os.path.join(root, str(rec.recording_id))
    calls = _calls(tmp_path)
    mkdir_at = [t for t, name, args in calls if name.startswith("mkdir") and f'"{made}"' in args]
    renamed = [
        (t, re.findall(r'"([^"]+)"', args)[0])
        for t, name, args in calls
        if name.startswith("rename") and f'"{made}"' in args
    ]
    assert mkdir_at or renamed, f"neither a mkdir nor a rename to {made} traced"
    # where the segment file was created: in the spare (then renamed in) or in the new directory
    named_at, held_in = (renamed[0][0], renamed[0][1]) if renamed else (mkdir_at[0], made)
    segment = os.path.join(held_in, "00000000000000000000.seg")
    created = [
        t
        for t, name, args in calls
        if name.startswith("open") and f'"{segment}"' in args and "O_CREAT" in args
    ]
    assert created, f"no creation of {segment} traced"
    root_synced = _synced_after(calls, root, named_at)
    dir_synced = _synced_after(calls, held_in, created[0])
    after = [c for c in calls if c[0] > named_at and c[1] != "openat"][:20]
    # main: the recording's descriptor was fsynced, ``recordings`` never
    assert root_synced and root_synced[0] < acknowledged, f"fsyncs after the new name: {after}"
    # main: the segment file's data was fsynced, its name in the recording's directory never
    assert dir_synced and dir_synced[0] < acknowledged, f"fsyncs after the segment: {after}"
    if renamed:  # the spare's names were durable before it was renamed in
        assert dir_synced[0] < named_at, f"the spare was fsynced after its rename: {after}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_staged_parts_directory_names_are_fsynced_before_the_stage_is_acknowledged(
    tmp_path,
) -> None:
    """A staged part lies in ``sink/staged/<sink id hex>/<batch id>/``, both directories made
    for the batch's first part. Its file was fsynced, and the batch directory after its rename
    to ``.part``, but never the directories holding the new directories' names: after a power
    cut the acknowledged part could be gone with its batch directory (the commit then fails
    with STAGED_DATA_MISSING and Spark runs the batch again: no loss, but an acknowledged stage
    that was not durable). Now each new directory's parent is fsynced after its mkdir, before
    the answer; for a part staged over the session and one the client wrote itself (local)."""
    acknowledged: dict[bool, float] = {}
    with _traced_client(tmp_path, "mkdir,mkdirat,fsync,fdatasync,rename,renameat,renameat2") as c:
        for batch, local in ((7, False), (8, True)):
            c.stage("sink-a", batch, 0, 0, STREAM, [b"row"] * 3, local=local)
            acknowledged[local] = time.time()
    staged = os.path.join(os.path.realpath(tmp_path / "srv"), "sink", "staged")
    sink_dir = os.path.join(staged, b"sink-a".hex())
    calls = _calls(tmp_path)
    sink_made = _made(calls, sink_dir)
    for batch, local in ((7, False), (8, True)):
        batch_dir = os.path.join(sink_dir, str(batch))
        part = os.path.join(batch_dir, f"0-0@{STREAM}.part")
        renamed = [t for t, name, args in calls if name.startswith("rename") and part in args]
        assert renamed, f"no rename to {part} traced"
        ack = acknowledged[local]
        after = [c for c in calls if c[0] > _made(calls, batch_dir)][:20]
        # main: fsynced after the rename (the part's name in its batch directory) ...
        assert any(t < ack for t in _synced_after(calls, batch_dir, renamed[0])), after
        # ... but not the batch directory's name, nor the sink directory's
        assert any(t < ack for t in _synced_after(calls, sink_dir, _made(calls, batch_dir))), after
        assert any(t < acknowledged[False] for t in _synced_after(calls, staged, sink_made)), after
