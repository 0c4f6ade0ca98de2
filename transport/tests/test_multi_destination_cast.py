"""Multi-destination-cast with dynamic control mode: receivers register through their SMs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.protocol.frames import StatusMessage
from aeron_spark.transport.protocol.publication import CONNECTION_TIMEOUT_NS, PublicationState
from aeron_spark.transport.testing import ManualClock, pump

TIMEOUT_S = 20.0


def test_dynamic_mdc_sends_to_every_registered_receiver(tmp_path: Path) -> None:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        pub = d.add_publication("aeron:udp?control=127.0.0.1:0|control-mode=dynamic", 20)
        control_port = pub.local_endpoints[0][1]
        assert control_port > 0
        channel = (
            f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{control_port}|control-mode=dynamic"
        )
        subs = [d.add_subscription(channel, 20) for _ in range(2)]
        pump(d, lambda: all(s.is_connected for s in subs) and len(pub.destinations) == 2)
        assert sorted(pub.destinations) == sorted(s.local_endpoints[0] for s in subs)
        messages = [bytes([i]) * (i * 50) for i in range(60)]
        received: list[list[bytes]] = [[], []]
        assemblers = [
            FragmentAssembler(lambda p, h, got=got: got.append(bytes(p))) for got in received
        ]
        sent = 0
        deadline = time.monotonic() + TIMEOUT_S
        while any(len(r) < len(messages) for r in received):
            assert time.monotonic() < deadline
            while sent < len(messages) and pub.offer(messages[sent]) > 0:
                sent += 1
            work = d.do_work()
            for sub, assembler in zip(subs, assemblers, strict=True):
                work += sub.poll(assembler, 100)
            if work == 0:
                d.idle(0.002)
        assert received == [messages, messages]
        assert all(s.images[0].session_id == pub.session_id for s in subs)


def test_a_receiver_that_leaves_is_dropped_and_the_others_keep_receiving(tmp_path: Path) -> None:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        pub = d.add_publication("aeron:udp?control=127.0.0.1:0|control-mode=dynamic", 21)
        channel = (
            f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{pub.local_endpoints[0][1]}"
            "|control-mode=dynamic"
        )
        stay, leave = d.add_subscription(channel, 21), d.add_subscription(channel, 21)
        pump(d, lambda: len(pub.destinations) == 2 and stay.is_connected and leave.is_connected)
        leave.close()
        pump(d, lambda: len(pub.destinations) == 1)  # its EOS SM removed it
        assert pub.destinations == [stay.local_endpoints[0]]
        pub.offer(b"still here")
        got: list[bytes] = []
        pump(d, lambda: stay.poll(lambda p, h: got.append(bytes(p)), 10) > 0 or bool(got))
        assert got == [b"still here"]


def test_destinations_expire_after_the_connection_timeout() -> None:
    clock = ManualClock()
    pub = PublicationState(
        session_id=8,
        stream_id=1,
        initial_term_id=0,
        term_id=0,
        term_offset=0,
        term_length=65536,
        mtu=1408,
        dynamic=True,
        now_ns=clock.now_ns,
    )
    a, b = ("10.0.0.1", 5000), ("192.168.1.7", 6000)  # e.g. two clients behind NAT

    def status(receiver_id: int) -> StatusMessage:
        return StatusMessage(8, 1, 0, 0, 65536, receiver_id)

    pub.on_status_message(status(1), a, clock.now_ns)
    pub.on_status_message(status(2), b, clock.now_ns)
    assert set(pub.destinations) == {a, b}
    sent: list[Any] = []
    for _ in range(6):
        clock.advance(CONNECTION_TIMEOUT_NS // 5)
        pub.on_status_message(status(1), a, clock.now_ns)
        pub.send(clock.now_ns, lambda data, address: sent.append(address))
    assert set(pub.destinations) == {a}
    assert set(pub.receivers) == {1}
    pub.offer(b"x")
    sent.clear()
    pub.send(clock.now_ns, lambda data, address: sent.append(address))
    assert sent == [a]
