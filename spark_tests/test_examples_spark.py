"""The Spark examples print what the README says they print (each is its own Spark application)."""

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
    result = _run("examples/plain_aeron_ingest.py", "--messages", "2000")
    assert result["published"] == result["read"] == 2000
    assert result["in_order"] is True and result["recordings"] == 1
    assert result["source"].startswith("ingest:")


def test_exactly_once_roundtrip_example() -> None:
    result = _run("examples/exactly_once_roundtrip.py", "--orders", "8000", "--per-batch", "3000")
    assert result["expected"] == result["written"] == result["distinct"] == 4000
    assert result["batches"] == 3 and result["rerun_batch"] == 2
    assert result["rerun_input_rows"] == 2000 and result["exactly_once"] is True
