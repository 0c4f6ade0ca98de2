"""Flow control strategies of a publication with several receivers (``fc=max``, ``fc=min``,
``fc=tagged``, Aeron's syntax), stepped by a manual clock: with ``min`` the slowest receiver sets
the pace until it goes silent for the receiver timeout or ends its stream; with ``tagged`` only
receivers whose SMs carry the group tag hold the sender; ``g:/N`` keeps a publication unconnected
until N such receivers are known. Before these, every publication followed its fastest receiver,
and a slow archive of three recording one publication fell behind for good."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.api import BACK_PRESSURED, NOT_CONNECTED
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.protocol.flow_control import (
    FlowControl,
    FlowControlPolicy,
    MinFlowControl,
    parse_flow_control,
)
from aeron_spark.transport.protocol.frames import SmFlags, StatusMessage
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.testing import ManualClock, Wire, pump
from aeron_spark.transport.uri import ChannelConfig

A = ("127.0.0.5", 4000)
B = ("127.0.0.6", 4000)
C = ("127.0.0.7", 4000)
TERM = 1 << 16
WINDOW = 8 * 1024
MS = 1_000_000
TIMEOUT_S = 30.0


def _pub(clock: ManualClock, fc: str | None) -> PublicationState:
    return PublicationState(
        session_id=77,
        stream_id=10,
        initial_term_id=5,
        term_id=5,
        term_offset=0,
        term_length=TERM,
        mtu=1408,
        dynamic=True,
        now_ns=clock.now_ns,
        flow_control=None if fc is None else parse_flow_control(fc),
    )


def _sm(
    position: int, receiver_id: int, *, tag: int | None = None, flags: int = 0
) -> StatusMessage:
    return StatusMessage(77, 10, 5, position, WINDOW, receiver_id, flags=flags, group_tag=tag)


def _fill(pub: PublicationState) -> int:
    """Offer 1 KiB messages until the publication pushes back; how many it took."""
    n = 0
    while pub.offer(b"x" * 1000) > 0:
        n += 1
        assert n < 1000
    return n


def _send_all(pub: PublicationState, clock: ManualClock) -> None:
    wire = Wire()
    while pub.send(clock.now_ns, wire):
        pass


def test_max_follows_the_fastest_receiver_as_before() -> None:
    clock = ManualClock()
    pub = _pub(clock, None)
    assert type(pub.flow) is FlowControl
    pub.on_status_message(_sm(0, 1), A, clock.now_ns)
    _fill(pub)
    _send_all(pub, clock)  # an SM beyond what was sent is refused
    pub.on_status_message(_sm(4096, 2), B, clock.now_ns)
    assert pub.flow.sender_limit == 4096 + WINDOW


def test_min_waits_for_the_slowest_until_it_goes_silent_for_the_receiver_timeout() -> None:
    clock = ManualClock()
    pub = _pub(clock, "min,t:100ms")
    assert isinstance(pub.flow, MinFlowControl)
    pub.on_status_message(_sm(0, 1), A, clock.now_ns)
    pub.on_status_message(_sm(0, 2), B, clock.now_ns)
    _fill(pub)
    _send_all(pub, clock)
    assert WINDOW - 1100 < pub.sender_position <= WINDOW  # a window past both, whole frames
    # A keeps up, B is slow: the sender goes no further than B's window
    pub.on_status_message(_sm(pub.sender_position, 1), A, clock.now_ns)
    pub.on_status_message(_sm(1024, 2), B, clock.now_ns)
    assert pub.flow.sender_limit == 1024 + WINDOW
    _fill(pub)
    _send_all(pub, clock)
    assert pub.sender_position <= 1024 + WINDOW
    # B goes silent; A keeps sending SMs: after the receiver timeout B no longer holds A back
    for _ in range(12):
        clock.advance(10 * MS)
        pub.on_status_message(_sm(pub.sender_position & (TERM - 1), 1), A, clock.now_ns)
        pub.send(clock.now_ns, Wire())
    assert pub.flow.counted.keys() == {1}
    assert pub.flow.sender_limit >= pub.sender_position
    _fill(pub)
    _send_all(pub, clock)
    assert pub.sender_position > 1024 + WINDOW


def test_min_end_of_stream_of_the_slowest_releases_the_others() -> None:
    clock = ManualClock()
    pub = _pub(clock, "min")
    pub.on_status_message(_sm(0, 1), A, clock.now_ns)
    pub.on_status_message(_sm(0, 2), B, clock.now_ns)
    _fill(pub)
    _send_all(pub, clock)
    pub.on_status_message(_sm(4096, 1), A, clock.now_ns)
    assert pub.flow.sender_limit == WINDOW
    pub.on_status_message(_sm(0, 2, flags=SmFlags.EOS), B, clock.now_ns)
    pub.on_status_message(_sm(4096, 1), A, clock.now_ns)
    assert pub.flow.sender_limit == 4096 + WINDOW


def test_min_does_not_wait_for_a_receiver_joining_more_than_a_window_behind() -> None:
    clock = ManualClock()
    pub = _pub(clock, "min")
    while pub.sender_position < 4 * WINDOW:  # A alone for four windows
        pub.on_status_message(_sm(pub.sender_position, 1), A, clock.now_ns)
        _fill(pub)
        _send_all(pub, clock)
    position = pub.sender_position
    pub.on_status_message(_sm(position, 1), A, clock.now_ns)
    pub.on_status_message(_sm(0, 2), B, clock.now_ns)  # 4 windows behind: not counted
    assert pub.flow.counted.keys() == {1}
    assert pub.flow.sender_limit == position + WINDOW


def test_tagged_counts_only_receivers_with_the_group_tag() -> None:
    clock = ManualClock()
    pub = _pub(clock, "tagged,g:7")
    pub.on_status_message(_sm(0, 1, tag=7), A, clock.now_ns)
    _fill(pub)
    _send_all(pub, clock)
    pub.on_status_message(_sm(4096, 2), B, clock.now_ns)  # untagged: receives, holds nobody
    pub.on_status_message(_sm(4096, 3, tag=8), C, clock.now_ns)  # another group
    assert pub.flow.counted.keys() == {1}
    assert pub.flow.sender_limit == WINDOW
    pub.on_status_message(_sm(2048, 1, tag=7), A, clock.now_ns)
    assert pub.flow.sender_limit == 2048 + WINDOW


def test_a_group_minimum_keeps_the_publication_unconnected_until_enough_receivers() -> None:
    clock = ManualClock()
    pub = _pub(clock, "tagged,g:7/2")
    pub.on_status_message(_sm(0, 1, tag=7), A, clock.now_ns)
    pub.on_status_message(_sm(0, 2), B, clock.now_ns)  # untagged: does not count
    assert not pub.is_connected
    assert pub.offer(b"x") == NOT_CONNECTED
    assert pub.flow.sender_limit == 0
    pub.on_status_message(_sm(0, 3, tag=7), C, clock.now_ns)
    assert pub.is_connected
    assert pub.flow.sender_limit == WINDOW
    assert pub.offer(b"x") > 0
    _fill(pub)
    assert pub.offer(b"x" * 1000) == BACK_PRESSURED


def test_min_group_size_applies_to_any_receiver() -> None:
    clock = ManualClock()
    pub = _pub(clock, "min,g:/3")
    pub.on_status_message(_sm(0, 1), A, clock.now_ns)
    pub.on_status_message(_sm(0, 2), B, clock.now_ns)
    assert not pub.is_connected and pub.offer(b"x") == NOT_CONNECTED
    pub.on_status_message(_sm(0, 3), C, clock.now_ns)
    assert pub.is_connected and pub.offer(b"x") > 0


def test_a_dropped_destination_stops_holding_the_sender() -> None:
    clock = ManualClock()
    pub = _pub(clock, "min,t:10s")
    pub.on_status_message(_sm(0, 1), A, clock.now_ns)
    pub.on_status_message(_sm(0, 2), B, clock.now_ns)
    _fill(pub)
    _send_all(pub, clock)
    pub.on_status_message(_sm(4096, 1), A, clock.now_ns)
    assert pub.flow.sender_limit == WINDOW
    # B stops sending SMs: its destination goes after the connection timeout (5 s), with its
    # receiver, although the flow control's own receiver timeout (10 s) has not passed
    for _ in range(60):
        clock.advance(100 * MS)
        pub.on_status_message(_sm(4096, 1), A, clock.now_ns)
        pub.send(clock.now_ns, Wire())
    assert B not in pub.dests.by_address
    assert pub.flow.counted.keys() == {1}
    assert pub.flow.sender_limit == 4096 + WINDOW


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("max", FlowControlPolicy("max")),
        ("min", FlowControlPolicy("min")),
        ("min,t:250ms", FlowControlPolicy("min", 250 * MS)),
        ("min,g:/2", FlowControlPolicy("min", group_min_size=2)),
        ("tagged,g:123", FlowControlPolicy("tagged", group_tag=123)),
        ("tagged,g:-5/3,t:1s", FlowControlPolicy("tagged", 1_000 * MS, -5, 3)),
    ],
)
def test_fc_parameter_parses_as_aeron_writes_it(text: str, policy: FlowControlPolicy) -> None:
    config = ChannelConfig.from_uri(f"aeron:udp?endpoint=127.0.0.1:40000|fc={text}")
    assert config.flow_control == policy


@pytest.mark.parametrize(
    "text",
    ["fastest", "max,t:1s", "min,t:0s", "min,t:soon", "min,g:3", "tagged", "tagged,g:x", "min,q:1"],
)
def test_a_bad_fc_parameter_is_a_channel_error_naming_it(text: str) -> None:
    with pytest.raises(ChannelError, match="fc"):
        ChannelConfig.from_uri(f"aeron:udp?endpoint=127.0.0.1:40000|fc={text}")


def test_a_subscription_gtag_goes_into_every_status_message() -> None:
    from aeron_spark.transport.protocol.frames import decode_datagram  # noqa: PLC0415
    from aeron_spark.transport.protocol.image import ImageState  # noqa: PLC0415

    config = ChannelConfig.from_uri("aeron:udp?endpoint=127.0.0.1:40000|gtag=-42")
    assert config.group_tag == -42
    image = ImageState(
        session_id=77,
        stream_id=10,
        initial_term_id=5,
        active_term_id=5,
        term_offset=0,
        term_length=TERM,
        mtu=1408,
        source_address=A,
        group_tag=config.group_tag,
    )
    wire = Wire()
    image.do_work(0, wire)
    (data, _), *_ = wire.sent
    (sm,) = decode_datagram(data)
    assert isinstance(sm, StatusMessage) and sm.group_tag == -42
    with pytest.raises(ChannelError, match="gtag"):
        ChannelConfig.from_uri("aeron:udp?endpoint=127.0.0.1:40000|gtag=1e3")


@pytest.mark.parametrize("fc", ["min", "tagged,g:5/3"])
def test_a_slow_receiver_of_three_gets_every_message_with_min_flow_control(
    tmp_path: Path, fc: str
) -> None:
    """Real sockets: a dynamic MDC publication with 64 KiB terms and three subscriptions, one of
    which reads a fragment only every fourth turn. With ``fc=min`` (or the three tagged) the
    publication waits for it and every subscription gets every message in order; with the old
    max-only flow control the two fast ones ran more than a log ahead of the slow one, whose
    lost datagrams were then no longer there to resend."""
    with Driver(DriverConfig(threading_mode="invoker", directory=tmp_path)) as d:
        pub = d.add_publication(
            f"aeron:udp?control=127.0.0.1:0|control-mode=dynamic|term-length=64k|fc={fc}", 22
        )
        channel = (
            f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{pub.local_endpoints[0][1]}"
            "|control-mode=dynamic|gtag=5"
        )
        subs = [d.add_subscription(channel, 22) for _ in range(3)]
        pump(d, lambda: all(s.is_connected for s in subs) and len(pub.destinations) == 3)
        messages = [bytes([i % 251]) * (1000 + (i * 37) % 3000) for i in range(400)]
        received: list[list[bytes]] = [[], [], []]
        assemblers = [
            FragmentAssembler(lambda p, h, got=got: got.append(bytes(p))) for got in received
        ]
        sent = turn = 0
        deadline = time.monotonic() + TIMEOUT_S
        while any(len(r) < len(messages) for r in received):
            assert time.monotonic() < deadline, [len(r) for r in received]
            while sent < len(messages) and pub.offer(messages[sent]) > 0:
                sent += 1
            turn += 1
            work = d.do_work()
            work += subs[0].poll(assemblers[0], 100) + subs[1].poll(assemblers[1], 100)
            if turn % 4 == 0:
                work += subs[2].poll(assemblers[2], 1)
            if work == 0:
                d.idle(0.001)
        assert received == [messages, messages, messages]
