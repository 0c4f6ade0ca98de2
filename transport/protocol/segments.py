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
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_RUN_BYTES", "MAX_SEGMENTS", "segment_runs"]

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
