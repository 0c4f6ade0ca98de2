"""Which datagrams of one send go out together in one UDP GSO send (sans-I/O).

Linux's UDP generic segmentation offload (``UDP_SEGMENT``, Linux 4.18) takes one ``sendmsg`` of
a buffer and a segment size and puts datagrams of that size on the wire, the last one shorter
if the buffer is not a multiple of it: the wire carries exactly what one ``sendto`` per
datagram would, for one trip through the socket layer. A publication's datagrams are runs of
whole frames cut at the mtu (:func:`~.term.scan_for_send`), so a message's fragments are
mtu-sized datagrams but the last; equal small messages make equal datagrams too.

:func:`segment_runs` groups a send's datagrams (offset and length in one buffer, in sending
order) into runs one GSO send may carry: contiguous in the buffer, every datagram of the first
one's length but the last, which may be shorter and then ends the run, at most
:data:`MAX_SEGMENTS` datagrams and :data:`MAX_RUN_BYTES` bytes. A run of one datagram is sent
the ordinary way.

:func:`datagrams` finds a send's datagrams in the log (the one scan of fresh data, retransmits
and runs alike): ``(partition, term offset, length, advance)`` each, as Aeron's sender scans.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from aeron_spark.transport.protocol.logbuffer import PARTITION_COUNT
from aeron_spark.transport.protocol.term import scan_for_send

__all__ = ["MAX_RUN_BYTES", "MAX_SEGMENTS", "datagrams", "segment_runs"]

# Linux's UDP_MAX_SEGMENTS (64 from 4.18; later kernels allow 128, older refuse more than 64).
MAX_SEGMENTS = 64
# One GSO send is built as one IP datagram before it is cut: its payload is at most
# 65535 - 20 (IPv4 header) - 8 (UDP header) bytes; IPv6 allows 20 more, the IPv4 bound serves both.
MAX_RUN_BYTES = 65507


def segment_runs(
    datagrams: Iterable[tuple[int, int]],
    max_segments: int = MAX_SEGMENTS,
    max_bytes: int = MAX_RUN_BYTES,
) -> list[tuple[int, int, int]]:
    """``(start, end, segment_length)`` runs covering ``datagrams`` (``(offset, length)`` each,
    in order); a run's datagrams are ``[start, end)`` cut every ``segment_length`` bytes."""
    runs: list[tuple[int, int, int]] = []
    start = end = segment = count = 0
    open_run = False
    for offset, length in datagrams:
        if (
            open_run
            and offset == end
            and length <= segment
            and count < max_segments
            and end - start + length <= max_bytes
        ):
            end += length
            count += 1
            if length < segment:  # a shorter datagram can only be a run's last
                runs.append((start, end, segment))
                open_run = False
            continue
        if open_run:
            runs.append((start, end, segment))
        start, end, segment, count, open_run = offset, offset + length, length, 1, True
    if open_run:
        runs.append((start, end, segment))
    return runs


def datagrams(
    terms: list[memoryview],
    term_length: int,
    shift: int,
    position: int,
    limit: int,
    mtu: int,
    max_count: int,
) -> Iterator[tuple[int, int, int, int]]:
    """The datagrams from ``position`` up to ``limit``, at most ``max_count``: ``(partition,
    term offset, length to send, advance)`` each (:func:`~.term.scan_for_send`: whole frames
    within the mtu, a PAD sends its header and advances over the padding). A datagram never
    crosses a term's end; the scan stops at the first frame not yet complete."""
    count = 0
    mask = term_length - 1
    while position < limit and count < max_count:
        offset = position & mask
        partition = (position >> shift) % PARTITION_COUNT
        available = limit - position
        rest = term_length - offset
        to_send, advance = scan_for_send(
            terms[partition], offset, available if available < rest else rest, mtu
        )
        if advance == 0:
            return
        yield partition, offset, to_send, advance
        count += 1
        position += advance
