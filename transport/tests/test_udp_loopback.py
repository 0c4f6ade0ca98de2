"""The driver and client API over real UDP sockets on loopback, in one process."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeron_spark.transport import (
    BACK_PRESSURED,
    CLOSED,
    NOT_CONNECTED,
    BufferClaim,
    ChannelError,
    ControlledAction,
    Driver,
    DriverConfig,
    DriverError,
    FragmentAssembler,
    Image,
    NotConnectedError,
    read_counters,
)
from aeron_spark.transport.errors import ClosedError
from aeron_spark.transport.testing import pump

TIMEOUT_S = 20.0


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        yield d


def connect(
    driver: Driver, params: str = "", stream_id: int = 10, host: str = "127.0.0.1", **callbacks: Any
) -> tuple[Any, Any]:
    sub = driver.add_subscription(f"aeron:udp?endpoint={host}:0", stream_id, **callbacks)
    port = sub.local_endpoints[0][1]
    where = f"[{host}]" if ":" in host else host
    pub = driver.add_publication(f"aeron:udp?endpoint={where}:{port}{params}", stream_id)
    pump(driver, lambda: pub.is_connected and sub.is_connected)
    return pub, sub


def transfer(
    driver: Driver, pub: Any, sub: Any, messages: list[bytes], timeout_s: float = TIMEOUT_S
) -> list[bytes]:
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda payload, header: got.append(bytes(payload)))
    i = 0
    deadline = time.monotonic() + timeout_s
    while len(got) < len(messages):
        assert time.monotonic() < deadline, f"only {len(got)} of {len(messages)} arrived"
        while i < len(messages) and pub.offer(messages[i]) > 0:
            i += 1
        work = driver.do_work() + sub.poll(assembler, 256)
        if work == 0:
            driver.idle(0.002)
    return got


def test_subscription_reports_the_ephemeral_port_it_bound(driver: Driver) -> None:
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 1)
    ((host, port),) = sub.local_endpoints
    assert host == "127.0.0.1" and port > 0


def test_messages_of_all_sizes_arrive_in_order_exactly_once(driver: Driver) -> None:
    pub, sub = connect(driver, "|term-length=128k")
    rnd = random.Random(1)
    messages = [rnd.randbytes(rnd.randint(0, 5 * pub.mtu)) for _ in range(2000)]
    assert transfer(driver, pub, sub, messages) == messages


def test_offer_before_any_subscriber_is_not_connected(driver: Driver) -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 3)
    driver.do_work()
    assert pub.offer(b"x") == NOT_CONNECTED
    with pytest.raises(NotConnectedError) as info:
        pub.offer_blocking(b"x", timeout_s=0.2)
    assert info.value.reason == "NOT_CONNECTED"


def test_slow_subscriber_back_pressures_the_publisher_and_nothing_is_lost(tmp_path: Path) -> None:
    with Driver(DriverConfig(threading_mode="shared", directory=tmp_path)) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0|rcv-wnd=8k", 4)
        port = sub.local_endpoints[0][1]
        pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k", 4)
        assert pub.wait_until_connected(TIMEOUT_S)
        messages = [bytes([i % 256]) * 700 for i in range(300)]
        results: list[int] = []

        def produce() -> None:
            for m in messages:
                while (r := pub.offer(m)) < 0:
                    results.append(r)
                    time.sleep(0.001)

        producer = threading.Thread(target=produce)
        producer.start()
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < len(messages) and time.monotonic() < deadline:
            sub.poll(lambda p, h: got.append(bytes(p)), 2)  # two messages at a time, then nap
            time.sleep(0.002)
        producer.join(TIMEOUT_S)
        assert got == messages
        assert BACK_PRESSURED in results
        assert d.counters.snapshot()["back_pressure_events"] > 0


def test_offer_blocking_waits_for_the_window_and_delivers_everything(tmp_path: Path) -> None:
    with Driver(DriverConfig(directory=tmp_path)) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 4)
        pub = d.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}|term-length=64k", 4
        )
        assert pub.wait_until_connected(TIMEOUT_S)
        messages = [i.to_bytes(4, "little") * 100 for i in range(2000)]
        got: list[bytes] = []

        def consume() -> None:
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < len(messages) and time.monotonic() < deadline:
                if sub.poll(lambda p, h: got.append(bytes(p)), 50) == 0:
                    sub.wait(0.1)

        consumer = threading.Thread(target=consume)
        consumer.start()
        for m in messages:
            pub.offer_blocking(m, timeout_s=TIMEOUT_S)
        consumer.join(TIMEOUT_S)
        assert got == messages


def test_term_id_wraps_past_int32_max(driver: Driver) -> None:
    start = 2**31 - 2
    pub, sub = connect(
        driver, f"|term-length=64k|init-term-id={start}|term-id={start}|term-offset=0"
    )
    term_ids: set[int] = set()
    got: list[bytes] = []

    def on_fragment(payload: memoryview, header: Any) -> None:
        term_ids.add(header.term_id)
        got.append(bytes(payload))

    messages = [i.to_bytes(4, "little") * 250 for i in range(400)]  # ~6 terms of 64 KiB
    i = 0
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < len(messages) and time.monotonic() < deadline:
        while i < len(messages) and pub.offer(messages[i]) > 0:
            i += 1
        if driver.do_work() + sub.poll(on_fragment, 100) == 0:
            driver.idle(0.002)
    assert got == messages
    assert {2**31 - 2, 2**31 - 1, -(2**31), -(2**31) + 1} <= term_ids
    assert pub.position > 4 * 65536


def test_ipv6_loopback(driver: Driver) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("IPv6 loopback is not configured on this machine")
    pub, sub = connect(driver, host="::1")
    assert sub.images[0].source_identity.startswith("[::1]:")
    messages = [bytes([i]) * (i * 37) for i in range(100)]
    assert transfer(driver, pub, sub, messages) == messages


def test_image_callbacks_and_end_of_stream_on_close(driver: Driver) -> None:
    available: list[Image] = []
    unavailable: list[Image] = []
    pub, sub = connect(
        driver,
        "|linger=0",
        on_available_image=available.append,
        on_unavailable_image=unavailable.append,
    )
    assert [i.session_id for i in available] == [pub.session_id]
    image = available[0]
    assert image.initial_term_id == pub.initial_term_id and image.mtu == pub.mtu
    assert sub.image_by_session_id(pub.session_id) is image
    pub.offer(b"final")
    pub.close()
    assert pub.offer(b"late") == CLOSED
    got: list[bytes] = []
    pump(
        driver,
        lambda: (
            bool(unavailable) or bool(sub.poll(lambda p, h: got.append(bytes(p)), 10) and False)
        ),
    )
    assert got == [b"final"]
    assert unavailable == [image] and image.is_closed and image.is_end_of_stream
    assert sub.images == []


def test_try_claim_commit_and_abort(driver: Driver) -> None:
    pub, sub = connect(driver)
    claim = pub.try_claim(5, reserved_value=99)
    assert isinstance(claim, BufferClaim)
    claim.buffer[:] = b"hello"
    claim.commit()
    aborted = pub.try_claim(3)
    assert isinstance(aborted, BufferClaim)
    aborted.abort()
    with pub.try_claim(2) as c:  # type: ignore[union-attr]
        c.buffer[:] = b"ok"
    got: list[tuple[bytes, int]] = []
    pump(
        driver,
        lambda: (
            sub.poll(lambda p, h: got.append((bytes(p), h.reserved_value)), 10) > 0
            and len(got) >= 2
            or len(got) >= 2
        ),
    )
    assert got == [(b"hello", 99), (b"ok", 0)]


def test_controlled_poll_abort_leaves_the_fragment_for_next_time(driver: Driver) -> None:
    pub, sub = connect(driver)
    for m in (b"a", b"b", b"c"):
        pub.offer(m)
    seen: list[bytes] = []

    def handler(payload: memoryview, header: Any) -> ControlledAction:
        if bytes(payload) == b"b" and b"b?" not in seen:
            seen.append(b"b?")
            return ControlledAction.ABORT
        seen.append(bytes(payload))
        return ControlledAction.CONTINUE

    pump(driver, lambda: sub.images[0]._state.hwm >= pub.position)
    assert sub.controlled_poll(handler, 10) == 1
    assert sub.controlled_poll(handler, 10) == 2
    assert seen == [b"a", b"b?", b"b", b"c"]


def test_block_poll_hands_whole_raw_frames(driver: Driver) -> None:
    pub, sub = connect(driver)
    for i in range(10):
        pub.offer(bytes([i]) * 10)
    pump(driver, lambda: sub.images[0]._state.hwm >= pub.position)
    blocks: list[tuple[bytes, int, int, int]] = []
    image = sub.images[0]
    consumed = image.block_poll(
        lambda term, offset, length, session, term_id: blocks.append(
            (bytes(term[offset : offset + length]), offset, session, term_id)
        ),
        1 << 20,
    )
    assert consumed == 10 * 64 and image.position == pub.position
    raw, offset, session, term_id = blocks[0]
    assert session == pub.session_id and term_id == pub.initial_term_id and len(raw) == 640


def test_concurrent_publication_from_several_threads(tmp_path: Path) -> None:
    with Driver(DriverConfig(directory=tmp_path)) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 5)
        channel = f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}"
        pub = d.add_publication(channel, 5, exclusive=False)
        assert pub.wait_until_connected(TIMEOUT_S)

        def produce(tag: int) -> None:
            for n in range(300):
                pub.offer_blocking(bytes([tag]) + n.to_bytes(4, "little"), timeout_s=TIMEOUT_S)

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(3)]
        for t in threads:
            t.start()
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 900 and time.monotonic() < deadline:
            if sub.poll(lambda p, h: got.append(bytes(p)), 100) == 0:
                sub.wait(0.1)
        for t in threads:
            t.join(TIMEOUT_S)
        for tag in range(3):
            mine = [int.from_bytes(m[1:], "little") for m in got if m[0] == tag]
            assert mine == list(range(300))


def test_two_publications_to_one_subscription_are_two_images(driver: Driver) -> None:
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 6)
    channel = f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}"
    pubs = [driver.add_publication(channel, 6) for _ in range(2)]
    pump(driver, lambda: all(p.is_connected for p in pubs) and len(sub.images) == 2)
    for p in pubs:
        p.offer(p.session_id.to_bytes(4, "little", signed=True))
    got: list[tuple[int, bytes]] = []
    pump(
        driver,
        lambda: (
            sub.poll(lambda pl, h: got.append((h.session_id, bytes(pl))), 10) >= 0 and len(got) == 2
        ),
    )
    assert sorted(got) == sorted(
        (p.session_id, p.session_id.to_bytes(4, "little", signed=True)) for p in pubs
    )


def test_spy_subscription_reads_a_local_publication(driver: Driver) -> None:
    pub, sub = connect(driver)
    port = sub.local_endpoints[0][1]
    spy = driver.add_subscription(f"aeron-spy:aeron:udp?endpoint=127.0.0.1:{port}", 10)
    assert len(spy.images) == 1
    pub.offer(b"seen twice")
    got: list[bytes] = []
    spy.poll(lambda p, h: got.append(bytes(p)), 10)
    assert got == [b"seen twice"]


def test_counters_are_published_to_a_file_another_process_can_read(tmp_path: Path) -> None:
    config = DriverConfig(threading_mode="invoker", directory=tmp_path, counters_interval_ns=1)
    with Driver(config) as d:
        pub, sub = connect(d)
        transfer(d, pub, sub, [b"x" * 100] * 10)
        d.do_work()
        snap = d.counters.snapshot()
        assert snap["bytes_sent"] > 1000 and snap["status_messages_received"] >= 1
        assert snap[f"sub_pos:{pub.session_id}:10"] == pub.position
        assert snap[f"pub_lmt:{pub.session_id}:10"] >= pub.position
        published = read_counters(tmp_path)
        assert len(published) == 1 and published[0]["counters"]["bytes_sent"] > 0


def test_bad_channel_parameters_name_the_parameter(driver: Driver) -> None:
    with pytest.raises(ChannelError) as info:
        driver.add_publication("aeron:udp?endpoint=127.0.0.1:1|mtu=1000", 1)
    assert info.value.name == "mtu"
    with pytest.raises(ChannelError) as info:
        driver.add_subscription("aeron:udp?control=127.0.0.1:1", 1)
    assert info.value.name == "endpoint"


def test_ipc_channels_go_to_the_ipc_module_or_fail_clearly(driver: Driver) -> None:
    try:
        pub = driver.add_publication("aeron:ipc", 1)
    except DriverError as exc:
        assert "ipc" in str(exc)
    else:
        assert hasattr(pub, "offer")


def test_closed_driver_refuses_new_resources(tmp_path: Path) -> None:
    d = Driver(DriverConfig(threading_mode="invoker", directory=tmp_path))
    d.start()
    d.close()
    with pytest.raises(ClosedError):
        d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 1)


@pytest.mark.parametrize("mode", ["shared", "dedicated"])
def test_threaded_driver_modes_deliver_with_blocking_helpers(tmp_path: Path, mode: str) -> None:
    with Driver(DriverConfig(threading_mode=mode, directory=tmp_path)) as d:  # type: ignore[arg-type]
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 7)
        pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}", 7)
        assert pub.wait_until_connected(TIMEOUT_S)
        messages = [bytes([i]) * (i * 31) for i in range(200)]
        got: list[bytes] = []
        assembler = FragmentAssembler(lambda p, h: got.append(bytes(p)))
        for m in messages:
            pub.offer_blocking(m, timeout_s=TIMEOUT_S)
            sub.poll(assembler, 10)
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < len(messages) and time.monotonic() < deadline:
            if sub.poll(assembler, 100) == 0:
                sub.wait(0.1)
        assert got == messages


def test_driver_config_takes_a_directory_as_text(tmp_path: Path) -> None:
    config = DriverConfig(threading_mode="invoker", directory=str(tmp_path))  # type: ignore[arg-type]
    assert config.directory == tmp_path
    with pytest.raises(ChannelError) as info:
        DriverConfig(directory=42)  # type: ignore[arg-type]
    assert info.value.name == "directory"


def test_a_publication_tells_when_its_receiver_last_sent_a_status_message(driver) -> None:
    """``Publication.last_status_ns``: the driver's time of the newest SM of a connected
    receiver, which an idle receiver keeps sending (the stream server renews an idle session's
    lease from it: issue 31); None before the first and once no receiver is left."""
    sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
    port = sub.local_endpoints[0][1]
    pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 10)
    assert pub.last_status_ns is None
    pump(driver, lambda: pub.is_connected and sub.is_connected)
    first = pub.last_status_ns
    assert first is not None and first <= time.monotonic_ns()
    pump(driver, lambda: pub.last_status_ns > first)  # idle: its SMs go on
    sub.close()
    pump(driver, lambda: pub.last_status_ns is None)  # its last SM (EOS) or the timeout
    assert not pub.is_connected
    pub.close()
