"""Garbage datagrams only ever raise RemoteProtocolError, are counted, and never stop a driver."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import SendEndpoint
from aeron_spark.transport.driver.endpoint import UdpEndpoint
from aeron_spark.transport.errors import RemoteProtocolError
from aeron_spark.transport.protocol.frames import SetupFrame
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.uri import Endpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SOURCE = ("127.0.0.1", 41000)

# Structured garbage: a plausible header (version 0, a known type, our stream) and random rest.
headers = st.builds(
    lambda length, flags, ftype, offset, session, stream, term, rest: (
        struct.pack("<iBBhiiii", length, 0, flags, ftype, offset, session, stream, term) + rest
    ),
    st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 32, 33, 64, 1408, 65536]),
    st.integers(0, 255),
    st.sampled_from([0, 1, 2, 3, 4, 5, 6, 0x0B, 0x7F]),
    st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 32, 65504, 65536]),
    st.sampled_from([3, 4]) | st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([10]) | st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([7, 8, 9]) | st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=200),
)
datagrams = st.binary(max_size=300) | headers


def dispatcher_with_image() -> ReceiveDispatcher:
    dispatcher = ReceiveDispatcher()
    dispatcher.add(StreamInterest(10))
    dispatcher.add(StreamInterest(10, session_id=4))
    setup = SetupFrame(0, 3, 10, 7, 7, 65536, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SOURCE, 0, lambda d, a: None)
    return dispatcher


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(datagrams, min_size=1, max_size=5))
def test_receive_path_raises_only_remote_protocol_errors(packets: list[bytes]) -> None:
    dispatcher = dispatcher_with_image()
    now = 1
    for packet in packets:
        for buf in (packet, bytearray(packet) + bytearray(64)):
            try:
                dispatcher.on_datagram(buf, len(packet), SOURCE, now, lambda d, a: None)
            except RemoteProtocolError:
                pass
        now += 1_000_000
        dispatcher.do_work(now, lambda d, a: None)
    for image in dispatcher.images():
        image.poll(lambda p, h: None, 100)
        image.block_poll(lambda *args: None, 65536)


@settings(max_examples=300, deadline=None)
@given(st.lists(datagrams, min_size=1, max_size=5))
def test_control_path_raises_only_remote_protocol_errors(packets: list[bytes]) -> None:
    counters = SystemCounters()
    udp = UdpEndpoint(Endpoint("127.0.0.1", 0, socket.AF_INET), counters)
    try:
        ep = SendEndpoint("k", udp)
        pub = PublicationState(
            session_id=3,
            stream_id=10,
            initial_term_id=7,
            term_id=7,
            term_offset=0,
            term_length=65536,
            mtu=1408,
            destination=SOURCE,
        )
        ep.add(pub)
        pub.offer(b"x" * 100)
        for packet in packets:
            try:
                ep.on_control(packet, len(packet), SOURCE, 1)
            except RemoteProtocolError:
                pass
            pub.send(2, lambda d, a: None)
    finally:
        udp.close()


def test_a_driver_counts_garbage_and_keeps_delivering(tmp_path: Path) -> None:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
        port = sub.local_endpoints[0][1]
        pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 10)
        deadline = time.monotonic() + 10
        while not pub.is_connected:
            assert time.monotonic() < deadline
            d.do_work()
            d.idle(0.005)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
            for junk in (
                b"",
                b"\x00",
                b"\xff" * 40,
                struct.pack("<iBBh", 5, 0, 0, 1) + bytes(40),
                struct.pack("<iBBh", 40, 1, 0, 5) + bytes(32),
            ):
                attacker.sendto(junk, ("127.0.0.1", port))
                attacker.sendto(junk, pub.local_endpoints[0])
        pub.offer(b"still fine")
        got: list[bytes] = []
        while not got:
            assert time.monotonic() < deadline
            if d.do_work() + sub.poll(lambda p, h: got.append(bytes(p)), 10) == 0:
                d.idle(0.005)
        assert got == [b"still fine"]
        assert d.counters.snapshot()["invalid_frames"] >= 6
        assert d.errors == []


# The crafted inputs of issue 15 (item 3): SETUPs asking for huge terms or mtus, DATA and
# heartbeats far ahead (~512 MiB in a 1 GiB term, just past half a term, just past the window).
GIB = 1024**3
MIB = 1024**2
crafted_setups = st.builds(
    lambda session, term_length, mtu, active: SetupFrame(
        0, session, 10, 7, active, term_length, mtu
    ).encode(),
    st.sampled_from([3, 4, 5]),
    st.sampled_from([GIB, 512 * MIB, 64 * MIB, MIB, 128 * 1024, 65536]),
    st.sampled_from([65504, 32768, 8192, 1408, 64]),
    st.sampled_from([7, 8]),
)
crafted_data = st.builds(
    lambda session, offset, term, size, heartbeat: (
        struct.pack("<iBBhiiii", 0, 0, 0xC0, 1, offset, session, 10, term) + bytes(24)
        if heartbeat
        else struct.pack("<iBBhiiii", 32 + size, 0, 0xC0, 1, offset, session, 10, term)
        + bytes(24)
        + b"\xab" * size
        + bytes(-size % 32)
    ),
    st.sampled_from([3, 4, 5]),
    st.sampled_from(
        [512 * MIB - 4096, GIB // 2 - 1056, 32 * 1024, 32 * 1024 - 64, 128 * 1024, 0, 1024]
    )
    | st.integers(0, GIB // 32 - 64).map(lambda n: n * 32),
    st.sampled_from([7, 8, 9]),
    st.sampled_from([0, 32, 1000]),
    st.booleans(),
)


def _check_bounded(dispatcher: ReceiveDispatcher, bounded: StreamInterest) -> None:
    for image in bounded.images.values():
        assert image.term_length <= 65536 and image.mtu <= 8192
    for image in dispatcher.images():
        assert image.hwm <= image.last_sm_position + image.window
        assert image.rebuild_position <= max(image.hwm, image.subscriber_position)
        assert len(image._inserted) <= image.window // 32


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(crafted_setups | crafted_data, min_size=1, max_size=12))
def test_crafted_setups_and_far_data_are_refused_or_dropped(packets: list[bytes]) -> None:
    """Only RemoteProtocolError; a bounded interest never gets a big image; no image holds,
    or scans, anything past the window its SMs advertise."""
    dispatcher = ReceiveDispatcher()
    wide, bounded = StreamInterest(10), StreamInterest(10, max_term_length=65536, max_mtu=8192)
    dispatcher.add(wide)
    dispatcher.add(bounded)
    now = 1
    for packet in packets:
        try:
            dispatcher.on_datagram(packet, len(packet), SOURCE, now, lambda d, a: None)
        except RemoteProtocolError:
            pass
        _check_bounded(dispatcher, bounded)
        now += 1_000_000
        dispatcher.do_work(now, lambda d, a: None)
        _check_bounded(dispatcher, bounded)
