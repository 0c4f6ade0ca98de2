"""The Spark examples print what the README says they print (each is its own Spark application),
run at their defaults as README runs them (the market ticks pair needs a server: only its endpoint
and checkpoint are given)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.spark


def _run(*argv: str) -> dict:
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plain_aeron_ingest_example() -> None:
    result = _run("examples/plain_aeron_ingest.py")  # at its defaults, as README runs it
    assert result["published"] == result["read"] == 5000
    assert result["in_order"] is True and result["recordings"] == 1
    assert result["source"].startswith("ingest:")


def test_exactly_once_roundtrip_example() -> None:
    result = _run("examples/exactly_once_roundtrip.py")  # at its defaults, as README runs it
    assert result["expected"] == result["written"] == result["distinct"] == 10_000
    assert result["batches"] == 4 and result["rerun_batch"] == 3
    assert result["rerun_input_rows"] == 2000 and result["exactly_once"] is True


def test_market_ticks_job_example_counts_what_it_wrote_on_its_own_streams(server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """README's commands (issue 33, item 6): the producer and the job at their defaults but for
    the server and the checkpoint, next to what the tour left on streams 10 and 20 (1,000
    non-JSON lines, copied): the job reads and writes streams of its own and counts the rows it
    wrote (it printed 1000 "output_rows" after writing none: the tour's rows on stream 20)."""
    from aeron_spark.connector.server.testing import client_for

    with client_for(server.endpoint, encryption=True) as client:
        client.publish(10, [str(i).encode() for i in range(1, 1001)])  # seq 1 1000 | publish
        client.publish(20, [str(i).encode() for i in range(1, 1001)])  # the tour's copy
    produced = _run(
        "examples/market_ticks_producer.py",
        "--endpoint",
        server.endpoint,
        "--backfill-minutes",
        "5",
    )
    assert produced["published"] == 20_000
    result = _run(
        "examples/market_ticks_job.py",
        "--endpoint",
        server.endpoint,
        "--checkpoint",
        str(tmp_path / "ck"),
        "--available-now",
    )
    assert result["input_rows"] == 20_000  # the ticks, not the tour's lines
    # 5 minutes of ticks in batches of 5,000: the closed minutes' rows, 5 symbols each
    assert result["written_rows"] >= 5 and result["output_rows"] == result["written_rows"]
