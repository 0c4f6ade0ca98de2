"""Credentials for an Aeron Archive that authenticates its control sessions.

An archive runs an ``Authenticator`` (Java's ``aeron.archive.authenticator.supplier``). It gets
the bytes a client puts in its connect request (``encodedCredentials``) and then either accepts
the session, refuses it (an ERROR response with ``AUTHENTICATION_REJECTED``), or sends a
``Challenge``; the client answers with a ``ChallengeResponse`` carrying new credentials, and the
archive accepts or refuses those. :class:`ArchiveCredentials` is what this client sends: the
encoded credentials and, for archives that challenge, a function from the challenge to the
response (Java's ``CredentialsSupplier``).

The secret never shows: ``repr`` and ``str`` are ``ArchiveCredentials(<hidden>)``, the configs
that hold credentials leave them out of their ``repr``, errors never quote them, and nothing here
logs them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aeron_spark.errors import ConfigurationError

ChallengeHandler = Callable[[bytes], bytes]
MAX_CREDENTIALS_BYTES = 64 * 1024  # the archive's whole connect request must fit one message


class ArchiveCredentials:
    """``encoded``: the bytes of the connect request's ``encodedCredentials`` (a ``str`` is
    UTF-8 encoded); ``on_challenge``: called with the archive's challenge, returns the
    credentials to answer it with (None: a challenge fails the connect with
    :class:`~.errors.ArchiveChallengeError`)."""

    __slots__ = ("_encoded", "_on_challenge")

    def __init__(self, encoded: bytes | str, on_challenge: ChallengeHandler | None = None) -> None:
        if isinstance(encoded, str):
            encoded = encoded.encode("utf-8")
        if not isinstance(encoded, bytes | bytearray | memoryview):
            raise ConfigurationError(
                "credentials", f"<{type(encoded).__name__}>", "bytes or a str (UTF-8 encoded)"
            )
        data = bytes(encoded)
        if len(data) > MAX_CREDENTIALS_BYTES:
            raise ConfigurationError(
                "credentials",
                f"<{len(data)} bytes>",
                f"at most {MAX_CREDENTIALS_BYTES} bytes of encoded credentials",
            )
        if on_challenge is not None and not callable(on_challenge):
            raise ConfigurationError(
                "on_challenge", f"<{type(on_challenge).__name__}>", "a function bytes -> bytes"
            )
        self._encoded = data
        self._on_challenge = on_challenge

    @classmethod
    def from_file(
        cls, path: str | Path, on_challenge: ChallengeHandler | None = None
    ) -> ArchiveCredentials:
        """The credentials held in a file (its bytes, one trailing newline dropped), so a
        secret need not be written into a job's options. A missing or unreadable file is a
        :class:`ConfigurationError` naming the path, never the content."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(
                "archiveCredentialsFile", str(path), problem=f"cannot be read ({exc.strerror})"
            ) from None
        if data.endswith(b"\r\n"):
            data = data[:-2]
        elif data.endswith(b"\n"):
            data = data[:-1]
        return cls(data, on_challenge)

    @classmethod
    def of(cls, value: ArchiveCredentials | bytes | str | None) -> ArchiveCredentials | None:
        """``value`` as credentials (None stays None)."""
        if value is None or isinstance(value, ArchiveCredentials):
            return value
        return cls(value)

    @property
    def encoded(self) -> bytes:
        """The bytes sent in the connect request."""
        return self._encoded

    @property
    def answers_challenges(self) -> bool:
        return self._on_challenge is not None

    def on_challenge(self, challenge: bytes) -> bytes:
        """The credentials answering ``challenge`` (the caller checks
        :attr:`answers_challenges` first)."""
        if self._on_challenge is None:
            raise ConfigurationError("on_challenge", None, "a function to answer challenges")
        answer = self._on_challenge(bytes(challenge))
        if isinstance(answer, str):
            answer = answer.encode("utf-8")
        if not isinstance(answer, bytes | bytearray | memoryview):
            raise TypeError(
                f"the challenge handler returned a {type(answer).__name__}, not bytes or str"
            )
        return bytes(answer)

    def __repr__(self) -> str:
        return "ArchiveCredentials(<hidden>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArchiveCredentials):
            return NotImplemented
        import hmac

        return hmac.compare_digest(self._encoded, other._encoded) and (
            self._on_challenge is other._on_challenge
        )

    def __hash__(self) -> int:
        return hash((type(self), len(self._encoded)))


__all__ = ["MAX_CREDENTIALS_BYTES", "ArchiveCredentials", "ChallengeHandler"]
