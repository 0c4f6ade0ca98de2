"""The receiver side, stepped by a manual clock: images from SETUP, SMs, NAKs, EOS, liveness."""

from __future__ import annotations

from typing import Any

from aeron_spark.transport.protocol.frames import (
    DataFrame,
    NakFrame,
    SetupFrame,
    SmFlags,
    StatusMessage,
)
from aeron_spark.transport.protocol.image import (
    IMAGE_LIVENESS_TIMEOUT_NS,
    MAX_GAPS,
    SM_INTERVAL_NS,
    ImageState,
)
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.testing import ManualClock, Wire

SENDER = ("127.0.0.1", 41000)
MS = 1_000_000
US = 1_000


def sms(wire: Wire) -> list[StatusMessage]:
    return [StatusMessage.decode(d) for d, _ in wire.take() if d[6] == 3]


class Pair:
    """A publication state and a dispatcher with one subscription, wired by hand."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        term_length: int = 64 * 1024,
        window: int = 32 * 1024,
        **interest: Any,
    ) -> None:
        self.clock = clock
        self.pub = PublicationState(
            session_id=5,
            stream_id=10,
            initial_term_id=100,
            term_id=100,
            term_offset=0,
            term_length=term_length,
            mtu=1408,
            destination=("127.0.0.1", 40000),
            now_ns=clock.now_ns,
        )
        self.images: list[ImageState] = []
        self.gone: list[ImageState] = []
        self.dispatcher = ReceiveDispatcher()
        self.interest = StreamInterest(
            10,
            receiver_window=window,
            on_image=self.images.append,
            on_image_gone=self.gone.append,
            **interest,
        )
        self.dispatcher.add(self.interest)
        self.to_sub = Wire()
        self.to_pub = Wire()

    def deliver(self, drop: Any = lambda i, data: False) -> None:
        for i, (data, _) in enumerate(self.to_sub.take()):
            if not drop(i, data):
                self.dispatcher.on_datagram(data, len(data), SENDER, self.clock.now_ns, self.to_pub)

    def joined(self) -> ImageState:
        """Two steps: SETUP then its SM; the image they made."""
        self.step()
        self.step()
        return self.images[0]

    def step(self, drop: Any = lambda i, data: False) -> None:
        now = self.clock.now_ns
        self.pub.send(now, self.to_sub)
        self.deliver(drop)
        self.dispatcher.do_work(now, self.to_pub)
        for data, source in self.to_pub.take():
            if data[6] == 3:
                self.pub.on_status_message(StatusMessage.decode(data), source, now)
            elif data[6] == 2:
                self.pub.on_nak(NakFrame.decode(data), now)


def poll_all(image: ImageState) -> list[bytes]:
    got: list[bytes] = []
    while image.poll(lambda p, h: got.append(bytes(p)), 100):
        pass
    return got


def test_image_is_created_from_setup_at_the_setup_position_and_sends_a_first_sm_at_once() -> None:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    images: list[ImageState] = []
    dispatcher.add(StreamInterest(10, on_image=images.append))
    setup = SetupFrame(
        term_offset=128,
        session_id=3,
        stream_id=10,
        initial_term_id=7,
        active_term_id=9,
        term_length=65536,
        mtu=1408,
    ).encode()
    dispatcher.on_datagram(setup, len(setup), SENDER, clock.now_ns, wire)
    (image,) = images
    assert image.join_position == 2 * 65536 + 128
    assert image.source_identity == "127.0.0.1:41000"
    dispatcher.do_work(clock.now_ns, wire)
    (status,) = sms(wire)
    assert (status.consumption_term_id, status.consumption_term_offset) == (9, 128)
    assert status.receiver_window == 32768  # 128 KiB capped at half the term


def test_setup_for_another_stream_or_filtered_session_makes_no_image() -> None:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    images: list[ImageState] = []
    dispatcher.add(StreamInterest(10, session_id=4, on_image=images.append))
    for session, stream in ((3, 10), (4, 11)):
        setup = SetupFrame(0, session, stream, 7, 7, 65536, 1408).encode()
        dispatcher.on_datagram(setup, len(setup), SENDER, clock.now_ns, wire)
    assert images == []


def test_data_of_an_unknown_session_elicits_a_send_setup_sm_at_most_every_100ms() -> None:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    dispatcher.add(StreamInterest(10))
    data = DataFrame(0, 3, 10, 7, b"hi").encode()
    for _ in range(3):
        dispatcher.on_datagram(data, len(data), SENDER, clock.now_ns, wire)
    sent = wire.take()
    assert len(sent) == 1 and sent[0][1] == SENDER
    status = StatusMessage.decode(sent[0][0])
    assert status.flags == SmFlags.SEND_SETUP
    assert (status.consumption_term_id, status.consumption_term_offset, status.receiver_window) == (
        0,
        0,
        0,
    )
    clock.advance(100 * MS)
    dispatcher.on_datagram(data, len(data), SENDER, clock.now_ns, wire)
    assert len(wire.take()) == 1


def test_messages_flow_and_sms_follow_the_quarter_window_rule() -> None:
    clock = ManualClock()
    pair = Pair(clock, window=32 * 1024)
    pair.step()  # SETUP
    pair.step()  # image's first SM -> connected
    assert pair.pub.is_connected
    image = pair.images[0]
    pair.pub.offer(b"a" * 100)
    pair.step()
    assert poll_all(image) == [b"a" * 100]
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    assert sms(pair.to_pub) == []  # 128 bytes consumed < window/4: no SM yet
    for _ in range(80):
        pair.pub.offer(b"b" * 100)
    pair.step()
    poll_all(image)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    (status,) = sms(pair.to_pub)
    assert status.consumption_term_offset == image.subscriber_position
    clock.advance(SM_INTERVAL_NS)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    assert len(sms(pair.to_pub)) == 1  # periodic


def test_a_lost_datagram_is_naked_after_the_delay_and_retransmitted() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = _lose_a_run(pair, range(1, 2), count=40)
    assert image.gap_position > 0 and image.naks_sent == 0
    clock.advance(50 * US)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    assert image.naks_sent == 0
    clock.advance(60 * US)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    naks = [NakFrame.decode(d) for d, _ in pair.to_pub.sent if d[6] == 2]
    assert len(naks) == 1 and naks[0].term_offset == image.gap_position
    pair.step()
    pair.step()
    assert poll_all(image) == [bytes([i]) * 200 for i in range(40)]
    assert image.gap_position == -1


def test_nak_is_repeated_while_the_gap_stays() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = _lose_a_run(pair, range(1, 2), count=40)
    sent = 0
    for _ in range(100):  # 100 ms: first NAK after the delay, then again after 10 and 20 ms more
        clock.advance(MS)
        pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
        sent += len([d for d, _ in pair.to_pub.take() if d[6] == 2])
    assert sent >= 3 and image.naks_sent == sent


def test_unreliable_image_fills_gaps_with_padding_instead_of_naking() -> None:
    clock = ManualClock()
    pair = Pair(clock, reliable=False)
    image = _lose_a_run(pair, range(1, 2), count=40)
    clock.advance(MS)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    got = poll_all(image)
    assert image.naks_sent == 0 and image.gaps_filled == 1
    assert got[0] == bytes([0]) * 200 and len(got) < 40 and got[-1] == bytes([39]) * 200


def test_over_run_and_under_run_datagrams_are_dropped_and_counted() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = pair.joined()
    far = DataFrame(40000, 5, 10, 100, b"x" * 10).encode()
    pair.dispatcher.on_datagram(far, len(far), SENDER, clock.now_ns, pair.to_pub)
    assert image.over_runs == 1
    pair.pub.offer(b"y" * 10)
    pair.step()
    poll_all(image)
    old = DataFrame(0, 5, 10, 100, b"y" * 10).encode()
    pair.dispatcher.on_datagram(old, len(old), SENDER, clock.now_ns, pair.to_pub)
    assert image.under_runs == 1


def test_eos_drains_then_the_image_goes_away_with_eos_sms() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = pair.joined()
    pair.pub.offer(b"bye")
    pair.pub.close(clock.now_ns)
    pair.step()
    clock.advance(MS)
    pair.step()  # EOS heartbeat
    assert image.eos_position == image.hwm
    assert not image.is_done
    assert poll_all(image) == [b"bye"]
    assert image.is_end_of_stream
    for _ in range(5):
        clock.advance(SM_INTERVAL_NS)
        pair.step()
    assert pair.gone == [image]
    assert pair.pub.is_done  # the EOS SM ended its linger early


def test_image_without_packets_for_the_liveness_timeout_goes_away() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = pair.joined()
    clock.advance(IMAGE_LIVENESS_TIMEOUT_NS + 1)
    for _ in range(4):
        pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
        clock.advance(SM_INTERVAL_NS)
    assert pair.gone == [image]
    eos = [StatusMessage.decode(d) for d, _ in pair.to_pub.take() if d[6] == 3]
    assert eos and all(s.flags == SmFlags.EOS for s in eos)


def test_subscription_control_address_elicits_setup_and_receives_sms() -> None:
    clock, wire = ManualClock(), Wire()
    dispatcher = ReceiveDispatcher()
    control = ("127.0.0.1", 45000)
    dispatcher.add(StreamInterest(10, control_address=control))
    dispatcher.do_work(clock.now_ns, wire)
    ((data, address),) = wire.take()
    status = StatusMessage.decode(data)
    assert address == control and status.flags == SmFlags.SEND_SETUP and status.session_id == 0
    clock.advance(100 * MS)
    dispatcher.do_work(clock.now_ns, wire)
    assert len(wire.take()) == 1


def test_term_rotation_cleans_consumed_partitions_across_many_terms() -> None:
    clock = ManualClock()
    pair = Pair(clock, term_length=64 * 1024, window=32 * 1024)
    image = pair.joined()
    expected: list[bytes] = []
    got: list[bytes] = []
    for n in range(3000):
        msg = n.to_bytes(4, "little") * (1 + n % 100)
        while pair.pub.offer(msg) < 0:
            pair.step()
            got += poll_all(image)
            clock.advance(MS)
        expected.append(msg)
    for _ in range(50):
        pair.step()
        got += poll_all(image)
        clock.advance(MS)
    assert got == expected
    assert image.subscriber_position > 5 * 64 * 1024


def test_a_lost_last_datagram_is_naked_once_heartbeats_show_the_gap() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = pair.joined()
    pair.pub.offer(b"only message")
    pair.step(drop=lambda i, data: True)  # its one DATA datagram is lost
    assert image.hwm == image.join_position
    for _ in range(3):
        clock.advance(100 * MS)  # idle: heartbeats carry the sender position
        pair.step()
    assert image.naks_sent >= 1
    assert poll_all(image) == [b"only message"]


def test_eos_status_messages_are_spaced_out() -> None:
    clock = ManualClock()
    pair = Pair(clock)
    image = pair.joined()
    image.is_closing = True
    sent = []
    for _ in range(5):
        pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
        sent += sms(pair.to_pub)
    assert len(sent) == 1 and sent[0].flags == SmFlags.EOS
    clock.advance(SM_INTERVAL_NS)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    assert len(sms(pair.to_pub)) == 1


def _lose_a_run(pair: Pair, lost: range, count: int = 60) -> ImageState:
    """Connect, offer ``count`` 200-byte messages and lose the datagrams numbered ``lost``."""
    image = pair.joined()
    for i in range(count):
        pair.pub.offer(bytes([i]) * 200)
    pair.step(drop=lambda i, data: i in lost)
    return image


def naks_of(wire: Wire) -> list[NakFrame]:
    return [NakFrame.decode(d) for d, _ in wire.take() if d[6] == 2]


def test_a_gap_partly_filled_by_its_retransmit_is_not_naked_again_before_its_retry_time() -> None:
    # A multi-datagram gap is retransmitted one datagram at a time; when the first one lands the
    # gap's start moves. The rest is still on its way: a fresh NAK now would only make the
    # sender resend it (issue 15: retransmit storms on a lossy link).
    clock = ManualClock()
    pair = Pair(clock)
    image = _lose_a_run(pair, range(1, 4))
    clock.advance(200 * US)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    (nak,) = naks_of(pair.to_pub)
    pair.pub.on_nak(nak, clock.now_ns)
    retransmits: list[tuple[bytes, Any]] = []
    pair.pub.send(clock.now_ns, lambda d, a: retransmits.append((bytes(d), a)))
    assert len(retransmits) == 3
    first = retransmits[0][0]
    pair.dispatcher.on_datagram(first, len(first), SENDER, clock.now_ns, pair.to_pub)
    for _ in range(20):  # 2 ms of receiver steps, the other two retransmits still in flight
        clock.advance(100 * US)
        pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    assert naks_of(pair.to_pub) == []
    assert image.naks_sent == 1
    for data, _ in retransmits[1:]:
        pair.dispatcher.on_datagram(data, len(data), SENDER, clock.now_ns, pair.to_pub)
    pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
    assert poll_all(image) == [bytes([i]) * 200 for i in range(60)]


def test_a_gap_that_stays_is_renaked_with_a_growing_interval() -> None:
    # Re-NAKing every 10 ms forever floods a sender whose retransmits take longer than that.
    clock = ManualClock()
    pair = Pair(clock)
    image = _lose_a_run(pair, range(1, 2))
    times = []
    for _ in range(300):  # 300 ms, retransmits never arrive
        clock.advance(MS)
        pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
        if naks_of(pair.to_pub):
            times.append(clock.now_ns)
    intervals = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) >= 3, times
    assert intervals[0] >= 10 * MS
    assert all(b >= a for a, b in zip(intervals, intervals[1:], strict=False))
    assert intervals[-1] > intervals[0]
    assert len(times) <= 8
    assert image.naks_sent == len(times)


def test_many_gaps_are_naked_once_each_until_their_retry_time() -> None:
    # Ten separate gaps: each one NAK after the delay, none again within the retry interval.
    clock = ManualClock()
    pair = Pair(clock)
    image = _lose_a_run(pair, range(1, 20, 2), count=110)
    naks = []
    for _ in range(9):
        clock.advance(MS)
        pair.dispatcher.do_work(clock.now_ns, pair.to_pub)
        naks += naks_of(pair.to_pub)
    assert len(naks) == 10 == len({n.term_offset for n in naks})
    assert image.naks_sent == 10


def test_more_gaps_than_are_tracked_at_once_are_all_recovered_in_order() -> None:
    # ~190 separate gaps (more than MAX_GAPS) before any NAK; gap scans are incremental (only
    # known gaps and the new tail are rescanned), so the untracked ones must still be found.
    clock = ManualClock()
    pair = Pair(clock, term_length=1024 * 1024, window=512 * 1024)
    image = pair.joined()
    expected: list[bytes] = []
    got: list[bytes] = []
    n = 0
    most_gaps = 0
    for round_ in range(80):
        while n < 3000 and pair.pub.offer(msg := n.to_bytes(4, "little") * 50) > 0:
            expected.append(msg)
            n += 1
        lossy = round_ < 6
        pair.step(drop=lambda i, data, lossy=lossy: lossy and i % 2 == 1 and data[6] == 1)
        most_gaps = max(most_gaps, len(image.gaps))
        got += poll_all(image)
        if round_ >= 6:
            clock.advance(2 * MS)
    assert most_gaps == MAX_GAPS
    assert got == expected
