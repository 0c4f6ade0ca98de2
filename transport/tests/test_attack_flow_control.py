"""Attacks on ``fc=min`` / ``fc=tagged`` over real sockets: a hostile receiver of a dynamic MDC
publication sends status messages of its own (a position far ahead of anything sent, another
receiver's id), a receiver process is killed with SIGKILL. The publication must neither overrun
a live slow receiver (it loses data for good once the others are a log ahead) nor wait for a
dead one longer than the receiver timeout, and it must not move on before it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.client import Publication, Subscription
from aeron_spark.transport.protocol.frames import SmFlags, StatusMessage
from aeron_spark.transport.testing import pump
from transport.tests import children

TIMEOUT_S = 60.0
STREAM = 22
TAG = 5
MS = 1_000_000

# A subscriber process that never polls: its image's SMs hold an fc=min publication at the
# position it joined + its window, until it is killed.
IDLE_SUBSCRIBER = """
import sys, time
from aeron_spark.transport import Driver, DriverConfig
with Driver(DriverConfig(directory=sys.argv[1])) as d:
    sub = d.add_subscription(sys.argv[2], int(sys.argv[3]))
    print(sub.local_endpoints[0][1], flush=True)
    while True:
        time.sleep(1)
"""


def start_idle_subscriber(directory: Path, channel: str) -> subprocess.Popen[bytes]:
    """A process subscribed to ``channel`` that never reads (its first line: its port); it dies
    with the test process, even a SIGKILLed one."""
    return children.popen(
        [sys.executable, "-c", IDLE_SUBSCRIBER, str(directory), channel, str(STREAM)],
        stdout=subprocess.PIPE,
        process_group=0,  # a group of its own, in the run's session (aeron_peer says why)
    )


def _mdc(fc: str) -> str:
    return f"aeron:udp?control=127.0.0.1:0|control-mode=dynamic|term-length=64k|fc={fc}"


def _sub_channel(pub: Publication) -> str:
    return (
        f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{pub.local_endpoints[0][1]}"
        f"|control-mode=dynamic|gtag={TAG}"
    )


def _sm(
    pub: Publication, position: int, receiver_id: int, window: int = 1 << 16, flags: int = 0
) -> bytes:
    shift = pub.term_length.bit_length() - 1
    term_id = pub.initial_term_id + (position >> shift)
    offset = position & (pub.term_length - 1)
    return StatusMessage(
        pub.session_id, STREAM, term_id, offset, window, receiver_id, group_tag=TAG, flags=flags
    ).encode()


@contextmanager
def _hostile() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock
    finally:
        sock.close()


def _fast_and_slow(d: Driver, pub: Publication) -> tuple[Subscription, Subscription, int]:
    """Two receivers of ``pub`` (for :func:`_deliver`), once both are its destinations and the
    slow one's receiver id is known: ``(fast, slow, slow's receiver id)``."""
    fast, slow = (d.add_subscription(_sub_channel(pub), STREAM) for _ in range(2))
    pump(d, lambda: fast.is_connected and slow.is_connected and len(pub.destinations) == 2)
    slow_address = ("127.0.0.1", slow.local_endpoints[0][1])
    pump(d, lambda: bool(pub.state.dests.by_address[slow_address].receiver_ids))
    (slow_id,) = pub.state.dests.by_address[slow_address].receiver_ids
    return fast, slow, slow_id


def _deliver(
    d: Driver,
    pub: Publication,
    fast: Subscription,
    slow: Subscription,
    between: Callable[[int], None] = lambda sent: None,
) -> list[list[bytes]]:
    """Offer 400 messages (about 1 MB, five logs of 64 KiB terms); ``fast`` reads everything it
    can, ``slow`` one fragment every fourth turn. Both must get every message, in order."""
    messages = [bytes([i % 251]) * (1000 + (i * 37) % 3000) for i in range(400)]
    received: list[list[bytes]] = [[], []]
    assemblers = [FragmentAssembler(lambda p, h, got=got: got.append(bytes(p))) for got in received]
    sent = turn = 0
    deadline = time.monotonic() + TIMEOUT_S
    while any(len(r) < len(messages) for r in received):
        counts = (
            pub.state.flow.sender_limit,
            pub.sender_position,
            [len(r) for r in received],
            getattr(pub.state.flow, "counted", None),
            {a: d.receiver_ids for a, d in pub.state.dests.by_address.items()},
        )
        assert time.monotonic() < deadline, counts
        while sent < len(messages) and pub.offer(messages[sent]) > 0:
            sent += 1
            between(sent)
        turn += 1
        work = d.do_work() + fast.poll(assemblers[0], 100)
        if turn % 4 == 0:
            work += slow.poll(assemblers[1], 1)
        if work == 0:
            d.idle(0.001)
    assert received == [messages, messages]
    return received


@pytest.mark.parametrize("fc", ["min", f"tagged,g:{TAG}"])
def test_a_status_message_far_ahead_does_not_make_the_publication_overrun_a_slow_receiver(
    tmp_path: Path, fc: str
) -> None:
    """A hostile receiver tells the publication, before anyone else joins, that it consumed a
    gigabyte nobody sent. Before: its position + window became the sender limit, which never
    goes down, and the slow receiver joining next was "more than a window behind" it, so never
    counted: the publication ran a log past it and it lost data for good (the delivery below
    timed out). Now an SM beyond what was sent is refused and counted."""
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d, _hostile() as h:
        pub = d.add_publication(_mdc(fc), STREAM)
        control = ("127.0.0.1", pub.local_endpoints[0][1])
        h.sendto(_sm(pub, 1 << 30, receiver_id=666), control)
        pump(d, lambda: pub.state.status_messages_received >= 1)
        assert pub.state.flow.sender_limit < 1 << 20
        assert pub.state.status_messages_refused == 1
        fast, slow = (d.add_subscription(_sub_channel(pub), STREAM) for _ in range(2))
        pump(d, lambda: fast.is_connected and slow.is_connected and len(pub.destinations) >= 3)
        _deliver(d, pub, fast, slow)


@pytest.mark.parametrize("fc", ["min", f"tagged,g:{TAG}"])
def test_another_receivers_id_from_a_hostile_address_does_not_release_the_publication(
    tmp_path: Path, fc: str
) -> None:
    """A hostile receiver that learnt the slow receiver's id (it is in every SM; a multicast
    group member sees them all) sends SMs in its name, each at the sender's position. Before:
    the counted position of that id was the highest either sent, so the slow receiver no longer
    held the publication, which ran a log past it. Now a receiver id is bound to the address
    it was first heard from; SMs naming it from elsewhere are refused and counted."""
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d, _hostile() as h:
        pub = d.add_publication(_mdc(fc), STREAM)
        control = ("127.0.0.1", pub.local_endpoints[0][1])
        fast, slow, slow_id = _fast_and_slow(d, pub)

        def forge(sent: int) -> None:
            h.sendto(_sm(pub, pub.sender_position, receiver_id=slow_id), control)

        _deliver(d, pub, fast, slow, forge)
        assert pub.state.status_messages_refused > 0  # forged SMs read (some dropped) refused


def test_a_killed_slowest_receiver_holds_min_for_the_receiver_timeout_then_not(
    tmp_path: Path,
) -> None:
    """The slowest receiver of an ``fc=min,t:2s`` publication is a process that never reads;
    it is killed with SIGKILL (no EOS). The publication stays at that receiver's limit while
    its SMs last and for the receiver timeout after the last one (never sooner, on the
    driver's clock), then moves on: the live receiver gets every message."""
    child_dir = tmp_path / "child"
    child_dir.mkdir()
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path / "d")) as d:
        pub = d.add_publication(_mdc("min,t:2s"), STREAM)
        flow = pub.state.flow
        proc = start_idle_subscriber(child_dir, _sub_channel(pub))
        try:
            assert proc.stdout is not None
            child_address = ("127.0.0.1", int(proc.stdout.readline()))
            fast = d.add_subscription(_sub_channel(pub), STREAM)
            pump(d, lambda: len(flow.counted) == 2 and fast.is_connected, timeout_s=60.0)
            (child_id,) = pub.state.dests.by_address[child_address].receiver_ids
            held = flow.counted[child_id]  # the child's join position + window
            messages = [bytes([i % 251]) * 1000 for i in range(300)]
            received: list[bytes] = []
            assembler = FragmentAssembler(lambda p, h: received.append(bytes(p)))
            sent = 0

            def step() -> None:
                nonlocal sent
                while sent < len(messages) and pub.offer(messages[sent]) > 0:
                    sent += 1
                if d.do_work() + fast.poll(assembler, 100) == 0:
                    d.idle(0.001)

            # held: the fast receiver reads all it is sent, the sender stays at the child's limit
            pump_deadline = time.monotonic() + TIMEOUT_S
            while pub.sender_position + 1100 <= held:
                assert time.monotonic() < pump_deadline, (pub.sender_position, held)
                step()
            for _ in range(200):
                step()
            assert pub.sender_position <= held < len(messages) * 1032
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            last_sm_ns = flow.counted_seen[child_id]
            deadline = time.monotonic() + TIMEOUT_S
            while flow.sender_limit <= held:
                assert time.monotonic() < deadline, flow.counted
                if child_id in flow.counted_seen:
                    last_sm_ns = flow.counted_seen[child_id]
                step()
            released_ns = time.monotonic_ns()
            assert child_id not in flow.counted
            assert released_ns - last_sm_ns >= 2_000 * MS  # not before the receiver timeout
            while len(received) < len(messages):
                assert time.monotonic() < deadline, len(received)
                step()
            assert received == messages
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def test_a_flood_of_receiver_ids_from_one_address_stays_bounded(tmp_path: Path) -> None:
    """A hostile destination of an ``fc=min`` publication keeps itself alive and sends each SM
    under a new receiver id. Before: every id stayed in its destination's ``receiver_ids`` for
    as long as it lived (memory without bound) and in the flow control's receivers for the
    timeout (each SM then took the minimum over all of them). Now a destination has at most
    four ids still heard from; SMs naming another are refused and counted."""
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d, _hostile() as h:
        pub = d.add_publication(_mdc("min"), STREAM)
        flow = pub.state.flow
        control = ("127.0.0.1", pub.local_endpoints[0][1])
        hostile_address = h.getsockname()
        sub = d.add_subscription(_sub_channel(pub), STREAM)
        pump(d, lambda: sub.is_connected and len(flow.counted) == 1)
        flood = 3000
        for rid in range(1, flood + 1):
            h.sendto(_sm(pub, 0, receiver_id=rid), control)
            if rid % 50 == 0:
                pump(d, lambda rid=rid: pub.state.status_messages_received >= rid // 2)
        pump(d, lambda: pub.state.status_messages_received >= flood)
        dest = pub.state.dests.by_address[hostile_address]
        assert len(dest.receiver_ids) <= 4
        assert len(flow.receivers) <= 5 and len(flow.counted) <= 5
        assert pub.state.status_messages_refused >= flood - 4


@pytest.mark.parametrize("fc", ["min", f"tagged,g:{TAG}"])
def test_an_end_of_stream_naming_another_receiver_does_not_release_the_publication(
    tmp_path: Path, fc: str
) -> None:
    """A hostile destination (it sent an SM of its own first) sends end-of-stream SMs naming
    the slow receiver's id. Before: each removed the slow receiver from the flow control and the
    sender ran past its window; what it dropped was soon older than the sender resends, so it
    stopped at 22 of 400 messages and, counted again, held the publication there for good
    (both receivers stalled). Now an EOS naming a receiver id its destination does not have is
    refused and counted."""
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d, _hostile() as h:
        pub = d.add_publication(_mdc(fc), STREAM)
        control = ("127.0.0.1", pub.local_endpoints[0][1])
        fast, slow, slow_id = _fast_and_slow(d, pub)
        h.sendto(_sm(pub, 0, receiver_id=777), control)  # a destination of its own
        pump(d, lambda: len(pub.destinations) == 3)
        eos = _sm(pub, 0, receiver_id=slow_id, flags=SmFlags.EOS)

        def forge(sent: int) -> None:
            h.sendto(eos, control)

        _deliver(d, pub, fast, slow, forge)
        assert pub.state.status_messages_refused > 0  # forged SMs read (some dropped) refused


def test_a_receiver_joining_late_is_waited_for_from_where_it_joined(tmp_path: Path) -> None:
    """``fc=min``: a slow receiver subscribes after the fast one read 150 messages, while the
    publisher keeps offering. It joins where the publication is (its SETUP) and from its first
    status message holds the sender: it gets every message from its first one on, in order, to
    the last (none lost to a sender run ahead of it)."""
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        pub = d.add_publication(_mdc("min"), STREAM)
        fast = d.add_subscription(_sub_channel(pub), STREAM)
        pump(d, lambda: fast.is_connected and len(pub.state.flow.counted) == 1)
        messages = [i.to_bytes(4, "little") * (250 + (i * 37) % 750) for i in range(600)]
        received: list[list[bytes]] = [[], []]
        assemblers = [
            FragmentAssembler(lambda p, h, got=got: got.append(bytes(p))) for got in received
        ]
        late: Subscription | None = None
        sent = turn = 0
        deadline = time.monotonic() + TIMEOUT_S
        while len(received[0]) < len(messages) or (
            late is not None and received[1][-1:] != messages[-1:]
        ):
            assert time.monotonic() < deadline, [len(r) for r in received]
            while sent < len(messages) and pub.offer(messages[sent]) > 0:
                sent += 1
            if late is None and len(received[0]) >= 150:
                late = d.add_subscription(_sub_channel(pub), STREAM)
            turn += 1
            work = d.do_work() + fast.poll(assemblers[0], 100)
            if late is not None and turn % 4 == 0:
                work += late.poll(assemblers[1], 1)
            if work == 0:
                d.idle(0.001)
        assert received[0] == messages
        first = messages.index(received[1][0])
        assert 150 <= first < len(messages) - 100
        assert received[1] == messages[first:]
