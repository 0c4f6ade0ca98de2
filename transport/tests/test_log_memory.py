"""A UDP log's resident memory is what it still holds, not every page it ever wrote (issue 31
item 6: a soak's server grew without a plateau while its sessions' logs filled up, three terms
each, however slowly they were written).

Resident pages are counted from ``/proc/self/pagemap`` (the "present" bit of each page of the
log's mapping): a count, not a timing."""

from __future__ import annotations

import ctypes
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.protocol.frames import NakFrame
from aeron_spark.transport.protocol.logbuffer import PARTITION_COUNT
from aeron_spark.transport.testing import pump

TERM = 256 * 1024


def resident_bytes(log: mmap.mmap) -> int:
    """Bytes of ``log``'s pages present in memory."""
    pointer = ctypes.c_char.from_buffer(log)
    address = ctypes.addressof(pointer)
    del pointer  # the export would keep the map from closing
    page = mmap.PAGESIZE
    assert address % page == 0
    pages = len(log) // page
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(address // page * 8)
        raw = fh.read(pages * 8)
    return sum(page for (entry,) in struct.iter_unpack("<Q", raw) if entry >> 63)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        yield d


def stream(driver: Driver, terms: int) -> tuple[Any, Any, int]:
    """``terms`` terms of 1,000-byte messages from a publication to a subscription on loopback,
    every one delivered; (publication state, image state, messages)."""
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 7)
    port = sub.local_endpoints[0][1]
    pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length={TERM}", 7)
    pump(driver, lambda: pub.is_connected and sub.is_connected)
    total = terms * TERM // 1056  # a 1,000-byte message takes 1,056 bytes of a term
    got: list[int] = []
    assembler = FragmentAssembler(lambda payload, header: got.append(len(payload)))
    sent = 0

    def step() -> bool:
        nonlocal sent
        while sent < total and pub.offer(b"x" * 1000) > 0:
            sent += 1
        sub.poll(assembler, 256)
        return len(got) == total

    pump(driver, step, timeout_s=120)
    pump(driver, lambda: driver.do_work() == 0)  # the last SM and the cleaning after it
    (image,) = sub.images
    assert got == [1000] * total
    return pub.state, image._state, total


def test_a_publication_and_its_image_hold_memory_for_what_they_still_need(
    driver: Driver,
) -> None:
    pub, image, _ = stream(driver, terms=10)
    assert len(pub.log) == len(image.log) == PARTITION_COUNT * TERM
    # the publication keeps what its receiver may still NAK (past the position its SMs
    # reported: nothing, here, but a chunk not yet given back); the image what it has not
    # delivered (nothing). Both wrote all three terms more than three times over: before, all
    # three stayed resident.
    assert resident_bytes(pub.log) <= TERM // 4
    assert resident_bytes(image.log) <= TERM // 4
    assert pub.released_bytes > 0 and image.released_bytes > 0


def test_given_back_pages_read_as_zeros_when_their_term_comes_round_again(
    driver: Driver,
) -> None:
    """A term given back is a clean term: messages written over it after three rotations are
    delivered whole (the stream above checks each one), and what lies past the appender's
    position in the current term is zero (a reader stops there)."""
    pub, image, _ = stream(driver, terms=7)
    position = pub.appender.position
    partition = (position // TERM) % PARTITION_COUNT
    offset = position % TERM
    term = pub.terms[partition]
    assert bytes(term[offset:]) == bytes(TERM - offset)
    read_term = image.terms[(image.subscriber_position // TERM) % PARTITION_COUNT]
    assert bytes(read_term[image.subscriber_position % TERM :]) == bytes(
        TERM - image.subscriber_position % TERM
    )


def test_a_nak_for_what_was_given_back_is_ignored_not_answered_with_zeros(
    driver: Driver,
) -> None:
    """A NAK within the old reach (half a term behind the sender) for data the receiver has
    consumed (a late duplicate) asks for pages given back: nothing is resent (before, the
    bytes were still there and were resent)."""
    pub, _image, _ = stream(driver, terms=4)
    # 248 frames of 1,056 bytes fill a term (then a PAD): the stream ends with the fourth
    # term's last frame; a NAK names a frame's start, 200 frames into that term (~50 KiB back)
    position = pub.sender_position // TERM * TERM + 200 * 1056
    assert pub.sender_position - TERM // 2 < position < pub.sender_position
    nak = NakFrame(
        session_id=pub.session_id,
        stream_id=pub.stream_id,
        term_id=pub.initial_term_id + (position // TERM),
        term_offset=position % TERM,
        length=4096,
    )
    sent = pub.retransmits_sent
    assert pub.on_nak(nak, 0) == 0
    assert pub.retransmits_sent == sent
    assert not pub.pending
