"""The SBE constructs trading venues' schemas use (issue 33), in the engine on its own: sets over
a named <type>, <xi:include> (and its refusals), char enums whose values are digits, and required
enums holding their null value. test_sbe_golden.py checks the same schema against SbeTool's Java."""

from __future__ import annotations

import os
import re
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sbe_values as sv  # noqa: E402

from aeron_spark.transport import sbe  # noqa: E402

VENUE = str(sv.DATA / "golden-venue.xml")


def _plain() -> str:
    """golden-venue.xml as XML text without its include and with sets over primitives (the
    enum tests below then fail on the old code for their own reason, not at loading)."""
    types = (sv.DATA / "golden-venue-types.xml").read_text().split("?>", 1)[1]
    text = Path(VENUE).read_text().split("?>", 1)[1]
    text = text.replace('<xi:include href="golden-venue-types.xml"/>', types)
    return re.sub(r'(<set [^>]*encodingType=")uInt', r"\1uint", text)


HEADER = """
    <composite name="messageHeader">
        <type name="blockLength" primitiveType="uint16"/>
        <type name="templateId" primitiveType="uint16"/>
        <type name="schemaId" primitiveType="uint16"/>
        <type name="version" primitiveType="uint16"/>
    </composite>"""


def _schema(types: str, fields: str, head: str = "") -> str:
    return f"""<sbe:messageSchema xmlns:sbe="http://fixprotocol.io/2016/sbe"
        xmlns:xi="http://www.w3.org/2001/XInclude" package="t" id="5" version="0">
        {head}<types>{types}</types>
        <sbe:message name="M" id="1">{fields}</sbe:message></sbe:messageSchema>"""


def _header(block_length: int) -> bytes:
    return struct.pack("<4H", block_length, 1, 5, 0)


def test_a_set_over_a_named_type_is_that_types_primitive() -> None:
    xml = _schema(
        HEADER
        + """<type name="uInt8" primitiveType="uint8"/>
        <set name="MatchEventIndicator" encodingType="uInt8">
            <choice name="LastTradeMsg">0</choice><choice name="EndOfEvent">7</choice>
        </set>""",
        '<field name="m" id="1" type="MatchEventIndicator"/><field name="q" id="2" type="int32"/>',
    )
    codec = sbe.load(xml, "M")
    payload = _header(5) + bytes([0x81]) + struct.pack("<i", 9)
    batch, _ = codec.decode([payload])
    assert batch.to_pylist() == [{"m": {"LastTradeMsg": True, "EndOfEvent": True}, "q": 9}]
    assert codec.encode(batch) == [payload]


def test_a_set_over_a_named_non_integer_type_is_refused() -> None:
    xml = _schema(
        HEADER + '<type name="Px" primitiveType="double"/>'
        '<set name="S" encodingType="Px"><choice name="a">0</choice></set>',
        '<field name="s" id="1" type="S"/>',
    )
    with pytest.raises(sbe.SbeSchemaError, match="set 's': bad encodingType 'Px'"):
        sbe.load(xml, "M")


@pytest.fixture
def tree() -> Iterator[Path]:
    """A directory holding a schema directory (``tree/schemas``) and a file outside it."""
    with tempfile.TemporaryDirectory() as top:
        root = Path(top)
        (root / "schemas" / "common").mkdir(parents=True)
        (root / "schemas" / "common" / "header.xml").write_text(f"<types>{HEADER}</types>")
        (root / "secret.xml").write_text(f"<types>{HEADER}</types>")
        yield root


def _write(tree: Path, href: str) -> str:
    path = tree / "schemas" / "s.xml"
    path.write_text(
        _schema(
            '<type name="Q" primitiveType="int32"/>',
            '<field name="q" id="1" type="Q"/>',
            head=f'<xi:include href="{href}"/>',
        )
    )
    return str(path)


def test_includes_resolve_relative_to_the_schema_file(tree: Path) -> None:
    codec = sbe.load(_write(tree, "common/header.xml"), "M")
    assert codec.schema.header_length == 8
    assert codec.decode([_header(4) + struct.pack("<i", 7)])[0].to_pylist() == [{"q": 7}]


@pytest.mark.parametrize("href", ["../secret.xml", "{top}/secret.xml", "file://{top}/secret.xml"])
def test_includes_outside_the_schema_directory_are_refused(tree: Path, href: str) -> None:
    path = _write(tree, href.format(top=tree))
    with pytest.raises(sbe.SbeSchemaError, match="secret.xml.* is outside the schema's directory"):
        sbe.load(path, "M")


def test_an_include_through_a_symlink_out_of_the_tree_is_refused(tree: Path) -> None:
    os.symlink(tree / "secret.xml", tree / "schemas" / "link.xml")
    with pytest.raises(sbe.SbeSchemaError, match="secret.xml' is outside"):
        sbe.load(_write(tree, "link.xml"), "M")


def test_include_errors_name_the_file(tree: Path) -> None:
    (tree / "schemas" / "bad.xml").write_text("<types>")
    with pytest.raises(sbe.SbeSchemaError, match="bad.xml' is not well-formed XML"):
        sbe.load(_write(tree, "bad.xml"), "M")
    with pytest.raises(sbe.SbeSchemaError, match="cannot read .*missing.xml"):
        sbe.load(_write(tree, "missing.xml"), "M")
    with pytest.raises(sbe.SbeSchemaError, match="recursive include"):
        sbe.load(_write(tree, "s.xml"), "M")


def test_schema_text_is_the_schema_with_its_includes_resolved() -> None:
    text = sbe.schema_text(VENUE)  # what Spark ships to its executors
    assert "XInclude" not in text
    assert sbe.parse_schema(text) == sbe.parse_schema(VENUE)


def test_an_include_in_schema_text_asks_for_a_file() -> None:
    xml = _schema("", "", head='<xi:include href="common.xml"/>')
    with pytest.raises(sbe.SbeSchemaError, match="give the schema as a file path"):
        sbe.load(xml, "M")


def _exec(side: int, tif: int, aggressor: int, reason: int, entries: list[tuple]) -> bytes:
    block = struct.pack("<IccBBHHi", 1, bytes([side]), bytes([tif]), 0, aggressor, reason, 0, 2)
    group = struct.pack("<HB", 11, len(entries)) + b"".join(
        struct.pack("<cqBB", bytes([e]), 100, 0, i) for e, i in entries
    )
    return struct.pack("<4H", len(block), 1, 903, 0) + block + group + struct.pack("<H", 0)


def test_the_venue_schema_inlined_is_the_same_layout() -> None:
    assert sbe.load(_plain(), "Exec").message == sbe.load(VENUE, "Exec").message


def test_char_enum_digits_are_characters() -> None:
    codec = sbe.load(_plain(), "Exec")
    payload = _exec(ord("2"), ord("0"), 1, 300, [(ord("0"), 0), (ord("6"), 1), (ord("A"), 0)])
    batch, _ = codec.decode([payload])
    row = batch.to_pylist()[0]
    assert (row["side"], row["tif"], row["aggressor"], row["reason"]) == (
        "Sell",
        "Day",
        "True",
        "PriceBand",
    )
    assert [e["entryType"] for e in row["entries"]] == ["Bid", "Settle", "Imbalance"]
    assert codec.encode(batch) == [payload]  # Sell is '2' (0x32), Bid is '0' (0x30)


def test_char_enum_digits_raw() -> None:
    raw = sbe.load(_plain(), "Exec", raw_enums=True)
    payload = _exec(ord("1"), ord("3"), 0, 7, [(ord("0"), 1)])
    batch, _ = raw.decode([payload])
    row = batch.to_pylist()[0]
    assert (row["side"], row["tif"], row["entries"][0]["entryType"]) == (0x31, 0x33, 0x30)
    assert raw.encode(batch) == [payload]  # the raw values read are written back


def test_char_enum_values_are_one_character() -> None:
    xml = _schema(
        HEADER + '<enum name="E" encodingType="char"><validValue name="a">10</validValue></enum>',
        '<field name="e" id="1" type="E"/>',
    )
    with pytest.raises(sbe.SbeSchemaError, match="'10' is not a char value"):
        sbe.load(xml, "M")


def test_required_enums_holding_their_null_value_round_trip() -> None:
    codec = sbe.load(_plain(), "Exec")
    # Java's encoders write NULL_VAL into required enums: char 0, uint8 255, uint16 65535
    payload = _exec(0, 0, 255, 65535, [(0, 255)])
    batch, _ = codec.decode([payload])
    row = batch.to_pylist()[0]
    assert (row["side"], row["tif"], row["aggressor"], row["reason"]) == (None,) * 4
    assert (row["entries"][0]["entryType"], row["entries"][0]["implied"]) == (None, None)
    assert codec.encode(batch) == [payload]
    raw = sbe.load(_plain(), "Exec", raw_enums=True)
    assert raw.encode(raw.decode([payload])[0]) == [payload]


def test_a_required_enum_column_is_still_required() -> None:
    codec = sbe.load(VENUE, "Exec")
    rows = sv.random_rows(codec.message, 3, seed=5)
    batch = pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema).drop_columns(["side"])
    with pytest.raises(sbe.SbeEncodeError, match="column 'side': expected a column"):
        codec.encode(batch)


def test_text_the_data_encoding_cannot_hold_is_a_coded_error() -> None:
    codec = sbe.load(VENUE, "Exec")
    rows = sv.random_rows(codec.message, 3, seed=6)
    rows[1]["text"] = "caf\u00e9"
    with pytest.raises(
        sbe.SbeEncodeError, match="column 'text', row 1: expected text that US-ASCII"
    ):
        codec.encode(pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema))
