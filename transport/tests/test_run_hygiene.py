"""The test run's own hygiene (the root ``conftest.py``), checked on real pytest processes.

* An interrupted run (Ctrl-C twice, a CI job killed, SIGKILL) never reached its
  ``pytest_unconfigure``, so its ``aeron-spark-test-run-*`` directory stayed in the temporary
  directory for good. A run now removes, as it starts, those whose pytest process is gone (each
  names its process: pid and start time, so a pid reused since is not taken for the run), and
  never a live run's nor one that names no owner.
* A parallel run (``-n 3 --dist loadgroup``) runs each test file whole on one worker and every
  test of spark_tests/ on one worker (one SparkSession a run): xdist's own loadgroup, under
  pytest 9.2, handed out every test on its own (pytest-xdist#1386), and Spark tests ran on two
  workers at once; the root conftest's scheduler does it now. The other workers run their tests
  at a lower priority (nice), so that the Python workers Spark starts connect back within its
  fixed 10 s.
* A run on a machine whose /dev/shm cannot take the log buffers (a container's 64 MiB, a
  read-only mount) failed test by test far from the cause; it now stops at once saying why.
  The /dev/shm of the child run is a tmpfs of a mount namespace of its own (``unshare -m``, root):
  the machine's /dev/shm is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "aeron-spark-test-run-"
# a run of one tiny test of this directory: the root conftest's session start and end
TARGET = "transport/tests/test_run_hygiene.py::test_a_trivial_test_for_the_child_runs"
NICE_OUTSIDE_SPARK = 10  # the root conftest's: a parallel run's workers outside the Spark group


def test_a_trivial_test_for_the_child_runs() -> None:
    assert ROOT.joinpath("conftest.py").is_file()


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def _child_run(
    tmp: Path,
    prefix: list[str] | None = None,
    args: tuple[str, ...] = ("-n", "0", TARGET),
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """A pytest run of ``args`` (by default TARGET in one process) in ``tmp``."""
    env = dict(os.environ, TMPDIR=str(tmp), PYTEST_DEBUG_TEMPROOT=str(tmp), **(extra_env or {}))
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(
        [*(prefix or []), *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def live() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait(timeout=30)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_run_removes_the_directories_of_interrupted_runs_and_no_live_ones(
    tmp_path: Path, live: subprocess.Popen[bytes]
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    runs = {
        "dead": f"{gone.pid} {_start_time(os.getpid())}",  # its process exited
        "reused": f"{os.getpid()} 1",  # its pid now another process's (another start time)
        "live": f"{live.pid} {_start_time(live.pid)}",  # a run still going on
        "unowned": None,  # names no owner: left alone
    }
    for name, owner in runs.items():
        path = tmp_path / f"{PREFIX}{name}"
        path.mkdir()
        (path / "aeron-spark-left-behind").mkdir()
        if owner is not None:
            (path / "pytest-owner").write_text(owner + "\n")
    done = _child_run(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(PREFIX))
    assert left == [f"{PREFIX}live", f"{PREFIX}unowned"], (left, done.stdout[-2000:])
    assert "removed 2 temporary directories of interrupted runs" in done.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a /dev/shm of its own needs root and unshare (a mount namespace)",
)
@pytest.mark.parametrize(
    ("mount", "says"),
    [
        ("size=1m", "/dev/shm has 1.0 MiB free, the tests need at least 256 MiB"),
        ("ro", "/dev/shm is not writable"),
    ],
)
def test_a_run_stops_at_once_when_dev_shm_is_not_usable(
    tmp_path: Path, mount: str, says: str
) -> None:
    mounted = f'mount -t tmpfs -o {mount} aeron-spark-test-shm /dev/shm && exec "$@"'
    done = _child_run(
        tmp_path, ["unshare", "-m", "--propagation", "private", "sh", "-c", mounted, "sh"]
    )
    out = done.stdout + done.stderr
    assert done.returncode == 4, out[-3000:]
    assert "/dev/shm is not usable for the tests" in out and says in out, out[-3000:]
    assert "1 passed" not in out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]  # its own went too


@pytest.mark.parametrize("spark_workers", [1, 2])
def test_a_parallel_run_keeps_each_file_and_all_of_spark_tests_on_one_worker(
    tmp_path: Path, spark_workers: int
) -> None:
    """Every file on one worker, spark_tests/ on one (``--spark-workers 2``: the files starting
    Spark drivers of their own on a second), and the Spark groups' tests at the run's own
    priority, the others' lower."""
    # tests of four files of spark_tests/ and one other file, none starting Spark: seconds each
    spark = [
        "spark_tests/test_errors_helper.py",
        "spark_tests/test_cluster.py::test_compose_file_has_no_obsolete_version_key",
        "spark_tests/test_readme_tour.py::test_tour_says_which_python_spark_needs",
        "spark_tests/test_sink_option_errors.py::test_readme_says_when_streaming_sink_options_are_checked",
    ]
    own_drivers = "spark_tests/test_cluster.py"  # in the root conftest's SPARK_OWN_DRIVERS
    other = "handshake/tests/test_messages_codec.py"
    # each worker notes the nice level each test ran at (a plugin of the child run's own)
    probe = tmp_path / "nice_probe"
    probe.mkdir()
    (probe / "nice_probe.py").write_text(NICE_PROBE)
    done = _child_run(
        tmp_path,
        args=(
            *("-n", str(1 + spark_workers), "--dist", "loadgroup", "-v", "-p", "nice_probe"),
            *("--spark-workers", str(spark_workers), *spark, other),
        ),
        extra_env={
            "PYTHONPATH": os.pathsep.join([str(probe), *filter(None, [os.getenv("PYTHONPATH")])]),
            "NICE_PROBE_OUT": str(tmp_path / "nice.txt"),
        },
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]

    def unit(nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if spark_workers == 2 and path == own_drivers:
            return "spark-own-drivers"
        return "spark" if path.startswith("spark_tests/") else "other"

    workers: dict[str, set[str]] = {}
    for worker, nodeid in re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", done.stdout, re.M):
        workers.setdefault(unit(nodeid), set()).add(worker)
    spark_units = {"spark", "spark-own-drivers"} if spark_workers == 2 else {"spark"}
    assert set(workers) == {*spark_units, "other"}, out[-3000:]
    assert all(len(on) == 1 for on in workers.values()), workers
    assert len(set().union(*workers.values())) == len(workers), workers  # a worker a unit
    # the Spark groups ran at the run's own priority, the other file's tests lower (nice is
    # inherited: this test's own level is the child run's; the kernel caps it at 19)
    nice: dict[str, set[int]] = {}
    for line in (tmp_path / "nice.txt").read_text().splitlines():
        nodeid, level = line.rsplit(" ", 1)
        nice.setdefault(unit(nodeid), set()).add(int(level))
    base = os.nice(0)
    lower = min(19, base + NICE_OUTSIDE_SPARK)
    assert nice == {**dict.fromkeys(spark_units, {base}), "other": {lower}}, nice


# the child run's plugin: each test's node id and nice level as it ran, a line each
NICE_PROBE = """
import os
from pathlib import Path

def pytest_runtest_call(item):
    with open(Path(os.environ["NICE_PROBE_OUT"]), "a") as out:
        out.write(f"{item.nodeid} {os.nice(0)}\\n")
"""
