"""json / msgpack / text records: decoding into a schema, bad-record policies, sink encoding."""

from __future__ import annotations

import datetime as dt
import json

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.connector.client import ReplayBlock
from aeron_spark.connector.formats import iter_messages
from aeron_spark.connector.formats_records import (
    BadRecordError,
    Decoding,
    RecordDecoder,
    encode_rows,
    infer_schema,
)
from aeron_spark.errors import ConfigurationError
from connector.tests.test_formats import record

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("price", pa.float64()),
        ("symbol", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
    ]
)


def rows(n: int) -> list[dict]:
    base = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    return [
        {
            "id": i,
            "price": i * 1.5,
            "symbol": f"s{i % 3}",
            "at": base + dt.timedelta(seconds=i),
            "day": dt.date(2026, 1, 1) + dt.timedelta(days=i % 30),
        }
        for i in range(n)
    ]


def decode(
    payloads: list[bytes],
    fmt: str,
    policy: str = "fail",
    metadata: bool = False,
    schema: pa.Schema = SCHEMA,
) -> tuple[pa.Table, RecordDecoder]:
    data, geo = record(payloads)
    decoding = Decoding(fmt, schema.serialize().to_pybytes(), policy, "_bad", metadata)
    decoder = RecordDecoder(decoding, 42)
    batches = list(decoder.batches([ReplayBlock(0, data, 7_000, len(data))], geo))
    return pa.Table.from_batches(batches, schema=decoding.output_schema()), decoder


def as_rows(table: pa.Table) -> list[dict]:
    out = table.to_pylist()
    for r in out:
        r["at"] = r["at"].astimezone(dt.UTC) if r.get("at") else r.get("at")
    return out


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_rows_written_by_the_sink_encoder_read_back_identically(fmt: str) -> None:
    expected = rows(5000)  # several chunks of messages
    payloads = encode_rows(pa.RecordBatch.from_pylist(expected, schema=SCHEMA), fmt)
    assert len(payloads) == 5000
    table, decoder = decode(payloads, fmt)
    assert as_rows(table) == expected
    assert decoder.dropped == 0


def test_json_fields_missing_or_unknown_are_null_or_ignored_and_newlines_are_fine() -> None:
    payloads = [b'{"id": 1, "other": [1, 2]}', b'{\n  "symbol": "x",\n  "id": 2\n}']
    table, _ = decode(payloads, "json")
    assert table.column("id").to_pylist() == [1, 2]
    assert table.column("symbol").to_pylist() == [None, "x"]


BAD = {
    "json": [b'{"id": "not a number"}', b"[1, 2]", b"   ", b'{"id": 1}{"id": 2}', b"\xff{"],
    "msgpack": [
        msgpack.packb([1, 2]),
        b"\xc1",
        msgpack.packb({"id": "x"}) + b"\x00",
        msgpack.packb({"id": "nope"}),
    ],
    "text": [b"\xff\xfe", b"ok\x80"],
}


def mixed(fmt: str, n: int = 3000) -> tuple[list[bytes], list[int]]:
    """n good messages with the format's bad ones spread among them; returns the bad indices."""
    good = (
        encode_rows(pa.RecordBatch.from_pylist(rows(n), schema=SCHEMA), fmt)
        if fmt != "text"
        else [f"line {i}".encode() for i in range(n)]
    )
    payloads, bad_at = list(good), []
    for k, bad in enumerate(BAD[fmt]):
        at = (k + 1) * n // (len(BAD[fmt]) + 1)
        payloads.insert(at, bad)
        bad_at.append(at)
    return payloads, bad_at


TEXT = pa.schema([("value", pa.string())])


@pytest.mark.parametrize("fmt", ["json", "msgpack", "text"])
def test_bad_records_fail_naming_the_position(fmt: str) -> None:
    payloads, _ = mixed(fmt)
    with pytest.raises(BadRecordError, match=r"position \d+ of recording 42.*badRecordsPolicy"):
        decode(payloads, fmt, schema=TEXT if fmt == "text" else SCHEMA)


@pytest.mark.parametrize("fmt", ["json", "msgpack", "text"])
def test_bad_records_dropped_keep_every_good_row_in_order(fmt: str) -> None:
    payloads, bad_at = mixed(fmt)
    table, decoder = decode(
        payloads, fmt, "drop", metadata=True, schema=TEXT if fmt == "text" else SCHEMA
    )
    assert decoder.dropped == len(bad_at)
    assert table.num_rows == len(payloads) - len(bad_at)
    positions = table.column("position").to_pylist()
    assert positions == sorted(positions)
    if fmt == "text":
        assert table.column("value").to_pylist() == [f"line {i}" for i in range(3000)]
    else:
        assert table.column("id").to_pylist() == list(range(3000))


@pytest.mark.parametrize("fmt", ["json", "msgpack", "text"])
def test_bad_records_in_a_column_keep_their_place_and_bytes(fmt: str) -> None:
    payloads, bad_at = mixed(fmt)
    table, _ = decode(
        payloads, fmt, "column", metadata=True, schema=TEXT if fmt == "text" else SCHEMA
    )
    assert table.schema.names[-1] == "_bad" and table.num_rows == len(payloads)
    corrupt = table.column("_bad").to_pylist()
    assert [i for i, v in enumerate(corrupt) if v is not None] == bad_at
    assert [corrupt[i] for i in bad_at] == BAD[fmt]
    first = table.schema.names[0]
    data = table.column(first).to_pylist()
    assert all(data[i] is None for i in bad_at)
    assert sum(v is not None for v in data) == 3000
    assert table.column("recording_id").to_pylist() == [42] * len(payloads)


def test_metadata_columns_are_the_frames() -> None:
    payloads = encode_rows(pa.RecordBatch.from_pylist(rows(3), schema=SCHEMA), "json")
    table, _ = decode(payloads, "json", metadata=True)
    data, geo = record(payloads)
    messages = list(iter_messages([ReplayBlock(0, data, 7_000, len(data))], geo))
    assert table.column("position").to_pylist() == [m.position for m in messages]
    assert table.column("reserved_value").to_pylist() == [0, 1, 2]
    assert table.column("session_id").to_pylist() == [77] * 3


def test_inferring_a_schema_from_one_record() -> None:
    assert infer_schema("json", b'{"a": 1, "b": "x"}').names == ["a", "b"]
    assert infer_schema("msgpack", msgpack.packb({"a": 1.5})).field("a").type == pa.float64()
    with pytest.raises(ConfigurationError, match="schema option"):
        infer_schema("json", b"not json")


def test_json_sink_encoding_is_plain_json() -> None:
    [payload] = encode_rows(pa.RecordBatch.from_pylist(rows(1), schema=SCHEMA), "json")
    assert json.loads(payload) == {
        "id": 0,
        "price": 0.0,
        "symbol": "s0",
        "at": "2026-01-02T03:04:05.678000+00:00",
        "day": "2026-01-01",
    }


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.just(b'{"id": 3}')), min_size=1, max_size=60))
def test_any_mix_of_messages_is_split_exactly_into_good_and_bad(payloads: list[bytes]) -> None:
    table, decoder = decode(payloads, "json", "column")
    assert table.num_rows == len(payloads)
    for payload, row in zip(payloads, table.to_pylist(), strict=True):
        if payload == b'{"id": 3}':
            assert row["id"] == 3 and row["_bad"] is None
        elif row["_bad"] is not None:
            assert row["_bad"] == payload and row["id"] is None
