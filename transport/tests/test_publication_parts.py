"""The publication's parts, each stepped alone with a manual clock: flow control, destinations,
retransmits, the SETUP / heartbeat / RTTM frames (issue 29 item 3: one module per rule)."""

from __future__ import annotations

from typing import Any

from aeron_spark.transport.protocol.destinations import (
    REFUSED_ELICIT_NS,
    REFUSED_ELICITS_MAX,
    Destinations,
)
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS, FlowControl
from aeron_spark.transport.protocol.frames import (
    DataFlags,
    RttMeasurement,
    SetupFrame,
    decode_datagram,
)
from aeron_spark.transport.protocol.heartbeat import heartbeat_frame, rttm_reply, setup_frame
from aeron_spark.transport.protocol.retransmit import MAX_RETRANSMIT_RANGES, RetransmitHandler
from aeron_spark.transport.testing import ManualClock

A = ("10.0.0.1", 4000)
B = ("10.0.0.2", 4000)


# ------------------------------------------------------------------ flow control


def test_the_sender_limit_follows_the_most_advanced_receiver_and_never_goes_down() -> None:
    flow, clock = FlowControl(0, 1024), ManualClock()
    flow.on_status_message(1, 4096, 1024, clock.now_ns)
    flow.on_status_message(2, 1024, 1024, clock.now_ns)
    assert flow.sender_limit == 5120 and flow.has_initial_connection
    assert set(flow.receivers) == {1, 2} and flow.retransmit_window == 1024


def test_a_receiver_silent_past_the_timeout_is_gone_and_eos_removes_one_at_once() -> None:
    flow, clock = FlowControl(0, 1024), ManualClock()
    flow.on_status_message(1, 0, 1024, clock.now_ns)
    flow.on_status_message(2, 0, 1024, clock.now_ns)
    flow.on_end_of_stream(2)
    assert set(flow.receivers) == {1}
    assert flow.next_expiry_ns() == clock.now_ns + CONNECTION_TIMEOUT_NS + 1
    clock.advance(CONNECTION_TIMEOUT_NS)
    assert not flow.expire(clock.now_ns) and flow.receivers
    clock.advance(1)
    assert flow.expire(clock.now_ns) and not flow.receivers
    assert flow.has_initial_connection  # once connected, always was
    assert flow.next_expiry_ns() is None


# ------------------------------------------------------------------ destinations


def test_a_destination_is_added_only_as_the_rules_allow() -> None:
    dests = Destinations(session_id=7)
    dests.allowed_hosts = frozenset({"10.0.0.1"})
    assert dests.may_add(A, 0) and not dests.may_add(B, 0)
    dests.session_sm_only = True
    assert not dests.may_add(A, 0) and dests.may_add(A, 7)
    dests.max_destinations = 1
    dests.add(A, 0)
    assert not dests.may_add(("10.0.0.1", 4001), 7)
    assert dests.hosts == frozenset({"10.0.0.1"})


def test_a_held_setup_request_is_answered_when_its_host_is_allowed_in_time() -> None:
    dests, clock = Destinations(session_id=7), ManualClock()
    dests.allowed_hosts = frozenset()
    assert dests.refused_only_for_host(A, 7)
    dests.hold_refused(A, 7, clock.now_ns)
    assert dests.status_messages_deferred == 1 and not dests.refused_due(clock.now_ns)
    dests.allowed_hosts = frozenset({"10.0.0.1"})  # replaced whole: the change is seen
    assert dests.refused_changed() and dests.refused_due(clock.now_ns)
    assert dests.answer_refused(clock.now_ns, 1024)
    assert A in dests.by_address and dests.refused_elicits == {}
    assert dests.status_messages_refused == 0


def test_a_held_setup_request_whose_host_is_not_allowed_in_time_is_counted_refused() -> None:
    dests, clock = Destinations(session_id=7), ManualClock()
    dests.allowed_hosts = frozenset()
    dests.hold_refused(A, 7, clock.now_ns)
    assert dests.next_refused_ns() == clock.now_ns + REFUSED_ELICIT_NS + 1
    clock.advance(REFUSED_ELICIT_NS + 1)
    assert dests.refused_due(clock.now_ns)
    assert not dests.answer_refused(clock.now_ns, 1024)
    assert dests.status_messages_refused == 1 and not dests.by_address


def test_held_setup_requests_are_bounded_the_oldest_going_first() -> None:
    dests, clock = Destinations(session_id=7), ManualClock()
    dests.allowed_hosts = frozenset()
    for port in range(REFUSED_ELICITS_MAX + 5):
        dests.hold_refused(("10.0.1.1", port), 7, clock.now_ns)
    assert len(dests.refused_elicits) == REFUSED_ELICITS_MAX
    assert dests.status_messages_refused == 5
    assert ("10.0.1.1", 0) not in dests.refused_elicits


def test_a_silent_or_no_longer_allowed_destination_is_dropped_with_its_receivers() -> None:
    dests, clock = Destinations(session_id=7), ManualClock()
    receivers = {1: clock.now_ns, 2: clock.now_ns}
    dests.add(A, clock.now_ns).receiver_ids.add(1)
    dests.add(B, clock.now_ns).receiver_ids.add(2)
    dests.allowed_hosts = frozenset({"10.0.0.1"})
    assert dests.expire(clock.now_ns, receivers)
    assert set(dests.by_address) == {A} and set(receivers) == {1}
    clock.advance(CONNECTION_TIMEOUT_NS + 1)
    assert dests.expire(clock.now_ns, receivers)
    assert not dests.by_address and not receivers and dests.hosts == frozenset()


# ------------------------------------------------------------------ retransmits


class Resender:
    """Resends whole 32-byte frames: records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, Any]] = []

    def __call__(self, start: int, end: int, to: Any) -> tuple[int, int]:
        self.calls.append((start, end, to))
        return (end - start) // 32, end - start


def test_a_range_lingering_is_not_resent_again_until_its_linger_passes() -> None:
    handler, resend, clock = RetransmitHandler(linger_ns=1000), Resender(), ManualClock()
    assert handler.on_nak(0, 256, A, 4096, 64, clock.now_ns, resend) == 8
    # overlapping NAK: only the part not lingering goes
    assert handler.on_nak(128, 512, A, 4096, 64, clock.now_ns, resend) == 8
    assert resend.calls[-1] == (256, 512, A) and handler.retransmits_suppressed == 1
    # another destination has its own ranges
    handler.on_nak(0, 256, B, 4096, 64, clock.now_ns, resend)
    assert resend.calls[-1] == (0, 256, B)
    clock.advance(1000)
    handler.on_nak(0, 256, A, 4096, 64, clock.now_ns, resend)
    assert resend.calls[-1] == (0, 256, A)


def test_lingering_bytes_of_one_destination_never_exceed_its_window() -> None:
    handler, resend, clock = RetransmitHandler(linger_ns=1000), Resender(), ManualClock()
    handler.on_nak(0, 4096, A, 1024, 64, clock.now_ns, resend)
    assert resend.calls == [(0, 1024, A)] and handler.retransmits_suppressed == 1
    assert handler.on_nak(8192, 9216, A, 1024, 64, clock.now_ns, resend) == 0
    assert handler.retransmits_suppressed == 2


def test_lingering_ranges_are_bounded() -> None:
    handler, resend, clock = RetransmitHandler(linger_ns=1000), Resender(), ManualClock()
    for i in range(MAX_RETRANSMIT_RANGES + 3):
        handler.on_nak(i * 64, i * 64 + 32, None, 1 << 30, 64, clock.now_ns, resend)
    assert len(handler.ranges) == MAX_RETRANSMIT_RANGES
    assert handler.retransmits_suppressed == 3


# ------------------------------------------------------------------ control frames


def test_setup_and_heartbeat_name_the_sender_position() -> None:
    term_length = 64 * 1024
    position = 3 * term_length + 4096
    setup = SetupFrame.decode(
        setup_frame(
            position,
            session_id=5,
            stream_id=6,
            initial_term_id=100,
            term_length=term_length,
            mtu=1408,
        )
    )
    assert (setup.active_term_id, setup.term_offset, setup.mtu) == (103, 4096, 1408)
    beat = heartbeat_frame(
        position, True, session_id=5, stream_id=6, initial_term_id=100, term_length=term_length
    )
    frame = decode_datagram(beat)[0]
    assert (frame.term_id, frame.term_offset, len(beat)) == (103, 4096, 32)
    assert beat[5] & DataFlags.EOS
    plain = heartbeat_frame(
        0, False, session_id=5, stream_id=6, initial_term_id=1, term_length=4096
    )
    assert not plain[5] & DataFlags.EOS


def test_an_rttm_reply_echoes_the_timestamp() -> None:
    reply = RttMeasurement.decode(rttm_reply(RttMeasurement(5, 6, 123456, 0, 99, 0x80), 5, 6))
    assert (reply.echo_timestamp, reply.receiver_id, reply.flags) == (123456, 99, 0)
