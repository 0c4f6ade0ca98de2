"""An idle stream costs (almost) nothing (issue 31 item 1): the sender and the receiver step
only what is due, kicked or at its deadline, never every publication and image on every
step; and an idle stream's heartbeats and status messages keep Aeron's cadence (100 ms and
200 ms: spaced out, a flooded server lost sessions)."""

from __future__ import annotations

import socket
from typing import Any

from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import SendEndpoint, SenderAgent
from aeron_spark.transport.driver.endpoint import Endpoint, UdpEndpoint
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS
from aeron_spark.transport.protocol.frames import DataFlags, FrameType, SetupFrame, StatusMessage
from aeron_spark.transport.protocol.heartbeat import HEARTBEAT_INTERVAL_NS
from aeron_spark.transport.protocol.image import IMAGE_LIVENESS_TIMEOUT_NS, SM_INTERVAL_NS
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.protocol.schedule import DueQueue
from aeron_spark.transport.protocol.term import encode_data_header
from aeron_spark.transport.testing import ManualClock

MS = 1_000_000
TERM = 64 * 1024
SENDERS = [("127.0.0.1", 42000 + i) for i in range(100)]


def _count_calls(obj: Any, name: str, calls: list[Any]) -> None:
    """Record each call of ``obj.<name>`` (the real method still runs)."""
    real = getattr(obj, name)

    def counted(*args: Any) -> Any:
        calls.append(obj)
        return real(*args)

    setattr(obj, name, counted)


def _sm(pub: PublicationState, receiver_id: int) -> StatusMessage:
    return StatusMessage(pub.session_id, pub.stream_id, pub.initial_term_id, 0, TERM, receiver_id)


def test_due_queue_gives_ready_items_then_due_ones_each_once() -> None:
    q: DueQueue[str] = DueQueue()
    q.schedule("a", 30)
    q.schedule("b", 20)
    q.schedule("b", 10)  # earlier: replaces it (the entry at 20 is stale)
    q.schedule("b", 40)  # later: the earlier stays (b is stepped early, schedules again)
    q.ready.append("c")
    q.ready.append("c")
    assert q.next_ns(1000) == 0  # ready: now
    assert q.take(5) == ["c"]
    assert q.next_ns(1000) == 10
    assert q.take(15) == ["b"]
    q.schedule("b", 20)
    q.forget("b")
    assert q.next_ns(1000) == 30 and q.take(25) == []
    assert q.take(30) == ["a"] and q.next_ns(1000) == 1000 and len(q) == 0


def test_due_queue_heap_stays_bounded_when_deadlines_move() -> None:
    q: DueQueue[int] = DueQueue()
    for t in range(10_000, 0, -1):
        q.schedule(t % 3, t)  # ever earlier: each replaces the last
    assert len(q) == 3 and len(q._heap) <= 2 * 3 + 64


def test_the_sender_steps_only_the_publications_that_are_due() -> None:
    """100 connected idle publications on one socket: a step between their deadlines sends
    for none of them (each step called send() on every publication before)."""
    clock, counters = ManualClock(), SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    try:
        ep = SendEndpoint("k", udp)
        agent = SenderAgent(counters, lambda ep, pub: ep.remove(pub))
        agent.endpoints = (ep,)
        pubs = []
        for i, dest in enumerate(SENDERS):
            pub = PublicationState(
                session_id=1000 + i,
                stream_id=10,
                initial_term_id=0,
                term_id=0,
                term_offset=0,
                term_length=TERM,
                mtu=1408,
                destination=dest,
                now_ns=clock.now_ns,
            )
            ep.add(pub)
            pub.on_status_message(_sm(pub, i), dest, clock.now_ns)
            pubs.append(pub)
        agent.do_work(clock.now_ns)  # each added publication is stepped once
        assert not agent.has_work()
        calls: list[Any] = []
        for pub in pubs:
            _count_calls(pub, "send", calls)
        clock.advance(HEARTBEAT_INTERVAL_NS // 2)
        agent.do_work(clock.now_ns)
        assert calls == []
        assert agent.next_deadline_ns(clock.now_ns) == clock.now_ns + HEARTBEAT_INTERVAL_NS // 2
        pubs[7].offer(b"x")
        pubs[7].kick()  # what the client's offer does (NetworkPublicationLog.appended)
        assert agent.has_work()
        agent.do_work(clock.now_ns)
        assert calls == [pubs[7]]
        clock.advance(HEARTBEAT_INTERVAL_NS // 2)
        calls.clear()
        agent.do_work(clock.now_ns)  # their heartbeats are due: each stepped once
        assert sorted(map(id, calls)) == sorted(map(id, pubs))
    finally:
        udp.close()


def test_the_receiver_steps_only_the_images_that_are_due() -> None:
    clock, wire = ManualClock(), []
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10)
    dispatcher.add(interest)

    def transmit(data: Any, address: Any) -> None:
        wire.append(bytes(data))

    for i, source in enumerate(SENDERS):
        setup = SetupFrame(0, 2000 + i, 10, 0, 0, TERM, 1408).encode()
        dispatcher.on_datagram(setup, len(setup), source, clock.now_ns, transmit)
    dispatcher.do_work(clock.now_ns, transmit)  # each image's first SM
    assert len(wire) == 100
    calls: list[Any] = []
    for image in interest.images.values():
        _count_calls(image, "do_work", calls)
    clock.advance(SM_INTERVAL_NS // 2)
    dispatcher.do_work(clock.now_ns, transmit)
    assert calls == []
    hb = encode_data_header(0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, 2005, 10, 0)
    dispatcher.on_datagram(hb, len(hb), SENDERS[5], clock.now_ns, transmit)
    dispatcher.do_work(clock.now_ns, transmit)
    assert calls == [interest.images[2005]]


def test_an_idle_publication_keeps_heartbeating_every_100_ms() -> None:
    """The cap: an idle stream's heartbeats keep Aeron's 100 ms all through the image liveness
    (spaced out to 1 s, a flooded server's images expired: the hostile-flood test lost
    sessions in CI)."""
    clock, sent = ManualClock(), []
    dest = ("127.0.0.1", 40000)
    pub = PublicationState(
        session_id=5,
        stream_id=10,
        initial_term_id=0,
        term_id=0,
        term_offset=0,
        term_length=TERM,
        mtu=1408,
        destination=dest,
        now_ns=clock.now_ns,
    )

    def transmit(data: Any, address: Any) -> None:
        sent.append(clock.now_ns)

    pub.on_status_message(_sm(pub, 1), dest, clock.now_ns)
    pub.offer(b"data")
    pub.send(clock.now_ns, transmit)
    start, sent[:] = clock.now_ns, []
    while clock.now_ns - start < IMAGE_LIVENESS_TIMEOUT_NS:
        clock.now_ns = pub.next_deadline_ns
        pub.on_status_message(_sm(pub, 1), dest, clock.now_ns)  # the receiver stays
        pub.send(clock.now_ns, transmit)
    gaps = [b - a for a, b in zip([start, *sent], sent, strict=False)]
    assert gaps and all(g == HEARTBEAT_INTERVAL_NS for g in gaps)
    assert len(sent) >= IMAGE_LIVENESS_TIMEOUT_NS // HEARTBEAT_INTERVAL_NS - 1


def test_an_idle_image_keeps_its_status_messages_every_200_ms() -> None:
    """The cap: an idle image repeats its status message every 200 ms (Aeron's cadence; spaced
    out to 500 ms, sessions were lost under a flood)."""
    clock, sms = ManualClock(), []
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10)
    dispatcher.add(interest)

    def transmit(data: Any, address: Any) -> None:
        if data[6] == FrameType.SM:
            sms.append(clock.now_ns)

    setup = SetupFrame(0, 7, 10, 0, 0, TERM, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SENDERS[0], clock.now_ns, transmit)
    start = clock.now_ns
    hb = encode_data_header(0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, 7, 10, 0)
    while clock.now_ns - start < CONNECTION_TIMEOUT_NS:
        dispatcher.do_work(clock.now_ns, transmit)
        clock.now_ns = dispatcher.next_deadline_ns(clock.now_ns)
        dispatcher.on_datagram(hb, len(hb), SENDERS[0], clock.now_ns, transmit)  # alive
    gaps = [b - a for a, b in zip(sms, sms[1:], strict=False)]
    assert gaps and all(g == SM_INTERVAL_NS for g in gaps)
    assert len(sms) >= CONNECTION_TIMEOUT_NS // SM_INTERVAL_NS
