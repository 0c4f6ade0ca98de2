"""The root of every exception the project raises on purpose.

Each layer has its own tree below :class:`AeronSparkError` (``transport.errors``,
``handshake.errors``, ``connector.errors``), split, where it matters, into errors of our own making
(``Local...``) and errors caused by the peer or by input we received (``Remote...``).
"""

from __future__ import annotations


class AeronSparkError(Exception):
    """Base class of all errors raised by aeron-spark."""


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
