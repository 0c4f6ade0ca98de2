"""The stream server's control protocol: messages exchanged on one session.

Every message on a session starts with a kind byte:

``0x01`` CONTROL
    a msgpack map. A request is exactly ``{"id": uint32, "op": str, "args": map}``; a reply is
    ``{"id": id, "ok": true, "result": any}`` or ``{"id": id, "ok": false, "error": {"code": int,
    "message": str, "details": map}}``. A request that cannot be decoded far enough to know its
    id is answered with id 0. The end of a replay is a reply-shaped event
    ``{"id": replay request id, "ok": ..., "event": "replay_end", "result": {"position": int}}``.
``0x02`` REPLAY_DATA
    a 32-byte binary header and raw recorded Aeron frames, no msgpack on the data path::

        kind (uint8) | 3 reserved | request id (uint32) | position (int64) |
        end position (int64) | timestamp ns (int64) | frames ...

``0x03`` CHUNK
    a piece of a message too large for one transport message (:mod:`connector.chunking`).

Decoding is strict (h11 style): msgpack limits on sizes, exact key sets, a schema per operation
with types and ranges; anything else raises :class:`ControlProtocolError` naming what is wrong.

Decoding is also bounded (issue 28, item 4: a 9.5 MiB request of nested empty maps took the
server from 46 to 796 MiB). A request's ``id``, ``op`` and the ``args`` key come first, in that
order, read with msgpack limits that admit no container; the operation then sets the limits its
``args`` are decoded with (:data:`LIMITS`, derived from its schema): the whole message's size
(64 KiB for a control request; data travels in ``publish``/``stage`` requests and lists of
staged parts or positions in ``commit``/``abort``/``consumer_commit``), msgpack's
``max_str_len``, ``max_bin_len``, ``max_array_len`` and ``max_map_len``, and a budget of items
(every element of every array and map together, counted as each container is built), so what a
request can make the server allocate is bounded by its operation, whatever its bytes say.

A ``publish`` or ``stage`` request of :data:`VIEW_DECODE_BYTES` (1 MiB) or more (a reassembled
large message) has its ``args`` read by :func:`_decode_payload_args` instead of msgpack, within
the same limits, its payloads views (``memoryview``) into the message (issue 31 item 5: msgpack
copies every ``bin`` out, so the server held a large message twice); the wire format is the same.
One with an array of more than :data:`VIEW_DECODE_MAX_ITEMS` items (many small payloads) is
still decoded by msgpack, much faster per item than a Python loop.
"""

from __future__ import annotations

import enum
import struct
import threading
from dataclasses import dataclass
from typing import Any

import msgpack

from aeron_spark.connector.errors import ConnectorError, ControlProtocolError, PayloadTooLargeError

KIND_CONTROL = 0x01
KIND_REPLAY_DATA = 0x02
KIND_CHUNK = 0x03

REPLAY_DATA_HEADER = struct.Struct("<B3xIqqq")
REPLAY_DATA_HEADER_LENGTH = REPLAY_DATA_HEADER.size

#: The control protocol's version. 1: the operations before issue 31. 2: ``limits`` (the
#: largest message a stream takes, so a client refuses a larger one before sending it); its
#: reply carries the server's version. A client finds a version 1 server by its "unknown
#: operation" answer and then refuses only what no server takes (Aeron's 16 MiB). 3:
#: ``local_read_ranges`` and ``replay_ranges`` (a packed partition's ranges in one request; a
#: client falls back to a request a range on the "unknown operation" of an older server).
CONTROL_PROTOCOL_VERSION = 3

MAX_CONTROL_MESSAGE_BYTES = 256 * 1024 * 1024  # a reply (what a client accepts)
MAX_REQUEST_ID = 0xFFFF_FFFF
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_SINK_ID_LENGTH = 200
MAX_STR_LENGTH = 4096
MAX_LIST_LENGTH = 10_000_000  # in a reply

# What one request may carry (the operation's LIMITS are derived from these and its schema)
MAX_CONTROL_REQUEST_BYTES = 64 * 1024  # a request with no payloads and no list of maps
MAX_LIST_REQUEST_BYTES = 8 * 1024 * 1024  # commit / abort (staged parts), consumer_commit
MAX_DATA_REQUEST_BYTES = 32 * 1024 * 1024  # publish / stage (payloads)
MAX_REQUEST_BYTES = MAX_DATA_REQUEST_BYTES  # the largest of them
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024  # one payload: Aeron's largest message
MAX_PAYLOADS_PER_REQUEST = 1 << 16  # a client sends at most this many per request
MAX_STREAM_IDS = 4096
MAX_STAGED_PARTS = 65536
MAX_POSITIONS = 65536

# --- argument schemas -------------------------------------------------------------------------
# Each argument: (kind, required). Kinds: "int32", "int64", "pos" (int64 >= 0), "uint32",
# "str", "bool", "pos?" / "int32_list?" (None allowed), "bytes_list", "int64_list?", "staged_list",
# "pos_pairs" ([[recording_id, position], ...]), "pos_triples" ([[recording_id, start, end], ...]).

# a staged part: one attempt of one partition of one batch of one sink, into one stream
_PART: dict[str, tuple[str, bool]] = {
    "sink_id": ("sink_id", True),
    "batch_id": ("pos", True),
    "partition_id": ("pos", True),
    "attempt": ("pos", True),
    "stream_id": ("int32", True),
}

OPS: dict[str, dict[str, tuple[str, bool]]] = {
    "list_streams": {},
    "list_recordings": {"stream_ids": ("int32_list?", False)},
    "latest_positions": {"stream_ids": ("int32_list?", False)},
    # the catalog's positions of many recordings at once, no scan (issue 31 item 3)
    "recording_positions": {"stream_ids": ("int32_list?", False)},
    "position_at": {"recording_id": ("pos", True), "timestamp_ns": ("int64", True)},
    "scan": {
        "recording_id": ("pos", True),
        "start": ("pos", True),
        "end": ("pos?", False),
        "max_messages": ("pos?", False),
        "max_bytes": ("pos?", False),
        "parts": ("uint32", False),
    },
    # whole messages of many ranges in one request, within one shared budget (issue 31 item 3)
    "scan_ranges": {
        "ranges": ("pos_triples", True),
        "max_messages": ("pos?", False),
        "max_bytes": ("pos?", False),
    },
    "replay": {
        "recording_id": ("pos", True),
        "start": ("pos", True),
        "end": ("pos?", False),
        "max_block_bytes": ("uint32", False),
    },
    "stop_replay": {"replay_id": ("uint32", True)},
    "local_read": {"recording_id": ("pos", True), "start": ("pos", True), "end": ("pos", True)},
    # control protocol version 3 (issue 31 item 2): the ranges of a packed input partition in
    # one request each way, a local read's directories or one replay of them all, in order
    "local_read_ranges": {"ranges": ("pos_triples", True)},
    "replay_ranges": {"ranges": ("pos_triples", True), "max_block_bytes": ("uint32", False)},
    "publish": {
        "stream_id": ("int32", True),
        "payloads": ("bytes_list", True),
        "reserved_values": ("int64_list?", False),
    },
    "stage": {
        **_PART,
        "payloads": ("bytes_list", True),
        "reserved_values": ("int64_list?", False),
        "final": ("bool", True),
    },
    "local_stage": _PART,
    "local_stage_done": {**_PART, "count": ("pos", True), "bytes": ("pos", True)},
    "commit": {
        "sink_id": ("sink_id", True),
        "batch_id": ("pos", True),
        # every part of this stream (absent or None: the parts' streams, several in one commit;
        # servers before issue 32 require it)
        "stream_id": ("int32?", False),
        "staged": ("staged_list", True),
    },
    "abort": {
        "sink_id": ("sink_id", True),
        "batch_id": ("pos", True),
        "staged": ("staged_list", True),
    },
    "last_committed_batch": {"sink_id": ("sink_id", True)},
    "purge": {"recording_id": ("pos", True), "position": ("pos", True)},
    "consumer_commit": {
        "consumer_id": ("sink_id", True),
        "stream_ids": ("int32_list", True),
        "positions": ("pos_pairs", True),
    },
    "consumer_forget": {"consumer_id": ("sink_id", True)},
    "stats": {},
    "keepalive": {},
    # control protocol version 2 (issue 31): the largest message each stream takes, asked
    # before a large publish is sent (a version 1 server answers "unknown operation")
    "limits": {"stream_ids": ("int32_list?", False)},
}


class Permission(enum.Enum):
    """What an operation needs of the session that asks, on the streams it touches (what an
    authorized keys file grants: ``connector/server/authz.py``)."""

    NONE = "none"  # any authenticated session, no stream: keep alive, stop one's own replay
    READ = "read"  # list, position, scan, replay, stats, consumer positions
    WRITE = "write"  # publish, stage and commit sink batches, ask which batch was committed
    ADMIN = "admin"  # purge recordings, forget consumers


@dataclass(frozen=True, slots=True)
class Access:
    """One operation's row of the permission column: the permission it needs and whether a
    read-only server (``--read-only``) serves it (it changes nothing that is stored)."""

    permission: Permission
    read_only_serves: bool


_NONE, _READ = Access(Permission.NONE, True), Access(Permission.READ, True)
_WRITE, _ADMIN = Access(Permission.WRITE, False), Access(Permission.ADMIN, False)

# The access of every operation of OPS: the one table the server's dispatch (core.HANDLERS), its
# read-only refusal (core.WRITE_OPS) and its per-client check (authz.OP_PERMISSION) derive from.
PERMISSIONS: dict[str, Access] = {
    "list_streams": _READ,
    "list_recordings": _READ,
    "latest_positions": _READ,
    "recording_positions": _READ,
    "position_at": _READ,
    "scan": _READ,
    "scan_ranges": _READ,
    "replay": _READ,
    "stop_replay": _NONE,  # the session's own replay
    "local_read": _READ,
    "local_read_ranges": _READ,
    "replay_ranges": _READ,
    "publish": _WRITE,
    "stage": _WRITE,
    "local_stage": _WRITE,
    "local_stage_done": _WRITE,
    "commit": _WRITE,
    "abort": _WRITE,
    # the sink's question (write), which a read-only server still answers: it changes nothing
    "last_committed_batch": Access(Permission.WRITE, read_only_serves=True),
    "purge": _ADMIN,
    "consumer_commit": _READ,
    "consumer_forget": _ADMIN,
    "stats": _READ,
    "keepalive": _NONE,
    "limits": _NONE,  # the server's configured limits: no stream's data
}
if set(PERMISSIONS) != set(OPS):  # pragma: no cover - caught at import by every test
    raise AssertionError(f"PERMISSIONS and OPS differ: {set(PERMISSIONS) ^ set(OPS)}")

# The commit message a stage returns (and commit/abort take back): a small picklable map.
STAGED_KEYS: dict[str, str] = {
    "sink_id": "sink_id",
    "batch_id": "pos",
    "partition_id": "pos",
    "attempt": "pos",
    "stream_id": "int32",
    "part": "str",
    "count": "pos",
    "bytes": "pos",
}


def _brief(value: object, depth: int = 0) -> str:
    """A short description of a peer's value: never the repr of a whole list or payload (that
    could be megabytes built to be cut to 80 characters)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, (list, tuple, dict)):
        if depth or not value:
            return f"<{type(value).__name__} of {len(value)}>"
        first = next(iter(value))
        return f"<{type(value).__name__} of {len(value)}, first {_brief(first, 1)}>"
    return f"{value!r:.80}"


def _fail(op: str, name: str, value: object, expected: str) -> ControlProtocolError:
    return ControlProtocolError(
        f"{op}: argument {name}={_brief(value)} is invalid: expected {expected}",
        op=op,
        argument=name,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(op: str, name: str, kind: str, value: object) -> None:
    if kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    if kind == "int32":
        if not (_is_int(value) and INT32_MIN <= value <= INT32_MAX):  # type: ignore[operator]
            raise _fail(op, name, value, "a 32-bit integer")
    elif kind == "int64":
        if not (_is_int(value) and INT64_MIN <= value <= INT64_MAX):  # type: ignore[operator]
            raise _fail(op, name, value, "a 64-bit integer")
    elif kind == "pos":
        if not (_is_int(value) and 0 <= value <= INT64_MAX):  # type: ignore[operator]
            raise _fail(op, name, value, "a non-negative 64-bit integer")
    elif kind == "uint32":
        if not (_is_int(value) and 0 <= value <= MAX_REQUEST_ID):  # type: ignore[operator]
            raise _fail(op, name, value, "an unsigned 32-bit integer")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _fail(op, name, value, "true or false")
    elif kind == "str":
        if not isinstance(value, str) or len(value) > 4096:
            raise _fail(op, name, value, "a string of at most 4096 characters")
    elif kind == "sink_id":
        if not isinstance(value, str) or not 0 < len(value) <= MAX_SINK_ID_LENGTH:
            raise _fail(
                op, name, value, f"a non-empty string of at most {MAX_SINK_ID_LENGTH} characters"
            )
    elif kind == "int32_list":
        if not isinstance(value, list) or not all(
            _is_int(v) and INT32_MIN <= v <= INT32_MAX for v in value
        ):
            raise _fail(op, name, value, "a list of 32-bit integers")
    elif kind == "int64_list":
        if not isinstance(value, list) or not all(
            _is_int(v) and INT64_MIN <= v <= INT64_MAX for v in value
        ):
            raise _fail(op, name, value, "a list of 64-bit integers")
    elif kind == "bytes_list":
        # bytes, or views into a large request (_decode_payload_args)
        if not isinstance(value, list) or not all(
            isinstance(v, (bytes, memoryview)) for v in value
        ):
            raise _fail(op, name, value, "a list of byte strings")
    elif kind == "pos_pairs":
        if not isinstance(value, list) or not all(
            isinstance(v, list)
            and len(v) == 2
            and all(_is_int(x) and 0 <= x <= INT64_MAX for x in v)
            for v in value
        ):
            raise _fail(op, name, value, "a list of [recording_id, position] pairs")
    elif kind == "pos_triples":
        if not isinstance(value, list) or not all(
            isinstance(v, list)
            and len(v) == 3
            and all(_is_int(x) and 0 <= x <= INT64_MAX for x in v)
            for v in value
        ):
            raise _fail(op, name, value, "a list of [recording_id, start, end] triples")
    elif kind == "staged_list":
        if not isinstance(value, list):
            raise _fail(op, name, value, "a list of staged-part maps (what stage returned)")
        for item in value:
            check_staged(op, name, item)
    else:  # pragma: no cover - a schema bug, not peer input
        raise AssertionError(f"unknown schema kind {kind}")


def check_staged(op: str, name: str, item: object) -> None:
    """Validate one commit message produced by ``stage``."""
    if not isinstance(item, dict) or set(item) != set(STAGED_KEYS):
        raise _fail(op, name, item, f"a staged-part map with keys {sorted(STAGED_KEYS)}")
    for key, kind in STAGED_KEYS.items():
        _check(op, f"{name}.{key}", kind, item[key])


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Limits:
    """What decoding one operation's request may take: the message's bytes, msgpack's limits
    for its ``args`` and the items (elements of all arrays and maps together) they may hold."""

    max_bytes: int
    max_str_len: int
    max_bin_len: int
    max_array_len: int
    max_map_len: int
    max_items: int


def limits_for(schema: dict[str, tuple[str, bool]]) -> Limits:
    """The decoding limits an operation's schema implies (one row of :data:`LIMITS`)."""
    max_bytes, str_len, bin_len, array_len = MAX_CONTROL_REQUEST_BYTES, 64, 0, 0
    map_len, items = len(schema), len(schema) + 1
    for kind, _ in schema.values():
        kind = kind.rstrip("?")
        if kind == "str":
            str_len = max(str_len, 4 * MAX_STR_LENGTH)  # characters: UTF-8 takes up to 4 bytes
        elif kind == "sink_id":
            str_len = max(str_len, 4 * MAX_SINK_ID_LENGTH)
        elif kind == "int32_list":
            array_len, items = max(array_len, MAX_STREAM_IDS), items + MAX_STREAM_IDS + 1
        elif kind in ("bytes_list", "int64_list"):
            max_bytes = MAX_DATA_REQUEST_BYTES
            array_len = max(array_len, MAX_PAYLOADS_PER_REQUEST)
            items += MAX_PAYLOADS_PER_REQUEST + 1
            if kind == "bytes_list":
                bin_len = MAX_PAYLOAD_BYTES
        elif kind == "staged_list":
            max_bytes = max(max_bytes, MAX_LIST_REQUEST_BYTES)
            array_len = max(array_len, MAX_STAGED_PARTS)
            map_len = max(map_len, len(STAGED_KEYS))
            str_len = max(str_len, 4 * MAX_STR_LENGTH)  # "part"
            # the list's elements, and each map's entries and itself
            items += MAX_STAGED_PARTS * (len(STAGED_KEYS) + 2) + 1
        elif kind == "pos_pairs":
            max_bytes = max(max_bytes, MAX_LIST_REQUEST_BYTES)
            array_len = max(array_len, MAX_POSITIONS)
            items += MAX_POSITIONS * 4 + 1  # the list's elements, each pair's two and itself
        elif kind == "pos_triples":
            max_bytes = max(max_bytes, MAX_LIST_REQUEST_BYTES)
            array_len = max(array_len, MAX_POSITIONS)
            items += MAX_POSITIONS * 5 + 1  # the list's elements, each triple's three and itself
    return Limits(max_bytes, str_len, bin_len, array_len, map_len, items)


# every operation's decoding limits, from its schema
LIMITS: dict[str, Limits] = {op: limits_for(schema) for op, schema in OPS.items()}


class _TooManyItems(ValueError):
    pass


def _counting_hook(max_items: int) -> Any:
    """A msgpack ``list_hook``/``object_hook`` that counts the items of each container as it is
    built and stops the decoding past ``max_items`` (msgpack's own limits are per container)."""
    seen = 0

    def hook(container: Any) -> Any:
        nonlocal seen
        seen += len(container) + 1
        if seen > max_items:
            raise _TooManyItems(f"more than {max_items} items")
        return container

    return hook


def items_bound(body_bytes: int) -> int:
    """The most items (as ``_counting_hook`` charges them: each container's length plus one)
    a msgpack body of ``body_bytes`` bytes can hold: 2B - 1. Every value but the outermost
    is an element of a list or one of a map entry's two (so elements and entries together
    are at most the values, V), every container but the outermost is one of those values
    (so containers are at most V + 1), and each value starts with a byte of its own, beside
    the outermost's (so V <= B - 1): items <= 2V + 1 <= 2B - 1. Reached by B nested arrays
    (``[[[...[]...]]]``)."""
    return 2 * body_bytes - 1


def _header_unpacker(message: bytes | bytearray | memoryview) -> msgpack.Unpacker:
    """An unpacker over a request's first bytes that admits no container: enough for the map
    header, ``id``, ``op`` and the ``args`` key, which come first and in that order."""
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        max_buffer_size=256,
        max_str_len=64,
        max_bin_len=0,
        max_array_len=0,
        max_map_len=0,
        max_ext_len=0,
    )
    unpacker.feed(memoryview(message)[1:257])
    return unpacker


def _why(exc: Exception) -> str:
    """What msgpack found wrong: its own text, or for its silent errors what they mean."""
    if isinstance(exc, msgpack.StackError):
        return "nested deeper than the decoder allows (1,024 levels of arrays and maps)"
    return str(exc) or type(exc).__name__


def _unpack(body: bytes | bytearray | memoryview) -> Any:
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=64 * 1024,
            max_bin_len=MAX_CONTROL_MESSAGE_BYTES,
            max_array_len=MAX_LIST_LENGTH,
            # a stats reply's transport positions are a map of ~7 entries a session (3,700 at
            # 512 sessions): bounded as lists are, its memory by the reply's size
            max_map_len=MAX_LIST_LENGTH,
            max_ext_len=0,
        )
    except (ValueError, msgpack.UnpackException) as exc:  # ExtraData, FormatError, StackError...
        raise ControlProtocolError(f"undecodable control message: {_why(exc)}") from exc


# --- payloads as views (issue 31 item 5) ------------------------------------------------------

#: A request carrying payloads (``publish``, ``stage``) at least this long is decoded by
#: :func:`_decode_payload_args`, its payloads views into the message (no copy); a shorter one
#: by msgpack (faster per payload, and its copy is at most this many bytes).
VIEW_DECODE_BYTES = 1024 * 1024
#: ... unless it holds an array of more than this many items: many small payloads, whose copies
#: cost little and which msgpack decodes about ten times faster than Python can.
VIEW_DECODE_MAX_ITEMS = 256

_FIXED_INTS = {
    0xCC: struct.Struct(">B"),
    0xCD: struct.Struct(">H"),
    0xCE: struct.Struct(">I"),
    0xCF: struct.Struct(">Q"),
    0xD0: struct.Struct(">b"),
    0xD1: struct.Struct(">h"),
    0xD2: struct.Struct(">i"),
    0xD3: struct.Struct(">q"),
}
_LENGTH_FIELDS = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}
# msgpack's type bytes for nil, false and true (the spec's 0xc0, 0xc2, 0xc3; named, and spelt in
# decimal, so that no one takes them for the DATA header's flags)
_MSGPACK_NIL, _MSGPACK_FALSE, _MSGPACK_TRUE = 192, 194, 195
# tag -> (family, bytes of its length field) for the forms whose length follows the tag
_SIZED = {
    0xD9: ("str", 1),
    0xDA: ("str", 2),
    0xDB: ("str", 4),
    0xC4: ("bin", 1),
    0xC5: ("bin", 2),
    0xC6: ("bin", 4),
    0xDC: ("array", 2),
    0xDD: ("array", 4),
    0xDE: ("map", 2),
    0xDF: ("map", 4),
}


class _Undecodable(ValueError):
    pass


class _ManyItems(Exception):
    """An array of more than :data:`VIEW_DECODE_MAX_ITEMS`: msgpack decodes the request."""


def _decode_payload_args(op: str, body: memoryview, limits: Limits) -> Any:
    """The ``args`` of a ``publish`` or ``stage`` request, decoded with every byte string
    (``bin``) a ``memoryview`` into ``body``: no payload is copied.

    Why not msgpack: ``msgpack.unpackb`` returns each ``bin`` as a new ``bytes`` (it has no
    zero-copy mode), so a reassembled 16 MiB publish was held twice, the message and its
    decoded payload. This reads only what these two operations' arguments can be: one map of
    string keys whose values are nil, booleans, integers, strings, byte strings or arrays of
    those (one level); anything else (floats, ext, nested containers) is refused as msgpack's
    result would be by the schema. It applies the operation's msgpack limits (:data:`LIMITS`:
    string, bin, array and map lengths, the items budget), refuses bytes after the map (as
    msgpack's ``ExtraData``) and a truncated value, and its result goes through the same schema
    checks, so it accepts what the msgpack path accepts, with the same values (byte strings as
    views), and refuses what it refuses (test_server_protocol.py decodes the same inputs both
    ways). The views keep the message alive until the request is done with them. An array of
    more than :data:`VIEW_DECODE_MAX_ITEMS` raises ``_ManyItems``: the caller decodes with
    msgpack then (a Python loop per item took ~9x msgpack's time for 65,536 small payloads)."""
    n = len(body)
    at = 0

    def need(count: int) -> None:
        if at + count > n:
            raise _Undecodable("truncated")

    def sized(tag: int) -> tuple[str, int]:
        """The family of a str/bin/array/map tag and the length it announces."""
        nonlocal at
        if 0xA0 <= tag <= 0xBF:
            return "str", tag & 0x1F
        if 0x90 <= tag <= 0x9F:
            return "array", tag & 0x0F
        if 0x80 <= tag <= 0x8F:
            return "map", tag & 0x0F
        family, width = _SIZED.get(tag, ("", 0))
        if not width:
            return "", 0
        need(width)
        size = int(_LENGTH_FIELDS[width].unpack_from(body, at)[0])
        at += width
        return family, size

    def value(nested: bool) -> Any:
        nonlocal at
        need(1)
        tag = body[at]
        at += 1
        if tag <= 0x7F:
            return tag
        if tag >= 0xE0:
            return tag - 0x100
        if tag == _MSGPACK_NIL:
            return None
        if tag in (_MSGPACK_FALSE, _MSGPACK_TRUE):
            return tag == _MSGPACK_TRUE
        fmt = _FIXED_INTS.get(tag)
        if fmt is not None:
            need(fmt.size)
            number = fmt.unpack_from(body, at)[0]
            at += fmt.size
            return number
        family, size = sized(tag)
        if family == "str":
            if size > limits.max_str_len:
                raise _Undecodable(f"{size} exceeds max_str_len({limits.max_str_len})")
            need(size)
            text = bytes(body[at : at + size]).decode("utf-8")  # UnicodeDecodeError: ValueError
            at += size
            return text
        if family == "bin":
            if size > limits.max_bin_len:
                raise _Undecodable(f"{size} exceeds max_bin_len({limits.max_bin_len})")
            need(size)
            view = body[at : at + size]
            at += size
            return view
        if family == "array" and not nested:
            if size > VIEW_DECODE_MAX_ITEMS:
                raise _ManyItems
            if size > limits.max_array_len:
                raise _Undecodable(f"{size} exceeds max_array_len({limits.max_array_len})")
            count(size)
            return [value(True) for _ in range(size)]
        raise _Undecodable(f"type 0x{tag:02x} is not taken in {op}'s arguments")

    items = 0

    def count(size: int) -> None:
        """msgpack's items budget (``_counting_hook``), charged before the container is built."""
        nonlocal items
        items += size + 1
        if items > limits.max_items:
            raise _Undecodable(f"more than {limits.max_items} items")

    need(1)
    tag = body[at]
    at += 1
    family, entries = sized(tag)
    if family != "map":
        raise ControlProtocolError(f"{op}: args must be a map", op=op)
    if entries > limits.max_map_len:
        raise _Undecodable(f"{entries} exceeds max_map_len({limits.max_map_len})")
    args: dict[str, Any] = {}
    for _ in range(entries):
        key = value(True)
        if not isinstance(key, str):
            raise _Undecodable(f"{type(key).__name__} is not allowed for map key")
        args[key] = value(False)
    count(len(args))
    if at != n:
        raise _Undecodable(f"{n - at} bytes after the arguments")
    return args


_CONTROL_KIND = bytes((KIND_CONTROL,))
# One packer a thread: ``msgpack.packb`` makes a Packer (and its buffer) a call, ~4 of the ~5
# us an encode took on the project's machine (every request of a client: issue 31). A Packer
# is not shared between threads: its buffer is written during pack().
_packers = threading.local()


def encode_request(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    try:
        pack = _packers.pack
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    return _CONTROL_KIND + pack({"id": request_id, "op": op, "args": args})


#: A payload at least this long is not copied into an encoded request (encode_request_parts).
INLINE_PAYLOAD_BYTES = 64 * 1024


def _bin_header(length: int) -> bytes:
    """msgpack's bin 8/16/32 header for ``length`` bytes (as ``packb(use_bin_type=True)``)."""
    if length < 0x100:
        return struct.pack(">BB", 0xC4, length)
    if length < 0x10000:
        return struct.pack(">BH", 0xC5, length)
    return struct.pack(">BI", 0xC6, length)


def encode_request_parts(
    request_id: int, op: str, args: dict[str, Any]
) -> list[bytes | bytearray | memoryview]:
    """The bytes of :func:`encode_request` as a list of parts whose concatenation they are,
    with every payload of ``args["payloads"]`` of :data:`INLINE_PAYLOAD_BYTES` or more left as
    its own part (the caller's object, not copied): a sender chunks the parts
    (``chunking.split_parts``) and never holds a second copy of a large message."""
    payloads = args.get("payloads")
    if not isinstance(payloads, list) or not any(len(p) >= INLINE_PAYLOAD_BYTES for p in payloads):
        return [encode_request(request_id, op, args)]
    packer = msgpack.Packer(use_bin_type=True)
    parts: list[bytes | bytearray | memoryview] = []
    head = bytearray((KIND_CONTROL,))
    head += packer.pack_map_header(3)
    head += packer.pack("id") + packer.pack(request_id)
    head += packer.pack("op") + packer.pack(op)
    head += packer.pack("args") + packer.pack_map_header(len(args))
    for name, value in args.items():
        head += packer.pack(name)
        if name != "payloads":
            head += packer.pack(value)
            continue
        head += packer.pack_array_header(len(value))
        for payload in value:
            head += _bin_header(len(payload))
            if len(payload) < INLINE_PAYLOAD_BYTES:
                head += payload
            else:
                parts.append(head)
                parts.append(payload)
                head = bytearray()
    parts.append(head)
    return parts


def request_head(message: bytes | bytearray | memoryview) -> tuple[int, str] | None:
    """A CONTROL request's id and operation, read without decoding its ``args`` (a few bytes
    at the start of the message); None for anything :func:`decode_request` would refuse there
    (it then says why). What a server refuses by its operation alone (a session's deferred
    requests over their limit) is refused before its arguments cost a decode."""
    if not (2 <= len(message) <= MAX_REQUEST_BYTES) or message[0] != KIND_CONTROL:
        return None
    try:
        header = _header_unpacker(message)
        if header.read_map_header() != 3 or header.unpack() != "id":
            return None
        rid = header.unpack()
        if not (_is_int(rid) and 0 <= rid <= MAX_REQUEST_ID) or header.unpack() != "op":
            return None
        op = header.unpack()
    except (ValueError, msgpack.UnpackException):
        return None
    return (rid, op) if isinstance(op, str) and op in OPS else None


def _plain_head(message: bytes | bytearray | memoryview) -> tuple[int, str, int] | None:
    """A request's id, op and where its args start when its head is encoded as msgpack packs
    it (a map of 3, ``id`` a positive fixint or uint8/16/32, ``op`` a fixstr of a known
    operation, then ``args``); None for anything else (:func:`_unpacked_head` reads it, or
    names what is wrong). Made for the stream server's loop: a strict unpacker made for each
    request's head, part of decode_request (a fifth of a publish's CPU in the core, issue
    31)."""
    if len(message) < 15 or bytes(message[1:5]) != b"\x83\xa2id":  # 15: the shortest head
        return None
    tag = message[5]
    if tag < 0x80:
        rid, at = tag, 6
    elif tag == 0xCC:
        rid, at = message[6], 7
    elif tag == 0xCD:
        rid, at = int.from_bytes(message[6:8], "big"), 8
    elif tag == 0xCE:
        rid, at = int.from_bytes(message[6:10], "big"), 10
    else:
        return None
    if bytes(message[at : at + 3]) != b"\xa2op":
        return None
    tag = message[at + 3]
    if not 0xA0 <= tag <= 0xBF:
        return None
    at += 4
    end = at + (tag & 0x1F)
    op = _OP_NAMES.get(bytes(message[at:end]))
    if op is not None and op not in OPS:  # OPS decides (a test removes one: an older server)
        op = None
    if op is None or bytes(message[end : end + 5]) != b"\xa4args":
        return None
    return rid, op, end + 5


def _unpacked_head(message: bytes | bytearray | memoryview, shape: str) -> tuple[int, str, int]:
    """A request's id, op and where its args start, read with a strict unpacker (any encoding
    msgpack admits); raises :class:`ControlProtocolError` naming what is wrong (with the
    request's id in its details once the id was read)."""
    rid: int | None = None
    try:
        try:
            header = _header_unpacker(message)
            entries = header.read_map_header()
            if entries >= 1 and header.unpack() == "id":
                value = header.unpack()
                if not (_is_int(value) and 0 <= value <= MAX_REQUEST_ID):
                    raise ControlProtocolError(
                        f"request id {value!r:.40} is not an unsigned 32-bit integer"
                    )
                rid = value
            if entries != 3 or rid is None or header.unpack() != "op":
                raise ControlProtocolError(shape)
            op = header.unpack()
            if not isinstance(op, str) or op not in OPS:
                raise ControlProtocolError(
                    f"unknown operation {op!r:.60}; known: {sorted(OPS)}", op=op
                )
            if header.unpack() != "args":
                raise ControlProtocolError(shape)
            return rid, op, 1 + header.tell()
        except (ValueError, msgpack.UnpackException) as exc:
            raise ControlProtocolError(f"{shape}: {_why(exc)}") from exc
    except ControlProtocolError as exc:
        if rid is not None:
            exc.details["request_id"] = rid
        raise


_OP_NAMES = {op.encode(): op for op in OPS}


def decode_request(message: bytes | bytearray | memoryview) -> Request:
    """Strictly decode and validate a CONTROL request (kind byte included), within the limits of
    its operation (:data:`LIMITS`).

    Raises :class:`ControlProtocolError` (:class:`PayloadTooLargeError` for a message longer than
    its operation allows); its ``details["request_id"]`` holds the id when the message got far
    enough to have one, so the error can be answered on that id.
    """
    if len(message) > MAX_REQUEST_BYTES:
        raise PayloadTooLargeError(
            f"request of {len(message)} bytes (a request is at most {MAX_REQUEST_BYTES})",
            length=len(message),
            limit=MAX_REQUEST_BYTES,
        )
    if len(message) < 2 or message[0] != KIND_CONTROL:
        raise ControlProtocolError(
            f"expected a control message (kind 0x01), got {len(message)} bytes starting "
            f"{bytes(message[:1]).hex() or 'empty'}"
        )
    rid: int | None = None
    shape = "a request is a map with exactly the keys id, op and args, in that order"
    try:
        head = _plain_head(message)
        if head is not None:  # as msgpack encodes them (the clients'): no unpacker made
            rid, op, args_at = head
        else:
            rid, op, args_at = _unpacked_head(message, shape)
        limits = LIMITS[op]
        if len(message) > limits.max_bytes:
            raise PayloadTooLargeError(
                f"{op}: request of {len(message)} bytes (at most {limits.max_bytes})",
                op=op,
                length=len(message),
                limit=limits.max_bytes,
            )
        # the items budget's hook only for a body that could exceed it (3 Python calls a small
        # publish saved): a body of B bytes holds at most 2B - 1 items (ITEMS_BOUND)
        hook = (
            _counting_hook(limits.max_items)
            if items_bound(len(message) - args_at) > limits.max_items
            else None
        )
        try:
            args = None
            if limits.max_bin_len and len(message) >= VIEW_DECODE_BYTES:
                try:
                    args = _decode_payload_args(op, memoryview(message)[args_at:], limits)
                except _ManyItems:
                    pass  # many small payloads: msgpack's copies are cheap, its loop fast
            if args is None:
                args = msgpack.unpackb(
                    memoryview(message)[args_at:],
                    raw=False,
                    strict_map_key=True,
                    use_list=True,
                    max_str_len=limits.max_str_len,
                    max_bin_len=limits.max_bin_len,
                    max_array_len=limits.max_array_len,
                    max_map_len=limits.max_map_len,
                    max_ext_len=0,
                    list_hook=hook,
                    object_hook=hook,
                )
        except (ValueError, msgpack.UnpackException) as exc:  # ExtraData, FormatError, ...
            raise ControlProtocolError(f"{op}: undecodable args: {_why(exc)}", op=op) from exc
        schema = OPS[op]
        if not isinstance(args, dict):
            raise ControlProtocolError(f"{op}: args must be a map", op=op)
        unknown = set(args) - set(schema)
        if unknown:
            raise ControlProtocolError(f"{op}: unknown arguments {sorted(unknown)}", op=op)
        for name, (kind, required) in schema.items():
            if name not in args:
                if required:
                    raise ControlProtocolError(
                        f"{op}: missing argument {name}", op=op, argument=name
                    )
                continue
            _check(op, name, kind, args[name])
    except ControlProtocolError as exc:
        if rid is not None:
            exc.details["request_id"] = rid
        raise
    return Request(rid, op, args)


def encode_ok(request_id: int, result: Any) -> bytes:
    return bytes((KIND_CONTROL,)) + msgpack.packb(
        {"id": request_id, "ok": True, "result": result}, use_bin_type=True
    )


def encode_error(request_id: int, error: ConnectorError) -> bytes:
    return bytes((KIND_CONTROL,)) + msgpack.packb(
        {"id": request_id, "ok": False, "error": error.to_wire()}, use_bin_type=True, default=repr
    )


def encode_event(request_id: int, event: str, result: Any) -> bytes:
    return bytes((KIND_CONTROL,)) + msgpack.packb(
        {"id": request_id, "ok": True, "event": event, "result": result}, use_bin_type=True
    )


def encode_event_error(request_id: int, event: str, error: ConnectorError) -> bytes:
    return bytes((KIND_CONTROL,)) + msgpack.packb(
        {"id": request_id, "ok": False, "event": event, "error": error.to_wire()},
        use_bin_type=True,
        default=repr,
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """A decoded reply or event: ``ok`` with ``result``, or ``error`` (a raw error map)."""

    id: int
    ok: bool
    result: Any
    error: Any
    event: str | None


def decode_reply(message: bytes | bytearray | memoryview) -> Reply:
    if len(message) < 2 or message[0] != KIND_CONTROL:
        raise ControlProtocolError("expected a control reply")
    body = _unpack(memoryview(message)[1:])
    if (
        not isinstance(body, dict)
        or not _is_int(body.get("id"))
        or not isinstance(body.get("ok"), bool)
    ):
        raise ControlProtocolError(f"malformed reply {body!r:.200}")
    keys = set(body) - {"event"}
    if keys != ({"id", "ok", "result"} if body["ok"] else {"id", "ok", "error"}):
        raise ControlProtocolError(f"malformed reply keys {sorted(body)}")
    event = body.get("event")
    if event is not None and not isinstance(event, str):
        raise ControlProtocolError("malformed reply event")
    return Reply(body["id"], body["ok"], body.get("result"), body.get("error"), event)


def encode_replay_header(
    request_id: int, position: int, end_position: int, timestamp_ns: int
) -> bytes:
    return REPLAY_DATA_HEADER.pack(
        KIND_REPLAY_DATA, request_id, position, end_position, timestamp_ns
    )


def decode_replay_data(
    message: bytes | bytearray | memoryview,
) -> tuple[int, int, int, int, memoryview]:
    """``(request_id, position, end_position, timestamp_ns, frames)`` of a REPLAY_DATA message."""
    if len(message) < REPLAY_DATA_HEADER_LENGTH or message[0] != KIND_REPLAY_DATA:
        raise ControlProtocolError(f"malformed replay data message ({len(message)} bytes)")
    _, rid, position, end_position, ts = REPLAY_DATA_HEADER.unpack_from(message, 0)
    if end_position < position or position < 0:
        raise ControlProtocolError(f"replay data with bad range [{position}, {end_position})")
    return rid, position, end_position, ts, memoryview(message)[REPLAY_DATA_HEADER_LENGTH:]


__all__ = [
    "CONTROL_PROTOCOL_VERSION",
    "KIND_CHUNK",
    "KIND_CONTROL",
    "KIND_REPLAY_DATA",
    "LIMITS",
    "Limits",
    "OPS",
    "PERMISSIONS",
    "REPLAY_DATA_HEADER",
    "REPLAY_DATA_HEADER_LENGTH",
    "Access",
    "Permission",
    "Reply",
    "Request",
    "STAGED_KEYS",
    "check_staged",
    "decode_replay_data",
    "decode_reply",
    "decode_request",
    "request_head",
    "encode_error",
    "encode_event",
    "encode_event_error",
    "encode_ok",
    "encode_replay_header",
    "encode_request",
    "encode_request_parts",
]
