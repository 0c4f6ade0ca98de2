"""``stats`` lists every consumer with its positions, rebuilt from the registry on every call:
up to ``--max-consumer-positions`` (1,000,000) of them, ~0.57 s of CPU (10,000 consumers x 100
positions; msgpack's encoding 0.14 s more) on the server's loop for every ``stats`` request a
client sends (a read permission) and for the ``stat.json`` snapshot every second. A consumer's
entry is now made again only when the consumer changed (a commit, a drop of gone recordings
replaces its object; nothing changes one in place), so a call costs its consumers, not their
positions. Counted deterministically: the position maps built (3.11's dict comprehensions are
calls of their own), on a real registry over a real directory."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from aeron_spark.connector.server import retention
from aeron_spark.connector.server.retention import ConsumerRegistry

CONSUMERS = 200


def _maps_built(registry: ConsumerRegistry, now_s: float) -> tuple[int, list[dict[str, Any]]]:
    """``registry.describe(now_s)`` and how many position maps it built."""
    built = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal built
        code = frame.f_code
        ours = code.co_filename == retention.__file__
        if event == "call" and code.co_name == "<dictcomp>" and ours:
            built += 1

    sys.setprofile(profile)
    try:
        rows = registry.describe(now_s)
    finally:
        sys.setprofile(None)
    return built, rows


def _expected(registry: ConsumerRegistry, now_s: float) -> list[dict[str, Any]]:
    return [
        {
            "consumer_id": c.consumer_id,
            "stream_ids": list(c.stream_ids),
            "positions": {str(k): v for k, v in sorted(c.positions.items())},
            "age_s": round(now_s - c.updated_s, 1),
        }
        for c in sorted(registry.consumers.values(), key=lambda c: c.consumer_id)
    ]


def test_describing_unchanged_consumers_rebuilds_no_positions(tmp_path: Path) -> None:
    registry = ConsumerRegistry(str(tmp_path))
    now = time.time()
    for n in range(CONSUMERS):  # committed as a client does (the file written each time)
        registry.commit(f"c{n:03d}", [7], {r: 1000 + r for r in range(50)}, now_s=now - n)
    first, rows = _maps_built(registry, now)
    assert first == CONSUMERS
    assert rows == _expected(registry, now)
    # nothing changed: no position map made again (main: all 200 again); the ages move on
    again, rows = _maps_built(registry, now + 5)
    assert again == 0, again
    assert rows == _expected(registry, now + 5)
    # a commit and a forget through the registry (the file written, fsynced): one made again
    registry.commit("c005", [7], {"60": 2000}, now_s=now + 6)
    assert registry.forget("c006")
    after, rows = _maps_built(registry, now + 7)
    assert after == 1, after
    assert rows == _expected(registry, now + 7)
    assert [r for r in rows if r["consumer_id"] == "c005"][0]["positions"]["60"] == 2000
    # a recording gone: every consumer that held a position of it changes
    assert registry.drop_recordings(lambda rid: rid == 3) == CONSUMERS - 1
    dropped, rows = _maps_built(registry, now + 8)
    assert dropped == CONSUMERS - 1, dropped
    assert rows == _expected(registry, now + 8)
    assert all("3" not in r["positions"] for r in rows)
