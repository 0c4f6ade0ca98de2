"""When the receiver wakes a subscriber: once per receiver step for a burst of datagrams.

A subscriber woken per datagram (``on_data`` from inside ``on_datagram``) took the GIL from the
receiver thread at every ``recvfrom``: a bounded replay from the real Aeron Archive spent ~160 us
per receive while its consumer mostly waited. The dispatcher now marks the interest and calls
``on_data`` once, at the start of its next ``do_work`` (the receiver agent steps it right after
draining up to 64 datagrams of the socket).
"""

from __future__ import annotations

from typing import Any

from aeron_spark.transport.protocol.frames import DataFrame, SetupFrame
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.testing import ManualClock

SENDER = ("127.0.0.1", 41000)


def _wire(data: Any, address: Any) -> None:
    pass


def _setup(dispatcher: ReceiveDispatcher, clock: ManualClock, session: int = 3) -> None:
    setup = SetupFrame(0, session, 10, 7, 7, 65536, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SENDER, clock.now_ns, _wire)


def _data(dispatcher: ReceiveDispatcher, clock: ManualClock, offset: int, session: int = 3) -> int:
    frame = DataFrame(offset, session, 10, 7, bytes(64)).encode()  # 96 bytes aligned
    dispatcher.on_datagram(frame, len(frame), SENDER, clock.now_ns, _wire)
    return offset + 96


def test_a_burst_of_datagrams_wakes_the_subscriber_once_at_the_next_step() -> None:
    clock = ManualClock()
    dispatcher = ReceiveDispatcher()
    images: list[ImageState] = []
    woken: list[int] = []  # the image's received position when the subscriber is woken
    dispatcher.add(
        StreamInterest(10, on_image=images.append, on_data=lambda: woken.append(images[0].hwm))
    )
    _setup(dispatcher, clock)
    offset = 0
    for _ in range(10):
        offset = _data(dispatcher, clock, offset)
    assert woken == []  # nothing while the burst is drained
    assert dispatcher.do_work(clock.now_ns, _wire) >= 1
    assert woken == [960]  # once, with the whole burst there
    dispatcher.do_work(clock.now_ns, _wire)
    assert woken == [960] and dispatcher.data_notifications == 1
    offset = _data(dispatcher, clock, offset)
    assert woken == [960]
    dispatcher.do_work(clock.now_ns, _wire)
    assert woken == [960, 1056] and dispatcher.data_notifications == 2


def test_each_subscription_with_data_is_woken_once_and_one_without_data_not_at_all() -> None:
    clock = ManualClock()
    dispatcher = ReceiveDispatcher()
    woken: list[str] = []
    dispatcher.add(StreamInterest(10, on_data=lambda: woken.append("a")))
    dispatcher.add(StreamInterest(10, on_data=lambda: woken.append("b")))
    dispatcher.add(StreamInterest(10, session_id=4, on_data=lambda: woken.append("other")))
    _setup(dispatcher, clock)
    offset = 0
    for _ in range(5):
        offset = _data(dispatcher, clock, offset)
    dispatcher.do_work(clock.now_ns, _wire)
    assert sorted(woken) == ["a", "b"]
    dispatcher.do_work(clock.now_ns, _wire)
    assert sorted(woken) == ["a", "b"]


def test_a_duplicate_or_refused_datagram_wakes_no_one() -> None:
    clock = ManualClock()
    dispatcher = ReceiveDispatcher()
    woken: list[int] = []
    dispatcher.add(StreamInterest(10, on_data=lambda: woken.append(1)))
    _setup(dispatcher, clock)
    frame = DataFrame(64 * 1024 - 96, 3, 10, 7 + 8, bytes(64)).encode()  # far past the window
    dispatcher.on_datagram(frame, len(frame), SENDER, clock.now_ns, _wire)
    dispatcher.do_work(clock.now_ns, _wire)
    assert woken == []


def test_a_gap_an_unreliable_image_pads_wakes_the_subscriber_in_the_step_that_pads_it() -> None:
    """Issue 31: every advance of what a subscriber can read signals it. Data signals as it is
    inserted; an unreliable image (``reliable=false``) instead pads a gap whose NAK fell due,
    and the frames behind it became readable with nothing arriving: a subscriber woken only by
    ``on_data`` (as the stream server's loop is) waited for the next datagram, for good on a
    stream that had gone quiet. Frames 1 and 3 arrive, 2 never does (manual clock)."""
    clock = ManualClock()
    dispatcher = ReceiveDispatcher()
    images: list[ImageState] = []
    woken: list[int] = []
    dispatcher.add(
        StreamInterest(
            10,
            on_image=images.append,
            on_data=lambda: woken.append(images[0].gaps_filled),
            reliable=False,
        )
    )
    _setup(dispatcher, clock)
    dispatcher.do_work(clock.now_ns, _wire)  # its first SM: connected
    _data(dispatcher, clock, 0)
    _data(dispatcher, clock, 192)  # frame 2 (at 96) lost
    dispatcher.do_work(clock.now_ns, _wire)
    assert woken == [0]
    read: list[int] = []
    assert images[0].poll(lambda body, header: read.append(len(body)), 10) == 1  # frame 1
    for _ in range(100):  # until the gap's NAK falls due and it is padded
        clock.advance(5_000_000)
        dispatcher.do_work(clock.now_ns, _wire)
        if images[0].gaps_filled:
            break
    assert images[0].gaps_filled == 1
    assert woken == [0, 1]  # before: [0], frame 3 readable and nobody told
    assert images[0].poll(lambda body, header: read.append(len(body)), 10) == 1  # frame 3
    dispatcher.do_work(clock.now_ns, _wire)
    assert woken == [0, 1]
