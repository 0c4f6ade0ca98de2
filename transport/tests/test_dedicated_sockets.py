"""A subscription socket's senders on sockets of their own (``dedicated-sources``, issue 28).

A channel with ``dedicated-sources=N`` binds its socket with ``SO_REUSEPORT``;
``Driver.dedicate_socket(image)`` then gives that image's sender a socket bound to the same
address and connected to it, read into the same dispatcher: the kernel hands it every datagram
of the sender, so a flood of the shared socket does not reach them (the end-to-end flood test is
``connector/tests/test_attack_port_flood.py``). Real UDP sockets on loopback, two invoker-mode
drivers stepped by the test (bounded waits).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import ChannelError, Driver, DriverConfig, TransportError
from aeron_spark.transport.driver.agents import DedicatedBudget

TIMEOUT_S = 20.0
MESSAGE = 1000


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[tuple[Driver, Driver]]:
    config = DriverConfig(
        threading_mode="invoker",
        counters_interval_ns=50_000_000,  # the tick that closes idle dedicated sockets
        write_counters_file=False,
    )
    with Driver(config) as receiver, Driver(config) as sender:
        yield receiver, sender


def pump(drivers: tuple[Driver, ...], until: Any) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not until():
        assert time.monotonic() < deadline, "condition not reached in time"
        if sum(d.do_work() for d in drivers) == 0:
            drivers[0].idle(0.002)


def deliver(drivers: tuple[Driver, ...], pub: Any, image: Any, messages: list[bytes]) -> list:
    got: list[bytes] = []
    sent = 0
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < len(messages):
        assert time.monotonic() < deadline, f"{len(got)} of {len(messages)} delivered"
        while sent < len(messages) and pub.offer(messages[sent]) > 0:
            sent += 1
        work = sum(d.do_work() for d in drivers)
        work += image.poll(lambda payload, header: got.append(bytes(payload)), 64)
        if work == 0:
            drivers[0].idle(0.002)
    return got


def payloads(tag: bytes, count: int) -> list[bytes]:
    return [tag + i.to_bytes(4, "big") + bytes(MESSAGE - len(tag) - 4) for i in range(count)]


def receive_endpoint(driver: Driver) -> Any:
    (rep,) = driver._conductor.receive_endpoints.values()
    return rep


def counted_receives(udp: Any) -> list[int]:
    """Count the datagrams ``udp``'s socket hands over (wraps its receive call)."""
    counts = [0]
    inner = udp._recvfrom_into

    def recvfrom_into(buffer: Any) -> Any:
        got = inner(buffer)
        counts[0] += 1
        return got

    udp._recvfrom_into = recvfrom_into
    return counts


def test_a_dedicated_sender_is_read_from_a_connected_socket_of_its_own(drivers) -> None:
    receiver, sender = drivers
    sub = receiver.add_subscription("aeron:udp?endpoint=127.0.0.1:0|dedicated-sources=1", 10)
    port = sub.local_endpoints[0][1]
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    pub_a = sender.add_publication(channel, 10)
    pub_b = receiver.add_publication(channel, 10)  # another sender: another socket
    pump(drivers, lambda: len(sub.images) == 2 and pub_a.is_connected and pub_b.is_connected)
    image_a = next(im for im in sub.images if im.session_id == pub_a.session_id)
    image_b = next(im for im in sub.images if im.session_id == pub_b.session_id)
    rep = receive_endpoint(receiver)
    shared = counted_receives(rep.endpoint)

    first = receiver.dedicate_socket(image_a)
    second = receiver.dedicate_socket(image_a)  # counted: a second session of the same sender
    assert first is not None and second is not None
    (dedicated,) = rep.dedicated.values()
    assert dedicated.users == 2
    assert rep.sockets == (dedicated.udp, rep.endpoint)  # read first
    assert dedicated.udp.sock.getpeername() == image_a.source_address
    assert dedicated.udp.sock.getsockname() == rep.endpoint.sock.getsockname()
    own = counted_receives(dedicated.udp)
    # the limit is 1: the other sender stays on the shared socket, counted
    assert receiver.dedicate_socket(image_b) is None
    counters = receiver.counters.snapshot()
    assert (counters["dedicated_sockets_opened"], counters["dedicated_sockets_refused"]) == (1, 1)

    messages = payloads(b"a", 300)  # several 64 KiB terms: flow control and SMs move too
    before = shared[0]
    assert deliver(drivers, pub_a, image_a, messages) == messages
    assert own[0] >= 300
    # what the shared socket handed over meanwhile is the other sender's heartbeats, not a's
    assert shared[0] - before < 100

    receiver.release_socket(first)
    receiver.release_socket(second)
    pump(drivers, lambda: not rep.dedicated)  # closed about a second after its last release
    assert rep.sockets == (rep.endpoint,)
    assert dedicated.udp.closed
    assert receiver.counters.snapshot()["dedicated_sockets_closed"] == 1
    # and the sender goes on over the shared socket
    more = payloads(b"b", 50)
    assert deliver(drivers, pub_a, image_a, more) == more


def test_a_dedicated_receiver_sends_its_status_messages_to_a_socket_of_its_own(drivers) -> None:
    """On a dynamic publication's control socket: the receiver's SMs and NAKs arrive on a
    socket connected to it, and the data still leaves by the shared one."""
    publisher, subscriber = drivers
    pub = publisher.add_publication(
        "aeron:udp?control=127.0.0.1:0|control-mode=dynamic|term-length=64k|dedicated-sources=2",
        10,
    )
    control = pub.local_endpoints[0][1]
    sub = subscriber.add_subscription(
        f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{control}|control-mode=dynamic", 10
    )
    pump(drivers, lambda: bool(sub.images) and pub.is_connected)
    (ep,) = publisher._conductor.send_endpoints.values()
    handle = publisher.dedicate_socket(pub)
    assert handle is not None
    (dedicated,) = ep.dedicated.values()
    assert dedicated.udp.sock.getpeername() == tuple(pub.destinations[0])
    own = counted_receives(dedicated.udp)
    messages = payloads(b"c", 300)  # five terms: the publisher waits for SMs to move on
    assert deliver(drivers, pub, sub.images[0], messages) == messages
    assert own[0] >= 5
    publisher.release_socket(handle)
    pump(drivers, lambda: not ep.dedicated)
    assert ep.sockets == (ep.endpoint,)


def test_a_channel_without_dedicated_sources_gives_none(drivers) -> None:
    receiver, sender = drivers
    sub = receiver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
    pub = sender.add_publication(f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}", 10)
    pump(drivers, lambda: bool(sub.images) and pub.is_connected)
    assert receiver.dedicate_socket(sub.images[0]) is None
    assert receive_endpoint(receiver).sockets == (receive_endpoint(receiver).endpoint,)
    assert receiver.counters.snapshot()["dedicated_sockets_refused"] == 0
    with pytest.raises(ChannelError, match="dedicated-sources"):  # a socket's option
        receiver.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}|dedicated-sources=2", 11
        )


def test_a_fixed_port_is_not_shared_with_another_reuseport_socket(drivers) -> None:
    """SO_REUSEPORT would let a second socket of the same user bind the port: a second
    server on the same port is refused as a plain bind is."""
    first, second = drivers
    sub = first.add_subscription("aeron:udp?endpoint=127.0.0.1:0|dedicated-sources=4", 10)
    port = sub.local_endpoints[0][1]
    with pytest.raises(TransportError, match="in use"):
        second.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|dedicated-sources=4", 10)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))


def test_a_budget_bounds_each_tags_share_and_an_idle_socket_gives_its_place(drivers) -> None:
    """A :class:`DedicatedBudget` shared by callers: a sender over its tag's share stays on the
    shared socket (counted ``dedicated_sockets_over_share``) while another tag's sender gets
    one; the budget is given back when a socket closes, and a socket lingering after its last
    release is closed at once for a newcomer of the same tag."""
    receiver, sender = drivers
    sub = receiver.add_subscription("aeron:udp?endpoint=127.0.0.1:0|dedicated-sources=8", 10)
    port = sub.local_endpoints[0][1]
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    pubs = [sender.add_publication(channel, 10), receiver.add_publication(channel, 10)]
    pump(drivers, lambda: len(sub.images) == 2 and all(p.is_connected for p in pubs))
    image_a, image_b = (
        next(im for im in sub.images if im.session_id == p.session_id) for p in pubs
    )
    budget = DedicatedBudget(8, {"key": 1})
    rep = receive_endpoint(receiver)

    held_a = receiver.dedicate_socket(image_a, budget, (("key", "a"),))
    assert held_a is not None and budget.held == 1
    # image b's sender under the same key: over the key's share, stays on the shared socket
    assert receiver.dedicate_socket(image_b, budget, (("key", "a"),)) is None
    counters = receiver.counters.snapshot()
    assert counters["dedicated_sockets_over_share"] == 1
    assert counters["dedicated_sockets_refused"] == 1
    # a's socket lingers after its release (still counted); a newcomer of key a takes its place
    receiver.release_socket(held_a)
    held_b = receiver.dedicate_socket(image_b, budget, (("key", "a"),))
    assert held_b is not None and budget.held == 1
    (only,) = rep.dedicated.values()
    assert only.udp.sock.getpeername() == image_b.source_address
    assert receiver.counters.snapshot()["dedicated_sockets_closed"] == 1
    # under another key, a's sender gets one again
    held_a = receiver.dedicate_socket(image_a, budget, (("key", "b"),))
    assert held_a is not None and budget.held == 2 and len(rep.dedicated) == 2
    receiver.release_socket(held_a)
    receiver.release_socket(held_b)
    pump(drivers, lambda: not rep.dedicated)  # both close after the linger
    assert budget.held == 0 and budget.held_by(("key", "a")) == 0
