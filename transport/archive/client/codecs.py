"""Encoding and decoding of the archive control messages with the project's SBE engine.

The message definitions are ``control.xml`` beside this module (our own, written from the
protocol); :mod:`aeron_spark.transport.sbe` turns them into codecs. A request is built from its
fields as keyword arguments; a response is decoded into a dict of its fields (enums as ints).
"""

from __future__ import annotations

import struct
from functools import cache
from importlib import resources
from typing import Any

import pyarrow as pa

from aeron_spark.transport.archive.client.errors import ArchiveProtocolError
from aeron_spark.transport.sbe import MessageCodec, SbeError, Schema, parse_schema

# Aeron 1.47's archive control protocol: semantic version 1.11.0 (major, minor, patch bytes).
PROTOCOL_MAJOR_VERSION = 1
PROTOCOL_MINOR_VERSION = 11
PROTOCOL_PATCH_VERSION = 0
PROTOCOL_SEMANTIC_VERSION = (
    (PROTOCOL_MAJOR_VERSION << 16) | (PROTOCOL_MINOR_VERSION << 8) | PROTOCOL_PATCH_VERSION
)
NULL_VALUE = -1  # "none" for ids and positions (Aeron's NULL_POSITION / NULL_VALUE)
NULL_LENGTH = -1
LENGTH_TO_END = (1 << 63) - 1  # a replay of an active recording that follows it as it grows

_HEADER = struct.Struct("<HHHH")  # blockLength, templateId, schemaId, version

# ControlResponse.code
OK, ERROR, RECORDING_UNKNOWN, SUBSCRIPTION_UNKNOWN = 0, 1, 2, 3
# SourceLocation
LOCAL, REMOTE = 0, 1


def semantic_version_text(version: int) -> str:
    return f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}"


@cache
def schema() -> Schema:
    text = resources.files(__package__).joinpath("control.xml").read_text("utf-8")
    return parse_schema(text)


@cache
def codec(name: str) -> MessageCodec:
    return MessageCodec(schema(), schema().message(name), raw_enums=True)


@cache
def _by_template() -> dict[int, MessageCodec]:
    return {m.id: codec(m.name) for m in schema().messages}


def encode(name: str, **fields: Any) -> bytes:
    """One message (header included) of template ``name`` with ``fields`` (all of them)."""
    c = codec(name)
    columns = {}
    for f in c.arrow_schema:
        if f.name not in fields:
            raise TypeError(f"{name}: missing field {f.name!r}")
        columns[f.name] = pa.array([fields.pop(f.name)], f.type)
    if fields:
        raise TypeError(f"{name}: unknown fields {sorted(fields)}")
    batch = pa.RecordBatch.from_pydict(columns, schema=c.arrow_schema)
    return c.encode(batch)[0]


def template_of(payload: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(templateId, schemaId) of a message."""
    if len(payload) < _HEADER.size:
        raise ArchiveProtocolError(
            f"a control message of {len(payload)} bytes is shorter than the SBE header",
            length=len(payload),
        )
    _, template_id, schema_id, _ = _HEADER.unpack_from(payload)
    return template_id, schema_id


def decode(payload: bytes | bytearray | memoryview) -> tuple[str, dict[str, Any]] | None:
    """(message name, fields) of a response, or None for a message of another schema or a
    template we do not read (the caller counts those)."""
    template_id, schema_id = template_of(payload)
    if schema_id != schema().id:
        return None
    c = _by_template().get(template_id)
    if c is None:
        return None
    try:
        batch, _ = c.decode([bytes(payload)])
    except SbeError as exc:
        raise ArchiveProtocolError(
            f"cannot decode the archive's {c.message.name}: {exc}", template_id=template_id
        ) from exc
    return c.message.name, batch.to_pylist()[0]


__all__ = [
    "ERROR",
    "LENGTH_TO_END",
    "LOCAL",
    "NULL_LENGTH",
    "NULL_VALUE",
    "OK",
    "PROTOCOL_SEMANTIC_VERSION",
    "RECORDING_UNKNOWN",
    "REMOTE",
    "SUBSCRIPTION_UNKNOWN",
    "codec",
    "decode",
    "encode",
    "schema",
    "semantic_version_text",
    "template_of",
]
