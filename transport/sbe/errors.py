"""Exception tree of the SBE engine.

Split as the rest of the project is: :class:`SbeSchemaError` is a schema (or a choice of message)
we cannot use (a configuration error of ours); :class:`SbeDecodeError` is bytes received that are
not a valid message of the schema (the peer's fault); :class:`SbeEncodeError` is a value that does
not fit its field (the caller's rows). Each carries a stable ``code`` and structured ``details``
(``column`` and ``row`` for encode errors, ``index`` and ``template_id`` for decode errors).
"""

from __future__ import annotations

import enum
from typing import Any

from aeron_spark.errors import DetailedError


class SbeErrorCode(enum.IntEnum):
    SCHEMA = 1
    UNKNOWN_MESSAGE = 2
    DECODE = 3
    OTHER_TEMPLATE = 4
    ENCODE = 5


class SbeError(DetailedError):
    """Base class of SBE engine errors."""

    code: SbeErrorCode = SbeErrorCode.SCHEMA

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across Spark's Python workers
        return (_rebuild, (type(self), self.message, self.details))


def _rebuild(cls: type[SbeError], message: str, details: dict[str, Any]) -> SbeError:
    return cls(message, **details)


class SbeSchemaError(SbeError, ValueError):
    """The XML is not a message schema we can use (names the element and what is wrong)."""

    code = SbeErrorCode.SCHEMA


class UnknownMessageError(SbeSchemaError):
    """No message of the schema has this name or template id."""

    code = SbeErrorCode.UNKNOWN_MESSAGE


class SbeDecodeError(SbeError):
    """A message's bytes do not decode (too short, bad header, lengths past its end).
    ``details``: ``index`` (message in the batch) and, when known, ``template_id``."""

    code = SbeErrorCode.DECODE


class OtherTemplateError(SbeDecodeError):
    """A message of another template (or schema) than the one(s) being decoded.
    ``details``: ``index``, ``template_id``, ``schema_id``."""

    code = SbeErrorCode.OTHER_TEMPLATE


class SbeEncodeError(SbeError, ValueError):
    """A value does not fit its field: out of range, too long, or null where required.
    ``details``: ``column`` (dotted path) and ``row`` (index in the batch)."""

    code = SbeErrorCode.ENCODE


__all__ = [
    "OtherTemplateError",
    "SbeDecodeError",
    "SbeEncodeError",
    "SbeError",
    "SbeErrorCode",
    "SbeSchemaError",
    "UnknownMessageError",
]
