"""A publication tells its owner when a receiver goes (issue 31: the stream server asked every
session's connection once a second, ~20 Python calls a session-second, a sixth of an idle
server's CPU at 2,048 sessions, to find the one way the transport ends a connection without a
signal: the reply publication's receiver gone silent). ``PublicationState.on_receiver_lost``
is called whenever a receiver or a destination goes (status messages timed out, an end of
stream, a destination dropped); ``is_connected`` never turns False without it (but for the
publication's own close). Stepped by a manual clock; the driver-level fan-out
(``Publication.add_lost_listener``) on real sockets."""

from __future__ import annotations

import random
import time

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS, FlowControlPolicy
from aeron_spark.transport.protocol.frames import SmFlags, StatusMessage
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.testing import ManualClock, Wire

A = ("127.0.0.5", 4000)
B = ("127.0.0.6", 4000)
TERM = 1 << 16
MS = 1_000_000


def _pub(
    clock: ManualClock, dynamic: bool = True, policy: FlowControlPolicy | None = None
) -> tuple[PublicationState, list[int]]:
    pub = PublicationState(
        session_id=77,
        stream_id=10,
        initial_term_id=5,
        term_id=5,
        term_offset=0,
        term_length=TERM,
        mtu=1408,
        dynamic=dynamic,
        destination=None if dynamic else A,
        now_ns=clock.now_ns,
        idle_heartbeat_interval_ns=2_000 * MS,
        flow_control=policy,
    )
    lost: list[int] = []
    pub.on_receiver_lost = lambda: lost.append(clock.now_ns)
    return pub, lost


def _sm(receiver_id: int, flags: int = 0) -> StatusMessage:
    return StatusMessage(77, 10, 5, 0, TERM // 2, receiver_id, flags=flags)


def _idle(pub: PublicationState, clock: ManualClock, wire: Wire, span_ns: int, *senders) -> None:  # type: ignore[no-untyped-def]
    """``span_ns`` of 100 ms steps, an SM from each of ``senders`` (address, receiver id) a
    second, the publication stepped at its deadlines."""
    end = clock.now_ns + span_ns
    while clock.now_ns < end:
        clock.advance(100 * MS)
        if clock.now_ns % (1_000 * MS) == 0:
            for address, receiver_id in senders:
                pub.on_status_message(_sm(receiver_id), address, clock.now_ns)
        if clock.now_ns >= pub.next_deadline_ns:
            pub.send(clock.now_ns, wire)


def test_a_receiver_gone_silent_is_told_once_at_its_timeout_and_none_while_it_speaks() -> None:
    clock, wire = ManualClock(), Wire()
    pub, lost = _pub(clock)
    pub.on_status_message(_sm(1), A, clock.now_ns)
    pub.on_status_message(_sm(2), B, clock.now_ns)
    _idle(pub, clock, wire, 30_000 * MS, (A, 1), (B, 2))
    assert lost == [] and pub.is_connected  # 30 s of an idle stream: nothing to tell
    _idle(pub, clock, wire, 10_000 * MS, (A, 1))  # B is silent from now
    assert len(lost) == 1 and pub.is_connected  # one of two went: told, still connected
    assert list(pub.destinations) == [A]
    silent_since = clock.now_ns
    _idle(pub, clock, wire, 10_000 * MS)  # A too
    assert len(lost) == 2 and not pub.is_connected
    # at the publication's first step past the timeout (its idle heartbeat, 2 s at most)
    assert lost[1] - silent_since <= CONNECTION_TIMEOUT_NS + 2_000 * MS
    _idle(pub, clock, wire, 10_000 * MS)
    assert len(lost) == 2  # nobody left: nothing more to tell


def test_an_end_of_stream_and_a_host_no_longer_allowed_are_told_at_once() -> None:
    clock = ManualClock()
    pub, lost = _pub(clock)
    pub.on_status_message(_sm(1), A, clock.now_ns)
    pub.on_status_message(_sm(2), B, clock.now_ns)
    pub.on_status_message(_sm(1, SmFlags.EOS), A, clock.now_ns)  # A's image closed
    assert len(lost) == 1 and list(pub.destinations) == [B]
    pub.allowed_hosts = frozenset({A[0]})  # B's handshake ended
    pub.on_status_message(_sm(2), B, clock.now_ns)  # its next SM drops it
    assert len(lost) == 2 and not pub.is_connected


def test_a_unicast_publications_receiver_timing_out_is_told() -> None:
    clock, wire = ManualClock(), Wire()
    pub, lost = _pub(clock, dynamic=False)
    pub.on_status_message(_sm(1), A, clock.now_ns)
    _idle(pub, clock, wire, 5_000 * MS, (A, 1))
    assert lost == [] and pub.is_connected
    _idle(pub, clock, wire, 10_000 * MS)
    assert len(lost) == 1 and not pub.is_connected


@pytest.mark.parametrize(
    ("dynamic", "policy"),
    [
        (True, None),
        (False, None),
        (True, FlowControlPolicy(strategy="min", receiver_timeout_ns=3_000 * MS)),
        (True, FlowControlPolicy(strategy="min", group_min_size=2)),
        (True, FlowControlPolicy(strategy="tagged", group_tag=9, group_min_size=1)),
    ],
)
def test_is_connected_never_turns_false_untold(dynamic: bool, policy: FlowControlPolicy) -> None:
    """Random SMs (two receivers, EOS now and then, group tags), hosts allowed and not, the
    clock moving in random steps and the publication stepped at random: every operation after
    which ``is_connected`` is False though it was True before called the listener."""
    rng = random.Random(31)
    clock, wire = ManualClock(), Wire()
    pub, lost = _pub(clock, dynamic, policy)
    flips = 0
    for _ in range(20_000):
        before, told = pub.is_connected, len(lost)
        roll = rng.random()
        if roll < 0.45:
            address, receiver_id = rng.choice([(A, 1), (B, 2)])
            flags = SmFlags.EOS if rng.random() < 0.05 else 0
            sm = StatusMessage(
                77, 10, 5, 0, TERM // 2, receiver_id, flags=flags, group_tag=rng.choice([None, 9])
            )
            pub.on_status_message(sm, address, clock.now_ns)
        elif roll < 0.47:
            pub.allowed_hosts = rng.choice([None, frozenset({A[0]}), frozenset({B[0]})])
        elif roll < 0.8:
            clock.advance(rng.randrange(1, 1_500) * MS)
        else:
            pub.send(clock.now_ns, wire)
        if before and not pub.is_connected:
            flips += 1
            assert len(lost) > told, f"is_connected turned False untold (flip {flips})"
    assert flips >= 20  # the walk went through many losses


def test_a_drivers_publication_tells_its_listeners_on_the_senders_thread() -> None:
    """Real sockets: a subscription's image ends (its subscription closed: an EOS SM); the
    publication's listeners are called (on the driver's thread), a listener that raises
    counted as the driver's error and the others still called."""
    with Driver(DriverConfig(write_counters_file=False)) as driver:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
        port = sub.local_endpoints[0][1]
        pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 10)
        told: list[str] = []

        def broken() -> None:
            raise RuntimeError("a listener's bug")

        assert pub.add_lost_listener(broken)
        assert pub.add_lost_listener(lambda: told.append("lost"))
        deadline = time.monotonic() + 30
        while not pub.is_connected:
            assert time.monotonic() < deadline, "never connected"
            time.sleep(0.01)
        errors = driver.system_counters.errors
        sub.close()
        while not told:
            assert time.monotonic() < deadline, "the listener was never called"
            time.sleep(0.01)
        assert not pub.is_connected
        assert driver.system_counters.errors > errors
