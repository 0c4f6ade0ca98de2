"""Option errors through Spark (issue 33, item 8): raised by ``load()`` itself, naming the option
as the user spelled it although Spark hands it over in lower case."""

from __future__ import annotations

import pytest

from aeron_spark.errors import ConfigurationError
from spark_tests._errors import raises_project

pytestmark = pytest.mark.spark


def _reader(spark, server, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("aeron").option("endpoint", server.endpoint).option("streamId", 1)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def test_a_misspelled_option_fails_load_naming_it_as_spelled(spark, server) -> None:  # type: ignore[no-untyped-def]
    with raises_project(
        ConfigurationError,
        r"invalid maxMessagesPerTriger='5': not a known source option: "
        r"did you mean maxMessagesPerTrigger\?",
    ):
        _reader(spark, server, maxMessagesPerTriger="5").load()  # load(), no action


def test_a_schema_that_is_not_ddl_fails_load_naming_the_schema_option(spark, server) -> None:  # type: ignore[no-untyped-def]
    with raises_project(ConfigurationError, r"invalid schema='id lng': not Spark DDL"):
        _reader(spark, server, format="json", schema="id lng").load()


def test_archive_credentials_are_redacted_from_plans(spark, capsys) -> None:  # type: ignore[no-untyped-def]
    """archiveCredentials is shown in a streaming query's plan (the options of its
    StreamingRelationV2) redacted by Spark's default spark.redaction.regex, whose ``credential``
    it matches (Spark 4: ``(?i)secret|password|token|access[.]?key|credential``); a batch read's
    plan does not list the options. Nothing here reaches an archive (explain does not plan the
    partitions)."""
    secret = "plan-secret-7f3a9c"
    for reader in (spark.read, spark.readStream):
        df = (
            reader.format("aeron")
            .option("archive", "aeron:udp?endpoint=127.0.0.1:9")
            .option("streamId", 1)
            .option("archiveCredentials", secret)
            .load()
        )
        df.explain(True)
    shown = capsys.readouterr().out
    assert "archiveCredentials=*********(redacted)" in shown  # the streaming relation's options
    assert secret not in shown
