"""Side-by-side timing: every contender runs once per round, rounds repeated, best time kept.

Interleaving keeps a slow spell of the shared machine from landing on one contender only (as it
would if each were timed in its own block, one after the other)."""

from __future__ import annotations

import time
from collections.abc import Callable


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
