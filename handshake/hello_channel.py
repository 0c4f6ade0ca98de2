"""A client process's HELLO channel to one server, shared by its handshakes.

A handshake starts on two channels (see :mod:`.channels`): a HELLO publication to the server's
port and a subscription to the server's reply stream on its control port. Opening them costs two
sockets, an image on each side and a round trip before the first HELLO may go; closing them
costs end-of-stream status messages on both sides. Aeron's clients keep channels like these
open, and so does this one: one :class:`HelloChannel` per (driver, server channels) carries the
HELLOs of every handshake of this process with that server, from any thread, and hands each
reply to the handshake it names (every reply carries its handshake's connect key).

Lifetime: a channel stays open ``hello_linger_s`` after its last handshake ends (a reaper thread
closes it then); a handshake that fails on the transport (timed out, the server went away)
retires the channel it used; a channel whose server has been silent for longer than its
heartbeats allow is not reused (a server that crashed or restarted gets a fresh channel); a
closed driver's channels are forgotten. With ``hello_linger_s=0`` every handshake has a channel
of its own, closed when it ends (the behaviour before channels were shared).

Resumption: a WELCOME carries, sealed, a token the server keeps for one HELLO from the source
address and port of the HELLO by the same client key (protocol version 5). The channel keeps the
last one for 9 s; the next handshake on it takes it, sends its first HELLO with that token (and
its sealed identity) and skips the COOKIE round trip. A stale, spent or unknown token gets a
COOKIE, as a first HELLO does.

The server answers each HELLO an image carries (its rate limits and pending limits apply per
address and per /24 or /64, not per image), and keeps the host of a live HELLO image on its reply
publication, so a shared channel's reply image lives as long as its HELLO image.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aeron_spark.handshake import messages as m
from aeron_spark.handshake.channels import Channels
from aeron_spark.handshake.errors import ConnectionClosedError, RemoteProtocolError
from aeron_spark.transport import FragmentAssembler

# The server's reply publication heartbeats every joined destination every 100 ms: a reply
# image silent for longer than this is a server that is gone (crashed, restarted elsewhere).
STALE_NS = 1_000_000_000
# A WELCOME's resumption token is valid 10 to 20 s after it was made (two 10 s epochs): used
# for this long, it is never stale when it arrives.
RESUME_FOR_NS = 9_000_000_000
_WAIT_SLICE_S = 0.1  # re-check the handshake's own deadline at least this often


def connect_key_of(data: bytes) -> int | None:
    """The connect key a reply is addressed to (None: not a reply anyone can take)."""
    try:
        message = m.decode_message(data)
    except RemoteProtocolError:
        return None
    if isinstance(message, m.Welcome | m.Refuse | m.Cookie):
        return message.connect_key
    return None


class HelloChannel:
    """The HELLO publication and the reply subscription of this process to one server."""

    def __init__(self, driver: Any, channels: Channels, key: tuple[Any, ...]) -> None:
        self.driver = driver
        self.channels = channels
        self.key = key
        self.users = 0
        self.retired = False
        self.closed = False
        self.was_ready = False  # joined and connected once (set by the first handshake)
        self.idle_deadline_ns = 0
        self.unrouted = 0  # replies for no handshake of ours (others', late or garbage)
        # the replies' image was there once (the server opens its reply publication for our
        # first HELLO, so a new channel has none until then): its loss is the server gone
        self.joined = False
        # (token, server key, use until ns): the last WELCOME's resumption token; it is bound
        # to this channel's HELLO source, so the next handshakes on it skip the COOKIE
        self._resume: tuple[bytes, bytes, int] | None = None
        self._lock = threading.Lock()  # offers on the HELLO publication, polls of the replies
        self._inboxes: dict[int, deque[bytes]] = {}
        self._events: dict[int, threading.Event] = {}
        self.hello_pub = driver.add_publication(channels.hello_pub(), channels.hello_stream)
        try:
            # over UDP the server replies on a publication of this HELLO publication's own
            # (its session id), sent only to this address
            session = self.hello_pub.session_id if channels.media == "udp" else None
            self.replies = driver.add_subscription(
                channels.reply_sub(session), channels.reply_stream
            )
        except BaseException:
            self.hello_pub.close()
            raise
        # IPC data wakes nobody across processes, and an invoker driver runs only when stepped:
        # those wait on the subscription itself (which polls or steps), the others on events
        self._wait_on_subscription = channels.media == "ipc" or driver.is_invoker
        self._assembler = FragmentAssembler(self._route)
        self.replies.add_listener(self._wake_all)

    # ------------------------------------------------------------------ state

    def is_stale(self, now_ns: int) -> bool:
        """Was ready once, and is not, or the server has been silent too long: not reusable."""
        if self.closed or self.driver.is_closed:
            return True
        images = self.replies.images
        if images:
            self.joined = True
        if not self.was_ready or not self.joined:
            return False  # still joining for the handshake that opened it
        if not images or not self.hello_pub.is_connected:
            return True
        last = images[0].last_packet_ns
        return last is not None and now_ns - last > STALE_NS

    def resumption(self, now_ns: int) -> tuple[bytes, bytes] | None:
        """(token, server key) for the next HELLO, if a recent WELCOME gave one; taken (a
        token admits one HELLO: a concurrent handshake on this channel says HELLO without)."""
        with self._lock:
            resume, self._resume = self._resume, None
        if resume is None or now_ns >= resume[2]:
            return None
        return resume[0], resume[1]

    def remember(self, token: bytes, server_key: bytes, now_ns: int) -> None:
        self._resume = (token, server_key, now_ns + RESUME_FOR_NS)

    # ------------------------------------------------------------------ handshakes

    def register(self, connect_key: int) -> None:
        with self._lock:
            self._inboxes[connect_key] = deque()
            self._events[connect_key] = threading.Event()

    def unregister(self, connect_key: int) -> None:
        with self._lock:
            self._inboxes.pop(connect_key, None)
            self._events.pop(connect_key, None)

    def offer(self, message: bytes) -> int:
        with self._lock:
            return self.hello_pub.offer(message)

    def receive(self, connect_key: int, deadline: float, check: Callable[[], None]) -> bytes:
        """The next reply for ``connect_key``; ``check()`` (raises on the handshake's timeout)
        runs between waits. Raises :class:`ConnectionClosedError` if the replies went away."""
        event = self._events[connect_key]
        inbox = self._inboxes[connect_key]
        while True:
            with self._lock:
                if not inbox:
                    self.replies.poll(self._assembler, 16)
                if inbox:
                    return inbox.popleft()
                if self.replies.images:
                    self.joined = True
                elif self.joined:
                    raise ConnectionClosedError(
                        f"the server at {self.channels.host}:{self.channels.port} went away "
                        "during the handshake"
                    )
                event.clear()
            if self.replies.has_data():
                continue  # arrived between the poll and the clear
            check()
            remaining = min(max(deadline - time.monotonic(), 0.0), _WAIT_SLICE_S)
            if self._wait_on_subscription:
                self.replies.wait(remaining)
            else:
                event.wait(remaining)

    def _route(self, payload: Any, header: Any) -> None:
        data = bytes(payload)
        inbox = self._inboxes.get(connect_key_of(data) or 0)
        if inbox is None:
            self.unrouted += 1
        else:
            inbox.append(data)

    def _wake_all(self) -> None:
        for event in list(self._events.values()):
            event.set()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.replies.remove_listener(self._wake_all)
        for resource in (self.hello_pub, self.replies):
            try:
                resource.close()
            except Exception:  # noqa: BLE001 - a closed driver has closed them already
                pass


class _Registry:
    """The open channels of this process, and the thread that closes idle ones."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.channels: dict[tuple[Any, ...], HelloChannel] = {}
        self._reaper: threading.Thread | None = None

    def acquire(self, driver: Any, channels: Channels, shared: bool) -> HelloChannel:
        key = (id(driver), channels)
        with self.lock:
            channel = self.channels.get(key) if shared else None
            if channel is not None and (
                channel.driver is not driver or channel.is_stale(time.monotonic_ns())
            ):
                self._retire(channel)
                channel = None
            if channel is None:
                channel = HelloChannel(driver, channels, key)
                if shared:
                    self.channels[key] = channel
                else:
                    channel.retired = True
            channel.users += 1
            return channel

    def release(self, channel: HelloChannel, ok: bool, linger_s: float) -> None:
        with self.lock:
            channel.users -= 1
            if not ok or linger_s <= 0:
                self._retire(channel)
            if channel.users > 0:
                return
            if channel.retired:
                channel.close()
                return
            channel.idle_deadline_ns = time.monotonic_ns() + int(linger_s * 1e9)
            if self._reaper is None:
                self._reaper = threading.Thread(
                    target=self._reap, name="aeron-spark-hello-reaper", daemon=True
                )
                self._reaper.start()
            self.lock.notify()

    def _retire(self, channel: HelloChannel) -> None:
        """No new handshake takes it; closed once its last one ends."""
        channel.retired = True
        if self.channels.get(channel.key) is channel:
            del self.channels[channel.key]
        if channel.users == 0:
            channel.close()

    def _reap(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic_ns()
                next_ns: int | None = None
                for channel in list(self.channels.values()):
                    if channel.users:
                        continue
                    if channel.idle_deadline_ns <= now or channel.driver.is_closed:
                        self._retire(channel)
                    elif next_ns is None or channel.idle_deadline_ns < next_ns:
                        next_ns = channel.idle_deadline_ns
                self.lock.wait(None if next_ns is None else (next_ns - now) / 1e9 + 0.001)

    def close_all(self) -> None:
        """Close every idle channel now (tests, and a process about to close its driver)."""
        with self.lock:
            for channel in list(self.channels.values()):
                if channel.users == 0:
                    self._retire(channel)


registry = _Registry()

__all__ = ["RESUME_FOR_NS", "STALE_NS", "HelloChannel", "connect_key_of", "registry"]
