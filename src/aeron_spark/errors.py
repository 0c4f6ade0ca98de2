"""The root of every exception the project raises on purpose.

Each layer has its own tree below :class:`AeronSparkError` (``transport.errors``,
``handshake.errors``, ``connector.errors``), split, where it matters, into errors of our own making
(``Local...``) and errors caused by the peer or by input we received (``Remote...``).
"""

from __future__ import annotations

from typing import Any


class AeronSparkError(Exception):
    """Base class of all errors raised by aeron-spark."""


class DetailedError(AeronSparkError):
    """An error with a message and structured details, readable as attributes
    (``exc.position`` for ``details["position"]``)."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally: expose the structured details.
        details = self.__dict__.get("details")
        if details is not None and name in details:
            return details[name]
        raise AttributeError(name)


class ConfigurationError(AeronSparkError, ValueError):
    """A configuration value (option, URI parameter, argument) is invalid.

    ``name`` is the option or parameter at fault, ``value`` what was given, ``expected`` a short
    description of what is accepted.
    """

    def __init__(self, name: str, value: object, expected: str) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        super().__init__(f"invalid {name}={value!r}: expected {expected}")
