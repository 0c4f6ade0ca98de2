"""The ``aeron-spark`` command line: ``server``, ``stat``, ``publish``, ``tail``, ``keys``,
``consumers``, ``demo``.

Exit codes scripts can rely on:

====  ==========================================================
0     success
1     the operation failed (server unreachable, refused, I/O)
2     bad command line or option (usage error)
130   interrupted (Ctrl-C)
====  ==========================================================
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from aeron_spark.errors import AeronSparkError, ConfigurationError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

COMMANDS = ("server", "stat", "publish", "tail", "keys", "consumers", "demo")


def _client_settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from aeron_spark.connector.session.settings import settings_from_args

    return settings_from_args(args)


def _add_client_args(parser: argparse.ArgumentParser, stream: bool = True) -> None:
    from aeron_spark.connector.session.settings import add_session_arguments

    add_session_arguments(parser, timeout_s=30.0)
    if stream:
        parser.add_argument(
            "--stream-id", type=int, default=10, help="stream id (default %(default)s)"
        )


def _read_payloads(stream: TextIO, binary: bool) -> Iterator[bytes]:
    if binary:
        data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode()
        if data:
            yield data
        return
    for line in stream:
        line = line.rstrip("\n")
        if line:
            yield line.encode("utf-8")


def publish_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="aeron-spark publish",
        description="Publish messages into a stream of a running stream server: one message per "
        "line of the input files (or standard input), recorded as one recording.",
    )
    _add_client_args(parser)
    parser.add_argument("files", nargs="*", help="input files (default: standard input)")
    parser.add_argument(
        "--whole-file",
        action="store_true",
        help="send each file as one message instead of one message per line",
    )
    parser.add_argument("--progress", action="store_true", help="print progress to stderr")
    args = parser.parse_args(argv)
    from aeron_spark.connector.client import StreamClient

    def payloads() -> Iterator[bytes]:
        sources = args.files or ["-"]
        for name in sources:
            if name == "-":
                yield from _read_payloads(sys.stdin, args.whole_file)
            else:
                with open(name, encoding="utf-8") as fh:
                    yield from _read_payloads(fh, args.whole_file)

    count = 0
    started = time.monotonic()

    def counted() -> Iterator[bytes]:
        nonlocal count
        for payload in payloads():
            count += 1
            if args.progress and count % 10_000 == 0:
                rate = count / max(time.monotonic() - started, 1e-9)
                print(f"\rpublished {count:,} messages ({rate:,.0f}/s)", end="", file=sys.stderr)
            yield payload

    with StreamClient.connect(_client_settings(args)) as client:
        end = client.publish(args.stream_id, counted())
    if args.progress:
        print(file=sys.stderr)
    print(json.dumps({"stream_id": args.stream_id, "messages": count, "end_position": end}))
    return EXIT_OK


def tail_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="aeron-spark tail",
        description="Print the messages of a stream from a running stream server, one line each "
        "(recording id, position, payload as UTF-8 or hex).",
    )
    _add_client_args(parser)
    parser.add_argument(
        "--from",
        dest="start",
        default="earliest",
        help="earliest, latest, or a JSON object {recording_id: position}",
    )
    parser.add_argument(
        "--max-messages", type=int, default=0, help="stop after this many messages (0 = no limit)"
    )
    parser.add_argument(
        "--follow", action="store_true", help="keep polling for new messages until interrupted"
    )
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=0.5,
        help="seconds between polls with --follow (default %(default)s)",
    )
    parser.add_argument("--hex", action="store_true", help="print payloads as hex")
    args = parser.parse_args(argv)
    from aeron_spark.connector.client import StreamClient
    from aeron_spark.connector.formats import Geometry, iter_messages

    printed = 0
    with StreamClient.connect(_client_settings(args)) as client:
        positions: dict[int, int] = {}
        if args.start not in ("earliest", "latest"):
            try:
                positions = {int(k): int(v) for k, v in json.loads(args.start).items()}
            except (ValueError, AttributeError) as exc:
                raise ConfigurationError(
                    "--from",
                    args.start,
                    "earliest, latest or a JSON object {recording_id: position}",
                ) from exc
        first = True
        while True:
            for rec in client.list_recordings(stream_ids=[args.stream_id]):
                if rec.recording_id not in positions:
                    positions[rec.recording_id] = (
                        rec.recorded_position
                        if (args.start == "latest" and first)
                        else rec.purged_position
                    )
                start, end = positions[rec.recording_id], rec.recorded_position
                if end <= start:
                    continue
                geometry = Geometry(rec.initial_term_id, rec.term_length)
                blocks = client.replay(rec.recording_id, start, end)
                for message in iter_messages(blocks, geometry):
                    payload = bytes(message.payload)
                    text = payload.hex() if args.hex else payload.decode("utf-8", "replace")
                    print(f"{rec.recording_id}\t{message.position}\t{text}")
                    printed += 1
                    if args.max_messages and printed >= args.max_messages:
                        return EXIT_OK
                positions[rec.recording_id] = end
            first = False
            if not args.follow:
                return EXIT_OK
            time.sleep(args.poll_interval_s)


def keys_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="aeron-spark keys",
        description="Show the server key (or with --client this client's identity key) of this "
        "host, list or forget known server keys.",
    )
    parser.add_argument(
        "action",
        choices=("show", "list", "forget"),
        help="show this host's key, list the known server keys, or forget one",
    )
    parser.add_argument("endpoint", nargs="?", help="for 'forget': the server's host:port")
    parser.add_argument(
        "--client",
        action="store_true",
        help="for 'show': this client's identity key (what a server lists in --authorized-keys) "
        "instead of the server key",
    )
    parser.add_argument(
        "--key-store",
        default=None,
        help="key store directory (default $AERON_SPARK_KEY_STORE or ~/.aeron-spark/keys)",
    )
    args = parser.parse_args(list(argv))
    from aeron_spark.handshake.crypto import fingerprint
    from aeron_spark.handshake.keystore import (
        KeyStore,
        client_public_key_hex,
        server_public_key_hex,
    )

    store = KeyStore(args.key_store)
    if args.action == "show":
        show = client_public_key_hex if args.client else server_public_key_hex
        key = show(store.directory)
        print(key)
        print(
            f"fingerprint {fingerprint(bytes.fromhex(key))} (key store {store.directory})",
            file=sys.stderr,
        )
        return EXIT_OK
    if args.action == "list":
        for endpoint, known in sorted(store.known_servers().items()):
            print(f"{endpoint} {known.hex()} {fingerprint(known)}")
        return EXIT_OK
    if not args.endpoint:
        parser.error("forget needs the server's host:port")
    if store.forget(args.endpoint):
        print(f"forgot the key of {args.endpoint}; the next connection trusts the key it sees")
        return EXIT_OK
    print(f"no key is known for {args.endpoint} in {store.directory}", file=sys.stderr)
    return EXIT_FAILED


def consumers_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="aeron-spark consumers",
        description="List the consumers (sources with a consumerId) a server's retention waits "
        "for, or forget one whose query is gone so retention may purge what it held.",
    )
    parser.add_argument(
        "action", choices=("list", "forget"), help="list the consumers, or forget one"
    )
    parser.add_argument("consumer_id", nargs="?", help="for 'forget': the consumerId")
    _add_client_args(parser, stream=False)  # consumers span streams: no --stream-id
    args = parser.parse_args(list(argv))
    from aeron_spark.connector.client import StreamClient

    if args.action == "forget" and not args.consumer_id:
        parser.error("forget needs the consumerId")
    with StreamClient.connect(_client_settings(args)) as client:
        if args.action == "list":
            for consumer in client.stats().get("consumers", []):
                print(json.dumps(consumer))
            return EXIT_OK
        if client.consumer_forget(args.consumer_id):
            print(f"forgot consumer {args.consumer_id!r}")
            return EXIT_OK
    print(f"no consumer {args.consumer_id!r} on {args.endpoint}", file=sys.stderr)
    return EXIT_FAILED


def _lazy(module: str, func: str) -> Callable[[Sequence[str]], int]:
    def run(argv: Sequence[str]) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), func)(argv))

    return run


HANDLERS: dict[str, Callable[[Sequence[str]], int]] = {
    "server": _lazy("aeron_spark.connector.server", "server_main"),
    "stat": _lazy("aeron_spark.connector.server", "stat_main"),
    "publish": publish_main,
    "tail": tail_main,
    "keys": keys_main,
    "consumers": consumers_main,
    "demo": _lazy("aeron_spark.demo", "main"),
}

HELP = """usage: aeron-spark COMMAND [options]

commands:
  server    run a stream server (records streams, serves replays and sink commits)
  stat      show streams, recordings, positions, sessions and counters of a running server
  publish   publish lines or files into a stream
  tail      print the messages of a stream
  keys      show this host's server key, list or forget known server keys
  consumers list the consumers a server's retention waits for, or forget one
  demo      the quickstart: embedded server + producer + a local Spark query

'aeron-spark COMMAND --help' describes each command.
exit codes: 0 ok, 1 failed, 2 usage error, 130 interrupted
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(HELP, end="")
        return EXIT_OK if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        from aeron_spark import __version__

        print(f"aeron-spark {__version__}")
        return EXIT_OK
    command, rest = args[0], args[1:]
    handler = HANDLERS.get(command)
    if handler is None:
        print(f"aeron-spark: unknown command {command!r}\n\n{HELP}", end="", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handler(rest)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigurationError as exc:
        print(f"aeron-spark {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AeronSparkError as exc:
        print(f"aeron-spark {command}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
