"""Session links: the stream server's sessions are handshake connections (``handshake``).

A client connects with :class:`~aeron_spark.handshake.Client` (HELLO on the server's port, replies
and session traffic joined on ``port + 1``, X25519 key agreement, the server's key checked against
the key store or the pinned ``server_key``) and gets a private publication/subscription pair with
secret session ids; messages are sealed with AES-GCM unless both sides turned encryption off.

This module adapts those connections to what the connector needs:

* :class:`Link` (client side): ``send(message, deadline)``, ``receive(deadline)``, ``close``;
* :class:`ServerListener` / :class:`ServerLink` (server side): ``accept(now_ns)``, ``wait``,
  ``receive_nowait``, ``try_send``, all non-blocking for the server's single event loop.

Transport and handshake failures surface as the connector's own errors
(:class:`SessionLostError`, a :class:`ServerUnavailableError`: the client reconnects on it while
its timeout allows); refusals are plain :class:`ServerUnavailableError`, keeping their typed
handshake exception as the cause.

Invariants: a link delivers whole messages, in order, once; ``send`` blocks at most until its
deadline; a link whose peer went away reports ``is_connected == False`` and never blocks again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from aeron_spark.connector.errors import ServerUnavailableError, SessionLostError
from aeron_spark.handshake import (
    Client,
    ClientConfig,
    Connection,
    HandshakeError,
    HandshakeRefusedError,
    Server,
    shared_driver,
)
from aeron_spark.handshake import ServerConfig as HandshakeServerConfig
from aeron_spark.handshake.config import is_loopback
from aeron_spark.handshake.errors import (
    HandshakeTimeoutError,
    KeyStoreError,
    KeyStoreLockedError,
    ServerFullError,
    ShuttingDownError,
    TooManyPendingError,
)
from aeron_spark.transport import Driver, TransportError

SESSION_TERM_LENGTH = 8 * 1024 * 1024
LOOPBACK_MTU = 65504
NETWORK_MTU = 1408  # fits a 1,500-byte path: 8 KiB datagrams were IP-fragmented (issue 15)
log = logging.getLogger(__name__)


class Link(Protocol):
    """What the client needs from a session."""

    max_message_length: int

    @property
    def is_connected(self) -> bool: ...
    def send(self, message: bytes | bytearray | memoryview, deadline: float) -> None: ...
    def receive(self, deadline: float) -> bytes | None: ...
    def close(self) -> None: ...


def session_mtu(host: str) -> int:
    return LOOPBACK_MTU if is_loopback(host) else NETWORK_MTU


class ClientLink:
    """The client side of a session: a handshake :class:`Connection` with deadlines."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.max_message_length = connection.max_message_length
        self.encrypted = connection.encrypted

    @property
    def is_connected(self) -> bool:
        return self.connection.is_connected

    def send(self, message: bytes | bytearray | memoryview, deadline: float) -> None:
        try:
            self.connection.send(message, timeout_s=max(deadline - time.monotonic(), 0.001))
        except (HandshakeError, TransportError, TimeoutError) as exc:
            raise SessionLostError(f"cannot send to the stream server: {exc}") from exc

    def receive(self, deadline: float) -> bytes | None:
        """The next whole message, or None at the deadline or once the session is lost."""
        return self.connection.receive(max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        self.connection.close()


class ServerLink:
    """The server side of one session (non-blocking calls for the server's event loop)."""

    def __init__(self, connection: Connection, server: Server | None = None) -> None:
        self.connection = connection
        self._server = server  # the handshake server that accepted it (its wake-ups)
        connection.deliver_views = True
        self.peer = connection.peer
        self.max_message_length = connection.max_message_length
        # the client's static public key, proven in the handshake
        self.client_key: bytes = getattr(connection, "client_key", b"")

    @property
    def is_connected(self) -> bool:
        return self.connection.is_connected

    @property
    def awaits_receiver(self) -> bool:
        """Lost only by the reply publication, for now (``Connection.awaits_receiver``)."""
        return self.connection.awaits_receiver

    def last_heard_ns(self) -> int | None:
        """When the client's transport last showed it alive (``Connection.last_heard_ns``)."""
        return self.connection.last_heard_ns()

    def receive_nowait(self, poll: bool = True) -> bytes | memoryview | None:
        """The next message, or None: a read-only view of its opened frame (the body is not
        copied out of it). Without ``poll``: only a message an earlier call's poll read."""
        return self.connection.receive_view_nowait(poll)

    @property
    def buffered(self) -> int:
        """Messages an earlier poll read that no receive took yet (given before a poll)."""
        return self.connection.buffered

    @property
    def may_have_more(self) -> bool:
        """The last poll read all it was allowed: more may be waiting beyond it."""
        return self.connection.poll_was_full

    def on_ready(self, callback: Callable[[], object]) -> bool:
        """Have ``callback`` called (from a driver thread: keep it cheap) whenever a message may
        have arrived or the connection's images changed; False when the media cannot tell (IPC
        has no cross-process signal: poll such a link on every pass). From then on the
        callback alone says so: the handshake server's own wake-up for it is removed."""
        sub = self.connection.subscription
        add = getattr(sub, "add_listener", None)
        if add is None or str(getattr(sub, "channel", "")).startswith("aeron:ipc"):
            return False
        add(callback)
        if self._server is not None:
            self._server.stop_waking_for(self.connection)
        return True

    def on_lost(self, callback: Callable[[], object]) -> bool:
        """Have ``callback`` called (from a driver thread: keep it cheap) whenever the
        connection's reply publication may have lost its client (the client's status messages
        timed out, it ended its stream, its address was dropped), the one way the transport
        ends a connection that :meth:`on_ready` does not signal (images coming and going do);
        False when the media cannot tell (IPC): then only asking :attr:`is_connected` tells."""
        add = getattr(self.connection.publication, "add_lost_listener", None)
        return bool(add(callback)) if add is not None else False

    def try_send(self, message: bytes) -> bool:
        try:
            return self.connection.try_send(message)
        except (HandshakeError, TransportError) as exc:
            raise ServerUnavailableError(f"session {self.peer} is gone: {exc}") from exc

    def close(self) -> None:
        self.connection.close()

    def __repr__(self) -> str:
        return f"ServerLink({self.connection!r})"


class ServerListener:
    """Accepts handshake sessions on ``host:port`` (and ``port + 1``; port 0 picks free ones)."""

    def __init__(
        self,
        host: str,
        port: int,
        driver: Driver,
        *,
        encryption: bool = True,
        key_store_dir: str | None = None,
        authorize: Any = None,
        **limits: Any,
    ) -> None:
        self.server = Server(
            HandshakeServerConfig(
                host=host,
                port=port,
                encryption=encryption,
                key_store_dir=key_store_dir,
                **limits,
                session_term_length=SESSION_TERM_LENGTH,
                session_mtu=session_mtu(host),
            ),
            driver=driver,
            on_error=self._on_error,
            authorize=authorize,
        )
        self.endpoint = self.server.endpoint
        self.public_key = self.server.public_key.hex()

    def _on_error(self, conn: Connection | None, exc: BaseException) -> None:
        log.info("session %s: %s", conn.peer if conn is not None else "-", exc)

    @property
    def refused(self) -> int:
        return sum(self.server.core.counters.refused.values())

    def accept(self, now_ns: int) -> list[ServerLink]:
        """Sessions whose handshake completed since the last call."""
        server = self.server
        return [ServerLink(conn, server) for conn in server.accept(now_ns)]

    def wait(self, timeout_s: float) -> None:
        self.server.wait(timeout_s)

    def wake(self) -> None:
        """End :meth:`wait` now (any thread; with an invoker driver, its select too)."""
        self.server.wake()

    def take_wakeup(self) -> bool:
        return self.server.take_wakeup()

    def wait_stepping(self, driver: Driver, timeout_s: float) -> bool:
        """Invoker mode (``driver`` stepped by the caller): sleep in the driver's select and
        step it for what arrives (status messages, heartbeats, NAKs: driver work only) until
        something is for the caller (a wake-up: a session's or a HELLO's data, an image
        change, another thread's :meth:`wake`) or the timeout (bounded by the handshake's own
        deadlines). True when it ended right after a step (the caller's next step may wait);
        the driver's own thread did this in the threaded modes, with two threads handing the
        interpreter lock back and forth for every datagram."""
        server = self.server
        end_ns = time.monotonic_ns() + int(server.wait_bound_s(timeout_s) * 1e9)
        ready = server.is_woken
        stepped = False
        while True:
            remaining_ns = end_ns - time.monotonic_ns()
            if remaining_ns <= 0:
                return stepped
            # (IPC resources' work: step again before any sleep)
            if not (stepped and driver.step_again) and driver.idle(remaining_ns / 1e9, ready):
                return stepped  # woken before it slept (a wake in the select: stepped below)
            driver.do_work()
            stepped = True
            if ready():  # a session's data, a HELLO, another thread's wake-up
                return True

    def stats(self, transport: dict[str, int] | None = None) -> dict[str, Any]:
        return self.server.stats(transport)

    def close(self) -> None:
        self.server.close()


#: Handshake failures a later attempt may not meet: the server did not answer in time (down,
#: restarting, unreachable), was shutting down, or was full for the moment; or the key store's
#: lock was held by another process past the attempt's timeout (it may let go).
_TRANSIENT = (
    HandshakeTimeoutError,
    ShuttingDownError,
    ServerFullError,
    TooManyPendingError,
    KeyStoreLockedError,
)


def open_client_link(settings: Any, driver: Driver | None = None) -> Link:
    """A session for :class:`~aeron_spark.connector.client.ClientSettings`, over ``driver``
    (None: the process's shared driver)."""
    config = ClientConfig(
        encryption=settings.encryption,
        server_key=settings.server_key,
        trust_on_first_use=settings.trust_on_first_use,
        key_store_dir=settings.key_store_dir,
        client_key_file=getattr(settings, "client_key", None),
        timeout_s=settings.timeout_s,
    )
    try:
        connection = Client(config, driver=driver or shared_driver()).connect(settings.endpoint)
    except _TRANSIENT as exc:  # no answer (yet), or a server on its way down: may be retried
        raise SessionLostError(
            f"cannot open a session with the stream server at {settings.endpoint}: {exc}"
        ) from exc
    except (HandshakeRefusedError, KeyStoreError) as exc:  # a refusal: retrying cannot help
        raise ServerUnavailableError(str(exc)) from exc
    except (HandshakeError, TransportError) as exc:
        raise SessionLostError(
            f"cannot open a session with the stream server at {settings.endpoint}: {exc}"
        ) from exc
    return ClientLink(connection)


__all__ = [
    "ClientLink",
    "Link",
    "ServerLink",
    "ServerListener",
    "open_client_link",
    "session_mtu",
    "shared_driver",
]
