"""Side-by-side timing: every contender runs once per round, rounds repeated, best time kept.

Interleaving keeps a slow spell of the shared machine from landing on one contender only (as it
would if each were timed in its own block, one after the other)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any


def interleaved_best(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Seconds of the fastest run of each contender, after one warm-up run of each."""
    for run in runs.values():
        run()  # warm-up: Python workers, imports, JIT
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def ceiling_ratios(result: Mapping[str, Any]) -> dict[str, Any]:
    """What the source and sink benchmarks report beside their rows per second: the binary and
    arrow contenders' against the ceiling's, and sbe's (103-byte messages) against arrow's."""
    ceiling = result["ceiling_rows_per_s"]
    return {
        "binary_to_ceiling_ratio": round(result["binary_rows_per_s"] / ceiling, 3),
        "arrow_to_ceiling_ratio": round(result["arrow_rows_per_s"] / ceiling, 3),
        "sbe_message_length": 103,
        "sbe_to_arrow_ratio": round(result["sbe_rows_per_s"] / result["sbe_arrow_rows_per_s"], 3),
    }
