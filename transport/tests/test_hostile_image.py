"""Crafted datagrams against the receiver, stepped by a manual clock (issue 15, item 3).

A SETUP with a 1 GiB term and DATA ~512 MiB ahead used to be accepted (anything up to half a
term past the last SM), and the gap scan then walked the empty 512 MiB 32 bytes at a time in
Python on every datagram. Now: data or heartbeats past the window our SMs advertise are flow
control over-runs (dropped, counted, nothing moves); a SETUP above the subscription's term length
or mtu bound makes no image and is counted; a gap scan reads one header per frame, never one per
32 bytes of empty term.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.protocol import term as term_module
from aeron_spark.transport.protocol.frames import (
    DataFlags,
    DataFrame,
    FrameType,
    NakFrame,
    SetupFrame,
)
from aeron_spark.transport.protocol.image import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    SM_INTERVAL_NS,
    ImageState,
)
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.protocol.term import encode_data_header
from aeron_spark.transport.testing import ManualClock

SENDER = ("127.0.0.1", 41000)
GIB = 1024**3
MIB = 1024**2


class Wire:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def __call__(self, data: Any, address: Any) -> None:
        self.sent.append(bytes(data))

    def naks(self) -> list[NakFrame]:
        return [NakFrame.decode(d) for d in self.sent if d[6] == FrameType.NAK]


def one_image(
    term_length: int, window: int = 128 * 1024, **interest: Any
) -> tuple[ReceiveDispatcher, ImageState, Wire, ManualClock]:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    images: list[ImageState] = []
    dispatcher.add(StreamInterest(10, receiver_window=window, on_image=images.append, **interest))
    setup = SetupFrame(0, 3, 10, 7, 7, term_length, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SENDER, clock.now_ns, wire)
    (image,) = images
    dispatcher.do_work(clock.now_ns, wire)  # the first SM: position 0, our window
    return dispatcher, image, wire, clock


def send(dispatcher: ReceiveDispatcher, data: bytes, clock: ManualClock, wire: Wire) -> int:
    return dispatcher.on_datagram(data, len(data), SENDER, clock.now_ns, wire)


def heartbeat(term_offset: int, term_id: int = 7, eos: bool = False) -> bytes:
    flags = DataFlags.UNFRAGMENTED | (DataFlags.EOS if eos else 0)
    return encode_data_header(0, flags, FrameType.DATA, term_offset, 3, 10, term_id)


def test_the_crafted_pair_is_an_over_run_and_moves_nothing() -> None:
    """The issue's pair: a 1 GiB term (allowed here) and DATA ~512 MiB ahead, then a heartbeat."""
    dispatcher, image, wire, clock = one_image(GIB)
    assert image.window == 128 * 1024
    far = DataFrame(512 * MIB - 4096, 3, 10, 7, b"\xab" * 1024).encode()
    assert send(dispatcher, far, clock, wire) == 0
    assert (image.over_runs, image.hwm, image.bytes_received) == (1, 0, 0)
    send(dispatcher, heartbeat(512 * MIB - 4096, eos=True), clock, wire)
    assert (image.over_runs, image.hwm, image.eos_position) == (2, 0, None)
    clock.advance(1_000_000)
    dispatcher.do_work(clock.now_ns, wire)
    assert image.gaps == {} and wire.naks() == []


def test_data_past_the_advertised_window_but_within_half_a_term_is_an_over_run() -> None:
    """Half a term (the old bound) is 512 KiB here; the window our SMs advertise is 64 KiB."""
    dispatcher, image, wire, clock = one_image(MIB, window=64 * 1024)
    inside = DataFrame(64 * 1024 - 64, 3, 10, 7, b"i" * 32).encode()  # ends exactly at 64 KiB
    beyond = DataFrame(64 * 1024 - 32, 3, 10, 7, b"o" * 32).encode()  # ends 32 bytes past it
    assert send(dispatcher, inside, clock, wire) == 1
    assert send(dispatcher, beyond, clock, wire) == 0
    assert (image.over_runs, image.hwm) == (1, 64 * 1024)
    send(dispatcher, heartbeat(64 * 1024 + 32), clock, wire)
    assert (image.over_runs, image.hwm) == (2, 64 * 1024)


def test_the_window_moves_with_the_sms_we_send() -> None:
    dispatcher, image, wire, clock = one_image(MIB, window=64 * 1024)
    for offset in range(0, 64 * 1024, 1024):
        assert send(dispatcher, DataFrame(offset, 3, 10, 7, b"d" * 992).encode(), clock, wire)
    late = DataFrame(64 * 1024, 3, 10, 7, b"d" * 992).encode()
    assert send(dispatcher, late, clock, wire) == 0 and image.over_runs == 1
    assert image.poll(lambda p, h: None, 1000) == 64
    dispatcher.do_work(clock.now_ns, wire)  # the subscriber moved: an SM at 64 KiB goes out
    assert image.last_sm_position == 64 * 1024
    assert send(dispatcher, late, clock, wire) == 1


@pytest.mark.parametrize(
    ("term_length", "mtu", "accepted"),
    [
        (GIB, 1408, False),
        (128 * 1024, 1408, False),
        (64 * 1024, 32 * 1024, False),
        (64 * 1024, 8192, True),
        (64 * 1024, 1408, True),
    ],
)
def test_a_setup_above_the_subscription_bounds_makes_no_image_and_is_counted(
    term_length: int, mtu: int, accepted: bool
) -> None:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    images: list[ImageState] = []
    dispatcher.add(
        StreamInterest(10, max_term_length=64 * 1024, max_mtu=8192, on_image=images.append)
    )
    setup = SetupFrame(0, 3, 10, 7, 7, term_length, mtu).encode()
    send(dispatcher, setup, clock, wire)
    assert len(images) == (1 if accepted else 0)
    assert dispatcher.setups_rejected == (0 if accepted else 1)
    dispatcher.do_work(clock.now_ns, wire)
    if not accepted:
        assert wire.sent == []  # a refused SETUP costs no reply


def _count_header_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads = [0]
    real = term_module._i32_from

    def counting(buffer: Any, offset: int = 0) -> tuple[int]:
        reads[0] += 1
        return real(buffer, offset)

    monkeypatch.setattr(term_module, "_i32_from", counting)
    return reads


def test_a_gap_scan_reads_frame_headers_not_the_empty_term(monkeypatch) -> None:
    """A 480 KiB gap before one frame: the old scan read 15,360 empty headers per scan."""
    dispatcher, image, wire, clock = one_image(MIB, window=512 * 1024)
    frame = DataFrame(480 * 1024, 3, 10, 7, b"z" * 100).encode()
    assert send(dispatcher, frame, clock, wire) == 1
    reads = _count_header_reads(monkeypatch)
    clock.advance(1_000_000)
    dispatcher.do_work(clock.now_ns, wire)
    assert reads[0] <= 4
    assert (image.gap_position, image.gap_length) == (0, 480 * 1024)
    for _ in range(100):  # the NAK goes out after the NAK delay, whatever it is
        if wire.naks():
            break
        clock.advance(10_000_000)
        dispatcher.do_work(clock.now_ns, wire)
    nak = wire.naks()[0]
    assert (nak.term_offset, nak.length) == (0, 480 * 1024)


def _reference_gaps(term: memoryview, start: int, end: int) -> list[tuple[int, int]]:
    """Gaps in [start, end), found the slow way: every 32-byte slot that no frame covers."""
    gaps: list[tuple[int, int]] = []
    offset = start
    while offset < end:
        length = int.from_bytes(term[offset : offset + 4], "little", signed=True)
        if length > 0:
            offset += (length + 31) & -32
            continue
        gap = offset
        while offset < end and not any(term[offset : offset + 4]):
            offset += 32
        gaps.append((gap, min(offset, end) - gap))
    return gaps


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 255), st.integers(1, 96)),
        min_size=1,
        max_size=40,
        unique_by=lambda t: t[0],
    ),
    st.randoms(use_true_random=False),
)
def test_gaps_found_from_inserted_datagrams_match_a_byte_by_byte_scan(
    slots: list[tuple[int, int]], rng: Any
) -> None:
    """Frames at random 256-byte slots, in random order: same gaps as walking every 32 bytes."""
    dispatcher, image, wire, clock = one_image(64 * 1024, window=32 * 1024)
    rng.shuffle(slots)
    for slot, size in slots:
        send(dispatcher, DataFrame(slot * 128, 3, 10, 7, b"q" * size).encode(), clock, wire)
        if rng.random() < 0.3:
            clock.advance(1000)
            dispatcher.do_work(clock.now_ns, wire)
    clock.advance(1000)
    dispatcher.do_work(clock.now_ns, wire)
    expected = _reference_gaps(image.terms[0], 0, image.hwm)
    assert sorted((p, entry[0]) for p, entry in image.gaps.items()) == expected
    first = expected[0][0] if expected else image.hwm
    assert image.rebuild_position == first


def test_a_driver_refuses_big_setups_by_configuration_and_by_channel(tmp_path: Path) -> None:
    """Real sockets: DriverConfig bounds every subscription; max-term-length lowers one."""
    with pytest.raises(ChannelError, match="max_image_term_length"):
        DriverConfig(max_image_term_length=3 * MIB)
    with pytest.raises(ChannelError, match="max-mtu"):
        Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)).add_subscription(
            "aeron:udp?endpoint=127.0.0.1:0|max-mtu=100", 1
        )
    config = DriverConfig(
        threading_mode="invoker", directory=tmp_path, max_image_term_length=4 * MIB
    )
    with Driver(config) as d:
        wide = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 1)
        narrow = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0|max-term-length=64k", 2)
        pubs = {
            "too big for the driver": d.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{wide.local_endpoints[0][1]}|term-length=8m", 1
            ),
            "fits the driver": d.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{wide.local_endpoints[0][1]}|term-length=4m", 1
            ),
            "too big for the channel": d.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{narrow.local_endpoints[0][1]}|term-length=128k", 2
            ),
            "fits the channel": d.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{narrow.local_endpoints[0][1]}|term-length=64k", 2
            ),
        }
        deadline = time.monotonic() + 10
        while not (pubs["fits the driver"].is_connected and pubs["fits the channel"].is_connected):
            assert time.monotonic() < deadline, "the publications within bounds never connected"
            if d.do_work() == 0:
                d.idle(0.005)
        settle = time.monotonic() + 0.3  # a few more SETUP rounds for the refused ones
        while time.monotonic() < settle:
            if d.do_work() == 0:
                d.idle(0.005)
        assert not pubs["too big for the driver"].is_connected
        assert not pubs["too big for the channel"].is_connected
        assert {im.term_length for im in wide.images} == {4 * MIB}
        assert {im.term_length for im in narrow.images} == {64 * 1024}
        assert d.counters.snapshot()["setups_rejected"] >= 2
        assert d.errors == []


def test_image_limits_per_sender_per_address_and_in_all() -> None:
    """SETUPs for new session ids: a sender (address and port) gets max_images_per_source, an
    IP address max_images_per_address, everyone together max_images; the rest are counted."""
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10, max_images=5, max_images_per_source=2, max_images_per_address=3)
    dispatcher.add(interest)

    def setup_from(source: tuple[str, int], session: int) -> None:
        frame = SetupFrame(0, session, 10, 7, 7, 65536, 1408).encode()
        dispatcher.on_datagram(frame, len(frame), source, clock.now_ns, wire)

    for session in range(100, 110):  # one hostile socket
        setup_from(("10.0.0.1", 5000), session)
    assert len(interest.images) == 2 and dispatcher.images_refused == 8
    setup_from(("10.0.0.1", 5001), 200)  # the same host, another socket
    setup_from(("10.0.0.1", 5002), 201)  # past the address's 3
    assert len(interest.images) == 3 and dispatcher.images_refused == 9
    setup_from(("10.0.0.2", 6000), 300)
    setup_from(("10.0.0.3", 7000), 400)
    setup_from(("10.0.0.4", 8000), 500)  # past the 5 in all
    assert sorted(interest.images) == [100, 101, 200, 300, 400]
    assert dispatcher.images_refused == 10
    # data of a refused session from a full sender asks for no SETUP (no reply to the flood)
    wire.sent.clear()
    hb = encode_data_header(0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, 105, 10, 7)
    dispatcher.on_datagram(hb, len(hb), ("10.0.0.1", 5000), clock.now_ns, wire)
    assert wire.sent == []
    # once the hostile images time out, their slots are free again
    for _ in range(2):
        clock.advance(IMAGE_LIVENESS_TIMEOUT_NS + 1)
        for session in (200, 300, 400):  # the others stay alive
            hb = encode_data_header(0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, session, 10, 7)
            source = {200: ("10.0.0.1", 5001), 300: ("10.0.0.2", 6000), 400: ("10.0.0.3", 7000)}
            dispatcher.on_datagram(hb, len(hb), source[session], clock.now_ns, wire)
        for _ in range(5):
            clock.advance(SM_INTERVAL_NS)
            dispatcher.do_work(clock.now_ns, wire)
    assert sorted(interest.images) == [200, 300, 400]
    setup_from(("10.0.0.4", 8000), 500)
    assert sorted(interest.images) == [200, 300, 400, 500]
    assert interest.images_per_source == {
        ("10.0.0.1", 5001): 1,
        "10.0.0.1": 1,
        ("10.0.0.2", 6000): 1,
        "10.0.0.2": 1,
        ("10.0.0.3", 7000): 1,
        "10.0.0.3": 1,
        ("10.0.0.4", 8000): 1,
        "10.0.0.4": 1,
    }


def test_unvouched_images_are_evicted_for_a_newcomer_and_vouched_ones_never() -> None:
    """Issue 28 item 5: spoofed SETUPs (kept alive by heartbeats) filled a HELLO subscription's
    image limits and refused every honest client. With ``evict_unvouched`` a new sender's SETUP
    at a full limit evicts the oldest image its subscriber never vouched for (counted), from the
    narrowest full limit, and from the network holding the most such images; a vouched image
    is never evicted, and an image cap made only of vouched images still refuses."""
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    gone: list[ImageState] = []
    interest = StreamInterest(
        10, max_images=6, max_images_per_address=3, evict_unvouched=True, on_image_gone=gone.append
    )
    dispatcher.add(interest)

    def setup_from(source: tuple[str, int], session: int) -> None:
        frame = SetupFrame(0, session, 10, 7, 7, 65536, 1408).encode()
        dispatcher.on_datagram(frame, len(frame), source, clock.now_ns, wire)

    # the attacker holds the honest client's address (same host) and the rest of the cap
    for i in range(3):
        setup_from(("10.0.0.1", 5000 + i), 100 + i)
        setup_from(("10.0.0.2", 5000 + i), 200 + i)
    assert len(interest.images) == 6 and dispatcher.images_refused == 0
    for _ in range(20):  # heartbeats keep them alive across the liveness timeout
        clock.advance(IMAGE_LIVENESS_TIMEOUT_NS // 4)
        for session in list(interest.images):
            image = interest.images[session]
            hb = encode_data_header(0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, session, 10, 7)
            dispatcher.on_datagram(hb, len(hb), image.source_address, clock.now_ns, wire)
        dispatcher.do_work(clock.now_ns, wire)
    assert len(interest.images) == 6
    # the honest client at 10.0.0.1 (its address full) evicts that address's oldest
    setup_from(("10.0.0.1", 6000), 300)
    assert 300 in interest.images and 100 not in interest.images
    assert dispatcher.images_evicted == 1 and gone[-1].session_id == 100
    assert gone[-1].is_closing
    interest.images[300].vouch()
    # a newcomer from another network at the full cap evicts from the network holding the
    # most unvouched images (10.0.0.x here), never the vouched one
    setup_from(("192.0.2.9", 7000), 400)
    assert 400 in interest.images and 300 in interest.images and len(interest.images) == 6
    assert dispatcher.images_evicted == 2
    # the evicted session id is cooled down: its SETUP again makes nothing
    setup_from(("10.0.0.1", 5000), 100)
    assert 100 not in interest.images
    # once every image is vouched, the cap refuses (nothing to evict)
    for image in interest.images.values():
        image.vouch()
    refused = dispatcher.images_refused
    setup_from(("198.51.100.1", 7000), 500)
    assert 500 not in interest.images and dispatcher.images_refused == refused + 1
    assert dispatcher.images_evicted == 2


def test_without_evict_unvouched_a_full_limit_refuses_as_before() -> None:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10, max_images=2)
    dispatcher.add(interest)
    for i, session in enumerate((1, 2, 3)):
        frame = SetupFrame(0, session, 10, 7, 7, 65536, 1408).encode()
        dispatcher.on_datagram(frame, len(frame), (f"10.0.{i}.1", 5000), clock.now_ns, wire)
    assert sorted(interest.images) == [1, 2]
    assert dispatcher.images_refused == 1 and dispatcher.images_evicted == 0
