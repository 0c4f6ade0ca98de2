"""Session links: how one client and the server exchange whole messages over the transport.

This is the *plain* session layer: a client opens a publication to the server's session port and
a subscription on a port of its own, and introduces itself with a HELLO naming that port; the
server answers on a publication of its own to it with WELCOME. Each client's publication is one
image on the server's session subscription, so the image's session id identifies the session.
Nothing is authenticated or sealed here: it is what runs until the handshake layer's secure
sessions (``aeron_spark.handshake``) are wired in behind the same :class:`Link` interface, and it
stays as the ``encryption=False`` path for trusted networks.

HELLO and WELCOME are control-kind messages (``0x01`` + msgpack), strictly validated:

    HELLO   {"hello": 1, "port": int, "stream_id": int, "mtu": int, "term_length": int}
    WELCOME {"welcome": 1, "max_message_length": int}

Invariants: a link delivers whole messages (fragments reassembled), in order; ``send`` blocks at
most until its deadline; a link whose image or publication goes away reports
``is_connected == False`` and never blocks again.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import random
import threading
import time
from collections import deque
from typing import Any, Protocol

import msgpack
from aeron_spark.connector.errors import ControlProtocolError, ServerUnavailableError
from aeron_spark.transport import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    Driver,
    DriverConfig,
    FragmentAssembler,
    TransportError,
)

SESSION_STREAM_ID = 0x5E55
SESSION_TERM_LENGTH = 8 * 1024 * 1024
SESSION_RECEIVER_WINDOW = SESSION_TERM_LENGTH // 2  # the default 128 KiB caps loopback at ~150 MB/s
LOOPBACK_MTU = 65504
NETWORK_MTU = 8192
_HELLO_KEYS = {"hello", "port", "stream_id", "mtu", "term_length"}
_POLL_FRAGMENTS = 64
log = logging.getLogger(__name__)


class Link(Protocol):
    """What the client needs from a session."""

    max_message_length: int

    @property
    def is_connected(self) -> bool: ...
    def send(self, message: bytes, deadline: float) -> None: ...
    def receive(self, deadline: float) -> bytes | None: ...
    def close(self) -> None: ...


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def session_mtu(host: str) -> int:
    return LOOPBACK_MTU if _is_loopback(host) else NETWORK_MTU


_driver_lock = threading.Lock()
_driver: Driver | None = None


def shared_driver() -> Driver:
    """The process-wide driver all client links share (created on first use)."""
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = Driver(DriverConfig(write_counters_file=False)).start()
            atexit.register(_driver.close)
        return _driver


def _control(body: dict[str, Any]) -> bytes:
    return b"\x01" + msgpack.packb(body, use_bin_type=True)


def _decode_control(message: bytes) -> Any:
    if len(message) < 2 or message[0] != 0x01:
        raise ControlProtocolError("expected a control message")
    try:
        return msgpack.unpackb(
            message[1:],
            raw=False,
            strict_map_key=True,
            max_map_len=16,
            max_str_len=256,
            max_bin_len=256,
            max_array_len=16,
        )
    except (ValueError, msgpack.UnpackException) as exc:
        raise ControlProtocolError(f"undecodable session message: {exc}") from exc


class _Inbox:
    """Whole messages reassembled from fragments, copied out of the term."""

    def __init__(self) -> None:
        self.messages: deque[bytes] = deque()
        self.assembler = FragmentAssembler(self._on_message)

    def _on_message(self, payload: memoryview, header: object) -> None:
        self.messages.append(bytes(payload))


def _offer(pub: Any, message: bytes, deadline: float) -> None:
    try:
        pub.offer_blocking(message, timeout_s=max(deadline - time.monotonic(), 0.001))
    except TransportError as exc:
        raise ServerUnavailableError(f"cannot send to the session peer: {exc}") from exc


class PlainClientLink:
    """The client side of a plain session (see the module docstring)."""

    def __init__(self, endpoint: str, timeout_s: float, driver: Driver | None = None) -> None:
        host, _, port = endpoint.rpartition(":")
        host = host.strip("[]")
        self._driver = driver or shared_driver()
        deadline = time.monotonic() + timeout_s
        mtu = session_mtu(host)
        self._stream_id = random.randrange(1, 2**31)
        bind = "127.0.0.1" if _is_loopback(host) else "0.0.0.0"
        self._inbox = _Inbox()
        self._welcomed = False
        self._sub = self._driver.add_subscription(
            f"aeron:udp?endpoint={bind}:0|rcv-wnd={SESSION_RECEIVER_WINDOW}", self._stream_id
        )
        self._pub = None
        try:
            local_port = self._sub.local_endpoints[0][1]
            self._pub = self._driver.add_publication(
                f"aeron:udp?endpoint={host}:{port}|mtu={mtu}|term-length={SESSION_TERM_LENGTH}",
                SESSION_STREAM_ID,
            )
            if not self._pub.wait_until_connected(max(deadline - time.monotonic(), 0.001)):
                raise ServerUnavailableError(f"no stream server answers at {endpoint}")
            _offer(
                self._pub,
                _control(
                    {
                        "hello": 1,
                        "port": local_port,
                        "stream_id": self._stream_id,
                        "mtu": mtu,
                        "term_length": SESSION_TERM_LENGTH,
                    }
                ),
                deadline,
            )
            welcome = self.receive(deadline)
            if welcome is None:
                raise ServerUnavailableError(f"the stream server at {endpoint} did not welcome us")
            body = _decode_control(welcome)
            if (
                not isinstance(body, dict)
                or body.get("welcome") != 1
                or not isinstance(body.get("max_message_length"), int)
            ):
                raise ControlProtocolError(f"unexpected session reply {body!r:.200}")
            self._welcomed = True
            self.max_message_length = min(
                int(body["max_message_length"]), self._pub.max_message_length
            )
        except BaseException:
            self.close()
            raise
        self._closed = False

    @property
    def is_connected(self) -> bool:
        pub = self._pub
        return pub is not None and not pub.is_closed and pub.is_connected and bool(self._sub.images)

    def send(self, message: bytes, deadline: float) -> None:
        if self._pub is None:
            raise ServerUnavailableError("the session is closed")
        _offer(self._pub, message, deadline)

    def receive(self, deadline: float) -> bytes | None:
        """The next whole message, or None at the deadline or once the session is lost."""
        inbox = self._inbox
        while not inbox.messages:
            if self._sub.poll(inbox.assembler, _POLL_FRAGMENTS) == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._welcomed and not self.is_connected):
                    return None
                self._sub.wait(min(remaining, 0.05))
        return inbox.messages.popleft()

    def close(self) -> None:
        if self._pub is not None:
            self._pub.close()
            self._pub = None
        self._sub.close()


class ServerLink:
    """The server side of one plain session: the client's image and our publication to it."""

    def __init__(self, image: Any, pub: Any, peer: str) -> None:
        self.image = image
        self.pub = pub
        self.peer = peer
        self.max_message_length = pub.max_message_length
        self._inbox = _Inbox()
        self._closed = False

    @property
    def is_connected(self) -> bool:
        return not (
            self._closed or self.image.is_closed or self.pub.is_closed or not self.pub.is_connected
        )

    def receive_nowait(self) -> bytes | None:
        inbox = self._inbox
        if not inbox.messages:
            self.image.poll(inbox.assembler, _POLL_FRAGMENTS)
            if not inbox.messages:
                return None
        return inbox.messages.popleft()

    def try_send(self, message: bytes) -> bool:
        result = self.pub.offer(message)
        if result > 0:
            return True
        if result in (BACK_PRESSURED, ADMIN_ACTION):
            return False
        raise ServerUnavailableError(f"session {self.peer} is gone (offer result {result})")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pub.close()

    def __repr__(self) -> str:
        return f"ServerLink({self.peer})"


class _Pending:
    __slots__ = ("image", "inbox", "pub", "peer", "deadline_ns")

    def __init__(self, image: Any, deadline_ns: int) -> None:
        self.image = image
        self.inbox = _Inbox()
        self.pub: Any = None
        self.peer = image.source_identity
        self.deadline_ns = deadline_ns


class ServerListener:
    """Accepts plain sessions on ``host:port`` (port 0 picks a free one)."""

    HELLO_TIMEOUT_NS = 10_000_000_000

    def __init__(self, host: str, port: int, driver: Driver) -> None:
        self._driver = driver
        self._sub = driver.add_subscription(
            f"aeron:udp?endpoint={host}:{port}|rcv-wnd={SESSION_RECEIVER_WINDOW}", SESSION_STREAM_ID
        )
        bound = self._sub.local_endpoints[0]
        self.endpoint = f"{host}:{bound[1]}"
        self._pending: dict[int, _Pending] = {}
        self._known: set[int] = set()
        self.refused = 0

    def accept(self, now_ns: int) -> list[ServerLink]:
        """Sessions whose HELLO arrived and whose reply publication is connected."""
        accepted: list[ServerLink] = []
        live = {id(image) for image in self._sub.images}
        self._known &= live
        for image in self._sub.images:
            if id(image) not in self._known:
                self._known.add(id(image))
                self._pending[id(image)] = _Pending(image, now_ns + self.HELLO_TIMEOUT_NS)
        for key, pending in list(self._pending.items()):
            try:
                link = self._advance(pending, now_ns)
            except (ControlProtocolError, TransportError):
                self.refused += 1
                link = None
                pending.deadline_ns = 0
            if link is not None:
                accepted.append(link)
                del self._pending[key]
            elif now_ns >= pending.deadline_ns or pending.image.is_closed:
                if pending.pub is not None:
                    pending.pub.close()
                del self._pending[key]
        return accepted

    def _advance(self, pending: _Pending, now_ns: int) -> ServerLink | None:
        if pending.pub is None:
            pending.image.poll(pending.inbox.assembler, 1)
            if not pending.inbox.messages:
                return None
            hello = _decode_control(pending.inbox.messages.popleft())
            if not isinstance(hello, dict) or set(hello) != _HELLO_KEYS or hello["hello"] != 1:
                raise ControlProtocolError(f"bad HELLO {hello!r:.200}")
            for name in ("port", "stream_id", "mtu", "term_length"):
                if not isinstance(hello[name], int):
                    raise ControlProtocolError(f"bad HELLO field {name}")
            ip = pending.image.source_identity.rpartition(":")[0].strip("[]")
            pending.peer = f"{ip}:{hello['port']}"
            host = f"[{ip}]" if ":" in ip else ip
            pending.pub = self._driver.add_publication(
                f"aeron:udp?endpoint={host}:{hello['port']}|mtu={hello['mtu']}"
                f"|term-length={hello['term_length']}",
                hello["stream_id"],
            )
        if not pending.pub.is_connected:
            return None
        link = ServerLink(pending.image, pending.pub, pending.peer)
        if (
            pending.pub.offer(
                _control({"welcome": 1, "max_message_length": link.max_message_length})
            )
            < 0
        ):
            return None
        link._inbox = pending.inbox  # anything the client sent after HELLO
        return link

    def wait(self, timeout_s: float) -> None:
        self._sub.wait(timeout_s)

    def wake(self) -> None:
        """Nothing to do: waits are bounded (at most tens of milliseconds)."""

    def close(self) -> None:
        for pending in self._pending.values():
            if pending.pub is not None:
                pending.pub.close()
        self._pending.clear()
        self._sub.close()


_warned_plain = False


def open_client_link(settings: Any) -> Link:
    """A link for :class:`~aeron_spark.connector.client.ClientSettings` (plain sessions)."""
    global _warned_plain
    if settings.encryption and not _warned_plain:
        _warned_plain = True
        log.warning(
            "encryption was asked for, but this build runs sessions in plain mode "
            "(the handshake layer is not wired in yet): traffic is NOT sealed"
        )
    return PlainClientLink(settings.endpoint, settings.timeout_s)


__all__ = [
    "SESSION_STREAM_ID",
    "Link",
    "PlainClientLink",
    "ServerLink",
    "ServerListener",
    "open_client_link",
    "shared_driver",
]
