"""Simple Binary Encoding (SBE) messages as Arrow columns, and back, without Spark.

codec = sbe.load("schema.xml", "Trade")       # message by name or template id
batch, others = codec.decode(payloads)        # pyarrow.RecordBatch of codec.arrow_schema
payloads = codec.encode(batch)                # one message (header included) per row
"""

from aeron_spark.transport.sbe.codec import MessageCodec, load
from aeron_spark.transport.sbe.errors import (
    OtherTemplateError,
    SbeDecodeError,
    SbeEncodeError,
    SbeError,
    SbeErrorCode,
    SbeSchemaError,
    UnknownMessageError,
)
from aeron_spark.transport.sbe.schema import Schema, parse_schema, schema_text

__all__ = [
    "MessageCodec",
    "OtherTemplateError",
    "SbeDecodeError",
    "SbeEncodeError",
    "SbeError",
    "SbeErrorCode",
    "SbeSchemaError",
    "Schema",
    "UnknownMessageError",
    "load",
    "parse_schema",
    "schema_text",
]
