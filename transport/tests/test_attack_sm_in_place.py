"""Crafted status messages against the sender's in-place SM read (``SendEndpoint.on_control``
-> ``PublicationState.on_sm``, issue 31: an SM's fields read from the datagram, no
``StatusMessage`` built). The in-place read must refuse what ``StatusMessage.decode`` refuses
and nothing crafted may let a publication send past what a real receiver's SM allows. Real
loopback datagrams from a real peer socket."""

from __future__ import annotations

import socket
import struct
from typing import Any

from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import SendEndpoint, SenderAgent
from aeron_spark.transport.driver.endpoint import Endpoint, UdpEndpoint
from aeron_spark.transport.protocol.frames import SM, StatusMessage
from aeron_spark.transport.testing import ManualClock, session_publication
from transport.tests.test_idle_streams import _read_until

TERM = 64 * 1024


def _rig() -> tuple[ManualClock, SystemCounters, UdpEndpoint, UdpEndpoint, SenderAgent, Any]:
    clock, counters = ManualClock(), SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    peer = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), SystemCounters())
    ep = SendEndpoint("k", udp)
    agent = SenderAgent(counters, lambda ep, pub: ep.remove(pub))
    agent.endpoints = (ep,)
    return clock, counters, udp, peer, agent, ep


def _with_version(frame: bytes, version: int) -> bytes:
    return frame[:4] + bytes([version]) + frame[5:]


def test_attack_an_sm_of_another_protocol_version_is_refused_as_the_decoder_refuses_it() -> None:
    """Held: ``StatusMessage.decode`` refuses a frame whose version is not ours
    (``invalid_frames``); the in-place read skips that check, but ``on_control`` refuses
    another version before it (passes on main): a guard that the read never takes one."""
    clock, counters, udp, peer, agent, ep = _rig()
    try:
        me = ("127.0.0.1", udp.local_port)
        pub = session_publication(clock, ("127.0.0.1", peer.local_port), 1000)
        ep.add(pub)
        agent.do_work(clock.now_ns)  # its first SETUP
        foreign = _with_version(StatusMessage(1000, 10, 0, 0, TERM // 2, 5).encode(), 1)
        tagged = _with_version(StatusMessage(1000, 10, 0, 0, TERM // 2, 6, 7).encode(), 9)
        for datagram in (foreign, tagged):
            peer.send(datagram, me)
        _read_until(agent, counters, 2, clock.now_ns)
        assert counters.invalid_frames == 2, (
            f"SMs of versions 1 and 9 taken as ours: invalid_frames {counters.invalid_frames}, "
            f"connected {pub.is_connected}, sender limit {pub.flow.sender_limit}"
        )
        assert not pub.is_connected and pub.flow.sender_limit == 0
        assert pub.status_messages_received == 0
        peer.send(StatusMessage(1000, 10, 0, 0, 4096, 5).encode(), me)  # ours: taken
        _read_until(agent, counters, 3, clock.now_ns)
        assert pub.is_connected and pub.flow.sender_limit == 4096
    finally:
        udp.close()
        peer.close()


def test_attack_crafted_positions_and_windows_never_open_more_than_an_sm_allows() -> None:
    """Held: positions past what was sent (a far term id, a wrapped one, a negative offset),
    another session's id, a negative or zero window: refused or ignored; the sender limit is
    the largest honest position + window only."""
    clock, counters, udp, peer, agent, ep = _rig()
    try:
        me = ("127.0.0.1", udp.local_port)
        pub = session_publication(clock, ("127.0.0.1", peer.local_port), 1000)
        ep.add(pub)
        agent.do_work(clock.now_ns)
        peer.send(StatusMessage(1000, 10, 0, 0, 2048, 5).encode(), me)
        _read_until(agent, counters, 1, clock.now_ns)
        assert pub.flow.sender_limit == 2048
        for _ in range(3):
            assert pub.offer(bytes(1000)) > 0  # three frames of 1,056 bytes (aligned)
        pub.kick()
        agent.do_work(clock.now_ns)
        sent = pub.sender_position
        assert sent == 1056  # one frame fits the window, two do not
        crafted = [
            StatusMessage(1000, 10, 3, 0, 1024, 5),  # a term never sent
            StatusMessage(1000, 10, -(2**31), 0, 1024, 5),  # a term id that wraps
            StatusMessage(1000, 10, 2**31 - 1, 2**31 - 1, 2**31 - 1, 5),
            StatusMessage(1000, 10, 1, -(TERM - 16), 1024, 5),  # next term, offset back
            StatusMessage(1001, 10, 0, 0, 2**31 - 1, 5),  # another session's id
            StatusMessage(1000, 10, 0, 0, -(2**31), 5),  # a negative window
        ]
        for sm in crafted:
            peer.send(sm.encode(), me)
        peer.send(struct.pack("<i", 36) + bytes(SM.size - 4), me)  # a type-0 frame
        _read_until(agent, counters, 1 + len(crafted) + 1, clock.now_ns)
        assert pub.flow.sender_limit == 2048 and pub.sender_position == sent
        assert pub.dests.status_messages_refused == 3  # the three positions never sent
    finally:
        udp.close()
        peer.close()
