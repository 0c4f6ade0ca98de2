"""Record the images of a subscription (UDP or IPC) into a :class:`RecordingStore`.

One recording per image (publisher session), created with the image's first message and stopped
when it goes away. Frames are copied as whole raw blocks (``Image.block_poll``), at the image's
stream positions, so a replay by position gives back byte-identical frames::

    store = RecordingStore("/data/archive", fsync=False)
    recorder = Recorder(store, driver.add_subscription("aeron:udp?endpoint=0.0.0.0:40456", 10))
    while running:
        if recorder.do_work(time.monotonic_ns()) == 0:
            recorder.subscription.wait(0.05)
    recorder.close()            # drains what the images hold and stops their recordings

A recording holds whole messages only, so that a reader can take it from its start to its end:

- an image that joins inside a fragmented message (a publisher that was sending one when this
  subscription's process restarted joins where it is) is recorded from its first message on:
  the recording starts at the first BEGIN fragment (or PAD frame), and the fragments before it
  are counted (``head_bytes_skipped``), not recorded (they are no message anyone can read);
- a recording whose image went away inside a fragmented message (its publisher died in the
  middle of one) is cut back to the end of its last whole message before it is stopped
  (``tail_bytes_cut``); :class:`RecordingStore` does the same to a recording a crash left live.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aeron_spark.transport.archive.recordings import Recording, RecordingStore
from aeron_spark.transport.protocol.frames import FRAME_ALIGNMENT, FRAME_HEAD, DataFlags, FrameType
from aeron_spark.transport.protocol.logbuffer import compute_position

BLOCK_BYTES = 4 * 1024 * 1024
BLOCKS_PER_PASS = 16
RETRY_DELAY_NS = 100_000_000
_head_from = FRAME_HEAD.unpack_from  # frame_length, version, flags, type, term_offset
_DATA = int(FrameType.DATA)
_BEGIN = int(DataFlags.BEGIN)


def _term_of(image: Any, position: int) -> tuple[int, int]:
    shift = image.term_length.bit_length() - 1
    term_id = (image.initial_term_id + (position >> shift) + 2**31) % 2**32 - 2**31
    return term_id, position & (image.term_length - 1)


def _message_start(term: Any, offset: int, length: int) -> int:
    """Bytes of the fragments a block starts with that continue a message begun before it
    (DATA frames without the BEGIN flag): where its first message (or PAD frame) starts."""
    i = 0
    while i + 32 <= length:
        frame_length, _v, flags, ftype, _o = _head_from(term, offset + i)
        if frame_length <= 0 or ftype != _DATA or flags & _BEGIN:
            return i
        i += (frame_length + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
    return length


class Recorder:
    """See the module docstring. ``source`` prefixes each recording's source identity."""

    def __init__(
        self,
        store: RecordingStore,
        subscription: Any,
        *,
        source: str = "ingest",
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.store = store
        self.subscription = subscription
        self.source = source
        self.clock = clock
        self._recording: dict[int, tuple[Any, Recording]] = {}  # id(image) -> (image, recording)
        self.images_recorded = 0
        self.bytes_recorded = 0
        self.append_failures = 0  # blocks left in their image because they could not be written
        self.head_bytes_skipped = 0  # an image's first fragments, of a message begun before it
        self.tail_bytes_cut = 0  # an incomplete last message of an image that went away
        self.last_error: str | None = None
        self._retry_at: dict[int, int] = {}  # id(image) -> now_ns of its next try

    def recording_of(self, image: Any) -> Recording | None:
        entry = self._recording.get(id(image))
        return entry[1] if entry is not None else None

    def _start(self, image: Any, position: int, timestamp_ns: int) -> Recording:
        rec = self.store.create(
            image.stream_id,
            image.session_id,
            f"{self.source}:{image.source_identity}",
            image.initial_term_id,
            *_term_of(image, position),
            image.term_length,
            image.mtu,
            timestamp_ns,
        )
        self._recording[id(image)] = (image, rec)
        self.images_recorded += 1
        self.head_bytes_skipped += position - image.join_position
        return rec

    def _drain(self, image: Any, timestamp_ns: int, passes: int | None) -> int:
        shift = image.term_length.bit_length() - 1

        def on_block(term: Any, offset: int, length: int, _session: int, term_id: int) -> None:
            position = compute_position(term_id, offset, shift, image.initial_term_id)
            rec = self.recording_of(image)
            if rec is None:  # the image's first message not seen yet
                skip = _message_start(term, offset, length)
                if skip == length:
                    return  # all of it continues a message begun before the image joined
                rec = self._start(image, position + skip, timestamp_ns)
            skip = rec.recorded_position - position  # a block retried after a failed append
            rec.append(term[offset + skip : offset + length], rec.recorded_position, timestamp_ns)

        work = 0
        while passes is None or work < passes:
            n = image.block_poll(on_block, BLOCK_BYTES)
            if n == 0:
                break
            self.bytes_recorded += n
            work += 1
        return work

    def do_work(self, now_ns: int = 0) -> int:
        """Record what every image holds (bounded per call); start and stop recordings.

        A block that cannot be written (disk full, I/O error, no descriptor) stays in its image
        (``block_poll`` consumes a block only once it is recorded, so the publisher is held back
        by flow control): the failure is counted and that image retried after
        ``RETRY_DELAY_NS``, while the other images go on."""
        timestamp_ns = self.clock()
        now_ns = now_ns or time.monotonic_ns()
        work = 0
        live = set()
        for image in self.subscription.images:
            live.add(id(image))
            if self._retry_at.get(id(image), 0) > now_ns:
                continue
            try:
                work += self._drain(image, timestamp_ns, BLOCKS_PER_PASS)
            except OSError as exc:
                self.append_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._retry_at[id(image)] = now_ns + RETRY_DELAY_NS
                continue
            self._retry_at.pop(id(image), None)
        for key in [k for k in self._retry_at if k not in live]:
            del self._retry_at[key]
        for key in [k for k in self._recording if k not in live]:
            _, rec = self._recording.pop(key)
            self._finish(rec, timestamp_ns)
            work += 1
        return work

    def _finish(self, rec: Recording, timestamp_ns: int) -> None:
        """Stop ``rec`` at the end of its last whole message (see the module docstring)."""
        self.tail_bytes_cut += rec.cut_incomplete_message()
        rec.stop(timestamp_ns)

    def close(self) -> None:
        """Drain what the images already hold, stop their recordings (at their last whole
        message: the rest of one coming in goes to the recording of the image's next life),
        close the subscription."""
        timestamp_ns = self.clock()
        for image, rec in list(self._recording.values()):
            if not image.is_closed:
                try:
                    self._drain(image, timestamp_ns, None)
                except OSError as exc:  # what is left in the image was never acknowledged
                    self.append_failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
            self._finish(rec, timestamp_ns)
        self._recording.clear()
        self.subscription.close()


__all__ = ["Recorder"]
