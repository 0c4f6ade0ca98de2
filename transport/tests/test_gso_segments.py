"""Which datagrams a publication sends in one UDP GSO send (sans-I/O): runs of contiguous,
equal datagrams but a shorter last one, within the kernel's bounds; and the datagrams a
publication's runs make are exactly those it sends one by one, fresh or resent."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aeron_spark.transport.protocol.frames import DataFrame, FrameType, NakFrame, frame_type_of
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.segments import MAX_RUN_BYTES, MAX_SEGMENTS, segment_runs
from aeron_spark.transport.testing import ManualClock

from .test_publication_state_machine import DEST, RECEIVER, make, sm

# ------------------------------------------------------------------ the decision


def test_equal_datagrams_make_one_run() -> None:
    assert segment_runs([(0, 1408), (1408, 1408), (2816, 1408)]) == [(0, 4224, 1408)]


def test_a_shorter_last_datagram_ends_the_run() -> None:
    # an 8 KiB message at mtu 1408: five full fragments and a shorter last one, then the next
    # message's first fragment starts a new run
    datagrams = [(i * 1408, 1408) for i in range(5)] + [(7040, 1344), (8384, 1408), (9792, 1408)]
    assert segment_runs(datagrams) == [(0, 8384, 1408), (8384, 11200, 1408)]


def test_a_longer_datagram_starts_a_new_run() -> None:
    assert segment_runs([(0, 1056), (1056, 1408), (2464, 1408)]) == [
        (0, 1056, 1056),
        (1056, 3872, 1408),
    ]


def test_a_datagram_not_where_the_last_ended_starts_a_new_run() -> None:
    # a PAD datagram (its 32-byte header only) ends a term; the next term starts elsewhere
    datagrams = [(0, 1408), (1408, 32), (65536, 1408), (66944, 1408)]
    assert segment_runs(datagrams) == [(0, 1440, 1408), (65536, 68352, 1408)]
    assert segment_runs([(0, 1408), (2000, 1408)]) == [(0, 1408, 1408), (2000, 3408, 1408)]


def test_one_datagram_is_a_run_of_its_own_length() -> None:
    assert segment_runs([(96, 500)]) == [(96, 596, 500)]
    assert segment_runs([]) == []


@pytest.mark.parametrize("count", [MAX_SEGMENTS - 1, MAX_SEGMENTS, MAX_SEGMENTS + 1])
def test_at_most_max_segments_per_run(count: int) -> None:
    runs = segment_runs([(i * 32, 32) for i in range(count)])
    assert runs[0] == (0, 32 * min(count, MAX_SEGMENTS), 32)
    if count > MAX_SEGMENTS:
        assert runs[1:] == [(MAX_SEGMENTS * 32, count * 32, 32)]
    else:
        assert len(runs) == 1


def test_at_most_max_run_bytes_per_run() -> None:
    # 46 datagrams of 1408 (64,768 bytes) fit; the 47th would pass 65,507
    runs = segment_runs([(i * 1408, 1408) for i in range(47)])
    assert runs == [(0, 46 * 1408, 1408), (46 * 1408, 47 * 1408, 1408)]
    # exactly at the bound is in; one byte over is not
    assert segment_runs([(0, 65000), (65000, MAX_RUN_BYTES - 65000)]) == [(0, MAX_RUN_BYTES, 65000)]
    assert segment_runs([(0, 65000), (65000, MAX_RUN_BYTES - 64999)]) == [
        (0, 65000, 65000),
        (65000, MAX_RUN_BYTES + 1, MAX_RUN_BYTES - 64999),
    ]


def test_custom_bounds() -> None:
    assert segment_runs([(0, 10), (10, 10), (20, 10)], max_segments=2) == [
        (0, 20, 10),
        (20, 30, 10),
    ]
    assert segment_runs([(0, 10), (10, 10), (20, 10)], max_bytes=25) == [(0, 20, 10), (20, 30, 10)]


# ------------------------------------------------------------------ a publication's runs

TERM = 512 * 1024  # messages up to 64 KiB


class OneByOne:
    def __init__(self) -> None:
        self.datagrams: list[tuple[bytes, Any]] = []

    def __call__(self, data: Any, address: Any) -> None:
        self.datagrams.append((bytes(data), address))


class Runs(OneByOne):
    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[int, int]] = []  # (datagrams, segment length) of each call

    def segments(self, data: Any, segment_length: int, address: Any) -> None:
        data = bytes(data)
        assert data, "an empty run"
        cut = [data[at : at + segment_length] for at in range(0, len(data), segment_length)]
        self.runs.append((len(cut), segment_length))
        self.datagrams.extend((d, address) for d in cut)


def _publish(
    sizes: list[int], wire: OneByOne, runs: Runs | None, *, lagging: bool = False, **kw: Any
) -> PublicationState:
    """``lagging``: the receiver consumes none of it (its SMs stay at 0, its window half a
    term), so a NAK can still reach all that was sent (a publication gives back the pages of
    what every receiver consumed, as no NAK from it can ask for them again)."""
    clock = ManualClock()
    pub = make(clock, **kw)
    send = runs.segments if runs is not None else None

    def sm_now() -> Any:
        if lagging:
            return sm(pub, 0, pub.term_length // 2)
        return sm(pub, pub.sender_position)

    pub.send(clock.now_ns, wire, send)  # SETUP
    pub.on_status_message(sm_now(), RECEIVER, clock.now_ns)
    rng = random.Random(7)
    for size in sizes:
        payload = rng.randbytes(size)
        for _ in range(1000):
            if pub.offer(payload) > 0:
                break
            clock.advance(1000)
            pub.send(clock.now_ns, wire, send)
            pub.on_status_message(sm_now(), RECEIVER, clock.now_ns)
        else:
            raise AssertionError("the publication never took the message")
    for _ in range(1000):
        if pub.sender_position >= pub.position:
            break
        clock.advance(1000)
        pub.send(clock.now_ns, wire, send)
        pub.on_status_message(sm_now(), RECEIVER, clock.now_ns)
    assert pub.sender_position == pub.position
    return pub


@pytest.mark.parametrize(
    "sizes",
    [
        [8192] * 20,  # mtu-sized fragments, a shorter last one
        [1024] * 200,  # equal one-frame datagrams
        [65536] * 3,  # more fragments than a run may carry
        [100, 3000, 8192, 17, 1376, 1377, 40000, 1] * 24,  # mixed, over several terms
    ],
    ids=["8k", "1k", "64k", "mixed"],
)
def test_runs_put_the_same_datagrams_on_the_wire(sizes: list[int]) -> None:
    one_by_one = OneByOne()
    plain = _publish(sizes, one_by_one, None, term_length=TERM)
    runs = Runs()
    batched = _publish(sizes, runs, runs, term_length=TERM)
    assert plain.position > 2 * TERM or sizes[0] != 100
    assert runs.datagrams == one_by_one.datagrams
    assert all(address == DEST for _, address in runs.datagrams)
    assert any(count > 1 for count, _ in runs.runs), runs.runs
    assert batched.bytes_sent == plain.bytes_sent > sum(sizes)


def test_an_8k_message_is_one_run_at_mtu_1408() -> None:
    runs = Runs()
    _publish([8192] * 4, runs, runs)
    assert runs.runs == [(6, 1408)] * 4  # 5 x 1408 + 1344 in one send each


# ------------------------------------------------------------------ retransmits in runs


LATER_NS = ManualClock().now_ns + 50_000_000  # after _publish's last step (it steps by 1 us)


def _data(datagrams: list[tuple[bytes, Any]]) -> list[bytes]:
    """The datagrams that carry frames of the log (no SETUP, no heartbeat)."""
    return [
        d
        for d, _ in datagrams
        if frame_type_of(d) in (FrameType.DATA, FrameType.PAD) and DataFrame.decode(d).frame_length
    ]


def _nak_range(datagrams: list[bytes], window: int) -> tuple[int, int, list[bytes]]:
    """A NAKed range of whole datagrams of the first term, within one receiver window: its
    term offset, its length and the datagrams first sent for it."""
    offsets = [DataFrame.decode(d).term_offset for d in datagrams]
    first = 1
    last = first
    while last + 1 < len(offsets) and offsets[last + 1] - offsets[first] <= window:
        if offsets[last + 1] < offsets[last]:
            break  # the next term
        last += 1
    return offsets[first], offsets[last] - offsets[first], datagrams[first:last]


@pytest.mark.parametrize(
    "sizes",
    [
        [8192] * 20,  # mtu-sized fragments, a shorter last one
        [1024] * 200,  # equal one-frame datagrams
        [65536] * 3,  # more fragments than a run may carry
        [100, 3000, 8192, 17, 1376, 1377, 40000, 1] * 3,  # mixed
    ],
    ids=["8k", "1k", "64k", "mixed"],
)
def test_a_naked_range_is_resent_in_runs_byte_identical_to_one_by_one(sizes: list[int]) -> None:
    one_by_one = OneByOne()
    plain = _publish(sizes, one_by_one, None, lagging=True, term_length=TERM)
    runs = Runs()
    batched = _publish(sizes, runs, runs, lagging=True, term_length=TERM)
    assert runs.datagrams == one_by_one.datagrams
    originals = _data(one_by_one.datagrams)
    offset, length, expected = _nak_range(originals, 128 * 1024)
    assert len(expected) > 2
    fresh_runs = len(runs.runs)
    del one_by_one.datagrams[:], runs.datagrams[:]
    for pub, wire, segments in ((plain, one_by_one, None), (batched, runs, runs.segments)):
        nak = NakFrame(pub.session_id, pub.stream_id, pub.initial_term_id, offset, length)
        assert pub.on_nak(nak, LATER_NS, None) == len(expected)
        pub.send(LATER_NS, wire, segments)
    resent = _data(runs.datagrams)
    assert resent == _data(one_by_one.datagrams) == expected
    assert all(address == DEST for _, address in runs.datagrams)
    retransmit_runs = runs.runs[fresh_runs:]
    # runs of several datagrams (a run of one is an ordinary send, not counted here)
    assert sum(count for count, _ in retransmit_runs) <= len(expected)
    assert any(count > 1 for count, _ in retransmit_runs), retransmit_runs
    assert len(retransmit_runs) < len(expected) / 2
    assert batched.retransmits_sent == plain.retransmits_sent == len(expected)
    assert batched.retransmitted_bytes == plain.retransmitted_bytes == sum(map(len, expected))


def test_a_resent_run_goes_one_by_one_without_segments() -> None:
    """A publication stepped without ``transmit_segments`` (GSO off) cuts its queued runs."""
    wire = OneByOne()
    pub = _publish([8192] * 4, wire, None, lagging=True, term_length=TERM)
    originals = _data(wire.datagrams)
    del wire.datagrams[:]
    length = sum(map(len, originals[:12]))  # two messages of six fragments each
    nak = NakFrame(pub.session_id, pub.stream_id, pub.initial_term_id, 0, length)
    assert pub.on_nak(nak, LATER_NS, None) == 12
    pub.send(LATER_NS, wire, None)
    assert _data(wire.datagrams) == originals[:12]
