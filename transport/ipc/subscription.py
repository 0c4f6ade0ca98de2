"""An ``aeron:ipc`` subscription: finds publications' log files in the driver directory and reads
them in place, one :class:`IpcImage` per publication (per publishing session).

Same API as the UDP :class:`~aeron_spark.transport.Subscription` (``poll``, ``controlled_poll``,
``images``, ``wait``, ``has_data``, ``is_connected``, ``close``, image callbacks). The driver's
conductor calls :meth:`do_work`: it scans for new log files, heartbeats this subscriber's slots,
and retires images whose publisher closed (once drained) or died (pid gone or heartbeat older than
the liveness timeout; complete frames written before are still delivered first). Each image reads
through the UDP image's own poll code over the mapped terms.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aeron_spark.transport.ipc.logfile import (
    STATE_CLOSED,
    LogFile,
    file_name,
    ipc_directory,
    parse_name,
    pid_alive,
)
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.term import Header
from aeron_spark.transport.uri import ChannelConfig

SCAN_INTERVAL_NS = 20_000_000
LISTING_INTERVAL_NS = 1_000_000_000  # the directory is listed at least this often
MTIME_SETTLED_NS = 100_000_000  # a directory mtime this old is past any coarse clock tick
HEARTBEAT_INTERVAL_NS = 100_000_000


class _ReadState:
    """The attributes :class:`ImageState`'s poll functions use, over a mapped log file."""

    # ImageState's functions run over this object's attributes (it is not an ImageState).
    poll: Any = ImageState.poll
    controlled_poll: Any = ImageState.controlled_poll
    block_poll: Any = ImageState.block_poll

    def __init__(self, log: LogFile, position: int) -> None:
        self.terms = log.terms
        self.term_length = log.term_length
        self.shift = log.term_length.bit_length() - 1
        self.term_mask = log.term_length - 1
        self.initial_term_id = log.initial_term_id
        self.session_id = log.session_id
        self.subscriber_position = position
        self.header = Header(log.initial_term_id, self.shift)


class IpcImage:
    """One IPC publication as seen by one subscription."""

    def __init__(self, log: LogFile, slot: int, position: int, subscription: IpcSubscription):
        self.log = log
        self.slot = slot
        self.subscription = subscription
        self._state = _ReadState(log, position)
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.mtu = log.mtu
        self.join_position = position
        self.source_identity = f"ipc:pid{log.pid}"
        self.closed = False

    @property
    def position(self) -> int:
        return self._state.subscriber_position

    @property
    def is_closed(self) -> bool:
        return self.closed

    @property
    def is_end_of_stream(self) -> bool:
        return self.log.state == STATE_CLOSED and self.position >= self.log.position

    def _after(self, count: int) -> int:
        self.log.set_slot_position(self.slot, self._state.subscriber_position)
        return count

    def poll(self, handler: Any, fragment_limit: int) -> int:
        if self.closed:
            return 0
        return self._after(self._state.poll(handler, fragment_limit))

    def controlled_poll(self, handler: Any, fragment_limit: int) -> int:
        if self.closed:
            return 0
        return self._after(self._state.controlled_poll(handler, fragment_limit))

    def block_poll(self, handler: Any, block_length_limit: int) -> int:
        if self.closed:
            return 0
        return self._after(self._state.block_poll(handler, block_length_limit))

    def has_data(self) -> bool:
        state = self._state
        if self.closed:
            return False
        position = state.subscriber_position
        term = state.terms[(position >> state.shift) % 3]
        offset = position & state.term_mask
        return int.from_bytes(term[offset : offset + 4], "little", signed=True) > 0

    def __repr__(self) -> str:
        return (
            f"IpcImage(session_id={self.session_id}, stream_id={self.stream_id}, "
            f"position={self.position})"
        )


class IpcSubscription:
    """See the module docstring."""

    def __init__(
        self,
        config: ChannelConfig,
        stream_id: int,
        directory: Path,
        *,
        on_available_image: Callable[[IpcImage], object] | None = None,
        on_unavailable_image: Callable[[IpcImage], object] | None = None,
        liveness_timeout_ns: int,
    ) -> None:
        self.channel = "aeron:ipc"
        self.stream_id = stream_id
        self.session_filter = config.session_id
        self.folder = ipc_directory(directory)
        self._name_prefix = file_name(stream_id, 0).rpartition("_")[0] + "_"  # "pub_<stream>_"
        self.liveness_timeout_ns = liveness_timeout_ns
        self._on_available = on_available_image
        self._on_unavailable = on_unavailable_image
        self._images: tuple[IpcImage, ...] = ()
        self._known: set[str] = set()
        self._next_scan_ns = 0
        self._listed_stamp: int | None = None  # the directory's mtime at a complete listing
        self._next_listing_ns = 0
        self._next_heartbeat_ns = 0
        self._round_robin = 0
        self._closed = False
        self._lock = threading.Lock()
        self._listeners: tuple[Callable[[], object], ...] = ()
        self.local_endpoints: list[tuple[str, int]] = []
        self.do_work(time.monotonic_ns())  # publications already there are images at once

    # ---------------------------------------------------------------- driver duty cycle

    def do_work(self, now_ns: int) -> int:
        if self._closed:
            return 0
        work = 0
        with self._lock:
            if self._closed:  # closed while we waited for the lock: a scan now would claim
                return 0  # slots (re-find files close let go of) that nobody ever releases
            if now_ns >= self._next_scan_ns:
                self._next_scan_ns = now_ns + SCAN_INTERVAL_NS
                work += self._scan(now_ns)
            if now_ns >= self._next_heartbeat_ns:
                self._next_heartbeat_ns = now_ns + HEARTBEAT_INTERVAL_NS
                for image in self._images:
                    image.log.set_slot_heartbeat(image.slot, now_ns)
            work += self._retire(now_ns)
        return work

    def _scan(self, now_ns: int) -> int:
        """Open this stream's new log files. The directory is listed only when it changed (its
        mtime) since a listing that left nothing to retry, or a second has passed: listing a
        directory of hundreds of other streams' and dead processes' files 50 times a second
        cost an idle handshake server a tenth of a core."""
        try:
            stamp = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            return 0
        if stamp == self._listed_stamp and now_ns < self._next_listing_ns:
            return 0
        self._listed_stamp = None
        self._next_listing_ns = now_ns + LISTING_INTERVAL_NS
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        added = 0
        retry = False  # a file of ours that may become an image without the directory changing
        # The directory is shared by every stream (and holds what dead processes left): only
        # this stream's names are parsed, the others cost one startswith each.
        prefix = self._name_prefix
        for name in names:
            if not name.startswith(prefix) or name in self._known:
                continue
            ids = parse_name(name)
            if ids is None or ids[0] != self.stream_id:
                continue
            if self.session_filter is not None and ids[1] != self.session_filter:
                continue
            path = self.folder / name
            log = LogFile.open(path)
            if log is None:
                retry = True  # not initialised yet
                continue
            if not log.publisher_live(now_ns, self.liveness_timeout_ns):
                if log.state == STATE_CLOSED or not pid_alive(log.pid):
                    _clean_up_if_abandoned(log, now_ns, self.liveness_timeout_ns)
                else:
                    retry = True  # its publisher lives: its heartbeat may resume
                log.close()
                continue
            position = log.position
            slot = log.claim_slot(position, now_ns, self.liveness_timeout_ns)
            # The publisher may have run on (for other subscribers) before it saw our slot. Within
            # half a term of where we claimed, nothing we have yet to read can have been cleaned
            # (it cleans two terms ahead), so we keep every message from the claim on; further
            # than that, we join at its current position instead.
            latest = log.position
            if latest - position >= log.term_length // 2:
                position = latest
                log.set_slot_position(slot, position)
            image = IpcImage(log, slot, position, self)
            self._known.add(name)
            self._images = (*self._images, image)
            added += 1
            self._notify()
            if self._on_available is not None:
                self._on_available(image)
        # A file created within the same clock tick as the listing may leave the mtime as it
        # was (file times are coarse): only a stamp older than that tick is trusted.
        if not retry and time.time_ns() - stamp > MTIME_SETTLED_NS:
            self._listed_stamp = stamp
        return added

    def _retire(self, now_ns: int) -> int:
        gone = []
        for image in self._images:
            log = image.log
            if log.state == STATE_CLOSED:
                if image.position >= log.position:
                    gone.append(image)
            elif not log.publisher_live(now_ns, self.liveness_timeout_ns) and not image.has_data():
                gone.append(image)  # died: deliver what was complete, then let go
        for image in gone:
            self._drop(image, now_ns)
        return len(gone)

    def _drop(self, image: IpcImage, now_ns: int) -> None:
        image.closed = True
        self._images = tuple(i for i in self._images if i is not image)
        self._known.discard(image.log.path.name)
        self._listed_stamp = None  # its file may be found again (a publisher that resumes)
        image.log.release_slot(image.slot)
        _clean_up_if_abandoned(image.log, now_ns, self.liveness_timeout_ns)
        image.log.close()
        self._notify()
        if self._on_unavailable is not None:
            self._on_unavailable(image)

    # ---------------------------------------------------------------- client API

    @property
    def images(self) -> list[IpcImage]:
        return list(self._images)

    def image_by_session_id(self, session_id: int) -> IpcImage | None:
        return next((i for i in self._images if i.session_id == session_id), None)

    @property
    def is_connected(self) -> bool:
        return bool(self._images)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def poll(self, handler: Any, fragment_limit: int) -> int:
        images = self._images
        if not images:
            return 0
        start = self._round_robin % len(images)
        self._round_robin = start + 1
        total = 0
        for i in range(len(images)):
            total += images[(start + i) % len(images)].poll(handler, fragment_limit - total)
            if total >= fragment_limit:
                break
        return total

    def controlled_poll(self, handler: Any, fragment_limit: int) -> int:
        total = 0
        for image in self._images:
            total += image.controlled_poll(handler, fragment_limit - total)
            if total >= fragment_limit:
                break
        return total

    def has_data(self) -> bool:
        return any(image.has_data() for image in self._images)

    def wait(self, timeout_s: float) -> bool:
        """Until data may be there or the images changed; False on timeout. The publisher is
        another process, so this sleeps in a short back-off (50 us growing to 1 ms)."""
        deadline = time.monotonic() + timeout_s
        images = self._images
        delay = 0.00005
        while True:
            self.do_work(time.monotonic_ns())  # rate-limited scan: works in invoker mode too
            if self.has_data() or self._images is not images:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.001)

    def add_listener(self, listener: Callable[[], object]) -> None:
        """Called when images come or go (data arrival has no cross-process signal: use wait)."""
        self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[], object]) -> None:
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            self._closed = True
            now = time.monotonic_ns()
            for image in self._images:
                self._drop(image, now)

    def __enter__(self) -> IpcSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IpcSubscription(stream_id={self.stream_id}, images={len(self._images)})"


def _clean_up_if_abandoned(log: LogFile, now_ns: int, liveness_ns: int) -> None:
    """Remove a log file nobody will use again: its publisher closed or died and no live
    subscriber still holds a slot."""
    if log.publisher_live(now_ns, liveness_ns):
        return
    if not log.live_slots(now_ns, liveness_ns):
        log.unlink()


__all__ = ["IpcImage", "IpcSubscription"]
