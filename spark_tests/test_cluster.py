"""The demo cluster's topology without Docker: a standalone master and two workers from the
installed PySpark on 127.0.0.1, the stream server, the producer, and the job of
docker-compose.yml, run against spark://127.0.0.1:PORT."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_tests._cluster import StandaloneCluster

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def run(args: list[str], timeout_s: float) -> dict:
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_job_on_a_standalone_cluster_with_two_workers(tmp_path: Path) -> None:
    from aeron_spark.connector.server import ServerConfig, StreamServer

    with (
        StreamServer(ServerConfig(directory=str(tmp_path / "server"), port=0)) as server,
        StandaloneCluster(tmp_path / "cluster", workers=2) as cluster,
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
            str(tmp_path / "ckpt"),
            "--available-now",
        ]
        first = run(job, 600)
        assert first["input_rows"] == 5000
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


def test_compose_file_is_valid() -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose (Debian package) is not installed")
    done = subprocess.run(
        [tool, "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
