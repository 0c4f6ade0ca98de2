"""The handshake server: the I/O around :class:`~.machine.ServerCore`.

Channels (UDP; ``H`` = host, ``P`` = port, ``C`` = control port, default ``P + 1``)::

    HELLO in        subscription  aeron:udp?endpoint=H:P|max-term-length=64k|... HANDSHAKE_STREAM_ID
    replies out     publication   aeron:udp?control=H:C|control-mode=dynamic REPLY_STREAM_ID
    client -> us    subscription  aeron:udp?endpoint=H:P|session-id=<secret>  <per-client stream>
    us -> client    publication   aeron:udp?control=H:C|control-mode=dynamic|session-id=<secret>

Every client joins the reply publication in dynamic control mode (so replies reach clients behind
NAT) and picks out the replies addressed to its connect key. A HELLO without a valid cookie gets a
COOKIE and allocates nothing; the client says HELLO again with it on the same publication (so
from the same address and port), and only that HELLO is admitted, or a HELLO carrying the
resumption token an earlier WELCOME sealed for that address and port. A client process says the
HELLOs of all its handshakes with this server on one publication (``hello_channel.py``): every
HELLO of a UDP image is answered, and the host of a live HELLO image stays on the reply
publication, which is opened for the image's first HELLO (a SETUP alone opens nothing). Each
session's subscription only
accepts the secret session id, so a stranger's publication on that stream is ignored by the
transport. All of a server's subscriptions share the one socket on ``P`` and all its publications
the one on ``C``, except that an established session's client gets a socket of its own on each
(on ``P`` connected to the address and port it sends from, on ``C`` to the one it receives on),
which a flood of the public ports does not reach (``SO_REUSEPORT``; why this and not a third
port: ``channels.py``).

Use it either from your own loop (``accept(now_ns)`` returns new connections, ``wait(timeout)``
sleeps until any of the server's subscriptions has something) or with ``start()``, which runs a
thread that accepts, polls every connection and calls ``on_connect(conn)``,
``on_message(conn, bytes)``, ``on_disconnect(conn)`` and ``on_error(conn | None, exc)``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aeron_spark.counters import REGISTRY, CounterType
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.channels import Channels
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.connection import Connection
from aeron_spark.handshake.crypto import SealCounters
from aeron_spark.handshake.errors import ErrorCode, HandshakeError, RemoteProtocolError
from aeron_spark.handshake.keystore import KeyStore
from aeron_spark.handshake.machine import (
    MAX_COOKIES,
    Rejected,
    ServerCore,
    ServerSession,
    SessionEvent,
)
from aeron_spark.handshake.messages import refuse_for
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler, TransportError
from aeron_spark.transport.driver.agents import DedicatedBudget
from aeron_spark.transport.protocol.publication import host_of
from aeron_spark.transport.protocol.receiver import source_prefix

log = logging.getLogger(__name__)
# What the handshake server's I/O shell exports in :meth:`Server.stats` beside the machine's
# ``ServerCounters`` (declared as counters of the registry: ``aeron-spark stat`` lists them);
# the first five are gauges (now), the rest counts since start
SERVER_STATS = (
    ("connections", "established handshake connections"),
    ("pending", "handshakes admitted, not yet connected"),
    ("pending_per_prefix", "pending handshakes per /24 or /64 (a map)"),
    ("hello_images", "open HELLO images (one per client driver and port)"),
    ("hello_images_waiting", "open UDP HELLO images that have not said HELLO yet"),
    ("reply_publications", "open reply publications of HELLO images"),
    ("hello_images_without_hello", "UDP HELLO images gone without one HELLO read"),
    ("reply_publications_failed", "HELLO images whose reply publication did not open"),
    ("reply_publications_closed_silent", "reply publications closed: their image fell silent"),
    ("reply_drops", "handshake replies dropped (back pressure or expired)"),
    ("pair_address_mismatches", "HELLOs whose reply address is not their image's"),
    ("amplification_drops", "sends refused by the driver's amplification ledger"),
    ("frames_opened", "sealed session frames opened"),
    ("frames_rejected", "sealed session frames rejected (the four below)"),
    ("frames_tampered", "sealed session frames that did not authenticate"),
    ("frames_replayed", "sealed session frames seen before"),
    ("frames_reordered", "sealed session frames out of order"),
    ("pongs_unsolicited", "session PONG frames no ping asked for (dropped, not kept)"),
)
for _name, _description in SERVER_STATS:
    REGISTRY.register(CounterType.HANDSHAKE_SERVER, _name, _description)
# The driver's counters of what strangers sent and the transport dropped, in :meth:`Server.stats`
TRANSPORT_REFUSALS = (
    "status_messages_refused",  # SMs from an address that may not be a destination (item 1)
    "status_messages_deferred",  # SETUP requests held until the host's HELLO (honest clients)
    "naks_refused",  # NAKs from an address that is not a destination (item 2)
    "data_wrong_source",  # DATA for an image from another source than its SETUP's (item 3)
    "setups_rejected",  # SETUPs asking for a bigger term or mtu than the channel takes (item 6)
    "images_refused",  # SETUPs past a subscription's image limits (item 6)
    "images_evicted",  # HELLO images without a valid HELLO evicted for a newcomer (28 item 5)
    "setups_rate_limited",  # SETUPs from one address past its rate (item 6)
    "images_created",
    "invalid_frames",
    # established sessions' client addresses given a socket of their own on the port, refused
    # one (at max_dedicated_sockets, or no descriptor), and those closed after their last session
    "dedicated_sockets_opened",
    "dedicated_sockets_refused",
    "dedicated_sockets_closed",
    "dedicated_sockets_over_share",  # of the refused: the client's address or key share full
)
_BIND_ATTEMPTS = 20
# HELLOs read from one HELLO image in one step (a client process with many handshakes in flight
# shares one image; the others get their turn in the same step)
HELLOS_PER_STEP = 8
# every connection is checked for a lost peer this often (closed ones are released at once)
REAP_INTERVAL_NS = 500_000_000
# A HELLO publication heartbeats every 100 ms while its process lives (a closed one ends its
# image at once): its image silent this long, with no handshake in flight on it, is a client
# process gone (killed, os._exit), and the image's reply publication is closed then rather than
# when the image's liveness (10 s) runs out; opened again should the image speak again
HELLO_SILENT_NS = 2_000_000_000


def _udp_port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def dedicated_share_address(host: str) -> str:
    """The client address a dedicated-socket share is counted under: an IPv4 address (IPv4-mapped
    ones as IPv4, ``host_of``) as it is, an IPv6 address as its /64, from which any one host may
    pick as many source addresses as it likes (as the HELLO and SETUP rates per /64)."""
    return host if ":" not in host else source_prefix((host, 0))


class _HelloInbox:
    """The HELLOs of one client's HELLO publication. Over UDP a client process keeps one HELLO
    publication per server for all its handshakes (see ``hello_channel.py``): every HELLO it
    carries is answered (the core's rate, pending and per-address limits bound them, per
    address and per /24 or /64, not per image), at most ``HELLOS_PER_STEP`` a step, on the
    image's own reply publication (``reply``, opened with the image: its one destination is
    the subscription at the image's address that names the image's session id). Over IPC a
    client opens one per handshake: the first HELLO and after each COOKIE one more (at most
    ``MAX_COOKIES`` times), then nothing (IPC images are polled, not signalled: a finished one
    is not polled again)."""

    __slots__ = (
        "image",
        "messages",
        "assembler",
        "done",
        "answered",
        "ipc",
        "address",
        "host",
        "reply",
        "silent_at",
    )

    def __init__(self, image: Any, ipc: bool = False) -> None:
        self.image = image
        self.ipc = ipc
        self.messages: deque[bytes] = deque()
        self.assembler = FragmentAssembler(lambda p, h: self.messages.append(bytes(p)))
        self.done = False
        self.answered = 0
        self.address = "ipc" if ipc else _address_of(image)
        self.host = "ipc" if ipc else host_of((self.address,))
        self.reply: Any = None  # UDP: this image's reply publication (None: not open)
        # the image's last packet when its reply publication was closed for its silence (None:
        # not closed so): opened again only once the image has spoken since
        self.silent_at: int | None = None


class _Pending:
    """I/O of a session between WELCOME and CONFIRM."""

    __slots__ = ("sub", "pub", "inbox", "assembler", "confirm", "welcome_sent")

    def __init__(self, sub: Any, pub: Any) -> None:
        self.sub = sub
        self.pub = pub
        self.inbox: deque[bytes] = deque()
        self.assembler = FragmentAssembler(lambda p, h: self.inbox.append(bytes(p)))
        self.confirm: bytes | None = None
        self.welcome_sent = False


class Server:
    """Accepts handshake sessions (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        driver: Driver | None = None,
        key_store: KeyStore | None = None,
        on_connect: Callable[[Connection], object] | None = None,
        on_message: Callable[[Connection, bytes], object] | None = None,
        on_disconnect: Callable[[Connection], object] | None = None,
        on_error: Callable[[Connection | None, BaseException], object] | None = None,
        authorize: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.config = config = config or ServerConfig()
        self.key_store = key_store or KeyStore(config.key_store_dir)
        # authorize(client static public key) -> may it connect (None: any client may)
        self.core = ServerCore(config, self.key_store.server_private_key(), authorize=authorize)
        self.public_key = self.core.static_public
        self._own_driver = driver is None
        self.driver = driver or Driver(DriverConfig(write_counters_file=False)).start()
        self.on_connect = on_connect
        self.on_message = on_message
        self.on_disconnect = on_disconnect
        self.on_error = on_error
        self._wakeup = threading.Event()
        # the one listener object each subscription gets (removed by that same object)
        self._wake_listener = self._wakeup.set
        # an invoker driver's select is where its owner waits: wake() ends it too
        self._wake_driver = self.driver.wake if self.driver.is_invoker else None
        # whether a wake-up was given (the flag itself: asked several times a wait)
        self.is_woken = self._wakeup.is_set
        self._hellos: dict[int, _HelloInbox] = {}
        # each HELLO subscription's images as the last full read saw them: a step with the
        # same images and none holding data reads nothing (issue 31: the read cost ~80 us a
        # step, and the stream server steps the handshake once per loop pass, about once per
        # request at 2,048 sessions)
        self._hello_images_seen: list[tuple[Any, ...] | None] = []
        # the earliest a UDP HELLO image with a reply publication may be found silent: a quiet
        # step (nothing new on the HELLO images) still walks them from then (HELLO_SILENT_NS)
        self._silence_due_ns: int | None = None
        # (reply publication, message, expiry ns: 0 over IPC)
        self._replies: deque[tuple[Any, bytes, int]] = deque()
        self.reply_publications_failed = 0  # HELLO images whose reply publication did not open
        self.reply_publications_closed_silent = 0  # closed: their HELLO image fell silent
        # UDP HELLO images gone without one HELLO read (a SETUP and nothing more: a flood of
        # SETUPs from many ports); none had a reply publication or was sent a reply
        self.hello_images_without_hello = 0
        self.pair_address_mismatches = 0
        self.connections: list[Connection] = []
        self._by_conn: dict[int, ServerSession] = {}
        # Per-session work only for what needs it (issue 31 item 1: each step walked every
        # session several times): the handshakes between WELCOME and their connection, the
        # connections closed since the last step (reaped at once), every connection checked for
        # a lost peer only every REAP_INTERVAL_NS, the IPC connections (they cannot signal)
        self._pairs: dict[ServerSession, None] = {}
        self._closing: deque[Connection] = deque()
        self._next_reap_ns = 0
        # how often every connection is walked for a lost peer: an owner that checks each
        # connection it was given itself and closes the lost ones (the stream server, once a
        # second each) sets it longer, the walk then only a safety net (issue 31 item 1: at
        # 2,048 idle sessions the walk, twice a second, was ~5% of the server's idle time)
        self.lost_peer_walk_ns = REAP_INTERVAL_NS
        # an owner that gives a connection whose publication lost its receiver a grace (the
        # stream server's lost grace: its client may be resubscribing) says which it spares:
        # the walk leaves those to the owner's own re-check (it closed them as any lost one)
        self.spares_lost: Callable[[Connection], bool] | None = None
        self._ipc_connections: set[int] = set()
        self.seal_counters = SealCounters()
        self._reply_of: dict[ServerSession, Any] = {}
        # the HELLO image each live handshake or session was admitted on, and how many of them
        # vouch for each image: an image is vouched while one lives, not forever (a host that
        # gets HELLOs admitted and lets them expire kept its images vouched: never evicted)
        self._vouch_of: dict[ServerSession, Any] = {}
        self._vouches: dict[int, int] = {}
        self.reply_drops = 0
        # client addresses that may get a socket of their own on the port (see channels.py)
        self._dedicated_limit = config.dedicated_socket_limit()
        # one budget for both ports, with each client address's and key's share of it
        self.dedicated_budget = DedicatedBudget(
            self._dedicated_limit, config.dedicated_shares(self._dedicated_limit)
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        try:
            self._open_listeners()
        except BaseException:
            if self._own_driver:
                self.driver.close()
            raise

    # ---------------------------------------------------------------- set-up

    def _open_listeners(self) -> None:
        cfg = self.config
        for _ in range(_BIND_ATTEMPTS):
            port = cfg.port
            if port == 0:
                with socket.socket(
                    socket.AF_INET6 if ":" in cfg.host else socket.AF_INET, socket.SOCK_DGRAM
                ) as probe:
                    probe.bind((cfg.host, 0))
                    port = probe.getsockname()[1]
            control = cfg.control_port if cfg.control_port is not None else port + 1
            if cfg.port == 0 and (control > 65535 or not _udp_port_free(cfg.host, control)):
                continue
            try:
                self._open_on(port, control)
                return
            except TransportError:
                if cfg.port != 0:
                    raise
        raise HandshakeError(f"no free pair of UDP ports on {cfg.host} for the handshake server")

    def _open_on(self, port: int, control: int) -> None:
        self.port, self.control_port = port, control
        self._listeners: list[tuple[Channels, Any, Any]] = []
        media = ("udp", "ipc") if self.config.ipc else ("udp",)
        try:
            for kind in media:
                channels = Channels(kind, self.config.host, port, control)
                # HELLO images are bounded like the handshakes they start: a stranger sending
                # SETUPs for new session ids gets no more images than its address may have
                # and as many new ones a second from one /24 or /64 as HELLOs it may say
                sub = self.driver.add_subscription(
                    channels.hello_sub(
                        2 * self.config.max_pending,
                        self.config.max_per_address,
                        max(1, round(self.config.hellos_per_prefix_per_s)),
                        self._dedicated_limit,
                    ),
                    channels.hello_stream,
                )
                try:
                    # over UDP every HELLO image gets a reply publication of its own (see
                    # _open_reply), so no client reads another's replies; this one, which
                    # takes no destination, binds the control port from the start
                    pub = self.driver.add_publication(
                        channels.reply_pub(dedicated=self._dedicated_limit), channels.reply_stream
                    )
                except BaseException:
                    sub.close()
                    raise
                self._listeners.append((channels, sub, pub))
                self._listen(sub)
        except BaseException:
            for _, sub, pub in self._listeners:
                sub.close()
                if pub is not None:
                    pub.close()
            raise
        self._hello_sub = self._listeners[0][1]

    def _listen(self, sub: Any) -> None:
        add = getattr(sub, "add_listener", None)
        if add is not None:
            add(self._wake_listener)

    def stop_waking_for(self, conn: Connection) -> None:
        """``conn``'s data and image changes no longer wake :meth:`wait`: its owner listens to
        its subscription itself (the stream server's loop, which queues the session and then
        wakes). With both, each message set the wake-up twice on the driver's thread (a lock
        and a notify each), the first time before the session was queued (issue 31)."""
        remove = getattr(conn.subscription, "remove_listener", None)
        if remove is not None:
            remove(self._wake_listener)

    @property
    def endpoint(self) -> str:
        return f"{_host(self.config.host)}:{self.port}"

    # ---------------------------------------------------------------- the loop step

    def accept(self, now_ns: int | None = None) -> list[Connection]:
        """Advance every handshake; the connections that completed. Never blocks."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        self._read_hellos(now)
        accepted = self._advance_pending()
        for session in self.core.expired(now):
            self._refuse_quietly(session, ErrorCode.HANDSHAKE_TIMEOUT, "handshake timed out")
            self._free(session, SessionEvent.TIMEOUT)
        self._flush_replies(now)
        self._reap(now)
        return accepted

    def _read_hellos(self, now_ns: int) -> None:
        seen = self._hello_images_seen
        if len(seen) != len(self._listeners):
            seen[:] = [None] * len(self._listeners)
        quiet = True
        for i, (_, sub, _) in enumerate(self._listeners):
            images = tuple(sub.images)
            if images != seen[i] or sub.has_data():
                quiet = False
            seen[i] = images
        if quiet and (self._silence_due_ns is None or now_ns < self._silence_due_ns):
            return  # no HELLO arrived, no image came or went, none may have fallen silent
        live: set[int] = set()
        due: int | None = None
        for channels, sub, shared_reply in self._listeners:
            images = sub.images
            live.update(id(image) for image in images)
            for image in images:
                inbox = self._hellos.get(id(image))
                if inbox is None:
                    inbox = self._hellos[id(image)] = _HelloInbox(image, channels.media == "ipc")
                if inbox.done:
                    continue
                if not inbox.ipc and self._silent(inbox, now_ns):
                    continue
                heard = inbox.image.last_packet_ns
                if inbox.reply is not None and heard is not None:  # checked again for silence
                    due = (
                        heard + HELLO_SILENT_NS
                        if due is None
                        else min(due, heard + HELLO_SILENT_NS)
                    )
                if (
                    inbox.reply is None
                    and not inbox.ipc
                    and not self.config.reply_on_hello_only
                    and self._open_reply(channels, inbox) is None
                ):
                    continue  # cannot be opened: this image's HELLOs go unanswered
                image.poll(inbox.assembler, HELLOS_PER_STEP)
                while inbox.messages and not inbox.done:
                    message = inbox.messages.popleft()
                    inbox.answered += 1
                    if inbox.ipc:
                        inbox.messages.clear()  # one HELLO per answer: the rest is not read
                        challenged = self._on_hello(
                            channels, shared_reply, "ipc", "ipc", message, now_ns
                        )
                        inbox.done = not challenged or inbox.answered > MAX_COOKIES
                        continue
                    # with reply_on_hello_only the image's reply publication is opened for its
                    # first HELLO, not for its SETUP: an image that never says HELLO (a SETUP
                    # flood from many ports) makes the server open nothing and send it nothing
                    # but Aeron's status messages. What is not a HELLO is refused silently (no
                    # connect key to answer to).
                    reply = inbox.reply
                    if reply is None and _is_hello(message):
                        reply = self._open_reply(channels, inbox)
                        if reply is None:
                            break  # cannot be opened: this image's HELLOs go unanswered
                    self._on_hello(
                        channels,
                        reply,
                        inbox.address,
                        image.source_identity,
                        message,
                        now_ns,
                        image,
                    )
        self._silence_due_ns = due
        for key in [k for k in self._hellos if k not in live]:
            gone = self._hellos.pop(key)
            if gone.reply is not None:
                gone.reply.close()
            if not gone.ipc and gone.answered == 0:
                self.hello_images_without_hello += 1

    def _silent(self, inbox: _HelloInbox, now_ns: int) -> bool:
        """Whether a UDP HELLO image's client is gone (see ``HELLO_SILENT_NS``): its reply
        publication is closed, once nothing in flight needs it (a handshake between its HELLO
        and its connection, a reply queued), and stays closed while the image says nothing."""
        heard = inbox.image.last_packet_ns
        if inbox.silent_at is not None:
            if heard == inbox.silent_at:
                return True
            inbox.silent_at = None  # it spoke again: a reply publication anew
            return False
        reply = inbox.reply
        if reply is None or heard is None or now_ns - heard < HELLO_SILENT_NS:
            return False
        if any(entry[0] is reply for entry in self._replies):
            return False  # a reply still to be offered
        if any(self._reply_of.get(session) is reply for session in self._pairs):
            return False  # a handshake waits for its connection: its refusal goes this way
        reply.close()  # what was offered drains (the publication lingers for it)
        inbox.reply = None
        inbox.silent_at = heard
        self.reply_publications_closed_silent += 1
        return True

    def _open_reply(self, channels: Channels, inbox: _HelloInbox) -> Any:
        """The reply publication of a UDP HELLO image (opened for its first HELLO): its one
        destination is the subscription at the image's address whose status messages name the
        image's session id (the client's reply subscription names its HELLO publication's
        session id), so a reply reaches the host that sent the HELLO and no other host; the
        cookie round trip then proves the client receives at its address. None if it cannot
        be opened (a clashing session id: that image's HELLOs are not answered, and counted)."""
        if inbox.reply is None and not inbox.done:
            try:
                inbox.reply = self.driver.add_publication(
                    channels.reply_pub(inbox.image.session_id, inbox.host), channels.reply_stream
                )
            except TransportError as exc:
                self.reply_publications_failed += 1
                inbox.done = True
                log.info("handshake server: no reply publication for %s: %s", inbox.address, exc)
        return inbox.reply

    def _on_hello(
        self,
        channels: Channels,
        reply: Any,
        address: str,
        source: str,
        data: bytes,
        now_ns: int,
        image: Any = None,
    ) -> bool:
        """Answer one HELLO; True if the answer is a COOKIE (the client may say HELLO again)."""
        try:
            session = self.core.on_hello(address, data, now_ns, source=source)
        except Rejected as rejected:
            if rejected.reply is not None:
                self._reply(reply, rejected.reply, address, now_ns)
            return rejected.code is None
        if image is not None:
            # a valid HELLO (its cookie or token echoed, admitted): its image is not evicted
            # for a newcomer while this handshake or its session lives; one that never got this
            # far is, oldest first (issue 28 item 5)
            image.vouch()
            self._vouch_of[session] = image
            self._vouches[id(image)] = self._vouches.get(id(image), 0) + 1
        self._reply_of[session] = reply
        try:
            session.transport = self._open_pair(channels, session)
            self._pairs[session] = None
        except (TransportError, OSError) as exc:
            log.warning("handshake server: cannot open a session for %s: %s", address, exc)
            self._reply(
                reply,
                refuse_for(
                    session.connect_key, ErrorCode.SERVER_FULL, f"cannot allocate: {exc}"
                ).encode(),
                address,
                now_ns,
            )
            self._free(session, SessionEvent.CLOSE)
            return False
        self._reply(reply, session.welcome, address, now_ns)
        return False

    def _reply(self, reply: Any, message: bytes, address: str, now_ns: int) -> None:
        """Queue a reply on the reply publication of the HELLO's image (over UDP it waits, up
        to the handshake timeout, until that image's client has joined it)."""
        expiry = 0 if address == "ipc" else now_ns + self.config.handshake_timeout_ns
        self._replies.append((reply, message, expiry))

    def _open_pair(self, channels: Channels, session: ServerSession) -> _Pending:
        d = session.details
        sub = self.driver.add_subscription(
            channels.c2s_sub(d, self.config.window()), d.c2s_stream_id
        )
        client = host_of((session.address,)) if channels.media == "udp" else None
        try:
            pub = self.driver.add_publication(channels.s2c_pub(d, client), d.s2c_stream_id)
        except BaseException:
            sub.close()
            raise
        self._listen(sub)
        return _Pending(sub, pub)

    def _advance_pending(self) -> list[Connection]:
        accepted = []
        for session in list(self._pairs):
            pending = session.transport
            if not isinstance(pending, _Pending):
                self._pairs.pop(session, None)
                continue
            if pending.confirm is None:
                if not self._pair_from_hello_address(session, pending):
                    self.pair_address_mismatches += 1
                    self._free(session, SessionEvent.BAD_DONE)
                    continue
                pending.sub.poll(pending.assembler, 4)
                if not pending.inbox:
                    continue
                try:
                    pending.confirm = self.core.on_done(session, pending.inbox.popleft())
                except (RemoteProtocolError, HandshakeError) as exc:
                    self._report(None, exc)
                    self._free(session, SessionEvent.BAD_DONE)
                    continue
            if pending.pub.offer(pending.confirm) < 0:
                continue  # not joined yet or back-pressured: try again on the next step
            conn = self._connection(session, pending)
            session.transport = conn
            self._pairs.pop(session, None)
            accepted.append(conn)
        return accepted

    @staticmethod
    def _pair_from_hello_address(session: ServerSession, pending: _Pending) -> bool:
        """Whether the client's session publication comes from the address of its HELLO (so
        a HELLO spoofed from an allowed address cannot open a session for another)."""
        if session.address == "ipc":
            return True
        want = host_of((session.address,))
        return all(host_of((_address_of(image),)) == want for image in pending.sub.images)

    def _connection(self, session: ServerSession, pending: _Pending) -> Connection:
        sealer = opener = None
        if session.details.encryption:
            sealer, opener = session.keys.server_sealer(self.seal_counters)
        image = pending.sub.images[0] if pending.sub.images else None
        peer = image.source_identity if image is not None else session.address
        conn = Connection(
            pending.pub,
            pending.sub,
            peer=peer,
            max_message_length=session.details.max_message_length,
            sealer=sealer,
            opener=opener,
            seal_counters=self.seal_counters,
            on_disconnect=self.on_disconnect,
            on_error=self._report,
            on_close=self._closing.append,
        )
        conn.client_key = session.client_key  # type: ignore[attr-defined]
        if session.address != "ipc":
            # it proved it receives at its address: no amplification bound towards it
            # (its two streams only: the session ids are secret, so no spoofer's frames share
            # the exemption, and the handshake channels towards that address stay bounded)
            trusted = (
                host_of((session.address,)),
                (session.details.c2s_session_id, session.details.s2c_session_id),
            )
            self.driver.trust_host(*trusted)
            conn.trusted_host = trusted
            # its datagrams on sockets of their own, out of a flood's reach (channels.py): what
            # it sends to the port, and its SMs and NAKs to the control port
            tags = (("address", dedicated_share_address(trusted[0])), ("key", session.client_key))
            for peer in (image, pending.pub):
                handle = (
                    self.driver.dedicate_socket(peer, self.dedicated_budget, tags)
                    if peer is not None
                    else None
                )
                if handle is not None:
                    conn.dedicated_sockets.append(handle)
        for frame in pending.inbox:  # whole frames the client sent right after DONE
            conn.deliver(frame)
        pending.inbox.clear()
        self.connections.append(conn)
        self._by_conn[id(conn)] = session
        if session.address == "ipc":
            self._ipc_connections.add(id(conn))
        if self.on_connect is not None:
            self.on_connect(conn)
        return conn

    def _refuse_quietly(self, session: ServerSession, code: ErrorCode, text: str) -> None:
        reply = self._reply_of.get(session)
        if reply is not None and not reply.is_closed:
            message = refuse_for(session.connect_key, code, text).encode()
            self._reply(reply, message, session.address, time.monotonic_ns())

    def _free(self, session: ServerSession, event: SessionEvent) -> None:
        resources = session.transport
        if isinstance(resources, _Pending):
            resources.pub.close()
            resources.sub.close()
        elif isinstance(resources, Connection):
            resources.close()
            self._distrust(resources)
        session.transport = None
        self._pairs.pop(session, None)
        self._reply_of.pop(session, None)
        self._unvouch(session)
        self.core.release(session, event)

    def _unvouch(self, session: ServerSession) -> None:
        """The handshake or session ``session`` ended: its HELLO image is evictable again once
        nothing else admitted on it lives."""
        image = self._vouch_of.pop(session, None)
        if image is None:
            return
        left = self._vouches.get(id(image), 0) - 1
        if left > 0:
            self._vouches[id(image)] = left
        else:
            self._vouches.pop(id(image), None)
            image.vouch(False)

    def _flush_replies(self, now_ns: int) -> None:
        """Offer the queued replies; one whose client has not joined its reply publication yet
        waits (until its handshake's timeout), the others go on."""
        held: deque[tuple[Any, bytes, int]] = deque()
        blocked: set[int] = set()  # reply publications back-pressured in this step
        while self._replies:
            entry = self._replies.popleft()
            reply, message, expiry = entry
            if reply.is_closed:
                self.reply_drops += 1  # its HELLO image went away
                continue
            if expiry and not reply.is_connected:
                if expiry <= now_ns:
                    self.reply_drops += 1  # its client never joined
                else:
                    held.append(entry)
                continue
            if id(reply) not in blocked and reply.offer(message) > 0:
                continue
            blocked.add(id(reply))
            held.append(entry)
        while len(held) > 4 * self.config.max_pending:
            held.popleft()  # nobody is listening and it keeps growing
            self.reply_drops += 1
        self._replies = held

    def _reap(self, now_ns: int) -> None:
        """Release the connections that are gone: those closed since the last step at once,
        and, every ``lost_peer_walk_ns`` (``REAP_INTERVAL_NS`` unless the owner checks its
        connections itself), those whose peer was lost (a walk of them all)."""
        closing = self._closing
        if now_ns >= self._next_reap_ns:
            self._next_reap_ns = now_ns + self.lost_peer_walk_ns
            closing.clear()
            gone = [c for c in self.connections if not c.is_connected]
            spares = self.spares_lost
            if spares is not None and gone:
                gone = [c for c in gone if c.is_closed or not c.awaits_receiver or not spares(c)]
        elif closing:
            gone = []
            while closing:
                conn = closing.popleft()
                if id(conn) in self._by_conn:  # not reaped yet
                    gone.append(conn)
        else:
            return
        for conn in gone:
            self._ipc_connections.discard(id(conn))
            session = self._by_conn.pop(id(conn), None)
            if not conn.is_closed and self.on_disconnect is not None and conn.take_lost_report():
                self.on_disconnect(conn)
            conn.close()
            self._distrust(conn)
            if session is not None:
                session.transport = None
                self._reply_of.pop(session, None)
                self._unvouch(session)
                self.core.release(session, SessionEvent.TRANSPORT_LOST)
            # Last, so that a connection no longer counted has given back all it held.
            self.connections.remove(conn)

    def _distrust(self, conn: Connection) -> None:
        trusted = conn.trusted_host
        if trusted is not None:
            conn.trusted_host = None
            self.driver.distrust_host(*trusted)
        handles, conn.dedicated_sockets = conn.dedicated_sockets, []
        for handle in handles:
            self.driver.release_socket(handle)

    def _report(self, conn: Connection | None, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(conn, exc)
        else:
            log.info("handshake server: %s", exc)

    # ---------------------------------------------------------------- waiting and threads

    def wait(self, timeout_s: float) -> None:
        """Sleep until a HELLO, a session message or an image change arrives (or the timeout)."""
        # The wake-up is cleared when a wait ends, not when one starts: a session's data that
        # arrived since the last wait (maybe after the caller's poll of it) returns at once,
        # with no look at every connection (issue 31 item 1: that look walked them all)
        timeout_s = self.wait_bound_s(timeout_s)
        driver = self.driver
        if driver.is_invoker:
            # the caller steps the driver (invoker mode): sleep in its select over the
            # transport's sockets, which wake() also ends (no driver thread to wait for)
            if timeout_s > 0:
                driver.idle(timeout_s, self._wakeup.is_set)
            self._wakeup.clear()
        elif timeout_s <= 0 or self._wakeup.wait(timeout_s):
            self._wakeup.clear()

    def wait_bound_s(self, timeout_s: float) -> float:
        """How long :meth:`wait` may sleep at most (0: a HELLO waits to be read): ``timeout_s``,
        or less for the handshake's own deadlines and the joins and IPC data nothing signals."""
        if any(sub.has_data() for _, sub, _ in self._listeners):
            return 0.0
        deadline = self.core.next_deadline_ns()
        if self.connections and (deadline is None or self._next_reap_ns < deadline):
            deadline = self._next_reap_ns  # the walk for lost peers (a caller may sleep long)
        if deadline is not None:
            timeout_s = min(timeout_s, max(deadline - time.monotonic_ns(), 0) / 1e9)
        if self.core.pending or self._replies:
            timeout_s = min(timeout_s, 0.005)  # pending sessions wait on joins we are not told of
        if self._ipc_connections or any(
            i.ipc and i.answered and not i.done for i in self._hellos.values()
        ):
            timeout_s = min(timeout_s, 0.001)  # IPC data has no cross-process wake-up
        return timeout_s

    def wake(self) -> None:
        """End :meth:`wait` now (any thread)."""
        self._wakeup.set()
        if self._wake_driver is not None:
            self._wake_driver()

    def take_wakeup(self) -> bool:
        """Whether a wake-up was given since the last :meth:`wait` (or this call), cleared: an
        owner that steps an invoker driver and then handles everything a wake-up can be for
        takes it, so its next :meth:`wait` does not end at once for what it already did."""
        if self._wakeup.is_set():
            self._wakeup.clear()
            return True
        return False

    def start(self) -> Server:
        """Run accept + poll on a thread, delivering through the callbacks."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="handshake-server", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.accept()
                busy = False
                for conn in list(self.connections):
                    for message in _drain(conn):
                        busy = True
                        if self.on_message is not None:
                            self.on_message(conn, message)
                if not busy:
                    self.wait(0.05)
            except Exception as exc:  # noqa: BLE001 - report and keep serving others
                self._report(None, exc)

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.core.shutting_down = True
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        for session in list(self.core.sessions):
            self._free(session, SessionEvent.CLOSE)
        for conn in self.connections:
            conn.close()
            self._distrust(conn)
        self.connections.clear()
        for inbox in self._hellos.values():
            if inbox.reply is not None:
                inbox.reply.close()
        self._hellos.clear()
        for _, sub, pub in self._listeners:
            sub.close()
            if pub is not None:
                pub.close()
        if self._own_driver:
            self.driver.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self, transport: dict[str, int] | None = None) -> dict[str, Any]:
        """The handshake's counts; ``transport``: the driver's counters snapshot when the caller
        has just taken one (a snapshot walks every stream: a stream server's stat took two)."""
        c = self.core.counters
        ledger = getattr(self.driver, "amplification", None)
        if transport is None:
            transport = self.driver.counters.snapshot()
        machine: dict[str, Any] = dict(REGISTRY.snapshot(CounterType.HANDSHAKE, c))
        machine["refused"] = dict(c.refused)
        shell = REGISTRY.snapshot(
            CounterType.HANDSHAKE_SERVER,
            {
                "connections": len(self.connections),
                "pending": self.core.pending,
                "pending_per_prefix": dict(self.core.pending_per_prefix),
                "hello_images": len(self._hellos),
                # live UDP HELLO images that have not said HELLO yet, and those gone without one
                "hello_images_waiting": sum(
                    not i.ipc and i.answered == 0 for i in self._hellos.values()
                ),
                "reply_publications": sum(i.reply is not None for i in self._hellos.values()),
                "hello_images_without_hello": self.hello_images_without_hello,
                "reply_publications_failed": self.reply_publications_failed,
                "reply_publications_closed_silent": self.reply_publications_closed_silent,
                "reply_drops": self.reply_drops,
                "pair_address_mismatches": self.pair_address_mismatches,
                "amplification_drops": ledger.drops if ledger is not None else 0,
                "frames_opened": self.seal_counters.opened,
                "frames_rejected": self.seal_counters.rejected(),
                "frames_tampered": self.seal_counters.tampered,
                "frames_replayed": self.seal_counters.replayed,
                "frames_reordered": self.seal_counters.reordered,
                "pongs_unsolicited": self.seal_counters.pongs_unsolicited,
            },
        )
        # what the transport under the server refused (the server's driver, all channels)
        refusals = REGISTRY.snapshot(
            CounterType.TRANSPORT, {name: transport.get(name, 0) for name in TRANSPORT_REFUSALS}
        )
        return {**shell, **machine, **refusals}


def _is_hello(data: bytes) -> bool:
    """Whether a message decodes as a HELLO (it has a connect key a reply can name)."""
    try:
        return isinstance(m.decode_message(data), m.Hello)
    except RemoteProtocolError:
        return False


def _address_of(image: Any) -> str:
    """The IP address an image's SETUP (and so all its data) came from."""
    return str(image.source_identity.rpartition(":")[0].strip("[]"))


def _drain(conn: Connection) -> list[bytes]:
    out: list[bytes] = []
    while True:
        message = conn.receive_nowait()
        if message is None:
            return out
        out.append(message)


__all__ = ["Server"]
