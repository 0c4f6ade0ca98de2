"""The transport example prints what the README says it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_producer_consumer_example_delivers_everything_in_order() -> None:
    done = subprocess.run(
        [sys.executable, "examples/producer_consumer.py", "--messages", "2000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "sent": 2000,
        "received": 2000,
        "in_order": True,
    }
