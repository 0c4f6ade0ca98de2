"""The stream server's configuration: one frozen, validated dataclass (units in field names)."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aeron_spark.errors import ConfigurationError
from aeron_spark.handshake.config import parse_networks
from aeron_spark.handshake.machine import normalise_address
from aeron_spark.transport.protocol.logbuffer import (
    check_mtu,
    check_term_length,
    max_message_length,
)

DEFAULT_PORT = 40123
MAX_PORT = 65534  # the server also takes port + 1 (its replies)
# the server's media driver: stepped by its loop ("invoker") or on a thread of its own ("shared")
DRIVER_THREADING = ("invoker", "shared")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How a :class:`~aeron_spark.connector.server.StreamServer` runs.

    ``directory``           where recordings, the catalog, staged sink data and the commit log live
    ``host`` / ``port``     the session (handshake) endpoint; the server also uses port + 1, so
                            65534 is the highest port; port 0 picks a free pair
    ``ingest_channel``      an Aeron channel whose plain publications are recorded (None: off)
    ``ingest_stream_ids``   stream ids recorded from the ingest channel
    ``encryption``          seal session traffic (AES-GCM) when the handshake layer offers it
    ``allow_plain_udp``     let unsealed sessions run over UDP (trusted networks only; without
                            it a session over UDP is sealed even when neither side asks)
    ``reply_on_hello_only`` open a HELLO image's reply publication only for its first HELLO
                            (a SETUP flood opens nothing; clients before this release cannot
                            connect: the handshake's ``ServerConfig.reply_on_hello_only``)
    ``key_store_dir``       the server's key store (None: the handshake layer's default)
    ``allow`` / ``deny``    addresses or CIDR ranges allowed / denied a session (deny wins; an
                            empty allow list allows everyone)
    ``max_clients`` / ``max_per_address``  session limits (in total / per client IP address,
                            an IPv6 one's /64; 4096 / 2048: a Spark cluster behind one NAT
                            address fits, and still cannot take the other half; issue 31)
    ``max_per_key``         sessions one client key may hold, with ``authorized_keys_file`` only
                            (without it a client may make a key per session); None: half of
                            ``max_clients``, so a Spark job's driver and executors, which share
                            one key, get many sessions and still cannot lock other keys out
    ``max_dedicated_sockets``  sockets of their own for sessions' client processes, both ports
                            together (None: an eighth of the open files limit at start)
    ``max_dedicated_per_address`` / ``max_dedicated_per_key``  one client address's / key's share
                            of them (IPv6: a /64's; None: a quarter each); past it its sessions
                            use the public sockets (see ``handshake.ServerConfig``)
    ``max_pending_per_prefix``  handshakes in flight from one /24 (IPv4) or /64 (IPv6) network
    ``hellos_per_prefix_per_s``  HELLOs (and new HELLO images) one /24 or /64 may have answered
                            per second, burst as many; past it a HELLO is answered busy
                            (TOO_MANY_PENDING, as many a second at most) or dropped; counted
    ``term_length`` / ``mtu``  geometry of recordings the server creates (publish, sink commits);
                            mtu None: Aeron's largest, 65504, or half a term if that is less
                            (fewer fragments per large message; recordings are replayed through
                            sessions, never sent frame by frame). The term length sets the
                            largest message: Aeron's ``min(term_length / 8, 16 MiB)`` (64 MiB
                            terms: 8 MiB; 128 MiB or more: 16 MiB, Aeron's cap)
    ``stream_term_lengths``  ``(stream_id, term_length)`` pairs: the term length of that
                            stream's new recordings, in place of ``term_length`` (as Aeron sets
                            it per publication with the channel's ``term-length``)
    ``session_lease_ns``    a session is closed (expired) once, for this long, it made no
                            request, consumed nothing sent to it, and its transport showed no
                            sign of its client: a lease that runs out is renewed from the last
                            status message the client's driver sent for the session's reply
                            publication or the last data or heartbeat of its image (IPC: its
                            subscriber's heartbeat, its process alive), which an idle client's
                            driver sends every second; so an idle, alive client keeps its
                            session (Kafka's background heartbeat), and one killed, frozen or
                            cut off loses it after the lease (Spark's ``stop()`` is
                            best-effort). A session with replies waiting behind back pressure
                            renews only by consuming them. Keep it several seconds at least
                            (the transport's signs come a second apart); clients also send
                            keepalives while they wait for a reply
    ``staging_lease_s``     staged sink parts untouched this long are garbage collected
    ``max_replays_per_session``, ``max_block_bytes``  replay limits
    ``read_only``           refuse publish, stage, commit, abort and purge
    ``allow_purge``         accept purge requests
    ``allowed_stream_ids``  when set, only these streams may be read or written
    ``fsync``               fsync recordings after each append batch (crash safety of acknowledged
                            publishes); commits are always fsynced
    ``retention_bytes`` / ``retention_s``  purge each recording down to its last so many bytes /
                            seconds, on the gc tick, at term granularity (None: keep everything)
    ``retention_respects_consumers``  never purge what a live consumer (a source with a
                            ``consumerId``) has not committed yet
    ``consumer_lease_s``    a consumer that has not committed for this long holds nothing
    ``max_consumers_per_client``  consumers one client may create (its key with
                            ``authorized_keys_file``, else its address, an IPv6 one's /64); a
                            new one past it is refused
    ``max_consumer_positions``  committed positions ``consumers.msgpack`` holds, all consumers
                            together (rewritten whole on every commit); a commit adding past
                            it is refused
    ``max_consumer_positions_per_client``  one client's share of them (counted as
                            ``max_consumers_per_client``; None: half of the total, so a Spark
                            job's one key gets half a million and still cannot lock other
                            clients out)
    ``local_reads``         tell a client that can see this directory where a recording's
                            segment files are, so it reads a checked range from them instead of
                            a replay over its session (readers on the server's own host or on a
                            shared volume; a client proves it sees the files by reading a random
                            token the server writes at start)
    ``local_writes``        let a sink task that can write this directory write its staged part
                            file itself (the server creates it for the task's session, checks
                            every record when the task says it is done, and commits it as any
                            other part); tasks that cannot stage over their session
    ``min_free_bytes``      refuse publish, stage, commit and ingest appends (a coded
                            ``STORAGE_FULL`` error; ingest waits) while the directory's file
                            system has less than this free, before it is full (0: only a full
                            disk refuses)
    ``authorized_keys_file``  a file of client keys and their permissions (see ``authz.py``):
                            only listed keys may connect and each request is checked against
                            its key's permissions; re-read when it changes and on SIGHUP (None:
                            any client may connect and do anything the settings above allow)
    ``max_open_files``      recording files (segments, indexes) kept open at once, for appends
                            and replays, in a shared least-recently-used cache; None: a third
                            of the descriptor limit (raised to the hard limit at start),
                            between 16 and 16384 (three per publishing session)
    ``max_incomplete_bytes`` / ``max_incomplete_bytes_per_session``  what the chunks of messages
                            not yet complete may hold, across all sessions / in one session (a
                            message announced longer than the latter is refused at its first
                            chunk); memory is charged as chunks arrive, a chunk past either is
                            refused (``LIMIT_EXCEEDED``) and its message discarded
    ``max_incomplete_bytes_per_client``  one client's share of ``max_incomplete_bytes``, all its
                            sessions together (its key with ``authorized_keys_file``, else its
                            address, an IPv6 one's /64); None: half of it
    ``incomplete_message_timeout_s``  an incomplete message not whole this long after its first
                            chunk is discarded (on the clock, whatever else the session sends)
    ``driver_threading``    how the server's media driver runs: ``"invoker"`` (no driver thread:
                            the server's loop steps it each pass and sleeps in one select over
                            its sockets, as Aeron's ``ThreadingMode.INVOKER``) or ``"shared"``
                            (one driver thread beside the loop; every request then hands the
                            interpreter lock between the two threads several times)
    ``ingest_allow``        addresses or CIDR ranges whose publications the ingest channel
                            records (empty: any); a source must also pass ``allow`` / ``deny``;
                            other sources' SETUPs make no image and are counted
                            (``setups_source_refused``)
    """

    directory: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    ingest_channel: str | None = None
    ingest_stream_ids: tuple[int, ...] = (10,)
    encryption: bool = True
    allow_plain_udp: bool = False
    reply_on_hello_only: bool = False
    key_store_dir: str | None = None
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    max_clients: int = 4096
    max_per_address: int = 2048
    max_per_key: int | None = None
    max_dedicated_sockets: int | None = None
    max_dedicated_per_address: int | None = None
    max_dedicated_per_key: int | None = None
    max_pending_per_prefix: int = 32
    hellos_per_prefix_per_s: float = 1000.0
    term_length: int = 64 * 1024 * 1024
    mtu: int | None = None
    stream_term_lengths: tuple[tuple[int, int], ...] = ()
    session_lease_ns: int = 60_000_000_000
    staging_lease_s: float = 3600.0
    gc_interval_ns: int = 10_000_000_000
    max_replays_per_session: int = 16
    max_block_bytes: int = 1024 * 1024
    read_only: bool = False
    allow_purge: bool = True
    allowed_stream_ids: frozenset[int] | None = None
    fsync: bool = False
    retention_bytes: int | None = None
    retention_s: float | None = None
    retention_respects_consumers: bool = True
    consumer_lease_s: float = 7 * 24 * 3600.0
    max_consumers_per_client: int = 1024
    max_consumer_positions: int = 1_000_000
    max_consumer_positions_per_client: int | None = None
    local_reads: bool = True
    local_writes: bool = True
    min_free_bytes: int = 0
    max_open_files: int | None = None
    authorized_keys_file: str | None = None
    max_incomplete_bytes: int = 256 * 1024 * 1024
    max_incomplete_bytes_per_session: int = 32 * 1024 * 1024
    max_incomplete_bytes_per_client: int | None = None
    incomplete_message_timeout_s: float = 30.0
    ingest_allow: tuple[str, ...] = ()
    driver_threading: Literal["invoker", "shared"] = "invoker"

    def __post_init__(self) -> None:
        if self.driver_threading not in DRIVER_THREADING:
            raise ConfigurationError(
                "driver_threading", self.driver_threading, " or ".join(DRIVER_THREADING)
            )
        if not isinstance(self.directory, str) or not self.directory:
            raise ConfigurationError("directory", self.directory, "a directory path")
        if not 0 <= self.port <= MAX_PORT:
            raise ConfigurationError(
                "port",
                self.port,
                f"0..{MAX_PORT}: the server also uses port + 1, so {MAX_PORT} is the highest "
                "usable port (0 picks a free pair)",
            )
        check_term_length(self.term_length, "term_length")
        seen: set[int] = set()
        for stream_id, term_length in self.stream_term_lengths:
            if not -(2**31) <= stream_id < 2**31 or stream_id in seen:
                raise ConfigurationError(
                    "stream_term_lengths", stream_id, "distinct 32-bit stream ids"
                )
            seen.add(stream_id)
            check_term_length(term_length, f"term length of stream {stream_id}")
        if self.mtu is not None:
            check_mtu(self.mtu, "mtu")
            shortest = min([self.term_length, *(t for _, t in self.stream_term_lengths)])
            if self.mtu > shortest // 2:
                raise ConfigurationError("mtu", self.mtu, "at most half of every term length")
        for name in (
            "max_clients",
            "max_per_address",
            "max_pending_per_prefix",
            "hellos_per_prefix_per_s",
            "session_lease_ns",
            "gc_interval_ns",
            "max_replays_per_session",
            "max_consumers_per_client",
            "max_consumer_positions",
            "max_block_bytes",
            "max_incomplete_bytes",
            "max_incomplete_bytes_per_session",
            "incomplete_message_timeout_s",
        ):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # nan passed a "<= 0" check
                raise ConfigurationError(name, value, "a positive number")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ConfigurationError("retention_bytes", self.retention_bytes, "0 or more bytes")
        if self.retention_s is not None and not 0 <= self.retention_s < math.inf:
            raise ConfigurationError("retention_s", self.retention_s, "0 or more seconds")
        if not 0 < self.consumer_lease_s < math.inf:
            raise ConfigurationError("consumer_lease_s", self.consumer_lease_s, "a positive number")
        if not 0 < self.staging_lease_s < math.inf:
            raise ConfigurationError("staging_lease_s", self.staging_lease_s, "a positive number")
        part = self.max_incomplete_bytes_per_client
        if part is not None and not 0 < part <= self.max_incomplete_bytes:
            raise ConfigurationError(
                "max_incomplete_bytes_per_client", part, "1..max_incomplete_bytes bytes"
            )
        share = self.max_consumer_positions_per_client
        if share is not None and not 0 < share <= self.max_consumer_positions:
            raise ConfigurationError(
                "max_consumer_positions_per_client", share, "1..max_consumer_positions"
            )
        if self.max_per_key is not None and self.max_per_key <= 0:
            raise ConfigurationError("max_per_key", self.max_per_key, "a positive number")
        for name in ("max_dedicated_sockets", "max_dedicated_per_address", "max_dedicated_per_key"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigurationError(name, value, "a count of sockets >= 0 (0: none)")
        if self.min_free_bytes < 0:
            raise ConfigurationError("min_free_bytes", self.min_free_bytes, "0 or more bytes")
        if self.max_open_files is not None and self.max_open_files < 1:
            raise ConfigurationError("max_open_files", self.max_open_files, "at least 1")
        if self.max_block_bytes < 4096:
            raise ConfigurationError("max_block_bytes", self.max_block_bytes, "at least 4096")
        parse_networks("allow", self.allow)  # an unparsable address is named here, not at start
        parse_networks("deny", self.deny)
        parse_networks("ingest_allow", self.ingest_allow)
        if self.max_incomplete_bytes_per_session > self.max_incomplete_bytes:
            raise ConfigurationError(
                "max_incomplete_bytes_per_session",
                self.max_incomplete_bytes_per_session,
                f"at most max_incomplete_bytes ({self.max_incomplete_bytes})",
            )
        if self.ingest_allow and _is_ipc(self.ingest_channel):
            raise ConfigurationError(
                "ingest_allow",
                self.ingest_allow,
                "a UDP ingest channel (an aeron:ipc publisher is a process of this host)",
            )
        if not all(-(2**31) <= s < 2**31 for s in self.ingest_stream_ids):
            raise ConfigurationError(
                "ingest_stream_ids", self.ingest_stream_ids, "32-bit stream ids"
            )

    def ingest_source_filter(self) -> Callable[[str], bool] | None:
        """Which sender hosts the ingest channel records (None: any): not denied, and in
        ``allow`` and in ``ingest_allow`` where each is given (IPv4-mapped IPv6 addresses and
        ranges as the IPv4 they are, as the handshake's admission sees them)."""
        deny = _v4_mapped(parse_networks("deny", self.deny))
        allow = _v4_mapped(parse_networks("allow", self.allow))
        only = _v4_mapped(parse_networks("ingest_allow", self.ingest_allow))
        if not (deny or allow or only) or _is_ipc(self.ingest_channel):
            return None

        def admits(host: str) -> bool:
            try:
                ip = ipaddress.ip_address(normalise_address(host))
            except ValueError:
                return False
            return (
                not any(ip in net for net in deny)
                and (not allow or any(ip in net for net in allow))
                and (not only or any(ip in net for net in only))
            )

        return admits

    @property
    def consumer_positions_share(self) -> int:
        """The committed consumer positions one client may hold."""
        share = self.max_consumer_positions_per_client
        return share if share is not None else max(self.max_consumer_positions // 2, 1)

    @property
    def incomplete_bytes_share(self) -> int:
        """The bytes one client's incomplete chunked messages may hold together."""
        part = self.max_incomplete_bytes_per_client
        return part if part is not None else max(self.max_incomplete_bytes // 2, 1)

    @property
    def recording_mtu(self) -> int:
        """The mtu of recordings the server creates."""
        return self.mtu if self.mtu is not None else min(65504, self.term_length // 2)

    def term_length_for(self, stream_id: int) -> int:
        """The term length of ``stream_id``'s new recordings."""
        for sid, term_length in self.stream_term_lengths:
            if sid == stream_id:
                return term_length
        return self.term_length

    def mtu_for(self, stream_id: int) -> int:
        """The mtu of ``stream_id``'s new recordings."""
        term_length = self.term_length_for(stream_id)
        return self.mtu if self.mtu is not None else min(65504, term_length // 2)

    def max_message_length_for(self, stream_id: int) -> int:
        """The largest message ``stream_id`` takes: Aeron's ``min(term_length / 8, 16 MiB)`` of
        its recordings' term length (what a client is told before it publishes)."""
        return max_message_length(self.term_length_for(stream_id))


def _is_ipc(channel: str | None) -> bool:
    return channel is not None and channel.startswith("aeron:ipc")


def _v4_mapped(networks: tuple[Any, ...]) -> tuple[Any, ...]:
    """Ranges written as IPv4-mapped IPv6 (``::ffff:10.0.0.0/104``) as their IPv4 ranges: the
    addresses matched are normalised that way."""
    mapped = ipaddress.ip_network("::ffff:0:0/96")
    return tuple(
        ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
        if net.version == 6 and net.subnet_of(mapped)
        else net
        for net in networks
    )


__all__ = ["DEFAULT_PORT", "MAX_PORT", "ServerConfig"]
