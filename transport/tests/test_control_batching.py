"""The control frames a driver step sends to one destination go out in GSO runs (issue 31): an
idle driver's timers share a grid, so one step sends hundreds of status messages and heartbeats
to the one address of a client process; queued per endpoint (``UdpEndpoint.queue``) and sent at
the end of the step (``flush``), each run of equal frames is one ``sendmsg``. Over real loopback
sockets: the wire carries the same datagrams in the same order per destination, each passes the
amplification ledger and is counted, a full run goes at once, and nothing is held past the step.
"""

from __future__ import annotations

import random
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import (
    ReceiveEndpoint,
    ReceiverAgent,
    SendEndpoint,
    SenderAgent,
)
from aeron_spark.transport.driver.endpoint import (
    AmplificationLedger,
    UdpEndpoint,
    gso_supported,
)
from aeron_spark.transport.protocol.frames import FrameType, SetupFrame, StatusMessage
from aeron_spark.transport.protocol.heartbeat import HEARTBEAT_INTERVAL_NS
from aeron_spark.transport.protocol.receiver import StreamInterest
from aeron_spark.transport.protocol.segments import MAX_SEGMENTS
from aeron_spark.transport.testing import LossConfig, ManualClock, session_publication
from aeron_spark.transport.uri import Endpoint

from .test_udp_loopback import transfer

WAIT_S = 20.0  # per datagram: bounded, sized for a loaded machine
TERM = 64 * 1024
SO_NO_CHECK = 11  # asm-generic/socket.h: no UDP checksums on this socket (the kernel refuses GSO)


def _gso_here() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return gso_supported(s)


pytestmark = pytest.mark.skipif(not _gso_here(), reason="UDP GSO needs Linux 4.18 or later")


@pytest.fixture
def sender() -> Iterator[UdpEndpoint]:
    udp = UdpEndpoint(Endpoint("0.0.0.0", 0, socket.AF_INET), SystemCounters())
    try:
        yield udp
    finally:
        udp.close()


@pytest.fixture
def receivers() -> Iterator[list[socket.socket]]:
    socks = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.settimeout(WAIT_S)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def _frames(lengths: list[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(n) for n in lengths]


def _nothing_waiting(receiver: socket.socket) -> bool:
    return select.select([receiver], [], [], 0.05)[0] == []


def _receive(receiver: socket.socket, count: int) -> list[bytes]:
    return [receiver.recv(65536) for _ in range(count)]


def test_queued_frames_wait_for_the_flush_then_arrive_in_order_in_one_send(
    sender: UdpEndpoint, receivers: list[socket.socket]
) -> None:
    receiver = receivers[0]
    address = receiver.getsockname()
    frames = _frames([36] * 20 + [32], 1)
    for frame in frames[:20]:
        sender.queue(memoryview(bytearray(frame)), address)  # a buffer its caller reuses
    assert _nothing_waiting(receiver)  # held until the step's end
    assert sender.counters.datagrams_sent == 0
    sender.queue(frames[20], address)  # a shorter frame ends the run: it goes now
    assert _receive(receiver, 21) == frames
    counters = sender.counters
    assert counters.gso_sends == 1 and counters.datagrams_sent == 21
    assert counters.bytes_sent == 20 * 36 + 32
    sender.flush()  # nothing left to send
    assert _nothing_waiting(receiver) and counters.datagrams_sent == 21


def test_a_full_run_goes_at_once_and_the_rest_at_the_flush(
    sender: UdpEndpoint, receivers: list[socket.socket]
) -> None:
    receiver = receivers[0]
    address = receiver.getsockname()
    frames = _frames([36] * (MAX_SEGMENTS + 3), 2)
    for frame in frames:
        sender.queue(frame, address)
    assert _receive(receiver, MAX_SEGMENTS) == frames[:MAX_SEGMENTS]
    assert _nothing_waiting(receiver)
    sender.flush()
    assert _receive(receiver, 3) == frames[MAX_SEGMENTS:]
    assert sender.counters.gso_sends == 2
    assert sender.counters.datagrams_sent == MAX_SEGMENTS + 3


def test_frames_to_one_destination_never_overtake_each_other(
    sender: UdpEndpoint, receivers: list[socket.socket]
) -> None:
    """Runs cut where a frame of another length comes, two destinations interleaved, a direct
    send and a data run after queued frames: each destination gets its frames in the order
    they were given."""
    a, b = receivers
    to_a = _frames([36, 36, 40, 40, 40, 36, 32, 36], 3)
    to_b = _frames([36] * 5, 4)
    for i, frame in enumerate(to_a):
        sender.queue(frame, a.getsockname())
        if i < len(to_b):
            sender.queue(to_b[i], b.getsockname())
    direct = b"direct"
    sender.send(direct, a.getsockname())  # the run open to ``a`` goes first
    data = _frames([1408] * 3 + [100], 5)
    sender.queue(b"x" * 36, b.getsockname())
    sender.send_segments(b"".join(data), 1408, b.getsockname())
    sender.flush()
    assert _receive(a, len(to_a) + 1) == to_a + [direct]
    assert _receive(b, len(to_b) + 1 + len(data)) == to_b + [b"x" * 36] + data
    counters = sender.counters
    assert counters.datagrams_sent == len(to_a) + 1 + len(to_b) + 1 + len(data)
    assert counters.send_errors == 0 and counters.short_sends == 0


def test_closing_the_endpoint_sends_what_the_step_queued(receivers: list[socket.socket]) -> None:
    """A publication closed with linger 0 queues its end-of-stream heartbeat in the step that
    then frees its endpoint (its last publication): the close sends it first (without that,
    test_udp_loopback's end-of-stream test saw no EOS)."""
    receiver = receivers[0]
    udp = UdpEndpoint(Endpoint("0.0.0.0", 0, socket.AF_INET), SystemCounters())
    frames = _frames([32] * 3, 8)
    for frame in frames:
        udp.queue(frame, receiver.getsockname())
    udp.close()
    assert _receive(receiver, 3) == frames
    assert udp.counters.datagrams_sent == 3 and udp.counters.send_errors == 0


def test_the_ledger_admits_or_drops_each_queued_frame(
    sender: UdpEndpoint, receivers: list[socket.socket]
) -> None:
    """An address not trusted gets at most three times what came from it, frame by frame:
    100 bytes received allow eight 36-byte frames of ten; two are dropped and counted."""
    receiver = receivers[0]
    address = receiver.getsockname()
    ledger = AmplificationLedger(factor=3)
    ledger.on_receive("127.0.0.1", 100)
    sender.ledger = ledger
    frames = _frames([36] * 10, 6)
    for frame in frames:
        sender.queue(frame, address)
    sender.flush()
    assert _receive(receiver, 8) == frames[:8]
    assert _nothing_waiting(receiver)
    counters = sender.counters
    assert counters.amplification_drops == 2 and ledger.drops == 2
    assert counters.datagrams_sent == 8 and ledger.sent["127.0.0.1"] == 8 * 36


def test_a_destination_that_refuses_gso_gets_its_frames_one_by_one(
    sender: UdpEndpoint, receivers: list[socket.socket]
) -> None:
    receiver = receivers[0]
    address = receiver.getsockname()
    sender.sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)  # the kernel answers EINVAL
    frames = _frames([36] * 6, 7)
    for frame in frames:
        sender.queue(frame, address)
    sender.flush()
    assert _receive(receiver, 6) == frames
    counters = sender.counters
    assert counters.gso_fallbacks == 1 and counters.gso_sends == 0
    assert counters.datagrams_sent == 6 and address in sender.gso_refused
    sender.queue(frames[0], address)  # sent at once from then on
    assert _receive(receiver, 1) == frames[:1]
    assert counters.gso_fallbacks == 1 and counters.datagrams_sent == 7


@pytest.mark.parametrize("gro", [False, True], ids=["plain", "gro"])
def test_idle_heartbeats_of_many_publications_go_out_in_one_send(gro: bool) -> None:
    """40 idle publications to one address (a client process's): their heartbeats, due in one
    sender step, leave in one GSO send; the receiving endpoint gets 40 heartbeats, one per
    session, whether the kernel cuts the run (plain) or hands it over whole (UDP GRO)."""
    clock, counters = ManualClock(), SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    peer = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), SystemCounters(), gro=gro)
    try:
        ep = SendEndpoint("k", udp)
        agent = SenderAgent(counters, lambda ep, pub: ep.remove(pub))
        agent.endpoints = (ep,)
        dest = peer.local_address
        pubs = [session_publication(clock, dest, 1000 + i) for i in range(40)]
        for pub in pubs:
            ep.add(pub)
            sm = StatusMessage(pub.session_id, 10, 0, 0, TERM, 1)
            pub.on_status_message(sm, dest, clock.now_ns)
        agent.do_work(clock.now_ns)  # each added publication is stepped once
        _drain(peer, None)
        sent, gso_sends = counters.datagrams_sent, counters.gso_sends
        clock.advance(HEARTBEAT_INTERVAL_NS)
        agent.do_work(clock.now_ns)
        assert counters.datagrams_sent - sent == 40
        assert counters.gso_sends - gso_sends == 1
        got = _drain(peer, 40)
        assert all(len(frame) == 32 and frame[6] == FrameType.DATA for frame in got)
        sessions = sorted(int.from_bytes(frame[12:16], "little") for frame in got)
        assert sessions == [1000 + i for i in range(40)]
        assert (peer.counters.gro_receives >= 1) == gro
    finally:
        udp.close()
        peer.close()


def _drain(udp: UdpEndpoint, count: int | None) -> list[bytes]:
    """``count`` datagrams received by ``udp`` (bounded wait), or what is there now (None)."""
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while count is None or len(got) < count:
        item = udp.raw_receive()
        if item is None:
            if count is None:
                if not select.select([udp.sock], [], [], 0.2)[0]:
                    return got
                continue
            assert time.monotonic() < deadline, f"{len(got)} of {count} arrived"
            select.select([udp.sock], [], [], 0.05)
            continue
        buf, length, _source = item
        got.append(bytes(buf[:length]))
    return got


def test_status_messages_of_many_images_go_out_in_one_send() -> None:
    """40 images of one sender address on one receive endpoint: the SMs their SETUPs ask for,
    sent in the step that read them, leave in one GSO send, one SM per session."""
    clock, counters = ManualClock(), SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.1", 0))
        peer.settimeout(WAIT_S)
        rep = ReceiveEndpoint("k", udp)
        interest = StreamInterest(10)
        rep.dispatcher.add(interest)
        agent = ReceiverAgent(counters)
        agent.endpoints = (rep,)
        for i in range(40):
            peer.sendto(SetupFrame(0, 2000 + i, 10, 0, 0, TERM, 1408).encode(), udp.local_address)
        deadline = time.monotonic() + WAIT_S
        while len(interest.images) < 40:
            assert time.monotonic() < deadline, f"{len(interest.images)} images"
            select.select([udp.sock], [], [], 0.05)
            agent.do_work(clock.now_ns)
        got = _receive(peer, 40)  # the step flushed its SMs: nothing is held past it
        assert all(frame[6] == FrameType.SM for frame in got)
        sessions = sorted(int.from_bytes(frame[8:12], "little") for frame in got)
        assert sessions == [2000 + i for i in range(40)]
        assert counters.gso_sends >= 1 and counters.datagrams_sent == 40
    finally:
        udp.close()
        peer.close()


@pytest.mark.parametrize("loss", [0.0, 0.1], ids=["clean", "lossy"])
def test_many_streams_of_one_channel_deliver_with_batched_control_frames(
    tmp_path: Path, loss: float
) -> None:
    """24 streams between two drivers over one channel, with and without 10% of the datagrams
    dropped on arrival: every message arrives whole and in order on every stream, the control
    frames went out in runs, none refused."""
    pub_cfg = DriverConfig(threading_mode="invoker", directory=tmp_path / "p")
    sub_cfg = DriverConfig(
        threading_mode="invoker",
        directory=tmp_path / "s",
        loss=LossConfig(drop_rate=loss, seed=31) if loss else None,
    )
    rng = random.Random(31)
    with Driver(pub_cfg) as pub_driver, Driver(sub_cfg) as sub_driver:
        first = sub_driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 1)
        port = first.local_endpoints[0][1]
        subs = [first] + [
            sub_driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", s)
            for s in range(2, 25)
        ]
        pubs = [
            pub_driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|mtu=1408", s)
            for s in range(1, 25)
        ]
        deadline = time.monotonic() + 60
        while not all(p.is_connected for p in pubs) or not all(s.is_connected for s in subs):
            assert time.monotonic() < deadline, "streams never connected"
            if pub_driver.do_work() + sub_driver.do_work() == 0:
                sub_driver.idle(0.002)
        both = _Both(pub_driver, sub_driver)
        for pub, sub in zip(pubs, subs, strict=True):
            messages = [rng.randbytes(rng.choice([36, 100, 3000])) for _ in range(20)]
            assert transfer(both, pub, sub, messages) == messages  # type: ignore[arg-type]
        pub_counts = pub_driver.counters.snapshot()
        sub_counts = sub_driver.counters.snapshot()
    assert pub_counts["gso_sends"] > 0 and sub_counts["gso_sends"] > 0
    assert pub_counts["gso_fallbacks"] == 0 and sub_counts["gso_fallbacks"] == 0
    assert (sub_counts["loss_injected_drops"] > 0) == bool(loss)


class _Both:
    """Two invoker drivers stepped as one (what ``transfer`` steps and idles)."""

    def __init__(self, a: Driver, b: Driver) -> None:
        self.a, self.b = a, b

    def do_work(self) -> int:
        return int(self.a.do_work()) + int(self.b.do_work())

    def idle(self, timeout_s: float) -> None:
        self.b.idle(timeout_s)
