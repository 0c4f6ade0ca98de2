"""Option errors read as the rest do (issue 33, item 8): each names the option as the user
spelled it (Spark hands options over in lower case), says what is wrong in a sentence of its
own, and is raised while the options are parsed (``load()`` / ``save()``), not by Spark later."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from aeron_spark.connector.formats_sbe import check_sink_schema
from aeron_spark.connector.options import (
    parse_archive_source_options,
    parse_sink_options,
    parse_source_options,
)
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import sbe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "transport" / "tests"))
import sbe_values as sv  # noqa: E402

V1 = str(sv.DATA / "golden-v1.xml")


def _lowered(options: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}  # as Spark's CaseInsensitiveDict has them


def test_a_misspelled_option_is_named_in_the_user_case_with_the_closest_option() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_source_options(_lowered({"streamId": "1", "maxMessagesPerTriger": "5"}))
    message = str(info.value)
    assert message.startswith("invalid maxMessagesPerTriger='5': not a known source option")
    assert "did you mean maxMessagesPerTrigger?" in message
    assert "maxmessagespertriger" not in message
    with pytest.raises(ConfigurationError, match=r"invalid sinkld='x'.* did you mean sinkId\?"):
        parse_sink_options(_lowered({"streamId": "1", "sinkld": "x"}))
    # nothing close: no guess, the list of options
    with pytest.raises(ConfigurationError, match=r"invalid zzz='1': not a known source option \("):
        parse_source_options(_lowered({"streamId": "1", "zzz": "1"}))


def test_archive_mode_names_a_refused_option_as_readme_spells_it() -> None:
    options = _lowered({"archive": "aeron:udp?endpoint=127.0.0.1:8010", "streamId": "1"})
    with pytest.raises(ConfigurationError, match=r"^invalid keyStore='/k': expected no keyStore"):
        parse_archive_source_options({**options, "keystore": "/k"})


def test_no_error_reads_expected_followed_by_a_sentence() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_source_options(
            {"streamid": "1", "format": "sbe", "sbeschema": "/nonexistent/trades.xml"}
        )
    message = str(info.value)
    assert message.startswith("invalid sbeSchema='/nonexistent/trades.xml': cannot read")
    assert "expected cannot" not in message
    with pytest.raises(ConfigurationError) as info:
        parse_source_options({"streamid": "1", "format": "sbe", "sbeschema": V1, "sbemessage": "X"})
    assert str(info.value).startswith("invalid sbeMessage='X': the schema has no message 'X'")


@pytest.mark.parametrize(
    "ddl, near",
    [
        ("id lng, price double", "expected a type at 'lng"),
        ("id long price double", "expected ',' or the end at 'price double"),
        ("id long,", "expected a column name at the end"),
        ("tags array<string", "expected '>' at the end"),
        ("code varchar", "varchar takes 1 parameter"),
    ],
)
def test_a_schema_that_is_not_ddl_names_the_schema_option(ddl: str, near: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_source_options({"streamid": "1", "format": "json", "schema": ddl})
    assert str(info.value).startswith(f"invalid schema={ddl!r}: not Spark DDL: {near}")


@pytest.mark.parametrize(
    "ddl",
    [
        "id long, price double, symbol string, at timestamp, day date",
        "`a b` array<struct<x: int, `y`: map<string, decimal(10,2)>>> not null comment 'c'",
        "d decimal, e dec(5), f varchar(10), g interval day to second, h char(3), i binary",
        "t timestamp_ntz, u timestamp_ltz, s string collate UTF8_LCASE, b boolean, y tinyint",
        "struct<a: int, b string>",
    ],
)
def test_ddl_spark_takes_is_taken(ddl: str) -> None:
    assert parse_source_options({"streamid": "1", "format": "json", "schema": ddl}).schema_ddl


def test_a_column_that_is_no_sbe_field_is_named_with_its_type_only() -> None:
    options = parse_sink_options(
        {"streamid": "1", "format": "sbe", "sbeschema": V1, "sbemessage": "Tick"}
    )
    assert options.sbe is not None
    schema = sbe.load(V1, "Tick").arrow_schema
    with pytest.raises(ConfigurationError) as info:
        check_sink_schema(schema.append(pa.field("nope", pa.int64())), options.sbe)
    message = str(info.value)
    assert message.startswith("invalid column nope='int64': does not fit SBE message Tick")
    assert "price" not in message.split("(it has")[0]  # not the whole Arrow schema
    assert len(message) < 400, message
    with pytest.raises(ConfigurationError, match=r"^invalid column qty=None: .*required"):
        check_sink_schema(pa.schema([f for f in schema if f.name != "qty"]), options.sbe)


@pytest.mark.parametrize(
    ("key", "ours"),
    [
        ("maxOffsetsPerTrigger", "maxMessagesPerTrigger"),
        ("maxoffsetspertrigger", "maxMessagesPerTrigger"),
        ("startingOffsets", "startingPositions"),
        ("subscribe", "streamIds"),
    ],
)
def test_a_kafka_option_is_named_as_spelled_and_ours_given(key: str, ours: str) -> None:
    # The user's spelling, where it survives, is kept (it was recased to a neighbour's:
    # 'maxoffsetsPerTrigger'); a Kafka name gets the name this connector has for it.
    from aeron_spark.connector.options import KAFKA_SPELLINGS, parse_source_options

    with pytest.raises(ConfigurationError) as info:
        parse_source_options({"streamId": "1", key: "5"})
    assert info.value.name in (key, *KAFKA_SPELLINGS)
    assert info.value.name.lower() == key.lower()
    assert f"here it is {ours}" in str(info.value)


@pytest.mark.parametrize(
    ("parse", "options", "name", "store"),
    [
        (
            parse_source_options,
            {"archiveControlStreamId": "10"},
            "archiveControlStreamId",
            "server",
        ),
        (parse_source_options, {"archiveResponseHost": "h"}, "archiveResponseHost", "server"),
        (parse_sink_options, {"archiveStagingChannel": "x"}, "archiveStagingChannel", "server"),
        (parse_archive_source_options, {"consumerId": "c"}, "consumerId", "archive"),
        (parse_archive_source_options, {"readOn": "driver"}, "readOn", "archive"),
        (parse_archive_source_options, {"endingTimestamp": "1"}, "endingTimestamp", "archive"),
    ],
)
def test_an_option_of_another_store_is_refused_naming_option_and_store(
    parse: object, options: dict[str, str], name: str, store: str
) -> None:
    """Issue 29: the options of each store are one section of one module, and an option the
    chosen store does not take is refused at load() with a coded error naming both (before, a
    stream server source called archiveControlStreamId "not a known source option")."""
    from aeron_spark.connector.options import StoreOptionError

    base = {"streamId": "1"}
    if parse is parse_archive_source_options:
        base["archive"] = "aeron:udp?endpoint=127.0.0.1:8010"
    with pytest.raises(StoreOptionError) as info:
        parse(_lowered({**base, **options}))  # type: ignore[operator]
    assert info.value.code == "OPTION_NOT_FOR_STORE"
    assert info.value.name == name
    assert store in info.value.store and f"no {name} with {info.value.store}" in str(info.value)
