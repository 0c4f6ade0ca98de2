"""``python -m benchmarks.real_subscriber`` on a tiny N (issue 34 item 2): our publication and the
real Aeron's (Java, from Maven Central) each send the same messages of random sizes to the real
subscriber in one run; every message arrives, in order, and the JSON has both goodputs, their
ratio and the load average."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import aeron_peer  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.interop
@pytest.mark.slow
def test_real_subscriber_benchmark_runs_ours_and_the_real_publisher_side_by_side() -> None:
    aeron_peer.require_java("the real Aeron for benchmarks.real_subscriber")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_subscriber", "--messages", "300"]
        + ["--max-size", "3000", "--repeats", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["messages"] == 300
    assert result["ours_mb_per_s"] > 0 and result["java_mb_per_s"] > 0
    assert result["ours_to_java"] > 0
    # the same sizes from both publishers (Python's and Java's xorshift agree), every byte arrived
    assert (
        result["ours_bytes_received"] == result["java_bytes_received"] == [result["message_bytes"]]
    )
    assert len(result["load_average_at_start"]) == 3 and len(result["load_average_at_end"]) == 3
