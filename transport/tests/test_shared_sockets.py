"""Publications and subscriptions sharing UDP sockets, as Aeron's driver shares its channel
endpoints: unicast publications to one endpoint send from one socket, and a subscription that
names the port a port-0 subscription was given (same control) reads from that one's socket.

Real UDP sockets on loopback, one driver in invoker mode stepped by the test (bounded waits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import BACK_PRESSURED, ChannelError, Driver, DriverConfig
from aeron_spark.transport.testing import LossConfig, pump

TIMEOUT_S = 20.0
MESSAGE = 1000  # bytes: 200 of them are three 64 KiB terms, so flow control must move


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        yield d


def deliver(driver: Driver, pub: Any, reader: Any, messages: list[bytes]) -> list[bytes]:
    """Offer ``messages`` on ``pub`` (None: they were offered already) and poll ``reader`` (an
    image or a subscription) until they have all arrived; what arrived, in order."""
    got: list[bytes] = []
    sent = 0 if pub is not None else len(messages)
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < len(messages):
        assert time.monotonic() < deadline, f"{len(got)} of {len(messages)} delivered"
        while sent < len(messages) and pub.offer(messages[sent]) > 0:
            sent += 1
        work = driver.do_work()
        work += reader.poll(lambda payload, header: got.append(bytes(payload)), 64)
        if work == 0:
            driver.idle(0.002)
    return got


def payloads(tag: bytes, count: int) -> list[bytes]:
    return [tag + i.to_bytes(4, "big") + bytes(MESSAGE - 5) for i in range(count)]


def send_socket(driver: Driver) -> Any:
    (ep,) = driver._conductor.send_endpoints.values()
    return ep.endpoint


# ---------------------------------------------------------------------- publications


def test_publications_to_one_endpoint_share_one_socket_and_flow_control_apart(
    driver: Driver,
) -> None:
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
    port = sub.local_endpoints[0][1]
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    a = driver.add_publication(channel, 10)
    b = driver.add_publication(channel, 10)
    assert a.session_id != b.session_id
    assert len(driver._conductor.send_endpoints) == 1
    assert a.local_endpoints == b.local_endpoints
    udp = send_socket(driver)
    assert driver._conductor.sender.endpoints[0].endpoint is udp
    with pytest.raises(ChannelError, match="session-id"):  # one (session, stream) per socket
        driver.add_publication(f"{channel}|session-id={a.session_id}", 10)

    pump(driver, lambda: a.is_connected and b.is_connected and len(sub.images) == 2)
    image = {im.session_id: im for im in sub.images}

    # a's receiver never reads: a fills the receiver window and is back-pressured ...
    accepted_a: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    refused = 0
    while refused < 50:  # 50 steps in a row that move nothing
        assert time.monotonic() < deadline, "a was never back-pressured"
        msg = b"a" + len(accepted_a).to_bytes(4, "big") + bytes(MESSAGE - 5)
        result = a.offer(msg)
        if result > 0:
            accepted_a.append(msg)
            refused = 0
            continue
        assert result == BACK_PRESSURED
        refused += 1
        driver.do_work()
    assert image[a.session_id].position == 0 and len(accepted_a) * MESSAGE > 32 * 1024

    # ... while b, on the same socket, moves three terms' worth through its own SMs
    messages_b = payloads(b"b", 200)
    assert deliver(driver, b, image[b.session_id], messages_b) == messages_b
    assert a.offer(b"a" + bytes(MESSAGE - 1)) == BACK_PRESSURED  # a is still held back
    assert image[a.session_id].position == 0

    # a's receiver catches up: everything a accepted arrives, in order, on a's image only
    assert deliver(driver, None, image[a.session_id], accepted_a) == accepted_a

    # closing a keeps the socket (b still sends on it); b keeps delivering
    a.close()
    pump(driver, lambda: driver._conductor.publications == [b])
    assert send_socket(driver) is udp and udp.sock.fileno() != -1
    more = payloads(b"B", 20)
    assert deliver(driver, b, image[b.session_id], more) == more

    # the last one closed: the socket closes with it
    b.close()
    pump(driver, lambda: not driver._conductor.send_endpoints)
    assert driver._conductor.sender.endpoints == () and udp.sock.fileno() == -1


def test_naks_on_a_shared_socket_reach_the_publication_they_name(tmp_path: Path) -> None:
    """A lossy link (every socket of the driver drops 10% of what it receives): each
    publication gets the NAKs for its own losses and repairs its own stream."""
    config = DriverConfig(
        threading_mode="invoker", directory=tmp_path, loss=LossConfig(drop_rate=0.1, seed=7)
    )
    with Driver(config) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
        channel = f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}|term-length=64k"
        pubs = [d.add_publication(channel, 10) for _ in range(2)]
        assert len(d._conductor.send_endpoints) == 1
        pump(d, lambda: all(p.is_connected for p in pubs) and len(sub.images) == 2)
        image = {im.session_id: im for im in sub.images}
        for pub, tag in zip(pubs, (b"x", b"y"), strict=True):
            messages = payloads(tag, 200)
            assert deliver(d, pub, image[pub.session_id], messages) == messages
        for pub in pubs:
            assert pub._state.naks_received > 0 and pub._state.retransmits_sent > 0
        assert d.system_counters.loss_injected_drops > 0


def test_a_shared_send_socket_refuses_a_channel_asking_other_socket_buffers(
    driver: Driver,
) -> None:
    """As Aeron's driver: a channel that names so-sndbuf/so-rcvbuf other than the shared
    socket's is refused (it does not get a socket of its own); one naming none, or the same,
    shares it."""
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
    endpoint = f"127.0.0.1:{sub.local_endpoints[0][1]}"
    first = driver.add_publication(f"aeron:udp?endpoint={endpoint}|so-sndbuf=256k", 10)
    with pytest.raises(ChannelError, match="so-sndbuf") as refused:
        driver.add_publication(f"aeron:udp?endpoint={endpoint}|so-sndbuf=512k", 10)
    assert "262144" in str(refused.value)  # names what the shared socket has
    with pytest.raises(ChannelError, match="so-rcvbuf"):
        driver.add_publication(f"aeron:udp?endpoint={endpoint}|so-rcvbuf=1m", 10)
    same = driver.add_publication(f"aeron:udp?endpoint={endpoint}|so-sndbuf=256k", 10)
    unnamed = driver.add_publication(f"aeron:udp?endpoint={endpoint}", 10)
    assert len(driver._conductor.send_endpoints) == 1
    assert first.local_endpoints == same.local_endpoints == unnamed.local_endpoints
    assert len(driver._conductor.publications) == 3  # nothing of the refused ones is left


def test_publications_not_sharing_a_socket(driver: Driver) -> None:
    """Another endpoint, interface or max-amplification (a guarded socket) is another socket."""
    subs = [driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10) for _ in range(2)]
    p1, p2 = (f"127.0.0.1:{s.local_endpoints[0][1]}" for s in subs)
    plain = driver.add_publication(f"aeron:udp?endpoint={p1}", 10)
    other = driver.add_publication(f"aeron:udp?endpoint={p2}", 10)
    bound = driver.add_publication(f"aeron:udp?endpoint={p1}|interface=127.0.0.1", 10)
    guarded = driver.add_publication(f"aeron:udp?endpoint={p1}|max-amplification=3", 10)
    guarded2 = driver.add_publication(f"aeron:udp?endpoint={p1}|max-amplification=3", 10)
    sockets = {p.local_endpoints[0] for p in (plain, other, bound, guarded)}
    assert len(sockets) == 4 == len(driver._conductor.send_endpoints)
    assert guarded2.local_endpoints == guarded.local_endpoints
    ledgers = {
        ep.endpoint.local_port: ep.endpoint.ledger
        for ep in driver._conductor.send_endpoints.values()
    }
    assert ledgers[guarded.local_endpoints[0][1]] is driver.amplification is not None
    assert ledgers[plain.local_endpoints[0][1]] is None


# ---------------------------------------------------------------------- subscriptions


def dynamic_sub(port: int, control_port: int, extra: str = "") -> str:
    return (
        f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.1:{control_port}"
        f"|control-mode=dynamic{extra}"
    )


def test_a_subscription_on_a_port_zero_subscriptions_port_shares_its_socket(
    driver: Driver,
) -> None:
    c = driver._conductor
    # two dynamic-MDC publications on one control socket (a handshake server's reply
    # publication and a session's), each with its own stream (the driver shares the socket
    # of publications naming the same control, here the same "any port")
    pub_channel = "aeron:udp?control=127.0.0.1:0|control-mode=dynamic|term-length=64k"
    replies = driver.add_publication(pub_channel, 30)
    session = driver.add_publication(f"{pub_channel}|session-id=777", 31)
    control = replies.local_endpoints[0][1]
    assert session.local_endpoints == replies.local_endpoints
    first = driver.add_subscription(dynamic_sub(0, control), 30)
    port = first.local_endpoints[0][1]
    second = driver.add_subscription(dynamic_sub(port, control, "|session-id=777"), 31)
    assert second.local_endpoints == first.local_endpoints
    assert len(c.receive_endpoints) == 1
    (rep,) = c.receive_endpoints.values()
    udp = rep.endpoint

    pump(driver, lambda: first.is_connected and second.is_connected)
    here = [("127.0.0.1", port)]
    assert replies.destinations == here and session.destinations == here
    assert [im.session_id for im in first.images] == [replies.session_id]
    assert [im.session_id for im in second.images] == [777]
    for pub, sub, tag in ((replies, first, b"r"), (session, second, b"s")):
        messages = payloads(tag, 200)  # three terms: each image's SMs must reach its publication
        assert deliver(driver, pub, sub, messages) == messages

    # closing the session's subscription: EOS for its image only; the reply stream goes on
    second.close()
    pump(driver, lambda: session.destinations == [] and not session.is_connected)
    assert replies.destinations == here and replies.is_connected
    assert list(c.receive_endpoints.values()) == [rep] and udp.sock.fileno() != -1
    messages = payloads(b"R", 50)
    assert deliver(driver, replies, first, messages) == messages
    assert [im.session_id for im in first.images] == [replies.session_id]

    # the last interest gone: the socket closes
    first.close()
    pump(driver, lambda: not c.receive_endpoints)
    assert c.receiver.endpoints == () and udp.sock.fileno() == -1


def test_a_subscription_naming_a_taken_port_with_another_control_is_refused(
    driver: Driver,
) -> None:
    first = driver.add_subscription(dynamic_sub(0, 40123), 30)
    port = first.local_endpoints[0][1]
    for channel in (
        dynamic_sub(port, 40124),  # another control
        f"aeron:udp?endpoint=127.0.0.1:{port}",  # no control at all
    ):
        with pytest.raises(ChannelError, match="control") as refused:
            driver.add_subscription(channel, 31)
        assert f"127.0.0.1:{port}" in str(refused.value)
    assert len(driver._conductor.receive_endpoints) == 1
    assert driver._conductor.subscriptions == [first]
    # the same control still shares
    third = driver.add_subscription(dynamic_sub(port, 40123), 31)
    assert third.local_endpoints == first.local_endpoints


def test_a_shared_receive_socket_refuses_a_channel_asking_other_socket_options(
    driver: Driver,
) -> None:
    first = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0|so-rcvbuf=256k", 30)
    endpoint = f"127.0.0.1:{first.local_endpoints[0][1]}"
    for param in ("so-rcvbuf=1m", "so-sndbuf=64k", "max-amplification=3"):
        with pytest.raises(ChannelError, match=param.split("=")[0]):
            driver.add_subscription(f"aeron:udp?endpoint={endpoint}|{param}", 31)
    same = driver.add_subscription(f"aeron:udp?endpoint={endpoint}|so-rcvbuf=256k", 31)
    unnamed = driver.add_subscription(f"aeron:udp?endpoint={endpoint}", 32)
    assert first.local_endpoints == same.local_endpoints == unnamed.local_endpoints
    assert len(driver._conductor.receive_endpoints) == 1
    assert driver._conductor.subscriptions == [first, same, unnamed]
