"""The helper the Spark tests assert errors with accepts exactly the project's error it is given
(no Spark needed: the wrapped text is the one Spark 4 reports for a data source's error)."""

from __future__ import annotations

import pytest

from aeron_spark.connector.errors import (
    ControlProtocolError,
    ServerUnavailableError,
)
from aeron_spark.connector.formats_records import BadRecordError
from aeron_spark.errors import ConfigurationError
from spark_tests._errors import project_error_in, raises_project

WRAPPED = """[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: Traceback \
(most recent call last):
  File "/x/connector/datasource.py", line 70, in writer
    options = parse_sink_options(self.options)
  File "/x/connector/options.py", line 459, in parse_sink_options
    raise ConfigurationError("channel", channel, f"an Aeron channel URI ({exc})") from None
aeron_spark.errors.ConfigurationError: invalid channel='aeron:udp?endpoint=nohost': expected an \
Aeron channel URI (invalid endpoint='nohost': expected host:port)
 SQLSTATE: 38000"""

TASK = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/x/connector/source.py", line 112, in read
    raise BadRecordError(
aeron_spark.connector.formats_records.BadRecordError: position 640 of recording 0 is not a \
msgpack map; set badRecordsPolicy=drop or column
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(...)"""


class Wrapped(Exception):
    """Stands for Spark's AnalysisException / PythonException: only its text matters."""


def test_the_wrapped_class_and_message_are_accepted() -> None:
    assert project_error_in(Wrapped(WRAPPED), ConfigurationError, "invalid channel") is None
    assert project_error_in(Wrapped(TASK), BadRecordError, "not a msgpack map.*badRecords") is None
    with raises_project(ConfigurationError, "endpoint='nohost'"):
        raise Wrapped(WRAPPED)


@pytest.mark.parametrize(
    "cls, match",
    [
        (ControlProtocolError, "invalid channel"),  # another class
        (ControlProtocolError, "msgpack"),  # the base class of the one raised
        (ConfigurationError, "streamId"),  # the right class, another message
    ],
)
def test_another_class_a_base_class_or_another_message_is_refused(cls, match) -> None:
    assert project_error_in(Wrapped(WRAPPED + "\n" + TASK), cls, match) is not None


def test_a_direct_error_must_be_the_class_with_its_code() -> None:
    exc = ServerUnavailableError("no subscriber on aeron:udp?endpoint=127.0.0.1:9")
    assert project_error_in(exc, ServerUnavailableError, "no subscriber") is None
    assert project_error_in(exc, ControlProtocolError, "no subscriber") is not None
    assert project_error_in(RuntimeError("no subscriber"), ServerUnavailableError, "no") is not None
    with pytest.raises(pytest.fail.Exception, match="is not the error raised"):
        with raises_project(ServerUnavailableError, "no subscriber"):
            raise RuntimeError("no subscriber")
