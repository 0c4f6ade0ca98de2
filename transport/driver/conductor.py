"""The driver's conductor: what a media driver knows, driven by ``now_ns`` (Aeron's conductor).

It owns the bookkeeping of one driver and nothing that blocks or reads a clock:

* the publications (their :class:`PublicationState` and the client object handed out), the
  subscriptions (network and spy), the send and receive endpoints they share, by key, and what
  the sender and receiver agents iterate (copy-on-write tuples, so the agents need no lock);
* session-id allocation, spies attached to local publications, the counts of what is gone
  (``retired``), stream positions and totals for the counters;
* its timers, as an agent (``do_work(now_ns)``): IPC resources are stepped when they are due
  (each at its own deadline, or kicked: just added, or the IPC directory's watch was readable;
  never walked in a step that has nothing for them), and every
  ``counters_interval_ns`` endpoints nobody uses any more and closed IPC resources are reaped
  and ``on_tick(now_ns)`` runs (the front writes the counters file there).

The front (:class:`~aeron_spark.transport.driver.driver.Driver`) parses channels, reads the
clock, opens sockets (``open_endpoint``) and IPC files, runs the agents on threads, and calls in
here with ``now_ns``. Client threads and agent threads both call the conductor: its methods take
``lock``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import (
    Dedicated,
    DedicatedBudget,
    ReceiveEndpoint,
    ReceiverAgent,
    SendEndpoint,
    SenderAgent,
)
from aeron_spark.transport.driver.endpoint import (
    UdpEndpoint,
    bind_endpoint_for,
    receiver_window_for,
)
from aeron_spark.transport.errors import ChannelError, DriverError
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS
from aeron_spark.transport.protocol.image import IMAGE_LIVENESS_TIMEOUT_NS, ImageState
from aeron_spark.transport.protocol.ipc import DUTY_INTERVAL_NS
from aeron_spark.transport.protocol.logbuffer import is_reserved_session_id, wrap_int32
from aeron_spark.transport.protocol.publication import Destination, PublicationState
from aeron_spark.transport.protocol.receiver import StreamInterest, image_counts
from aeron_spark.transport.protocol.schedule import DueQueue
from aeron_spark.transport.protocol.tally import Tally, attach, detach
from aeron_spark.transport.uri import DEFAULT_SO_RCVBUF, ChannelConfig, Endpoint, parse_uri

# (bind, channel) -> socket; a dedicated sender's socket also gets connect_to=<its address>
OpenEndpoint = Callable[..., UdpEndpoint]
# A sender's dedicated socket stays open this long after its last user released it (then closed
# on the conductor's next tick): a client process that opens sessions one after the other keeps
# its socket instead of paying a socket, and losing what is queued on it, per session.
DEDICATED_LINGER_NS = 1_000_000_000
# How often the conductor steps an IPC resource that cannot say when it needs it: their own
# timers are coarser (a subscription scans for new log files every 20 ms, heartbeats every
# 100 ms) and an offer or a wait refreshes what it needs itself, so waking every millisecond
# bought nothing but a thousand wake-ups a second per idle driver with an IPC resource (a
# handshake server). Resources that can tell (``next_deadline_ns``) are stepped at their own
# deadlines: an idle IPC subscription with the directory watched has none (issue 31).
IPC_POLL_INTERVAL_NS = DUTY_INTERVAL_NS


def _ipc_deadline(resource: Any, now_ns: int) -> int | None:
    deadline = getattr(resource, "next_deadline_ns", None)
    if deadline is None:
        return now_ns + IPC_POLL_INTERVAL_NS
    return deadline(now_ns, IPC_POLL_INTERVAL_NS)


class ImageLimits:
    """The driver-wide limits on what a SETUP may ask of a UDP subscription (0: no limit)."""

    __slots__ = (
        "max_term_length",
        "max_mtu",
        "max_images",
        "per_source",
        "per_address",
        "liveness_timeout_ns",
    )

    def __init__(
        self,
        max_term_length: int,
        max_mtu: int,
        max_images: int = 0,
        per_source: int = 0,
        per_address: int = 0,
        liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_NS,
    ) -> None:
        self.max_term_length = max_term_length
        self.max_mtu = max_mtu
        self.max_images = max_images
        self.per_source = per_source
        self.per_address = per_address
        # an image of a UDP subscription that receives no packet this long is gone
        self.liveness_timeout_ns = liveness_timeout_ns


class DriverConductor:
    """Publications, subscriptions, endpoints and timers of one driver (no I/O of its own)."""

    def __init__(
        self,
        system_counters: SystemCounters,
        open_endpoint: OpenEndpoint,
        *,
        image_limits: ImageLimits,
        retransmit_linger_ns: int,
        counters_interval_ns: int = 1_000_000_000,
        on_tick: Callable[[int], None] | None = None,
        wake_sender: Callable[[], None] | None = None,
        wake_receiver: Callable[[], None] | None = None,
        wake_conductor: Callable[[], None] | None = None,
        session_id_seed: int | None = None,
        publication_connection_timeout_ns: int = CONNECTION_TIMEOUT_NS,
    ) -> None:
        self.system_counters = system_counters
        # a UDP publication's receiver silent this long is gone (its publication unconnected)
        self.publication_connection_timeout_ns = publication_connection_timeout_ns
        self.open_endpoint = open_endpoint
        self.image_limits = image_limits
        self.retransmit_linger_ns = retransmit_linger_ns
        self.interval_ns = counters_interval_ns
        self.deadline_ns = 0
        self.on_tick = on_tick
        self._wake_sender = wake_sender
        self._wake_receiver = wake_receiver
        self._wake_conductor = wake_conductor
        self.lock = threading.RLock()
        self.sender = SenderAgent(system_counters, self.on_publication_done)
        self.receiver = ReceiverAgent(system_counters, self.reap_receive_endpoints)
        self.send_endpoints: dict[Any, SendEndpoint] = {}
        self.receive_endpoints: dict[Any, ReceiveEndpoint] = {}
        # client Publication objects (network), by id of their state; Subscription objects
        # (network and spy) and spies, by id of the subscription: each close forgets its own
        # in O(1) (a list rewritten per close made closing N sessions O(N^2): issue 31)
        self._publications: dict[int, Any] = {}
        self._subscriptions: dict[int, Any] = {}
        self._spies: dict[int, tuple[Any, ChannelConfig]] = {}
        self.ipc: tuple[Any, ...] = ()  # IPC publications/subscriptions, stepped here
        # which of them to step: kicked (any thread appends to ``ready``) or at their deadline
        self.ipc_due: DueQueue[Any] = DueQueue()
        self.ipc_watch: Any = None  # the IPC directory's watch (ipc/watch.py), if any
        # the watch is read only in a step whose poll found it readable (the runner sets this
        # each step; None: stepped by hand, nobody polled: read it)
        self.readable: set[Any] | None = None
        self.sockets_version = 0  # bumped when filenos() changes (the runner registers them)
        self.retired: dict[str, int] = {}  # counts of publications and endpoints that are gone
        # the live publications' counts, kept as they count (tally.py): totals() walks no stream
        self.tally = Tally()
        seed = random.getrandbits(32) if session_id_seed is None else session_id_seed
        self._next_session_id = wrap_int32(seed)

    @property
    def publications(self) -> list[Any]:
        """The open network publications (client objects), oldest first."""
        return list(self._publications.values())

    @property
    def subscriptions(self) -> list[Any]:
        """The open network and spy subscriptions (client objects), oldest first."""
        return list(self._subscriptions.values())

    @property
    def spies(self) -> list[tuple[Any, ChannelConfig]]:
        return list(self._spies.values())

    # ------------------------------------------------------------------ agent

    def do_work(self, now_ns: int) -> int:
        """Read the watch if readable, step the IPC resources that are due, and the
        housekeeping tick when it is due. An idle step (a datagram woke the driver for the
        sender or the receiver) costs two comparisons here: a read of the watch and a
        ``do_work`` of every IPC resource in every step were a third of an empty step
        (issue 31)."""
        work = 0
        watch = self.ipc_watch
        due = self.ipc_due
        if watch is not None:
            readable = self.readable
            if readable is None or watch in readable:
                if watch.drain():
                    # a new log file (or the watch armed again): the subscriptions compare
                    # its generation with their last scan's
                    due.ready.extend(self.ipc)
        for resource in due.take(now_ns):
            work += resource.do_work(now_ns)
            at = _ipc_deadline(resource, now_ns)
            if at is not None:
                due.schedule(resource, at)
        if now_ns >= self.deadline_ns:
            self.deadline_ns = now_ns + self.interval_ns
            self.reap_receive_endpoints()
            self.reap_dedicated(now_ns)
            self.reap_ipc()
            if self.on_tick is not None:
                self.on_tick(now_ns)
        return work

    def has_work(self) -> bool:
        """An IPC resource was added since the last step (it is stepped at once)."""
        return bool(self.ipc_due.ready)

    def next_deadline_ns(self, now_ns: int) -> int:
        """The housekeeping tick or the earliest IPC resource's own deadline (a publication's
        heartbeat; a subscription's poll while it has images, none while the IPC directory's
        watch will wake the driver for a new log file), from the heap: no walk."""
        return self.ipc_due.next_ns(self.deadline_ns)

    def filenos(self) -> list[Any]:
        watch = self.ipc_watch
        return [watch] if watch is not None and not watch.closed else []

    def watch_ipc(self, watch: Any) -> None:
        """The driver's inotify watch of its IPC directory: readable when a log file comes."""
        with self.lock:
            self.ipc_watch = watch
            self.sockets_version += 1  # the runner registers it
        if self._wake_conductor is not None:
            self._wake_conductor()

    def wake_sender(self) -> None:
        if self._wake_sender is not None:
            self._wake_sender()

    def wake_receiver(self) -> None:
        if self._wake_receiver is not None:
            self._wake_receiver()

    # ------------------------------------------------------------------ publications

    def allocate_session_id(self) -> int:
        with self.lock:
            while True:
                sid = self._next_session_id
                self._next_session_id = wrap_int32(sid + 1)
                if not is_reserved_session_id(sid):
                    return sid

    def add_network_publication(
        self,
        config: ChannelConfig,
        stream_id: int,
        now_ns: int,
        make_publication: Callable[[PublicationState, SendEndpoint], Any],
        destination: Any = None,
    ) -> Any:
        """A UDP publication's state on its (maybe shared) send endpoint; the client object
        ``make_publication`` builds for it. ``destination`` is its unicast address (None for
        MDC); ``config.control`` set without manual mode makes it dynamic.

        Publications share a socket as Aeron's driver shares a ``SendChannelEndpoint``: MDC
        ones naming the same control address, unicast ones with the same
        :func:`unicast_send_key` (the SMs, NAKs and RTTMs arriving on it reach the one their
        session and stream ids name). One that names socket options other than the shared
        socket's is refused (:func:`check_shares_socket`); the socket closes with the last."""
        dynamic = config.control is not None and config.control_mode in ("", "dynamic")
        manual = config.control_mode == "manual"
        with self.lock:
            if config.session_id is not None:
                session_id = config.session_id
            else:
                session_id = self.allocate_session_id()
            if config.has_explicit_position:
                initial_term_id = config.initial_term_id
                term_id = config.term_id
                term_offset = config.term_offset
                assert (
                    initial_term_id is not None and term_id is not None and term_offset is not None
                )
            else:
                initial_term_id = random.getrandbits(32) - 2**31
                term_id, term_offset = initial_term_id, 0
            state = PublicationState(
                session_id=session_id,
                stream_id=stream_id,
                initial_term_id=initial_term_id,
                term_id=term_id,
                term_offset=term_offset,
                term_length=config.term_length,
                mtu=config.mtu,
                publication_window_length=config.publication_window_length,
                linger_ns=config.linger_ns,
                retransmit_linger_ns=self.retransmit_linger_ns,
                idle_heartbeat_interval_ns=config.idle_heartbeat_interval_ns,
                destination=destination,
                dynamic=dynamic,
                now_ns=now_ns,
                flow_control=config.flow_control,
                connection_timeout_ns=self.publication_connection_timeout_ns,
            )
            if config.destination_host is not None:
                host = config.destination_host
                state.allowed_hosts = frozenset() if host == "none" else frozenset({host})
                state.session_sm_only = config.session_id is not None
            state.max_destinations = config.max_destinations
            if dynamic or manual:
                bind = (
                    config.control
                    if config.control is not None
                    else bind_endpoint_for(config.endpoint or Endpoint("0.0.0.0", 0, 2))
                )
                key: Any = ("control", str(bind))
            else:
                assert config.endpoint is not None
                bind = bind_endpoint_for(config.endpoint)
                key = unicast_send_key(config)
            ep = self.send_endpoints.get(key)
            if ep is None:
                ep = SendEndpoint(key, self.open_endpoint(bind, config), config)
                self.send_endpoints[key] = ep
                self.sender.endpoints = (*self.sender.endpoints, ep)
            else:
                if (session_id, stream_id) in ep.by_session:
                    raise ChannelError(
                        "session-id", session_id, "a session id not already used on this channel"
                    )
                check_shares_socket(config, ep.config)
            attach(self.tally, state, state.dests, state.retransmit)  # before the sender sees it
            ep.add(state)
            pub = make_publication(state, ep)
            self._publications[id(state)] = pub
            self.system_counters.publications_created += 1
            for spy_sub, spy_config in list(self._spies.values()):
                if spy_sub.stream_id == stream_id and spy_matches(spy_config, config):
                    self.attach_spy(spy_sub, pub, now_ns)
        self.wake_sender()
        return pub

    def add_destination(self, state: PublicationState, address: Any, now_ns: int) -> None:
        """A manual MDC destination: SETUP goes to it on the next send."""
        state.destinations[address] = Destination(address, now_ns)
        state.setup_deadline_ns = 0
        state.kick()
        self.wake_sender()

    def close_publication(self, pub: Any, now_ns: int) -> None:
        """The client closed it: the sender drains, lingers and frees it (its lifecycle)."""
        if isinstance(pub.registration, SendEndpoint):
            pub.state.close(now_ns)
            self.wake_sender()
        elif pub.registration is not None:
            pub.registration.close()

    def on_publication_done(self, ep: SendEndpoint, state: PublicationState) -> None:
        """The sender found it CLOSED: forget it, end its spies' images, free a lone endpoint."""
        with self.lock:
            ep.remove(state)
            detach(state, state.dests, state.retransmit)
            self._retire(publication_counts(state))
            self._publications.pop(id(state), None)
            for spy in state.spies:
                spy.on_source_closed()
            for sub, _ in list(self._spies.values()):
                for log in sub.image_logs():
                    if log in state.spies:
                        sub.image_unavailable(log)
            if not ep.has_publications():
                self.send_endpoints.pop(ep.key, None)
                self.sender.endpoints = tuple(e for e in self.sender.endpoints if e is not ep)
                self._close_dedicated(ep, list(ep.dedicated))
                ep.endpoint.close()

    def _retire(self, counts: dict[str, int]) -> None:
        for name, value in counts.items():
            self.retired[name] = self.retired.get(name, 0) + value

    # ------------------------------------------------------------------ subscriptions

    def add_spy_subscription(self, sub: Any, config: ChannelConfig, now_ns: int) -> None:
        """``aeron-spy:``: an image on each matching local publication's log, now and later."""
        with self.lock:
            self._spies[id(sub)] = (sub, config)
            self._subscriptions[id(sub)] = sub
            for pub in list(self._publications.values()):
                pcfg = ChannelConfig.from_uri(pub.channel)
                if pub.stream_id == sub.stream_id and spy_matches(config, pcfg):
                    self.attach_spy(sub, pub, now_ns)

    def add_network_subscription(
        self,
        sub: Any,
        config: ChannelConfig,
        control: Any,
        admit_source: Callable[[str], bool] | None = None,
    ) -> None:
        """A UDP subscription: its interest on the (maybe shared) receive endpoint, making
        images only for the sender hosts ``admit_source`` admits (None: any).

        Subscriptions naming the same local address and control share the socket (a port-0
        one is registered under the port it was given, so naming that port shares it too);
        one naming a taken address with another control, or other socket options, is
        refused. The socket closes once its last interest's images are gone."""
        assert config.endpoint is not None
        limits = self.image_limits
        with self.lock:
            key: Any = receive_key(config.endpoint, config.control)
            rep = self.receive_endpoints.get(key) if config.endpoint.port != 0 else None
            if rep is None:
                if config.endpoint.port != 0:
                    self._check_port_not_shared(config)
                udp = self.open_endpoint(config.endpoint, config)
                if config.endpoint.port == 0:
                    # registered under the port it was given: a later subscription naming
                    # that port (and the same control) shares this socket
                    key = receive_key(replace(config.endpoint, port=udp.local_port), config.control)
                rep = ReceiveEndpoint(key, udp, config)
                self.receive_endpoints[key] = rep
                self.receiver.endpoints = (*self.receiver.endpoints, rep)
            else:
                check_shares_socket(config, rep.config)
            interest = StreamInterest(
                sub.stream_id,
                session_id=config.session_id,
                control_address=control,
                receiver_window=receiver_window_for(config.receiver_window_length, rep.endpoint),
                nak_delay_ns=config.nak_delay_ns,
                reliable=config.reliable,
                group_tag=config.group_tag,
                idle_sm_interval_ns=config.idle_sm_interval_ns,
                max_term_length=min(
                    limits.max_term_length, config.max_term_length or limits.max_term_length
                ),
                max_mtu=min(limits.max_mtu, config.max_mtu or limits.max_mtu),
                max_images=tighter(limits.max_images, config.max_images),
                max_images_per_source=tighter(limits.per_source, config.max_images_per_source),
                max_images_per_address=tighter(limits.per_address, config.max_images_per_address),
                setups_per_prefix_per_s=config.setups_per_prefix_per_s,
                admit_source=admit_source,
                evict_unvouched=config.evict_unvouched,
                liveness_timeout_ns=limits.liveness_timeout_ns,
                on_image=sub.image_available,
                on_image_gone=sub.image_unavailable,
                on_data=sub.data_arrived,
            )
            rep.dispatcher.add(interest)
            sub.registration = (rep, interest)
            local = rep.endpoint.local_address
            sub.local_endpoints = [(str(local[0]), int(local[1]))]
            self._subscriptions[id(sub)] = sub
            self.system_counters.subscriptions_created += 1
        self.wake_receiver()

    def _check_port_not_shared(self, config: ChannelConfig) -> None:
        """A subscription on a local address a receive endpoint already has, with another
        control: refused by name (its socket could not be bound anyway)."""
        where = str(config.endpoint)
        for other in self.receive_endpoints:
            if other[1] == where:
                raise ChannelError(
                    "control",
                    str(config.control) if config.control is not None else "(none)",
                    f"{other[2] if other[2] != 'None' else 'no control'} as the subscriptions "
                    f"already on {where} have, to share their socket",
                )

    def attach_spy(self, sub: Any, pub: Any, now_ns: int) -> None:
        state = pub.state
        position = state.sender_position
        image = ImageState(
            session_id=state.session_id,
            stream_id=state.stream_id,
            initial_term_id=state.initial_term_id,
            active_term_id=wrap_int32(state.initial_term_id + (position >> state.shift)),
            term_offset=position & (state.term_length - 1),
            term_length=state.term_length,
            mtu=state.mtu,
            source_address=("127.0.0.1", 0),
            log=state.log,
            now_ns=now_ns,
        )
        image.terms = state.terms
        image.source_identity = "spy"
        state.spies = (*state.spies, image)
        pub.spy_notify = (*pub.spy_notify, sub.data_arrived)
        sub.image_available(image)

    def close_subscription(self, sub: Any, now_ns: int) -> None:
        with self.lock:
            if self._subscriptions.get(id(sub)) is sub:
                del self._subscriptions[id(sub)]
            spy = self._spies.get(id(sub))
            if spy is not None and spy[0] is sub:
                del self._spies[id(sub)]
            reg = sub.registration
            if reg is None:
                for log in sub.image_logs():
                    for pub in list(self._publications.values()):
                        if log in pub.state.spies:
                            pub.state.spies = tuple(s for s in pub.state.spies if s is not log)
                            pub.spy_notify = tuple(
                                n for n in pub.spy_notify if n != sub.data_arrived
                            )
                    sub.image_unavailable(log)
                return
            if isinstance(reg, tuple):
                rep, interest = reg
                rep.dispatcher.remove(interest, now_ns)
                # The receiver sends EOS SMs for the images over the next steps; the
                # conductor's tick closes the socket once the dispatcher has no interest left.
            else:
                reg.close()
        self.wake_receiver()

    def reap_receive_endpoints(self) -> None:
        with self.lock:
            for key, rep in list(self.receive_endpoints.items()):
                if not rep.dispatcher.has_interests():
                    del self.receive_endpoints[key]
                    self.receiver.endpoints = tuple(
                        e for e in self.receiver.endpoints if e is not rep
                    )
                    self._retire(dispatcher_counts(rep))
                    self._close_dedicated(rep, list(rep.dedicated))
                    rep.endpoint.close()

    # ------------------------------------------------------------------ dedicated peers

    def dedicate_source(
        self,
        ep: ReceiveEndpoint | SendEndpoint,
        address: Any,
        budget: DedicatedBudget | None = None,
        tags: tuple[tuple[str, Any], ...] = (),
    ) -> Any:
        """Give the peer at ``address`` a socket of its own on ``ep``'s local address: a UDP
        socket with ``SO_REUSEPORT``, bound there and connected to ``address``, read like the
        shared one (see :class:`ReceiveEndpoint`; on a send endpoint the peer is a receiver,
        whose SMs and NAKs arrive there). Counted per call: returns a handle for one
        :meth:`release_source`, or None (nothing changes: the peer stays on the shared socket)
        when the channel that opened ``ep`` did not ask for it (``dedicated-sources``), at that
        many dedicated peers already, past ``budget`` (in all, or the share of one of ``tags``:
        also counted ``dedicated_sockets_over_share``), or when the socket cannot be opened (no
        descriptor left): all but the first counted ``dedicated_sockets_refused``. An idle
        socket (lingering after its last release) that stands in the way is closed first."""
        config = ep.config
        limit = config.dedicated_sources if config is not None else 0
        if not limit:
            return None
        key = (str(address[0]), int(address[1]))
        with self.lock:
            table: dict[Any, Any] = (
                self.receive_endpoints if isinstance(ep, ReceiveEndpoint) else self.send_endpoints
            )
            if table.get(ep.key) is not ep:
                return None  # closed meanwhile
            held = ep.dedicated.get(key)
            if held is not None:
                held.users += 1
                held.idle_since_ns = None
                return (ep, key)
            if len(ep.dedicated) >= limit and not self._reclaim_idle([ep], None, None):
                self.system_counters.dedicated_sockets_refused += 1
                return None
            if budget is not None:
                why = budget.why_not(tags)
                if why is not None:
                    # an idle socket under the same budget (and tag) gives its place
                    tag = next((t for t in tags if t[0] == why), None)
                    self._reclaim_idle(self._all_endpoints(), budget, tag)
                why = budget.take(tags)
                if why is not None:
                    self.system_counters.dedicated_sockets_refused += 1
                    if why != "limit":
                        self.system_counters.dedicated_sockets_over_share += 1
                    return None
            local = ep.endpoint.local_address
            bind = Endpoint(str(local[0]), int(local[1]), ep.endpoint.family)
            try:
                udp = self.open_endpoint(bind, config, connect_to=tuple(address))
            except (DriverError, OSError):
                if budget is not None:
                    budget.give_back(tags)
                self.system_counters.dedicated_sockets_refused += 1
                return None
            ep.dedicated[key] = Dedicated(udp, budget, tags if budget is not None else ())
            self._resocket(ep)
            self.system_counters.dedicated_sockets_opened += 1
        if isinstance(ep, ReceiveEndpoint):
            self.wake_receiver()
        else:
            self.wake_sender()
        return (ep, key)

    def release_source(self, handle: Any, now_ns: int) -> None:
        """Undo one :meth:`dedicate_source` (its handle); the socket closes
        ``DEDICATED_LINGER_NS`` after its last user released it (the conductor's tick)."""
        ep, key = handle
        with self.lock:
            held = ep.dedicated.get(key)
            if held is None or held.users <= 0:
                return
            held.users -= 1
            if held.users == 0:
                held.idle_since_ns = now_ns

    def reap_dedicated(self, now_ns: int) -> None:
        """Close the dedicated sockets nobody has used for ``DEDICATED_LINGER_NS``."""
        with self.lock:
            endpoints: list[Any] = [*self.receive_endpoints.values(), *self.send_endpoints.values()]
            for ep in endpoints:
                if not ep.dedicated:
                    continue
                idle = [
                    key
                    for key, held in ep.dedicated.items()
                    if held.idle_since_ns is not None
                    and now_ns - held.idle_since_ns >= DEDICATED_LINGER_NS
                ]
                if idle:
                    self._close_dedicated(ep, idle)

    def _all_endpoints(self) -> list[ReceiveEndpoint | SendEndpoint]:
        return [*self.receive_endpoints.values(), *self.send_endpoints.values()]

    def _reclaim_idle(
        self,
        endpoints: list[ReceiveEndpoint | SendEndpoint],
        budget: DedicatedBudget | None,
        tag: tuple[str, Any] | None,
    ) -> bool:
        """Close the longest idle dedicated socket of ``endpoints`` (of ``budget`` and under
        ``tag`` when given) to make room for a new one; whether there was one."""
        oldest: tuple[int, Any, Any] | None = None
        for ep in endpoints:
            for key, held in ep.dedicated.items():
                if held.idle_since_ns is None:
                    continue
                if budget is not None and held.budget is not budget:
                    continue
                if tag is not None and tag not in held.tags:
                    continue
                if oldest is None or held.idle_since_ns < oldest[0]:
                    oldest = (held.idle_since_ns, ep, key)
        if oldest is None:
            return False
        self._close_dedicated(oldest[1], [oldest[2]])
        return True

    def _close_dedicated(self, ep: ReceiveEndpoint | SendEndpoint, keys: list[Any]) -> None:
        for key in keys:
            held = ep.dedicated.pop(key, None)
            if held is not None:
                held.udp.close()
                if held.budget is not None:
                    held.budget.give_back(held.tags)
                self.system_counters.dedicated_sockets_closed += 1
        if keys:
            self._resocket(ep)

    def _resocket(self, ep: ReceiveEndpoint | SendEndpoint) -> None:
        """``ep.sockets`` from its dedicated sockets (read first) and its shared one; the
        agent's runner registers them again."""
        ep.sockets = (*(held.udp for held in ep.dedicated.values()), ep.endpoint)
        if isinstance(ep, ReceiveEndpoint):
            self.receiver.sockets_version += 1
        else:
            self.sender.sockets_version += 1

    def send_endpoint_of(self, state: PublicationState) -> SendEndpoint | None:
        """The send endpoint a UDP publication's state sends from (None: gone)."""
        with self.lock:
            for ep in self.send_endpoints.values():
                if ep.by_session.get((state.session_id, state.stream_id)) is state:
                    return ep
        return None

    # ------------------------------------------------------------------ IPC

    def add_ipc(self, resource: Any) -> None:
        """An IPC publication or subscription, stepped by :meth:`do_work` (now, then at its
        deadlines or when the watch says the directory changed) until it is closed.

        No client thread moves a resource's deadline earlier unseen: an IPC subscription's
        waiter scans too, but only while the conductor holds a deadline for it (a change of
        the directory the conductor read but has not scanned yet, or a file to look at again:
        both scheduled at its next scan), so an image a waiter finds is polled from then."""
        with self.lock:
            self.ipc = (*self.ipc, resource)
        self.ipc_due.ready.append(resource)
        if self._wake_conductor is not None:
            self._wake_conductor()

    def reap_ipc(self) -> None:
        closed = [r for r in self.ipc if getattr(r, "is_closed", False)]
        if closed:
            with self.lock:
                self.ipc = tuple(r for r in self.ipc if r not in closed)
            for resource in closed:
                self.ipc_due.forget(resource)

    # ------------------------------------------------------------------ shutdown

    def release_all(self, on_error: Callable[[BaseException], None]) -> None:
        """Close every endpoint and IPC resource (the driver is closing)."""
        with self.lock:
            for ep in self.send_endpoints.values():
                self._close_dedicated(ep, list(ep.dedicated))
                ep.endpoint.close()
            for rep in self.receive_endpoints.values():
                self._close_dedicated(rep, list(rep.dedicated))
                rep.endpoint.close()
            self.send_endpoints.clear()
            self.receive_endpoints.clear()
            for resource in self.ipc:
                try:
                    resource.close()
                except Exception as exc:  # noqa: BLE001
                    on_error(exc)
            self.ipc = ()
            if self.ipc_watch is not None:
                self.ipc_watch.close()

    # ------------------------------------------------------------------ counters

    def totals(self) -> dict[str, int]:
        """The counters the live publications, dispatchers and images keep, plus the retired
        ones': the running totals of the publications (the conductor's tally) and of each
        receive endpoint's images (its dispatcher's), kept where they count (tally.py), so a
        snapshot reads O(receive endpoints), never every stream (the walk of every publication
        and image was 10-13 ms of the server's loop a second at 1,024 sessions; issue 31)."""
        totals = dict(self.retired)
        for name, value in self.tally.snapshot().items():
            totals[name] = totals.get(name, 0) + value
        for rep in self.receiver.endpoints:
            d = rep.dispatcher
            for name, attribute in _DISPATCHER_COUNTERS:
                totals[name] = totals.get(name, 0) + getattr(d, attribute)
            for name, value in d.retired.items():
                totals[name] = totals.get(name, 0) + value
            for name, value in d.tally.snapshot().items():
                totals[name] = totals.get(name, 0) + value
        return totals

    def stream_positions(self) -> dict[str, int]:
        """Each stream's positions, keyed ``<kind>:<session>:<stream>`` (the keys made once per
        publication or image: a server's stat snapshot asks every few seconds for thousands)."""
        out: dict[str, int] = {}
        for ep in self.sender.endpoints:
            for s in ep.publications:
                keys = s.position_keys
                if not keys:
                    key = f"{s.session_id}:{s.stream_id}"
                    keys = s.position_keys = tuple(
                        f"{kind}:{key}" for kind in ("pub_pos", "pub_lmt", "snd_pos", "snd_lmt")
                    )
                out[keys[0]] = s.appender.position
                out[keys[1]] = s.publisher_limit
                out[keys[2]] = s.sender_position
                out[keys[3]] = s.sender_limit
        for rep in self.receiver.endpoints:
            for image in rep.dispatcher.images():
                keys = image.position_keys
                if not keys:
                    key = f"{image.session_id}:{image.stream_id}"
                    keys = image.position_keys = tuple(
                        f"{kind}:{key}" for kind in ("rcv_hwm", "rcv_pos", "sub_pos")
                    )
                out[keys[0]] = image.hwm
                out[keys[1]] = image.rebuild_position
                out[keys[2]] = image.subscriber_position
        return out


# (system counter name, attribute) of what a publication, a dispatcher and an image count
_PUBLICATION_COUNTERS = (
    ("naks_received", "naks_received"),
    ("retransmits_sent", "retransmits_sent"),
    ("retransmitted_bytes", "retransmitted_bytes"),
    ("retransmits_suppressed", "retransmits_suppressed"),
    ("heartbeats_sent", "heartbeats_sent"),
    ("setups_sent", "setups_sent"),
    ("status_messages_received", "status_messages_received"),
    ("back_pressure_events", "back_pressure_events"),
    ("invalid_frames", "invalid_naks"),
    ("status_messages_refused", "status_messages_refused"),
    ("status_messages_deferred", "status_messages_deferred"),
    ("naks_refused", "naks_refused"),
)
_DISPATCHER_COUNTERS = (
    ("status_messages_sent", "status_messages_sent"),
    ("setups_received", "setups_received"),
    ("setups_rejected", "setups_rejected"),
    ("images_refused", "images_refused"),
    ("images_evicted", "images_evicted"),
    ("setups_rate_limited", "setups_rate_limited"),
    ("setups_source_refused", "setups_source_refused"),
    ("unknown_session_data", "unknown_session_data"),
    ("data_wrong_source", "data_wrong_source"),
    ("images_created", "images_created"),
    ("images_removed", "images_removed"),
    ("heartbeats_received", "heartbeats_received"),
)


def publication_counts(state: PublicationState) -> dict[str, int]:
    return {name: getattr(state, attribute) for name, attribute in _PUBLICATION_COUNTERS}


def dispatcher_counts(rep: ReceiveEndpoint) -> dict[str, int]:
    d = rep.dispatcher
    counts = {name: getattr(d, attribute) for name, attribute in _DISPATCHER_COUNTERS}
    for name, value in d.retired.items():
        counts[name] = counts.get(name, 0) + value
    for image in d.images():
        for name, value in image_counts(image).items():
            counts[name] = counts.get(name, 0) + value
    return counts


def receive_key(endpoint: Endpoint, control: Endpoint | None) -> tuple[str, str, str]:
    """A receive endpoint's key: its local address (a port-0 one under the port it was
    given) and its control; subscriptions with the same key share the socket."""
    return ("sub", str(endpoint), str(control))


def unicast_send_key(config: ChannelConfig) -> tuple[Any, ...]:
    """The send endpoint of a unicast publication: shared by every one whose channel has the
    same canonical form (Aeron's ``SendChannelEndpoint``): the destination endpoint, the
    ``interface`` asked for, and ``max-amplification`` (a guarded socket has the driver's
    amplification ledger, an unguarded one none). Session id, stream id, term length and mtu
    are each publication's own."""
    return ("pub", str(config.endpoint), config.interface, config.max_amplification)


_SOCKET_BUFFERS = (("so-rcvbuf", "so_rcvbuf", DEFAULT_SO_RCVBUF), ("so-sndbuf", "so_sndbuf", 0))


def check_shares_socket(config: ChannelConfig, existing: ChannelConfig | None) -> None:
    """A publication or subscription joining an endpoint opened for ``existing``: refused (as
    Aeron's driver does) if it names a socket buffer (``so-rcvbuf``/``so-sndbuf``) other than
    the shared socket's, or another ``max-amplification`` (a guarded socket or not). A channel
    naming no buffer takes the socket's as they are."""
    if existing is None:
        return
    for param, field, default in _SOCKET_BUFFERS:
        value, had = getattr(config, field), getattr(existing, field)
        # the URI is parsed again only to tell a default named explicitly from none
        if value != had and (value != default or param in _named_params(config)):
            raise ChannelError(
                param,
                value,
                f"{had or 'the OS default'} (the socket it shares, opened for {existing.uri}) "
                "or none",
            )
    if config.dedicated_sources and config.dedicated_sources != existing.dedicated_sources:
        raise ChannelError(
            "dedicated-sources",
            config.dedicated_sources,
            f"{existing.dedicated_sources} (the socket it shares, opened for {existing.uri}) "
            "or none",
        )
    if config.max_amplification != existing.max_amplification:
        raise ChannelError(
            "max-amplification",
            config.max_amplification,
            f"{existing.max_amplification} (the socket it shares, opened for {existing.uri})",
        )


def _named_params(config: ChannelConfig) -> frozenset[str]:
    try:
        return frozenset(parse_uri(config.uri).params) if config.uri else frozenset()
    except ChannelError:
        return frozenset()


def tighter(driver: int, channel: int | None) -> int:
    """The tighter of two limits, where 0 (or None) means no limit."""
    limits = [v for v in (driver, channel) if v]
    return min(limits) if limits else 0


def spy_matches(spy: ChannelConfig, pub: ChannelConfig) -> bool:
    """Whether an ``aeron-spy:`` subscription's channel names this publication's channel."""
    if pub.media != "udp":
        return False
    if spy.endpoint is not None:
        return pub.endpoint is not None and (spy.endpoint.host, spy.endpoint.port) == (
            pub.endpoint.host,
            pub.endpoint.port,
        )
    if spy.control is not None:
        return pub.control is not None and str(spy.control) == str(pub.control)
    return True


__all__ = ["DriverConductor", "ImageLimits", "dispatcher_counts", "publication_counts"]
