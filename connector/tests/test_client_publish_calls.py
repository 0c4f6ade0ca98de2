"""What a client's publish of one small message costs its calling thread, in Python calls (issue
31: the benchmark's client process spends ~380 us of CPU a publish at 2,048 sessions, its
publishing threads' share ~90 Python calls each): counted with ``sys.setprofile`` on the calling
thread, against a real server in its own process."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import server_process

_PUBLISHES = 20


def _calls_per_publish(client: StreamClient, payloads: Any) -> tuple[float, list[int]]:
    calls = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    positions = []
    sys.setprofile(profile)
    try:
        for _ in range(_PUBLISHES):
            positions.append(client.publish(3, payloads))
    finally:
        sys.setprofile(None)
    return calls[0] / _PUBLISHES, positions


def test_a_small_publish_costs_its_thread_few_python_calls(tmp_path: Path) -> None:
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        settings = ClientSettings(endpoint=endpoint, timeout_s=30)
        with StreamClient.connect(settings) as client:
            client.publish(3, [b"first"])  # the session's first publish (its recording made)
            per_publish, positions = _calls_per_publish(client, [b"p" * 100])
            # every publish recorded, one after the other (~160 bytes a framed message)
            assert positions == sorted(set(positions)), positions
            # main made ~92 (its batching generator, length checks, request parts, an empty
            # poll and an is_connected walk before each wait, readiness asked three times);
            # ~62 now, a spurious wake-up now and then allowed for
            assert per_publish <= 72, per_publish
            # the general path (reserved values, a tuple, several payloads) still publishes
            end = client.publish(3, (b"a", b"b"), reserved_values=[1, 2])
            assert end > positions[-1]
