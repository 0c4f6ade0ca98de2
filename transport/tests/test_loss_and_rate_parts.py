"""The image's loss detector and the per-prefix token bucket, stepped alone with a manual clock
(issue 29 item 3), and the receive side's randomness injected like the clock."""

from __future__ import annotations

import random

from aeron_spark.transport.protocol.frames import DataFlags, FrameType
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.logbuffer import PARTITION_COUNT
from aeron_spark.transport.protocol.loss_detector import (
    MAX_NAK_RETRY_NS,
    MIN_NAK_RETRY_NS,
    LossDetector,
)
from aeron_spark.transport.protocol.prefix_rate import PrefixRateLimiter
from aeron_spark.transport.protocol.receiver import StreamInterest
from aeron_spark.transport.protocol.term import encode_data_header, insert_packet
from aeron_spark.transport.testing import ManualClock

TERM = 64 * 1024


def _terms() -> list[memoryview]:
    log = bytearray(PARTITION_COUNT * TERM)
    view = memoryview(log)
    return [view[i * TERM : (i + 1) * TERM] for i in range(PARTITION_COUNT)]


def _frame(terms: list[memoryview], offset: int, detector: LossDetector) -> None:
    header = encode_data_header(64, DataFlags.UNFRAGMENTED, FrameType.DATA, offset, 1, 2, 0)
    insert_packet(terms[0], offset, header + b"x" * 32)
    detector.note_inserted(offset)


def test_a_gap_is_naked_after_the_delay_then_backs_off_and_a_fill_measures_the_round_trip() -> None:
    terms, clock = _terms(), ManualClock()
    loss = LossDetector(terms, TERM, 0, nak_delay_ns=100_000)
    _frame(terms, 0, loss)
    _frame(terms, 256, loss)
    assert loss.scan(0, 320, clock.now_ns) == 64  # frame 0 complete, gap [64, 256)
    assert (loss.gap_position, loss.gap_length) == (64, 192)
    assert loss.due(clock.now_ns) == []
    assert loss.next_deadline_ns(1 << 62) == clock.now_ns + 100_000
    clock.advance(100_000)
    ((position, entry),) = loss.due(clock.now_ns)
    loss.on_nak_sent(entry, clock.now_ns)
    first_retry = loss.nak_retry_ns
    assert entry[1] == clock.now_ns + first_retry
    loss.on_nak_sent(entry, clock.now_ns)
    assert entry[1] == clock.now_ns + 2 * first_retry  # doubled
    clock.advance(3_000_000)
    _frame(terms, 64, loss)  # the retransmit lands: gap [128, 256) keeps its timer
    assert loss.scan(64, 320, clock.now_ns) == 128
    assert loss.gaps[128][2] == 2
    for offset in (128, 192):
        _frame(terms, offset, loss)
    assert loss.scan(128, 320, clock.now_ns) == 320 and loss.gaps == {}
    assert loss.nak_rtt_ns == 3_000_000  # the sample: the last NAK to the fill
    assert MIN_NAK_RETRY_NS <= loss.nak_retry_ns <= MAX_NAK_RETRY_NS


def test_the_bucket_allows_a_burst_of_one_seconds_rate_then_refills_with_the_clock() -> None:
    bucket, clock = PrefixRateLimiter(3), ManualClock()
    assert [bucket.allows("10.0.0", clock.now_ns) for _ in range(4)] == [True, True, True, False]
    assert bucket.allows("10.0.1", clock.now_ns)  # another network has its own bucket
    clock.advance(333_333_334)
    assert bucket.allows("10.0.0", clock.now_ns)
    assert not bucket.allows("10.0.0", clock.now_ns)
    clock.advance(-10_000_000_000)  # a clock going back gains nothing
    assert not bucket.allows("10.0.0", clock.now_ns)


def test_the_bucket_table_is_bounded_forgetting_refilled_prefixes_first() -> None:
    bucket, clock = PrefixRateLimiter(1, table_limit=2), ManualClock()
    assert bucket.allows("a", clock.now_ns) and bucket.allows("b", clock.now_ns)
    assert not bucket.allows("c", clock.now_ns)  # full, none refilled: a newcomer waits
    clock.advance(1_000_000_000)
    assert bucket.allows("c", clock.now_ns) and len(bucket.table) <= 2


def test_receiver_ids_come_from_the_random_source_passed_in() -> None:
    interest = StreamInterest(10, rng=random.Random(7))
    assert interest.receiver_id == random.Random(7).getrandbits(63)
    image = ImageState(
        session_id=1,
        stream_id=10,
        initial_term_id=0,
        active_term_id=0,
        term_offset=0,
        term_length=TERM,
        mtu=1408,
        source_address=("127.0.0.1", 5000),
        rng=random.Random(8),
    )
    assert image.receiver_id == random.Random(8).getrandbits(63)
