"""How a client reaches a stream server: :class:`ClientSettings` (the source's and sink's options
carry one; the link opens a session with it)."""

from __future__ import annotations

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
    ``max_request_bytes``   publish/stage payloads are sent in requests of about this size
    ``max_in_flight``       requests of one publish/stage sent before waiting for replies
    ``keepalive_interval_s``  a keepalive is sent when the client has been silent this long
    """

    endpoint: str = DEFAULT_ENDPOINT
    encryption: bool = True
    key_store_dir: str | None = None
    server_key: str | None = None
    trust_on_first_use: bool = True
    timeout_s: float = 30.0
    client_key: str | None = None
    max_request_bytes: int = 2 * 1024 * 1024
    max_in_flight: int = 4
    keepalive_interval_s: float = 10.0

    def __post_init__(self) -> None:
        host, sep, port = self.endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError("endpoint", self.endpoint, "host:port with a port 1..65535")
        if not self.timeout_s > 0:
            raise ConfigurationError("timeout_s", self.timeout_s, "a positive number of seconds")
        if self.max_request_bytes < 1024:
            raise ConfigurationError("max_request_bytes", self.max_request_bytes, "at least 1024")
        if self.max_in_flight < 1:
            raise ConfigurationError("max_in_flight", self.max_in_flight, "at least 1")
        if not self.keepalive_interval_s > 0:
            raise ConfigurationError(
                "keepalive_interval_s", self.keepalive_interval_s, "a positive number of seconds"
            )


__all__ = ["DEFAULT_ENDPOINT", "ClientSettings"]
