"""UDP GSO over real sockets: a run sent in one ``sendmsg`` reaches a plain UDP socket as its
individual datagrams, byte for byte; a run the kernel refuses goes one datagram at a time and
is counted; the driver sends its publications' runs that way end to end."""

from __future__ import annotations

import random
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import ChannelError, Driver, DriverConfig, DriverError
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.endpoint import UdpEndpoint, gso_supported
from aeron_spark.transport.testing import LossConfig
from aeron_spark.transport.uri import Endpoint

from .test_udp_loopback import connect, transfer

WAIT_S = 20.0  # per datagram: bounded, sized for a loaded machine
SO_NO_CHECK = 11  # asm-generic/socket.h: no UDP checksums on this socket (IPv4)
UDP_NO_CHECK6_TX = 101  # linux/udp.h: the same for IPv6 (sending)
UDP_NO_CHECK6_RX = 102  # and the receiver must take zero checksums (RFC 6935)


def _gso_here() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return gso_supported(s)


pytestmark = pytest.mark.skipif(not _gso_here(), reason="UDP GSO needs Linux 4.18 or later")

FAMILIES = {
    "ipv4": (socket.AF_INET, "127.0.0.1", "0.0.0.0"),
    "ipv6": (socket.AF_INET6, "::1", "::"),
}


@pytest.fixture(params=sorted(FAMILIES))
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[UdpEndpoint, socket.socket, Any]]:
    """Our sending endpoint and a plain UDP socket receiving, of one address family."""
    family, loopback, wildcard = FAMILIES[request.param]
    receiver = socket.socket(family, socket.SOCK_DGRAM)
    try:
        receiver.bind((loopback, 0))
    except OSError as exc:
        receiver.close()
        pytest.skip(f"no {request.param} loopback here: {exc}")
    receiver.settimeout(WAIT_S)
    sender = UdpEndpoint(Endpoint(wildcard, 0, family), SystemCounters())
    try:
        yield sender, receiver, receiver.getsockname()
    finally:
        sender.close()
        receiver.close()


def _receive(receiver: socket.socket, count: int) -> list[bytes]:
    return [receiver.recv(65536) for _ in range(count)]


def _no_more(sender: UdpEndpoint, receiver: socket.socket, address: Any) -> None:
    """Nothing else was delivered: a marker sent after the run is the next datagram."""
    sender.send(b"marker", address)
    assert receiver.recv(65536) == b"marker"


def _run(lengths: list[int]) -> tuple[bytes, list[bytes]]:
    rng = random.Random(sum(lengths))
    datagrams = [rng.randbytes(n) for n in lengths]
    return b"".join(datagrams), datagrams


def test_a_run_arrives_as_its_datagrams(pair: tuple[UdpEndpoint, socket.socket, Any]) -> None:
    sender, receiver, address = pair
    assert sender.gso
    data, datagrams = _run([1408] * 5 + [1344])  # an 8 KiB message's fragments at mtu 1408
    sender.send_segments(memoryview(data), 1408, address)
    assert _receive(receiver, 6) == datagrams
    _no_more(sender, receiver, address)
    counters = sender.counters
    assert counters.gso_sends == 1 and counters.gso_fallbacks == 0
    assert counters.datagrams_sent == 7 and counters.bytes_sent == len(data) + 6
    # equal datagrams only, the most one send carries (46 x 1408 <= 65,507)
    data, datagrams = _run([1408] * 46)
    sender.send_segments(data, 1408, address)
    assert _receive(receiver, 46) == datagrams
    _no_more(sender, receiver, address)
    assert counters.gso_sends == 2 and counters.datagrams_sent == 7 + 47


def test_a_run_of_one_datagram_is_an_ordinary_send(
    pair: tuple[UdpEndpoint, socket.socket, Any],
) -> None:
    sender, receiver, address = pair
    sender.send_segments(b"x" * 900, 1408, address)
    assert _receive(receiver, 1) == [b"x" * 900]
    assert sender.counters.gso_sends == 0 and sender.counters.datagrams_sent == 1


def test_a_refused_run_goes_one_by_one_and_is_counted(
    pair: tuple[UdpEndpoint, socket.socket, Any],
) -> None:
    sender, receiver, address = pair
    # A socket that sends without UDP checksums cannot segment (the kernel answers EINVAL):
    # a real refusal, as on a route through IPsec or a segment above the path MTU.
    if sender.family == socket.AF_INET6:
        sender.sock.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
        receiver.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
    else:
        sender.sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    data, datagrams = _run([1056] * 7 + [200])
    sender.send_segments(data, 1056, address)
    assert _receive(receiver, 8) == datagrams
    _no_more(sender, receiver, address)
    counters = sender.counters
    assert counters.gso_fallbacks == 1 and counters.gso_sends == 0
    assert counters.datagrams_sent == 9 and counters.send_errors == 0
    assert address in sender.gso_refused
    # that destination is sent to one by one from then on: no second refusal
    sender.send_segments(data, 1056, address)
    assert _receive(receiver, 8) == datagrams
    assert counters.gso_fallbacks == 1 and counters.gso_sends == 0
    assert counters.datagrams_sent == 17


def test_gso_off_sends_one_by_one() -> None:
    counters = SystemCounters()
    sender = UdpEndpoint(Endpoint("0.0.0.0", 0, socket.AF_INET), counters, gso=False)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
            receiver.bind(("127.0.0.1", 0))
            receiver.settimeout(WAIT_S)
            data, datagrams = _run([1408] * 3 + [10])
            sender.send_segments(data, 1408, receiver.getsockname())
            assert _receive(receiver, 4) == datagrams
    finally:
        sender.close()
    assert counters.gso_sends == 0 and counters.gso_fallbacks == 0
    assert counters.datagrams_sent == 4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_coalesced_receive_is_handed_out_as_its_datagrams(family: str) -> None:
    """With UDP GRO a GSO run over loopback arrives in one receive: the endpoint hands it out
    datagram by datagram, cut where the sender cut it, then the next receive."""
    fam, loopback, wildcard = FAMILIES[family]
    try:
        receiver = UdpEndpoint(Endpoint(loopback, 0, fam), SystemCounters(), gro=True)
    except DriverError as exc:
        pytest.skip(f"no {family} loopback here: {exc}")
    sender = UdpEndpoint(Endpoint(wildcard, 0, fam), SystemCounters())
    try:
        assert receiver.gro and sender.gso
        address = receiver.local_address
        first, first_datagrams = _run([1408] * 5 + [1344])
        second, second_datagrams = _run([1408] * 46)
        sender.send_segments(first, 1408, address)
        sender.send_segments(second, 1408, address)
        sender.send(b"marker", address)
        got: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while b"marker" not in got:
            item = receiver.raw_receive()
            if item is None:
                assert time.monotonic() < deadline, f"{len(got)} datagrams arrived"
                select.select([receiver.sock], [], [], 0.05)
                continue
            buf, length, source = item
            assert source[1] == sender.local_port
            got.append(bytes(buf[:length]))
        assert got == first_datagrams + second_datagrams + [b"marker"]
        counters = receiver.counters
        assert counters.datagrams_received == 53
        assert counters.bytes_received == len(first) + len(second) + 6
        assert counters.gro_receives == 2  # each run in one receive
        assert receiver.gro_segment == 0
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize(
    ("gso", "gro"), [(True, False), (False, False), (True, True)], ids=["gso", "plain", "gso-gro"]
)
def test_driver_delivers_messages_sent_in_runs(tmp_path: Path, gso: bool, gro: bool) -> None:
    config = DriverConfig(threading_mode="invoker", directory=tmp_path, udp_gso=gso, udp_gro=gro)
    rng = random.Random(3)
    messages = [rng.randbytes(rng.choice([1024, 8192, 65536, 1, 3000])) for _ in range(60)]
    with Driver(config) as driver:
        pub, sub = connect(driver, "|mtu=1408|term-length=1m")
        got = transfer(driver, pub, sub, messages)
        snapshot = driver.counters.snapshot()
    assert got == messages
    if gso:
        assert snapshot["gso_sends"] > 0
    else:
        assert snapshot["gso_sends"] == 0
    assert snapshot["gso_fallbacks"] == 0
    assert (snapshot["gro_receives"] > 0) == gro


@pytest.mark.parametrize("gso", [True, False], ids=["gso", "plain"])
def test_lost_datagrams_are_resent_in_runs_and_every_message_arrives(
    tmp_path: Path, gso: bool
) -> None:
    """Retransmits go out as GSO runs through the same path as fresh data (issue 34): over
    real sockets with 10% of the datagrams dropped, every message arrives whole, in order."""
    config = DriverConfig(
        threading_mode="invoker",
        directory=tmp_path,
        udp_gso=gso,
        loss=LossConfig(drop_rate=0.1, seed=34),
    )
    rng = random.Random(34)
    messages = [rng.randbytes(rng.choice([8192, 20_000, 1024, 3000])) for _ in range(150)]
    with Driver(config) as driver:
        pub, sub = connect(driver, "|mtu=1408|term-length=1m")
        got = transfer(driver, pub, sub, messages)
        snapshot = driver.counters.snapshot()
    assert got == messages
    assert snapshot["retransmits_sent"] > 0 and snapshot["loss_injected_drops"] > 0
    assert (snapshot["gso_sends"] > 0) == gso
    assert snapshot["gso_fallbacks"] == 0


@pytest.mark.parametrize("name", ["udp_gso", "udp_gro"])
def test_udp_gso_and_gro_must_be_bools(name: str) -> None:
    with pytest.raises(ChannelError, match=name):
        DriverConfig(**{name: "no"})
