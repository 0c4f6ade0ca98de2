"""The on-disk position/time index (issue 31 item 6): the same answers as a list model, memory
independent of the number of entries, damage handled at load."""

from __future__ import annotations

import bisect
import os
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.transport.archive import timeindex
from aeron_spark.transport.archive.fdcache import FdCache
from aeron_spark.transport.archive.timeindex import ENTRY, TimeIndex


class Model:
    """The index as it was: two sorted lists."""

    def __init__(self) -> None:
        self.pos: list[int] = []
        self.ts: list[int] = []

    def floor(self, p: int):
        i = bisect.bisect_right(self.pos, p) - 1
        return None if i < 0 else (i, self.pos[i], self.ts[i])

    def next_position(self, p: int):
        i = bisect.bisect_right(self.pos, p)
        return self.pos[i] if i < len(self.pos) else None

    def first_at_or_after(self, t: int, min_pos: int):
        i = bisect.bisect_left(self.ts, t)
        while i < len(self.pos) and self.pos[i] < min_pos:
            i += 1
        return self.pos[i] if i < len(self.pos) else None

    def cut(self, p: int) -> None:
        i = bisect.bisect_left(self.pos, p)
        del self.pos[i:], self.ts[i:]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 300), st.integers(0, 3)),
        st.tuples(st.just("cut"), st.integers(0, 40_000), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops, probes=st.lists(st.integers(-10, 45_000), min_size=1, max_size=20))
def test_lookups_match_a_list_model_through_appends_cuts_and_reopens(
    tmp_path_factory, monkeypatch, ops, probes
):
    monkeypatch.setattr(timeindex, "STRIDE", 4)  # many blocks from few entries
    monkeypatch.setattr(timeindex, "CACHED_BLOCKS", 2)
    path = str(tmp_path_factory.mktemp("ix") / "index")
    files = FdCache(4)
    index, model = TimeIndex(path, files.use), Model()
    for op, a, b in ops:
        if op == "append":
            for _ in range(a // 10 + 1):
                p = (model.pos[-1] if model.pos else 0) + 32 * (1 + a % 7)
                t = (model.ts[-1] if model.ts else 0) + b
                index.append(p, t)
                model.pos.append(p)
                model.ts.append(t)
        elif op == "cut":
            index.cut(a)
            model.cut(a)
        else:
            files.close()
            index = TimeIndex(path, files.use)
        assert len(index) == len(model.pos)
        assert index.last == (None if not model.pos else (model.pos[-1], model.ts[-1]))
    for p in probes:
        assert index.floor(p) == model.floor(p)
        assert index.next_position(p) == model.next_position(p)
        assert index.first_at_or_after(p // 10, p // 2) == model.first_at_or_after(p // 10, p // 2)
    assert list(index.positions_from_end()) == model.pos[::-1]
    assert (os.path.getsize(path) if os.path.exists(path) else 0) == 16 * len(model.pos)
    files.close()


def test_a_read_only_view_stops_at_its_limit(tmp_path):
    path = str(tmp_path / "index")
    files = FdCache(4)
    writer = TimeIndex(path, files.use)
    for i in range(2000):
        writer.append(64 * (i + 1), 10 * i)
    view = TimeIndex(path, files.use, limit_position=64 * 1500)
    assert len(view) == 1499 and view.last == (64 * 1499, 10 * 1498)
    assert view.next_position(64 * 1499) is None
    assert view.first_at_or_after(10**9, 0) is None
    files.close()


def test_ten_million_entries_cost_well_under_ten_megabytes(tmp_path):
    # The index is read from its file; memory holds one entry in 512 and a few blocks. The
    # issue's target: <= 10 MB per 10 million entries (the lists held ~93 bytes an entry).
    n = 10_000_000
    arr = np.empty((n, 2), dtype="<i8")
    arr[:, 0] = np.arange(1, n + 1, dtype=np.int64) * 64
    arr[:, 1] = np.arange(n, dtype=np.int64) // 3
    path = str(tmp_path / "index")
    arr.tofile(path)
    del arr
    files = FdCache(4)
    tracemalloc.start()
    try:
        index = TimeIndex(path, files.use)
        rng = np.random.default_rng(7)
        for p in rng.integers(0, 64 * n, 2000):
            found = index.floor(int(p))
            assert found is None or found[1] == int(p) // 64 * 64
        for t in rng.integers(0, n // 3, 500):
            assert index.first_at_or_after(int(t), 0) == (3 * int(t) + 1) * 64
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        files.close()
    assert len(index) == n
    assert peak < 2 * 1024 * 1024, f"the index of {n} entries took {peak} bytes"


def test_a_torn_or_disordered_tail_ends_the_index_there(tmp_path):
    path = str(tmp_path / "index")
    files = FdCache(4)
    index = TimeIndex(path, files.use)
    for i in range(1, 1100):
        index.append(32 * i, i)
    files.close()
    with open(path, "ab") as fh:  # an entry going backwards, then half an entry
        fh.write(ENTRY.pack(32, 5) + b"\x01" * 7)
    again = TimeIndex(path, files.use)
    assert len(again) == 1099 and again.last == (32 * 1099, 1099)
    files.close()


@pytest.mark.parametrize("damage_at", [3, 700])
def test_disorder_in_the_middle_keeps_what_is_before_it(tmp_path, damage_at):
    path = str(tmp_path / "index")
    arr = np.empty((1500, 2), dtype="<i8")
    arr[:, 0] = np.arange(1, 1501) * 32
    arr[:, 1] = np.arange(1500)
    arr[damage_at + 1 :, 0] -= 10_000_000  # the sparse level sees positions go back
    arr.tofile(path)
    files = FdCache(4)
    index = TimeIndex(path, files.use)
    assert len(index) == damage_at + 1
    files.close()
