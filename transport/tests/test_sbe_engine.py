"""The SBE engine on its own (no Java): schema errors, evolution within one batch, other templates,
encode errors naming column and row, garbage input only ever raising the engine's errors."""

from __future__ import annotations

import pickle
import struct
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import sbe_values as sv  # noqa: E402

from aeron_spark.errors import AeronSparkError  # noqa: E402
from aeron_spark.transport import sbe  # noqa: E402

V0, V1, BE = (str(sv.DATA / f"golden-{n}.xml") for n in ("v0", "v1", "be"))


def _rows(codec: sbe.MessageCodec, n: int, seed: int = 1) -> list[dict]:
    return sv.random_rows(codec.message, n, seed)


def _batch(codec: sbe.MessageCodec, rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema)


@pytest.mark.parametrize(
    ("xml", "words"),
    [
        ("<nope/>", "not <sbe:messageSchema>"),
        ("<sbe:messageSchema xmlns:sbe='x'", "not well-formed"),
        ("/nonexistent/schema.xml", "cannot read"),
        ("<messageSchema><types/></messageSchema>", "unknown type 'messageHeader'"),
    ],
)
def test_bad_schemas_raise_a_coded_error(xml: str, words: str) -> None:
    with pytest.raises(sbe.SbeSchemaError) as info:
        sbe.parse_schema(xml)
    assert words in str(info.value)
    assert info.value.code == sbe.SbeErrorCode.SCHEMA
    assert isinstance(info.value, AeronSparkError)


def test_schema_errors_name_the_element() -> None:
    text = Path(V1).read_text().replace('type="Side"/>', 'type="Sidez"/>', 1)
    with pytest.raises(sbe.SbeSchemaError, match="field 'side': unknown type 'Sidez'"):
        sbe.parse_schema(text)
    text = (
        Path(V1)
        .read_text()
        .replace(
            'name="orderId" id="1" type="uint64"/>',
            'name="orderId" id="1" type="uint64" offset="x"/>',
        )
    )
    with pytest.raises(sbe.SbeSchemaError, match="offset='x' is not an integer"):
        sbe.parse_schema(text)


def test_message_by_name_or_template_id() -> None:
    schema = sbe.parse_schema(V1)
    assert schema.message("Order") is schema.message(2) is schema.message(" 2")
    with pytest.raises(sbe.UnknownMessageError, match=r"no message 'Nope' \(it has Tick \(1\)"):
        schema.message("Nope")


def test_layout_matches_the_standard() -> None:
    """Offsets as SbeTool computes them (checked against its generated BLOCK_LENGTHs)."""
    v0, v1, be = (sbe.parse_schema(p) for p in (V0, V1, BE))
    assert [m.block_length for m in v0.messages] == [86, 17]
    assert [m.block_length for m in v1.messages] == [104, 21]
    assert [g.block_length for g in v1.message("Order").groups] == [25, 4]
    assert be.message("Quote").block_length == 64  # blockLength attribute above the fields
    assert be.byte_order == ">" and be.header_length == 8


def test_big_endian_bytes_by_hand() -> None:
    codec = sbe.load(BE, "Quote")
    row = {
        "bid": {"mantissa": 1, "exponent": -2},
        "ask": {"mantissa": 2, "exponent": -2},
        "size": 7,
        "symbol": "AB",
        "side": "SELL",
        "flags": {"a": True, "b": True, "c": False},
        "big": 2**64 - 2,
        "f": 1.5,
        "d": -2.0,
        "levels": [{"px": 5, "qty": None}],
        "note": "é",
    }
    (payload,) = codec.encode(_batch(codec, [row]))
    # header (blockLength, version, templateId, schemaId), big-endian, members in its own order
    assert payload[:8] == struct.pack(">HHHH", 64, 0, 7, 902)
    assert payload[8:17] == struct.pack(">qb", 1, -2)
    assert payload[26:30] == struct.pack(">I", 7)
    assert payload[30:35] == b"AB\0\0\0" and payload[35:36] == b"S"
    assert payload[36:40] == struct.pack(">I", 1 | 1 << 7)
    assert payload[40:48] == struct.pack(">Q", 2**64 - 2)
    assert payload[56:60] == struct.pack(">f", 1.5)
    assert payload[72:75] == struct.pack(">HB", 12, 1)  # group dimension: blockLength, count
    assert payload[75:87] == struct.pack(">qi", 5, -(2**31))  # optional qty: its null value
    assert payload[87:] == struct.pack(">H", 2) + "é".encode()
    back, _ = codec.decode([payload])
    assert sv.normal(back.to_pylist()) == [row]


def test_fixed_messages_decode_as_one_matrix() -> None:
    codec = sbe.load(V1, "Tick")
    rows = _rows(codec, 5000)
    payloads = codec.encode(_batch(codec, rows))
    matrix = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
    batch, others = codec.decode_matrix(matrix)
    assert len(others) == 0 and batch.num_rows == 5000
    assert sv.normal(batch.to_pylist()) == rows
    assert np.array_equal(codec.encode_matrix(_batch(codec, rows)), matrix)


def test_old_and_new_messages_in_one_batch() -> None:
    """A v1 reader over v0 and v1 messages interleaved: v1 fields null only in the v0 ones; a v0
    reader over the same skips what it does not know."""
    for message in ("Tick", "Order"):
        v0, v1 = sbe.load(V0, message), sbe.load(V1, message)
        rows = _rows(v1, 300, seed=3)
        new = v1.encode(_batch(v1, rows))
        old_rows = [sv.project(v0.message, r) for r in rows]
        old = v0.encode(_batch(v0, old_rows))
        mixed = [new[i] if i % 3 else old[i] for i in range(len(rows))]
        got, _ = v1.decode(mixed)
        want = [r if i % 3 else sv.project(v1.message, old_rows[i]) for i, r in enumerate(rows)]
        assert sv.normal(got.to_pylist()) == want
        got, _ = v0.decode(mixed)
        assert sv.normal(got.to_pylist()) == old_rows


def test_other_templates_are_left_out_and_named() -> None:
    tick, order = sbe.load(V1, "Tick"), sbe.load(V1, "Order")
    ticks = tick.encode(_batch(tick, _rows(tick, 4)))
    orders = order.encode(_batch(order, _rows(order, 3)))
    mixed = [ticks[0], orders[0], ticks[1], ticks[2], orders[1], orders[2], ticks[3]]
    batch, others = tick.decode(mixed)
    assert batch.num_rows == 4 and others.tolist() == [1, 4, 5]
    batch, others = order.decode(mixed)
    assert batch.num_rows == 3 and others.tolist() == [0, 2, 3, 6]
    # another schema id with the same template id is another template too
    foreign = bytearray(ticks[0])
    foreign[4:6] = struct.pack("<H", 999)
    _, others = tick.decode([ticks[0], bytes(foreign)])
    assert others.tolist() == [1]


def test_raw_enums() -> None:
    codec = sbe.load(V1, "Tick", raw_enums=True)
    assert codec.arrow_schema.field("side").type == pa.int16()
    named = sbe.load(V1, "Tick")
    rows = _rows(named, 10)
    batch, _ = codec.decode(named.encode(_batch(named, rows)))
    raw = {"BUY": 1, "SELL": 2, None: None}  # a required enum's null value reads as null
    assert batch.column("side").to_pylist() == [raw[r["side"]] for r in rows]
    assert batch.column("market").to_pylist() == [0] * 10  # a constant enum field, raw


@pytest.mark.parametrize(
    ("message", "column", "value", "words"),
    [
        ("Tick", "u8", 256, "column 'u8', row 3: expected an integer from 0 to 254"),
        ("Tick", "pct", 101, "column 'pct', row 3: expected an integer from 0 to 100"),
        ("Tick", "symbol", "ABCDEFGHI", "column 'symbol', row 3: expected at most 8 bytes"),
        ("Tick", "symbol", "caf\u00e9", "column 'symbol', row 3: expected US-ASCII text"),
        ("Tick", "qty", None, "column 'qty', row 3: expected a value (the field is required"),
        ("Tick", "side", "HOLD", "column 'side', row 3: expected one of BUY, SELL, not 'HOLD'"),
        ("Tick", "levels", [1, 2, 3], "column 'levels', row 3: expected an array of exactly 4"),
        ("Tick", "seq", -1, "column 'seq', row 3: expected an integer from 0 to"),
        ("Order", "blob", b"x" * 70000, "column 'blob', row 3: expected at most 65534 bytes"),
    ],
)
def test_values_that_do_not_fit_name_column_and_row(
    message: str, column: str, value: object, words: str
) -> None:
    codec = sbe.load(V1, message)
    rows = _rows(codec, 6)
    rows[3][column] = value
    batch = _batch(codec, rows)
    with pytest.raises(sbe.SbeEncodeError) as info:
        codec.encode(batch)
    assert words in str(info.value)
    assert info.value.details["row"] == 3


def test_errors_inside_groups_name_the_message_row() -> None:
    codec = sbe.load(V1, "Order")
    rows = _rows(codec, 6, seed=5)
    for r in rows:
        r["legs"] = r["legs"] or [sv.random_rows(codec.message.groups[0], 1, 1)[0]]
    rows[4]["legs"][-1]["legId"] = -5
    with pytest.raises(sbe.SbeEncodeError, match="column 'legs.legId', row 4"):
        codec.encode(_batch(codec, rows))


def test_missing_and_unknown_columns() -> None:
    codec = sbe.load(V1, "Tick")
    batch = _batch(codec, _rows(codec, 2))
    with pytest.raises(sbe.SbeEncodeError, match="column 'qty': expected a column"):
        codec.encode(batch.drop_columns(["qty"]))
    extra = batch.append_column("nope", pa.array([1, 2]))
    with pytest.raises(sbe.SbeEncodeError, match="column 'nope' is no field of message Tick"):
        codec.encode(extra)
    # optional and newer (sinceVersion) fields may be left out: null / zero, as a v0 writer does
    got, _ = codec.decode(codec.encode(batch.drop_columns(["bidQty", "mid"])))
    assert got.column("bidQty").null_count == 2 and got.column("mid").null_count == 2


def test_truncated_messages_raise_decode_errors() -> None:
    for message in ("Tick", "Order"):
        codec = sbe.load(V1, message)
        good = codec.encode(_batch(codec, _rows(codec, 3)))
        with pytest.raises(sbe.SbeDecodeError) as info:
            codec.decode([good[0], good[1][:-1] if message == "Order" else good[1][:20], good[2]])
        assert info.value.details["index"] == 1
    with pytest.raises(sbe.SbeDecodeError, match="shorter than the 8-byte message header"):
        codec.decode([b"\x01\x02"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=120), min_size=1, max_size=5), st.sampled_from(["Tick", "Order"])
)
def test_garbage_only_ever_raises_engine_errors(payloads: list[bytes], message: str) -> None:
    codec = sbe.load(V1, message)
    tick = payloads[0][:2] + struct.pack("<HH", codec.message.id, 901) + payloads[0][6:]
    try:
        codec.decode([tick, *payloads[1:]])
    except sbe.SbeError:
        pass


def test_errors_survive_pickling() -> None:
    err = sbe.SbeEncodeError("column 'x', row 2: expected y", column="x", row=2)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is sbe.SbeEncodeError and back.row == 2 and back.column == "x"


PADDED = """<sbe:messageSchema xmlns:sbe="http://fixprotocol.io/2016/sbe" id="5" version="{v}">
  <types>
    <composite name="messageHeader">
      <type name="blockLength" primitiveType="uint16"/>
      <type name="templateId" primitiveType="uint16"/>
      <type name="schemaId" primitiveType="uint16"/>
      <type name="version" primitiveType="uint16"/>
    </composite>
  </types>
  <sbe:message name="M" id="1" blockLength="16">
    <field name="a" id="1" type="int64"/>
    {extra}
  </sbe:message>
</sbe:messageSchema>"""


def test_fields_newer_than_the_message_are_null_inside_its_block() -> None:
    """A v0 block padded to 16 bytes (blockLength) whose padding v1 uses for a new field: the v0
    message's block is long enough, only its version says the field is not there."""
    v0 = sbe.load(PADDED.format(v=0, extra=""), "M")
    v1 = sbe.load(
        PADDED.format(v=1, extra='<field name="b" id="2" type="int64" sinceVersion="1"/>'), "M"
    )
    (old,) = v0.encode(pa.RecordBatch.from_pylist([{"a": 7}], schema=v0.arrow_schema))
    assert len(old) == 8 + 16
    dirty = old[:16] + b"\xff" * 8  # whatever a v0 writer left in its padding
    got, _ = v1.decode([dirty])
    assert got.to_pylist() == [{"a": 7, "b": None}]
    (new,) = v1.encode(pa.RecordBatch.from_pylist([{"a": 7, "b": 9}], schema=v1.arrow_schema))
    assert v1.decode([new])[0].to_pylist() == [{"a": 7, "b": 9}]
    assert v0.decode([new])[0].to_pylist() == [{"a": 7}]
