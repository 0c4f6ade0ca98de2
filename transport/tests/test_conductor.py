"""The driver's conductor stepped by a manual clock: session ids, timers, freeing what closed.

The conductor reads no clock: every call takes ``now_ns``. Sockets are real (opened on
127.0.0.1 through the same factory the driver uses); the client objects are the real ones,
owned by a driver that is never started, so no agent thread runs and nothing but the test
steps the conductor and its sender.
"""

from __future__ import annotations

import socket
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.api import NOT_CONNECTED
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.client import network_publication, network_subscription
from aeron_spark.transport.driver.conductor import (
    DriverConductor,
    ImageLimits,
)
from aeron_spark.transport.driver.endpoint import UdpEndpoint, destination_address
from aeron_spark.transport.protocol.frames import SetupFrame
from aeron_spark.transport.protocol.image import ImagePhase
from aeron_spark.transport.protocol.logbuffer import (
    MAX_UDP_PAYLOAD_LENGTH,
    RESERVED_SESSION_ID_HIGH,
    RESERVED_SESSION_ID_LOW,
    TERM_MAX_LENGTH,
)
from aeron_spark.transport.protocol.publication import PublicationPhase
from aeron_spark.transport.testing import ManualClock, pump, walked_totals
from aeron_spark.transport.uri import ChannelConfig, Endpoint

MS = 1_000_000


def conductor(counters: SystemCounters, **kw: Any) -> DriverConductor:
    def open_endpoint(bind: Endpoint, config: ChannelConfig) -> UdpEndpoint:
        return UdpEndpoint(bind, counters)

    return DriverConductor(
        counters,
        open_endpoint,
        image_limits=ImageLimits(TERM_MAX_LENGTH, MAX_UDP_PAYLOAD_LENGTH),
        retransmit_linger_ns=10 * MS,
        **kw,
    )


def test_session_ids_skip_the_reserved_range_and_wrap() -> None:
    c = conductor(SystemCounters(), session_id_seed=RESERVED_SESSION_ID_LOW - 1)
    assert c.allocate_session_id() == RESERVED_SESSION_ID_LOW - 1
    assert c.allocate_session_id() == RESERVED_SESSION_ID_HIGH + 1
    c = conductor(SystemCounters(), session_id_seed=2**31 - 1)
    assert [c.allocate_session_id() for _ in range(2)] == [2**31 - 1, -(2**31)]


def test_timers_and_reaping_follow_the_manual_clock() -> None:
    clock, ticks = ManualClock(), []
    counters = SystemCounters()
    c = conductor(counters, counters_interval_ns=1000 * MS, on_tick=ticks.append)
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    sub = network_subscription(driver, "aeron:udp?endpoint=127.0.0.1:0", 10, None, None)
    c.add_network_subscription(sub, ChannelConfig.from_uri(sub.channel), None)
    (rep,) = c.receive_endpoints.values()
    assert c.receiver.endpoints == (rep,) and counters.subscriptions_created == 1
    c.do_work(clock.now_ns)
    assert ticks == [clock.now_ns]
    assert c.next_deadline_ns(clock.now_ns) == clock.now_ns + 1000 * MS
    c.close_subscription(sub, clock.now_ns)
    c.receiver.do_work(clock.now_ns)  # the dispatcher lets go of the closed interest
    # ... and the same receiver step frees the socket (not the conductor's next tick)
    assert not c.receive_endpoints and c.receiver.endpoints == ()
    assert rep.endpoint.sock.fileno() == -1  # its socket is closed
    clock.advance(1000 * MS - 1)
    c.do_work(clock.now_ns)
    assert len(ticks) == 1  # not yet: the timer has not fired
    clock.advance(1)
    c.do_work(clock.now_ns)
    assert ticks[-1] == clock.now_ns and len(ticks) == 2
    assert c.retired["images_created"] == 0 and "status_messages_sent" in c.retired
    assert c.subscriptions == []


def test_a_closed_publication_is_freed_by_the_next_sender_step_with_its_spy_image() -> None:
    clock = ManualClock()
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    c = driver._conductor
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.1", 0))
        peer.settimeout(5)
        channel = f"aeron:udp?endpoint=127.0.0.1:{peer.getsockname()[1]}"
        spy = network_subscription(driver, f"aeron-spy:{channel}", 10, None, None)
        c.add_spy_subscription(spy, ChannelConfig.from_uri(spy.channel), clock.now_ns)
        config = ChannelConfig.from_uri(channel)
        assert config.endpoint is not None
        pub = c.add_network_publication(
            config,
            10,
            clock.now_ns,
            lambda state, ep: network_publication(driver, state, channel, True, ep),
            destination_address(config.endpoint),
        )
        assert c.publications == [pub] and len(c.sender.endpoints) == 1
        (image,) = spy.images
        state = pub._state
        assert pub.offer(b"x") == NOT_CONNECTED
        c.sender.do_work(clock.now_ns)  # SETUP, on the clock we gave it
        setup = SetupFrame.decode(peer.recv(2048))
        assert (setup.session_id, setup.stream_id) == (pub.session_id, 10)
        clock.advance(10 * MS)
        c.close_publication(pub._log, clock.now_ns)
        assert state.phase is PublicationPhase.DRAINING and c.publications == [pub]
        c.sender.do_work(clock.now_ns)
        assert state.phase is PublicationPhase.CLOSED
        assert c.publications == [] and c.send_endpoints == {} and c.sender.endpoints == ()
        assert image._state.phase is ImagePhase.CLOSED and spy.images == [] and image.is_closed
        assert c.retired["setups_sent"] == 1 == c.totals()["setups_sent"]
        assert c.stream_positions() == {}
    finally:
        peer.close()
        driver.close()


def test_totals_are_the_sums_of_every_live_stream_and_what_retired() -> None:
    """``totals()`` sums columns of every publication and image at once (issue 31: the stat
    snapshot's walk built a dict per stream); it must equal the per-stream counts summed."""
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    c = driver._conductor
    try:
        pairs = []
        for stream_id in (10, 11, 12):
            sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", stream_id)
            port = sub.local_endpoints[0][1]
            pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", stream_id)
            pairs.append((pub, sub))
        pump(driver, lambda: all(p.is_connected and s.is_connected for p, s in pairs))
        got: list[bytes] = []
        for pub, _ in pairs:
            pump(driver, lambda pub=pub: pub.offer(b"m" * 100) > 0)
        pump(
            driver,
            lambda: (
                sum(s.poll(lambda b, h: got.append(b), 8) for _, s in pairs) == 0 and len(got) == 3
            ),
        )
        pairs[0][0].close()  # one publication retires: its counts move to ``retired``
        pump(driver, lambda: len(c.publications) == 2)
        expected = walked_totals(driver._conductor)
        totals = c.totals()
        assert totals == expected
        assert totals["setups_sent"] >= 3 and totals["status_messages_received"] >= 3
        assert totals["status_messages_sent"] >= 3 and totals["heartbeats_received"] >= 0
    finally:
        driver.close()


def _opcodes(step: Any) -> int:
    """Python bytecodes executed by ``step()`` on this thread (a count of work, not a time)."""
    import sys

    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        step()
    finally:
        sys.settrace(None)
    return count


def _close_one_of(n: int) -> int:
    """The work of closing one of ``n`` sessions' publications and subscriptions (a client's
    sessions: every publication on one send socket, every subscription on one receive socket,
    each subscription with a stream id of its own), through the steps that free them."""
    clock = ManualClock()
    counters = SystemCounters()
    c = conductor(counters)
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.1", 0))
        channel = f"aeron:udp?endpoint=127.0.0.1:{peer.getsockname()[1]}"
        config = ChannelConfig.from_uri(channel)
        assert config.endpoint is not None
        port = 0
        pubs, subs = [], []
        for k in range(n):
            sub = network_subscription(
                driver, f"aeron:udp?endpoint=127.0.0.1:{port}", k, None, None
            )
            c.add_network_subscription(sub, ChannelConfig.from_uri(sub.channel), None)
            port = sub.local_endpoints[0][1]
            subs.append(sub)
            pubs.append(
                c.add_network_publication(
                    config,
                    1000 + k,
                    clock.now_ns,
                    lambda state, ep: network_publication(driver, state, channel, True, ep),
                    destination_address(config.endpoint),
                )
            )
        assert len(c.sender.endpoints) == 1 and len(c.receive_endpoints) == 1
        c.sender.do_work(clock.now_ns)  # their SETUPs: nothing of theirs is due after it
        c.receiver.do_work(clock.now_ns)
        pub, sub = pubs[n // 2], subs[n // 2]

        def close() -> None:
            c.close_publication(pub._log, clock.now_ns)
            c.sender.do_work(clock.now_ns)
            c.close_subscription(sub, clock.now_ns)
            c.receiver.do_work(clock.now_ns)

        work = _opcodes(close)
        assert pub not in c.publications and len(c.publications) == n - 1
        assert sub not in c.subscriptions and len(c.subscriptions) == n - 1
        (rep,) = c.receive_endpoints.values()
        assert sub.stream_id not in rep.dispatcher.interests
        assert len(rep.dispatcher.interests) == n - 1
        (ep,) = c.send_endpoints.values()
        assert len(ep.publications) == n - 1 and pub._state not in ep.publications
        return work
    finally:
        peer.close()
        c.release_all(lambda exc: None)
        driver.close()


def test_closing_one_of_n_sessions_costs_the_same_whatever_n() -> None:
    """Closing a session's publication and subscription is O(1) in the number of the
    driver's other sessions: a publication list, a subscription list, the send endpoint's
    publications and every stream's interests were rewritten per close (closing N sessions
    was O(N^2): 8.5% of a 2,048-session client's time; issue 31)."""
    small, large = _close_one_of(32), _close_one_of(512)
    assert large < 1.5 * small, (small, large)
