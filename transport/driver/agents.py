"""The driver's agents and the loop that runs them (Aeron's Sender, Receiver and runner; the
conductor agent is :class:`~aeron_spark.transport.driver.conductor.DriverConductor`).

Each agent has ``do_work(now_ns) -> work_count``, ``next_deadline_ns(now_ns)`` (when it next has
something to do without new input), ``has_work()`` (checked just before sleeping) and
``filenos()`` (sockets whose readability wakes it). :class:`AgentRunner` runs one or more agents
on one thread: it steps them while they do work and otherwise sleeps in ``select`` until a socket
is readable, the earliest deadline passes, or a client wakes it (a byte on a socket pair). It never
spins.

Agents are only ever stepped by one thread at a time. Clients change what they iterate by
replacing tuples (copy on write), so the agents need no locks.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from operator import call as _call
from typing import Any, Protocol

from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.endpoint import UdpEndpoint
from aeron_spark.transport.protocol.frames import (
    SM,
    SM_GROUP_TAG,
    SM_LENGTH,
    SM_WITH_GROUP_TAG_LENGTH,
    FrameType,
    NakFrame,
    RttMeasurement,
    SmFlags,
    StatusMessage,
    frame_type_of,
)
from aeron_spark.transport.protocol.publication import PublicationPhase, PublicationState
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher
from aeron_spark.transport.protocol.schedule import DueQueue

UNCLAIMED_ELICITS_MAX = 64  # SETUP requests for publications not (yet) there, per socket
RECEIVES_PER_STEP = 64
# the longest a driver thread sleeps when no agent has a deadline nearer (a safety net: every
# agent reports its deadlines and every client change wakes it)
IDLE_MAX_S = 1.0
_TYPE_SM = int(FrameType.SM)
_TYPE_NAK = int(FrameType.NAK)
_TYPE_RTTM = int(FrameType.RTTM)
_TYPE_ERR = int(FrameType.ERR)
_SEND_SETUP = int(SmFlags.SEND_SETUP)  # an int: an IntFlag operation builds an enum member
_unpack_sm = SM.unpack_from
_PUBLICATION_CLOSED = PublicationPhase.CLOSED
_unpack_group_tag = SM_GROUP_TAG.unpack_from


class _SocketIndex:
    """Which endpoint each socket of an agent's endpoints belongs to, so a step reads the
    sockets its runner's poll found readable without walking every socket (a server's
    endpoint holds a dedicated socket per client process: walking its thousands on every
    step, each wake-up for one datagram, was most of an idle server's time; issue 31).
    Rebuilt when the agent's endpoints or ``sockets_version`` change. ``always``: the sockets
    a step may read though not polled readable (a loss hook that may hold datagrams back, or
    UDP GRO with datagrams of a coalesced receive left). An agent stepped by hand (nobody
    polled: ``readable`` None) reads every socket."""

    __slots__ = ("token", "by_sock", "always")

    def __init__(self) -> None:
        self.token: tuple[Any, int] | None = None
        self.by_sock: dict[Any, tuple[Any, UdpEndpoint]] = {}
        self.always: tuple[tuple[Any, UdpEndpoint], ...] = ()

    def readable(self, agent: Any, readable: set[Any]) -> dict[Any, list[UdpEndpoint]]:
        """The sockets a step reads, by endpoint (each endpoint's in its ``sockets`` order
        is not kept: each is read up to its own share of the step either way)."""
        token = (agent.endpoints, agent.sockets_version)
        if self.token is None or self.token[0] is not token[0] or self.token[1] != token[1]:
            self.token = token
            self.by_sock = {udp.sock: (ep, udp) for ep in agent.endpoints for udp in ep.sockets}
            self.always = tuple(
                (ep, udp)
                for ep in agent.endpoints
                for udp in ep.sockets
                if udp.loss is not None or udp.gro
            )
        out: dict[Any, list[UdpEndpoint]] = {}
        by_sock = self.by_sock
        for sock in readable:
            hit = by_sock.get(sock)
            if hit is not None:
                got = out.get(hit[0])
                if got is None:
                    out[hit[0]] = [hit[1]]
                else:
                    got.append(hit[1])
        for ep, udp in self.always:
            if udp.sock not in readable and (udp.loss is not None or udp.gro_segment != 0):
                got = out.get(ep)
                if got is None:
                    out[ep] = [udp]
                else:
                    got.append(udp)
        return out


class Agent(Protocol):
    def do_work(self, now_ns: int) -> int: ...
    def next_deadline_ns(self, now_ns: int) -> int: ...
    def has_work(self) -> bool: ...
    def filenos(self) -> list[Any]: ...


class Dedicated:
    """A peer address's connected socket on an endpoint's address (see
    :class:`ReceiveEndpoint`): how many asked for it, and since when nobody has (ns, or None);
    the budget it was taken from, under its tags (given back when it closes)."""

    __slots__ = ("udp", "users", "idle_since_ns", "budget", "tags")

    def __init__(
        self,
        udp: UdpEndpoint,
        budget: DedicatedBudget | None = None,
        tags: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        self.udp = udp
        self.users = 1
        self.idle_since_ns: int | None = None
        self.budget = budget
        self.tags = tags


class DedicatedBudget:
    """Dedicated sockets several endpoints share (a handshake server's two ports): at most
    ``limit`` open in all (descriptors: one budget for both ports, lingering ones included), and
    at most ``shares[kind]`` under any one tag of that kind (tags such as ``("address", ip)``,
    ``("key", client_key)``), so one client cannot take the whole budget. Thread-safe (each
    conductor calls it under its own lock). ``refused``: takes refused, by reason (``"limit"``
    or the share's kind)."""

    def __init__(self, limit: int, shares: dict[str, int] | None = None) -> None:
        self.limit = limit
        self.shares = dict(shares or {})
        self.held = 0
        self._by_tag: dict[tuple[str, Any], int] = {}
        self._lock = threading.Lock()
        self.refused: dict[str, int] = {}

    def held_by(self, tag: tuple[str, Any]) -> int:
        return self._by_tag.get(tag, 0)

    def why_not(self, tags: tuple[tuple[str, Any], ...]) -> str | None:
        """Why one more socket under ``tags`` would not fit now (None: it fits)."""
        with self._lock:
            return self._why_not(tags)

    def _why_not(self, tags: tuple[tuple[str, Any], ...]) -> str | None:
        if self.held >= self.limit:
            return "limit"
        for tag in tags:
            share = self.shares.get(tag[0])
            if share is not None and self._by_tag.get(tag, 0) >= share:
                return tag[0]
        return None

    def take(self, tags: tuple[tuple[str, Any], ...]) -> str | None:
        """Take one socket under ``tags``; None, or why not (counted in ``refused``)."""
        with self._lock:
            why = self._why_not(tags)
            if why is not None:
                self.refused[why] = self.refused.get(why, 0) + 1
                return why
            self.held += 1
            for tag in tags:
                self._by_tag[tag] = self._by_tag.get(tag, 0) + 1
            return None

    def give_back(self, tags: tuple[tuple[str, Any], ...]) -> None:
        with self._lock:
            self.held -= 1
            for tag in tags:
                left = self._by_tag.get(tag, 0) - 1
                if left > 0:
                    self._by_tag[tag] = left
                else:
                    self._by_tag.pop(tag, None)


class SendEndpoint:
    """A publication-side socket and the publications sending through it (every publication
    whose channel has the same canonical form: see ``DriverConductor.add_network_publication``).
    ``config`` is the channel of the publication that opened it (the socket's options).
    ``sockets``: as a :class:`ReceiveEndpoint`'s (the control frames of a dedicated receiver,
    its SMs and NAKs, arrive on a socket connected to it; data still leaves by ``endpoint``)."""

    def __init__(self, key: Any, endpoint: UdpEndpoint, config: Any = None) -> None:
        self.key = key
        self.endpoint = endpoint
        self.config = config
        self.dedicated: dict[Any, Dedicated] = {}
        self.sockets: tuple[UdpEndpoint, ...] = (endpoint,)
        # its publications, oldest first; ``publications`` is a tuple made from them when read
        # after a change (a tuple rewritten per removal made closing N sessions O(N^2)): the
        # version the cached tuple was made at, bumped by every change
        self._publications: dict[int, PublicationState] = {}
        self._version = 0
        self._made: tuple[int, tuple[PublicationState, ...]] = (0, ())
        self.by_session: dict[tuple[int, int], PublicationState] = {}
        # what a SETUP request naming session 0 looks at (it walked every publication): one
        # naming a stream, that stream's publications; one naming stream 0, those that take
        # any session's SMs (not ``session_sm_only``)
        self._by_stream: dict[int, dict[int, PublicationState]] = {}
        self._any_session: dict[int, PublicationState] = {}
        # SETUP requests naming a (session id, stream id) no publication here has yet:
        # (session, stream) -> (source, when), the last UNCLAIMED_ELICITS_MAX. A publication
        # added with those ids within REFUSED_ELICIT_NS answers them as if they came then (a
        # handshake server opens a client's reply publication when its HELLO image appears,
        # just after the client asked for it), within its own destination rules.
        self.unclaimed_elicits: dict[tuple[int, int], tuple[Any, int]] = {}
        # The publications to step: kicked (input, offers, close) or at their next deadline;
        # an idle one is not looked at until its heartbeat or SETUP is due.
        self.due: DueQueue[PublicationState] = DueQueue()

    def add(self, publication: PublicationState) -> None:
        key = (publication.session_id, publication.stream_id)
        self.by_session[key] = publication
        asked = self.unclaimed_elicits.pop(key, None)
        if asked is not None and publication.allowed_hosts is not None:
            # answered by the sender like a SETUP request refused until its host was allowed
            publication.hold_unclaimed_elicit(asked[0], key[0], asked[1])
        self._publications[id(publication)] = publication
        self._by_stream.setdefault(publication.stream_id, {})[id(publication)] = publication
        if not publication.session_sm_only:
            self._any_session[id(publication)] = publication
        self._version += 1
        publication.kicked = False
        publication.wakeups = self.due.ready
        publication.kick()  # its first SETUP goes now

    def remove(self, publication: PublicationState) -> None:
        self.by_session.pop((publication.session_id, publication.stream_id), None)
        if self._publications.pop(id(publication), None) is not None:
            self._version += 1
        same = self._by_stream.get(publication.stream_id)
        if same is not None:
            same.pop(id(publication), None)
            if not same:
                del self._by_stream[publication.stream_id]
        self._any_session.pop(id(publication), None)
        publication.wakeups = None
        self.due.forget(publication)

    @property
    def publications(self) -> tuple[PublicationState, ...]:
        """Its publications, oldest first (a tuple: safe to walk from any thread)."""
        version, made = self._made
        if version != self._version:
            # the version first: a change while the tuple is made leaves it stale, made again
            # on the next read (tuple() of a dict view runs without releasing the GIL)
            version = self._version
            made = tuple(self._publications.values())
            self._made = (version, made)
        return made

    def has_publications(self) -> bool:
        return bool(self._publications)

    def step(
        self,
        now_ns: int,
        on_done: Callable[[SendEndpoint, PublicationState], None],
    ) -> int:
        """Step the publications that are due: kicked, or at their deadline."""
        due = self.due
        ready = due.ready
        endpoint = self.endpoint
        send = endpoint.queue  # the agent's step flushes it (SenderAgent.do_work)
        send_segments = endpoint.send_segments if endpoint.gso else None
        work = 0
        for pub in due.take(now_ns):
            if pub.wakeups is not ready:
                continue  # removed meanwhile
            pub.kicked = False  # before send(): a kick from now on queues it again
            work += pub.send(now_ns, send, send_segments)
            if pub.phase is _PUBLICATION_CLOSED:  # is_done
                due.forget(pub)
                on_done(self, pub)
            elif (
                pub.pending
                or (pub.sender_position < pub.appender.position and pub.has_data_to_send())
                or (pub.dests.refused_elicits and pub.has_refused_changed())
            ):
                # more than one step's worth: on the next step (each call's own first check
                # before it: an idle stream's step makes none of them)
                ready.append(pub)
            else:
                due.schedule(pub, pub.next_deadline_ns)
        return work

    def on_control(
        self, buf: Any, length: int, source: Any, now_ns: int, _transmit: Any = None
    ) -> None:
        """An SM, NAK, RTTM or ERR for one of our publications; raises RemoteProtocolError.
        (``_transmit``: unused, the receiver's handler's shape: ``UdpEndpoint.drain``.)"""
        if length < 8 or buf[4] != 0:
            frame_type_of(buf[:length])  # raises: short, or another protocol version
        ftype = buf[6] | (buf[7] << 8)  # as frame_type_of, without a slice and a call a frame
        pub: PublicationState | None
        if ftype == _TYPE_SM:
            # StatusMessage.decode's fields and checks, read in place (no slice, no frame
            # object: an idle stream's SMs are most of a sender's datagrams; issue 31)
            if length >= SM_LENGTH:
                (
                    frame_length,
                    _v,
                    flags,
                    _t,
                    session_id,
                    stream_id,
                    term_id,
                    term_offset,
                    window,
                    receiver_id,
                ) = _unpack_sm(buf, 0)
                if frame_length == SM_LENGTH:
                    group_tag = None
                elif frame_length == SM_WITH_GROUP_TAG_LENGTH and length >= frame_length:
                    group_tag = _unpack_group_tag(buf, SM_LENGTH)[0]
                else:
                    frame_length = 0
            else:
                frame_length = 0
            if frame_length == 0 or (session_id == 0 and flags & _SEND_SETUP):
                # the decoder's refusal (it raises), or a receiver announcing itself
                self._on_announce(StatusMessage.decode(buf[:length]), source, now_ns)
                return
            pub = self.by_session.get((session_id, stream_id))
            if pub is not None:
                # stepped only if the SM gave it something to do now (most repeat a position:
                # its deadline stays as it was)
                if pub.on_sm(
                    flags,
                    session_id,
                    term_id,
                    term_offset,
                    window,
                    receiver_id,
                    group_tag,
                    source,
                    now_ns,
                ):
                    pub.kick()
            elif flags & _SEND_SETUP:
                unclaimed = self.unclaimed_elicits
                key = (session_id, stream_id)
                unclaimed.pop(key, None)
                if len(unclaimed) >= UNCLAIMED_ELICITS_MAX:
                    del unclaimed[next(iter(unclaimed))]
                unclaimed[key] = (source, now_ns)
        elif ftype == _TYPE_NAK:
            nak = NakFrame.decode(buf[:length])
            pub = self.by_session.get((nak.session_id, nak.stream_id))
            if pub is not None and pub.on_nak(nak, now_ns, source):
                self.due.ready.append(pub)
        elif ftype == _TYPE_RTTM:
            rttm = RttMeasurement.decode(buf[:length])
            pub = self.by_session.get((rttm.session_id, rttm.stream_id))
            if pub is not None:
                pub.on_rttm(rttm, source)
                self.due.ready.append(pub)
        elif ftype == _TYPE_ERR:
            self.endpoint.counters.errors += 1
        # DATA/SETUP arriving at a publication's socket are not for us: ignored.

    def _on_announce(self, sm: StatusMessage, source: Any, now_ns: int) -> None:
        """A receiver announcing itself (MDC dynamic: a SETUP request naming session id 0).
        The real driver sends stream id 0 too ("pending setup"): that one is for every
        publication on the endpoint. A publication that takes only SMs of its own session (a
        secure session's) ignores and counts these: a stranger learns nothing of it from
        SETUPs. Only the publications it may be for are looked at (tuples: C copies, safe
        while the conductor adds and removes): a stream's, or for stream 0 those taking any
        session's SMs, the secure ones' refusal counted once."""
        if sm.stream_id:
            same = self._by_stream.get(sm.stream_id)
            pubs = tuple(same.values()) if same else ()
        else:
            pubs = tuple(self._any_session.values())
            if len(pubs) < len(self._publications):
                self.endpoint.counters.status_messages_refused += 1
        for pub in pubs:
            if pub.session_sm_only and source not in pub.destinations:
                pub.status_messages_refused += 1
                continue
            if pub.on_status_message(sm, source, now_ns):
                pub.kick()


class ReceiveEndpoint:
    """A subscription-side socket and the dispatcher of its datagrams. ``config`` is the
    channel of the subscription that opened it (the socket's options).

    ``sockets`` is what the receiver reads into the one dispatcher: the connected sockets
    dedicated to single senders (``dedicated``, by sender address; a channel with
    ``dedicated-sources=N`` binds its socket with ``SO_REUSEPORT`` and the conductor adds them,
    :meth:`DriverConductor.dedicate_source`) first, each up to its own share of a step, then
    the shared socket. The kernel hands a connected socket every datagram of its 4-tuple, so a
    flood of the shared socket (a public port) does not overflow a dedicated sender's buffer,
    nor take its turn in a step. Every reply (SMs, NAKs) still goes out of the shared socket:
    the same source address and port as before, so a sender sees no difference."""

    def __init__(self, key: Any, endpoint: UdpEndpoint, config: Any = None) -> None:
        self.key = key
        self.endpoint = endpoint
        self.config = config
        self.dispatcher = ReceiveDispatcher()
        self.dedicated: dict[Any, Dedicated] = {}
        self.sockets: tuple[UdpEndpoint, ...] = (endpoint,)
        # Every subscription of it closed (its images only send their EOS SMs, spaced out):
        # until quiet_until, while its socket has nothing and no interest was added (the
        # interests' tuples are still quiet_token), a step has nothing to do on it. A client
        # connecting fast has a dozen such endpoints; each cost every step a dispatcher pass.
        self.quiet_token: tuple[Any, ...] | None = None
        self.quiet_until = 0

    def is_quiet(self, now_ns: int) -> bool:
        token = self.quiet_token
        if token is None or now_ns >= self.quiet_until:
            return False
        interests = self.dispatcher.interests
        if len(interests) != len(token):
            return False
        for current, seen in zip(interests.values(), token, strict=True):
            if current is not seen:
                return False
        return True

    def note_quiet(self, now_ns: int) -> None:
        """After a dispatcher pass: whether it is quiet now, and until when."""
        interests = self.dispatcher.interests
        for group in interests.values():
            for interest in group:
                if not interest.closed:
                    self.quiet_token = None
                    return
        self.quiet_token = tuple(interests.values())
        self.quiet_until = self.dispatcher.next_deadline_ns(now_ns)


class SenderAgent:
    """Reads control frames on publication sockets and sends data, SETUP, heartbeats."""

    def __init__(
        self,
        counters: SystemCounters,
        on_publication_done: Callable[[SendEndpoint, PublicationState], None],
    ) -> None:
        self.counters = counters
        self.endpoints: tuple[SendEndpoint, ...] = ()
        self.sockets_version = 0  # bumped when an endpoint's ``sockets`` change
        self.on_publication_done = on_publication_done
        self.readable: set[Any] | None = None  # set by the runner each step (_SocketIndex)
        self._index = _SocketIndex()  # the sockets a step reads, from what is readable

    def do_work(self, now_ns: int) -> int:
        """One step; the frames it queued on its endpoints go out before it returns (one
        method, not a step inside a try: a Python call a wake-up less; issue 31)."""
        try:
            work = 0
            readable = self.readable
            reading = None if readable is None else self._index.readable(self, readable)
            for ep in self.endpoints:
                for udp in ep.sockets if reading is None else reading.get(ep, ()):
                    # on_control each datagram (an invalid one counted: UdpEndpoint.drain)
                    work += udp.drain(ep.on_control, now_ns, None, RECEIVES_PER_STEP)
                work += ep.step(now_ns, self.on_publication_done)
            return work
        finally:
            for ep in self.endpoints:
                if ep.endpoint.runs:  # queued frames: flush() only then (a call an endpoint)
                    ep.endpoint.flush()

    def has_work(self) -> bool:
        """A publication was kicked (or had more than a step's worth), or datagrams of a
        coalesced receive are left: step again."""
        for ep in self.endpoints:
            if ep.due.ready or ep.endpoint.gro_segment:
                return True
        return False

    def next_deadline_ns(self, now_ns: int) -> int:
        deadline = now_ns + 1_000_000_000
        for ep in self.endpoints:
            deadline = ep.due.next_ns(deadline)
        return deadline

    def filenos(self) -> list[Any]:
        return [udp.sock for ep in self.endpoints for udp in ep.sockets]


class ReceiverAgent:
    """Reads data/SETUP on subscription sockets; sends SMs and NAKs for the images.

    ``on_endpoint_idle()`` (if given) is called in the step that sees a socket none of whose
    subscriptions is left (all closed, their images gone): the driver closes it then, not on
    its next housekeeping tick. Every step reads every socket, so each socket left open after
    its last subscription closed costs every step (a client connecting fast would otherwise
    carry a second's worth of dead sockets in each of its steps)."""

    def __init__(
        self, counters: SystemCounters, on_endpoint_idle: Callable[[], object] | None = None
    ) -> None:
        self.counters = counters
        self.endpoints: tuple[ReceiveEndpoint, ...] = ()
        # bumped when an endpoint's ``sockets`` change (the runner registers them again)
        self.sockets_version = 0
        self.on_endpoint_idle = on_endpoint_idle
        self.readable: set[Any] | None = None  # set by the runner each step (_SocketIndex)
        self._index = _SocketIndex()  # the sockets a step reads, from what is readable

    def do_work(self, now_ns: int) -> int:
        """One step; the SMs and NAKs it queued go out before it returns (one method, as
        the sender's)."""
        try:
            work = 0
            idle = False
            readable = self.readable
            reading = None if readable is None else self._index.readable(self, readable)
            for ep in self.endpoints:
                endpoint = ep.endpoint
                sockets = ep.sockets if reading is None else reading.get(ep, ())
                if not sockets and ep.quiet_token is not None and ep.is_quiet(now_ns):
                    continue
                dispatcher = ep.dispatcher
                send = endpoint.queue  # flushed below
                on_datagram = dispatcher.on_datagram
                for udp in sockets:
                    # on_datagram each datagram (an invalid one counted: UdpEndpoint.drain)
                    work += udp.drain(on_datagram, now_ns, send, RECEIVES_PER_STEP)
                work += dispatcher.do_work(now_ns, send)
                if not dispatcher.interests:
                    idle = True
                else:
                    ep.note_quiet(now_ns)
            if idle and self.on_endpoint_idle is not None:
                self.on_endpoint_idle()
            return work
        finally:
            for ep in self.endpoints:
                if ep.endpoint.runs:  # queued frames: flush() only then (a call an endpoint)
                    ep.endpoint.flush()

    def has_work(self) -> bool:
        """Datagrams of a coalesced receive (UDP GRO) are left: step again."""
        for ep in self.endpoints:
            if ep.endpoint.gro_segment:
                return True
        return False

    def next_deadline_ns(self, now_ns: int) -> int:
        deadline = now_ns + 1_000_000_000
        for ep in self.endpoints:
            if ep.quiet_token is not None and ep.is_quiet(now_ns):
                d = ep.quiet_until
            else:
                d = ep.dispatcher.next_deadline_ns(now_ns)
            if d < deadline:
                deadline = d
        return deadline

    def filenos(self) -> list[Any]:
        return [udp.sock for ep in self.endpoints for udp in ep.sockets]


class AgentRunner:
    """Runs agents on one thread (or steps them by hand), sleeping in select when idle."""

    def __init__(
        self, name: str, agents: Sequence[Agent], on_error: Callable[[BaseException], None]
    ) -> None:
        self.name = name
        self.agents = tuple(agents)
        self.on_error = on_error
        self.sleeping = False
        self._woken = False  # a wake-up byte was sent since the runner last went to sleep
        self.wakeups_sent = 0  # wake-up bytes sent (one per sleep at most)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._registered: dict[int, Any] = {}
        self._token: tuple[Any, ...] | None = None
        # what says an agent's sockets changed: its endpoints (a tuple replaced on change, copy
        # on write) and its sockets_version, read with one C-level getter per agent (the check
        # runs twice a wake-up: a Python call per agent and attribute was a tenth of an empty
        # step; issue 31)
        token_getters = tuple(
            (agent, attrgetter(*names))
            for agent in self.agents
            for names in [tuple(n for n in ("endpoints", "sockets_version") if hasattr(agent, n))]
            if names
        )
        self._token_of = tuple(agent for agent, _ in token_getters)
        self._token_get = tuple(get for _, get in token_getters)
        self._reading_agents = tuple(a for a in self.agents if hasattr(a, "readable"))
        # the sockets idle()'s select found readable: the step right after it reads those
        # without polling again (one epoll_wait a step, not two)
        self._ready: set[Any] | None = None
        # whether the last step's work came from an agent that reports no more through
        # sockets, has_work() and deadlines (the conductor's IPC resources): step again at once
        self.restep = True
        self._running = False
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Make a sleeping runner look at its agents now (callable from any thread). One byte
        per sleep: once one is on its way, the wake-ups until the runner sleeps again send
        nothing (a server's loop offering replies to many sessions in one pass woke it with a
        ``send`` each; issue 31)."""
        if self.sleeping and not self._woken:
            self._woken = True
            try:
                self._wake_w.send(b"\x01")
            except OSError:
                pass  # a full socket pair: the runner has bytes to wake it already
            else:
                self.wakeups_sent += 1

    def has_work(self) -> bool:
        """An agent has work now (its ``has_work()``): :meth:`idle` would not sleep."""
        for agent in self.agents:
            if agent.has_work():
                return True
        return False

    def do_work(self, now_ns: int | None = None, poll: bool = True) -> int:
        """Step every agent once. Without ``poll`` (an invoker sending what it just offered)
        no socket is read unless the last ``idle()`` found it readable: what arrived since
        is read on the next step (its ``select`` then ends at once)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        if not poll and self._ready is None:
            self._ready = set()
        self._poll_readable()
        work = 0
        restep = False
        reading = self._reading_agents
        for agent in self.agents:
            try:
                done = agent.do_work(now)
            except Exception as exc:  # noqa: BLE001 - a bug in an agent must not kill the driver
                self.on_error(exc)
                continue
            if done:
                work += done
                if agent not in reading:
                    restep = True
        self.restep = restep
        return work

    def idle(self, timeout_s: float | None = None, ready: Callable[[], bool] | None = None) -> bool:
        """Sleep until a socket is readable, the next deadline, a wake-up, or ``timeout_s``.

        ``sleeping`` is set before the deadlines are asked: a client that changes an agent's
        state and then wakes it either did so before (the deadline sees the change) or finds
        it sleeping (its wake-up byte ends the select), never neither. ``ready`` (an invoker's
        own condition, asked after ``sleeping`` is set, so under the same rule): True returns
        at once (and returns True); whoever makes it true then calls :meth:`wake`."""
        self._sync_registrations()
        # before sleeping is set: a wake-up from now on sends its byte (the last one was read,
        # or is still there and ends this select at once)
        self._woken = False
        self.sleeping = True
        try:
            if ready is not None and ready():
                return True
            agents = self.agents
            for agent in agents:
                if agent.has_work():
                    return False
            now = time.monotonic_ns()
            deadline = None
            for agent in agents:
                at = agent.next_deadline_ns(now)
                if deadline is None or at < deadline:
                    deadline = at
            if deadline is None or deadline <= now:
                return False
            wait_s = (deadline - now) / 1e9
            if timeout_s is not None:
                if timeout_s <= 0:
                    return False
                wait_s = min(wait_s, timeout_s)
            events = self._selector.select(wait_s)
            self._ready = {key.fileobj for key, _ in events}
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    # one byte a sleep (wake()): one read takes them, without the failing
                    # second read a loop would end on; any left end the next select at once
                    try:
                        self._wake_r.recv(4096)
                    except (BlockingIOError, InterruptedError):
                        pass
        finally:
            self.sleeping = False
        return False

    def _poll_readable(self) -> None:
        """Tell the agents which sockets have datagrams now (one ``epoll_wait`` with no
        timeout): a step reads those, not every socket (a client connecting fast has a dozen,
        most of them closing subscriptions' that only send their EOS status messages)."""
        agents = self._reading_agents
        if not agents:
            return
        ready = self._ready
        self._ready = None
        if not self._sync_registrations() or ready is None:
            # no select just before (or the sockets changed since): poll now
            try:
                events = self._selector.select(0)
            except (OSError, ValueError):
                ready = None  # closed under us: read every socket this step, as before
            else:
                ready = {key.fileobj for key, _ in events}
        for agent in agents:
            agent.readable = ready

    def _sync_registrations(self) -> bool:
        """Register the agents' sockets with the selector; False if they changed."""
        # each agent's getter called on it in C (a method and a list comprehension were two
        # Python calls, twice a wake-up; issue 31)
        token = tuple(map(_call, self._token_get, self._token_of))
        if token == self._token:  # the endpoints tuples compare by identity first
            return True
        self._token = token
        wanted: dict[int, Any] = {}
        for agent in self.agents:
            for sock in agent.filenos():
                wanted[id(sock)] = sock
        if wanted.keys() == self._registered.keys():
            return False
        for key in self._registered.keys() - wanted.keys():
            try:
                self._selector.unregister(self._registered[key])
            except (KeyError, ValueError, OSError):
                pass
        registered = {k: v for k, v in self._registered.items() if k in wanted}
        for key in wanted.keys() - self._registered.keys():
            try:
                self._selector.register(wanted[key], selectors.EVENT_READ)
            except (KeyError, ValueError, OSError):
                continue
            registered[key] = wanted[key]
        self._registered = registered
        return False

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._running:
            try:
                # The sender and receiver say what is left through has_work(), deadlines and
                # readable sockets, which idle() checks before it sleeps: after their work go
                # there, not through one more step that finds nothing (half the steps).
                # no cap on the sleep: every agent says when it next has something to do
                # (an idle driver used to wake ten times a second whatever it held)
                if self.do_work() == 0 or not self.restep:
                    self.idle(IDLE_MAX_S)
            except Exception as exc:  # noqa: BLE001 - a bug in a deadline must not kill the driver
                self.on_error(exc)
                self.sleeping = False
                time.sleep(0.001)  # only after an error: never a spin on a repeating one

    def stop(self, timeout_s: float = 5.0) -> None:
        self._running = False
        self.sleeping = True
        self._woken = False
        self.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._thread = None

    def close(self) -> None:
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
