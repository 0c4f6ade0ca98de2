"""Terms are cleaned by giving their pages back (issue 31 item 5).

A publication zero-filled the term it rotated into and an image the term its subscriber had
passed, so once a stream had carried three terms' worth of data all three stayed resident: a
16 MiB message through a session's 8 MiB terms left 24 MiB a side (1.5x the message). Now a
term of :func:`allocate_log`'s anonymous memory is cleaned with ``madvise(MADV_DONTNEED)``: it
reads as zeros all the same, and its pages are faulted in again only when written.

Counted with ``mincore`` (the pages of a log that are resident), over real UDP sockets.
"""

from __future__ import annotations

import ctypes
import mmap
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.logbuffer import allocate_log, release_range
from aeron_spark.transport.testing import pump

from .test_udp_loopback import connect, transfer

TIMEOUT_S = 30.0
PAGE = mmap.PAGESIZE
TERM = 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(log: mmap.mmap) -> int:
    """The bytes of ``log`` whose pages are in memory (``mincore``)."""
    anchor = ctypes.c_char.from_buffer(log)
    try:
        pages = -(-len(log) // PAGE)
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.addressof(anchor), len(log), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(v & 1 for v in vec) * PAGE
    finally:
        del anchor  # the log's buffer export ends here


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        yield d


def test_a_released_term_reads_as_zeros_and_holds_no_pages() -> None:
    log = allocate_log(3 * TERM)
    try:
        log[TERM : 2 * TERM] = b"\x5a" * TERM
        assert resident_bytes(log) >= TERM
        assert release_range(log, TERM, 2 * TERM) == TERM
        assert resident_bytes(log) == 0
        assert log[TERM : 2 * TERM] == bytes(TERM)  # clean, as zero_fill left it
    finally:
        log.close()


def test_terms_a_stream_passed_through_are_given_back_on_both_sides(driver: Driver) -> None:
    """4.6 terms of messages (1 MiB terms) through a publication and its image: what stays
    resident is what each side still needs, not all three terms."""
    pub, sub = connect(driver, "|term-length=1m")
    rnd = random.Random(5)
    messages = [rnd.randbytes(4000) for _ in range(1200)]  # ~4.6 MiB framed
    transfer(driver, pub, sub, messages, TIMEOUT_S)
    (image,) = sub.images
    # the image cleans the term its subscriber passed on its next duty cycle
    pump(driver, lambda: image._state.cleaned_term_count >= (image.position >> 20) - 1)
    assert pub.position > 4 * TERM
    pub_log, image_log = pub._state.log, image._state.log
    assert len(pub_log) == len(image_log) == 3 * TERM
    written = -(-(pub.position % TERM) // PAGE) * PAGE  # of the current term, in pages
    assert 0 < written < TERM
    # the publication keeps the two terms before its current one (retransmits) and what it
    # wrote of the current one: a zero-filled term was resident whole from its rotation on
    assert resident_bytes(pub_log) <= 2 * TERM + written, resident_bytes(pub_log)
    # the image: the term its subscriber is in and the one before, whatever it received
    assert resident_bytes(image_log) <= TERM + written + PAGE, resident_bytes(image_log)
