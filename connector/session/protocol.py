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
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any

import msgpack
from aeron_spark.connector.errors import ConnectorError, ControlProtocolError, PayloadTooLargeError

KIND_CONTROL = 0x01
KIND_REPLAY_DATA = 0x02
KIND_CHUNK = 0x03

REPLAY_DATA_HEADER = struct.Struct("<B3xIqqq")
REPLAY_DATA_HEADER_LENGTH = REPLAY_DATA_HEADER.size

MAX_CONTROL_MESSAGE_BYTES = 256 * 1024 * 1024
MAX_REQUEST_ID = 0xFFFF_FFFF
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_SINK_ID_LENGTH = 200
MAX_LIST_LENGTH = 10_000_000

# --- argument schemas -------------------------------------------------------------------------
# Each argument: (kind, required). Kinds: "int32", "int64", "pos" (int64 >= 0), "uint32",
# "str", "bool", "pos?" / "int32_list?" (None allowed), "bytes_list", "int64_list?", "staged_list",
# "pos_pairs" ([[recording_id, position], ...]).

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
    "position_at": {"recording_id": ("pos", True), "timestamp_ns": ("int64", True)},
    "scan": {
        "recording_id": ("pos", True),
        "start": ("pos", True),
        "end": ("pos?", False),
        "max_messages": ("pos?", False),
        "max_bytes": ("pos?", False),
        "parts": ("uint32", False),
    },
    "replay": {
        "recording_id": ("pos", True),
        "start": ("pos", True),
        "end": ("pos?", False),
        "max_block_bytes": ("uint32", False),
    },
    "stop_replay": {"replay_id": ("uint32", True)},
    "local_read": {"recording_id": ("pos", True), "start": ("pos", True), "end": ("pos", True)},
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
    "position_at": _READ,
    "scan": _READ,
    "replay": _READ,
    "stop_replay": _NONE,  # the session's own replay
    "local_read": _READ,
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


def _fail(op: str, name: str, value: object, expected: str) -> ControlProtocolError:
    return ControlProtocolError(
        f"{op}: argument {name}={value!r:.80} is invalid: expected {expected}", op=op, argument=name
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
        if not isinstance(value, list) or not all(isinstance(v, bytes) for v in value):
            raise _fail(op, name, value, "a list of byte strings")
    elif kind == "pos_pairs":
        if not isinstance(value, list) or not all(
            isinstance(v, list)
            and len(v) == 2
            and all(_is_int(x) and 0 <= x <= INT64_MAX for x in v)
            for v in value
        ):
            raise _fail(op, name, value, "a list of [recording_id, position] pairs")
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
            max_map_len=1024,
            max_ext_len=0,
        )
    except (ValueError, msgpack.UnpackException) as exc:  # ExtraData, FormatError, StackError...
        raise ControlProtocolError(f"undecodable control message: {exc}") from exc


def encode_request(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    return bytes((KIND_CONTROL,)) + msgpack.packb(
        {"id": request_id, "op": op, "args": args}, use_bin_type=True
    )


def decode_request(message: bytes | bytearray | memoryview) -> Request:
    """Strictly decode and validate a CONTROL request (kind byte included).

    Raises :class:`ControlProtocolError`; its ``details["request_id"]`` holds the id when the
    message got far enough to have one, so the error can be answered on that id.
    """
    if len(message) > MAX_CONTROL_MESSAGE_BYTES:
        raise PayloadTooLargeError(
            f"control message of {len(message)} bytes",
            length=len(message),
            limit=MAX_CONTROL_MESSAGE_BYTES,
        )
    if len(message) < 2 or message[0] != KIND_CONTROL:
        raise ControlProtocolError(
            f"expected a control message (kind 0x01), got {len(message)} bytes starting "
            f"{bytes(message[:1]).hex() or 'empty'}"
        )
    body = _unpack(memoryview(message)[1:])
    if not isinstance(body, dict) or set(body) != {"id", "op", "args"}:
        rid = body.get("id") if isinstance(body, dict) else None
        err = ControlProtocolError("a request is a map with exactly the keys id, op and args")
        if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid <= MAX_REQUEST_ID:
            err.details["request_id"] = rid
        raise err
    rid, op, args = body["id"], body["op"], body["args"]
    if not (_is_int(rid) and 0 <= rid <= MAX_REQUEST_ID):
        raise ControlProtocolError(f"request id {rid!r:.40} is not an unsigned 32-bit integer")
    try:
        schema = OPS.get(op) if isinstance(op, str) else None
        if schema is None:
            raise ControlProtocolError(f"unknown operation {op!r:.60}; known: {sorted(OPS)}", op=op)
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
    "KIND_CHUNK",
    "KIND_CONTROL",
    "KIND_REPLAY_DATA",
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
    "encode_error",
    "encode_event",
    "encode_event_error",
    "encode_ok",
    "encode_replay_header",
    "encode_request",
]
