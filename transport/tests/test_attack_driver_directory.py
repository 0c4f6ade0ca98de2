"""A local user who takes a driver's default directory first.

The default driver directory is ``/dev/shm/aeron-spark-<user>``: a name anyone can compute, in
a directory anyone may create entries in. Another user who makes it before the victim's first
run owns it: the victim's drivers used it as their own, so that user's IPC publications were
read as the victim's streams (and it could replace or delete the victim's log files, flood the
IPC watch, or plant symlinks where the driver writes its counters). A driver now refuses a
default directory owned by another user, and any directory every user may write
(``DirectoryUnsafeError``, DIRECTORY_UNSAFE), before it reads or writes anything there.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.driver.driver import default_directory
from aeron_spark.transport.errors import DirectoryUnsafeError

STREAM = 31
OTHER_UID = 65534  # nobody


def _hijacked(monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user name of this test's own, so its default directory is a fresh one."""
    name = f"aeron-spark-attack-{os.getpid()}-{time.monotonic_ns()}"
    for var in ("USER", "LOGNAME", "LNAME", "USERNAME"):
        monkeypatch.setenv(var, name)
    monkeypatch.delenv("AERON_SPARK_DIR", raising=False)
    return default_directory()


def _chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)
    os.chown(path, uid, uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another user owns")
def test_a_driver_refuses_a_default_directory_another_user_made_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attacker's directory (0755, owned by nobody) holds its IPC publication on the
    victim's stream. Before: the victim's driver subscribed there and read the attacker's
    message as its stream's. Now its start is refused, naming the directory and its owner."""
    directory = _hijacked(monkeypatch)
    try:
        directory.mkdir(mode=0o755)
        # the attacker's publisher (its files given to the attacker's uid, as its own process
        # would have made them)
        with Driver(DriverConfig(directory=directory, write_counters_file=False)) as attacker:
            pub = attacker.add_publication("aeron:ipc", STREAM)
            _chown_tree(directory, OTHER_UID)
            victim = Driver(DriverConfig())  # the default directory
            try:
                victim.start()
            except DirectoryUnsafeError as exc:
                assert str(directory) in str(exc) and "DIRECTORY_UNSAFE" in str(exc)
                assert exc.owner_uid == OTHER_UID
                return
            try:
                sub = victim.add_subscription("aeron:ipc", STREAM)
                got: list[bytes] = []
                deadline = time.monotonic() + 30
                while not got and time.monotonic() < deadline:
                    pub.offer(b"forged by another user")
                    sub.poll(lambda data, *_: got.append(bytes(data)), 10)
                    time.sleep(0.01)
            finally:
                victim.close()
            pytest.fail(
                f"the victim's driver used {directory}, made by uid {OTHER_UID}, as its own and "
                f"read {got[:1]!r} from that user's publication"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_driver_refuses_a_directory_every_user_may_write(tmp_path: Path) -> None:
    """A directory named explicitly may be another user's (a group sharing one), but not one
    every user may write: refused at start, before anything is swept or written there."""
    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, 0o777)
    planted = directory / "ipc"
    planted.mkdir()
    with pytest.raises(DirectoryUnsafeError) as info:
        Driver(DriverConfig(directory=directory)).start()
    assert "every user may write" in str(info.value)
    assert info.value.mode == 0o777
    os.chmod(directory, 0o755)  # the owner's again: accepted
    with Driver(DriverConfig(directory=directory)) as driver:
        driver.add_subscription("aeron:ipc", STREAM).close()
