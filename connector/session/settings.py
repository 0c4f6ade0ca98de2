"""How a client reaches a stream server: :class:`ClientSettings` (the source's and sink's options
carry one; the link opens a session with it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from aeron_spark.errors import ConfigurationError

DEFAULT_ENDPOINT = "127.0.0.1:40123"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach a stream server. Frozen and picklable (Spark ships it to executors).

    ``endpoint``            ``host:port`` of the server's session endpoint
    ``encryption``          seal the session (AES-GCM); must match the server's setting
    ``key_store_dir``       where known server keys live (None: the handshake layer's default)
    ``server_key``          expected server public key (hex), pinning it instead of the key store
    ``trust_on_first_use``  accept and remember an unknown server key
    ``client_key``          this client's identity private key file (64 hex digits, 0600); None:
                            ``client.key`` in the key store (created on first use)
    ``timeout_s``           bound on connecting and on every wait for the server
    ``connect_attempt_timeout_s``  bound on one attempt to open a new session while the client
                            replaces a lost one (attempts go on until ``timeout_s`` is spent;
                            like Kafka's ``socket.connection.setup.timeout.ms``)
    ``max_request_bytes``   publish/stage payloads are sent in requests of about this size
    ``max_in_flight``       requests of one publish/stage sent before waiting for replies
    ``keepalive_interval_s``  a keepalive is sent when the client has been silent this long
    ``max_queued_replay_bytes``  blocks the client's replays, all together, may have waiting
                            for their iterators while it reads the session for something else
                            (other calls, another replay); past it a replay's blocks are
                            dropped, the replay stopped and asked again from its last delivered
                            block when it is read next (``replay_overruns``); the replay being
                            read always takes the block it waits for
    """

    endpoint: str = DEFAULT_ENDPOINT
    encryption: bool = True
    key_store_dir: str | None = None
    server_key: str | None = None
    trust_on_first_use: bool = True
    timeout_s: float = 30.0
    connect_attempt_timeout_s: float = 5.0
    client_key: str | None = None
    max_request_bytes: int = 2 * 1024 * 1024
    max_in_flight: int = 4
    keepalive_interval_s: float = 10.0
    max_queued_replay_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        host, sep, port = self.endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError("endpoint", self.endpoint, "host:port with a port 1..65535")
        if not self.timeout_s > 0:
            raise ConfigurationError("timeout_s", self.timeout_s, "a positive number of seconds")
        attempt = self.connect_attempt_timeout_s
        if isinstance(attempt, bool) or not isinstance(attempt, int | float) or not attempt > 0:
            raise ConfigurationError(
                "connect_attempt_timeout_s", attempt, "a positive number of seconds"
            )
        if self.max_request_bytes < 1024:
            raise ConfigurationError("max_request_bytes", self.max_request_bytes, "at least 1024")
        if self.max_in_flight < 1:
            raise ConfigurationError("max_in_flight", self.max_in_flight, "at least 1")
        if self.max_queued_replay_bytes < 64 * 1024:
            raise ConfigurationError(
                "max_queued_replay_bytes", self.max_queued_replay_bytes, "at least 65536"
            )
        if not self.keepalive_interval_s > 0:
            raise ConfigurationError(
                "keepalive_interval_s", self.keepalive_interval_s, "a positive number of seconds"
            )


__all__ = ["DEFAULT_ENDPOINT", "ClientSettings"]


def add_session_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    timeout_s: float,
    endpoint: bool = True,
    when: str = "",
) -> None:
    """The command line's session options (``--endpoint``, ``--no-encryption``, ``--key-store``,
    ``--server-key``, ``--client-key``, ``--no-trust-on-first-use``, ``--timeout-s``), one
    definition for every command that opens a session (read back by :func:`settings_from_args`).
    ``endpoint=False``: the caller adds ``--endpoint`` itself; ``when``: a condition the flags
    apply under, put before their help text."""
    if endpoint:
        parser.add_argument(
            "--endpoint",
            default=DEFAULT_ENDPOINT,
            help="stream server handshake endpoint host:port (default %(default)s)",
        )
    parser.add_argument(
        "--no-encryption",
        action="store_true",
        help=f"{when}do not seal the session (only for trusted networks)",
    )
    parser.add_argument(
        "--key-store",
        default=None,
        help="key store directory (default $AERON_SPARK_KEY_STORE or ~/.aeron-spark/keys)",
    )
    parser.add_argument(
        "--server-key",
        default=None,
        help="pin the server's public key (hex, from 'aeron-spark keys show' on the server)",
    )
    parser.add_argument(
        "--client-key",
        default=None,
        metavar="FILE",
        help="this client's identity private key file (default: client.key in the key store, "
        "created on first use; 'aeron-spark keys show --client' prints its public key)",
    )
    parser.add_argument(
        "--no-trust-on-first-use",
        action="store_true",
        help="refuse a server whose key is neither pinned nor already known",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=timeout_s,
        help="connect and request timeout in seconds (default %(default)s)",
    )


def settings_from_args(args: argparse.Namespace) -> ClientSettings:
    """The :class:`ClientSettings` the options of :func:`add_session_arguments` name."""
    return ClientSettings(
        endpoint=args.endpoint,
        encryption=not args.no_encryption,
        key_store_dir=args.key_store,
        server_key=args.server_key,
        trust_on_first_use=not args.no_trust_on_first_use,
        timeout_s=args.timeout_s,
        client_key=args.client_key,
    )
