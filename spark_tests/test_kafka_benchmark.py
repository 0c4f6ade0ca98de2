"""Smoke test of ``python -m benchmarks.kafka`` on a tiny N: the harness starts a real KRaft Kafka
broker (Maven resolves it) and an aeron server, runs every contender, and its JSON holds every key
the README's "Compared with Kafka" table is built from. Out of the default run (marker ``kafka``:
it downloads the broker and the connector); run it with ``pytest -m kafka``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = (
    "aeron_to_kafka_source_ratio",
    "aeron_to_kafka_sink_ratio",
    "aeron_to_kafka_latency_p50_ratio",
    "aeron_to_kafka_cpu_ratio",
    "aeron_remote_to_kafka_source_ratio",
    "aeron_duplicates",
    "kafka_duplicates",
    "kafka_version",
    "kafka_connector",
    "pyspark_version",
)


def test_kafka_benchmark_tiny_run_prints_every_figure() -> None:
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH: the broker comes from Maven Central")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.kafka",
            "--rows",
            "4000",
            "--repeats",
            "1",
            "--per-trigger",
            "2000",
            "--latency-messages",
            "5",
            "--exactly-once-rows",
            "2000",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1400,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [k for k in REQUIRED if result.get(k) is None] == []
    # every throughput run read or wrote all rows (the harness checks each query's row count)
    assert result["rows"] == 4000
    for key, value in result.items():
        if key.endswith("_rows_per_s") or key.endswith("_cpu_s_per_million_rows"):
            assert value > 0, key
    assert result["latency_kafka_samples"] == 5
    assert result["latency_aeron_driver_samples"] == 5
    assert result["latency_aeron_executors_samples"] == 5
    # the copy under a forced task failure: aeron -> aeron exactly once, Kafka loses nothing
    assert (result["aeron_rows"], result["aeron_duplicates"], result["aeron_missing"]) == (
        2000,
        0,
        0,
    )
    assert result["kafka_missing"] == 0 and result["kafka_unexpected"] == 0


def test_kafka_benchmark_real_time_contender_measured_beside_read_on_driver() -> None:
    """``--real-time`` (issue 34): Kafka -> Kafka in Spark's Real-Time Mode, stamped in the JVM,
    in the same run as aeron ``readOn=driver``; throughput (``--rows 0``) and the exactly-once
    copy skipped. Either RTM ran (every stamped message came back) or Spark's refusal is in the
    JSON."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH: the broker comes from Maven Central")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.kafka", "--rows", "0", "--exactly-once-rows", "0"]
        + ["--latency-messages", "3", "--real-time"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1400,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "rows" not in result and "aeron_to_kafka_source_ratio" not in result
    assert result["real_time_batch"] == "5 seconds"  # the default BATCH
    if "real_time_error" in result:  # a Spark before 4.1
        assert not result["pyspark_version"].startswith(("4.1", "4.2", "4.3")), result[
            "real_time_error"
        ]
    else:
        assert result["latency_kafka_real_time_samples"] == 3
        assert result["latency_kafka_real_time_p50_ms"] >= 0
    # readOn=driver ran in the same session; on a saturated machine its micro-batches may not
    # reach the stamped rows within the harness's wait (then no sample and no ratio)
    assert "latency_aeron_driver_samples" in result
    if result["latency_aeron_driver_samples"] and "real_time_error" not in result:
        assert result["aeron_driver_to_kafka_real_time_p50_ratio"] > 0
    assert result["load_average_before"] and result["load_average_after"]
    assert result["real_time_aeron_source"] and not result["real_time_aeron_source"].startswith(
        "none"
    )
