"""Frozen, validated configuration of handshake servers and clients (units in field names)."""

from __future__ import annotations

import functools
import ipaddress
import resource
from dataclasses import dataclass

from aeron_spark.errors import ConfigurationError

HANDSHAKE_STREAM_ID = 0x48534B01  # client HELLOs -> server, on the server's port
REPLY_STREAM_ID = 0x48534B02  # WELCOME / REFUSE -> every client, on the control port
LOOPBACK_MTU = 65504
NETWORK_MTU = 1408  # Aeron's default: one datagram fits a 1,500-byte path, never IP-fragmented


@functools.lru_cache(maxsize=4096)  # asked per HELLO (the reply mtu); bounded under a flood
def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def parse_networks(
    name: str, values: tuple[str, ...]
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """IP addresses or CIDR ranges (an option's values); a bad one is a ConfigurationError
    naming the option."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            raise ConfigurationError(name, value, f"an IP address or CIDR range ({exc})") from exc
    return tuple(out)


def _check_port(name: str, value: int | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or not 0 <= value < 65536:
        raise ConfigurationError(name, value, "a port 0..65535")


def _check_positive(name: str, value: int | float) -> None:
    if not value > 0:
        raise ConfigurationError(name, value, "a positive number")


def _check_term_length(name: str, value: int) -> None:
    if not (64 * 1024 <= value <= 1024**3 and value & (value - 1) == 0):
        raise ConfigurationError(name, value, "a power of two from 64 KiB to 1 GiB")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A handshake server.

    ``host``/``port``: where clients send HELLOs and their session traffic (port 0 picks a free
    one). ``control_port``: where clients join the server's replies and session publications in
    dynamic control mode (None: ``port + 1``). ``encryption``: seal sessions (a session is sealed
    when either side asks). Limits: ``max_clients`` (connected + pending), ``max_per_address``
    (connected + pending from one IP address; half of ``max_clients`` by default, so a Spark
    cluster behind one NAT address fits and still cannot take the other half: README,
    "Security model"), ``max_per_key`` (connected + pending of one client key, counted only
    when the server authorises client keys, ``authorize``: without that a client may make a key
    per session, so a per-key limit would bound nothing; None: half of ``max_clients``, at least
    one, so a Spark job whose driver and executors share a key gets many sessions and still
    cannot lock every other key out), ``max_pending`` (handshakes in flight),
    ``max_pending_per_prefix`` (handshakes in flight from one /24 IPv4 or /64 IPv6 network: far
    below ``max_pending``, so one host or one network cannot fill the server's pending slots),
    ``hellos_per_prefix_per_s`` (HELLOs one /24 or /64 may have answered per second, with a burst
    of as many; past it they are answered "busy" (REFUSE ``TOO_MANY_PENDING``, no longer than the
    HELLO) at most as many a second, the rest dropped unanswered; all counted). A HELLO is
    answered with a stateless COOKIE first and allocates nothing until the client echoes it (see
    :mod:`.messages`).
    ``allow``/``deny``: addresses or CIDR ranges, checked before anything is allocated (deny wins;
    an empty allow list allows all). ``session_term_length``/``session_mtu`` (None: 65504 on
    loopback, else 1408, which fits a 1,500-byte Ethernet path) and ``receiver_window_length``
    size each session's streams. ``ipc``: also accept same-host clients over ``aeron:ipc``
    (they connect to ``ipc:<port>``). ``allow_plain_udp``: let a session over UDP go unsealed
    when neither side asks for sealing (trusted networks only; otherwise such a session is sealed
    anyway, loopback included: its only protection would be its secret session id).
    ``reply_on_hello_only``: open a UDP HELLO image's reply publication only for its first
    HELLO, not for its SETUP, so a flood of SETUPs from many ports opens nothing (clients of
    this release say HELLO before the reply image joins; older clients wait for that image and
    never connect to such a server: turn it on once every client is of this release or later).
    Off: the reply publication is opened when the image appears, as before.
    ``max_dedicated_sockets``: the UDP sockets of their own the server gives client processes
    with a live session (all sessions of one with this server share its addresses): one on
    ``port`` and one on ``control_port`` each (connected to them, ``SO_REUSEPORT``), which a
    flood of the public ports does not reach; counted in all, both ports together (one budget:
    descriptors), lingering ones included. Past it a session shares the public sockets, as every
    session did before. None: an eighth of the open files limit (``RLIMIT_NOFILE``'s soft limit
    when the server starts), at most ``2 * max_clients``; 0: none.
    ``max_dedicated_per_address`` / ``max_dedicated_per_key``: of those, at most this many for
    one client IP address / one client key (its sessions from any number of source ports), so
    one client cannot take them all; past its share a client's session still works, on the
    public sockets (``dedicated_sockets_over_share``). None: a quarter of the budget (at least
    2: one client process).
    """

    host: str = "127.0.0.1"
    port: int = 0
    control_port: int | None = None
    key_store_dir: str | None = None
    encryption: bool = True
    max_clients: int = 4096
    max_per_address: int = 2048
    max_per_key: int | None = None
    max_pending: int = 256
    max_pending_per_prefix: int = 32
    hellos_per_prefix_per_s: float = 1000.0
    handshake_timeout_ns: int = 10_000_000_000
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    session_term_length: int = 1024 * 1024
    session_mtu: int | None = None
    receiver_window_length: int | None = None
    ipc: bool = True
    allow_plain_udp: bool = False
    reply_on_hello_only: bool = False
    max_dedicated_sockets: int | None = None
    max_dedicated_per_address: int | None = None
    max_dedicated_per_key: int | None = None

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigurationError("host", self.host, "an address to bind")
        _check_port("port", self.port)
        _check_port("control_port", self.control_port, allow_none=True)
        if self.control_port is not None and self.control_port == self.port != 0:
            raise ConfigurationError("control_port", self.control_port, "a port other than port")
        for name in (
            "max_clients",
            "max_per_address",
            "max_pending",
            "max_pending_per_prefix",
            "hellos_per_prefix_per_s",
            "handshake_timeout_ns",
        ):
            _check_positive(name, getattr(self, name))
        if self.max_per_key is not None:
            _check_positive("max_per_key", self.max_per_key)
        for name in ("max_dedicated_sockets", "max_dedicated_per_address", "max_dedicated_per_key"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ConfigurationError(name, value, "a count of sockets >= 0 (0: none)")
        parse_networks("allow", self.allow)
        parse_networks("deny", self.deny)
        _check_term_length("session_term_length", self.session_term_length)
        if self.session_mtu is not None and not 64 <= self.session_mtu <= LOOPBACK_MTU:
            raise ConfigurationError("session_mtu", self.session_mtu, f"64..{LOOPBACK_MTU}")
        if self.receiver_window_length is not None:
            _check_positive("receiver_window_length", self.receiver_window_length)

    @property
    def key_limit(self) -> int:
        """Sessions (connected + pending) one client key may hold: ``max_per_key``, or half of
        ``max_clients`` (at least one)."""
        if self.max_per_key is not None:
            return self.max_per_key
        return max(1, self.max_clients // 2)

    def dedicated_socket_limit(self) -> int:
        """``max_dedicated_sockets``, or an eighth of the soft open files limit now (at most
        ``2 * max_clients``; unlimited: ``2 * max_clients``): sockets in all, both ports."""
        if self.max_dedicated_sockets is not None:
            return self.max_dedicated_sockets
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return 2 * self.max_clients
        return min(2 * self.max_clients, soft // 8)

    def dedicated_shares(self, limit: int) -> dict[str, int]:
        """One client address's and one client key's share of ``limit`` dedicated sockets."""
        default = min(limit, max(2, limit // 4))
        return {
            "address": default
            if self.max_dedicated_per_address is None
            else self.max_dedicated_per_address,
            "key": default if self.max_dedicated_per_key is None else self.max_dedicated_per_key,
        }

    @property
    def mtu(self) -> int:
        if self.session_mtu is not None:
            return self.session_mtu
        return LOOPBACK_MTU if is_loopback(self.host) else NETWORK_MTU

    @property
    def max_message_length(self) -> int:
        """Aeron's rule: a message is at most an eighth of the term."""
        return min(self.session_term_length // 8, 16 * 1024 * 1024)

    def window(self) -> int:
        return self.receiver_window_length or self.session_term_length // 2


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """A handshake client.

    ``encryption``: ask for a sealed session (the server may seal it anyway). ``server_key``:
    expected server public key (64 hex digits), pinned instead of the key store.
    ``trust_on_first_use``: remember an unknown server's key (else refuse it).
    ``key_store_dir``: the known-servers store (None: ``$AERON_SPARK_KEY_STORE`` or
    ``~/.aeron-spark/keys``). ``control_port``: the server's control port (None: port + 1).
    ``timeout_s``: bound on the whole handshake. ``client_key_file``: this client's identity
    private key (64 hex digits, a 0600 file of ours; None: the key store's ``client.key``,
    created on first use). ``hello_linger_s``: how long this process keeps its HELLO publication
    and reply subscription to a server open after the last handshake with it, for the next
    handshakes to reuse (no new sockets, no new images, no set-up round trip); 0 closes them
    after each handshake.
    """

    encryption: bool = True
    server_key: str | None = None
    trust_on_first_use: bool = True
    key_store_dir: str | None = None
    client_key_file: str | None = None
    control_port: int | None = None
    timeout_s: float = 10.0
    receiver_window_length: int | None = None
    hello_linger_s: float = 10.0

    def __post_init__(self) -> None:
        _check_positive("timeout_s", self.timeout_s)
        if not 0 <= self.hello_linger_s <= 3600:
            raise ConfigurationError(
                "hello_linger_s", self.hello_linger_s, "seconds from 0 to 3600"
            )
        _check_port("control_port", self.control_port, allow_none=True)
        if self.server_key is not None:
            try:
                if len(bytes.fromhex(self.server_key)) != 32:
                    raise ValueError
            except ValueError:
                raise ConfigurationError(
                    "server_key", self.server_key, "64 hex digits (an X25519 public key)"
                ) from None

    @property
    def pinned_key(self) -> bytes | None:
        return bytes.fromhex(self.server_key) if self.server_key is not None else None


__all__ = [
    "HANDSHAKE_STREAM_ID",
    "REPLY_STREAM_ID",
    "ClientConfig",
    "ServerConfig",
    "is_loopback",
]
