"""An idle stream costs (almost) nothing (issue 31 item 1): the sender and the receiver step
only what is due, kicked or at its deadline, never every publication and image on every
step; and an idle stream's heartbeats and status messages keep Aeron's cadence (100 ms and
200 ms) unless its channel asks for longer idle intervals (our own sessions' channels do)."""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import (
    ReceiveEndpoint,
    ReceiverAgent,
    SendEndpoint,
    SenderAgent,
)
from aeron_spark.transport.driver.endpoint import Endpoint, UdpEndpoint
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS, FlowControlPolicy
from aeron_spark.transport.protocol.frames import (
    DataFlags,
    FrameType,
    SetupFrame,
    SmFlags,
    StatusMessage,
)
from aeron_spark.transport.protocol.heartbeat import HEARTBEAT_INTERVAL_NS
from aeron_spark.transport.protocol.image import IMAGE_LIVENESS_TIMEOUT_NS, SM_INTERVAL_NS
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.protocol.schedule import IDLE_GRID_NS, DueQueue
from aeron_spark.transport.protocol.term import encode_data_header
from aeron_spark.transport.testing import ManualClock, session_publication
from aeron_spark.transport.uri import ChannelConfig

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
            pub = session_publication(clock, dest, 1000 + i)
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


def _read_until(agent: SenderAgent, counters: SystemCounters, received: int, now_ns: int) -> None:
    """Step the sender until its sockets have received ``received`` datagrams in all (real
    loopback datagrams: bounded wait, no spin)."""
    deadline = time.monotonic() + 20
    while counters.datagrams_received < received:
        assert time.monotonic() < deadline, "datagrams never arrived"
        agent.do_work(now_ns)
        time.sleep(0.001)
    agent.do_work(now_ns)


def test_a_status_message_that_only_repeats_a_position_does_not_step_the_publication() -> None:
    """Issue 31: every SM received made the sender step its publication (a full ``send``:
    destinations, flow control, data, heartbeat): a third of a server's sender steps, most for
    SMs that changed nothing. Over real loopback datagrams: ten SMs repeating a position step
    it not once; an SM whose window lets held-back data go steps it once (the data goes), an SM
    asking for SETUP steps it once (the SETUP goes)."""
    clock, counters = ManualClock(), SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    peer_counters = SystemCounters()
    peer = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), peer_counters)
    try:
        ep = SendEndpoint("k", udp)
        agent = SenderAgent(counters, lambda ep, pub: ep.remove(pub))
        agent.endpoints = (ep,)
        me = ("127.0.0.1", udp.local_port)
        pub = session_publication(clock, ("127.0.0.1", peer.local_port), 1000)
        ep.add(pub)

        def sm(window: int, flags: int = 0) -> bytes:
            return StatusMessage(1000, 10, 0, 0, window, 5, flags=flags).encode()

        peer.send(sm(128), me)  # the first SM: connected, a 128-byte window
        _read_until(agent, counters, 1, clock.now_ns)
        assert pub.is_connected and not agent.has_work()
        calls: list[Any] = []
        _count_calls(pub, "send", calls)
        for _ in range(10):
            peer.send(sm(128), me)
        _read_until(agent, counters, 11, clock.now_ns)
        assert calls == []
        sent = counters.datagrams_sent
        assert pub.offer(bytes(200)) > 0  # more than the window: held back
        pub.kick()
        agent.do_work(clock.now_ns)
        assert len(calls) == 1 and counters.datagrams_sent == sent
        calls.clear()
        peer.send(sm(4096), me)  # a wider window: the data may go now
        _read_until(agent, counters, 12, clock.now_ns)
        assert calls == [pub] and counters.datagrams_sent == sent + 1
        calls.clear()
        setups = pub.setups_sent
        peer.send(sm(4096, int(SmFlags.SEND_SETUP)), me)
        _read_until(agent, counters, 13, clock.now_ns)
        assert calls == [pub] and pub.setups_sent == setups + 1
    finally:
        udp.close()
        peer.close()


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
    # a heartbeat at the position it has, then in-order data: moved at once, nothing to step
    # (each DATA datagram stepped its image: a fifth of a receiver's work; issue 31)
    flags = DataFlags.UNFRAGMENTED
    hb = encode_data_header(0, flags, FrameType.DATA, 0, 2005, 10, 0)
    dispatcher.on_datagram(hb, len(hb), SENDERS[5], clock.now_ns, transmit)
    data = encode_data_header(64, flags, FrameType.DATA, 0, 2005, 10, 0) + bytes(32)
    dispatcher.on_datagram(data, len(data), SENDERS[5], clock.now_ns, transmit)
    dispatcher.do_work(clock.now_ns, transmit)
    assert calls == [] and interest.images[2005].rebuild_position == 64
    # a heartbeat past what arrived (data lost before it): a gap to scan, stepped now
    hb = encode_data_header(0, flags, FrameType.DATA, 1024, 2005, 10, 0)
    dispatcher.on_datagram(hb, len(hb), SENDERS[5], clock.now_ns, transmit)
    dispatcher.do_work(clock.now_ns, transmit)
    assert calls == [interest.images[2005]]
    assert interest.images[2005].gaps


def test_an_idle_publication_keeps_heartbeating_every_100_ms() -> None:
    """The cap: an idle stream's heartbeats keep Aeron's 100 ms all through the image liveness
    (spaced out to 1 s, a flooded server's images expired: the hostile-flood test lost
    sessions in CI)."""
    clock, sent = ManualClock(), []
    dest = ("127.0.0.1", 40000)
    pub = session_publication(clock, dest)

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


def _idle_image(
    interest: StreamInterest,
) -> tuple[ManualClock, ReceiveDispatcher, Callable[[Any, Any], None], list[int]]:
    """An image of ``interest`` (a SETUP of session 7), kept alive by heartbeats for a
    connection timeout on a manual clock: the clock, the dispatcher, its ``transmit`` and the
    times of the status messages it sent."""
    clock, sms = ManualClock(), []
    dispatcher = ReceiveDispatcher()
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
    return clock, dispatcher, transmit, sms


def test_an_idle_image_keeps_its_status_messages_every_200_ms() -> None:
    """The cap: an idle image repeats its status message every 200 ms (Aeron's cadence; spaced
    out to 500 ms, sessions were lost under a flood)."""
    _clock, _dispatcher, _transmit, sms = _idle_image(StreamInterest(10))
    gaps = [b - a for a, b in zip(sms, sms[1:], strict=False)]
    assert gaps and all(g == SM_INTERVAL_NS for g in gaps)
    assert len(sms) >= CONNECTION_TIMEOUT_NS // SM_INTERVAL_NS


def _idle_pub(clock: ManualClock, dest: Any, idle_ns: int) -> PublicationState:
    pub = session_publication(clock, dest, idle_heartbeat_interval_ns=idle_ns)
    pub.on_status_message(_sm(pub, 1), dest, clock.now_ns)
    return pub


def test_an_idle_heartbeat_interval_spaces_the_heartbeats_after_the_first() -> None:
    """Issue 31: a channel's ``idle-heartbeat-interval`` (here 1 s; our sessions': 2 s) keeps
    the first heartbeat after data at 100 ms (a lost last datagram is found as soon), then spaces
    them out; the image still hears several within its liveness timeout; a closing stream's EOS
    heartbeats keep 100 ms."""
    clock, sent = ManualClock(), []
    dest = ("127.0.0.1", 40000)
    pub = _idle_pub(clock, dest, 1_000_000_000)

    def transmit(data: Any, address: Any) -> None:
        sent.append((clock.now_ns, bytes(data[:8])))

    for _round in range(2):  # data, then idle; and again: the cadence starts over after data
        pub.offer(b"data")
        pub.send(clock.now_ns, transmit)
        start, sent[:] = clock.now_ns, []
        while clock.now_ns - start < IMAGE_LIVENESS_TIMEOUT_NS:
            clock.now_ns = pub.next_deadline_ns
            pub.on_status_message(_sm(pub, 1), dest, clock.now_ns)  # the receiver stays
            pub.send(clock.now_ns, transmit)
        times = [t for t, _ in sent]
        gaps = [b - a for a, b in zip([start, *times], times, strict=False)]
        assert gaps[0] == HEARTBEAT_INTERVAL_NS
        assert gaps[1:] and all(g == 1_000_000_000 for g in gaps[1:])
        # ten where Aeron's cadence sends a hundred; at least five within the liveness
        assert 5 <= len(sent) <= IMAGE_LIVENESS_TIMEOUT_NS // 1_000_000_000 + 1
    pub.close(clock.now_ns)
    pub.send(clock.now_ns, transmit)
    sent.clear()
    before = clock.now_ns
    for _ in range(3):
        clock.now_ns = pub.next_deadline_ns
        pub.send(clock.now_ns, transmit)
    assert sent and sent[0][0] - before <= HEARTBEAT_INTERVAL_NS
    assert sent[0][1][5] & DataFlags.EOS  # the EOS heartbeat, at Aeron's pace


def test_an_idle_sm_interval_spaces_an_idle_images_status_messages() -> None:
    """Issue 31: a subscription's ``idle-sm-interval`` (our sessions': 1 s) is its SM timeout
    once connected: after the SM that followed the first (200 ms, in case the first was lost)
    the SMs go a second apart; the publication still hears five SMs in its 5 s connection
    timeout."""
    interest = StreamInterest(10, idle_sm_interval_ns=1_000_000_000)
    _clock, _dispatcher, _transmit, sms = _idle_image(interest)
    gaps = [b - a for a, b in zip(sms, sms[1:], strict=False)]
    assert gaps[0] == SM_INTERVAL_NS  # the first SM's follow-up: Aeron's pace once more
    assert gaps[1:] and all(g == 1_000_000_000 for g in gaps[1:])
    assert len(sms) >= 5


def _data(term_offset: int, length: int) -> bytes:
    flags = DataFlags.UNFRAGMENTED
    frame = encode_data_header(length, flags, FrameType.DATA, term_offset, 7, 10, 0)
    return frame + bytes(length - len(frame))


def test_data_does_not_bring_status_messages_sooner_than_the_sm_timeout() -> None:
    """Issue 31: a session publishing one small message a second sent two SMs a second (each
    message brought the next SM back to 200 ms after it), each one a datagram out, one in and
    a sender step at the other end. As Aeron, an SM goes when a quarter window was consumed
    or at the SM timeout (the channel's ``idle-sm-interval``), not because data arrived: ten
    messages a second apart, each consumed, bring at most eleven SMs in those ten seconds."""
    interest = StreamInterest(10, idle_sm_interval_ns=1_000_000_000)
    clock, dispatcher, transmit, sms = _idle_image(interest)
    image = interest.images[7]
    offset = 0
    sms.clear()
    start = clock.now_ns
    for _ in range(10):
        arrive = clock.now_ns + 1_000_000_000
        while (due := dispatcher.next_deadline_ns(clock.now_ns)) < arrive:
            clock.now_ns = due
            dispatcher.do_work(clock.now_ns, transmit)
        clock.now_ns = arrive
        data = _data(offset, 128)
        offset += 128
        dispatcher.on_datagram(data, len(data), SENDERS[0], clock.now_ns, transmit)
        dispatcher.do_work(clock.now_ns, transmit)
        assert image.poll(lambda payload, header: None, 10) == 1
        dispatcher.do_work(clock.now_ns, transmit)
    assert clock.now_ns - start == 10 * 1_000_000_000
    assert 9 <= len(sms) <= 11, [(t - start) // 1_000_000 for t in sms]
    # a quarter window consumed: its SM goes at once (the sender's limit moves)
    sms.clear()
    quarter = image.window // 4
    while image.subscriber_position - image.last_sm_position <= quarter:
        data = _data(offset, 1024)
        offset += 1024
        dispatcher.on_datagram(data, len(data), SENDERS[0], clock.now_ns, transmit)
        dispatcher.do_work(clock.now_ns, transmit)
        image.poll(lambda payload, header: None, 10)
    dispatcher.do_work(clock.now_ns, transmit)
    assert sms == [clock.now_ns]


def test_the_idle_intervals_are_channel_parameters_bounded_by_the_liveness_timeouts() -> None:
    """Aeron sets these cadences driver-wide (aeron.publication.heartbeat.timeout,
    aeron.rcv.status.message.timeout); here a channel may lengthen its idle ones, no further
    than a fifth of the image liveness (heartbeats) or connection timeout (SMs); absent, a
    channel keeps Aeron's cadence (0)."""
    base = "aeron:udp?endpoint=127.0.0.1:40123"
    plain = ChannelConfig.from_uri(base)
    assert plain.idle_heartbeat_interval_ns == 0 and plain.idle_sm_interval_ns == 0
    config = ChannelConfig.from_uri(f"{base}|idle-heartbeat-interval=2s|idle-sm-interval=1s")
    assert config.idle_heartbeat_interval_ns == 2_000_000_000
    assert config.idle_sm_interval_ns == 1_000_000_000
    for bad in ("idle-heartbeat-interval=3s", "idle-heartbeat-interval=50ms"):
        with pytest.raises(ChannelError, match="idle-heartbeat-interval"):
            ChannelConfig.from_uri(f"{base}|{bad}")
    for bad in ("idle-sm-interval=2s", "idle-sm-interval=100ms", "idle-sm-interval=soon"):
        with pytest.raises(ChannelError, match="idle-sm-interval"):
            ChannelConfig.from_uri(f"{base}|{bad}")


class _CountedSockets(tuple):  # type: ignore[type-arg]
    """An endpoint's ``sockets`` that counts the walks of it."""

    walks = 0

    def __iter__(self) -> Any:
        type(self).walks += 1
        return super().__iter__()


def test_a_step_reads_the_readable_socket_without_walking_every_dedicated_one() -> None:
    """Issue 31: an endpoint holds a dedicated socket per client process (thousands on a busy
    server) and the runner's poll says which are readable; a step walked them all (twice) to
    find those, once per wake-up. Now it looks the readable ones up (an index rebuilt when the
    sockets change): the datagram is read and dispatched, and no step walks the sockets."""
    clock, counters = ManualClock(), SystemCounters()
    udps = [UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters) for _ in range(65)]
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rep = ReceiveEndpoint("k", udps[-1])
        interest = StreamInterest(10)
        rep.dispatcher.add(interest)
        agent = ReceiverAgent(counters)
        agent.endpoints = (rep,)
        rep.sockets = _CountedSockets(udps)  # 64 dedicated sockets, then the shared one
        agent.sockets_version += 1
        agent.readable = set()
        agent.do_work(clock.now_ns)  # the index is built here (one walk)
        _CountedSockets.walks = 0
        target = udps[17]
        setup = SetupFrame(0, 77, 10, 0, 0, TERM, 1408).encode()
        sender.sendto(setup, target.local_address)
        agent.readable = {target.sock}  # what the runner's poll found
        deadline = time.monotonic() + 30.0
        while 77 not in interest.images and time.monotonic() < deadline:
            agent.do_work(clock.now_ns)
            time.sleep(0.001)  # the datagram crosses loopback (bounded wait)
        assert 77 in interest.images  # read from the readable socket and dispatched
        for _ in range(10):
            agent.readable = {udps[3].sock}
            agent.do_work(clock.now_ns)
        assert _CountedSockets.walks == 0
    finally:
        sender.close()
        for udp in udps:
            udp.close()


def test_idle_status_messages_of_many_images_share_steps_on_the_idle_grid() -> None:
    """Issue 31: 200 idle images (``idle-sm-interval`` 1 s) opened at scattered times each sent
    their idle SM at its own instant: 200 receiver wake-ups a second. Their idle deadlines now
    fall on the 20 ms grid, never later than the interval: over 3 s every image still sends an
    SM at least every second, and the receiver steps at most 50 distinct instants a second."""
    clock, sms = ManualClock(), []
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10, idle_sm_interval_ns=1_000_000_000)
    dispatcher.add(interest)

    def transmit(data: Any, address: Any) -> None:
        if data[6] == FrameType.SM:
            sms.append((clock.now_ns, int.from_bytes(bytes(data[8:12]), "little")))

    for i in range(200):
        clock.advance(4_999_999)  # scattered: 200 openings over a second
        setup = SetupFrame(0, 1000 + i, 10, 0, 0, TERM, 1408).encode()
        dispatcher.on_datagram(setup, len(setup), SENDERS[i % len(SENDERS)], clock.now_ns, transmit)
        dispatcher.do_work(clock.now_ns, transmit)
    start = clock.now_ns + 2_000_000_000  # past the first two SMs (Aeron's pace, then idle)
    steps = []
    while clock.now_ns < start + 3_000_000_000:
        clock.now_ns = dispatcher.next_deadline_ns(clock.now_ns)
        if clock.now_ns >= start:
            steps.append(clock.now_ns)
        dispatcher.do_work(clock.now_ns, transmit)
    assert len(steps) <= 3 * (1_000_000_000 // IDLE_GRID_NS) + 1, len(steps)
    window = [(t, s) for t, s in sms if t >= start]
    for session in range(1000, 1200):
        times = [start] + [t for t, s in window if s == session]
        assert len(times) >= 4 and max(b - a for a, b in itertools.pairwise(times)) <= 10**9


def test_a_session_publishing_once_a_second_costs_one_datagram_a_message_each_way() -> None:
    """Issue 31, over real loopback sockets (two invoker-mode drivers stepped on one made-up
    clock, 20 ms apart): a stream with our sessions' idle intervals carrying one 100-byte
    message a second. The subscriber's driver sends its SMs at the SM timeout (1 s), not one
    more after each message (it sent two a second: 20 for these 10 messages); the publisher's
    driver receives only those."""
    config = DriverConfig(threading_mode="invoker", write_counters_file=False)
    with Driver(config) as sub_driver, Driver(config) as pub_driver:
        sub = sub_driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0|idle-sm-interval=1s", 10)
        port = sub.local_endpoints[0][1]
        pub = pub_driver.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{port}|idle-heartbeat-interval=2s", 10
        )
        now = time.monotonic_ns()
        got: list[bytes] = []

        def step() -> None:
            pub_driver.do_work(now)
            sub_driver.do_work(now)
            sub.poll(lambda payload, header: got.append(bytes(payload)), 10)
            sub_driver.do_work(now)

        for _ in range(100):  # connect: SETUP, the first SMs (Aeron's pace), settled
            now += 20 * MS
            step()
        assert pub.is_connected

        def sms_sent() -> int:
            return sub_driver.counters.snapshot()["status_messages_sent"]

        def sms_received() -> int:
            return pub_driver.counters.snapshot()["status_messages_received"]

        sms, sms_in = sms_sent(), sms_received()
        for second in range(10):
            assert pub.offer(bytes(100)) > 0
            for _ in range(50):
                step()
                now += 20 * MS
            assert len(got) == second + 1
        sent = sms_sent() - sms
        assert 9 <= sent <= 11, sent
        assert sms_received() - sms_in == sent


def test_a_session_subscription_holding_its_image_has_no_timer_until_the_image_goes() -> None:
    """Issue 31: a subscription that names its session and asks its control address for SETUPs
    (a session's reply subscription on the client) asks nothing while it holds that session's
    image, yet it re-armed a one-second timer for nothing: a due-queue take and push a second
    per idle session (2,048 a second on a client holding 2,048 sessions). Over ten idle
    seconds the dispatcher now steps only the image (its ten SMs), never the subscription;
    once the image is gone (no packet for its liveness timeout) the subscription asks for a
    SETUP again, a cool-down after, as the timer found it at the latest."""
    control = ("127.0.0.1", 40555)
    interest = StreamInterest(
        10, control_address=control, session_id=7, idle_sm_interval_ns=1_000_000_000
    )
    clock, dispatcher, transmit, _sms = _idle_image(interest)
    elicits: list[Any] = []
    _count_calls(dispatcher, "_elicit", elicits)
    image = interest.images[7]
    sms_before = image.status_messages_sent
    hb = encode_data_header(0, DataFlags.UNFRAGMENTED, FrameType.DATA, 0, 7, 10, 0)
    start = clock.now_ns
    while clock.now_ns - start < 10_000_000_000:
        dispatcher.do_work(clock.now_ns, transmit)
        clock.now_ns = dispatcher.next_deadline_ns(clock.now_ns)
        dispatcher.on_datagram(hb, len(hb), SENDERS[0], clock.now_ns, transmit)  # alive
    assert elicits == [], f"the subscription was stepped {len(elicits)} times"
    assert 9 <= image.status_messages_sent - sms_before <= 11  # its SMs, a second apart
    # the image goes (no packet for its liveness timeout): the subscription asks again
    asked: list[int] = []

    def watch(data: Any, address: Any) -> None:
        if data[6] == FrameType.SM and data[5] & SmFlags.SEND_SETUP and address == control:
            asked.append(clock.now_ns)

    quiet_from = clock.now_ns
    while not asked and clock.now_ns - quiet_from < 2 * IMAGE_LIVENESS_TIMEOUT_NS:
        dispatcher.do_work(clock.now_ns, watch)
        clock.now_ns = dispatcher.next_deadline_ns(clock.now_ns)
    assert not interest.images and asked
    assert asked[0] - quiet_from <= IMAGE_LIVENESS_TIMEOUT_NS + 2_000_000_000


def test_a_timed_out_image_sleeps_between_its_eos_status_messages() -> None:
    """An image that heard nothing for its liveness timeout drains (three EOS SMs, spaced
    out); its deadline stayed its liveness deadline, behind it, so it was due at once again
    and again until its EOS SMs were sent: a receiver spun through that drain (here, on a
    manual clock, it never got past it). Now each of its steps ends with a deadline ahead."""
    interest = StreamInterest(10, idle_sm_interval_ns=1_000_000_000)
    clock, dispatcher, transmit, _sms = _idle_image(interest)
    image = interest.images[7]
    steps = 0
    while 7 in interest.images:
        steps += 1
        assert steps < 100, f"stepped {steps} times at {clock.now_ns} ({image.phase})"
        dispatcher.do_work(clock.now_ns, transmit)
        due = dispatcher.next_deadline_ns(clock.now_ns)
        assert due > clock.now_ns or 7 not in interest.images, image.phase
        clock.now_ns = due
    assert image.is_done


def test_a_joined_session_subscription_keeps_no_timer_over_real_sockets(tmp_path: Any) -> None:
    """Issue 31, over loopback with a real driver: a session's reply subscription (it names
    its session and asks the publication's control address for SETUPs) that joined its
    publication holds one deadline in its receiver, its image's; it held a second one, a
    one-second request timer re-armed for nothing."""
    driver = Driver(
        DriverConfig(threading_mode="invoker", directory=tmp_path, write_counters_file=False)
    )
    driver.start()
    try:
        pub = driver.add_publication(
            "aeron:udp?control=127.0.0.1:0|control-mode=dynamic|session-id=4242", 10
        )
        control_port = pub.local_endpoints[0][1]
        sub = driver.add_subscription(
            "aeron:udp?endpoint=127.0.0.1:0"
            f"|control=127.0.0.1:{control_port}|control-mode=dynamic|session-id=4242",
            10,
        )
        deadline = time.monotonic() + 60.0  # bounded for a loaded machine
        while not (sub.images and pub.is_connected) and time.monotonic() < deadline:
            driver.do_work()
            sub.wait(0.01)
        assert sub.images and pub.is_connected
        (endpoint,) = [ep for ep in driver._conductor.receiver.endpoints if ep.dispatcher.interests]
        now = time.monotonic_ns()
        for step in range(1, 41):  # two idle seconds of steps
            driver.do_work(now + step * 50_000_000)
        due = endpoint.dispatcher.due
        assert len(due) == 1, f"{len(due)} deadlines: the subscription's timer is back"
    finally:
        driver.close()


def test_the_sender_reads_a_status_message_in_place_as_the_decoder_does() -> None:
    """Issue 31: the sender reads an SM's fields from the datagram without building a
    StatusMessage (most of an idle sender's datagrams are SMs). Over real loopback datagrams it
    must take what the decoder takes and refuse what it refuses: a group tag (a 44-byte SM)
    reaches a tagged flow control; a datagram too short, a frame length that is neither 36 nor
    44, a 44-byte frame in a 36-byte datagram are each counted in ``invalid_frames`` and change
    nothing; a receiver announcing itself (session id 0, SETUP asked) is answered."""
    clock, counters = ManualClock(), SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    peer = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), SystemCounters())
    try:
        ep = SendEndpoint("k", udp)
        agent = SenderAgent(counters, lambda ep, pub: ep.remove(pub))
        agent.endpoints = (ep,)
        me = ("127.0.0.1", udp.local_port)
        tagged = FlowControlPolicy("tagged", group_tag=7)
        pub = session_publication(clock, ("127.0.0.1", peer.local_port), 1000, flow_control=tagged)
        ep.add(pub)
        agent.do_work(clock.now_ns)  # its first SETUP
        assert pub.setups_sent == 1

        def sm(receiver_id: int, window: int, tag: int | None = None, flags: int = 0) -> bytes:
            return StatusMessage(1000, 10, 0, 0, window, receiver_id, tag, flags).encode()

        peer.send(sm(5, 128), me)  # untagged: moves the limit while no tagged one is known
        _read_until(agent, counters, 1, clock.now_ns)
        assert pub.is_connected and pub.flow.sender_limit == 128 and pub.flow.counted == {}
        peer.send(sm(6, 4096, tag=7), me)  # 44 bytes: its tag read, so it is counted
        peer.send(sm(5, 8192), me)  # untagged again: receives, holds nothing
        _read_until(agent, counters, 3, clock.now_ns)
        assert pub.flow.counted == {6: 4096} and pub.flow.sender_limit == 4096
        assert pub.status_messages_received == 3 and counters.invalid_frames == 0
        good = sm(6, 9000, tag=7)
        bad = [
            good[:30],  # shorter than an SM
            struct.pack("<i", 40) + good[4:40],  # frame length neither 36 nor 44
            good[:36],  # says 44 bytes, has 36
        ]
        for datagram in bad:
            peer.send(datagram, me)
        _read_until(agent, counters, 3 + len(bad), clock.now_ns)
        assert counters.invalid_frames == len(bad)
        assert pub.status_messages_received == 3 and pub.flow.sender_limit == 4096
        setups = pub.setups_sent
        announce = StatusMessage(0, 10, 0, 0, 0, 9, flags=int(SmFlags.SEND_SETUP)).encode()
        peer.send(announce, me)
        _read_until(agent, counters, 4 + len(bad), clock.now_ns)
        assert pub.setups_sent == setups + 1
        assert pub.status_messages_received == 4 and counters.invalid_frames == len(bad)
    finally:
        udp.close()
        peer.close()
