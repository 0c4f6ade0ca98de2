"""A connected session: one private publication/subscription pair, sealed or plain frames.

Not thread-safe, like Aeron's Publication/Subscription it wraps: one thread sends, receives and
pings (a server may poll many connections from its one loop thread). Session frames are a kind byte
and a body (see :mod:`.messages`); sealed sessions wrap each frame with :class:`~.crypto.Sealer`.

Invariants: messages are delivered whole, in order, once; a sealed frame that fails to open
(tampered, replayed or out of order: an injected frame) is counted (``seal_counters``), reported to
``on_error``, never delivered, and ends the session: nothing after it is delivered, the connection
closes (``is_connected`` False, ``close_reason`` and later errors say why), since a sealed stream
cannot resynchronise past a substituted frame; once ``is_connected`` is False it stays False, and
the connection frees its publication and subscription on ``close``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from aeron_spark.handshake.crypto import SEAL_OVERHEAD, Opener, SealCounters, Sealer
from aeron_spark.handshake.errors import ConnectionClosedError, HandshakeError, RemoteProtocolError
from aeron_spark.handshake.messages import FrameKind
from aeron_spark.transport import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    NOT_CONNECTED,
    FragmentAssembler,
    TransportError,
)

log = logging.getLogger(__name__)
_DATA = bytes([FrameKind.DATA])
_PING = bytes([FrameKind.PING])
_PONG = bytes([FrameKind.PONG])
_CLOSE = bytes([FrameKind.CLOSE])
_POLL_FRAGMENTS = 64
#: Polls one ``receive_view_nowait`` makes at most while none completes a message (then None
#: with ``poll_was_full`` set: read again). Frames that are no message (PINGs, PONGs, unknown
#: kinds) complete none: a peer sending them kept one receive reading as long as they came.
MAX_POLLS_PER_RECEIVE = 8
#: The longest a receive (or ping) sleeps before it asks again whether the connection lives: data,
#: a CLOSE, an image going away and (UDP) the publication losing its receiver wake it at once;
#: only what no signal reports (an IPC peer gone silent) is noticed on this re-check. 50 ms
#: slices cost a waiter for a 70 ms reply (the benchmark's client at 2,048 sessions) a wake-up,
#: a poll and a connection check each (issue 31).
_WAIT_SLICE_S = 0.5


class Connection:
    """One end of a session. ``peer`` names the other end (``ip:port`` or ``ipc``)."""

    def __init__(
        self,
        publication: Any,
        subscription: Any,
        *,
        peer: str,
        max_message_length: int,
        sealer: Sealer | None = None,
        opener: Opener | None = None,
        seal_counters: SealCounters | None = None,
        on_disconnect: Callable[[Connection], object] | None = None,
        on_error: Callable[[Connection, BaseException], object] | None = None,
        on_close: Callable[[Connection], object] | None = None,
    ) -> None:
        self.publication = publication
        self.subscription = subscription
        self.peer = peer
        self.encrypted = sealer is not None
        overhead = 1 + (SEAL_OVERHEAD if self.encrypted else 0)
        self.max_message_length = max_message_length - overhead
        self._sealer = sealer
        self._opener = opener
        self.seal_counters = seal_counters or SealCounters()
        self.on_disconnect = on_disconnect
        self.on_error = on_error
        self._on_close = on_close
        self._inbox: deque[bytes | memoryview] = deque()
        self._assembler = FragmentAssembler(self._on_fragment)
        self._pongs: deque[tuple[bytes, int]] = deque()
        # the tokens of this end's pings awaiting their PONG: only those PONGs are kept (a
        # server never pings, and every PONG a client sent stayed in it for the session's life)
        self._pings_out: set[bytes] = set()
        self._closed = False
        self._peer_closed = False
        self._lost_reported = False
        # What the server exempted from the amplification bound for this session (host, session
        # ids): the server sets it after DONE and gives it back when the session ends.
        self.trusted_host: tuple[Any, ...] | None = None
        # server side, UDP: the driver's handles of the sockets of their own it gave the
        # client's addresses (Driver.dedicate_socket; each released once when it ends)
        self.dedicated_sockets: list[Any] = []
        self.close_reason: str | None = None  # why we closed it ourselves (e.g. a forged frame)
        self.messages_sent = 0
        self.messages_received = 0
        self.frames_dropped = 0
        # DATA messages delivered as memoryviews of their frame (bytes-like, read-only: no copy
        # of the body) rather than bytes; for a reader that only reads them (the stream server)
        self.deliver_views = False
        # the last poll read as many fragments as it was allowed: more may be waiting
        self.poll_was_full = False
        # is_connected as the last poll that read nothing found it (receive() does not ask again)
        self._connected_at_poll = True
        # a receive waiting for a reply wakes when the publication loses its peer (a crashed
        # peer's status messages stop: the one loss no image change signals), not at its next
        # re-check slice; IPC cannot tell (False): the slice notices there
        wake = getattr(subscription, "wake", None)
        add_lost = getattr(publication, "add_lost_listener", None)
        if wake is not None and add_lost is not None:
            add_lost(wake)

    # ---------------------------------------------------------------- state

    @property
    def is_connected(self) -> bool:
        if self._closed or self._peer_closed or self.close_reason is not None:
            return False
        sub = self.subscription
        if sub.is_closed or not sub.is_connected:  # images, not a list of them
            return False
        # False for a closed publication too (UDP and IPC alike): no is_closed asked first,
        # three calls through its layers of the stream server's check of every session a
        # second (issue 31)
        return self.publication.is_connected

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def awaits_receiver(self) -> bool:
        """Connected but for the publication, which has no receiver now (the peer's status
        messages lapsed or it ended an image: it may speak again); False when connected, or
        when anything else says the connection is gone (closed, the peer's CLOSE, the
        subscription's image gone)."""
        if self._closed or self._peer_closed or self.close_reason is not None:
            return False
        sub = self.subscription
        if sub.is_closed or not sub.is_connected:
            return False
        return not self.publication.is_connected

    def last_heard_ns(self) -> int | None:
        """When (``time.monotonic_ns``) the peer's transport last showed it alive: the newest
        of its status messages for our publication (its subscription lives) and of its data or
        heartbeats on our subscription's image (its publication lives); over IPC, its
        subscriber's heartbeat. An idle peer's driver sends both every ``idle-sm-interval`` /
        ``idle-heartbeat-interval``: no message of ours, no thread of its application. None:
        nothing heard, or this end is closed. Cheap (no walk), for an occasional check."""
        if self._closed or self.publication.is_closed:
            return None
        heard = self.publication.last_status_ns
        for image in self.subscription.images:
            last = image.last_packet_ns
            if last is not None and (heard is None or last > heard):
                heard = last
        return heard

    def take_lost_report(self) -> bool:
        """True the first time it is called, or ``_check_lost`` found the connection lost: the
        loss is reported once, by whoever takes it."""
        if self._lost_reported:
            return False
        self._lost_reported = True
        return True

    def deliver(self, frame: bytes | bytearray | memoryview) -> None:
        """A whole frame of this session that arrived before the connection existed (the
        handshake kept it): handled as if it came now."""
        self._on_fragment(memoryview(frame), None)

    def _check_lost(self) -> bool:
        """Whether connected; the first time not, the loss is reported."""
        connected = self.is_connected
        if not connected and not self._lost_reported and not self._closed:
            self._lost_reported = True
            if self.on_disconnect is not None:
                self.on_disconnect(self)
        return connected

    # ---------------------------------------------------------------- sending

    def _frame(self, kind: bytes, body: bytes | bytearray | memoryview) -> bytes | memoryview:
        """The frame to offer: sealed into this thread's buffer (valid until its next frame:
        ``offer`` copies it into the log), or ``kind + body``."""
        if self._sealer is not None:
            return self._sealer.seal_frame(kind[0], body)
        return kind + body

    def try_send(self, message: bytes | bytearray | memoryview) -> bool:
        """Offer one message without waiting: False if back-pressured, or while the
        publication awaits its receiver (:attr:`awaits_receiver`): try again later."""
        return self._offer(_DATA, message)

    def _offer(self, kind: bytes, body: bytes | bytearray | memoryview) -> bool:
        if self._closed or self.close_reason is not None:
            raise ConnectionClosedError(self._closed_text())
        if len(body) > self.max_message_length:
            raise ValueError(
                f"message of {len(body)} bytes is longer than {self.max_message_length}"
            )
        sealer = self._sealer
        frame = self._frame(kind, body)
        result = self.publication.offer(frame)
        if result > 0:
            if kind is _DATA:
                self.messages_sent += 1
            return True
        if sealer is not None:
            # The sealed frame was never sent, so its counter (nonce) is unused: take it back.
            sealer.counter -= 1
        if result in (BACK_PRESSURED, ADMIN_ACTION):
            return False
        if result == NOT_CONNECTED and self.awaits_receiver:
            # Aeron's NOT_CONNECTED is "not now": no subscriber at this moment, and one may
            # come (the publication keeps sending its setup). With the peer's own stream alive
            # here (its image, no CLOSE) the peer may be resubscribing or its status messages
            # lapsed: not sent, try again (its owner decides how long: the stream server's
            # grace; ``send`` gives up at once, as the connection is not connected)
            return False
        self._check_lost()
        raise ConnectionClosedError(f"the connection to {self.peer} is lost (offer {result})")

    def send(self, message: bytes | bytearray | memoryview, timeout_s: float = 10.0) -> None:
        """Send one message, waiting up to ``timeout_s`` while back-pressured."""
        self._send_kind(_DATA, message, timeout_s)

    def _send_kind(
        self, kind: bytes, body: bytes | bytearray | memoryview, timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.0001
        while not self._offer(kind, body):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"back-pressured by {self.peer} for {timeout_s:g} s")
            if not self.is_connected:
                self._check_lost()
                raise ConnectionClosedError(f"the connection to {self.peer} is lost")
            time.sleep(min(delay, remaining))  # wait for the peer to consume; bounded back-off
            delay = min(delay * 2, 0.005)

    # ---------------------------------------------------------------- receiving

    def _closed_text(self) -> str:
        if self.close_reason is not None:
            return f"the connection to {self.peer} was closed: {self.close_reason}"
        return f"the connection to {self.peer} is closed"

    def _on_fragment(self, payload: memoryview, header: object) -> None:
        if self.close_reason is not None:
            self.frames_dropped += 1  # after a forged frame nothing more is trusted
            return
        if self._opener is not None:
            try:
                frame = self._opener.open(payload)
            except RemoteProtocolError as failure:
                self.frames_dropped += 1
                self.close_reason = f"a sealed frame failed authentication ({failure})"
                error = ConnectionClosedError(self._closed_text())
                error.__cause__ = failure
                if self.on_error is not None:
                    self.on_error(self, error)
                else:
                    log.warning("session %s: %s", self.peer, error)
                return
        else:
            frame = bytes(payload)
        if not frame:
            self.frames_dropped += 1
            return
        kind = frame[0]
        if kind == FrameKind.DATA:
            self.messages_received += 1
            # the body as a view of the frame (no copy) where the reader takes views
            self._inbox.append(memoryview(frame)[1:] if self.deliver_views else frame[1:])
            return
        body = frame[1:]
        if kind == FrameKind.PING:
            try:
                self._offer(_PONG, body)  # best effort: a lost PONG only times a ping out
            except (HandshakeError, TransportError, ValueError):
                pass
        elif kind == FrameKind.PONG:
            if body in self._pings_out:
                self._pongs.append((body, time.monotonic_ns()))
            else:  # no ping of ours asked for it: dropped, counted
                self.frames_dropped += 1
                self.seal_counters.pongs_unsolicited += 1
        elif kind == FrameKind.CLOSE:
            self._peer_closed = True
            self._check_lost()
        else:
            self.frames_dropped += 1
            exc = RemoteProtocolError(f"unknown session frame kind {kind}")
            if self.on_error is not None:
                self.on_error(self, exc)

    def poll_frames(self, fragment_limit: int = _POLL_FRAGMENTS) -> int:
        """Read up to ``fragment_limit`` fragments into the inbox (handles PING/PONG/CLOSE)."""
        if self._closed:
            return 0
        count = self.subscription.poll(self._assembler, fragment_limit)
        self.poll_was_full = count >= fragment_limit
        if self.close_reason is not None:
            self._check_lost()
            self.close()  # after the poll: never free the subscription from inside it
            return count
        if count == 0:
            self._connected_at_poll = self._check_lost()
        return count

    def receive_view_nowait(self, poll: bool = True) -> bytes | memoryview | None:
        """The next message as it was delivered: a memoryview of its frame with
        ``deliver_views`` (no copy), else bytes; None when no whole message has arrived (a
        poll that read all it was allowed and completed none polls again: None never leaves
        arrived fragments unread; after ``MAX_POLLS_PER_RECEIVE`` polls completing none it
        says None with ``poll_was_full`` set: call again). Without ``poll`` only what an
        earlier poll read is given (a caller woken by the subscription's listener for what
        arrives later: the stream server's loop)."""
        if not self._inbox and not self._closed:
            if not poll:
                return None
            # a poll that read all it was allowed without completing a message polls again:
            # the rest of the message is there (a message of more fragments than a poll
            # takes, made readable at once when a retransmission filled a gap before it), and
            # no signal will come for fragments that already arrived (issue 31: the stream
            # server's loop took None for "nothing left" and the session stalled for good)
            for _ in range(MAX_POLLS_PER_RECEIVE):
                self.poll_frames()
                if self._inbox:
                    break
                if not self.poll_was_full or self._closed:
                    return None
            else:  # cut at the bound: ``poll_was_full`` says more may be waiting
                return None
        return self._inbox.popleft()

    @property
    def buffered(self) -> int:
        """Whole messages an earlier poll read and no receive took yet (a call with ``poll``
        gives these before it polls again)."""
        return len(self._inbox)

    def receive_nowait(self) -> bytes | None:
        message = self.receive_view_nowait()
        return message if message is None or type(message) is bytes else bytes(message)

    def receive(self, timeout_s: float) -> bytes | None:
        """The next message, or None at the timeout or once the connection is lost."""
        deadline = time.monotonic() + timeout_s
        if not self._inbox and not self._closed:
            # Wait before the first poll: a reply is seldom there already when it is asked
            # for, and the wait returns at once when an image has data, the images changed
            # or the subscription closed. Polling first read nothing and asked is_connected
            # through the transport's layers: ~18 of a client's ~90 Python calls a publish
            # (issue 31). A loss is still seen at once: an image going, a CLOSE and a close
            # wake the wait, and the poll after it (reading nothing) asks.
            self.subscription.wait(min(timeout_s, _WAIT_SLICE_S))
        while not self._inbox:
            if self.poll_frames() == 0:
                remaining = deadline - time.monotonic()
                # a poll of a closed connection reads nothing and asks nothing
                if remaining <= 0 or self._closed or not self._connected_at_poll:
                    return None
                self.subscription.wait(min(remaining, _WAIT_SLICE_S))
        message = self._inbox.popleft()
        return message if type(message) is bytes else bytes(message)

    def poll(self, handler: Callable[[bytes], object], limit: int = 64) -> int:
        """Call ``handler(message)`` for up to ``limit`` messages already arrived."""
        delivered = 0
        while delivered < limit:
            message = self.receive_nowait()
            if message is None:
                break
            handler(message)
            delivered += 1
        return delivered

    def __iter__(self) -> Iterator[bytes]:
        """Messages until the connection is closed or lost."""
        while True:
            message = self.receive(1.0)
            if message is not None:
                yield message
            elif not self.is_connected:
                return

    def ping(self, timeout_s: float = 5.0) -> float:
        """Round-trip time in seconds (data arriving meanwhile stays queued for ``receive``)."""
        token = time.monotonic_ns().to_bytes(8, "big")
        sent = time.monotonic_ns()
        self._pings_out.add(token)
        try:
            self._send_kind(_PING, token, timeout_s)
            deadline = time.monotonic() + timeout_s
            while True:
                while self._pongs:
                    body, arrived = self._pongs.popleft()
                    if body == token:
                        return (arrived - sent) / 1e9
                if self.poll_frames() == 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(
                            f"no answer to a ping from {self.peer} in {timeout_s:g} s"
                        )
                    if not self.is_connected:
                        raise ConnectionClosedError(f"the connection to {self.peer} is lost")
                    self.subscription.wait(min(remaining, _WAIT_SLICE_S))
        finally:
            self._pings_out.discard(token)

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Tell the peer (best effort), then free the publication and subscription."""
        if self._closed:
            return
        try:
            if not self._peer_closed and self.publication.is_connected:
                reason, self.close_reason = self.close_reason, None
                try:
                    self._offer(_CLOSE, b"")  # tell the peer, even after a forged frame
                finally:
                    self.close_reason = reason
        except (HandshakeError, TransportError, ValueError):
            pass
        self._closed = True
        self.publication.close()
        self.subscription.close()
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self.is_connected else "closed" if self._closed else "lost"
        sealed = "sealed" if self.encrypted else "plain"
        return f"Connection({self.peer}, {sealed}, {state})"


__all__ = ["Connection"]
