"""Record the images of a subscription (UDP or IPC) into a :class:`RecordingStore`.

One recording per image (publisher session), created when the image appears and stopped when it
goes away. Frames are copied as whole raw blocks (``Image.block_poll``), at the image's stream
positions, so a replay by position gives back byte-identical frames::

    store = RecordingStore("/data/archive", fsync=False)
    recorder = Recorder(store, driver.add_subscription("aeron:udp?endpoint=0.0.0.0:40456", 10))
    while running:
        if recorder.do_work(time.monotonic_ns()) == 0:
            recorder.subscription.wait(0.05)
    recorder.close()            # drains what the images hold and stops their recordings
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aeron_spark.transport.archive.recordings import Recording, RecordingStore

BLOCK_BYTES = 4 * 1024 * 1024
BLOCKS_PER_PASS = 16
RETRY_DELAY_NS = 100_000_000


def _term_of(image: Any) -> tuple[int, int]:
    shift = image.term_length.bit_length() - 1
    position = image.join_position
    term_id = (image.initial_term_id + (position >> shift) + 2**31) % 2**32 - 2**31
    return term_id, position & (image.term_length - 1)


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
        self.last_error: str | None = None
        self._retry_at: dict[int, int] = {}  # id(image) -> now_ns of its next try

    def recording_of(self, image: Any) -> Recording | None:
        entry = self._recording.get(id(image))
        return entry[1] if entry is not None else None

    def _start(self, image: Any, timestamp_ns: int) -> Recording:
        rec = self.store.create(
            image.stream_id,
            image.session_id,
            f"{self.source}:{image.source_identity}",
            image.initial_term_id,
            *_term_of(image),
            image.term_length,
            image.mtu,
            timestamp_ns,
        )
        self._recording[id(image)] = (image, rec)
        self.images_recorded += 1
        return rec

    def _drain(self, image: Any, rec: Recording, timestamp_ns: int, passes: int | None) -> int:
        def on_block(term: Any, offset: int, length: int, _session: int, _term_id: int) -> None:
            rec.append(term[offset : offset + length], rec.recorded_position, timestamp_ns)

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
                entry = self._recording.get(id(image))
                rec = entry[1] if entry is not None else self._start(image, timestamp_ns)
                work += self._drain(image, rec, timestamp_ns, BLOCKS_PER_PASS)
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
            rec.stop(timestamp_ns)
            work += 1
        return work

    def close(self) -> None:
        """Drain what the images already hold, stop their recordings, close the subscription."""
        timestamp_ns = self.clock()
        for image, rec in list(self._recording.values()):
            if not image.is_closed:
                try:
                    self._drain(image, rec, timestamp_ns, None)
                except OSError as exc:  # what is left in the image was never acknowledged
                    self.append_failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
        self._recording.clear()
        self.subscription.close()


__all__ = ["Recorder"]
