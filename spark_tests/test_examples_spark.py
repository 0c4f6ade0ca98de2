"""The Spark examples print what the README says they print, run at their defaults as README runs
them (the market ticks pair needs a server: only its endpoint and checkpoint are given).

They run one after the other in one Python process (``spark_tests._examples``), each as its
command line runs it: each builds its own SparkSession (its own master and settings: a Spark
application of its own) and stops it at its end, in the JVM the first one started. The suite so
starts one driver process for all of them instead of one per example; each test below checks
what its example printed, as when it ran alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 900  # all of them on a loaded 2-core machine (each had 300 s on its own)
pytestmark = [pytest.mark.spark, pytest.mark.timeout(RUN_TIMEOUT_S + 60)]


def _run_all(commands: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Each example's ``{"rc", "stdout", "stderr"}`` (``stderr`` with the JVM's lines printed
    while it ran), by name."""
    done = subprocess.run(
        [sys.executable, "-m", "spark_tests._examples", json.dumps(list(commands.values()))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(records) == len(commands), (done.stdout[-3000:], done.stderr[-3000:])
    # the runner's stderr: its marker line before each example, then what the JVM printed
    jvm = done.stderr.split("\n== example ")[1:]
    for n, record in enumerate(records):
        record["stderr"] += "\n[JVM and process output]\n" + (jvm[n] if n < len(jvm) else "")
    return dict(zip(commands, records, strict=True))


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    from aeron_spark.connector.server import ServerConfig, StreamServer
    from aeron_spark.connector.server.testing import client_for

    tmp = tmp_path_factory.mktemp("examples")
    config = ServerConfig(directory=str(tmp / "server"), port=0, term_length=1024 * 1024, mtu=8192)
    with StreamServer(config) as server:
        with client_for(server.endpoint, encryption=True) as client:
            client.publish(10, [str(i).encode() for i in range(1, 1001)])  # seq 1 1000 | publish
            client.publish(20, [str(i).encode() for i in range(1, 1001)])  # the tour's copy
        return _run_all(
            {
                "market_ticks_producer": [
                    "examples/market_ticks_producer.py",
                    "--endpoint",
                    server.endpoint,
                    "--backfill-minutes",
                    "5",
                ],
                "market_ticks_job": [
                    "examples/market_ticks_job.py",
                    "--endpoint",
                    server.endpoint,
                    "--checkpoint",
                    str(tmp / "ck"),
                    "--available-now",
                ],
                # the others at their defaults, as README runs them
                "plain_aeron_ingest": ["examples/plain_aeron_ingest.py"],
                "exactly_once_roundtrip": ["examples/exactly_once_roundtrip.py"],
                "secure_remote": ["examples/secure_remote.py"],
            }
        )


def _printed(ran: dict[str, dict[str, Any]], name: str) -> dict:
    record = ran[name]
    assert record["rc"] == 0, record["stderr"][-3000:]
    return json.loads(record["stdout"].strip().splitlines()[-1])


def test_plain_aeron_ingest_example(ran) -> None:  # type: ignore[no-untyped-def]
    result = _printed(ran, "plain_aeron_ingest")
    assert result["published"] == result["read"] == 5000
    assert result["in_order"] is True and result["recordings"] == 1
    assert result["source"].startswith("ingest:")


def test_exactly_once_roundtrip_example(ran) -> None:  # type: ignore[no-untyped-def]
    result = _printed(ran, "exactly_once_roundtrip")
    assert result["expected"] == result["written"] == result["distinct"] == 10_000
    assert result["batches"] == 4 and result["rerun_batch"] == 3
    assert result["rerun_input_rows"] == 2000 and result["exactly_once"] is True


def test_market_ticks_job_example_counts_what_it_wrote_on_its_own_streams(ran) -> None:  # type: ignore[no-untyped-def]
    """README's commands (issue 33, item 6): the producer and the job at their defaults but for
    the server and the checkpoint, next to what the tour left on streams 10 and 20 (1,000
    non-JSON lines, copied): the job reads and writes streams of its own and counts the rows it
    wrote (it printed 1000 "output_rows" after writing none: the tour's rows on stream 20)."""
    produced = _printed(ran, "market_ticks_producer")
    assert produced["published"] == 20_000
    result = _printed(ran, "market_ticks_job")
    assert result["input_rows"] == 20_000  # the ticks, not the tour's lines
    # 5 minutes of ticks in batches of 5,000: the closed minutes' rows, 5 symbols each
    assert result["written_rows"] >= 5 and result["output_rows"] == result["written_rows"]


def test_secure_remote_example_pins_the_key_and_refuses_a_wrong_one(ran) -> None:  # type: ignore[no-untyped-def]
    """examples/secure_remote.py: a server with its own key store, Spark pinning its key."""
    assert _printed(ran, "secure_remote") == {
        "written": 1000,
        "read": 1000,
        "sealed": True,
        "wrong_key_refused": True,
    }
