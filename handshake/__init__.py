"""Secure sessions over the transport, after dorkbox Network and "Echo 2.0".

A client says HELLO on the server's shared handshake channel, the server allocates a private
publication/subscription pair with secret session ids, keys are agreed with X25519 (server key
pinned or trusted on first use) and the session's messages are sealed with AES-GCM::

    from aeron_spark.handshake import Server, ServerConfig, connect
    with Server(ServerConfig(port=40500), on_message=lambda c, m: c.send(m)).start():
        with connect("127.0.0.1:40500") as conn:
            conn.send(b"hello"); print(conn.receive(5.0)); print(conn.ping())
"""

from aeron_spark.handshake.client import Client, connect, shared_driver
from aeron_spark.handshake.config import ClientConfig, ServerConfig
from aeron_spark.handshake.connection import Connection
from aeron_spark.handshake.crypto import SealCounters, fingerprint
from aeron_spark.handshake.errors import (
    AddressDeniedError,
    ClientUnknownError,
    ConnectionClosedError,
    EncryptionRequiredError,
    ErrorCode,
    HandshakeError,
    HandshakeRefusedError,
    HandshakeTimeoutError,
    KeyRefusedError,
    KeyStoreError,
    KeyStoreLockedError,
    LocalProtocolError,
    MalformedHandshakeError,
    RemoteProtocolError,
    ServerFullError,
    ShuttingDownError,
    TooManyConnectionsError,
    TooManyForKeyError,
    TooManyPendingError,
    UnsupportedVersionError,
)
from aeron_spark.handshake.keystore import KeyStore, default_key_store_dir
from aeron_spark.handshake.server import Server

__all__ = [
    "AddressDeniedError",
    "Client",
    "ClientConfig",
    "Connection",
    "ConnectionClosedError",
    "ClientUnknownError",
    "EncryptionRequiredError",
    "ErrorCode",
    "HandshakeError",
    "HandshakeRefusedError",
    "HandshakeTimeoutError",
    "KeyRefusedError",
    "KeyStore",
    "KeyStoreError",
    "KeyStoreLockedError",
    "LocalProtocolError",
    "MalformedHandshakeError",
    "RemoteProtocolError",
    "SealCounters",
    "Server",
    "ServerConfig",
    "ServerFullError",
    "ShuttingDownError",
    "TooManyConnectionsError",
    "TooManyForKeyError",
    "TooManyPendingError",
    "UnsupportedVersionError",
    "connect",
    "default_key_store_dir",
    "fingerprint",
    "shared_driver",
]
