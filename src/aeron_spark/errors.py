"""The root of every exception the project raises on purpose.

Each layer has its own tree below :class:`AeronSparkError` (``transport.errors``,
``handshake.errors``, ``connector.errors``), split, where it matters, into errors of our own making
(:class:`LocalProtocolError`) and errors caused by the peer or by input we received
(:class:`RemoteProtocolError`). Those two bases live here, once: each layer's protocol errors
subclass them (``transport.errors.RemoteProtocolError`` is a ``TransportError`` and an
``aeron_spark.errors.RemoteProtocolError``), so ``except RemoteProtocolError`` at the top catches
what any layer's peer did wrong, as h11/h2 split theirs.
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


class LocalProtocolError(AeronSparkError):
    """We were asked to do something the protocol does not allow (a bug or misuse on our side)."""


class RemoteProtocolError(AeronSparkError):
    """A peer sent something that is not valid protocol (malformed, oversized, unexpected)."""


class ConfigurationError(AeronSparkError, ValueError):
    """A configuration value (option, URI parameter, argument) is invalid.

    ``name`` is the option or parameter at fault, ``value`` what was given, ``expected`` a short
    description of what is accepted (``invalid name='value': expected ...``); or, where what is
    wrong is better said as a sentence of its own (a file that cannot be read, a syntax error),
    ``problem`` says it (``invalid name='value': <problem>``).
    """

    def __init__(
        self, name: str, value: object, expected: str = "", *, problem: str | None = None
    ) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        self.problem = problem
        says = problem if problem is not None else f"expected {expected}"
        super().__init__(f"invalid {name}={value!r}: {says}")
