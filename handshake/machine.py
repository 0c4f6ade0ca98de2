"""Sans-I/O handshake state machines: bytes and ``now_ns`` in, bytes and decisions out.

Both sides are explicit transition tables (after h11): an input the table does not list for the
current state is a protocol error, raised as :class:`LocalProtocolError` when it is our own call
out of order and :class:`RemoteProtocolError` when the peer's message caused it; either way the
machine ends in ``FAILED`` (client) or ``CLOSED`` (server session) and frees what it held.

Client::

    IDLE --start--> JOINING --channels_ready/send HELLO--> HELLO_SENT
    HELLO_SENT --COOKIE (at most MAX_COOKIES; its server key checked)/send HELLO with the cookie
                and the sealed client identity--> HELLO_SENT
    HELLO_SENT --WELCOME ok--> OPENING --pair_ready/send DONE--> DONE_SENT --CONFIRM ok--> CONNECTED
    CONNECTED --close / peer close / transport lost--> CLOSED
    any unfinished --REFUSE / bad WELCOME / timeout / transport lost--> FAILED

Server admission (:class:`ServerCore`, stateless until the cookie is valid): a HELLO is rate
limited per /24 or /64, checked against deny/allow and the version, answered with a COOKIE unless
it carries a valid one for its source address and port (``ipc`` over IPC), then its sealed client
identity is opened and checked (``authorize``: an unlisted key is refused with CLIENT_UNKNOWN),
then the stateful limits (connect key in use, total, per address, pending per /24 or /64,
pending) and only then is it given ids and keys. Every address is normalised first
(``::ffff:a.b.c.d`` is ``a.b.c.d``).

Server session::

    WELCOMED --DONE ok--> CONNECTED --close / peer close / transport lost--> CLOSED
    WELCOMED --bad DONE / timeout / transport lost / close--> CLOSED
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from aeron_spark.counters import CounterType, counter_set
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig, parse_networks
from aeron_spark.handshake.crypto import (
    SessionKeys,
    client_keys,
    fingerprint,
    open_identity_keeping,
    public_bytes,
    seal_identity_keeping,
    server_keys,
)
from aeron_spark.handshake.errors import (
    EncryptionRequiredError,
    ErrorCode,
    HandshakeError,
    HandshakeTimeoutError,
    LocalProtocolError,
    RemoteProtocolError,
    refusal,
)
from aeron_spark.transport.protocol.prefix_rate import PrefixRateLimiter

# Aeron reserves session ids -1..1000 by default for publications given an explicit session-id.
RESERVED_SESSION_ID_LOW = -1
RESERVED_SESSION_ID_HIGH = 1000
MIN_SESSION_STREAM_ID = 0x10000
_ID_BYTES = 16  # one read of the system's random source per session: its four ids
MAX_COOKIES = 3  # COOKIEs a client answers in one handshake (a stale one gets a fresh one)
COOKIE_PERIOD_NS = 10_000_000_000  # a cookie is valid for 10-20 s
TOKEN_LIFETIME_NS = COOKIE_PERIOD_NS  # a resumption token is valid this long after its WELCOME
# Cookies and resumption tokens already spent (each admits one HELLO), and tokens issued, held
# until they expire; past this many the oldest are forgotten (a forgotten token gets a COOKIE)
_SPENT_LIMIT = 65536


class ClientState(enum.Enum):
    IDLE = "idle"
    JOINING = "joining"
    HELLO_SENT = "hello_sent"
    OPENING = "opening"
    DONE_SENT = "done_sent"
    CONNECTED = "connected"
    CLOSED = "closed"
    FAILED = "failed"


class ClientEvent(enum.Enum):
    START = "start"
    CHANNELS_READY = "channels_ready"
    WELCOME = "welcome"
    REFUSE = "refuse"
    PAIR_READY = "pair_ready"
    CONFIRM = "confirm"
    CLOSE = "close"
    PEER_CLOSED = "peer_closed"
    TRANSPORT_LOST = "transport_lost"
    TIMEOUT = "timeout"
    PROTOCOL_ERROR = "protocol_error"


_C = ClientState
_CE = ClientEvent
CLIENT_TRANSITIONS: dict[tuple[ClientState, ClientEvent], ClientState] = {
    (_C.IDLE, _CE.START): _C.JOINING,
    (_C.JOINING, _CE.CHANNELS_READY): _C.HELLO_SENT,
    (_C.HELLO_SENT, _CE.WELCOME): _C.OPENING,
    (_C.OPENING, _CE.PAIR_READY): _C.DONE_SENT,
    (_C.DONE_SENT, _CE.CONFIRM): _C.CONNECTED,
    (_C.CONNECTED, _CE.CLOSE): _C.CLOSED,
    (_C.CONNECTED, _CE.PEER_CLOSED): _C.CLOSED,
    (_C.CONNECTED, _CE.TRANSPORT_LOST): _C.CLOSED,
    (_C.CONNECTED, _CE.PROTOCOL_ERROR): _C.CLOSED,
    (_C.CLOSED, _CE.CLOSE): _C.CLOSED,
    (_C.FAILED, _CE.CLOSE): _C.FAILED,
}
for _state in (_C.JOINING, _C.HELLO_SENT, _C.OPENING, _C.DONE_SENT):
    for _event in (_CE.REFUSE, _CE.TIMEOUT, _CE.TRANSPORT_LOST, _CE.CLOSE, _CE.PROTOCOL_ERROR):
        CLIENT_TRANSITIONS[(_state, _event)] = _C.FAILED
CLIENT_TRANSITIONS[(_C.IDLE, _CE.CLOSE)] = _C.CLOSED

# Events a peer's message causes (an unknown pair with these is the peer's fault).
CLIENT_REMOTE_EVENTS = {_CE.WELCOME, _CE.REFUSE, _CE.CONFIRM, _CE.PEER_CLOSED}


class SessionState(enum.Enum):
    WELCOMED = "welcomed"
    CONNECTED = "connected"
    CLOSED = "closed"


class SessionEvent(enum.Enum):
    DONE = "done"
    BAD_DONE = "bad_done"
    CLOSE = "close"
    PEER_CLOSED = "peer_closed"
    TRANSPORT_LOST = "transport_lost"
    TIMEOUT = "timeout"
    PROTOCOL_ERROR = "protocol_error"


_S = SessionState
_SE = SessionEvent
SESSION_TRANSITIONS: dict[tuple[SessionState, SessionEvent], SessionState] = {
    (_S.WELCOMED, _SE.DONE): _S.CONNECTED,
    (_S.CLOSED, _SE.CLOSE): _S.CLOSED,
}
for _session_event in (
    _SE.BAD_DONE,
    _SE.CLOSE,
    _SE.TRANSPORT_LOST,
    _SE.TIMEOUT,
    _SE.PROTOCOL_ERROR,
):
    SESSION_TRANSITIONS[(_S.WELCOMED, _session_event)] = _S.CLOSED
for _session_event in (_SE.CLOSE, _SE.PEER_CLOSED, _SE.TRANSPORT_LOST, _SE.PROTOCOL_ERROR):
    SESSION_TRANSITIONS[(_S.CONNECTED, _session_event)] = _S.CLOSED
SESSION_REMOTE_EVENTS = {_SE.DONE, _SE.BAD_DONE, _SE.PEER_CLOSED}


def _step(
    table: Mapping[tuple[Any, Any], Any],
    state: enum.Enum,
    event: enum.Enum,
    remote: set[Any],
    what: str,
) -> enum.Enum:
    try:
        return table[(state, event)]
    except KeyError:
        error = RemoteProtocolError if event in remote else LocalProtocolError
        raise error(f"{what}: {event.value!r} is not allowed in state {state.value!r}") from None


# ============================================================================ client

_STAGE_HINTS = {
    "joining": "no server answers; is it running, and are its UDP port and port + 1 reachable?",
    "hello_sent": "the server got no HELLO or its reply was lost",
    "opening": "the private session streams did not connect (a firewall on the server's ports?)",
    "done_sent": "the server did not confirm the session",
}


class ClientHandshake:
    """One client handshake (sans-I/O). The I/O layer calls, in order:

    ``start(now_ns)``; ``hello()`` once the reply channel is joined and the HELLO publication is
    connected; ``on_reply(bytes)`` for every message on the reply channel until it returns the
    :class:`~.messages.SessionDetails`; ``done()`` once the private pair is open; ``on_confirm``
    with the first message on the pair. ``check_timeout(now_ns)`` at any time.
    ``check_server_key(spk)`` is called with the server's static key (from its COOKIE) before the
    client's identity is sealed for it, and raises to refuse it. ``static_key`` is the client's
    identity (None: a fresh one, for tests: no server that checks keys will list it).
    """

    def __init__(
        self,
        check_server_key: Callable[[bytes], None],
        *,
        static_key: X25519PrivateKey | None = None,
        encryption: bool = True,
        timeout_ns: int = 10_000_000_000,
        endpoint: str = "",
    ) -> None:
        self.state = ClientState.IDLE
        self._check_server_key = check_server_key
        self.endpoint = endpoint
        self.encryption = encryption
        self.timeout_ns = timeout_ns
        self.deadline_ns = 0
        self.connect_key = secrets.randbelow(m.MAX_CONNECT_KEY) + 1
        self._ephemeral = X25519PrivateKey.generate()
        self._static = static_key if static_key is not None else X25519PrivateKey.generate()
        self.static_public = public_bytes(self._static)
        self._hello = b""
        self.retry_hello: bytes | None = None  # a HELLO with the server's cookie, to send
        self.cookies = 0
        self.keys: SessionKeys | None = None
        self.details: m.SessionDetails | None = None
        self.server_key: bytes | None = None
        self._resumed = False  # the first HELLO carried a resumption token
        self.ignored_replies = 0
        self._known: tuple[bytes, tuple[bytes, bytes] | None] | None = None

    def _fire(self, event: ClientEvent) -> None:
        try:
            self.state = _step(  # type: ignore[assignment]
                CLIENT_TRANSITIONS, self.state, event, CLIENT_REMOTE_EVENTS, "client handshake"
            )
        except HandshakeError:
            self.state = ClientState.FAILED
            raise

    def start(self, now_ns: int) -> None:
        self._fire(ClientEvent.START)
        self.deadline_ns = now_ns + self.timeout_ns

    def hello(self, resume: tuple[bytes, bytes] | None = None) -> bytes:
        """The first HELLO; with ``resume`` = (resumption token, server key) of an earlier
        WELCOME to this client's source, a HELLO with that token and our identity sealed for
        that key (the server's key checked again first): no COOKIE round trip if it is valid."""
        self._fire(ClientEvent.CHANNELS_READY)
        if resume is None:
            self._hello = m.Hello(
                m.PROTOCOL_VERSION, self.connect_key, public_bytes(self._ephemeral), self.encryption
            ).encode()
            return self._hello
        token, server_key = resume
        try:
            self._check_server_key(server_key)
        except HandshakeError:
            self._fire(ClientEvent.PROTOCOL_ERROR)
            raise
        self.server_key = server_key
        self._resumed = True
        self._hello = self._hello_with(token, server_key)
        return self._hello

    def _hello_with(self, cookie: bytes, server_key: bytes) -> bytes:
        box, known = seal_identity_keeping(
            self._ephemeral, self._static, server_key, self.connect_key, cookie
        )
        self._known = (server_key, known)  # its X25519 results, for the key schedule
        return m.Hello(
            m.PROTOCOL_VERSION,
            self.connect_key,
            public_bytes(self._ephemeral),
            self.encryption,
            cookie,
            box,
        ).encode()

    def on_reply(self, data: bytes) -> m.SessionDetails | None:
        """Handle one reply-channel message: None if it is not for us (or not yet decisive).

        A COOKIE for us sets :attr:`retry_hello`, the HELLO to send again (the I/O layer sends
        it and sets the attribute back to None); later messages are answers to that HELLO.
        """
        try:
            message = m.decode_message(data)
        except RemoteProtocolError:
            self.ignored_replies += 1  # another client's business or garbage: not ours to fail on
            return None
        if (
            not isinstance(message, m.Welcome | m.Refuse | m.Cookie)
            or message.connect_key != self.connect_key
        ):
            self.ignored_replies += 1
            return None
        if self.state is not ClientState.HELLO_SENT:
            self.ignored_replies += 1
            return None
        if isinstance(message, m.Cookie):
            if self.cookies >= MAX_COOKIES:
                self.ignored_replies += 1  # a server (or someone) that never admits us: time out
                return None
            if self._resumed and self.cookies == 0 and message.server_key != self.server_key:
                self.server_key = None  # our token was from another key: check this one
            if self.server_key is not None and message.server_key != self.server_key:
                self.ignored_replies += 1  # another server key than the one we checked: forged
                return None
            if self.server_key is None:
                try:
                    self._check_server_key(message.server_key)
                except HandshakeError:
                    self._fire(ClientEvent.PROTOCOL_ERROR)
                    raise
                self.server_key = message.server_key
            self.cookies += 1
            self._hello = self.retry_hello = self._hello_with(message.cookie, message.server_key)
            return None
        if isinstance(message, m.Refuse):
            self._fire(ClientEvent.REFUSE)
            raise refusal(message.code, message.message, self.endpoint)
        if self.server_key is None or message.server_key != self.server_key:
            # A WELCOME before we sent our identity, or from another key than the COOKIE's.
            self.ignored_replies += 1
            return None
        try:
            known = self._known
            keys = client_keys(
                self._ephemeral,
                self._static,
                self._hello,
                message.server_key,
                message.ephemeral_key,
                known[1] if known is not None and known[0] == message.server_key else None,
            )
            details = m.SessionDetails.decode(keys.open_details(message.box))
        except RemoteProtocolError:
            # Sealed for someone else (a spoofed HELLO reused our connect key): not ours.
            self.ignored_replies += 1
            return None
        try:
            if self.encryption and not details.encryption:
                # Only the key holder can seal this, but a client that asked for sealing never
                # sends its data in the clear, whoever offers it.
                raise EncryptionRequiredError(
                    "this client asked for a sealed session and the server offered one with "
                    "encryption=false; connect with encryption=False to accept plain sessions",
                    self.endpoint,
                )
        except HandshakeError:
            self._fire(ClientEvent.PROTOCOL_ERROR)
            raise
        self._fire(ClientEvent.WELCOME)
        self.keys, self.details = keys, details
        return details

    def done(self) -> bytes:
        self._fire(ClientEvent.PAIR_READY)
        assert self.keys is not None
        return m.Done(self.keys.done_proof()).encode()

    def on_confirm(self, data: bytes) -> None:
        assert self.keys is not None or self.state is not ClientState.DONE_SENT
        try:
            message = m.decode_message(data)
            if not isinstance(message, m.Confirm):
                raise RemoteProtocolError(f"expected CONFIRM, got {type(message).__name__}")
            assert self.keys is not None
            if not SessionKeys.proofs_equal(message.proof, self.keys.confirm_proof()):
                raise RemoteProtocolError("CONFIRM's proof does not match our keys")
        except RemoteProtocolError:
            self._fire(ClientEvent.PROTOCOL_ERROR)
            raise
        self._fire(ClientEvent.CONFIRM)

    def check_timeout(self, now_ns: int) -> None:
        if self.state in (ClientState.CONNECTED, ClientState.CLOSED, ClientState.FAILED):
            return
        if self.state is not ClientState.IDLE and now_ns >= self.deadline_ns:
            stage = self.state.value
            self._fire(ClientEvent.TIMEOUT)
            raise HandshakeTimeoutError(
                f"no answer within {self.timeout_ns / 1e9:g} s (stuck in {stage}): "
                + _STAGE_HINTS.get(stage, "the server stopped answering"),
                self.endpoint,
            )

    def fail(self, event: ClientEvent = ClientEvent.TRANSPORT_LOST) -> None:
        if self.state not in (ClientState.CLOSED, ClientState.FAILED):
            self._fire(event)

    def close(self) -> None:
        self._fire(ClientEvent.CLOSE)


# ============================================================================ server


@dataclass(eq=False)
class ServerSession:
    """One client's allocation on the server: ids, keys and its state (sans-I/O)."""

    address: str
    connect_key: int
    details: m.SessionDetails
    keys: SessionKeys
    welcome: bytes
    deadline_ns: int
    state: SessionState = SessionState.WELCOMED
    transport: object = None  # the I/O layer's resources for this session
    released: bool = False
    pending: bool = True  # counted in ServerCore.pending until DONE or release
    prefix: str = ""  # the /24 or /64 the address is accounted in
    client_key: bytes = b""  # the client's static public key (proven by DONE)

    def fire(self, event: SessionEvent) -> None:
        try:
            self.state = _step(  # type: ignore[assignment]
                SESSION_TRANSITIONS, self.state, event, SESSION_REMOTE_EVENTS, "server session"
            )
        except HandshakeError:
            self.state = SessionState.CLOSED
            raise

    def on_done(self, data: bytes) -> bytes:
        """Check DONE; the CONFIRM to send back. Raises :class:`RemoteProtocolError` if bad."""
        try:
            message = m.decode_message(data)
            if not isinstance(message, m.Done):
                raise RemoteProtocolError(f"expected DONE, got {type(message).__name__}")
            if not SessionKeys.proofs_equal(message.proof, self.keys.done_proof()):
                raise RemoteProtocolError("DONE's proof does not match the session keys")
        except RemoteProtocolError:
            self.fire(SessionEvent.BAD_DONE)
            raise
        self.fire(SessionEvent.DONE)
        return m.Confirm(self.keys.confirm_proof()).encode()


@counter_set(CounterType.HANDSHAKE)
@dataclass
class ServerCounters:
    """A handshake server's admission counts (``refused`` is keyed by :class:`ErrorCode` name)."""

    hellos: int = 0
    malformed: int = 0
    accepted: int = 0
    connected: int = 0
    bad_done: int = 0
    expired: int = 0
    closed: int = 0
    cookies_sent: int = 0  # HELLOs answered with a COOKIE (nothing allocated)
    cookies_bad: int = 0  # HELLOs with a cookie that is not valid (forged, stale, other source)
    resumed: int = 0  # HELLOs admitted on the resumption token of an earlier WELCOME (no COOKIE)
    cookies_reused: int = 0  # HELLOs with a cookie or token already spent, or another key's token
    rate_limited: int = 0  # HELLOs past their /24's or /64's rate (not admitted)
    # of those, answered REFUSE TOO_MANY_PENDING ("busy, retry later"; the rest unanswered)
    rate_limited_answered: int = 0
    identities_bad: int = 0  # HELLOs whose sealed client identity does not open
    clients_refused: int = 0  # HELLOs from a client key that is not authorised (CLIENT_UNKNOWN)
    refused: Counter[str] = field(default_factory=Counter)  # by ErrorCode name


_BUSY_TEXT = "busy: HELLOs of this network past their rate, retry later"


class Rejected(Exception):
    """A HELLO the server answers with REFUSE (``reply``), allocating nothing; ``code`` None is
    a HELLO answered with a COOKIE (the client may send its HELLO again with it)."""

    def __init__(self, code: ErrorCode | None, reply: bytes | None) -> None:
        super().__init__(code.name if code is not None else "COOKIE")
        self.code = code
        self.reply = reply


# Pure functions of the address string, asked several times per HELLO (admission, rate
# limits, cookie): parsed once per address (ipaddress costs ~0.1 ms a parse). Bounded: a flood
# of addresses only turns the cache over.
@functools.lru_cache(maxsize=4096)
def normalise_address(address: str) -> str:
    """``address`` as every check sees it: brackets dropped, an IPv4-mapped IPv6 address
    (``::ffff:a.b.c.d``, how a server on ``::`` sees IPv4 clients) as plain IPv4."""
    import ipaddress

    bare = address.strip("[]")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return bare
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _mapped_as_ipv4(networks: tuple[Any, ...]) -> tuple[Any, ...]:
    """Ranges written as IPv4-mapped IPv6 (``::ffff:10.0.0.0/104``) as the IPv4 ranges they are,
    since the addresses they are matched against are normalised (:func:`normalise_address`)."""
    import ipaddress

    mapped = ipaddress.ip_network("::ffff:0:0/96")
    out = []
    for net in networks:
        if net.version == 6 and net.subnet_of(mapped):
            v4 = net.network_address.ipv4_mapped
            net = ipaddress.ip_network(f"{v4}/{net.prefixlen - 96}")
        out.append(net)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _ip_of(address: str) -> Any:
    """The normalised address as an ``ipaddress`` object; None if it is not an IP address."""
    import ipaddress

    try:
        return ipaddress.ip_address(normalise_address(address))
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def address_prefix(address: str) -> str:
    """The network an address is accounted in: its /24 (IPv4) or /64 (IPv6)."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(normalise_address(address))
    except ValueError:
        return address
    bits = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


@functools.lru_cache(maxsize=4096)
def address_share(address: str) -> str:
    """What an address's connections are counted under (``max_per_address``): an IPv4 address
    (an IPv4-mapped one too) as it is, an IPv6 address as its /64, from which any one host may
    pick as many source addresses as it likes (so its connections went uncounted past the
    limit, one address each); as the pending handshakes, HELLO rates and dedicated sockets."""
    ip = _ip_of(address)
    if ip is None:
        return address
    return str(ip) if ip.version == 4 else address_prefix(address)


class ServerCore:
    """Admission, allocation and key agreement for a handshake server (sans-I/O).

    Invariant: every id and per-address slot taken in :meth:`on_hello` is given back exactly once by
    :meth:`release`, whatever way the session ends.
    """

    def __init__(
        self,
        config: ServerConfig,
        static_key: X25519PrivateKey,
        *,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
        authorize: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.config = config
        # ``authorize(client static public key)``: may it connect? None: any client may.
        self.authorize = authorize
        self.static_key = static_key
        self.static_public = public_bytes(static_key)
        self._allow = _mapped_as_ipv4(parse_networks("allow", config.allow))
        self._deny = _mapped_as_ipv4(parse_networks("deny", config.deny))
        # session and stream ids: 4 bytes each from one read of ``_ID_BYTES`` bytes per session
        self._random_bytes = random_bytes
        self._id_pool = b""
        self.sessions: set[ServerSession] = set()
        self.pending = 0
        # the sessions still pending (WELCOME sent, no DONE yet): what expiry and deadlines
        # look at, never every established session (issue 31 item 1)
        self._pending_sessions: dict[ServerSession, None] = {}
        self.per_address: Counter[str] = Counter()
        # sessions (connected + pending) per client key; limited only when ``authorize`` is set
        self.per_key: Counter[bytes] = Counter()
        self.pending_per_prefix: Counter[str] = Counter()
        self._cookie_secret = secrets.token_bytes(32)
        # resumption tokens issued: token -> (source, client key, expiry ns), oldest first
        self._tokens: dict[bytes, tuple[str, bytes, int]] = {}
        # cookies that admitted a HELLO: cookie -> expiry ns, oldest first (each admits one)
        self._spent: dict[bytes, int] = {}
        self._hello_rate = PrefixRateLimiter(config.hellos_per_prefix_per_s)
        # HELLOs past that rate answered "busy" (REFUSE TOO_MANY_PENDING), as many at most
        self._busy_rate = PrefixRateLimiter(config.hellos_per_prefix_per_s)
        self.session_ids: set[int] = set()
        self.stream_ids: set[int] = set()
        self.connect_keys: set[int] = set()
        self.counters = ServerCounters()
        self.shutting_down = False

    # ---------------------------------------------------------------- admission

    def address_allowed(self, address: str) -> bool:
        if address == "ipc":
            return True
        ip = _ip_of(address)
        if ip is None:
            return False
        if any(ip in net for net in self._deny):
            return False
        return not self._allow or any(ip in net for net in self._allow)

    def on_hello(
        self, address: str, data: bytes, now_ns: int, *, source: str | None = None
    ) -> ServerSession:
        """Admit a HELLO from ``address`` or raise :class:`Rejected` (reply None: stay silent).

        ``source`` is where the HELLO came from, address and port (None: ``address``); the
        cookie is bound to it. Over IPC (``address`` "ipc") there is no cookie round trip.
        """
        self.counters.hellos += 1
        address = normalise_address(address)
        prefix = address_prefix(address)
        if address != "ipc" and not self._hello_rate.allows(prefix, now_ns):
            self.counters.rate_limited += 1
            raise Rejected(ErrorCode.TOO_MANY_PENDING, self._busy(prefix, data, now_ns))
        try:
            hello = m.decode_message(data)
            if not isinstance(hello, m.Hello):
                raise RemoteProtocolError(f"expected HELLO, got {type(hello).__name__}")
        except RemoteProtocolError:
            # Without a connect key there is nobody to address a refusal to.
            self.counters.malformed += 1
            self._refused(ErrorCode.MALFORMED)
            raise Rejected(ErrorCode.MALFORMED, None) from None
        ck = hello.connect_key
        source = source or address
        code, text = self._stateless_admission(address, hello)
        client_key = b""
        token = None
        known: tuple[bytes, bytes] | None = None
        if code is None:
            token = self._check_cookie(source, hello, data, now_ns)
            code, text, client_key, known = self._identity(hello)
            if code is None and token is not None:
                self._check_token_key(source, hello, client_key, token, now_ns)
        if code is None:
            code, text = self._admission(address, prefix, hello, client_key)
        if code is not None:
            self._refused(code)
            raise Rejected(code, m.refuse_for(ck, code, text).encode())
        self._spend(source, hello, token, now_ns)
        ephemeral = X25519PrivateKey.generate()
        try:
            keys = server_keys(
                self.static_key, ephemeral, hello.public_key, client_key, data, known
            )
        except RemoteProtocolError as exc:
            self.counters.malformed += 1
            self._refused(ErrorCode.MALFORMED)
            raise Rejected(
                ErrorCode.MALFORMED, m.refuse_for(ck, ErrorCode.MALFORMED, str(exc)).encode()
            ) from None
        details = m.SessionDetails(
            c2s_session_id=self._new_session_id(),
            c2s_stream_id=self._new_stream_id(),
            s2c_session_id=self._new_session_id(),
            s2c_stream_id=self._new_stream_id(),
            # over UDP a plain session's only protection is its secret session id: sealed
            # anyway unless the network is declared trusted (allow_plain_udp)
            encryption=self.config.encryption
            or hello.encryption
            or (address != "ipc" and not self.config.allow_plain_udp),
            max_message_length=self.config.max_message_length,
            term_length=self.config.session_term_length,
            mtu=self.config.mtu,
            resume_token=self._resume_token(source, client_key, now_ns),
        )
        welcome = m.Welcome(
            ck, self.static_public, public_bytes(ephemeral), keys.seal_details(details.encode())
        ).encode()
        session = ServerSession(
            address=address,
            connect_key=ck,
            details=details,
            keys=keys,
            welcome=welcome,
            deadline_ns=now_ns + self.config.handshake_timeout_ns,
            prefix=prefix,
            client_key=client_key,
        )
        self.sessions.add(session)
        self._pending_sessions[session] = None
        self.pending += 1
        self.pending_per_prefix[prefix] += 1
        self.per_address[address_share(address)] += 1
        self.per_key[client_key] += 1
        self.connect_keys.add(ck)
        self.counters.accepted += 1
        return session

    def _busy(self, prefix: str, data: bytes, now_ns: int) -> bytes | None:
        """The answer to a HELLO past its network's rate: REFUSE ``TOO_MANY_PENDING`` ("busy,
        retry later": the client backs off and tries again instead of waiting out its whole
        timeout), or None (dropped unanswered). Nothing is kept for its sender; the answer is
        never longer than the HELLO, and at most ``hellos_per_prefix_per_s`` HELLOs of a /24 or
        /64 are answered so a second (beside as many answered in full): past both, silence."""
        if not self._busy_rate.allows(prefix, now_ns):
            return None
        try:
            hello = m.decode_message(data)
        except RemoteProtocolError:
            return None
        if not isinstance(hello, m.Hello):
            return None
        reply = m.refuse_for(hello.connect_key, ErrorCode.TOO_MANY_PENDING, _BUSY_TEXT).encode()
        if len(reply) > len(data):
            return None  # never more bytes back than it sent
        self.counters.rate_limited_answered += 1
        return reply

    def _stateless_admission(self, address: str, hello: m.Hello) -> tuple[ErrorCode | None, str]:
        """Checks that need no state: answered before the cookie round trip."""
        if self.shutting_down:
            return ErrorCode.SHUTTING_DOWN, "the server is shutting down"
        if not self.address_allowed(address):
            return ErrorCode.ADDRESS_DENIED, f"address {address} is not allowed"
        if hello.version != m.PROTOCOL_VERSION:
            return (
                ErrorCode.UNSUPPORTED_VERSION,
                f"protocol version {hello.version} is not supported (this server speaks "
                f"{m.PROTOCOL_VERSION})",
            )
        return None, ""

    def _identity(
        self, hello: m.Hello
    ) -> tuple[ErrorCode | None, str, bytes, tuple[bytes, bytes] | None]:
        """The client's static key out of a HELLO with a valid cookie, checked against
        ``authorize`` (before anything is allocated)."""
        if not hello.identity:
            self.counters.identities_bad += 1
            return (
                ErrorCode.MALFORMED,
                "a HELLO with a cookie must carry the client identity",
                b"",
                None,
            )
        try:
            client_key, known = open_identity_keeping(
                self.static_key, hello.public_key, hello.connect_key, hello.cookie, hello.identity
            )
        except RemoteProtocolError as exc:
            self.counters.identities_bad += 1
            return ErrorCode.MALFORMED, str(exc), b"", None
        if self.authorize is not None and not self.authorize(client_key):
            self.counters.clients_refused += 1
            return (
                ErrorCode.CLIENT_UNKNOWN,
                f"client key {fingerprint(client_key)} is not authorised on this server "
                "(show it with 'aeron-spark keys show --client' and have it added to the "
                "server's authorized keys)",
                b"",
                None,
            )
        return None, "", client_key, known

    def _mac(self, label: bytes, *parts: bytes) -> bytes:
        """HMAC-SHA256 under the cookie secret of ``label`` then each part, length-prefixed,
        cut to a cookie's length."""
        mac = hmac.new(self._cookie_secret, label, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(len(part).to_bytes(2, "big") + part)
        return mac.digest()[: m.COOKIE_LENGTH]

    def _cookie(self, source: str, hello: m.Hello, epoch: int) -> bytes:
        return self._mac(
            b"",
            source.encode(),
            hello.connect_key.to_bytes(8, "big"),
            hello.public_key,
            bytes([hello.encryption]),
            epoch.to_bytes(8, "big", signed=True),
        )

    def _forget_expired(self, table: dict[bytes, Any], now_ns: int) -> None:
        """Drop a table's expired entries (oldest first) and, past ``_SPENT_LIMIT``, the oldest."""
        while table:
            oldest = next(iter(table))
            entry = table[oldest]
            expiry = entry if isinstance(entry, int) else entry[2]
            if expiry > now_ns and len(table) < _SPENT_LIMIT:
                return
            del table[oldest]

    def _resume_token(self, source: str, client_key: bytes, now_ns: int) -> bytes:
        """A WELCOME's resumption token (sent sealed): 16 random bytes the server remembers,
        for one HELLO from ``source`` by the holder of ``client_key`` within
        ``TOKEN_LIFETIME_NS`` (over IPC none is kept: IPC never skips its COOKIE round)."""
        token = secrets.token_bytes(m.COOKIE_LENGTH)
        if source != "ipc":
            self._forget_expired(self._tokens, now_ns)
            self._tokens[token] = (source, client_key, now_ns + TOKEN_LIFETIME_NS)
        return token

    def _check_cookie(
        self, source: str, hello: m.Hello, hello_bytes: bytes, now_ns: int
    ) -> tuple[str, bytes, int] | None:
        """Return if ``hello`` carries a cookie valid for ``source`` and not spent (None), or a
        resumption token issued for that source (its entry, checked against the client key
        once the identity is open), else raise the COOKIE."""
        epoch = now_ns // COOKIE_PERIOD_NS
        if hello.cookie:
            issued = self._tokens.get(hello.cookie)
            if issued is not None and issued[0] == source and issued[2] > now_ns:
                return issued
            if not any(
                hmac.compare_digest(hello.cookie, self._cookie(source, hello, valid))
                for valid in (epoch, epoch - 1)
            ):
                self.counters.cookies_bad += 1
            elif hello.cookie in self._spent:
                self.counters.cookies_reused += 1  # a replayed HELLO
            else:
                return None
        self.counters.cookies_sent += 1
        reply = m.Cookie(
            hello.connect_key, self._cookie(source, hello, epoch), self.static_public
        ).encode()
        if len(reply) > len(hello_bytes):
            self.counters.malformed += 1  # unpadded: never more bytes back than it sent
            raise Rejected(ErrorCode.MALFORMED, None)
        raise Rejected(None, reply)

    def _check_token_key(
        self,
        source: str,
        hello: m.Hello,
        client_key: bytes,
        token: tuple[str, bytes, int],
        now_ns: int,
    ) -> None:
        """A resumption token admits only the client key it was issued to: another key (a
        sniffed token) gets a COOKIE, and the token stays for its owner."""
        if hmac.compare_digest(token[1], client_key):
            return
        self.counters.cookies_reused += 1
        self.counters.cookies_sent += 1
        cookie = self._cookie(source, hello, now_ns // COOKIE_PERIOD_NS)
        raise Rejected(None, m.Cookie(hello.connect_key, cookie, self.static_public).encode())

    def _spend(
        self, source: str, hello: m.Hello, token: tuple[str, bytes, int] | None, now_ns: int
    ) -> None:
        """The cookie or token of an admitted HELLO admits no other (a replay gets a COOKIE)."""
        if token is not None:
            del self._tokens[hello.cookie]
            self.counters.resumed += 1
        elif source != "ipc":
            self._forget_expired(self._spent, now_ns)
            self._spent[hello.cookie] = now_ns + 2 * COOKIE_PERIOD_NS

    def _admission(
        self, address: str, prefix: str, hello: m.Hello, client_key: bytes
    ) -> tuple[ErrorCode | None, str]:
        cfg = self.config
        if hello.connect_key in self.connect_keys:
            return ErrorCode.MALFORMED, "connect key already in use"
        if len(self.sessions) >= cfg.max_clients:
            return ErrorCode.SERVER_FULL, f"the server is full ({cfg.max_clients} clients)"
        share = address_share(address)
        if self.per_address[share] >= cfg.max_per_address:
            network = "" if share == address else f" (its network {share}, counted as one)"
            return (
                ErrorCode.TOO_MANY_FROM_ADDRESS,
                f"{address}{network} already has {cfg.max_per_address} connections",
            )
        # Only listed keys are a client's identity: without ``authorize`` anyone may make a
        # key per session, so a per-key limit would bound nothing (the others still apply).
        if self.authorize is not None and self.per_key[client_key] >= cfg.key_limit:
            return (
                ErrorCode.TOO_MANY_FOR_KEY,
                f"client key {fingerprint(client_key)} already has {cfg.key_limit} sessions, "
                "the most one client key may hold on this server (max_per_key)",
            )
        if address != "ipc" and self.pending_per_prefix[prefix] >= cfg.max_pending_per_prefix:
            # pending: handshakes in flight, a moment's limit (clients retry it, with backoff),
            # unlike the connections above
            return (
                ErrorCode.TOO_MANY_PENDING,
                f"{prefix} already has {cfg.max_pending_per_prefix} handshakes pending",
            )
        if self.pending >= cfg.max_pending:
            return ErrorCode.TOO_MANY_PENDING, f"{cfg.max_pending} handshakes already pending"
        return None, ""

    def _refused(self, code: ErrorCode) -> None:
        self.counters.refused[code.name] += 1

    def _id_word(self) -> int:
        """32 secret random bits: four bytes of a pool filled by one read per session (a
        session takes four ids; a rare rejected draw takes four more)."""
        pool = self._id_pool
        if len(pool) < 4:
            pool = self._random_bytes(_ID_BYTES)
        self._id_pool = pool[4:]
        return int.from_bytes(pool[:4], "little")

    def _new_session_id(self) -> int:
        """A session id, uniform over the int32s that are neither reserved nor in use."""
        while True:
            sid = self._id_word() - 2**31
            if (
                not RESERVED_SESSION_ID_LOW <= sid <= RESERVED_SESSION_ID_HIGH
                and sid not in self.session_ids
            ):
                self.session_ids.add(sid)
                return sid

    def _new_stream_id(self) -> int:
        """A stream id, uniform over MIN_SESSION_STREAM_ID..2**31-1 less the handshake's own
        streams and those in use (31 bits, drawn again below the minimum: no modulo bias)."""
        while True:
            sid = self._id_word() & 0x7FFFFFFF
            if (
                sid >= MIN_SESSION_STREAM_ID
                and sid not in self.stream_ids
                and sid not in (0x48534B01, 0x48534B02)
            ):
                self.stream_ids.add(sid)
                return sid

    # ---------------------------------------------------------------- life cycle

    def on_done(self, session: ServerSession, data: bytes) -> bytes:
        try:
            confirm = session.on_done(data)
        except RemoteProtocolError:
            self.counters.bad_done += 1
            raise
        self._end_pending(session)
        self.counters.connected += 1
        return confirm

    def _end_pending(self, session: ServerSession) -> None:
        if not session.pending:
            return
        session.pending = False
        self._pending_sessions.pop(session, None)
        self.pending -= 1
        self.pending_per_prefix[session.prefix] -= 1
        if self.pending_per_prefix[session.prefix] <= 0:
            del self.pending_per_prefix[session.prefix]

    def expired(self, now_ns: int) -> list[ServerSession]:
        """Pending sessions past their deadline (moved to CLOSED; the caller releases them)."""
        out = []
        for session in list(self._pending_sessions):
            if session.state is SessionState.WELCOMED and now_ns >= session.deadline_ns:
                session.fire(SessionEvent.TIMEOUT)
                self.counters.expired += 1
                out.append(session)
        return out

    def next_deadline_ns(self) -> int | None:
        pending = [
            s.deadline_ns for s in self._pending_sessions if s.state is SessionState.WELCOMED
        ]
        return min(pending) if pending else None

    def release(self, session: ServerSession, event: SessionEvent = SessionEvent.CLOSE) -> None:
        """Close ``session`` (if not yet) and give back everything it held, exactly once."""
        if session.released:
            return
        if session.state is not SessionState.CLOSED:
            session.fire(event)
        self._end_pending(session)
        session.released = True
        self.sessions.discard(session)
        d = session.details
        self.session_ids.discard(d.c2s_session_id)
        self.session_ids.discard(d.s2c_session_id)
        self.stream_ids.discard(d.c2s_stream_id)
        self.stream_ids.discard(d.s2c_stream_id)
        self.connect_keys.discard(session.connect_key)
        share = address_share(session.address)
        self.per_address[share] -= 1
        if self.per_address[share] <= 0:
            del self.per_address[share]
        self.per_key[session.client_key] -= 1
        if self.per_key[session.client_key] <= 0:
            del self.per_key[session.client_key]
        self.counters.closed += 1


__all__ = [
    "CLIENT_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "ClientEvent",
    "ClientHandshake",
    "ClientState",
    "Rejected",
    "ServerCore",
    "address_prefix",
    "normalise_address",
    "ServerCounters",
    "ServerSession",
    "SessionEvent",
    "SessionState",
]
