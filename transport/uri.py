"""Channel URIs: ``aeron:udp?endpoint=host:port|mtu=1408|...`` and ``aeron:ipc?...``.

Parsing is in two steps, as in Aeron: :func:`parse_uri` splits the text into media and raw
parameters (``|``-separated ``key=value``, no escaping, empty keys/values are errors), then
:meth:`ChannelConfig.from_uri` validates the parameters this transport uses into a frozen
dataclass. Every error is a :class:`ChannelError` naming the bad parameter and what it accepts.

A handshake opens four channels per connection, so parsing is cached: IP address literals once
per host text (bounded), and whole configurations per exact channel text (bounded; only those
whose hosts are all IP literals, as a host name is resolved again each time since DNS may
change; and not those with a session-id, which name one session and are not asked for again).
The results are frozen dataclasses, so a cached one can be shared.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.protocol.flow_control import FlowControlPolicy, parse_flow_control
from aeron_spark.transport.protocol.heartbeat import (
    HEARTBEAT_INTERVAL_NS,
    IDLE_HEARTBEAT_INTERVAL_MAX_NS,
)
from aeron_spark.transport.protocol.image import SM_IDLE_INTERVAL_MAX_NS, SM_INTERVAL_NS
from aeron_spark.transport.protocol.logbuffer import (
    DEFAULT_IPC_TERM_LENGTH,
    DEFAULT_MTU_LENGTH,
    DEFAULT_RECEIVER_WINDOW_LENGTH,
    DEFAULT_TERM_LENGTH,
    check_mtu,
    check_term_length,
)

AERON_PREFIX = "aeron:"
SPY_PREFIX = "aeron-spy:"

Media = Literal["udp", "ipc"]
ControlMode = Literal["", "manual", "dynamic", "response"]

# Parameters accepted (others real Aeron knows are accepted and kept, but ignored here).
KNOWN_PARAMS = frozenset(
    {
        "endpoint",
        "interface",
        "control",
        "control-mode",
        "mtu",
        "term-length",
        "init-term-id",
        "term-id",
        "term-offset",
        "session-id",
        "reliable",
        "linger",
        "rcv-wnd",
        "so-rcvbuf",
        "so-sndbuf",
        "nak-delay",
        "ttl",
        "alias",
        "tags",
        "sparse",
        "eos",
        "tether",
        "group",
        "rejoin",
        "fc",
        "gtag",
        "cc",
        "ssc",
        "pub-wnd",
        "max-resend",
        "stream-id",
        "response-correlation-id",
        "untethered-window-limit-timeout",
        "untethered-resting-timeout",
        "media-rcv-ts-offset",
        "destination-host",
        "max-destinations",
        "max-amplification",
        "channel-rcv-ts-offset",
        "channel-snd-ts-offset",
        "spies-simulate-connection",
        # this transport's own (subscriptions): the largest term length / mtu a SETUP may ask
        "max-term-length",
        "max-mtu",
        "max-images",  # images at once (0: no limit), from one address+port, from one IP
        "max-images-per-source",
        "max-images-per-address",
        "setups-per-prefix-per-s",
        "evict-unvouched",  # at an image limit, evict the oldest image nobody vouched for
        "dedicated-sources",  # connected sockets of their own for that many trusted senders
        # an idle stream's control cadence, longer than Aeron's (the driver-wide settings
        # aeron.publication.heartbeat.timeout / aeron.rcv.status.message.timeout, per channel)
        "idle-heartbeat-interval",
        "idle-sm-interval",
    }
)

_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)?$")
_SIZE = re.compile(r"^(\d+)([kKmMgG])?$")
_UNITS_NS = {None: 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_SIZE_UNITS = {None: 1, "k": 1024, "m": 1024**2, "g": 1024**3}

DEFAULT_LINGER_NS = 5_000_000_000
DEFAULT_NAK_DELAY_NS = 100_000
DEFAULT_SO_RCVBUF = 128 * 1024


@dataclass(frozen=True, slots=True)
class ChannelUri:
    """The raw parts of a channel URI."""

    media: Media
    params: dict[str, str] = field(default_factory=dict)
    spy: bool = False

    def __str__(self) -> str:
        prefix = (SPY_PREFIX if self.spy else "") + AERON_PREFIX + self.media
        if not self.params:
            return prefix
        return prefix + "?" + "|".join(f"{k}={v}" for k, v in self.params.items())

    def with_params(self, **params: str | int) -> ChannelUri:
        merged = dict(self.params)
        merged.update({k.replace("_", "-"): str(v) for k, v in params.items()})
        return replace(self, params=merged)


def parse_uri(text: str) -> ChannelUri:
    """Split a channel URI into media and parameters."""
    if not isinstance(text, str):
        raise ChannelError("channel", text, "a string such as 'aeron:udp?endpoint=host:port'")
    rest = text.strip()
    spy = rest.startswith(SPY_PREFIX)
    if spy:
        rest = rest[len(SPY_PREFIX) :]
    if not rest.startswith(AERON_PREFIX):
        raise ChannelError("channel", text, "a URI starting with 'aeron:' or 'aeron-spy:aeron:'")
    rest = rest[len(AERON_PREFIX) :]
    media, _, query = rest.partition("?")
    if media not in ("udp", "ipc"):
        raise ChannelError("channel", text, "media 'udp' or 'ipc' (aeron:udp?... or aeron:ipc)")
    params: dict[str, str] = {}
    if query:
        for part in query.split("|"):
            key, sep, value = part.partition("=")
            if not sep or not key or not value:
                raise ChannelError("channel", text, f"key=value parameters, got {part!r}")
            if key in params:
                raise ChannelError(key, value, "a parameter given only once")
            params[key] = value
    return ChannelUri(media, params, spy)  # type: ignore[arg-type]


def parse_duration_ns(name: str, value: str) -> int:
    """``100ms``, ``5s``, ``250us``, ``100ns`` or a bare number of nanoseconds."""
    match = _DURATION.match(value.strip())
    if not match:
        raise ChannelError(name, value, "a duration such as 5s, 100ms, 250us or nanoseconds")
    return int(match.group(1)) * _UNITS_NS[match.group(2)]


def parse_size(name: str, value: str) -> int:
    """``65536``, ``64k``, ``16m``, ``1g``."""
    match = _SIZE.match(value.strip())
    if not match:
        raise ChannelError(name, value, "a byte count such as 65536, 64k, 16m or 1g")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _SIZE_UNITS[unit]


def parse_int32(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ChannelError(name, value, "a 32-bit integer") from None
    if not -(2**31) <= number < 2**31:
        raise ChannelError(name, value, "a 32-bit integer")
    return number


def parse_bool(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ChannelError(name, value, "true or false")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A resolved ``host:port`` (IPv4 or IPv6; IPv6 written ``[addr]:port``)."""

    host: str
    port: int
    family: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def __str__(self) -> str:
        return (
            f"[{self.host}]:{self.port}"
            if self.family == socket.AF_INET6
            else f"{self.host}:{self.port}"
        )


@functools.lru_cache(maxsize=4096)
def _ip_literal(host: str) -> tuple[str, int] | None:
    """(canonical text, address family) of an IP address literal, None for anything else.
    Bounded: many distinct hosts only turn the cache over."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    return str(addr), socket.AF_INET6 if addr.version == 6 else socket.AF_INET


@functools.lru_cache(maxsize=4096)
def _destination_host(host: str) -> str | None:
    """``destination-host``'s address as compared with senders (IPv4-mapped as IPv4); None if
    it is not an IP address."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def parse_endpoint(name: str, value: str, *, allow_port_zero: bool = True) -> Endpoint:
    """Parse and resolve ``host:port`` or ``[v6addr]:port``."""
    return _parse_endpoint(name, value, allow_port_zero)[0]


def _parse_endpoint(name: str, value: str, allow_port_zero: bool) -> tuple[Endpoint, bool]:
    """The endpoint and whether its host was a name (resolved, so not to be cached)."""
    text = value.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ChannelError(name, value, "[ipv6-address]:port")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ChannelError(name, value, "host:port")
    try:
        port = int(port_text)
    except ValueError:
        raise ChannelError(name, value, "host:port with a numeric port") from None
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise ChannelError(
            name,
            value,
            "a port from 1 to 65535" if not allow_port_zero else "a port from 0 to 65535",
        )
    literal = _ip_literal(host)
    if literal is not None:
        return Endpoint(literal[0], port, literal[1]), False
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise ChannelError(name, value, f"a resolvable host ({exc})") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # prefer IPv4 for names like localhost
    family, _, _, _, sockaddr = infos[0]
    return Endpoint(str(sockaddr[0]), port, int(family)), True


def _parse_term_length(name: str, value: str) -> int:
    return check_term_length(parse_size(name, value), name)


def _parse_mtu(name: str, value: str) -> int:
    return check_mtu(parse_size(name, value), name)


def _parse_destination_host(name: str, value: str) -> str:
    host = value.strip("[]")
    if host == "none":
        return host
    address = _destination_host(host)
    if address is None:
        raise ChannelError(name, value, "an IP address or none")
    return address


# The channel parameters each parsed on its own (parameter, ChannelConfig field, parser), in
# the order they are checked.
_PARSED_PARAMS: tuple[tuple[str, str, Callable[[str, str], object]], ...] = (
    ("session-id", "session_id", parse_int32),
    ("reliable", "reliable", parse_bool),
    ("linger", "linger_ns", parse_duration_ns),
    ("rcv-wnd", "receiver_window_length", parse_size),
    ("so-rcvbuf", "so_rcvbuf", parse_size),
    ("so-sndbuf", "so_sndbuf", parse_size),
    ("nak-delay", "nak_delay_ns", parse_duration_ns),
    ("pub-wnd", "publication_window_length", parse_size),
    ("max-term-length", "max_term_length", _parse_term_length),
    ("max-mtu", "max_mtu", _parse_mtu),
    ("max-images", "max_images", parse_size),
    ("max-images-per-source", "max_images_per_source", parse_size),
    ("max-images-per-address", "max_images_per_address", parse_size),
    ("evict-unvouched", "evict_unvouched", parse_bool),
    ("dedicated-sources", "dedicated_sources", parse_size),
    ("setups-per-prefix-per-s", "setups_per_prefix_per_s", parse_size),
    ("destination-host", "destination_host", _parse_destination_host),
    ("max-amplification", "max_amplification", parse_size),
    ("max-destinations", "max_destinations", parse_size),
)

_CONFIG_CACHE_SIZE = 1024
_config_cache: OrderedDict[str, ChannelConfig] = OrderedDict()
_config_cache_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """Validated settings of one channel, with Aeron's defaults; units in the field names."""

    media: Media
    spy: bool = False
    endpoint: Endpoint | None = None
    control: Endpoint | None = None
    interface: str | None = None
    control_mode: ControlMode = ""
    mtu: int = DEFAULT_MTU_LENGTH
    term_length: int = DEFAULT_TERM_LENGTH
    initial_term_id: int | None = None
    term_id: int | None = None
    term_offset: int | None = None
    session_id: int | None = None
    reliable: bool = True
    linger_ns: int = DEFAULT_LINGER_NS
    receiver_window_length: int = DEFAULT_RECEIVER_WINDOW_LENGTH
    so_rcvbuf: int = DEFAULT_SO_RCVBUF
    so_sndbuf: int = 0
    nak_delay_ns: int = DEFAULT_NAK_DELAY_NS
    publication_window_length: int = 0
    max_term_length: int | None = None  # subscriptions: refuse SETUPs asking for more
    max_mtu: int | None = None
    max_images: int | None = None
    max_images_per_source: int | None = None
    max_images_per_address: int | None = None
    # new images a subscription makes per second for the senders of one /24 (IPv4) or /64
    # (IPv6) network (0: no limit); SETUPs past it make nothing and are counted
    setups_per_prefix_per_s: int = 0
    # at an image limit a new sender's SETUP evicts the oldest image its subscriber never
    # vouched for (Image.vouch) instead of being refused (a handshake server's HELLO images)
    evict_unvouched: bool = False
    # subscriptions: the socket this channel opens (SO_REUSEPORT) may give up to this many
    # sender addresses a connected socket of their own (Driver.dedicate_source), whose
    # datagrams a flood of the shared socket does not overflow (0: none, a plain socket)
    dedicated_sources: int = 0
    # dynamic publications: the one IP address whose SMs may make a destination ("none": nobody
    # until the owner allows some, None: anyone) and how many destinations at most (0: no limit)
    destination_host: str | None = None
    max_destinations: int = 0
    # a socket opened for this channel sends an address that has not completed a handshake at
    # most this many times what it received from it (0: no bound; see AmplificationLedger)
    max_amplification: int = 0
    # publications: the flow control strategy (fc=max, fc=min,..., fc=tagged,...; None: max)
    flow_control: FlowControlPolicy | None = None
    # subscriptions: the group tag their SMs carry (gtag), counted by an fc=tagged publisher
    group_tag: int | None = None
    # an idle stream's heartbeats (publications) and status messages (subscriptions' images)
    # this far apart once the first one after the last data went at Aeron's cadence (100 ms /
    # 200 ms); 0: Aeron's cadence throughout. Our own sessions' channels set them (issue 31)
    idle_heartbeat_interval_ns: int = 0
    idle_sm_interval_ns: int = 0
    uri: str = ""

    @property
    def has_explicit_position(self) -> bool:
        return self.initial_term_id is not None

    @classmethod
    def from_uri(cls, text: str | ChannelUri) -> ChannelConfig:
        if isinstance(text, str) and cls is ChannelConfig:
            with _config_cache_lock:
                cached = _config_cache.get(text)
                if cached is not None:
                    _config_cache.move_to_end(text)
                    return cached
            config, resolved = cls._from_uri(parse_uri(text))
            # a session-id makes a channel text one session's own: it is not asked for again
            if not resolved and config.session_id is None:
                with _config_cache_lock:
                    _config_cache[text] = config
                    if len(_config_cache) > _CONFIG_CACHE_SIZE:
                        _config_cache.popitem(last=False)
            return config
        return cls._from_uri(parse_uri(text) if isinstance(text, str) else text)[0]

    @classmethod
    def _from_uri(cls, uri: ChannelUri) -> tuple[ChannelConfig, bool]:
        """The validated configuration and whether a host name was resolved for it."""
        resolved = False
        p = uri.params
        for key in p:
            if key not in KNOWN_PARAMS:
                raise ChannelError(
                    key,
                    p[key],
                    "a known channel parameter (" + ", ".join(sorted(KNOWN_PARAMS)) + ")",
                )
        kwargs: dict[str, object] = {"media": uri.media, "spy": uri.spy, "uri": str(uri)}
        if uri.media == "ipc":
            kwargs["term_length"] = DEFAULT_IPC_TERM_LENGTH
        if "endpoint" in p:
            kwargs["endpoint"], named = _parse_endpoint("endpoint", p["endpoint"], True)
            resolved |= named
        if "control" in p:
            kwargs["control"], named = _parse_endpoint("control", p["control"], True)
            resolved |= named
        if "interface" in p:
            kwargs["interface"] = p["interface"]
        if "control-mode" in p:
            mode = p["control-mode"]
            if mode not in ("manual", "dynamic", "response"):
                raise ChannelError("control-mode", mode, "manual, dynamic or response")
            kwargs["control_mode"] = mode
        if "mtu" in p:
            kwargs["mtu"] = check_mtu(parse_size("mtu", p["mtu"]))
        if "term-length" in p:
            kwargs["term_length"] = check_term_length(parse_size("term-length", p["term-length"]))
        position_keys = [k for k in ("init-term-id", "term-id", "term-offset") if k in p]
        if position_keys and len(position_keys) != 3:
            raise ChannelError(
                position_keys[0],
                p[position_keys[0]],
                "init-term-id, term-id and term-offset given together",
            )
        if position_keys:
            kwargs["initial_term_id"] = parse_int32("init-term-id", p["init-term-id"])
            kwargs["term_id"] = parse_int32("term-id", p["term-id"])
            kwargs["term_offset"] = parse_int32("term-offset", p["term-offset"])
        for key, field_name, parse in _PARSED_PARAMS:
            if key in p:
                kwargs[field_name] = parse(key, p[key])
        if "fc" in p:
            try:
                kwargs["flow_control"] = parse_flow_control(p["fc"])
            except ValueError as exc:
                raise ChannelError(
                    "fc", p["fc"], f"max, min[,t:5s][,g:/N] or tagged,g:TAG[/N][,t:5s] ({exc})"
                ) from None
        if "gtag" in p:
            try:
                tag = int(p["gtag"])
            except ValueError:
                tag = 1 << 64
            if not -(2**63) <= tag < 2**63:
                raise ChannelError("gtag", p["gtag"], "a 64-bit integer group tag")
            kwargs["group_tag"] = tag
        for key, low, high in (
            ("idle-heartbeat-interval", HEARTBEAT_INTERVAL_NS, IDLE_HEARTBEAT_INTERVAL_MAX_NS),
            ("idle-sm-interval", SM_INTERVAL_NS, SM_IDLE_INTERVAL_MAX_NS),
        ):
            if key in p:
                interval = parse_duration_ns(key, p[key])
                if not low <= interval <= high:
                    raise ChannelError(
                        key, p[key], f"a duration from {low // 1_000_000} to {high // 1_000_000} ms"
                    )
                kwargs[key.replace("-", "_") + "_ns"] = interval
        config = cls(**kwargs)  # type: ignore[arg-type]
        config.validate()
        return config, resolved

    def validate(self) -> None:
        if self.mtu > self.term_length // 2:
            raise ChannelError(
                "mtu", self.mtu, f"at most half the term length ({self.term_length // 2})"
            )
        if self.term_offset is not None:
            if not 0 <= self.term_offset < self.term_length or self.term_offset % 32:
                raise ChannelError(
                    "term-offset",
                    self.term_offset,
                    f"a multiple of 32 from 0 to {self.term_length - 32}",
                )
        if self.receiver_window_length <= 0:
            raise ChannelError("rcv-wnd", self.receiver_window_length, "a positive byte count")
        if (
            self.publication_window_length < 0
            or self.publication_window_length > self.term_length // 2
        ):
            raise ChannelError(
                "pub-wnd",
                self.publication_window_length,
                f"0 (default) to half the term length ({self.term_length // 2})",
            )
        if self.media == "udp" and not self.spy:
            if self.control_mode == "dynamic" and self.control is None:
                raise ChannelError("control-mode", "dynamic", "a 'control' endpoint to go with it")
