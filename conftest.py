"""Suite-wide set-up: one private key store for every server and client the tests start, and a
temporary directory of the run's own that must be left as it was found.

Servers on one host share one identity (like an SSH host key), so test servers that reuse a port
never look like a changed server key; the store is a fresh directory, never the user's
``~/.aeron-spark/keys``. Set before any SparkSession starts, so Spark's Python workers inherit it.

The run's processes (this one, the servers and peers it starts, Spark's Python workers: they all
inherit ``TMPDIR``) make their temporary files in a directory of the run's own, so the check that
the run leaves nothing behind sees only this run's files, never another run's on a shared machine
(pytest's own ``tmp_path`` directories stay where pytest keeps them). The directory names the
pytest process that made it (``pytest-owner``: its pid and start time); a run removes, as it
starts, those whose process is gone (an interrupted run never removed its own), never a live
run's, nor one naming no owner.

A parallel run (pytest-xdist: ``python -m pytest -n 3 --dist loadgroup``; one process is the
default, see pyproject's ``addopts``) runs each test file whole on one worker, and the files of
spark_tests/ on one worker, one after the other (``SPARK_GROUP``): one SparkSession for the
whole run, never one per worker, and one Spark driver at a time. Each worker is a pytest process
of its own, with its own run directory (inside the controller's), key store and ``/dev/shm``
check.

A run stops at once, saying why, when /dev/shm (where the drivers' log buffers live) is missing,
not writable or has less than 256 MiB free.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# What our code names its temporary files and directories (archive clients' drivers, servers,
# key stores, tmpfs mounts, ...): what the run must not leave behind.
PROJECT_TEMP_PREFIXES = ("aeron-archive-client-", "aeron-spark-")

RUN_PREFIX = "aeron-spark-test-run-"
# In each run's directory: "<pid> <start time>" of the pytest process that made it, so a later
# run can tell a directory left by an interrupted run (its process gone) from a live one's
OWNER_FILE = "pytest-owner"
# /dev/shm must take the Aeron log buffers of a run (ours, and the Java archives' of the interop
# tests): a container's default 64 MiB did not, and tests failed far from the cause
MIN_SHM_FREE = 256 * 1024 * 1024


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), None if there is none: with
    the pid it names one process, never a later one given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22 (the fields after the name start at 3)


def _sweep_dead_runs(parent: str) -> list[str]:
    """Remove the run directories in ``parent`` whose pytest process is gone (an interrupted
    run's: its ``pytest_unconfigure`` never came); a live run's stays, and so does one that
    names no owner (a run of an older conftest, or one being made: not ours to judge)."""
    removed: list[str] = []
    if not Path("/proc/self/stat").exists():
        return removed  # cannot tell a live run from a dead one here
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(RUN_PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            owner = Path(entry.path, OWNER_FILE).read_text().split()
        except OSError:
            continue
        if len(owner) != 2 or not owner[0].isdigit() or _start_time(int(owner[0])) == owner[1]:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


def shm_problem(path: str = "/dev/shm", need: int = MIN_SHM_FREE) -> str | None:
    """Why ``path`` cannot hold a run's log buffers (missing, not writable, too small), or None."""
    if not os.path.isdir(path):
        return f"{path} is missing (the drivers' log buffers live there)"
    try:
        fd, probe = tempfile.mkstemp(prefix="aeron-spark-test-shm-probe-", dir=path)
    except OSError as exc:
        return f"{path} is not writable: {exc}"
    try:
        os.write(fd, b"\0" * 4096)
    except OSError as exc:
        return f"{path} refused a 4 KiB write: {exc}"
    finally:
        os.close(fd)
        os.unlink(probe)
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if free < need:
        return (
            f"{path} has {free / 2**20:.1f} MiB free, the tests need at least "
            f"{need / 2**20:.0f} MiB (Aeron log buffers; in a container: --shm-size=1g)"
        )
    return None


_SWEPT = _sweep_dead_runs(tempfile.gettempdir())

# A run started in the background by a non-interactive shell (as CI runs it) inherits SIGINT
# ignored, and every process it starts would too: the Java peers, servers and programs the tests
# stop with SIGINT then ignored it and were killed only after their 10 s stop timeout (in CI:
# test_interop_aeron.py 484 s instead of ~110 s, 30 s teardowns of three archives). Python's own
# handler here: the processes started from now on get SIGINT's default action again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
_RUN_TMP = tempfile.mkdtemp(prefix=RUN_PREFIX)
Path(_RUN_TMP, OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
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


# A parallel run's units of work (pytest-xdist, ``-n 3 --dist loadgroup``): a
# test file, except that every file of spark_tests/ is one unit, SPARK_GROUP, run by one worker
# one after the other: the run starts one SparkSession (their ``spark`` fixture's), never one per
# worker, and no two Spark drivers at once. The files that start Spark drivers of their own
# (spark-submit, a Connect server, a standalone cluster) once had units of their own: with three
# Spark drivers at once at load 10-16, nine Spark tests failed with "Python worker failed to
# connect back" (Spark waits a fixed 10 s for a Python worker it starts to connect).
# ``--spark-workers 2`` makes those files (SPARK_OWN_DRIVERS: none uses the ``spark`` fixture)
# one unit of their own, SPARK_OWN_DRIVERS_GROUP, on a second worker: two Spark drivers at most
# at once, one a worker, and the session's SparkSession still on one worker only.
SPARK_GROUP = "spark"
SPARK_OWN_DRIVERS_GROUP = "spark-own-drivers"
SPARK_GROUPS = (SPARK_GROUP, SPARK_OWN_DRIVERS_GROUP)  # in the order they run first
SPARK_DIR = "spark_tests/"
SPARK_OWN_DRIVERS = frozenset(
    {
        "spark_tests/test_cluster.py",
        "spark_tests/test_examples_spark.py",
        "spark_tests/test_spark_connect.py",
    }
)


def pytest_addoption(parser) -> None:  # type: ignore[no-untyped-def]
    parser.addoption(
        "--spark-workers",
        type=int,
        choices=(1, 2),
        default=1,
        help="workers of a parallel run that run spark_tests/ (root conftest.py): 1, every "
        "file on one; 2, the files starting Spark drivers of their own on a second",
    )


def unit_of(nodeid: str, spark_workers: int = 1) -> str:
    """The unit of work of test ``nodeid`` in a parallel run (see ``SPARK_GROUP``)."""
    path = nodeid.split("::", 1)[0]
    if not path.startswith(SPARK_DIR):
        return path
    if spark_workers == 2 and path in SPARK_OWN_DRIVERS:
        return SPARK_OWN_DRIVERS_GROUP
    return SPARK_GROUP


# The CPU goes to the Spark worker first: a parallel run's worker lowers its priority (nice) for
# good as it starts a test outside the Spark group(s), and every process it starts from then on
# (Java peers, servers, clients) inherits it. A Spark group runs first on its worker, so that
# worker keeps nice 0 until its Spark group is done. Why: Spark gives a Python worker it starts a
# fixed 10 s to connect back (PythonWorkerFactory.createSimpleWorker, no setting; the streaming
# source of every query starts one), and the worker's start is ~0.5 s of CPU (pyspark, pyarrow,
# numpy): with the other workers' JVMs at the same priority it did not get that within 10 s.
NICE_OUTSIDE_SPARK = 10
_niced = False


def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadgroup`` schedules by ``unit_of``, in the order the workers collected (the
    order ``pytest_collection_modifyitems`` sets). xdist's own loadgroup reads groups from
    ``xdist_group`` marks through a suffix it writes into each test's id, which pytest 9.2's
    structured ids no longer take (pytest-xdist#1386): every test was then a unit of its own,
    two workers ran Spark tests at once, each with a SparkSession of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid, spark_workers)

    spark_workers = config.getoption("spark_workers")

    config.option.loadscopereorder = False  # by collection order, not by tests per unit
    return FileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:  # type: ignore[no-untyped-def]
    """The order units are handed out in (the longest first, so none starts last): the Spark
    group(s), files with a ``slow`` test, then the rest (a stable sort: a file's tests keep their
    order). A test that uses the ``spark`` fixture outside the Spark group (``--spark-workers 2``
    or not) is refused: it would start a second SparkSession in a parallel run."""
    stray = [i.nodeid for i in items if "spark" in getattr(i, "fixturenames", ())]
    stray = [nodeid for nodeid in stray if unit_of(nodeid, spark_workers=2) != SPARK_GROUP]
    if stray:
        raise pytest.UsageError(
            f"tests using the session's SparkSession outside {SPARK_DIR}, or in a file of "
            f"SPARK_OWN_DRIVERS (the one worker of a parallel run that runs the session's "
            f"Spark: root conftest.py): {stray}"
        )
    spark_workers = config.getoption("spark_workers")
    slow_units = {
        unit_of(i.nodeid, spark_workers) for i in items if i.get_closest_marker("slow") is not None
    }

    spark_ranks = {group: n for n, group in enumerate(SPARK_GROUPS)}

    def rank(item: pytest.Item) -> int:
        unit = unit_of(item.nodeid, spark_workers)
        return spark_ranks.get(unit, len(SPARK_GROUPS) + (0 if unit in slow_units else 1))

    items.sort(key=rank)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem) -> None:  # type: ignore[no-untyped-def]
    """A parallel run's worker lowers its priority as it starts a test outside the Spark
    group(s) (see ``NICE_OUTSIDE_SPARK``); one process (no xdist worker) never does."""
    global _niced
    if _niced or "PYTEST_XDIST_WORKER" not in os.environ:
        return
    if unit_of(item.nodeid, item.config.getoption("spark_workers")) in SPARK_GROUPS:
        return
    os.nice(NICE_OUTSIDE_SPARK)
    _niced = True


def pytest_sessionstart(session) -> None:  # type: ignore[no-untyped-def]
    """A run on a machine whose /dev/shm cannot take its log buffers stops here, saying why."""
    if sys.platform.startswith("linux"):
        problem = shm_problem()
        if problem is not None:
            pytest.exit(f"/dev/shm is not usable for the tests: {problem}", returncode=4)


def pytest_report_header(config) -> list[str]:  # type: ignore[no-untyped-def]
    if not _SWEPT:
        return []
    return [f"removed {len(_SWEPT)} temporary directories of interrupted runs: {_SWEPT}"]


def pytest_unconfigure(config) -> None:  # type: ignore[no-untyped-def]
    """The key store and the run's temporary directory go with the run."""
    shutil.rmtree(_KEY_STORE, ignore_errors=True)
    shutil.rmtree(_RUN_TMP, ignore_errors=True)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    """One line counting the interop tests (against the real Aeron), so a run shows how many of
    them passed and that none skipped. Told by the reports' own keywords (a marker is one): in a
    parallel run the items are collected in the workers, never in the process that reports."""
    outcomes: dict[str, str] = {}
    for status in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(status, []):
            if "interop" in getattr(report, "keywords", {}):
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
