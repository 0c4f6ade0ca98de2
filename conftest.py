"""Suite-wide set-up: one private key store for every server and client the tests start.

Servers on one host share one identity (like an SSH host key), so test servers that reuse a port
never look like a changed server key; the store is a fresh directory, never the user's
``~/.aeron-spark/keys``. Set before any SparkSession starts, so Spark's Python workers inherit it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_KEY_STORE = tempfile.mkdtemp(prefix="aeron-spark-test-keys-")
os.environ["AERON_SPARK_KEY_STORE"] = _KEY_STORE


def pytest_unconfigure(config) -> None:  # type: ignore[no-untyped-def]
    """The key store goes with the run (every run left one in the temporary directory)."""
    shutil.rmtree(_KEY_STORE, ignore_errors=True)


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
