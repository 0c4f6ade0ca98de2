"""Who may do what: the stream server's authorized keys file and its permission check.

The file (``--authorized-keys FILE``) has one line per client key; blank lines and ``#``
comments are ignored::

    # key (64 hex digits or base64 of 32 bytes)      name      permissions
    3b6a27bc...e1                                     ingest    write=10,11
    q2V5IGZvciB0aGUgZGFzaGJvYXJkIHRlYW0gLi4uLi4uLi4=  dashboard read=10,11,20-29
    9f0c...                                           ops       read=* write=* admin

Permissions: ``read=LIST``, ``write=LIST``, ``admin`` (every stream) or ``admin=LIST``, where a
LIST is stream ids and ranges ``a-b`` separated by commas, or ``*`` for every stream. What each
permission covers (the protocol's column ``session/protocol.PERMISSIONS``, read here as
:data:`OP_PERMISSION`, with no table of this module's own):

    read   list_streams, list_recordings, latest_positions, recording_positions, position_at,
           scan, scan_ranges, replay,
           local_read, local_read_ranges, replay_ranges, consumer_commit, stats  (listings show
           only readable streams)
    write  publish, stage, local_stage, local_stage_done, commit, abort, last_committed_batch
    admin  purge, consumer_forget

Operations on a recording are checked against its stream (``consumer_commit``: the stream of
each position's recording, which must exist); operations without a stream
(``abort``, ``last_committed_batch``, ``consumer_forget``, listings) need the permission on at
least one stream. ``keepalive`` and ``stop_replay`` (a session's own replay) need nothing.

A refusal names the operation, the client and the stream; a recording on a stream the client may
not read is answered exactly as one that does not exist (``UNKNOWN_RECORDING``, same text and
details), so it cannot learn which ids exist there. A recording's ``source`` (its producer's
address and port) is shown only to a client that may write its stream (others see its kind).
``stats`` shows a client the streams and recordings it reads (``store.recordings`` counting
those), its own sessions and the consumers of the streams it reads (narrowed to those streams);
the server-wide sections (:data:`SERVER_WIDE_STATS`: every client's activity) only with
``admin`` on every stream, otherwise named in ``withheld``. The server checks a request's
permission on its loop, before a deferred one is queued for the commit worker.

Parsing is strict: anything unexpected is a :class:`ConfigurationError` naming the file, the
line number and what is wrong; a file that fails to parse on a reload leaves the previous table
in force. The server polls the file's content (a SHA-256 of its bytes, every second): any edit
is noticed, also one that keeps its size and mtime; a file that vanishes or cannot be read is
a failed reload (logged and counted once per change of what the poll sees), and the previous
table stays in force.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aeron_spark.connector.errors import NotAuthorisedError, UnknownRecordingError
from aeron_spark.connector.session.protocol import PERMISSIONS, Permission
from aeron_spark.errors import ConfigurationError
from aeron_spark.handshake.crypto import fingerprint
from aeron_spark.transport.archive.diskio import read_regular

READ, WRITE, ADMIN = Permission.READ.value, Permission.WRITE.value, Permission.ADMIN.value

# op -> the permission it needs (None: any authenticated session may), read off the protocol's
# permission column (session/protocol.PERMISSIONS, the dispatch table's): nothing of its own.
OP_PERMISSION: dict[str, str | None] = {
    op: None if access.permission is Permission.NONE else access.permission.value
    for op, access in PERMISSIONS.items()
}
_NAME = re.compile(r"[A-Za-z0-9_.@+-]{1,64}")
_INT32 = (-(2**31), 2**31 - 1)
_RANGE = re.compile(r"(-?[0-9]{1,10})(?:-(-?[0-9]{1,10}))?")


@dataclass(frozen=True, slots=True)
class StreamSet:
    """Stream ids: every stream (``everything``) or a union of inclusive ranges."""

    everything: bool = False
    ranges: tuple[tuple[int, int], ...] = ()

    def __contains__(self, stream_id: object) -> bool:
        if self.everything:
            return True
        return isinstance(stream_id, int) and any(a <= stream_id <= b for a, b in self.ranges)

    def __bool__(self) -> bool:
        return self.everything or bool(self.ranges)

    @classmethod
    def parse(cls, text: str) -> StreamSet:
        if text == "*":
            return cls(everything=True)
        ranges = []
        for item in text.split(","):
            match = _RANGE.fullmatch(item)
            if match is None:
                raise ValueError(f"{item!r} is not a stream id or a range a-b")
            a = int(match[1])
            b = int(match[2]) if match[2] is not None else a
            if not (_INT32[0] <= a <= b <= _INT32[1]):
                raise ValueError(f"{item!r} is not a range of 32-bit stream ids (low <= high)")
            ranges.append((a, b))
        return cls(ranges=tuple(ranges))


@dataclass(frozen=True, slots=True)
class Grant:
    """One authorized key: its name and what it may do."""

    key: bytes
    name: str
    read: StreamSet = StreamSet()
    write: StreamSet = StreamSet()
    admin: StreamSet = StreamSet()

    def streams(self, permission: str) -> StreamSet:
        return getattr(self, permission)  # type: ignore[no-any-return]


class UnreadableRecordingError(UnknownRecordingError):
    """A recording on a stream the client may not read: on the wire exactly an unknown
    recording (``UNKNOWN_RECORDING``, ``no recording N``); counted by the server as refused."""


def _parse_key(text: str) -> bytes:
    if re.fullmatch(r"[0-9a-fA-F]{64}", text):
        return bytes.fromhex(text)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"key {text[:16]!r}... is neither 64 hex digits nor base64 of 32 bytes")
    return raw


def parse(text: str, source: str = "authorized keys") -> dict[bytes, Grant]:
    """The table of an authorized keys file (see the module docstring); strict."""
    table: dict[bytes, Grant] = {}
    names: set[str] = set()
    for number, raw_line in enumerate(text.splitlines(), 1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            fields = line.split()
            if len(fields) < 2:
                raise ValueError("expected '<key> <name> [read=LIST] [write=LIST] [admin[=LIST]]'")
            key = _parse_key(fields[0])
            name = fields[1]
            if not _NAME.fullmatch(name):
                raise ValueError(f"name {name!r} is not 1-64 of A-Z a-z 0-9 _ . @ + -")
            perms: dict[str, StreamSet] = {}
            for token in fields[2:]:
                perm, eq, value = token.partition("=")
                if perm not in (READ, WRITE, ADMIN):
                    raise ValueError(f"unknown permission {perm!r} (read, write or admin)")
                if perm in perms:
                    raise ValueError(f"permission {perm!r} given twice")
                if not eq:
                    if perm != ADMIN:
                        raise ValueError(f"{perm} needs a list of streams: {perm}=10,20-29 or *")
                    value = "*"
                perms[perm] = StreamSet.parse(value)
            if key in table:
                raise ValueError(f"key already listed (as {table[key].name!r})")
            if name in names:
                raise ValueError(f"name {name!r} already used by another key")
        except ValueError as exc:
            raise ConfigurationError(
                "authorized_keys", f"{source}:{number}: {raw_line.strip()[:120]}", str(exc)
            ) from None
        names.add(name)
        table[key] = Grant(key, name, **perms)
    return table


def allowed(grant: Grant | None, op: str, stream_id: int | None = None) -> bool:
    """Whether ``grant`` may run ``op`` on ``stream_id`` (None: an operation with no stream,
    allowed with the permission on at least one stream). No grant: nothing (except what needs
    no permission)."""
    if op not in OP_PERMISSION:
        return False
    permission = OP_PERMISSION[op]
    if permission is None:
        return True
    if grant is None:
        return False
    streams = grant.streams(permission)
    return bool(streams) if stream_id is None else stream_id in streams


def request_streams(
    op: str, args: dict[str, Any], stream_of: Callable[[int], int]
) -> list[int] | None:
    """The streams a request touches (None: it names none): its ``stream_id``, ``stream_ids``,
    the stream of its ``recording_id`` and those of the staged parts it commits or aborts."""
    streams = named_streams(args)
    streams.extend(stream_of(rid) for rid in named_recordings(args))
    return sorted(set(streams)) or None


def named_recordings(args: dict[str, Any]) -> list[int]:
    """The recordings a request names: its ``recording_id``, its ``ranges``' recordings and,
    for ``consumer_commit``, the recording of every position (each must exist and be of a stream
    the key may read: a consumer's positions were merged as they came, so a key allowed to read
    one stream made the server hold any number of made-up recording ids,
    ``test_attack_consumer_registry.py``)."""
    recordings: list[int] = []
    if "recording_id" in args:
        recordings.append(int(args["recording_id"]))
    recordings.extend(int(r[0]) for r in args.get("ranges") or () if isinstance(r, list) and r)
    positions = args.get("positions")
    if isinstance(positions, list):
        recordings.extend(
            dict.fromkeys(int(pair[0]) for pair in positions if isinstance(pair, list) and pair)
        )
    return recordings


def named_streams(args: dict[str, Any]) -> list[int]:
    """The streams a request names itself: ``stream_id``, ``stream_ids``, staged parts'."""
    streams: list[int] = []
    if args.get("stream_id") is not None:  # a commit of several streams has none
        streams.append(int(args["stream_id"]))
    if args.get("stream_ids") is not None:
        streams.extend(int(s) for s in args["stream_ids"])
    for part in args.get("staged") or ():
        if isinstance(part, dict) and "stream_id" in part:
            streams.append(int(part["stream_id"]))
    return streams


class Authorizer:
    """The table of one authorized keys file, re-read when it changes (see the module docs)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: str | None = None  # what the last load saw: a content hash or an error
        self.table: dict[bytes, Grant] = {}
        self.load()

    def _read(self) -> tuple[str, bytes | OSError]:
        """The file's SHA-256 (hex) and bytes; ``("unreadable: ...", the error)`` when it
        cannot be read (deleted, permissions)."""
        try:
            # never blocking: a FIFO here waited for a writer for good (the start, or the
            # loop's reload); one is unreadable (NOT_REGULAR_FILE), a symlink is followed
            data = read_regular(self.path, follow=True)
        except OSError as exc:
            return f"unreadable: {exc.strerror or exc} (errno {exc.errno})", exc
        return hashlib.sha256(data).hexdigest(), data

    def load(self) -> set[bytes]:
        """(Re-)read the file; the keys that were removed. Raises ConfigurationError (the old
        table stays) or OSError if it cannot be read (also the old table)."""
        seen, data = self._read()
        self._seen = seen  # a failure is reported once, until the file changes again
        if isinstance(data, OSError):
            raise OSError(
                data.errno,
                f"cannot read the authorized keys file: {data.strerror or data}",
                self.path,
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigurationError("authorized_keys", self.path, f"UTF-8 text ({exc})") from None
        table = parse(text, self.path)
        removed = set(self.table) - set(table)
        self.table = table
        return removed

    def changed(self) -> bool:
        """Whether the file's content (or its readability) differs from what the last load
        saw: a hash of the bytes, so an edit that keeps size, inode and mtime is seen."""
        return self._read()[0] != self._seen

    def may(self, key: bytes, op: str, stream_id: int | None = None) -> bool:
        """Whether ``key`` may run ``op`` on ``stream_id`` under the current table."""
        return allowed(self.table.get(key), op, stream_id)

    def knows(self, key: bytes) -> bool:
        """Handshake admission: may this client key connect at all?"""
        return key in self.table

    def name_of(self, key: bytes) -> str:
        grant = self.table.get(key)
        return grant.name if grant is not None else f"unlisted:{fingerprint(key)[:16]}"

    def check(
        self, key: bytes, op: str, args: dict[str, Any], stream_of: Callable[[int], int]
    ) -> None:
        """Raise :class:`NotAuthorisedError` (naming stream and operation) unless allowed.
        The stream of a recording the client may not read is not named (the recording is)."""
        grant = self.table.get(key)
        who = grant.name if grant is not None else "an unlisted key"
        for recording_id in named_recordings(args):
            held = stream_of(recording_id)  # UnknownRecording for one that does not exist
            if not allowed(grant, op, held) and not allowed(grant, "replay", held):
                # answered exactly as a recording that does not exist (code, text, details):
                # a refusal naming it told a reader which ids exist on streams it may not read
                raise UnreadableRecordingError(
                    f"no recording {recording_id}", recording_id=recording_id
                )
        streams: Iterable[int | None] = request_streams(op, args, stream_of) or [None]
        for stream_id in streams:
            if not allowed(grant, op, stream_id):
                where = f"stream {stream_id}" if stream_id is not None else "any stream"
                raise NotAuthorisedError(
                    f"NOT_AUTHORISED: {op} on {where} is not authorised for client {who!r} "
                    f"(needs {OP_PERMISSION.get(op) or 'an operation the server serves'})",
                    op=op,
                    stream_id=stream_id,
                    client=who,
                )

    def visible(self, key: bytes, op: str, result: Any, stream_of: Callable[[int], int]) -> Any:
        """A listing narrowed to the streams ``key`` may read; a recording's producer address
        (``source``) only to a key that may write its stream; ``stats``: see :func:`_stats`."""
        grant = self.table.get(key)
        readable = grant.read if grant is not None else StreamSet()
        if op == "list_recordings":
            return _recordings(result, grant)
        if op == "stats":
            return _stats(result, grant, stream_of)
        if readable.everything:
            return result
        if op == "list_streams":
            return [r for r in result if r["stream_id"] in readable]
        if op == "latest_positions":
            return [pair for pair in result if stream_of(pair[0]) in readable]
        if op == "recording_positions":  # rows [recording_id, stream_id, ...]
            return [row for row in result if row[1] in readable]
        return result


# What ``stats`` shows of the whole server (every client's activity: counters of every
# session's requests, the store's totals, the handshake and the transport): only to a key with
# ``admin`` on every stream. Another key gets its own sessions and the streams it reads.
SERVER_WIDE_STATS = ("counters", "store", "handshake", "transport", "storage", "limits", "server")


def _recordings(rows: list[dict[str, Any]], grant: Grant | None) -> list[dict[str, Any]]:
    """Recordings of the streams ``grant`` reads; ``source`` (a producer's address and port,
    ``session:<ip>:<port>``, ``ingest:<ip>:<port>``, a sink's id ``sink:<id>``) shown only on
    the streams it may write, else only its kind (``session``, ``ingest``, ``sink``)."""
    readable = grant.read if grant is not None else StreamSet()
    writable = grant.write if grant is not None else StreamSet()
    out = []
    for row in rows:
        stream_id = row["stream_id"]
        if stream_id not in readable:
            continue
        if stream_id not in writable and isinstance(row.get("source"), str):
            row = {**row, "source": row["source"].partition(":")[0]}
        out.append(row)
    return out


def _stats(
    result: dict[str, Any], grant: Grant | None, stream_of: Callable[[int], int]
) -> dict[str, Any]:
    """``stats`` for ``grant``: everything with ``admin`` on every stream; otherwise the streams
    and recordings it reads (sources as :func:`_recordings`), its own sessions, the consumers of
    the streams it reads, ``store.recordings`` counting the recordings it reads, and none of
    :data:`SERVER_WIDE_STATS` (named in ``withheld``)."""
    if grant is not None and grant.admin.everything:
        return result
    readable = grant.read if grant is not None else StreamSet()
    name = grant.name if grant is not None else None
    out = {k: v for k, v in result.items() if k not in SERVER_WIDE_STATS}
    if "streams" in result:
        out["streams"] = [r for r in result["streams"] if r["stream_id"] in readable]
    if "recordings" in result:
        out["recordings"] = _recordings(result["recordings"], grant)
    out["sessions"] = [s for s in result.get("sessions", []) if s.get("client") == name]
    out["consumers"] = _readable_consumers(result.get("consumers", []), readable, stream_of)
    if "recordings" in out:
        out["store"] = {"recordings": len(out["recordings"])}
    out["withheld"] = [k for k in SERVER_WIDE_STATS if k in result and k not in out]
    return out


def _readable_consumers(
    consumers: list[dict[str, Any]], readable: StreamSet, stream_of: Callable[[int], int]
) -> list[dict[str, Any]]:
    """``stats.consumers`` narrowed: consumers of readable streams, with only those streams
    and the positions of their recordings."""

    def visible(recording_id: str) -> bool:
        try:
            return stream_of(int(recording_id)) in readable
        except Exception:  # noqa: BLE001 - a recording that is gone: not shown
            return False

    out = []
    for consumer in consumers:
        streams = [s for s in consumer["stream_ids"] if s in readable]
        if streams:
            positions = {r: p for r, p in consumer["positions"].items() if visible(r)}
            out.append({**consumer, "stream_ids": streams, "positions": positions})
    return out


__all__ = [
    "ADMIN",
    "OP_PERMISSION",
    "READ",
    "WRITE",
    "Authorizer",
    "Grant",
    "SERVER_WIDE_STATS",
    "StreamSet",
    "UnreadableRecordingError",
    "allowed",
    "named_recordings",
    "named_streams",
    "parse",
    "request_streams",
]
