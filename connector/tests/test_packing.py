"""Many small recording ranges in few input partitions (issue 31 item 2: one task a recording
read 1,000,000 messages over 256 recordings at 72 k rows/s, against 1.32 M over 8), and the one
budget walk the source and the stream server share (it was written twice)."""

from __future__ import annotations

import pickle
import random

import pytest

from aeron_spark.connector.client import ClientSettings
from aeron_spark.connector.options import DEFAULT_PARTITION_BYTES, parse_source_options
from aeron_spark.connector.session.budget import share_budget
from aeron_spark.connector.source import (
    PackedRanges,
    pack_bounds,
    pack_ranges,
    ranges_of,
)
from aeron_spark.connector.stores.server import ServerRange, ServerStore
from aeron_spark.errors import ConfigurationError


def _covers_once_in_order(bounds: list[tuple[int, int]], n: int) -> None:
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a < b for a, b in bounds)
    assert all(x[1] == y[0] for x, y in zip(bounds, bounds[1:], strict=False))


def test_many_small_ranges_pack_into_as_few_partitions_as_the_bytes_ask() -> None:
    sizes = [625_000] * 256  # 1,000,000 messages of 160 bytes over 256 recordings
    for cap, groups in ((33_000_000, 5), (32_000_000, 6), (10**9, 1)):
        bounds = pack_bounds(sizes, cap)
        _covers_once_in_order(bounds, 256)
        assert len(bounds) == groups, cap
        assert all(sum(sizes[a:b]) <= cap for a, b in bounds)
        held = [b - a for a, b in bounds]
        assert max(held) - min(held) <= groups  # even: no small tail (51 * 5 + 1 at 32 MB)
    assert pack_bounds(sizes, DEFAULT_PARTITION_BYTES) == pack_bounds(
        sizes, DEFAULT_PARTITION_BYTES
    )  # deterministic: the same ranges, the same partitions (a re-run task, the same rows)


def test_ranges_larger_than_half_the_target_stay_alone_and_one_byte_means_one_range_each() -> None:
    sizes = [20_000_000] * 8
    assert pack_bounds(sizes, 32 * 1024 * 1024) == [(i, i + 1) for i in range(8)]
    assert pack_bounds(sizes, 10) == [(i, i + 1) for i in range(8)]  # larger than the target
    mixed = [64, 96, 32, 4096, 64]
    assert pack_bounds(mixed, 1) == [(i, i + 1) for i in range(5)]
    assert pack_bounds([], 100) == []
    assert pack_bounds([5], 1, 10) == [(0, 1)]


def test_min_partitions_is_honoured_when_packing() -> None:
    sizes = [100] * 50
    assert len(pack_bounds(sizes, 1 << 30)) == 1
    for minimum in (2, 7, 50, 80):
        bounds = pack_bounds(sizes, 1 << 30, minimum)
        _covers_once_in_order(bounds, 50)
        assert len(bounds) == min(50, minimum)
    # one large range takes the middle of several shares: the small ones still make the count
    bounds = pack_bounds([90, 5, 5], 1000, 3)
    assert bounds == [(0, 1), (1, 2), (2, 3)]
    bounds = pack_bounds([5, 5, 90, 5, 5], 1000, 4)
    _covers_once_in_order(bounds, 5)
    assert len(bounds) == 4


def test_packing_holds_its_bounds_over_random_sizes() -> None:
    rng = random.Random(31)
    for _ in range(300):
        n = rng.randint(1, 120)
        sizes = [
            rng.choice([32, 64, rng.randint(32, 10_000), rng.randint(1, 10**7)]) for _ in range(n)
        ]
        target = rng.choice([1, 100, 10_000, 10**6, 10**9])
        minimum = rng.choice([None, 1, 3, 16, 200])
        bounds = pack_bounds(sizes, target, minimum)
        _covers_once_in_order(bounds, n)
        assert len(bounds) >= min(n, minimum or 1)
        for a, b in bounds:
            assert b - a == 1 or sum(sizes[a:b]) <= target  # only a lone range is larger
        assert bounds == pack_bounds(list(sizes), target, minimum)


def _range(store: ServerStore, rid: int, start: int, end: int) -> ServerRange:
    return ServerRange(store, str(rid), rid, start, end, 0, 64 * 1024, False)


def test_pack_ranges_keeps_a_lone_range_bare_and_packs_pickle_with_one_store() -> None:
    store = ServerStore(ClientSettings(endpoint="127.0.0.1:40123"))
    parts = [_range(store, rid, 0, 640) for rid in range(1, 7)] + [_range(store, 9, 0, 10**6)]
    packed = pack_ranges(parts, 4096)
    assert [type(p) for p in packed] == [PackedRanges, ServerRange]
    assert ranges_of(packed[0]) == tuple(parts[:6]) and ranges_of(packed[1]) == (parts[6],)
    again = pickle.loads(pickle.dumps(packed[0]))
    assert again == packed[0]
    assert len({id(r.store) for r in again.ranges}) == 1  # the store pickled once
    assert ranges_of(pack_ranges(parts, 1)[0]) == (parts[0],)
    assert pack_ranges([], 4096) == []


def test_max_partition_bytes_option() -> None:
    base = {"endpoint": "127.0.0.1:40123", "streamId": "1"}
    assert parse_source_options(base).max_partition_bytes == DEFAULT_PARTITION_BYTES
    assert parse_source_options({**base, "maxPartitionBytes": "1"}).max_partition_bytes == 1
    with pytest.raises(ConfigurationError) as info:
        parse_source_options({**base, "maxPartitionBytes": "0"})
    assert info.value.name == "maxPartitionBytes"


def _scanner(messages: list[list[int]]):  # type: ignore[no-untyped-def]
    """A scan over recordings of whole messages of the given sizes (positions from 0)."""
    calls: list[tuple[int, int, int, int | None, int | None]] = []

    def scan(i: int, start: int, target: int, max_messages, max_bytes):  # type: ignore[no-untyped-def]
        calls.append((i, start, target, max_messages, max_bytes))
        end, count, at = start, 0, 0
        for size in messages[i]:
            at += size
            if at <= start:
                continue
            if at > target:
                break
            if count and max_bytes is not None and at - start > max_bytes:
                break
            end, count = at, count + 1
            if max_messages is not None and count >= max_messages:
                break
        return end, count

    return scan, calls


def test_one_budget_is_shared_evenly_then_the_rest_goes_to_those_with_more() -> None:
    messages = [[100] * 10, [100] * 2, [100] * 30]
    scan, calls = _scanner(messages)
    ranges = [(0, 1000), (0, 200), (0, 3000)]
    got = share_budget(ranges, 12, None, scan)
    # 4 each first; the second has 2, so the 2 left go to the next in order with more
    assert got == [(600, 6), (200, 2), (400, 4)]
    assert [c[0] for c in calls] == [0, 1, 2, 0]
    scan, _ = _scanner(messages)
    assert share_budget(ranges, None, None, scan) == [(1000, 10), (200, 2), (3000, 30)]
    scan, _ = _scanner(messages)
    assert share_budget([(500, 500), (0, 200)], None, 100, scan) == [(500, 0), (100, 1)]
    assert share_budget([(0, 1000)], None, None, lambda *a: (1000, -1)) == [(1000, -1)]


_NO_PANDAS = r"""
import sys
from aeron_spark.connector.formats import Geometry, batches_from_blocks
from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.transport.protocol.logbuffer import LogGeometry

framer = Framer(LogGeometry(64 * 1024, 1408, 7), 5, 9, 0)
uniform = [b"u%04d" % i for i in range(300)]  # equal lengths: the numpy path
mixed = [b"m" * (1 + i * 37 % 3000) for i in range(40)]  # fragmented too: the general path
blocks = [
    ReplayBlock(p, bytes(b), 1_700_000_000_123_456_789, p + len(b))
    for p, b in framer.frame(uniform + mixed, list(range(340)))
]
batches = list(batches_from_blocks(blocks, 3, Geometry(7, 64 * 1024), False))
print("pandas" in sys.modules)  # before to_pylist below, which imports it
rows = [r for b in batches for r in b.to_pylist()]
assert [r["value"] for r in rows] == uniform + mixed, "values"
assert [r["reserved_value"] for r in rows] == list(range(340))
assert {(r["stream_id"], r["session_id"], r["recording_id"]) for r in rows} == {(9, 5, 3)}
positions = [r["position"] for r in rows]
assert positions[0] == 0 and positions == sorted(positions)
assert {r["timestamp"].isoformat() for r in rows} == {"2023-11-14T22:13:20.123456+00:00"}
assert batches[0].schema.field("timestamp").type.tz == "UTC"
"""


def test_a_read_builds_its_columns_without_importing_pandas() -> None:
    """``pa.array`` imports pandas on its first call (~300 modules and their objects in every
    Spark Python worker, walked by the ``gc.collect()`` after each task: issue 31 item 2); the
    read path builds its columns from buffers, with the same values."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _NO_PANDAS], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False"


_WORKER_IMPORTS = r"""
import pickle, sys
from aeron_spark.connector.options import parse_source_options
from aeron_spark.connector.source import AeronBatchReader
reader = AeronBatchReader(parse_source_options({"endpoint": "127.0.0.1:40123", "streamId": "1"}))
blob = pickle.dumps(reader)
for name in [m for m in sys.modules if m.startswith(("aeron_spark", "pyspark_aeron"))]:
    del sys.modules[name]
import aeron_spark.connector.datasource  # a read task's function holds the data source
pickle.loads(blob)
print(sorted(m for m in sys.modules if m.startswith("aeron_spark")))
"""


def test_a_read_tasks_worker_imports_no_planning_sink_archive_or_codec_module() -> None:
    """What a Spark read task's Python worker imports (the data source, the pickled reader and
    its options) leaves out the sink, the archive stores and client, the SBE and record codecs
    (issue 31 item 2: 576 modules in a worker after a read, 537 without them; every one is walked
    by the gc.collect() after each task)."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _WORKER_IMPORTS], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().replace("'", '"'))
    assert "aeron_spark.connector.source" in loaded
    unwanted = (
        "aeron_spark.connector.sink",
        "aeron_spark.connector.raw",
        "aeron_spark.connector.stores.archive",
        "aeron_spark.connector.stores.replicas",
        "aeron_spark.connector.formats_sbe",
        "aeron_spark.connector.formats_records",
        "aeron_spark.transport.archive.client",
        "aeron_spark.transport.sbe",
    )
    assert [m for m in loaded if m.startswith(unwanted)] == []
