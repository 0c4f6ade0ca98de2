"""An ``aeron:ipc`` publication's log buffer: frames are appended straight into a shared,
memory-mapped log file (:mod:`.logfile`) that subscribers in other processes read in place.

The client API is the media-neutral :class:`~aeron_spark.transport.client.Publication`; this is
its IPC log. The limit (:class:`~aeron_spark.transport.protocol.ipc.PublisherLimit`) is the slowest
live subscriber's position plus the window (half a term), read from the subscribers' slots only
when the cached limit is used up, so a plain offer touches no other process's memory. With no live
subscriber ``offer`` returns NOT_CONNECTED, as Aeron's does. Claims are made in place, as UDP's.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aeron_spark.transport.api import CLOSED, MAX_POSITION_EXCEEDED
from aeron_spark.transport.client import Publication
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.ipc.logfile import STATE_CLOSED, LogFile
from aeron_spark.transport.ipc.waiting import BackoffSignal
from aeron_spark.transport.protocol.ipc import (
    PUBLISHER_HEARTBEAT_INTERVAL_NS,
    Interval,
    PublisherLimit,
)
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.term import TermAppender, zero_fill
from aeron_spark.transport.uri import ChannelConfig

HEARTBEAT_INTERVAL_NS = PUBLISHER_HEARTBEAT_INTERVAL_NS


class IpcPublicationLog:
    """An IPC publication's log file, appender and limit. Offers come under the publication's
    lock when it is concurrent; the driver's conductor calls :meth:`do_work`."""

    # The in-place claim is the UDP publication's own (over this object's terms and appender).
    _claim_frame: Any = PublicationState.claim

    def __init__(
        self, config: ChannelConfig, stream_id: int, directory: Path, liveness_timeout_ns: int
    ) -> None:
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
        self.session_id, self.stream_id = session_id, stream_id
        self.initial_term_id = initial_term_id
        self.term_length, self.mtu = config.term_length, config.mtu
        self.max_message_length = geometry.max_message_length
        self.max_payload_length = geometry.max_payload_length
        self.terms = self.log.terms
        self.state = PublisherLimit(
            config.publication_window_length or config.term_length // 2, config.term_length
        )
        self.signal = BackoffSignal()
        self.spy_notify: tuple[Callable[[], None], ...] = ()  # spies are UDP's
        self.appender = TermAppender(
            geometry, self.log.terms, session_id, stream_id, initial_term_id, 0
        )
        # Readers share the terms, so the term after the current one is cleaned when the current
        # one starts (nobody can be reading it: the window is half a term), never the one a reader
        # may be about to cross into.
        self.appender.clean_on_rotate = False
        self.appender.on_rotate = self._clean_ahead
        self.is_closed = False
        self.local_endpoints: list[tuple[str, int]] = []  # no sockets,
        self.destinations: list[tuple[str, int]] = []  # no destinations
        self.destination_hosts: frozenset[str] = frozenset()
        self.log.heartbeat_ns = time.monotonic_ns()
        self._heartbeat = Interval(HEARTBEAT_INTERVAL_NS)

    # ---------------------------------------------------------------- state

    @property
    def position(self) -> int:
        return self.appender.position

    @property
    def position_limit(self) -> int:
        return self.state.limit

    sender_position = position  # IPC has no sender: written means delivered

    @property
    def is_connected(self) -> bool:
        if not self.is_closed and not self.state.connected:
            self._refresh_limit(time.monotonic_ns())
        return self.state.connected and not self.is_closed

    @property
    def last_status_ns(self) -> int | None:
        """The newest heartbeat of a live subscriber's slot (None: none is live)."""
        if self.is_closed:
            return None
        log, now_ns = self.log, time.monotonic_ns()
        beats = [log.read_slot(i)[1] for i in log.live_slots(now_ns, self.liveness_timeout_ns)]
        return max(beats, default=None)

    def allow_destination_hosts(self, hosts: frozenset[str] | None) -> None:
        raise ChannelError("channel", "aeron:ipc", "a UDP channel (IPC has no destinations)")

    def add_destination(self, endpoint: str) -> None:
        raise ChannelError("channel", "aeron:ipc", "a UDP channel (IPC has no destinations)")

    def _refresh_limit(self, now_ns: int) -> int:
        log = self.log
        live = log.live_slots(now_ns, self.liveness_timeout_ns)
        return self.state.update(log.read_slot(i)[0] for i in live)

    def _clean_ahead(self, term_id: int, partition: int) -> None:
        zero_fill(self.log.terms[(partition + 1) % 3])

    def _refusal(self, end_position: int) -> int:
        """0 if a message ending at ``end_position`` may be written now, else the result code."""
        limit = self.state
        if limit.beyond_max(end_position):
            return MAX_POSITION_EXCEEDED
        if end_position > self._refresh_limit(time.monotonic_ns()):
            return limit.refusal()
        return 0

    # ---------------------------------------------------------------- appending

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int) -> int:
        if self.is_closed:
            return CLOSED
        length = len(payload)
        if length > self.max_message_length:
            raise ValueError(
                f"message of {length} bytes is longer than the maximum {self.max_message_length} "
                f"(term-length {self.term_length} / 8)"
            )
        appender = self.appender
        end = appender.position + appender.required_length(length)
        if end > self.state.limit:
            code = self._refusal(end)
            if code:
                return code
        return appender.append(payload, reserved_value)

    def offer_block(self, block: bytes | bytearray | memoryview) -> int:
        if self.is_closed:
            return CLOSED
        appender = self.appender
        if appender.term_offset >= self.term_length:
            appender.pad_and_rotate()  # nothing left to pad: just the next term
        position = appender.position
        if self.state.beyond_max(position + len(block)):
            return MAX_POSITION_EXCEEDED
        if position >= self.state.limit:  # as Aeron: the block goes if it starts under the limit
            code = self._refusal(position + 1)
            if code:
                return code
        return appender.append_block(block)

    def claim(self, length: int, reserved_value: int) -> tuple[memoryview, int] | int:
        if length > self.max_payload_length:
            raise ValueError(f"try_claim is limited to one fragment ({self.max_payload_length})")
        if self.is_closed:
            return CLOSED
        end = self.appender.position + self.appender.required_length(length)
        if end > self.state.limit:
            code = self._refusal(end)
            if code:
                return code
        claimed: tuple[memoryview, int] = self._claim_frame(length, reserved_value)
        return claimed

    def appended(self) -> None:
        self.log.position = self.appender.position

    def limit_ready(self) -> bool:
        return self.is_closed or self._refresh_limit(time.monotonic_ns()) > self.appender.position

    # ---------------------------------------------------------------- driver duty cycle

    def do_work(self, now_ns: int) -> int:
        if self.is_closed or not self._heartbeat.due(now_ns):
            return 0
        self.log.heartbeat_ns = now_ns
        self._refresh_limit(now_ns)
        return 1

    def next_deadline_ns(self, now_ns: int, poll_ns: int) -> int | None:
        """Its next heartbeat (None once closed). Ten a second even with no subscriber: a
        subscriber that finds the file judges it by its own liveness timeout (as short as
        a second in tests), so the publisher cannot heartbeat less often on its own say."""
        return None if self.is_closed else self._heartbeat.next_ns

    def close(self) -> None:
        """End of stream: subscribers drain to ``position``, then the last one removes the file
        (or we do, now, when nobody is subscribed). The publication holds its lock."""
        if self.is_closed:
            return
        self.is_closed = True
        self.log.position = self.appender.position
        self.log.state = STATE_CLOSED
        if not self.log.live_slots(time.monotonic_ns(), self.liveness_timeout_ns):
            self.log.unlink()
        self.appender.terms = []
        self.terms = []
        self.log.close()


class IpcPublication(Publication):
    """A :class:`~aeron_spark.transport.client.Publication` on ``aeron:ipc`` (see the module)."""

    def __init__(
        self,
        config: ChannelConfig,
        stream_id: int,
        directory: Path,
        *,
        exclusive: bool = True,
        liveness_timeout_ns: int,
    ) -> None:
        log = IpcPublicationLog(config, stream_id, directory, liveness_timeout_ns)
        super().__init__(log, "aeron:ipc", exclusive)
        self.log = log.log
        self.liveness_timeout_ns = liveness_timeout_ns

    def __repr__(self) -> str:
        return f"IpcPublication(session_id={self.session_id}, stream_id={self.stream_id})"


__all__ = ["IpcPublication", "IpcPublicationLog"]
