"""The demo cluster's topology without Docker: a standalone master and two workers from the
installed PySpark on 127.0.0.1, the stream server, the producer, and the job of
docker-compose.yml, run against spark://127.0.0.1:PORT.

The topology is read from docker-compose.yml: each named volume is a host directory, the server's
``--dir`` and the job's ``--checkpoint`` are where the file puts them, and each worker has its own
directories and sees only the volumes the file mounts on it (the others are hidden behind a
private tmpfs in its own mount namespace). A checkpoint on a volume the workers do not mount
leaves the aggregation's state, which executors write, out of the job's checkpoint: caught here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_tests import _compose
from spark_tests._cluster import StandaloneCluster, can_hide_directories, hiding
from transport.tests import children

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.spark, pytest.mark.slow]


# The executors' JVMs get the light options conftest gives the driver (SPARK_SUBMIT_OPTS): the
# client compiler only and one GC thread; a job of the test is too short for C2 to pay off
EXECUTOR_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def run(args: list[str], timeout_s: float) -> dict:
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        # read by pyspark when it starts the job's JVM (split as a shell would)
        PYSPARK_SUBMIT_ARGS=shlex.join(
            ["--conf", f"spark.executor.extraJavaOptions={EXECUTOR_JAVA_OPTIONS}", "pyspark-shell"]
        ),
    )
    done = children.run(  # the job dies with the test process, as the cluster does
        [sys.executable, *args], timeout_s, cwd=ROOT, env=env, text=True, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _state_files(checkpoint: Path) -> dict[str, list[str]]:
    """The aggregation's state store files per partition, as the job sees its checkpoint."""
    state = checkpoint / "state" / "0"
    return (
        {
            p.name: sorted(f.name for f in p.iterdir() if f.suffix in (".delta", ".snapshot"))
            for p in sorted(state.iterdir())
            if p.name.isdigit()
        }
        if state.is_dir()
        else {}
    )


@pytest.mark.timeout(1200)  # two job runs of up to 600 s each on a loaded 2-core machine
def test_job_on_a_standalone_cluster_with_two_workers(tmp_path: Path) -> None:
    from aeron_spark.connector.server import ServerConfig, StreamServer

    compose = _compose.load()
    volumes = tmp_path / "volumes"
    server_dir = _compose.host_path(
        compose, "stream-server", _compose.argument(compose, "stream-server", "--dir"), volumes
    )
    checkpoint = _compose.host_path(
        compose, "job", _compose.argument(compose, "job", "--checkpoint"), volumes
    )
    names = _compose.workers(compose)
    assert len(names) == 2, names
    hidden = [[volumes / v for v in _compose.hidden_volumes(compose, w)] for w in names]
    if any(hidden) and (reason := can_hide_directories()) is not None:
        pytest.skip(f"workers must not see {hidden} but {reason}")

    with (
        StreamServer(ServerConfig(directory=str(server_dir), port=0)) as server,
        StandaloneCluster(tmp_path / "cluster", workers=2, hidden=hidden) as cluster,
    ):
        assert cluster.alive_workers() == 2
        produced = run(
            [
                "examples/market_ticks_producer.py",
                "--endpoint",
                server.endpoint,
                "--batches",
                "10",
                "--ticks-per-batch",
                "500",
                "--backfill-minutes",
                "5",
            ],
            120,
        )
        assert produced["published"] == 5000
        job = [
            "examples/market_ticks_job.py",
            "--master",
            cluster.master_url,
            "--endpoint",
            server.endpoint,
            "--checkpoint",
            str(checkpoint),
            "--available-now",
        ]
        first = run(job, 600)
        assert first["input_rows"] == 5000
        # the executors ran with the light options (each executor's stderr starts with its
        # launch command)
        launched = [
            line
            for f in (tmp_path / "cluster").glob("worker*/work/app-*/*/stderr")
            for line in f.read_text(errors="replace").splitlines()
            if "Spark Executor Command" in line
        ]
        assert launched and all(
            f'"{option}"' in line for line in launched for option in EXECUTOR_JAVA_OPTIONS.split()
        ), launched
        # the executors' state store files are in the job's checkpoint, for every shuffle
        # partition (spark.sql.shuffle.partitions=4 in the job): a restarted job or a task
        # moved to the other worker finds them
        state = _state_files(checkpoint)
        assert sorted(state) == ["0", "1", "2", "3"] and all(state.values()), (
            f"the aggregation's state is not in the job's checkpoint {checkpoint}: {state}"
        )
        # Trigger.AvailableNow runs no empty batch to move the watermark, so the closed minutes
        # are written by the next run: more ticks, then the same job again from its checkpoint.
        more = run(
            [
                "examples/market_ticks_producer.py",
                "--endpoint",
                server.endpoint,
                "--batches",
                "1",
                "--ticks-per-batch",
                "500",
                "--seed",
                "2",
            ],
            120,
        )
        assert more["published"] == 500
        second = run(job, 600)
        assert second["input_rows"] == 500  # no tick read twice across the restart
        # Ticks spanned 5 minutes: the watermark (latest event - 10 s) closed the earlier minutes,
        # whose per-symbol aggregates were appended exactly once.
        assert second["output_rows"] >= 5


def test_hidden_directory_is_private_to_a_worker(tmp_path: Path) -> None:
    """What the cluster test relies on: a worker's hidden directory is its own empty tmpfs."""
    if (reason := can_hide_directories()) is not None:
        pytest.skip(reason)
    shared = tmp_path / "volume"
    shared.mkdir()
    (shared / "job-file").write_text("job")
    done = subprocess.run(
        hiding([shared], ["sh", "-c", f"ls -A {shared}; echo worker > {shared}/worker-file"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the worker does not see the job's file...
    assert sorted(p.name for p in shared.iterdir()) == ["job-file"]  # ...nor the job the worker's


def test_compose_checkpoint_volume_is_shared_by_job_and_workers() -> None:
    compose = _compose.load()
    checkpoint = _compose.argument(compose, "job", "--checkpoint")
    mount = _compose.mount_of(compose, "job", checkpoint)
    assert mount is not None, f"the job's checkpoint {checkpoint} is on no named volume"
    for worker in _compose.workers(compose):
        assert mount in _compose.mounts(compose, worker), (
            f"{worker} does not mount {mount.volume} at {mount.target}, where the job keeps its "
            f"checkpoint {checkpoint}: its executors would write the state in their own container"
        )
    assert len(_compose.workers(compose)) == 2


def test_compose_file_has_no_obsolete_version_key() -> None:
    assert "version" not in _compose.load()


def test_docker_build_context_and_image_are_portable() -> None:
    ignored = {
        line.strip().strip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git"} <= ignored and "**/__pycache__" in ignored
    dockerfile = (ROOT / "Dockerfile").read_text()
    # JAVA_HOME is found at build time, on any architecture (not Debian's amd64 directory)
    assert "amd64" not in dockerfile and "JAVA_HOME=" in dockerfile
    assert "COPY . ." in dockerfile


def test_compose_file_is_valid() -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose (Debian package) is not installed")
    done = subprocess.run(
        [tool, "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


ORPHAN_CHILD = """
import sys, threading
from pathlib import Path
from spark_tests._cluster import StandaloneCluster
work, hide = Path(sys.argv[1]), sys.argv[2] == "1"
holder = []
# started from a thread that ends at once: the cluster must outlive it (only its process counts)
t = threading.Thread(target=lambda: holder.append(
    StandaloneCluster(work, workers=1, hidden=[[work / "hidden"]] if hide else []).start()))
t.start(); t.join()
print(" ".join(str(p.pid) for p in holder[0].processes), flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(300)
def test_the_cluster_dies_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """A killed pytest run (a CI timeout's SIGKILL) left its cluster running (53 minutes, once):
    its master and workers are in sessions of their own. A real child process starts a cluster
    (a worker behind a private mount when it can, as the job's test does), and is SIGKILLed."""
    hide = can_hide_directories() is None
    child = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_CHILD, str(tmp_path / "cluster"), "1" if hide else "0"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]  # a worker registered
        assert len(pids) == 2
        for pid in pids:  # the JVMs themselves (setpriv, unshare, sh and spark-class exec'd)
            assert "org.apache.spark.deploy" in Path(f"/proc/{pid}/cmdline").read_text()
        # on main: the master and the worker still ran, orphaned
        assert not children.outliving(child, pids), "the cluster outlived its test process"
    finally:
        children.reap(child, pids)
