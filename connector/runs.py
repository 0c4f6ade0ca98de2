"""A run of sink payloads held as one Arrow binary array: no Python object per row.

The sink's ``binary`` and ``text`` formats turn each Arrow batch Spark hands a task into one
:class:`PayloadRun` (the ``value`` column's offsets and data buffers, and the ``reserved_value``
column as int64) instead of a list of ``bytes``. :func:`~aeron_spark.connector.client.batched`
cuts runs into pieces within its byte limit by slicing (zero-copy), a local stage lays the
staging records out from the buffers with numpy
(:func:`~aeron_spark.connector.session.records.records`), and only a stage over the session turns
a piece into the list of ``bytes`` its request carries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True, slots=True)
class PayloadRun:
    """Payloads (``values``: an Arrow ``binary`` array without nulls) and their reserved values
    (int64, one per payload, or None: 0 each)."""

    values: pa.Array
    reserved: np.ndarray | None = None

    @classmethod
    def from_columns(cls, value: pa.Array, reserved: pa.Array | None) -> PayloadRun:
        """From a sink batch's ``value`` column (binary or string; a null is an empty payload)
        and its ``reserved_value`` column (int or bigint; a null is 0), if any."""
        if pa.types.is_string(value.type):
            value = value.view(pa.binary())  # the UTF-8 bytes, as they are
        elif pa.types.is_large_string(value.type):
            value = value.view(pa.large_binary())
        if value.null_count:
            value = pc.fill_null(value, pa.scalar(b"", value.type))
        rvs = None
        if reserved is not None:
            if reserved.null_count:
                reserved = pc.fill_null(reserved, 0)
            rvs = reserved.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return cls(value, rvs)

    def __len__(self) -> int:
        return len(self.values)

    def offsets(self) -> np.ndarray:
        """Where each payload starts in :meth:`data`, and the end (``len + 1`` int64)."""
        n = len(self.values)
        width = 8 if pa.types.is_large_binary(self.values.type) else 4
        raw = self.values.buffers()[1]
        dtype = "<i8" if width == 8 else "<i4"
        offsets = np.frombuffer(raw, dtype=dtype, count=n + 1, offset=self.values.offset * width)
        return offsets.astype(np.int64) - int(offsets[0])

    def data(self) -> np.ndarray:
        """The payloads' bytes, back to back (a view of the array's data buffer)."""
        n = len(self.values)
        if n == 0:
            return np.empty(0, np.uint8)
        width = 8 if pa.types.is_large_binary(self.values.type) else 4
        dtype = "<i8" if width == 8 else "<i4"
        offsets = np.frombuffer(
            self.values.buffers()[1], dtype=dtype, count=n + 1, offset=self.values.offset * width
        )
        first, last = int(offsets[0]), int(offsets[-1])
        buffer = self.values.buffers()[2]
        if buffer is None:
            return np.empty(0, np.uint8)
        return np.frombuffer(buffer, dtype=np.uint8, count=last - first, offset=first)

    @property
    def nbytes(self) -> int:
        """Payload bytes of the run."""
        n = len(self.values)
        if n == 0:
            return 0
        offsets = self.offsets()
        return int(offsets[-1])

    def slice(self, start: int, stop: int) -> PayloadRun:
        return PayloadRun(
            self.values.slice(start, stop - start),
            None if self.reserved is None else self.reserved[start:stop],
        )

    def split(self, limit: int, overhead: int = 0, max_count: int = 0) -> Iterator[PayloadRun]:
        """Consecutive pieces of at most ``limit`` bytes counting ``overhead`` per payload (a
        larger payload alone) and at most ``max_count`` payloads (0: any), as
        :func:`~aeron_spark.connector.client.batched` cuts."""
        n = len(self.values)
        if n == 0:
            return
        offsets = self.offsets()
        cumulative = offsets[1:] + overhead * np.arange(1, n + 1, dtype=np.int64)
        start = 0
        while start < n:
            base = int(cumulative[start - 1]) if start else 0
            stop = int(np.searchsorted(cumulative, base + limit, side="right"))
            stop = max(stop, start + 1)
            if max_count:
                stop = min(stop, start + max_count)
            yield self if start == 0 and stop == n else self.slice(start, stop)
            start = stop

    def payloads(self) -> list[bytes]:
        """The payloads as ``bytes`` (for a request over the session)."""
        return self.values.to_pylist()  # type: ignore[no-any-return]

    def reserved_list(self) -> list[int] | None:
        return None if self.reserved is None else self.reserved.tolist()


__all__ = ["PayloadRun"]
