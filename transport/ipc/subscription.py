"""An ``aeron:ipc`` subscription's media: finds publications' log files in the driver directory
and reads them in place, one image per publication (per publishing session).

The client API is the media-neutral :class:`~aeron_spark.transport.client.Subscription`. The
driver's conductor steps :meth:`IpcSubscriptionMedia.do_work` (through the subscription): it scans
for new log files, heartbeats this subscriber's slots, and retires images whose publisher closed
(once drained) or died (pid gone or heartbeat older than the liveness timeout; complete frames
written before are still delivered first). When, and whether, is decided by the sans-I/O
:mod:`aeron_spark.transport.protocol.ipc`. Each image's log (:class:`IpcImageLog`) reads through
the UDP image's own poll code over the mapped terms.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aeron_spark.transport.client import Image, Subscription
from aeron_spark.transport.ipc.logfile import (
    STATE_CLOSED,
    LogFile,
    file_name,
    ipc_directory,
    parse_name,
    pid_alive,
)
from aeron_spark.transport.ipc.waiting import BackoffSignal
from aeron_spark.transport.ipc.watch import DirectoryWatch
from aeron_spark.transport.protocol import ipc as rules
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.term import Header
from aeron_spark.transport.uri import ChannelConfig

SCAN_INTERVAL_NS = rules.SCAN_INTERVAL_NS
HEARTBEAT_INTERVAL_NS = rules.SUBSCRIBER_HEARTBEAT_INTERVAL_NS
LISTING_INTERVAL_NS = 1_000_000_000  # the directory is listed at least this often
MTIME_SETTLED_NS = 100_000_000  # a directory mtime this old is past any coarse clock tick


class IpcImageLog:
    """One IPC publication's log as one subscriber reads it: the attributes
    :class:`ImageState`'s poll functions use, over the mapped file, and this subscriber's slot."""

    # ImageState's functions run over this object's attributes (it is not an ImageState).
    poll: Any = ImageState.poll
    controlled_poll: Any = ImageState.controlled_poll
    block_poll: Any = ImageState.block_poll

    def _consumed(self) -> None:
        """After a poll (the borrowed ones call it): the publisher reads our position itself."""

    def __init__(self, log: LogFile, slot: int, position: int) -> None:
        self.log = log
        self.slot = slot
        self.terms = log.terms
        self.term_length = log.term_length
        self.shift = log.term_length.bit_length() - 1
        self.term_mask = log.term_length - 1
        self.initial_term_id = log.initial_term_id
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.mtu = log.mtu
        self.join_position = position
        self.source_identity = f"ipc:pid{log.pid}"
        self.subscriber_position = position
        self.header = Header(log.initial_term_id, self.shift)

    @property
    def is_end_of_stream(self) -> bool:
        return self.log.state == STATE_CLOSED and self.subscriber_position >= self.log.position

    def has_data(self) -> bool:
        terms = self.terms
        if not terms:
            return False  # let go of
        position = self.subscriber_position
        term = terms[(position >> self.shift) % 3]
        offset = position & self.term_mask
        return int.from_bytes(term[offset : offset + 4], "little", signed=True) > 0

    def publish_position(self) -> None:
        self.log.set_slot_position(self.slot, self.subscriber_position)

    def publisher_live(self, now_ns: int, liveness_timeout_ns: int) -> bool:
        return self.log.publisher_live(now_ns, liveness_timeout_ns)

    def retired(self, now_ns: int, liveness_timeout_ns: int) -> bool:
        log = self.log
        return rules.image_retired(
            log.state,
            self.subscriber_position,
            log.position,
            lambda: log.publisher_live(now_ns, liveness_timeout_ns),
            self.has_data,
        )

    def release(self, now_ns: int, liveness_timeout_ns: int) -> None:
        self.log.release_slot(self.slot)
        _clean_up_if_abandoned(self.log, now_ns, liveness_timeout_ns)
        self.terms = []
        self.log.close()


class IpcSubscriptionMedia:
    """See the module docstring. ``_lock`` serialises the conductor's duty cycle and closing."""

    def __init__(
        self,
        config: ChannelConfig,
        stream_id: int,
        directory: Path,
        liveness_timeout_ns: int,
        on_error: Callable[[BaseException], object] | None = None,
        watch: DirectoryWatch | None = None,
    ) -> None:
        self.stream_id = stream_id
        # the driver's inotify watch of the directory: with it, no image and no file waiting
        # to be ready, the subscription has no deadline (a new log file wakes the driver)
        self._watch = watch
        self._watched = -1  # the watch's generation at the last scan
        self._retry = True  # a scan left a file of ours to look at again (or none ran yet)
        self.session_filter = config.session_id
        self.folder = ipc_directory(directory)
        self._name_prefix = file_name(stream_id, 0).rpartition("_")[0] + "_"  # "pub_<stream>_"
        self.liveness_timeout_ns = liveness_timeout_ns
        self._on_error = on_error
        self._known: set[str] = set()
        self._scan_due = rules.Interval(SCAN_INTERVAL_NS)
        self._heartbeat_due = rules.Interval(HEARTBEAT_INTERVAL_NS)
        self._listed_stamp: int | None = None  # the directory's mtime at a complete listing
        self._next_listing_ns = 0
        self._closed = False
        self._lock = threading.Lock()
        self._subscription: Subscription | None = None
        self.signal = BackoffSignal(self.do_work)  # rate-limited scan: works in invoker mode too

    def attach(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self.do_work(time.monotonic_ns())  # publications already there are images at once

    def after_poll(self, log: IpcImageLog) -> None:
        log.publish_position()

    def record_error(self, exc: BaseException) -> None:
        if self._on_error is None:
            raise exc
        self._on_error(exc)

    # ---------------------------------------------------------------- driver duty cycle

    def do_work(self, now_ns: int) -> int:
        if self._closed:
            return 0
        work = 0
        with self._lock:
            if self._closed:  # closed while we waited for the lock: a scan now would claim
                return 0  # slots (re-find files close let go of) that nobody ever releases
            watch = self._watch
            if watch is None or watch.broken:
                if self._scan_due.due(now_ns):
                    work += self._scan(now_ns)
            elif (watch.generation != self._watched or self._retry) and self._scan_due.due(now_ns):
                self._watched = watch.generation  # before the listing: a later change rescans
                work += self._scan(now_ns)
            if self._heartbeat_due.due(now_ns):
                for image in self._images():
                    image.log.set_slot_heartbeat(image.slot, now_ns)
            work += self._retire(now_ns)
        return work

    def next_deadline_ns(self, now_ns: int, poll_ns: int) -> int | None:
        """When the driver must step it next without new input (None: not before a change of
        the directory wakes the driver). ``poll_ns``: the driver's duty interval for an IPC
        resource that cannot tell (images: their data and their publishers' ends are polled)."""
        if self._closed:
            return None
        if self._subscription is not None and self._subscription.is_connected:
            return now_ns + poll_ns
        watch = self._watch
        if watch is None or watch.broken or watch.generation != self._watched or self._retry:
            return max(self._scan_due.next_ns, now_ns + poll_ns)
        return None

    def _images(self) -> list[IpcImageLog]:
        assert self._subscription is not None
        return self._subscription.image_logs()  # type: ignore[return-value]

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
            self._retry = False
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
            log = LogFile.open(self.folder / name)
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
            claimed = log.position
            slot = log.claim_slot(claimed, now_ns, self.liveness_timeout_ns)
            position = rules.join_position(claimed, log.position, log.term_length)
            if position != claimed:
                log.set_slot_position(slot, position)
            self._known.add(name)
            added += 1
            assert self._subscription is not None
            self._subscription.image_available(IpcImageLog(log, slot, position))
        # A file created within the same clock tick as the listing may leave the mtime as it
        # was (file times are coarse): only a stamp older than that tick is trusted.
        if not retry and time.time_ns() - stamp > MTIME_SETTLED_NS:
            self._listed_stamp = stamp
        self._retry = retry
        return added

    def _retire(self, now_ns: int) -> int:
        gone = [i for i in self._images() if i.retired(now_ns, self.liveness_timeout_ns)]
        for image in gone:
            self._drop(image, now_ns)
        return len(gone)

    def _drop(self, image: IpcImageLog, now_ns: int) -> None:
        assert self._subscription is not None
        self._known.discard(image.log.path.name)
        self._listed_stamp = None  # its file may be found again (a publisher that resumes)
        self._retry = True
        try:
            self._subscription.image_unavailable(image)
        finally:
            image.release(now_ns, self.liveness_timeout_ns)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            now = time.monotonic_ns()
            for image in self._images():
                self._drop(image, now)


class IpcSubscription(Subscription):
    """A :class:`~aeron_spark.transport.client.Subscription` on ``aeron:ipc`` (see the module)."""

    def __init__(
        self,
        config: ChannelConfig,
        stream_id: int,
        directory: Path,
        *,
        on_available_image: Callable[[Image], object] | None = None,
        on_unavailable_image: Callable[[Image], object] | None = None,
        liveness_timeout_ns: int,
        on_error: Callable[[BaseException], object] | None = None,
        watch: DirectoryWatch | None = None,
    ) -> None:
        media = IpcSubscriptionMedia(
            config, stream_id, directory, liveness_timeout_ns, on_error, watch
        )
        super().__init__("aeron:ipc", stream_id, on_available_image, on_unavailable_image, media)

    def __repr__(self) -> str:
        return f"IpcSubscription(stream_id={self.stream_id}, images={len(self._images)})"


IpcImage = Image  # what an IPC subscription's images are (the one client Image)


def _clean_up_if_abandoned(log: LogFile, now_ns: int, liveness_ns: int) -> None:
    """Remove a log file nobody will use again: its publisher closed or died and no live
    subscriber still holds a slot."""
    if log.publisher_live(now_ns, liveness_ns):
        return
    if not log.live_slots(now_ns, liveness_ns):
        log.unlink()


__all__ = ["IpcImage", "IpcImageLog", "IpcSubscription", "IpcSubscriptionMedia"]
