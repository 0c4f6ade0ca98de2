"""The transport example prints what the README says it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_producer_consumer_example_delivers_everything_in_order_at_its_defaults() -> None:
    # at its default 10,000 messages of 3,000 bytes the publication outruns the receiver's
    # window: the example must consume while back-pressured (it used to wait for itself)
    done = subprocess.run(
        [sys.executable, "examples/producer_consumer.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "sent": 10_000,
        "received": 10_000,
        "in_order": True,
    }
