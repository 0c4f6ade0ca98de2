"""Who a dynamic (multi-destination-cast) publication sends to, stepped by a manual clock (issue
22, items 1 and 2): NAKs are taken only from its destinations and answered only to the one that
asked, within that destination's own window; a publication limited to one host's SMs for its
own session (a secure session's) takes no stranger and no session-0 SM."""

from __future__ import annotations

from aeron_spark.transport.api import NOT_CONNECTED
from aeron_spark.transport.protocol.frames import NakFrame, SmFlags, StatusMessage
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.testing import ManualClock, Wire

A = ("127.0.0.5", 4000)
B = ("127.0.0.6", 4000)
STRANGER = ("127.0.0.66", 4000)
TERM = 1 << 20


def _pub(clock: ManualClock) -> PublicationState:
    return PublicationState(
        session_id=77,
        stream_id=10,
        initial_term_id=5,
        term_id=5,
        term_offset=0,
        term_length=TERM,
        mtu=1408,
        dynamic=True,
        now_ns=clock.now_ns,
    )


def _sm(session_id: int, window: int, receiver_id: int, flags: int = 0) -> StatusMessage:
    return StatusMessage(session_id, 10, 5, 0, window, receiver_id, flags=flags)


def test_naks_only_from_destinations_and_retransmits_only_to_the_asker_within_its_window() -> None:
    clock, wire = ManualClock(), Wire()
    pub = _pub(clock)
    pub.on_status_message(_sm(77, 64 * 1024, 1), A, clock.now_ns)
    pub.on_status_message(_sm(77, 512 * 1024, 2), B, clock.now_ns)
    for i in range(200):
        assert pub.offer(bytes([i % 251]) * 1000) > 0
    while pub.sender_position < pub.appender.position:
        assert pub.send(clock.now_ns, wire) > 0
    assert {address for _, address in wire.take()} == {A, B}

    # 20 NAKs of half a term each (all that was sent) from an address that is no destination
    for _ in range(20):
        pub.on_nak(NakFrame(77, 10, 5, 0, TERM // 2), clock.now_ns, STRANGER)
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    assert pub.naks_refused == 20 and pub.retransmits_sent == 0

    # the same from destination A: resent to A only, at most A's window while they linger
    for _ in range(20):
        pub.on_nak(NakFrame(77, 10, 5, 0, TERM // 2), clock.now_ns, A)
    pub.send(clock.now_ns, wire)
    resent = wire.take()
    assert resent and {address for _, address in resent} == {A}
    assert sum(len(data) for data, _ in resent) <= 64 * 1024 + 1408
    assert pub.retransmits_suppressed >= 19


def test_a_session_publication_takes_one_destination_from_its_client_and_own_session() -> None:
    clock, wire = ManualClock(), Wire()
    pub = _pub(clock)
    pub.allowed_hosts = frozenset({A[0]})
    pub.session_sm_only = True
    pub.max_destinations = 1
    # a session-0 "send me SETUPs" SM, from the client's host or anyone else: nothing
    pub.on_status_message(_sm(0, 1 << 16, 3, SmFlags.SEND_SETUP), STRANGER, clock.now_ns)
    pub.on_status_message(_sm(0, 1 << 16, 4, SmFlags.SEND_SETUP), A, clock.now_ns)
    # the session's own id from another host: nothing either
    pub.on_status_message(_sm(77, 1 << 16, 5, SmFlags.SEND_SETUP), STRANGER, clock.now_ns)
    # (the last is held for REFUSED_ELICIT_NS in case its host is allowed: deferred)
    assert pub.destinations == {} and pub.status_messages_refused == 2
    assert pub.status_messages_deferred == 1
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    # the client: its own session id from its host
    pub.on_status_message(_sm(77, 1 << 16, 6, SmFlags.SEND_SETUP), A, clock.now_ns)
    assert list(pub.destinations) == [A] and pub.destination_hosts == {A[0]}
    # a second socket on the client's host is past max_destinations
    pub.on_status_message(_sm(77, 1 << 16, 7), (A[0], A[1] + 1), clock.now_ns)
    assert list(pub.destinations) == [A] and pub.status_messages_refused == 3
    pub.send(clock.now_ns, wire)
    assert {address for _, address in wire.take()} == {A}


def test_a_setup_request_refused_before_its_host_was_allowed_is_answered_once_allowed() -> None:
    """A handshake client asks the reply publication for a SETUP before its HELLO image makes
    the server allow its host: once allowed (soon after), that request gets its SETUP at once,
    not at the client's next elicit 100 ms later. A host never allowed gets nothing, a request
    older than REFUSED_ELICIT_NS is forgotten, and each is answered once. Held requests are
    counted as deferred, and as refused only once their host was not allowed in time (issue 33:
    every honest client's first request was counted in status_messages_refused)."""
    clock, wire = ManualClock(), Wire()
    pub = _pub(clock)
    pub.allowed_hosts = frozenset()
    for source in (A, B, STRANGER):
        pub.on_status_message(_sm(0, 1 << 16, 3, SmFlags.SEND_SETUP), source, clock.now_ns)
        pub.on_status_message(_sm(0, 1 << 16, 3, SmFlags.SEND_SETUP), source, clock.now_ns)
    assert pub.destinations == {} and pub.status_messages_refused == 0
    assert pub.status_messages_deferred == 3  # a repeated request renews the one held
    pub.send(clock.now_ns, wire)
    assert wire.take() == []
    clock.advance(5_000_000)  # 5 ms
    pub.allowed_hosts = frozenset({A[0]})  # A's HELLO image is up
    pub.send(clock.now_ns, wire)
    sent = wire.take()
    assert [address for _, address in sent] == [A]
    assert sent[0][0][6] == 5  # a SETUP
    pub.send(clock.now_ns, wire)
    assert wire.take() == []  # once
    assert pub.status_messages_refused == 0  # A's was answered: not a refusal
    clock.advance(100_000_000)  # REFUSED_ELICIT_NS
    pub.allowed_hosts = frozenset({A[0], B[0]})  # too late for B's request: it elicits again
    pub.send(clock.now_ns, wire)
    assert B not in {address for _, address in wire.take()}  # (A: its periodic SETUP)
    assert B not in pub.destinations and STRANGER not in pub.destinations
    # B's host was allowed (late: not refused); the stranger's never was (refused)
    assert pub.refused_elicits == {} and pub.status_messages_refused == 1
    # a stranger's request expires refused without any change of the allowed hosts
    pub.on_status_message(_sm(0, 1 << 16, 3, SmFlags.SEND_SETUP), STRANGER, clock.now_ns)
    assert pub.status_messages_refused == 1 and pub.status_messages_deferred == 4
    clock.advance(100_000_001)
    pub.send(clock.now_ns, wire)
    assert pub.refused_elicits == {} and pub.status_messages_refused == 2
    # a flood of refused requests is remembered up to a bound
    from aeron_spark.transport.protocol.publication import REFUSED_ELICITS_MAX

    for port in range(1000):
        sm = _sm(0, 1 << 16, 3, SmFlags.SEND_SETUP)
        pub.on_status_message(sm, ("127.0.0.99", port), clock.now_ns)
    assert len(pub.refused_elicits) <= REFUSED_ELICITS_MAX
    # those pushed out were refused
    assert pub.status_messages_refused == 2 + 1000 - len(pub.refused_elicits)


def test_offers_answer_not_connected_once_the_last_destination_timed_out() -> None:
    """A dynamic publication whose every destination fell silent past the connection timeout
    drops them, and with them its receivers: nobody is connected, so its publisher limit falls
    back to the sender's position and offers answer NOT_CONNECTED (Aeron's rule), not appended
    into a window nobody reads any more (it stayed at the old window until the next SM)."""
    clock, wire = ManualClock(), Wire()
    pub = _pub(clock)
    pub.on_status_message(_sm(77, 64 * 1024, 1), A, clock.now_ns)
    assert pub.offer(b"x" * 100) > 0
    pub.send(clock.now_ns, wire)
    assert pub.is_connected and pub.publisher_limit > pub.sender_position
    clock.advance(pub.dests.connection_timeout_ns + 1_000_000_000)
    pub.send(clock.now_ns, wire)
    assert pub.destinations == {} and not pub.is_connected
    assert pub.publisher_limit == pub.sender_position, (pub.publisher_limit, pub.sender_position)
    assert pub.offer(b"y" * 100) == NOT_CONNECTED
