"""The media driver: owns sockets, agents and threads; hands out publications and subscriptions.

Threading modes (``DriverConfig.threading_mode``):

* ``"shared"`` (default): conductor, sender and receiver agents on one background thread;
* ``"dedicated"``: one thread per agent;
* ``"invoker"``: no thread; the caller steps everything with :meth:`Driver.do_work` (and may
  sleep in :meth:`Driver.idle`). Tests and the benchmark use it: no thread hand-off at all.

``aeron:udp`` channels are served here; ``aeron:ipc`` channels are handed to
:mod:`aeron_spark.transport.ipc` (its objects are stepped by the conductor);
``aeron-spy:aeron:udp?...`` subscriptions read local network publications' logs in-process.
"""

from __future__ import annotations

import getpass
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aeron_spark.transport import ipc
from aeron_spark.transport.counters import Counters, SystemCounters
from aeron_spark.transport.driver.agents import (
    Agent,
    AgentRunner,
    ConductorAgent,
    ReceiveEndpoint,
    ReceiverAgent,
    SendEndpoint,
    SenderAgent,
)
from aeron_spark.transport.driver.client import Image, Publication, Subscription
from aeron_spark.transport.driver.endpoint import (
    AmplificationLedger,
    UdpEndpoint,
    bind_endpoint_for,
    destination_address,
)
from aeron_spark.transport.errors import ChannelError, ClosedError, DriverError, LocalProtocolError
from aeron_spark.transport.protocol.image import ImageState
from aeron_spark.transport.protocol.logbuffer import (
    MAX_UDP_PAYLOAD_LENGTH,
    RESERVED_SESSION_ID_HIGH,
    RESERVED_SESSION_ID_LOW,
    TERM_MAX_LENGTH,
    check_mtu,
    check_term_length,
    is_reserved_session_id,
    wrap_int32,
)
from aeron_spark.transport.protocol.publication import Destination, PublicationState
from aeron_spark.transport.protocol.receiver import StreamInterest, image_counts
from aeron_spark.transport.uri import ChannelConfig, Endpoint, parse_endpoint

ThreadingMode = Literal["shared", "dedicated", "invoker"]
DEFAULT_SOCKET_BUFFER_LENGTH = 2 * 1024 * 1024


def default_directory() -> Path:
    """``/dev/shm/aeron-spark-<user>`` where /dev/shm exists, else under the temp directory."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"aeron-spark-{user}"


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """Settings of one driver; units in the names. ``loss`` injects receive-side loss (tests)."""

    threading_mode: ThreadingMode = "shared"
    directory: Path | None = None
    socket_buffer_length: int = DEFAULT_SOCKET_BUFFER_LENGTH
    counters_interval_ns: int = 1_000_000_000
    write_counters_file: bool = True
    retransmit_linger_ns: int = 10_000_000  # NAKs for a range just resent are ignored this long
    ipc_liveness_timeout_ns: int = 10_000_000_000  # an IPC peer silent this long is gone
    # Largest term length / mtu a SETUP may ask of our UDP subscriptions (each subscription may
    # lower them: max-term-length / max-mtu); bigger SETUPs are dropped and counted.
    max_image_term_length: int = TERM_MAX_LENGTH
    max_image_mtu: int = MAX_UDP_PAYLOAD_LENGTH
    # Images one UDP subscription takes at once: in all, from one sender (address and port),
    # from one IP address (0: no limit; channels may lower them: max-images,
    # max-images-per-source, max-images-per-address); SETUPs past them are counted.
    max_images: int = 0
    max_images_per_source: int = 0
    max_images_per_address: int = 0
    loss: Any = None  # a transport.api.MediaHook, e.g. transport.testing.LossConfig (tests)

    def __post_init__(self) -> None:
        if self.directory is not None and not isinstance(self.directory, Path):
            if not isinstance(self.directory, str):
                raise ChannelError("directory", self.directory, "a path (str or pathlib.Path)")
            object.__setattr__(self, "directory", Path(self.directory))
        if self.threading_mode not in ("shared", "dedicated", "invoker"):
            raise ChannelError(
                "threading_mode", self.threading_mode, "shared, dedicated or invoker"
            )
        if self.socket_buffer_length < 0:
            raise ChannelError(
                "socket_buffer_length", self.socket_buffer_length, "a byte count >= 0"
            )
        if self.ipc_liveness_timeout_ns <= 0:
            raise ChannelError(
                "ipc_liveness_timeout_ns", self.ipc_liveness_timeout_ns, "a positive duration"
            )
        if self.retransmit_linger_ns < 0:
            raise ChannelError("retransmit_linger_ns", self.retransmit_linger_ns, "a duration >= 0")
        if self.counters_interval_ns <= 0:
            raise ChannelError(
                "counters_interval_ns", self.counters_interval_ns, "a positive duration"
            )
        check_term_length(self.max_image_term_length, "max_image_term_length")
        check_mtu(self.max_image_mtu, "max_image_mtu")
        for name in ("max_images", "max_images_per_source", "max_images_per_address"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ChannelError(name, getattr(self, name), "a count >= 0 (0: no limit)")

    @property
    def resolved_directory(self) -> Path:
        return self.directory if self.directory is not None else default_directory()


class Driver:
    """An in-process Aeron media driver with the client API on top."""

    def __init__(self, config: DriverConfig | None = None) -> None:
        self.config = config or DriverConfig()
        self.directory = self.config.resolved_directory
        self.system_counters = SystemCounters()
        self.amplification: AmplificationLedger | None = None
        self._retired: dict[str, int] = {}
        self._lock = threading.RLock()
        self._sender = SenderAgent(self.system_counters, self._on_publication_done)
        self._receiver = ReceiverAgent(self.system_counters, self._reap_receive_endpoints)
        self._conductor = ConductorAgent(self._tick, self.config.counters_interval_ns)
        self._send_endpoints: dict[Any, SendEndpoint] = {}
        self._receive_endpoints: dict[Any, ReceiveEndpoint] = {}
        self._publications: list[Publication] = []
        self._subscriptions: list[Subscription] = []
        self._spies: list[tuple[Subscription, ChannelConfig]] = []
        self._ipc: list[Any] = []
        self._next_session_id = random.getrandbits(32) - 2**31
        self._runners: list[AgentRunner] = []
        self._sender_runner: AgentRunner | None = None
        self._receiver_runner: AgentRunner | None = None
        self._started = False
        self._closed = False
        self.errors: list[BaseException] = []
        self.counters = Counters(self.system_counters, self._stream_positions, self._totals)

    # ------------------------------------------------------------------ lifecycle

    @property
    def is_invoker(self) -> bool:
        return self.config.threading_mode == "invoker"

    def start(self) -> Driver:
        with self._lock:
            if self._closed:
                raise ClosedError("driver is closed")
            if self._started:
                return self
            self._started = True
            mode = self.config.threading_mode
            agents: tuple[Agent, ...] = (self._conductor, self._sender, self._receiver)
            if mode == "dedicated":
                self._runners = [
                    AgentRunner(f"aeron-{n}", [a], self._record_error)
                    for n, a in zip(("conductor", "sender", "receiver"), agents, strict=True)
                ]
                self._sender_runner, self._receiver_runner = self._runners[1], self._runners[2]
            else:
                runner = AgentRunner("aeron-driver", agents, self._record_error)
                self._runners = [runner]
                self._sender_runner = self._receiver_runner = runner
            if mode != "invoker":
                for runner in self._runners:
                    runner.start()
        return self

    def close(self) -> None:
        """Close every publication and subscription, stop the agents, release sockets."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pubs, subs = list(self._publications), list(self._subscriptions)
        for sub in subs:
            sub.close()
        for pub in pubs:
            pub.close()
        if self._started:
            # Give EOS a moment to go out (bounded), then stop.
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline and self._sender.endpoints:
                if self.is_invoker:
                    self.do_work()
                    self.idle(0.01)
                else:
                    time.sleep(0.01)
        for runner in self._runners:
            runner.stop()
            runner.close()
        with self._lock:
            for ep in self._send_endpoints.values():
                ep.endpoint.close()
            for rep in self._receive_endpoints.values():
                rep.endpoint.close()
            self._send_endpoints.clear()
            self._receive_endpoints.clear()
            for resource in self._ipc:
                try:
                    resource.close()
                except Exception as exc:  # noqa: BLE001
                    self._record_error(exc)
            self._ipc.clear()
        if self.config.write_counters_file:
            try:
                self.counters.file_path(self.directory).unlink(missing_ok=True)
            except OSError:
                pass

    def __enter__(self) -> Driver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def do_work(self, now_ns: int | None = None) -> int:
        """Step every agent once (invoker mode); returns the work done."""
        if not self._started:
            self.start()
        if not self.is_invoker:
            raise LocalProtocolError(
                "do_work() is for threading_mode='invoker'; the driver has threads"
            )
        return self._runners[0].do_work(now_ns)

    def idle(self, timeout_s: float) -> None:
        """Invoker mode: sleep until a socket is readable or the next deadline (<= timeout_s)."""
        if self.is_invoker and self._runners:
            self._runners[0].idle(timeout_s)
        else:
            time.sleep(timeout_s)

    def _record_error(self, exc: BaseException) -> None:
        self.system_counters.errors += 1
        if len(self.errors) < 100:
            self.errors.append(exc)

    def _wake_sender(self) -> None:
        runner = self._sender_runner
        if runner is not None and runner.sleeping:
            runner.wake()

    def _wake_receiver(self) -> None:
        runner = self._receiver_runner
        if runner is not None and runner.sleeping:
            runner.wake()

    # ------------------------------------------------------------------ publications

    def _allocate_session_id(self) -> int:
        while True:
            sid = self._next_session_id
            self._next_session_id = wrap_int32(sid + 1)
            if not is_reserved_session_id(sid):
                return sid

    def add_publication(self, channel: str, stream_id: int, exclusive: bool = True) -> Any:
        """A publication on ``aeron:udp?endpoint=host:port|...`` (or ``aeron:ipc``)."""
        config = ChannelConfig.from_uri(channel)
        _check_stream_id(stream_id)
        if not self._started:
            self.start()
        if self._closed:
            raise ClosedError("driver is closed")
        if config.spy:
            raise ChannelError(
                "channel", channel, "a publication channel (aeron-spy: is for subscriptions)"
            )
        if config.media == "ipc":
            return self._add_ipc_publication(config, stream_id, exclusive)
        dynamic = config.control is not None and config.control_mode in ("", "dynamic")
        manual = config.control_mode == "manual"
        if config.endpoint is None and not (dynamic or manual):
            raise ChannelError("endpoint", "", "an endpoint=host:port for a UDP publication")
        now = time.monotonic_ns()
        with self._lock:
            if config.session_id is not None:
                session_id = config.session_id
            else:
                session_id = self._allocate_session_id()
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
            destination = None
            if config.endpoint is not None and not dynamic and not manual:
                destination = destination_address(config.endpoint)
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
                retransmit_linger_ns=self.config.retransmit_linger_ns,
                destination=destination,
                dynamic=dynamic,
                now_ns=now,
            )
            if config.destination_host is not None:
                host = config.destination_host
                state.allowed_hosts = frozenset() if host == "none" else frozenset({host})
                state.session_sm_only = config.session_id is not None
            state.max_destinations = config.max_destinations
            if dynamic or manual:
                assert config.control is not None or manual
                bind = (
                    config.control
                    if config.control is not None
                    else bind_endpoint_for(config.endpoint or Endpoint("0.0.0.0", 0, 2))
                )
                key: Any = ("control", str(bind))
            else:
                assert config.endpoint is not None
                bind = bind_endpoint_for(config.endpoint)
                key = ("pub", session_id, stream_id)
            ep = self._send_endpoints.get(key)
            if ep is None:
                udp = self._open_endpoint(bind, config)
                ep = SendEndpoint(key, udp)
                self._send_endpoints[key] = ep
                self._sender.endpoints = (*self._sender.endpoints, ep)
            elif (session_id, stream_id) in ep.by_session:
                raise ChannelError(
                    "session-id", session_id, "a session id not already used on this channel"
                )
            ep.add(state)
            pub = Publication(self, state, channel, exclusive, ep)
            self._publications.append(pub)
            self.system_counters.publications_created += 1
            for spy_sub, spy_config in self._spies:
                if spy_sub.stream_id == stream_id and _spy_matches(spy_config, config):
                    self._attach_spy(spy_sub, pub)
        self._wake_sender()
        return pub

    def trust_host(self, host: str) -> None:
        """``host`` completed a handshake: sends to it are no longer bounded by what it sent
        (see ``max-amplification``); each call is undone by one :meth:`distrust_host`."""
        if self.amplification is not None:
            self.amplification.trust(host)

    def distrust_host(self, host: str) -> None:
        if self.amplification is not None:
            self.amplification.distrust(host)

    def _open_endpoint(self, bind: Endpoint, config: ChannelConfig) -> UdpEndpoint:
        buffer = self.config.socket_buffer_length
        loss = None
        if self.config.loss is not None:
            loss = self.config.loss.receive_hook(self.system_counters)
        udp = UdpEndpoint(
            bind,
            self.system_counters,
            so_rcvbuf=max(config.so_rcvbuf, buffer),
            so_sndbuf=max(config.so_sndbuf, buffer),
            loss=loss,
        )
        if config.max_amplification:
            # the driver's guarded sockets share one ledger: what an address sent to one
            # (a HELLO on the port) is its credit on the other (replies from port + 1)
            if self.amplification is None:
                self.amplification = AmplificationLedger(config.max_amplification)
            udp.ledger = self.amplification
        return udp

    def _add_destination(self, pub: Publication, endpoint: str) -> None:
        address = destination_address(parse_endpoint("endpoint", endpoint, allow_port_zero=False))
        state = pub._state
        state.destinations[address] = Destination(address, time.monotonic_ns())
        state.setup_deadline_ns = 0
        self._wake_sender()

    def _close_publication(self, pub: Publication) -> None:
        state = pub._state
        if isinstance(pub._registration, SendEndpoint):
            state.close(time.monotonic_ns())
            self._wake_sender()
        elif pub._registration is not None:
            pub._registration.close()

    def _on_publication_done(self, ep: SendEndpoint, state: PublicationState) -> None:
        with self._lock:
            ep.remove(state)
            self._retire_publication(state)
            self._publications = [p for p in self._publications if p._state is not state]
            for spy in state.spies:
                spy.is_done = True
            for sub, _ in self._spies:
                for image in list(sub._images):
                    if image._state in state.spies:
                        sub._image_unavailable(image._state)
            if not ep.publications:
                self._send_endpoints.pop(ep.key, None)
                self._sender.endpoints = tuple(e for e in self._sender.endpoints if e is not ep)
                ep.endpoint.close()

    def _retire_publication(self, state: PublicationState) -> None:
        for name, value in _publication_counts(state).items():
            self._retired[name] = self._retired.get(name, 0) + value

    # ------------------------------------------------------------------ subscriptions

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], object] | None = None,
        on_unavailable_image: Callable[[Image], object] | None = None,
    ) -> Any:
        """A subscription on ``aeron:udp?endpoint=host:port|...``, ``aeron:ipc``, ``aeron-spy:``."""
        config = ChannelConfig.from_uri(channel)
        _check_stream_id(stream_id)
        if not self._started:
            self.start()
        if self._closed:
            raise ClosedError("driver is closed")
        if config.media == "ipc":
            return self._add_ipc_subscription(
                config, stream_id, on_available_image, on_unavailable_image
            )
        sub = Subscription(self, channel, stream_id, on_available_image, on_unavailable_image)
        if config.spy:
            with self._lock:
                self._spies.append((sub, config))
                self._subscriptions.append(sub)
                for pub in self._publications:
                    pcfg = ChannelConfig.from_uri(pub.channel)
                    if pub.stream_id == stream_id and _spy_matches(config, pcfg):
                        self._attach_spy(sub, pub)
            return sub
        if config.endpoint is None:
            raise ChannelError("endpoint", "", "an endpoint=host:port to bind the subscription to")
        control = destination_address(config.control) if config.control is not None else None
        with self._lock:
            key: Any = ("sub", str(config.endpoint), str(config.control))
            rep = self._receive_endpoints.get(key) if config.endpoint.port != 0 else None
            if rep is None:
                udp = self._open_endpoint(config.endpoint, config)
                if config.endpoint.port == 0:
                    key = ("sub", str(config.endpoint), str(config.control), udp.local_port)
                rep = ReceiveEndpoint(key, udp)
                self._receive_endpoints[key] = rep
                self._receiver.endpoints = (*self._receiver.endpoints, rep)
            interest = StreamInterest(
                stream_id,
                session_id=config.session_id,
                control_address=control,
                receiver_window=_window_for(config.receiver_window_length, rep.endpoint),
                nak_delay_ns=config.nak_delay_ns,
                reliable=config.reliable,
                max_term_length=min(
                    self.config.max_image_term_length,
                    config.max_term_length or self.config.max_image_term_length,
                ),
                max_mtu=min(self.config.max_image_mtu, config.max_mtu or self.config.max_image_mtu),
                max_images=_limit(self.config.max_images, config.max_images),
                max_images_per_source=_limit(
                    self.config.max_images_per_source, config.max_images_per_source
                ),
                max_images_per_address=_limit(
                    self.config.max_images_per_address, config.max_images_per_address
                ),
                setups_per_prefix_per_s=config.setups_per_prefix_per_s,
                on_image=sub._image_available,
                on_image_gone=sub._image_unavailable,
                on_data=sub._data_arrived,
            )
            rep.dispatcher.add(interest)
            sub._registration = (rep, interest)
            local = rep.endpoint.local_address
            sub.local_endpoints = [(str(local[0]), int(local[1]))]
            self._subscriptions.append(sub)
            self.system_counters.subscriptions_created += 1
        self._wake_receiver()
        return sub

    def _attach_spy(self, sub: Subscription, pub: Publication) -> None:
        state = pub._state
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
            now_ns=time.monotonic_ns(),
        )
        image.terms = state.terms
        image.source_identity = "spy"
        state.spies = (*state.spies, image)
        pub.spy_notify = (*pub.spy_notify, sub._data_arrived)
        sub._image_available(image)

    def _close_subscription(self, sub: Subscription) -> None:
        with self._lock:
            self._subscriptions = [s for s in self._subscriptions if s is not sub]
            self._spies = [(s, c) for s, c in self._spies if s is not sub]
            reg = sub._registration
            if reg is None:
                for image in list(sub._images):
                    for pub in self._publications:
                        if image._state in pub._state.spies:
                            pub._state.spies = tuple(
                                s for s in pub._state.spies if s is not image._state
                            )
                            pub.spy_notify = tuple(
                                n for n in pub.spy_notify if n != sub._data_arrived
                            )
                    sub._image_unavailable(image._state)
                return
            if isinstance(reg, tuple):
                rep, interest = reg
                rep.dispatcher.remove(interest, time.monotonic_ns())
                # The receiver sends EOS SMs for the images over the next steps; the
                # conductor's tick closes the socket once the dispatcher has no interest left.
            else:
                reg.close()
        self._wake_receiver()

    def _reap_receive_endpoints(self) -> None:
        with self._lock:
            for key, rep in list(self._receive_endpoints.items()):
                if not rep.dispatcher.has_interests():
                    del self._receive_endpoints[key]
                    self._receiver.endpoints = tuple(
                        e for e in self._receiver.endpoints if e is not rep
                    )
                    self._retire_dispatcher(rep)
                    rep.endpoint.close()

    def _retire_dispatcher(self, rep: ReceiveEndpoint) -> None:
        for name, value in _dispatcher_counts(rep).items():
            self._retired[name] = self._retired.get(name, 0) + value

    # ------------------------------------------------------------------ IPC

    def _ipc_module(self) -> Any:
        if not hasattr(ipc, "add_publication") or not hasattr(ipc, "add_subscription"):
            raise DriverError(
                "aeron:ipc channels are not implemented yet (transport.ipc has no "
                "add_publication/add_subscription)"
            )
        return ipc

    def _add_ipc_publication(self, config: ChannelConfig, stream_id: int, exclusive: bool) -> Any:
        ipc = self._ipc_module()
        self.directory.mkdir(parents=True, exist_ok=True)
        resource = ipc.add_publication(
            config,
            stream_id,
            directory=self.directory,
            exclusive=exclusive,
            liveness_timeout_ns=self.config.ipc_liveness_timeout_ns,
        )
        self._register_ipc(resource)
        return resource

    def _add_ipc_subscription(
        self,
        config: ChannelConfig,
        stream_id: int,
        on_available_image: Any,
        on_unavailable_image: Any,
    ) -> Any:
        ipc = self._ipc_module()
        self.directory.mkdir(parents=True, exist_ok=True)
        resource = ipc.add_subscription(
            config,
            stream_id,
            directory=self.directory,
            on_available_image=on_available_image,
            on_unavailable_image=on_unavailable_image,
            liveness_timeout_ns=self.config.ipc_liveness_timeout_ns,
        )
        self._register_ipc(resource)
        return resource

    def _register_ipc(self, resource: Any) -> None:
        with self._lock:
            self._ipc.append(resource)
            self._conductor.ipc = (*self._conductor.ipc, resource)
        runner = self._runners[0] if self._runners else None
        if runner is not None and runner.sleeping:
            runner.wake()

    def _reap_ipc(self) -> None:
        closed = [r for r in self._conductor.ipc if getattr(r, "is_closed", False)]
        if closed:
            with self._lock:
                self._conductor.ipc = tuple(r for r in self._conductor.ipc if r not in closed)
                self._ipc = [r for r in self._ipc if r not in closed]

    # ------------------------------------------------------------------ counters

    def _tick(self, now_ns: int) -> int:
        self._reap_receive_endpoints()
        self._reap_ipc()
        if self.config.write_counters_file:
            try:
                self.counters.write(self.directory)
            except OSError as exc:
                self._record_error(exc)
        return 0

    def _totals(self) -> dict[str, int]:
        totals = dict(self._retired)
        for ep in self._sender.endpoints:
            for state in ep.publications:
                for name, value in _publication_counts(state).items():
                    totals[name] = totals.get(name, 0) + value
        for rep in self._receiver.endpoints:
            for name, value in _dispatcher_counts(rep).items():
                totals[name] = totals.get(name, 0) + value
        return totals

    def _stream_positions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ep in self._sender.endpoints:
            for s in ep.publications:
                key = f"{s.session_id}:{s.stream_id}"
                out[f"pub_pos:{key}"] = s.appender.position
                out[f"pub_lmt:{key}"] = s.publisher_limit
                out[f"snd_pos:{key}"] = s.sender_position
                out[f"snd_lmt:{key}"] = s.sender_limit
        for rep in self._receiver.endpoints:
            for image in rep.dispatcher.images():
                key = f"{image.session_id}:{image.stream_id}"
                out[f"rcv_hwm:{key}"] = image.hwm
                out[f"rcv_pos:{key}"] = image.rebuild_position
                out[f"sub_pos:{key}"] = image.subscriber_position
        return out


def _publication_counts(state: PublicationState) -> dict[str, int]:
    return {
        "naks_received": state.naks_received,
        "retransmits_sent": state.retransmits_sent,
        "retransmitted_bytes": state.retransmitted_bytes,
        "retransmits_suppressed": state.retransmits_suppressed,
        "heartbeats_sent": state.heartbeats_sent,
        "setups_sent": state.setups_sent,
        "status_messages_received": state.status_messages_received,
        "back_pressure_events": state.back_pressure_events,
        "invalid_frames": state.invalid_naks,
        "status_messages_refused": state.status_messages_refused,
        "naks_refused": state.naks_refused,
    }


def _dispatcher_counts(rep: ReceiveEndpoint) -> dict[str, int]:
    d = rep.dispatcher
    counts = {
        "status_messages_sent": d.status_messages_sent,
        "setups_received": d.setups_received,
        "setups_rejected": d.setups_rejected,
        "images_refused": d.images_refused,
        "setups_rate_limited": d.setups_rate_limited,
        "unknown_session_data": d.unknown_session_data,
        "data_wrong_source": d.data_wrong_source,
        "images_created": d.images_created,
        "images_removed": d.images_removed,
        "heartbeats_received": d.heartbeats_received,
    }
    for name, value in d.retired.items():
        counts[name] = counts.get(name, 0) + value
    for image in d.images():
        for name, value in image_counts(image).items():
            counts[name] = counts.get(name, 0) + value
    return counts


def _limit(driver: int, channel: int | None) -> int:
    """The tighter of two image limits, where 0 (or None) means no limit."""
    limits = [v for v in (driver, channel) if v]
    return min(limits) if limits else 0


def _window_for(window: int, endpoint: UdpEndpoint) -> int:
    """The receiver window, at most what the socket's receive buffer holds (as Aeron requires):
    a window the kernel cannot buffer turns a burst into socket overflows, i.e. loss. Linux
    reports twice the buffer asked for and charges each datagram more than its payload, so
    half of the reported length is what fits."""
    try:
        buffered = endpoint.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
    except OSError:
        return window
    return max(min(window, buffered), 64 * 1024)


def _check_stream_id(stream_id: int) -> None:
    if not isinstance(stream_id, int) or not -(2**31) <= stream_id < 2**31:
        raise ChannelError("stream_id", stream_id, "a 32-bit integer")


def _spy_matches(spy: ChannelConfig, pub: ChannelConfig) -> bool:
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


__all__ = [
    "Driver",
    "DriverConfig",
    "RESERVED_SESSION_ID_HIGH",
    "RESERVED_SESSION_ID_LOW",
    "default_directory",
]
