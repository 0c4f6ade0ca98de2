"""The sink's split of a task's rows by their ``stream_id`` column (issue 32 item 3)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aeron_spark.connector.sink import route_by_stream_id
from aeron_spark.errors import ConfigurationError


def _batch(values: list[bytes], streams: list[int | None], kind: pa.DataType) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(values, pa.binary()), pa.array(streams, kind)], names=["value", "stream_id"]
    )


@pytest.mark.parametrize("kind", [pa.int32(), pa.int64(), pa.int16()])
def test_rows_are_split_by_stream_in_order_and_the_column_dropped(kind: pa.DataType) -> None:
    batches = [
        _batch([b"a", b"b", b"c", b"d"], [31, 32, 31, -5], kind),
        _batch([], [], kind),
        _batch([b"e", b"f"], [32, 32], kind),  # one stream: no filter
    ]
    groups = route_by_stream_id(iter(batches))
    assert sorted(groups) == [-5, 31, 32]
    got = {s: [v for b in bs for v in b.column("value").to_pylist()] for s, bs in groups.items()}
    assert got == {31: [b"a", b"c"], 32: [b"b", b"e", b"f"], -5: [b"d"]}
    assert all(b.schema.names == ["value"] for bs in groups.values() for b in bs)


def test_a_null_or_out_of_range_stream_id_is_refused_naming_the_column() -> None:
    with pytest.raises(ConfigurationError, match="stream_id.*a stream id in every row"):
        route_by_stream_id(iter([_batch([b"a", b"b"], [31, None], pa.int32())]))
    with pytest.raises(ConfigurationError, match="stream_id.*32-bit stream ids"):
        route_by_stream_id(iter([_batch([b"a"], [2**31], pa.int64())]))
