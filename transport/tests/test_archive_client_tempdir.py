"""The archive client's process driver removes its temporary directory when the process exits
(each process that used an archive client, every Spark Python worker among them, left an
``aeron-archive-client-<pid>-*`` directory in /tmp before)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    from aeron_spark.transport.archive.client.client import process_driver
    driver = process_driver()
    print(driver.directory, flush=True)
    """
)


def test_the_process_drivers_directory_is_removed_at_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    directory = done.stdout.strip()
    assert os.path.basename(directory).startswith("aeron-archive-client-"), done.stdout
    assert not os.path.exists(directory), f"{directory} left behind"


# A process that used an archive client over UDP and ends without running atexit: Spark's Python
# workers end with os._exit, a peer the tests kill gets SIGKILL. A full test run left about 18
# such directories behind (issue 29).
_CHILD_ENDS_HARD = textwrap.dedent(
    """
    import os, signal, sys
    from aeron_spark.transport.archive.client.client import process_driver
    driver = process_driver()
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
    pub = driver.add_publication("aeron:udp?endpoint=127.0.0.1:9", 10)
    print(driver.directory, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)
    """
)


@pytest.mark.parametrize("ending", ["os._exit", "kill"])
def test_a_process_that_ends_without_atexit_leaves_no_directory(ending: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_ENDS_HARD, ending],
        capture_output=True,
        text=True,
        timeout=60,
    )
    directory = done.stdout.strip()
    assert os.path.basename(directory).startswith("aeron-archive-client-"), (
        done.stdout + done.stderr
    )
    assert not os.path.exists(directory), f"{directory} left behind"
