"""An ``aeron:ipc`` publication: appends frames straight into its shared log buffer file.

Same API as the UDP :class:`~aeron_spark.transport.Publication` (``offer``, ``try_claim``,
``offer_blocking``, ``wait_until_connected``, ``position``, ``position_limit``, ``is_connected``,
``close``). The limit is the slowest live subscriber's position plus the window (half a term), read
from the subscribers' slots only when the cached limit is used up, so a plain offer touches no
other process's memory. With no live subscriber ``offer`` returns NOT_CONNECTED, as Aeron's does.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from aeron_spark.transport.api import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    offer_blocking,
)
from aeron_spark.transport.errors import (
    BackPressuredError,
    ClosedError,
)
from aeron_spark.transport.ipc.logfile import STATE_CLOSED, LogFile
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.protocol.term import TermAppender, zero_fill
from aeron_spark.transport.uri import ChannelConfig

HEARTBEAT_INTERVAL_NS = 100_000_000


class IpcPublication:
    """See the module docstring. Thread-safe for concurrent (non-exclusive) use: one lock."""

    def __init__(
        self,
        config: ChannelConfig,
        stream_id: int,
        directory: Path,
        *,
        exclusive: bool = True,
        liveness_timeout_ns: int,
    ) -> None:
        self.channel = "aeron:ipc"
        self.stream_id = stream_id
        self.exclusive = exclusive
        self.liveness_timeout_ns = liveness_timeout_ns
        session_id = config.session_id
        if session_id is None:
            session_id = random.getrandbits(32) - 2**31
        initial_term_id = random.getrandbits(32) - 2**31
        geometry = LogGeometry(config.term_length, config.mtu, initial_term_id)
        self.log = LogFile.create(
            directory,
            term_length=config.term_length,
            mtu=config.mtu,
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
        )
        self.session_id = session_id
        self.initial_term_id = initial_term_id
        self.term_length = config.term_length
        self.mtu = config.mtu
        self.max_message_length = geometry.max_message_length
        self.max_payload_length = geometry.max_payload_length
        self.window = config.publication_window_length or config.term_length // 2
        self._appender = TermAppender(
            geometry, self.log.terms, session_id, stream_id, initial_term_id, 0
        )
        # Readers share the terms, so the term after the current one is cleaned when the current
        # one starts (nobody can be reading it: the window is half a term), never the one a reader
        # may be about to cross into.
        self._appender.clean_on_rotate = False
        self._appender.on_rotate = self._clean_ahead
        self._max_position = (1 << 31) * config.term_length - 1
        self._limit = 0
        self._connected = False
        self._lock = threading.Lock()
        self._closed = False
        self.is_closed_flag = False
        self.log.heartbeat_ns = time.monotonic_ns()
        self._next_heartbeat_ns = 0
        self.local_endpoints: list[tuple[str, int]] = []
        self.destinations: list[tuple[str, int]] = []

    # ---------------------------------------------------------------- state

    @property
    def position(self) -> int:
        return self._appender.position

    @property
    def position_limit(self) -> int:
        return self._limit

    @property
    def sender_position(self) -> int:
        return self._appender.position  # IPC has no sender: written means delivered

    @property
    def is_connected(self) -> bool:
        if not self._closed and not self._connected:
            self._refresh_limit(time.monotonic_ns())
        return self._connected and not self._closed

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _refresh_limit(self, now_ns: int) -> int:
        log = self.log
        positions = [log.read_slot(i)[0] for i in log.live_slots(now_ns, self.liveness_timeout_ns)]
        self._connected = bool(positions)
        self._limit = min(positions) + self.window if positions else 0
        return self._limit

    def _clean_ahead(self, term_id: int, partition: int) -> None:
        zero_fill(self.log.terms[(partition + 1) % 3])

    # ---------------------------------------------------------------- offering

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        if self.exclusive:
            return self._offer(payload, reserved_value)
        with self._lock:
            return self._offer(payload, reserved_value)

    def _offer(self, payload: bytes | bytearray | memoryview, reserved_value: int) -> int:
        if self._closed:
            return CLOSED
        length = len(payload)
        if length > self.max_message_length:
            raise ValueError(
                f"message of {length} bytes is longer than the maximum {self.max_message_length} "
                f"(term-length {self.term_length} / 8)"
            )
        appender = self._appender
        position = appender.position
        need = appender.required_length(length)
        if position + need > self._limit:
            if position + need > self._max_position:
                return MAX_POSITION_EXCEEDED
            if position + need > self._refresh_limit(time.monotonic_ns()):
                return BACK_PRESSURED if self._connected else NOT_CONNECTED
        new_position = appender.append(payload, reserved_value)
        self.log.position = new_position
        return new_position

    def try_claim(self, length: int, reserved_value: int = 0) -> Any:
        """Claim ``length`` bytes: a :class:`BufferClaim`-like object whose ``buffer`` is filled
        and then ``commit()``-ed (here: copied in on commit, which is what makes it visible)."""
        if length > self.max_payload_length:
            raise ValueError(f"try_claim is limited to one fragment ({self.max_payload_length})")
        if self._closed:
            return CLOSED
        need = self._appender.required_length(length)
        if self.position + need > self._limit and (
            self.position + need > self._refresh_limit(time.monotonic_ns())
        ):
            return BACK_PRESSURED if self._connected else NOT_CONNECTED
        return _Claim(self, length, reserved_value)

    def _wait_for_limit(self, deadline: float) -> bool:
        delay = 0.00005
        while time.monotonic() < deadline:
            time.sleep(delay)  # the consumer is another process: nothing to wake us, back off
            delay = min(delay * 2, 0.001)
            if self._refresh_limit(time.monotonic_ns()) > self.position:
                return True
        return False

    def wait_until_connected(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while not self.is_connected:
            if self._closed or time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        return True

    def offer_blocking(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        reserved_value: int = 0,
        timeout_s: float = 10.0,
    ) -> int:
        """Offer, retrying until ``timeout_s`` (``transport.api.offer_blocking``)."""
        return offer_blocking(self, self._wait_for_limit, payload, reserved_value, timeout_s)

    # ---------------------------------------------------------------- driver duty cycle

    def do_work(self, now_ns: int) -> int:
        if self._closed or now_ns < self._next_heartbeat_ns:
            return 0
        self._next_heartbeat_ns = now_ns + HEARTBEAT_INTERVAL_NS
        self.log.heartbeat_ns = now_ns
        self._refresh_limit(now_ns)
        return 1

    def close(self) -> None:
        """End of stream: subscribers drain to ``position``, then the last one removes the file
        (or we do, now, when nobody is subscribed)."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self.log.position = self._appender.position
            self.log.state = STATE_CLOSED
            if not self.log.live_slots(time.monotonic_ns(), self.liveness_timeout_ns):
                self.log.unlink()
            self._appender.terms = []
            self.log.close()

    def __enter__(self) -> IpcPublication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IpcPublication(session_id={self.session_id}, stream_id={self.stream_id})"


class _Claim:
    __slots__ = ("_pub", "buffer", "length", "reserved_value", "_done")

    def __init__(self, pub: IpcPublication, length: int, reserved_value: int) -> None:
        self._pub = pub
        self.buffer = bytearray(length)
        self.length = length
        self.reserved_value = reserved_value
        self._done = False

    def commit(self) -> int:
        if self._done:
            raise ClosedError("claim already committed or aborted")
        self._done = True
        result = self._pub.offer(self.buffer, self.reserved_value)
        if result < 0 and result != ADMIN_ACTION:
            raise BackPressuredError("the claimed space was taken back", "BACK_PRESSURED")
        return result

    def abort(self) -> None:
        self._done = True

    def __enter__(self) -> _Claim:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if not self._done:
            self.abort() if exc_type is not None else self.commit()


__all__ = ["IpcPublication"]
