"""The archive client's process driver removes its temporary directory when the process exits
(each process that used an archive client, every Spark Python worker among them, left an
``aeron-archive-client-<pid>-*`` directory in /tmp before)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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
