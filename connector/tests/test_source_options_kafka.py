"""Kafka's remaining source options in Aeron's words (issue 32 item 6): parsing and refusals."""

from __future__ import annotations

import pytest

from aeron_spark.connector.options import parse_archive_source_options, parse_source_options
from aeron_spark.errors import ConfigurationError

ARCHIVE = "aeron:udp?endpoint=127.0.0.1:8010"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("250", 250),
        ("30s", 30_000),
        ("15m", 900_000),
        ("2min", 120_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("500ms", 500),
        (" 3 s ", 3000),
    ],
)
def test_max_trigger_delay_takes_spark_duration_strings(text: str, ms: int) -> None:
    o = parse_source_options({"streamId": "1", "maxTriggerDelayMs": text})
    assert o.max_trigger_delay_ms == ms


@pytest.mark.parametrize("text", ["15x", "-1", "1.5s", "s", "15 minutes"])
def test_bad_max_trigger_delay_names_the_option_and_the_units(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_source_options({"streamId": "1", "maxTriggerDelayMs": text})
    assert info.value.name == "maxTriggerDelayMs"
    assert '"15m"' in str(info.value)


def test_starting_positions_by_timestamp_and_ending_timestamp_parse() -> None:
    o = parse_source_options(
        {
            "streamId": "1",
            "startingPositionsByTimestamp": '{"3": 1700000000000, "h:1/4": 5}',
            "endingTimestamp": "1700000001000",
        }
    )
    assert o.starting_by_timestamp == {"3": 1_700_000_000_000, "h:1/4": 5}
    assert o.ending_timestamp_ms == 1_700_000_001_000


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"startingPositionsByTimestamp": "latest"}, "startingPositionsByTimestamp"),
        ({"startingPositionsByTimestamp": '{"x": 1}'}, "startingPositionsByTimestamp"),
        ({"startingPositionsByTimestamp": '{"1": -1}'}, "startingPositionsByTimestamp"),
        ({"endingTimestamp": "soon"}, "endingTimestamp"),
    ],
)
def test_bad_timestamp_options_name_what_is_wrong(options: dict, name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_source_options({"streamId": "1", **options})
    assert info.value.name == name


@pytest.mark.parametrize("name", ["startingPositionsByTimestamp", "endingTimestamp"])
def test_archive_mode_refuses_timestamp_options(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_archive_source_options({"archive": ARCHIVE, "streamId": "1", name: '{"1": 1}'})
    assert info.value.name == name
    assert "no per-message time" in str(info.value)
