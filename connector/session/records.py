"""The part-file record format, shared by the server's staging and a client's local stage.

A part file (``staged/<sink>/<batch>/<partition>-<attempt>.part``) is a sequence of records
``length (uint32) | reserved value (int64) | payload``. The server writes them for a session's
``stage`` calls; a task on the server's host writes them itself (``connector.local``); the
server reads them back when it commits the batch.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Generator, Sequence
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from aeron_spark.connector.errors import StagedDataMissingError

RECORD = struct.Struct("<Iq")


@runtime_checkable
class PayloadBuffers(Protocol):
    """Payloads held as one buffer, not one object each: what :func:`records` lays out with
    numpy. The sink's :class:`~aeron_spark.connector.runs.PayloadRun` (an Arrow binary array) is
    one; naming it here, not importing it, keeps pyarrow out of the server, which stages lists."""

    @property
    def reserved(self) -> npt.NDArray[Any] | None:
        """One int64 reserved value per payload, or None (0 each)."""

    def __len__(self) -> int: ...

    def offsets(self) -> npt.NDArray[Any]:
        """Where each payload starts in :meth:`data`, and the end (``len + 1`` int64)."""

    def data(self) -> npt.NDArray[Any]:
        """The payloads' bytes, back to back (uint8)."""


_MIN_UNIFORM_RUN = 64
_LARGE_PAYLOAD = 4096  # from this average size on, staged payloads are written as they are


def records(
    payloads: Sequence[bytes] | PayloadBuffers, reserved_values: Sequence[int] | None
) -> list[bytes | bytearray | memoryview]:
    """The staging file's records (length, reserved value, payload) of one stage call, as the
    pieces to write: runs of equal payloads built with numpy, large payloads (Arrow messages)
    as they are beside their record headers (no gathering copy), small ones gathered. A
    :class:`PayloadBuffers` (a sink's payload run, its own reserved values) is laid out from its
    buffers with numpy."""
    # a list (what every stage request carries) skips the protocol's check: ~50 us on 3.11
    if not isinstance(payloads, list) and isinstance(payloads, PayloadBuffers):
        return [_run_records(payloads)]
    lengths = list(map(len, payloads))
    if len(lengths) >= _MIN_UNIFORM_RUN and min(lengths) == max(lengths):  # built with numpy
        count, length = len(lengths), lengths[0]
        rows = np.empty((count, RECORD.size + length), dtype=np.uint8)
        rows[:, :4] = np.frombuffer(struct.pack("<I", length), dtype=np.uint8)
        rvs = (
            np.zeros(count, dtype="<i8")
            if reserved_values is None
            else np.asarray(reserved_values, dtype="<i8")
        )
        rows[:, 4:12] = rvs.view(np.uint8).reshape(count, 8)
        rows[:, 12:] = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(count, length)
        return [rows.reshape(-1).data]  # written as it is, not copied
    pack = RECORD.pack
    rv_list = reserved_values if reserved_values is not None else [0] * len(payloads)
    if payloads and sum(lengths) >= _LARGE_PAYLOAD * len(payloads):
        pieces: list[bytes | bytearray | memoryview] = []
        for payload, rv in zip(payloads, rv_list, strict=True):
            pieces += (pack(len(payload), rv), payload)
        return pieces
    buf = bytearray()
    for payload, rv in zip(payloads, rv_list, strict=True):
        buf += pack(len(payload), rv)
        buf += payload
    return [buf]


def _run_records(run: PayloadBuffers) -> memoryview:
    """The records of a payload run, built from its buffers without a Python object per
    payload (the same bytes as ``records(run.payloads(), run.reserved_list())``)."""
    count = len(run)
    offsets = run.offsets()
    data = run.data()
    lengths = np.diff(offsets)
    rvs = np.zeros(count, dtype="<i8") if run.reserved is None else run.reserved.astype("<i8")
    if count and int(lengths.min()) == int(lengths.max()):  # equal lengths: one 2-D copy
        length = int(lengths[0])
        rows = np.empty((count, RECORD.size + length), dtype=np.uint8)
        rows[:, :4] = np.frombuffer(struct.pack("<I", length), dtype=np.uint8)
        rows[:, 4:12] = rvs.view(np.uint8).reshape(count, 8)
        rows[:, 12:] = data.reshape(count, length)
        return rows.reshape(-1).data
    header = np.empty((count, RECORD.size), dtype=np.uint8)
    header[:, :4] = lengths.astype("<u4").view(np.uint8).reshape(count, 4)
    header[:, 4:12] = rvs.view(np.uint8).reshape(count, 8)
    out = np.empty(len(data) + count * RECORD.size, dtype=np.uint8)
    starts = offsets[:-1] + RECORD.size * np.arange(count, dtype=np.int64)
    at = (starts[:, None] + np.arange(RECORD.size, dtype=np.int64)).reshape(-1)
    is_payload = np.ones(len(out), dtype=bool)
    is_payload[at] = False
    out[at] = header.reshape(-1)
    out[is_payload] = data
    return out.data


def _uniform_records(buf: bytes, offset: int, length: int) -> int:
    """How many whole records from ``offset`` have a payload of ``length`` bytes (fewer than
    :data:`_MIN_UNIFORM_RUN`: no run).

    Looks at the next ``_MIN_UNIFORM_RUN`` records first, then at twice as many each time while
    they all match: what it reads is bounded by twice the run it finds (or by
    ``_MIN_UNIFORM_RUN`` records where there is none), so a block of payloads of mixed lengths
    is read in time linear in the block, not in its records times its length."""
    size = RECORD.size + length
    count = (len(buf) - offset) // size
    if count < _MIN_UNIFORM_RUN:
        return 0
    checked, step = 0, _MIN_UNIFORM_RUN
    while checked < count:
        n = min(step, count - checked)
        rows = np.frombuffer(buf, np.uint8, n * size, offset + checked * size).reshape(n, size)
        same = rows[:, :4].copy().view("<u4").ravel() == length
        if not same.all():
            return checked + int(np.argmin(same))
        checked += n
        step *= 2
    return count


def block_records(buf: bytes) -> Generator[tuple[Any, Any], None, int]:
    """Yield the whole records of one block read from a part file (lists of payloads, or runs of
    equal-length payloads as a 2-D uint8 array and their reserved values); return the offset of
    the first byte not yet yielded (a record continuing in the next block)."""
    view = memoryview(buf)
    payloads: list[Any] = []
    rvs: list[int] = []
    offset, end = 0, len(buf)
    unpack = RECORD.unpack_from
    while offset + RECORD.size <= end:
        length, rv = unpack(buf, offset)
        run = _uniform_records(buf, offset, length)
        if run >= _MIN_UNIFORM_RUN:
            if payloads:
                yield payloads, rvs
                payloads, rvs = [], []
            size = RECORD.size + length
            rows = np.frombuffer(buf, np.uint8, run * size, offset).reshape(run, size)
            yield rows[:, RECORD.size :], rows[:, 4:12].copy().view("<i8").ravel()
            offset += run * size
            continue
        stop = offset + RECORD.size + length
        if stop > end:
            break
        payloads.append(view[offset + RECORD.size : stop])
        rvs.append(rv)
        offset = stop
    if payloads:
        yield payloads, rvs
    return offset


def complete_record(fh: BinaryIO, head: bytes, path: str) -> bytes:
    """One whole record from its first bytes ``head`` and what follows them in ``fh``."""
    if len(head) < RECORD.size:
        head += fh.read(RECORD.size - len(head))
    if len(head) >= RECORD.size:
        length, _rv = RECORD.unpack_from(head, 0)
        missing = RECORD.size + length - len(head)
        if missing > 0:
            head += fh.read(missing)
        if len(head) == RECORD.size + length:
            return head
    raise StagedDataMissingError(
        f"staged part {path} ends inside a record", part=os.path.basename(path)
    )


__all__ = ["RECORD", "PayloadBuffers", "block_records", "complete_record", "records"]
