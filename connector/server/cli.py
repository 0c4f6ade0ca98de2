"""``aeron-spark server``: run a stream server until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from aeron_spark.connector.server.config import DEFAULT_PORT, ServerConfig
from aeron_spark.connector.server.schedule import CHECK_INTERVAL_NS
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.protocol.heartbeat import IDLE_HEARTBEAT_INTERVAL_MAX_NS

# The shortest --session-lease-seconds: two of the longest gaps between a live, idle client's
# signs that its server's transport sees (a channel's idle heartbeat, at most 2 s; its status
# messages come every second) plus the loop's check of each session (1 s), so a client whose
# driver runs a heartbeat late on a loaded machine still renews (a ~1 s lease expired live
# sessions between two of their signs); the transport's own timeout (5 s without status
# messages) is as long
MIN_SESSION_LEASE_S = (2 * IDLE_HEARTBEAT_INTERVAL_MAX_NS + CHECK_INTERVAL_NS) / 1e9

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _byte_size(text: str) -> int:
    """``4096``, ``64K``, ``512M``, ``2G``, ``1T`` (binary units, optional ``B``/``iB``)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size in bytes (e.g. 4096, 512M, 2G)"
        ) from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size cannot be negative")
    return int(number * _UNITS[unit])


def _number(text: str) -> float:
    """A finite number (``nan`` and ``inf`` are refused here, with the option's name; as
    seconds they made the server fail at start with a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or abs(value) > 1e12:
        raise argparse.ArgumentTypeError(f"{text!r}: a finite number (at most 1e12) is needed")
    return value


def _stream_size(text: str) -> tuple[int, int]:
    """``STREAM=BYTES``, e.g. ``11=256M``."""
    stream, sep, size = text.partition("=")
    try:
        stream_id = int(stream)
    except ValueError:
        stream_id = None
    if not sep or stream_id is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not STREAM=BYTES (e.g. 11=256M)")
    return stream_id, _byte_size(size)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aeron-spark server",
        description="Run a stream server: records streams (published through sessions or by plain "
        "Aeron publications on the ingest channel), serves replays by position and "
        "commits Spark sink batches exactly once. SIGTERM or Ctrl-C shut it down "
        "gracefully (recordings are finished and synced).",
    )
    parser.add_argument("--dir", required=True, help="data directory (recordings, catalog, sink)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="handshake/session UDP port, at most 65534: port + 1 carries replies (default "
        "%(default)s; 0 picks a free pair)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--ingest-channel",
        default=None,
        help="record plain Aeron publications arriving on this channel, "
        "e.g. aeron:udp?endpoint=0.0.0.0:40456",
    )
    parser.add_argument(
        "--ingest-stream-id",
        type=int,
        action="append",
        default=None,
        help="stream id recorded from the ingest channel (repeatable; default 10)",
    )
    parser.add_argument(
        "--no-encryption",
        action="store_true",
        help="do not seal session traffic (trusted networks only)",
    )
    parser.add_argument(
        "--allow-plain-udp",
        action="store_true",
        help="let unsealed sessions run over UDP (trusted networks only); without it a session "
        "over UDP is sealed even when neither side asks (IPC sessions may stay plain)",
    )
    parser.add_argument(
        "--reply-on-hello-only",
        action="store_true",
        help="open a handshake reply publication only for a client's first HELLO, not for its "
        "SETUP (a SETUP flood opens nothing); clients older than this release cannot connect",
    )
    parser.add_argument(
        "--key-store",
        default=None,
        help="key store holding server.key (default $AERON_SPARK_KEY_STORE or ~/.aeron-spark/keys)",
    )
    parser.add_argument(
        "--fsync", action="store_true", help="fsync recordings after every append batch"
    )
    parser.add_argument(
        "--read-only", action="store_true", help="refuse publish, stage, commit, abort and purge"
    )
    parser.add_argument("--no-purge", action="store_true", help="refuse purge requests")
    parser.add_argument(
        "--no-local-writes",
        action="store_true",
        help="sink tasks always stage over their session, even those that can write this directory",
    )
    parser.add_argument(
        "--no-local-reads",
        action="store_true",
        help="never tell clients where recordings are on disk (every read is a replay over a "
        "session, even for readers that see this directory)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="only these addresses / CIDR ranges may open sessions (repeatable)",
    )
    parser.add_argument(
        "--deny", action="append", default=[], metavar="CIDR", help="refuse these (repeatable)"
    )
    parser.add_argument("--max-clients", type=int, default=4096, help="sessions in total")
    parser.add_argument(
        "--max-per-address",
        type=int,
        default=2048,
        help="sessions per client IP address, an IPv6 client's /64 (a cluster behind one NAT "
        "address is one address)",
    )
    parser.add_argument(
        "--max-per-key",
        type=int,
        default=None,
        help="sessions one client key may hold, with --authorized-keys only (default: half of "
        "--max-clients, so no key can lock the others out; a Spark job's driver and executors "
        "share one key)",
    )
    parser.add_argument(
        "--max-dedicated-sockets",
        type=int,
        default=None,
        help="UDP sockets of their own for client processes with a session (one on each of the "
        "two ports, out of a flood's reach), both ports together (default: an eighth of the open "
        "files limit; 0: none); past it a session shares the public sockets",
    )
    parser.add_argument(
        "--max-dedicated-per-address",
        type=int,
        default=None,
        help="of those, the sockets one client IP address may hold (default: a quarter of "
        "--max-dedicated-sockets); past it its sessions work on the public sockets",
    )
    parser.add_argument(
        "--max-dedicated-per-key",
        type=int,
        default=None,
        help="of those, the sockets one client key may hold, from any addresses (default: a "
        "quarter of --max-dedicated-sockets)",
    )
    parser.add_argument(
        "--max-pending-per-prefix",
        type=int,
        default=32,
        help="handshakes in flight from one /24 (IPv4) or /64 (IPv6) network (default "
        "%(default)s; raise it when more clients of one network connect at the same instant)",
    )
    parser.add_argument(
        "--hellos-per-prefix-per-s",
        type=_number,
        default=1000.0,
        help="HELLOs (and new HELLO streams) one /24 or /64 network may have answered per "
        "second, burst as many; past it a HELLO is answered busy (TOO_MANY_PENDING: the client "
        "backs off) as many a second at most, else dropped; counted (default %(default)s)",
    )
    parser.add_argument(
        "--retention-bytes",
        type=int,
        default=None,
        help="purge each recording down to its last N bytes (term granularity; default: keep all)",
    )
    parser.add_argument(
        "--retention-seconds",
        type=_number,
        default=None,
        help="purge what was recorded more than S seconds ago (default: keep all)",
    )
    parser.add_argument(
        "--retention-ignores-consumers",
        action="store_true",
        help="purge even what consumers (sources with a consumerId) have not committed",
    )
    parser.add_argument(
        "--session-lease-seconds",
        type=_number,
        default=60.0,
        help="a session is closed once it made no request, consumed nothing sent to it and its "
        "transport showed no sign of its client (an idle client's driver sends one a second) "
        f"for this long (default 60, at least {MIN_SESSION_LEASE_S:g})",
    )
    parser.add_argument(
        "--consumer-lease-seconds",
        type=_number,
        default=7 * 24 * 3600.0,
        help="a consumer silent this long holds nothing back (default 7 days)",
    )
    parser.add_argument(
        "--max-consumers-per-client",
        type=int,
        default=1024,
        help="consumers one client key may create (all clients on an open server; default 1024)",
    )
    parser.add_argument(
        "--max-consumer-positions",
        type=int,
        default=1_000_000,
        help="committed consumer positions kept, all consumers together (default 1000000)",
    )
    parser.add_argument(
        "--max-consumer-positions-per-client",
        type=int,
        default=None,
        help="committed consumer positions one client may hold: its key's with "
        "--authorized-keys, else its address's (an IPv6 one's /64); default half of "
        "--max-consumer-positions",
    )
    parser.add_argument(
        "--min-free-bytes",
        type=_byte_size,
        default=0,
        metavar="BYTES",
        help="refuse publish, stage and commit (error STORAGE_FULL) and hold ingest back while "
        "the directory's file system has less than this free, e.g. 512M or 2G (default 0: only "
        "a full disk refuses)",
    )
    parser.add_argument(
        "--authorized-keys",
        default=None,
        metavar="FILE",
        help="only the client keys listed in FILE may connect, each with its permissions "
        "('KEY NAME read=10,20-29 write=20 admin' per line; see 'aeron-spark keys show "
        "--client'); re-read when it changes and on SIGHUP. Without it any client may connect",
    )
    parser.add_argument(
        "--ingest-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="the ingest channel records only publications from these addresses / CIDR ranges "
        "(repeatable; they must also pass --allow and --deny); others make no image and are "
        "counted (setups_source_refused). Without it and --allow, any sender that reaches the "
        "ingest port is recorded",
    )
    parser.add_argument(
        "--max-incomplete-bytes",
        type=_byte_size,
        default=256 * 1024 * 1024,
        metavar="BYTES",
        help="what the chunks of large messages not yet complete may hold in memory, across all "
        "sessions (default 256M); a chunk past it is refused with LIMIT_EXCEEDED",
    )
    parser.add_argument(
        "--max-incomplete-bytes-per-session",
        type=_byte_size,
        default=32 * 1024 * 1024,
        metavar="BYTES",
        help="the largest message one session may send in chunks (default 32M)",
    )
    parser.add_argument(
        "--max-incomplete-bytes-per-client",
        type=_byte_size,
        default=None,
        metavar="BYTES",
        help="what one client's incomplete chunked messages may hold, all its sessions together "
        "(its key with --authorized-keys, else its address); default half of "
        "--max-incomplete-bytes",
    )
    parser.add_argument(
        "--incomplete-message-timeout-seconds",
        type=_number,
        default=30.0,
        help="discard a chunked message not whole this long after its first chunk (default 30)",
    )
    parser.add_argument(
        "--term-length",
        type=_byte_size,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="term length of the recordings the server creates (publish, sink commits): a power "
        "of two from 64K to 1G (default 64M). It sets the largest message, Aeron's "
        "min(term length / 8, 16M): 8M at 64M, 16M (Aeron's cap) from 128M",
    )
    parser.add_argument(
        "--stream-term-length",
        type=_stream_size,
        action="append",
        default=[],
        metavar="STREAM=BYTES",
        help="term length of one stream's new recordings, e.g. 11=256M (repeatable; as Aeron "
        "sets term-length per publication)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default %(default)s)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    if args.session_lease_seconds < MIN_SESSION_LEASE_S:
        raise ConfigurationError(
            "--session-lease-seconds",
            args.session_lease_seconds,
            f"at least {MIN_SESSION_LEASE_S:g} s (two of a live, idle client's heartbeats, 2 s "
            "apart, and the server's 1 s check of each session)",
        )
    return ServerConfig(
        directory=args.dir,
        host=args.host,
        port=args.port,
        ingest_channel=args.ingest_channel,
        ingest_stream_ids=tuple(args.ingest_stream_id or (10,)),
        encryption=not args.no_encryption,
        allow_plain_udp=args.allow_plain_udp,
        reply_on_hello_only=args.reply_on_hello_only,
        key_store_dir=args.key_store,
        fsync=args.fsync,
        read_only=args.read_only,
        allow_purge=not args.no_purge,
        local_reads=not args.no_local_reads,
        local_writes=not args.no_local_writes,
        allow=tuple(args.allow),
        deny=tuple(args.deny),
        max_clients=args.max_clients,
        max_per_address=args.max_per_address,
        max_per_key=args.max_per_key,
        max_dedicated_sockets=args.max_dedicated_sockets,
        max_dedicated_per_address=args.max_dedicated_per_address,
        max_dedicated_per_key=args.max_dedicated_per_key,
        max_pending_per_prefix=args.max_pending_per_prefix,
        hellos_per_prefix_per_s=args.hellos_per_prefix_per_s,
        retention_bytes=args.retention_bytes,
        retention_s=args.retention_seconds,
        retention_respects_consumers=not args.retention_ignores_consumers,
        consumer_lease_s=args.consumer_lease_seconds,
        session_lease_ns=int(args.session_lease_seconds * 1e9),
        max_consumers_per_client=args.max_consumers_per_client,
        max_consumer_positions=args.max_consumer_positions,
        max_consumer_positions_per_client=args.max_consumer_positions_per_client,
        min_free_bytes=args.min_free_bytes,
        authorized_keys_file=args.authorized_keys,
        ingest_allow=tuple(args.ingest_allow),
        max_incomplete_bytes=args.max_incomplete_bytes,
        max_incomplete_bytes_per_session=args.max_incomplete_bytes_per_session,
        max_incomplete_bytes_per_client=args.max_incomplete_bytes_per_client,
        incomplete_message_timeout_s=args.incomplete_message_timeout_seconds,
        term_length=args.term_length,
        stream_term_lengths=tuple(args.stream_term_length),
    )


def server_main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from aeron_spark.connector.server.server import StreamServer

    server = StreamServer(config_from_args(args))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %d: shutting down", signum)
        server.close(timeout_s=0)  # just ask the loop to stop; the main thread joins it

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        server.request_reload()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
    try:
        server.start()
        port = int(server.endpoint.rpartition(":")[2])
        print(
            f"aeron-spark server listening on {server.endpoint} (UDP ports {port} and "
            f"{port + 1}, dir {args.dir})\nserver key {server.public_key} "
            "(clients pin it with the option serverKey)",
            file=sys.stderr,
            flush=True,
        )
        while not server.wait(0.5):
            pass
    finally:
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if server.failure is not None else 0


__all__ = ["build_parser", "config_from_args", "server_main"]
