"""The sender side, stepped by a manual clock: SETUP, flow control, heartbeats, EOS, NAK, RTTM."""

from __future__ import annotations

from typing import Any

import pytest

from aeron_spark.transport.api import BACK_PRESSURED, CLOSED, MAX_POSITION_EXCEEDED, NOT_CONNECTED
from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.frames import (
    DataFrame,
    NakFrame,
    RttMeasurement,
    SetupFrame,
    SmFlags,
    StatusMessage,
    decode_datagram,
)
from aeron_spark.transport.protocol.publication import (
    CONNECTION_TIMEOUT_NS,
    HEARTBEAT_INTERVAL_NS,
    SETUP_INTERVAL_NS,
    PublicationState,
    abort_claim,
    commit_claim,
)
from aeron_spark.transport.testing import ManualClock, Wire

DEST = ("127.0.0.1", 40123)
RECEIVER = ("127.0.0.1", 50000)
MS = 1_000_000


def make(clock: ManualClock, **kw: Any) -> PublicationState:
    args: dict[str, Any] = dict(
        session_id=77,
        stream_id=10,
        initial_term_id=5,
        term_id=5,
        term_offset=0,
        term_length=64 * 1024,
        mtu=1408,
        destination=DEST,
        now_ns=clock.now_ns,
    )
    args.update(kw)
    return PublicationState(**args)


def sm(
    pub: PublicationState,
    position: int,
    window: int = 128 * 1024,
    flags: int = 0,
    receiver_id: int = 9,
) -> StatusMessage:
    term_id = pub.initial_term_id + (position >> pub.shift)
    return StatusMessage(
        pub.session_id,
        pub.stream_id,
        term_id,
        position & (pub.term_length - 1),
        window,
        receiver_id,
        flags=flags,
    )


def test_setup_repeats_every_100ms_until_first_status_message() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock, term_offset=128, term_id=5)
    pub.send(clock.now_ns, wire)
    frames = wire.take()
    assert len(frames) == 1 and frames[0][1] == DEST
    setup = SetupFrame.decode(frames[0][0])
    assert (setup.session_id, setup.stream_id, setup.term_offset, setup.active_term_id) == (
        77,
        10,
        128,
        5,
    )
    clock.advance(SETUP_INTERVAL_NS - 1)
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    clock.advance(1)
    pub.send(clock.now_ns, wire)
    assert len(wire.take()) == 1
    pub.on_status_message(sm(pub, pub.start_position), RECEIVER, clock.now_ns)
    clock.advance(SETUP_INTERVAL_NS * 5)
    pub.send(clock.now_ns, wire)
    assert all(DataFrame.decode(d).is_heartbeat for d, _ in wire.take())


def test_offers_are_not_connected_until_a_status_message_then_back_pressured() -> None:
    clock = ManualClock()
    pub = make(clock)
    assert pub.offer(b"x") == NOT_CONNECTED
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    assert pub.is_connected
    assert pub.publisher_limit == pub.term_length // 2
    positions = []
    while (result := pub.offer(bytes(1000))) > 0:
        positions.append(result)
    assert result == BACK_PRESSURED
    assert positions == sorted(positions)
    assert positions[-1] >= pub.term_length // 2


def test_sender_limit_is_sm_position_plus_window_and_never_goes_down() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0, window=4096), RECEIVER, clock.now_ns)
    for _ in range(20):
        assert pub.offer(bytes(480)) > 0
    pub.send(clock.now_ns, wire)
    data = [d for d, _ in wire.take()]
    assert sum(len(d) for d in data) == 4096
    assert pub.sender_position == 4096
    pub.on_status_message(sm(pub, 0, window=1024), RECEIVER, clock.now_ns)
    assert pub.sender_limit == 4096
    pub.on_status_message(sm(pub, 4096, window=4096), RECEIVER, clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert sum(len(d) for d, _ in wire.take()) == 4096  # up to 4096 + 4096


def test_datagrams_hold_whole_frames_up_to_the_mtu() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    for i in range(100):
        pub.offer(bytes([i]) * 100)
    pub.send(clock.now_ns, wire)
    seen = []
    for data, address in wire.take():
        assert address == DEST and len(data) <= 1408
        seen += [f.payload for f in decode_datagram(data)]
    assert seen == [bytes([i]) * 100 for i in range(100)]


def test_heartbeat_after_100ms_idle_with_frame_length_zero() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    pub.offer(b"hello")
    pub.send(clock.now_ns, wire)
    wire.take()
    clock.advance(HEARTBEAT_INTERVAL_NS - 1)
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    clock.advance(1)
    pub.send(clock.now_ns, wire)
    ((data, _),) = wire.take()
    frame = DataFrame.decode(data)
    assert len(data) == 32 and frame.is_heartbeat and frame.flags == 0xC0
    assert frame.term_offset == 64 and frame.term_id == 5


def test_close_drains_then_sends_eos_and_lingers() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock, linger_ns=500 * MS)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    pub.offer(b"last words")
    pub.close(clock.now_ns)
    assert pub.offer(b"more") == CLOSED
    pub.send(clock.now_ns, wire)
    frames = [decode_datagram(d)[0] for d, _ in wire.take()]
    assert frames[0].payload == b"last words"
    clock.advance(MS)
    pub.send(clock.now_ns, wire)
    ((data, _),) = wire.take()
    eos = DataFrame.decode(data)
    assert eos.is_heartbeat and eos.flags == 0xE0
    assert not pub.is_done
    clock.advance(HEARTBEAT_INTERVAL_NS)
    pub.send(clock.now_ns, wire)
    assert DataFrame.decode(wire.take()[0][0]).flags == 0xE0
    clock.advance(500 * MS)
    pub.send(clock.now_ns, wire)
    assert pub.is_done


def test_eos_status_message_ends_the_linger_early() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    pub.close(clock.now_ns)
    pub.send(clock.now_ns, wire)
    pub.on_status_message(sm(pub, 0, flags=SmFlags.EOS), RECEIVER, clock.now_ns)
    clock.advance(MS)
    pub.send(clock.now_ns, wire)
    assert pub.is_done


@pytest.mark.parametrize("leaves", ["eos", "timeout"])
def test_closed_publication_whose_receivers_left_undrained_lingers_then_is_done(
    leaves: str,
) -> None:
    # Aeron's DRAINING state: with no receiver left, what was never sent cannot be drained,
    # so the publication lingers and is freed instead of waiting for a flow-control window.
    clock, wire = ManualClock(), Wire()
    pub = make(clock, linger_ns=500 * MS)
    pub.on_status_message(sm(pub, 0, window=1024), RECEIVER, clock.now_ns)
    for _ in range(4):
        assert pub.offer(b"x" * 900) > 0
    pub.close(clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert pub.sender_position < pub.appender.position  # held back by the window
    if leaves == "eos":
        pub.on_status_message(sm(pub, 0, window=1024, flags=SmFlags.EOS), RECEIVER, clock.now_ns)
    else:
        clock.advance(CONNECTION_TIMEOUT_NS + 1)
    pub.send(clock.now_ns, wire)
    assert not pub.receivers and not pub.is_done
    clock.advance(500 * MS)
    pub.send(clock.now_ns, wire)
    assert pub.is_done
    assert pub.next_deadline_ns >= clock.now_ns


def test_connection_times_out_without_status_messages() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    assert pub.offer(b"a") > 0
    clock.advance(CONNECTION_TIMEOUT_NS + 1)
    pub.send(clock.now_ns, wire)
    assert not pub.is_connected
    assert pub.offer(b"b") == NOT_CONNECTED


def test_nak_is_answered_with_exact_copies_of_the_original_datagrams_then_lingers() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    for i in range(30):
        pub.offer(bytes([i]) * 300, reserved_value=i)
    pub.send(clock.now_ns, wire)
    originals = [d for d, _ in wire.take()]
    second = originals[1]
    offset = DataFrame.decode(second).term_offset
    pub.on_nak(NakFrame(77, 10, 5, offset, len(second)), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert [d for d, _ in wire.take()] == [second]
    pub.on_nak(NakFrame(77, 10, 5, offset, len(second)), clock.now_ns + MS)
    pub.send(clock.now_ns, wire)
    assert wire.take() == []  # inside the retransmit linger
    clock.advance(pub.retransmit_linger_ns)
    pub.on_nak(NakFrame(77, 10, 5, offset, len(second)), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert [d for d, _ in wire.take()] == [second]
    assert pub.retransmits_sent == 2


def test_nak_outside_the_term_or_ahead_of_the_sender_is_ignored() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    pub.offer(bytes(100))
    pub.send(clock.now_ns, wire)
    wire.take()
    pub.on_nak(NakFrame(77, 10, 5, pub.term_length, 100), clock.now_ns)
    pub.on_nak(NakFrame(77, 10, 5, 4096, 100), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    assert pub.invalid_naks == 1


def test_rttm_request_is_answered() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_rttm(RttMeasurement(77, 10, 123456, 0, 42, flags=0x80), RECEIVER)
    pub.send(clock.now_ns, wire)
    replies = [(RttMeasurement.decode(d), a) for d, a in wire.take() if d[6] == 6]
    assert replies == [(RttMeasurement(77, 10, 123456, 0, 42, flags=0), RECEIVER)]


def test_send_setup_status_message_makes_the_sender_repeat_setup() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    pub.send(clock.now_ns, wire)
    wire.take()
    pub.on_status_message(
        StatusMessage(77, 10, 0, 0, 0, 1, flags=SmFlags.SEND_SETUP), RECEIVER, clock.now_ns
    )
    pub.send(clock.now_ns, wire)
    assert [d[6] for d, _ in wire.take()] == [5]


def test_max_message_length_is_enforced_and_max_position_reported() -> None:
    clock = ManualClock()
    pub = make(clock)
    with pytest.raises(LocalProtocolError):
        pub.offer(bytes(pub.max_message_length + 1))
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    pub.max_position = pub.appender.position + 64
    assert pub.offer(bytes(100)) == MAX_POSITION_EXCEEDED


def test_claimed_frame_blocks_the_sender_until_committed_and_abort_becomes_padding() -> None:
    clock, wire = ManualClock(), Wire()
    pub = make(clock)
    pub.on_status_message(sm(pub, 0), RECEIVER, clock.now_ns)
    assert pub.claim_check(10) == 0
    term, offset = pub.claim(10)
    term[offset + 32 : offset + 42] = b"0123456789"
    assert not pub.has_data_to_send()
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    commit_claim(term, offset)
    term2, offset2 = pub.claim(5)
    abort_claim(term2, offset2)
    pub.offer(b"after")
    pub.send(clock.now_ns, wire)
    frames = [f for d, _ in wire.take() for f in decode_datagram(d)]
    assert frames[0].payload == b"0123456789"
    assert frames[1].frame_type == 0  # the aborted claim, as padding
    assert frames[2].payload == b"after"


def _sent_twenty_four(
    clock: ManualClock, wire: Wire, window: int = 128 * 1024
) -> tuple[PublicationState, list[bytes], list[int]]:
    """A connected publication that has sent 24 datagrams; (pub, datagrams, their offsets)."""
    pub = make(clock)
    pub.on_status_message(sm(pub, 0, window=window), RECEIVER, clock.now_ns)
    for i in range(120):
        pub.offer(bytes([i]) * 200)  # 256-byte frames, five to a 1408-byte datagram
    pub.send(clock.now_ns, wire)
    originals = [d for d, _ in wire.take()]
    assert len(originals) == 24
    return pub, originals, [DataFrame.decode(d).term_offset for d in originals]


def test_a_nak_overlapping_a_range_just_retransmitted_resends_only_what_is_new() -> None:
    # Two NAKs for overlapping ranges with different starts (a gap whose start moved as its
    # retransmit arrived): the overlap is not sent twice within the linger (issue 15).
    clock, wire = ManualClock(), Wire()
    pub, originals, offsets = _sent_twenty_four(clock, wire)
    pub.on_nak(NakFrame(77, 10, 5, offsets[1], offsets[4] - offsets[1]), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert [d for d, _ in wire.take()] == originals[1:4]
    clock.advance(MS)
    pub.on_nak(NakFrame(77, 10, 5, offsets[2], offsets[6] - offsets[2]), clock.now_ns)
    pub.on_nak(NakFrame(77, 10, 5, offsets[3], offsets[4] - offsets[3]), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert [d for d, _ in wire.take()] == originals[4:6]
    assert pub.retransmitted_bytes == sum(len(d) for d in originals[1:6])
    assert pub.retransmits_suppressed == 2


def test_a_nak_for_a_range_still_queued_is_not_queued_twice() -> None:
    clock, wire = ManualClock(), Wire()
    pub, originals, offsets = _sent_twenty_four(clock, wire)
    for _ in range(5):  # a burst of NAKs before the sender got to send anything
        pub.on_nak(NakFrame(77, 10, 5, offsets[7], offsets[9] - offsets[7]), clock.now_ns)
    pub.on_nak(NakFrame(77, 10, 5, offsets[8], offsets[10] - offsets[8]), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert [d for d, _ in wire.take()] == originals[7:10]


def test_retransmits_within_a_linger_are_bounded_by_the_receiver_window() -> None:
    # A flood of NAKs for distinct ranges may not make the sender resend more than one receiver
    # window per linger period; what is refused is counted and NAKed again later.
    clock, wire = ManualClock(), Wire()
    window = 4 * 1408
    pub, originals, offsets = _sent_twenty_four(clock, wire, window=128 * 1024)
    pub.on_status_message(sm(pub, 0, window=window), RECEIVER, clock.now_ns)
    for i in range(23):
        pub.on_nak(NakFrame(77, 10, 5, offsets[i], offsets[i + 1] - offsets[i]), clock.now_ns)
    pub.send(clock.now_ns, wire)
    resent = [d for d, _ in wire.take()]
    assert 0 < sum(len(d) for d in resent) <= window and len(resent) < 23
    assert pub.retransmits_suppressed >= 23 - len(resent)
    clock.advance(pub.retransmit_linger_ns + 1)
    pub.on_nak(NakFrame(77, 10, 5, offsets[20], offsets[21] - offsets[20]), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert [d for d, _ in wire.take()] == [originals[20]]


def test_a_nak_at_an_offset_that_is_not_frame_aligned_is_invalid() -> None:
    clock, wire = ManualClock(), Wire()
    pub, originals, offsets = _sent_twenty_four(clock, wire)
    pub.on_nak(NakFrame(77, 10, 5, offsets[1] + 8, 512), clock.now_ns)
    pub.send(clock.now_ns, wire)
    assert wire.take() == [] and pub.invalid_naks == 1
