"""examples/secure_remote.py: a server with its own key store, Spark pinning its key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_secure_remote_example_pins_the_key_and_refuses_a_wrong_one() -> None:
    done = subprocess.run(
        [sys.executable, "examples/secure_remote.py"],  # at its defaults, as README runs it
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "written": 1000,
        "read": 1000,
        "sealed": True,
        "wrong_key_refused": True,
    }
