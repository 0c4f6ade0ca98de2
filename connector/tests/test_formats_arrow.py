"""The arrow format's message decoding: the fast path (one record batch, schema from the cache)
gives exactly what Arrow's stream reader gives, and every other layout falls back to it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.formats_arrow import (
    _decode_one_batch,
    _SchemaCache,
    decode_message,
    encode_batches,
)
from aeron_spark.errors import ConfigurationError


def stream(*batches: pa.RecordBatch, options: pa.ipc.IpcWriteOptions | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def reference(payload: bytes) -> list[pa.RecordBatch]:
    return list(pa.ipc.open_stream(pa.py_buffer(payload)))


BATCH = pa.RecordBatch.from_pydict(
    {
        "v": pa.array([b"a", None, b"ccc"], pa.binary()),
        "n": pa.array([1, 2, None], pa.int64()),
        "s": pa.array(["x", "y", "z"]),
    }
)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_sink_messages_take_the_fast_path_and_match(compression) -> None:  # type: ignore[no-untyped-def]
    big = pa.RecordBatch.from_pydict(
        {"v": [bytes([i % 251]) * 116 for i in range(5000)], "i": list(range(5000))}
    )
    cache = _SchemaCache()
    messages = list(encode_batches(big, 128 * 1024, compression))
    assert len(messages) > 1
    for message in messages:
        assert _decode_one_batch(memoryview(message), cache) is not None
        got = decode_message(message, 0, cache)
        assert [b.to_pydict() for b in got] == [b.to_pydict() for b in reference(message)]
    assert len(cache._by_bytes) == 1  # one schema, parsed once


def test_other_layouts_fall_back_to_the_stream_reader() -> None:
    cache = _SchemaCache()
    two = stream(BATCH, BATCH.slice(1))
    dictionary = stream(
        pa.RecordBatch.from_pydict({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    )
    empty = stream(BATCH.slice(0, 0))
    for payload in (two, dictionary, empty):
        if payload is not empty:
            assert _decode_one_batch(memoryview(payload), cache) is None
        got = decode_message(payload, 0, cache)
        assert [b.to_pydict() for b in got] == [b.to_pydict() for b in reference(payload)]


def test_a_message_without_end_of_stream_marker_is_read() -> None:
    payload = stream(BATCH)
    assert payload.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    got = decode_message(payload[:-8], 0, _SchemaCache())
    assert got[0].equals(BATCH)


def test_schemas_change_between_messages() -> None:
    cache = _SchemaCache()
    other = pa.RecordBatch.from_pydict({"other": [1.5, 2.5]})
    for payload in (stream(BATCH), stream(other), stream(BATCH)):
        assert decode_message(payload, 0, cache)[0].equals(reference(payload)[0])
    assert len(cache._by_bytes) == 2


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not arrow at all",
        b"\xff\xff\xff\xff" + bytes(12),
        stream(BATCH)[:40],
        stream(BATCH)[:-20],
    ],
)
def test_damaged_messages_name_their_position(payload: bytes) -> None:
    with pytest.raises(ControlProtocolError, match="position 4096"):
        decode_message(payload, 4096, _SchemaCache())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=300), st.integers(-(2**63), 2**63 - 1) | st.none()),
        min_size=1,
        max_size=200,
    ),
    st.integers(256, 4096),
)
def test_random_batches_round_trip(rows, max_bytes) -> None:  # type: ignore[no-untyped-def]
    batch = pa.RecordBatch.from_pydict(
        {
            "v": pa.array([r[0] for r in rows], pa.binary()),
            "n": pa.array([r[1] for r in rows], pa.int64()),
        }
    )
    cache = _SchemaCache()
    try:
        messages = list(encode_batches(batch, max_bytes))
    except ConfigurationError:  # one row larger than a message: the sink refuses it (tested there)
        return
    got = [b for m in messages for b in decode_message(m, 0, cache)]
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches([batch]))


def test_coalesce_keeps_rows_and_order_and_cuts_at_schema_changes() -> None:
    from aeron_spark.connector.formats_arrow import coalesce

    small = [pa.RecordBatch.from_pydict({"i": list(range(k * 10, k * 10 + 10))}) for k in range(25)]
    other = pa.RecordBatch.from_pydict({"x": [1.0]})
    big = pa.RecordBatch.from_pydict({"i": list(range(1000, 1500))})
    out = list(coalesce([*small[:12], other, *small[12:], big], rows=100))
    assert [b.num_rows for b in out] == [100, 20, 1, 100, 30, 500]
    assert out[2].equals(other)
    ints = [v for b in out if b.schema.names == ["i"] for v in b.column("i").to_pylist()]
    assert ints == list(range(250)) + list(range(1000, 1500))
    assert list(coalesce([])) == []
    by_bytes = list(coalesce(small, rows=10**9, nbytes=small[0].nbytes * 5))
    assert [b.num_rows for b in by_bytes] == [50] * 5


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 700))
def test_coalesce_property(sizes, rows) -> None:  # type: ignore[no-untyped-def]
    from aeron_spark.connector.formats_arrow import coalesce

    start = 0
    batches = []
    for n in sizes:
        batches.append(pa.RecordBatch.from_pydict({"i": list(range(start, start + n))}))
        start += n
    out = list(coalesce(batches, rows=rows))
    assert [v for b in out for v in b.column("i").to_pylist()] == list(range(start))
    # a short batch is the last one, or the rows gathered before a large batch that passes as is
    assert all(
        b.num_rows >= rows or i == len(out) - 1 or out[i + 1].num_rows >= rows
        for i, b in enumerate(out)
    )
    assert all(b.num_rows > 0 for b in out)
