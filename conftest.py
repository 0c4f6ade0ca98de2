"""Suite-wide set-up: one private key store for every server and client the tests start, and a
temporary directory of the run's own that must be left as it was found.

Servers on one host share one identity (like an SSH host key), so test servers that reuse a port
never look like a changed server key; the store is a fresh directory, never the user's
``~/.aeron-spark/keys``. Set before any SparkSession starts, so Spark's Python workers inherit it.

The run's processes (this one, the servers and peers it starts, Spark's Python workers: they all
inherit ``TMPDIR``) make their temporary files in a directory of the run's own, so the check that
the run leaves nothing behind sees only this run's files, never another run's on a shared machine
(pytest's own ``tmp_path`` directories stay where pytest keeps them).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import pytest

# What our code names its temporary files and directories (archive clients' drivers, servers,
# key stores, tmpfs mounts, ...): what the run must not leave behind.
PROJECT_TEMP_PREFIXES = ("aeron-archive-client-", "aeron-spark-")

# A run started in the background by a non-interactive shell (as CI runs it) inherits SIGINT
# ignored, and every process it starts would too: the Java peers, servers and programs the tests
# stop with SIGINT then ignored it and were killed only after their 10 s stop timeout (in CI:
# test_interop_aeron.py 484 s instead of ~110 s, 30 s teardowns of three archives). Python's own
# handler here: the processes started from now on get SIGINT's default action again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
_RUN_TMP = tempfile.mkdtemp(prefix="aeron-spark-test-run-")
os.environ["TMPDIR"] = _RUN_TMP
tempfile.tempdir = _RUN_TMP

_KEY_STORE = tempfile.mkdtemp(prefix="aeron-spark-test-keys-")
os.environ["AERON_SPARK_KEY_STORE"] = _KEY_STORE


def _project_entries() -> set[str]:
    return {name for name in os.listdir(_RUN_TMP) if name.startswith(PROJECT_TEMP_PREFIXES)}


@pytest.fixture(scope="session", autouse=True)
def _temporary_directory_left_as_found() -> Iterator[None]:
    """Fails the run (at its last teardown) naming what its processes left in the temporary
    directory: a directory or file of ours that was not there when the run began."""
    before = _project_entries()
    yield
    left = sorted(_project_entries() - before)
    if left:
        pytest.fail(f"the run left {len(left)} entries in {_RUN_TMP}: {left}", pytrace=False)


def pytest_unconfigure(config) -> None:  # type: ignore[no-untyped-def]
    """The key store and the run's temporary directory go with the run."""
    shutil.rmtree(_KEY_STORE, ignore_errors=True)
    shutil.rmtree(_RUN_TMP, ignore_errors=True)


_INTEROP_IDS: set[str] = set()


def pytest_collection_modifyitems(items) -> None:  # type: ignore[no-untyped-def]
    _INTEROP_IDS.update(item.nodeid for item in items if item.get_closest_marker("interop"))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    """One line counting the interop tests (against the real Aeron), so a run shows how many of
    them passed and that none skipped."""
    outcomes: dict[str, str] = {}
    for status in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(status, []):
            if getattr(report, "nodeid", None) in _INTEROP_IDS:
                if outcomes.get(report.nodeid) not in ("failed", "error"):
                    outcomes[report.nodeid] = status
    if outcomes:
        counts = {
            s: list(outcomes.values()).count(s) for s in ("passed", "failed", "error", "skipped")
        }
        terminalreporter.write_line(
            "interop tests against the real Aeron: "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
        )
