"""A streaming sink's bad options: what the README promises is what happens.

Spark 4's Python Data Source API runs no Python at ``writeStream...start()``: the JVM builds the
sink's table from the DataFrame's schema, and ``DataSource.streamWriter()`` (where the options
are parsed) is called on the query's thread when it plans its first micro-batch with data. So
``start()`` returns and the query then stops, naming the option; nothing is written.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.spark


def _start_copy(spark, server, tmp_path: Path, sink_options: dict[str, str]):  # type: ignore[no-untyped-def]
    from aeron_spark.connector.server.testing import client_for

    with client_for(server.endpoint, encryption=True) as client:
        client.publish(50, [f"m{i}".encode() for i in range(100)])
    df = (
        spark.readStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("streamId", 50)
        .load()
        .select("value")
    )
    writer = (
        df.writeStream.format("aeron")
        .option("endpoint", server.endpoint)
        .option("checkpointLocation", str(tmp_path / "ck"))
    )
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    started = time.monotonic()
    query = writer.start()
    return query, started


def _failure(query, started: float) -> str:  # type: ignore[no-untyped-def]
    from pyspark.errors import StreamingQueryException

    try:
        with pytest.raises(StreamingQueryException) as info:
            query.awaitTermination(120)  # bounded: the first batch is planned within seconds
    finally:
        query.stop()
    assert time.monotonic() - started < 120
    return str(info.value)


def test_misspelled_sink_option_stops_the_query_naming_it(spark, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from aeron_spark.connector.server.testing import client_for

    query, started = _start_copy(
        spark, server, tmp_path, {"streamId": "51", "sinkId": "copy", "sinkld": "typo"}
    )
    message = _failure(query, started)
    assert "invalid sinkld='typo'" in message and "a known sink option" in message
    with client_for(server.endpoint, encryption=True) as client:
        assert client.list_recordings(stream_ids=[51]) == []  # nothing was written


def test_missing_sink_id_stops_the_query_naming_it(spark, server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    query, started = _start_copy(spark, server, tmp_path, {"streamId": "52"})
    message = _failure(query, started)
    assert "invalid sinkId=None" in message and "stable sink identity" in message


def test_readme_says_when_streaming_sink_options_are_checked() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (sentence,) = re.findall(r"An unknown or malformed option[^\n]*(?:\n[^\n]+)*", text)
    # start() cannot raise for a streaming sink (see the module docstring): the README must not
    # promise it, and must say where the error shows instead
    assert "first micro-batch" in sentence and "StreamingQueryException" in sentence, sentence
