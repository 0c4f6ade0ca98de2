"""The publication and image lifecycles as transition tables, driven by random event sequences.

A publication and a receive dispatcher (one subscription) are wired by hand over a link that
drops what hypothesis says, on a manual clock. After every action:

* each phase change is a path of the table (``transitions`` counts the changes; the new phase
  must be reachable from the old one in exactly that many table steps);
* CLOSED is terminal and a closed publication or image sends nothing;
* resources and counters agree: ``is_closed``/``is_done`` follow the phase, the linger deadline
  is set exactly in LINGER and CLOSED, positions keep their order, counters never go down,
  every image the dispatcher created is either live (not CLOSED) or reported gone (CLOSED) once;

and at the end, whatever was reached, closing both ends and letting time pass (over a perfect
or a dead link) ends both in CLOSED within a bounded number of steps.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.transport.api import CLOSED
from aeron_spark.transport.errors import LocalProtocolError
from aeron_spark.transport.protocol.frames import NakFrame, StatusMessage
from aeron_spark.transport.protocol.image import (
    IMAGE_TRANSITIONS,
    ImageEvent,
    ImagePhase,
    ImageState,
)
from aeron_spark.transport.protocol.lifecycle import reaches, step
from aeron_spark.transport.protocol.publication import (
    PUBLICATION_TRANSITIONS,
    PublicationEvent,
    PublicationPhase,
    PublicationState,
)
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest
from aeron_spark.transport.testing import ManualClock

SENDER = ("127.0.0.1", 41000)
MS = 1_000_000
LINGER_NS = 300 * MS
PUB_COUNTERS = (
    "status_messages_received",
    "naks_received",
    "retransmits_sent",
    "retransmitted_bytes",
    "retransmits_suppressed",
    "heartbeats_sent",
    "setups_sent",
    "bytes_sent",
    "back_pressure_events",
    "transitions",
)
IMAGE_COUNTERS = ("naks_sent", "status_messages_sent", "heartbeats_received", "bytes_received")


def exact_steps(table: dict[tuple[Any, Any], Any], start: Any, count: int) -> set[Any]:
    """Phases reachable from ``start`` by exactly ``count`` table transitions that change it."""
    current = {start}
    for _ in range(count):
        current = {t for (s, _), t in table.items() if s in current and t is not s}
    return current


# ---------------------------------------------------------------------------- the tables


@pytest.mark.parametrize(
    ("table", "phases", "final"),
    [
        (PUBLICATION_TRANSITIONS, PublicationPhase, PublicationPhase.CLOSED),
        (IMAGE_TRANSITIONS, ImagePhase, ImagePhase.CLOSED),
    ],
)
def test_every_phase_has_a_way_out_to_closed_and_closed_is_terminal(
    table: dict[tuple[Any, Any], Any], phases: Any, final: Any
) -> None:
    assert reaches(table, final) == set(phases)
    assert all(target is final for (source, _), target in table.items() if source is final)


def test_an_event_the_table_does_not_list_is_a_local_protocol_error() -> None:
    with pytest.raises(
        LocalProtocolError, match="'linger_expired' is not allowed in state 'active'"
    ):
        step(PUBLICATION_TRANSITIONS, PublicationPhase.ACTIVE, PublicationEvent.LINGER_EXPIRED, "")
    pub = make_publication(ManualClock())
    with pytest.raises(LocalProtocolError, match="publication: 'eos_sent'"):
        pub._fire(PublicationEvent.EOS_SENT)
    assert pub.phase is PublicationPhase.ACTIVE and pub.transitions == 0
    image = ImageState(
        session_id=5,
        stream_id=10,
        initial_term_id=0,
        active_term_id=0,
        term_offset=0,
        term_length=64 * 1024,
        mtu=1408,
        source_address=SENDER,
    )
    with pytest.raises(
        LocalProtocolError, match="image: 'eos_sms_sent' is not allowed in state 'init'"
    ):
        image._fire(ImageEvent.EOS_SMS_SENT)
    image.is_closing = True
    assert image.close_requested and image.phase is ImagePhase.INIT  # acted on by do_work
    with pytest.raises(LocalProtocolError, match="cannot be taken back"):
        image.is_closing = False
    image.on_source_closed()
    assert image.is_done
    with pytest.raises(LocalProtocolError, match="'connect' is not allowed in state 'closed'"):
        image._fire(ImageEvent.CONNECT)


# ---------------------------------------------------------------------------- random runs


def make_publication(clock: ManualClock) -> PublicationState:
    return PublicationState(
        session_id=5,
        stream_id=10,
        initial_term_id=100,
        term_id=100,
        term_offset=0,
        term_length=64 * 1024,
        mtu=1408,
        linger_ns=LINGER_NS,
        destination=("127.0.0.1", 40000),
        now_ns=clock.now_ns,
    )


class World:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.pub = make_publication(self.clock)
        self.images: list[ImageState] = []
        self.gone: list[ImageState] = []
        self.dispatcher = ReceiveDispatcher()
        self.born: list[ImagePhase] = []  # each image's phase when it was announced
        self.interest = StreamInterest(
            10, receiver_window=4 * 1024, on_image=self._on_image, on_image_gone=self.gone.append
        )
        self.dispatcher.add(self.interest)
        self.sub_closed = False
        self.received: list[bytes] = []
        self.pub_counts = self._pub_counts()
        self.image_counts: dict[int, tuple[int, ...]] = {}
        self.pub_phase = self.pub.phase
        self.pub_transitions = 0
        self.image_phases: dict[int, tuple[ImagePhase, int]] = {}

    def _on_image(self, image: ImageState) -> None:
        self.images.append(image)
        self.born.append(image.phase)

    def _pub_counts(self) -> tuple[int, ...]:
        return tuple(getattr(self.pub, name) for name in PUB_COUNTERS)

    def step(self, drop: int) -> None:
        """One round trip; ``drop`` is a bit mask over the datagrams (bit i drops the i-th)."""
        now = self.clock.now_ns
        to_sub: list[tuple[bytes, Any]] = []
        was_done = self.pub.is_done
        self.pub.send(now, lambda data, address: to_sub.append((bytes(data), address)))
        if was_done:
            assert to_sub == [], "a closed publication sent something"
        to_pub: list[bytes] = []
        out = lambda data, address: to_pub.append(bytes(data))  # noqa: E731
        for i, (data, _) in enumerate(to_sub):
            if not drop >> (i % 16) & 1:
                self.dispatcher.on_datagram(data, len(data), SENDER, now, out)
        closed_before = [image for image in self.images if image.is_done]
        before = len(to_pub)
        for image in closed_before:
            assert image.do_work(now, out) == 0
        assert len(to_pub) == before, "a closed image sent something"
        self.dispatcher.do_work(now, out)
        for i, data in enumerate(to_pub):
            if drop >> (16 + i % 16) & 1:
                continue
            if data[6] == 3:
                self.pub.on_status_message(StatusMessage.decode(data), SENDER, now)
            elif data[6] == 2:
                self.pub.on_nak(NakFrame.decode(data), now, SENDER)

    def act(self, action: tuple[str, int]) -> None:
        kind, value = action
        if kind == "offer":
            position = self.pub.position
            result = self.pub.offer(bytes([value & 0xFF]) * (1 + value % 6000))
            if self.pub.is_closed:
                assert result == CLOSED and self.pub.position == position
            else:
                assert result != CLOSED
        elif kind == "step":
            self.step(value)
        elif kind == "advance":
            self.clock.advance(value)
        elif kind == "poll":
            for image in self.images:
                image.poll(lambda payload, header: self.received.append(bytes(payload)), 10)
        elif kind == "close_publication":
            self.pub.close(self.clock.now_ns)
            assert self.pub.is_closed and self.pub.offer(b"late") == CLOSED
        elif kind == "close_subscription":
            self.dispatcher.remove(self.interest, self.clock.now_ns)
            self.sub_closed = True
        self.check()

    def check(self) -> None:
        pub = self.pub
        # only table transitions, CLOSED terminal
        made = pub.transitions - self.pub_transitions
        assert pub.phase in exact_steps(PUBLICATION_TRANSITIONS, self.pub_phase, made)
        if self.pub_phase is PublicationPhase.CLOSED:
            assert pub.phase is PublicationPhase.CLOSED and made == 0
        self.pub_phase, self.pub_transitions = pub.phase, pub.transitions
        assert pub.transitions <= 3
        # flags, deadlines and positions follow the phase
        assert pub.is_closed == (pub.phase is not PublicationPhase.ACTIVE)
        assert pub.is_done == (pub.phase is PublicationPhase.CLOSED)
        assert (pub.linger_deadline_ns is None) == (
            pub.phase in (PublicationPhase.ACTIVE, PublicationPhase.DRAINING)
        )
        assert pub.sender_position <= pub.position <= pub.max_position
        assert pub.publisher_limit >= pub.sender_position
        if pub.is_closed:
            assert pub.publisher_limit == pub.position and not pub.is_connected
        counts = self._pub_counts()
        assert all(a <= b for a, b in zip(self.pub_counts, counts, strict=True)), "counter fell"
        self.pub_counts = counts
        # images: created = live + gone, gone ones CLOSED and reported once
        d = self.dispatcher
        assert d.images_created == len(self.images)
        assert d.images_removed == len(self.gone) == len({id(i) for i in self.gone})
        live = list(self.interest.images.values())
        assert len(live) + len(self.gone) == len(self.images)
        assert all(image.is_done for image in self.gone)
        assert not any(image.is_done for image in live)
        for image in self.images:
            old_phase, old_count = self.image_phases.get(id(image), (ImagePhase.INIT, 0))
            made = image.transitions - old_count
            assert image.phase in exact_steps(IMAGE_TRANSITIONS, old_phase, made)
            if old_phase is ImagePhase.CLOSED:
                assert made == 0
            self.image_phases[id(image)] = (image.phase, image.transitions)
            assert image.transitions <= 3
            assert 0 <= image.eos_sms_left <= 3
            assert (image.eos_sms_left == 0) == image.is_done
            assert image.join_position <= image.subscriber_position <= image.hwm
            assert image.rebuild_position <= image.hwm
            if self.sub_closed:
                assert image.is_closing or image.is_done
            counts = tuple(getattr(image, name) for name in IMAGE_COUNTERS)
            previous = self.image_counts.get(id(image), counts)
            assert all(a <= b for a, b in zip(previous, counts, strict=True)), "counter fell"
            self.image_counts[id(image)] = counts

    def shut_down(self, dead_link: bool) -> None:
        """Close both ends; over a bounded time everything must reach CLOSED."""
        self.act(("close_publication", 0))
        self.act(("close_subscription", 0))
        drop = (1 << 32) - 1 if dead_link else 0
        for _ in range(300):  # 30 s of 100 ms steps: linger + connection/liveness timeouts
            if self.pub.is_done and all(image.is_done for image in self.images):
                break
            self.act(("step", drop))
            self.act(("poll", 0))
            self.act(("advance", 100 * MS))
        assert self.pub.phase is PublicationPhase.CLOSED
        assert all(image.phase is ImagePhase.CLOSED for image in self.images)
        assert not self.interest.images and len(self.gone) == len(self.images)


OFFER = st.tuples(st.just("offer"), st.integers(0, 10_000))
STEP = st.tuples(st.just("step"), st.sampled_from([0, 0, 0, 1, 0b1010, 1 << 16, (1 << 32) - 1]))
ACTIONS = st.one_of(
    OFFER,
    OFFER,
    STEP,
    STEP,
    st.tuples(
        st.just("advance"),
        st.sampled_from([1_000, MS, 50 * MS, 100 * MS, 250 * MS, 5_100 * MS, 10_100 * MS]),
    ),
    st.tuples(st.just("poll"), st.just(0)),
    st.tuples(st.just("close_publication"), st.just(0)),
    st.tuples(st.just("close_subscription"), st.just(0)),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(ACTIONS, max_size=60))
def test_random_event_sequences_keep_the_lifecycles_in_their_tables(
    actions: list[tuple[str, int]],
) -> None:
    for dead_link in (False, True):  # the same run, then shut down over a perfect or dead link
        world = World()
        for action in actions:
            world.act(action)
        world.shut_down(dead_link)


def test_data_sent_after_the_receivers_timed_out_keeps_the_limit_at_the_sender() -> None:
    """Found by the random test above: a message offered while connected, the receivers timing
    out (no SM for 5.1 s) and the sender then sending that message left ``publisher_limit``
    behind ``sender_position`` (0 < 64): while nobody is connected the limit is the sender's
    position, whatever the sender sent after the limit dropped."""
    world = World()
    for action in (("step", 0), ("offer", 0), ("advance", 5_100 * MS), ("step", 1 << 16)):
        world.act(action)  # check() after each: publisher_limit >= sender_position
    assert not world.pub.is_connected
    assert world.pub.publisher_limit == world.pub.sender_position == 64
    world.shut_down(dead_link=False)


def test_a_connected_run_goes_through_every_phase_in_order() -> None:
    world = World()
    seen_pub = [world.pub.phase]
    seen_image: list[ImagePhase] = []

    def note() -> None:
        if world.pub.phase is not seen_pub[-1]:
            seen_pub.append(world.pub.phase)
        if world.images and not seen_image:
            seen_image.append(world.born[0])
        if world.images and world.images[0].phase is not seen_image[-1]:
            seen_image.append(world.images[0].phase)

    for _ in range(3):
        world.act(("step", 0))
        note()
    world.act(("offer", 100))
    world.act(("close_publication", 0))
    note()
    for _ in range(40):
        world.act(("step", 0))
        world.act(("poll", 0))
        world.act(("advance", 50 * MS))
        note()
    assert seen_pub == list(PublicationPhase)
    assert seen_image == list(ImagePhase)
    assert world.received == [bytes([100]) * 101]
