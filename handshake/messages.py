"""Handshake messages and session frames: codecs with strict decoding.

Handshake messages are msgpack maps with a type field ``t``; every field is checked for presence,
type and range, and unknown keys are refused, so anything odd becomes a
:class:`RemoteProtocolError` at the boundary::

    HELLO    client -> server, handshake channel
             {t: 1, v: version, ck: connect key (1..2**63-1), pk: X25519 ephemeral public key
              (32 bytes), enc: bool (client wants sealed data),
              [cookie: 16 bytes, from COOKIE, id: 48 bytes, the client's static public key
              sealed for the server (see :mod:`.crypto`)], [pad: zero bytes]}
             the first HELLO (no cookie) is padded with 32 zero bytes so that it is longer than
             the COOKIE answering it (never more bytes back than a sender sent)
    COOKIE   server -> client, reply channel  {t: 6, ck, cookie: 16 bytes, spk: server static
             key (32)}
             the answer to a HELLO without a valid cookie: the client checks ``spk`` (pinned or
             known) and sends its HELLO again with the cookie and its sealed identity (same ck,
             pk and enc). A cookie is a MAC, under a secret only the server knows, of the HELLO's
             source address and port (``ipc`` over IPC), ck, pk, enc and a coarse time, so the
             server keeps no state and allocates nothing until a client has shown it receives
             at its address (DTLS HelloVerifyRequest, QUIC Retry) and who it is.
    WELCOME  server -> client, reply channel (all clients listen; addressed by ck)
             {t: 2, ck, spk: server static key (32), epk: server ephemeral key (32),
              box: AES-GCM sealed SessionDetails}
    REFUSE   server -> client, reply channel   {t: 3, ck, code: ErrorCode, msg: text}
    DONE     client -> server, first message on the private pair  {t: 4, proof: 16-byte tag}
    CONFIRM  server -> client, first message on the private pair  {t: 5, proof: 16-byte tag}

After CONFIRM every message on the pair is a *session frame*: one kind byte (DATA, PING, PONG,
CLOSE) and a body; sealed sessions wrap it as ``counter (8 bytes, big-endian) || AES-GCM(frame)``
(see :mod:`.crypto`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgpack

from aeron_spark.handshake.errors import ErrorCode, RemoteProtocolError

# 2: the COOKIE round trip; 3: client identity (sealed) and 4-DH keys; 4: a resumption token in
# the WELCOME's sealed details (a cookie for the client's next HELLOs from the same source);
# 5: the identity box carries a proof of the client's private key (X25519(cs, ss)), and a
# resumption token admits one HELLO, of the client key it was issued to
PROTOCOL_VERSION = 5
KEY_LENGTH = 32
COOKIE_LENGTH = 16
PROOF_LENGTH = 16
IDENTITY_LENGTH = 64  # a 32-byte key and its 16-byte proof sealed with AES-GCM
HELLO_PADDING = 32  # a first HELLO is longer than the COOKIE (which carries the server's key)
MAX_HANDSHAKE_MESSAGE_LENGTH = 1024
MAX_CONNECT_KEY = 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class MessageType(enum.IntEnum):
    HELLO = 1
    WELCOME = 2
    REFUSE = 3
    DONE = 4
    CONFIRM = 5
    COOKIE = 6


class FrameKind(enum.IntEnum):
    """First byte of a session frame."""

    DATA = 0
    PING = 1
    PONG = 2
    CLOSE = 3


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    connect_key: int
    public_key: bytes
    encryption: bool
    cookie: bytes = b""  # empty: the first HELLO, before the server's COOKIE
    identity: bytes = b""  # the sealed client static key (with the cookie only)

    def encode(self) -> bytes:
        body = {
            "t": MessageType.HELLO,
            "v": self.version,
            "ck": self.connect_key,
            "pk": self.public_key,
            "enc": self.encryption,
        }
        if self.cookie:
            body["cookie"] = self.cookie
        if self.identity:
            body["id"] = self.identity
        if not self.cookie:
            body["pad"] = bytes(HELLO_PADDING)
        return _pack(body)


@dataclass(frozen=True, slots=True)
class Cookie:
    connect_key: int
    cookie: bytes
    server_key: bytes

    def encode(self) -> bytes:
        return _pack(
            {
                "t": MessageType.COOKIE,
                "ck": self.connect_key,
                "cookie": self.cookie,
                "spk": self.server_key,
            }
        )


@dataclass(frozen=True, slots=True)
class Welcome:
    connect_key: int
    server_key: bytes
    ephemeral_key: bytes
    box: bytes

    def encode(self) -> bytes:
        return _pack(
            {
                "t": MessageType.WELCOME,
                "ck": self.connect_key,
                "spk": self.server_key,
                "epk": self.ephemeral_key,
                "box": self.box,
            }
        )


@dataclass(frozen=True, slots=True)
class Refuse:
    connect_key: int
    code: int
    message: str

    def encode(self) -> bytes:
        return _pack(
            {
                "t": MessageType.REFUSE,
                "ck": self.connect_key,
                "code": self.code,
                "msg": self.message[:256],
            }
        )


@dataclass(frozen=True, slots=True)
class Done:
    proof: bytes

    def encode(self) -> bytes:
        return _pack({"t": MessageType.DONE, "proof": self.proof})


@dataclass(frozen=True, slots=True)
class Confirm:
    proof: bytes

    def encode(self) -> bytes:
        return _pack({"t": MessageType.CONFIRM, "proof": self.proof})


Message = Hello | Welcome | Refuse | Done | Confirm | Cookie


@dataclass(frozen=True, slots=True)
class SessionDetails:
    """What the server allocated for one client, sealed inside WELCOME.

    ``c2s_*`` is the client's publication (session id and stream id the server subscribes to),
    ``s2c_*`` the server's publication to the client. ``encryption`` is whether session frames are
    sealed, ``max_message_length`` the largest message either side may send, ``term_length`` and
    ``mtu`` what the client's publication should use. ``resume_token`` is a cookie for the
    client's next HELLOs from the same source address and port (for 10 to 20 s): sealed, so only
    this client learns it (a COOKIE goes to every client joined to the reply channel).
    """

    c2s_session_id: int
    c2s_stream_id: int
    s2c_session_id: int
    s2c_stream_id: int
    encryption: bool
    max_message_length: int
    term_length: int
    mtu: int
    resume_token: bytes = b"\0" * COOKIE_LENGTH

    _KEYS = ("cs", "cx", "ss", "sx", "enc", "mml", "tl", "mtu", "rt")

    def encode(self) -> bytes:
        return _pack(
            dict(
                zip(
                    self._KEYS,
                    (
                        self.c2s_session_id,
                        self.c2s_stream_id,
                        self.s2c_session_id,
                        self.s2c_stream_id,
                        self.encryption,
                        self.max_message_length,
                        self.term_length,
                        self.mtu,
                        self.resume_token,
                    ),
                    strict=True,
                )
            )
        )

    @classmethod
    def decode(cls, data: bytes) -> SessionDetails:
        body = _unpack(data)
        _exact_keys(body, set(cls._KEYS), "session details")
        cs, cx, ss, sx = (_int(body, k, _INT32_MIN, _INT32_MAX) for k in ("cs", "cx", "ss", "sx"))
        return cls(
            cs,
            cx,
            ss,
            sx,
            encryption=_bool(body, "enc"),
            max_message_length=_int(body, "mml", 1, 2**31 - 1),
            term_length=_int(body, "tl", 64 * 1024, 1024 * 1024 * 1024),
            mtu=_int(body, "mtu", 64, 65504),
            resume_token=_bin(body, "rt", COOKIE_LENGTH, COOKIE_LENGTH),
        )


def decode_message(data: bytes | memoryview) -> Message:
    """Decode one handshake message; anything malformed raises :class:`RemoteProtocolError`."""
    if len(data) > MAX_HANDSHAKE_MESSAGE_LENGTH:
        raise RemoteProtocolError(
            f"handshake message of {len(data)} bytes (at most {MAX_HANDSHAKE_MESSAGE_LENGTH})"
        )
    body = _unpack(bytes(data))
    kind = body.get("t")
    if type(kind) is not int:
        raise RemoteProtocolError("handshake message without an integer type 't'")
    if kind == MessageType.HELLO:
        keys = {"t", "v", "ck", "pk", "enc"}
        keys |= {"cookie"} & set(body)
        keys |= {"id", "pad"} & set(body)
        _exact_keys(body, keys, "HELLO")
        if "pad" in body:
            _bin(body, "pad", 0, 256)
        return Hello(
            version=_int(body, "v", 0, 2**16),
            connect_key=_int(body, "ck", 1, MAX_CONNECT_KEY),
            public_key=_bin(body, "pk", KEY_LENGTH, KEY_LENGTH),
            encryption=_bool(body, "enc"),
            cookie=_bin(body, "cookie", COOKIE_LENGTH, COOKIE_LENGTH) if "cookie" in body else b"",
            identity=(_bin(body, "id", IDENTITY_LENGTH, IDENTITY_LENGTH) if "id" in body else b""),
        )
    if kind == MessageType.COOKIE:
        _exact_keys(body, {"t", "ck", "cookie", "spk"}, "COOKIE")
        return Cookie(
            connect_key=_int(body, "ck", 1, MAX_CONNECT_KEY),
            cookie=_bin(body, "cookie", COOKIE_LENGTH, COOKIE_LENGTH),
            server_key=_bin(body, "spk", KEY_LENGTH, KEY_LENGTH),
        )
    if kind == MessageType.WELCOME:
        _exact_keys(body, {"t", "ck", "spk", "epk", "box"}, "WELCOME")
        return Welcome(
            connect_key=_int(body, "ck", 1, MAX_CONNECT_KEY),
            server_key=_bin(body, "spk", KEY_LENGTH, KEY_LENGTH),
            ephemeral_key=_bin(body, "epk", KEY_LENGTH, KEY_LENGTH),
            box=_bin(body, "box", 16, 512),
        )
    if kind == MessageType.REFUSE:
        _exact_keys(body, {"t", "ck", "code", "msg"}, "REFUSE")
        return Refuse(
            connect_key=_int(body, "ck", 1, MAX_CONNECT_KEY),
            code=_int(body, "code", 0, 255),
            message=_str(body, "msg", 256),
        )
    if kind == MessageType.DONE:
        _exact_keys(body, {"t", "proof"}, "DONE")
        return Done(proof=_bin(body, "proof", PROOF_LENGTH, PROOF_LENGTH))
    if kind == MessageType.CONFIRM:
        _exact_keys(body, {"t", "proof"}, "CONFIRM")
        return Confirm(proof=_bin(body, "proof", PROOF_LENGTH, PROOF_LENGTH))
    raise RemoteProtocolError(f"unknown handshake message type {kind}")


def refuse_for(connect_key: int, code: ErrorCode, text: str) -> Refuse:
    return Refuse(connect_key, int(code), text)


# ---------------------------------------------------------------------------- helpers


def _pack(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _unpack(data: bytes) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=256,
            max_bin_len=MAX_HANDSHAKE_MESSAGE_LENGTH,
            max_array_len=0,
            max_map_len=16,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise RemoteProtocolError(f"undecodable handshake message: {exc}") from exc
    if not isinstance(body, dict):
        raise RemoteProtocolError(f"handshake message is a {type(body).__name__}, not a map")
    return body


def _exact_keys(body: dict[str, Any], keys: set[str], what: str) -> None:
    if set(body) != keys:
        extra = sorted(set(body) - keys)
        missing = sorted(keys - set(body))
        raise RemoteProtocolError(f"{what}: unexpected keys {extra}, missing {missing}")


def _int(body: dict[str, Any], key: str, low: int, high: int) -> int:
    value = body[key]
    if type(value) is not int or not low <= value <= high:
        raise RemoteProtocolError(f"field {key!r} must be an integer in [{low}, {high}]")
    return value


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body[key]
    if type(value) is not bool:
        raise RemoteProtocolError(f"field {key!r} must be a boolean")
    return value


def _bin(body: dict[str, Any], key: str, low: int, high: int) -> bytes:
    value = body[key]
    if type(value) is not bytes or not low <= len(value) <= high:
        raise RemoteProtocolError(f"field {key!r} must be {low}..{high} bytes")
    return value


def _str(body: dict[str, Any], key: str, high: int) -> str:
    value = body[key]
    if type(value) is not str or len(value) > high:
        raise RemoteProtocolError(f"field {key!r} must be text of at most {high} characters")
    return value


__all__ = [
    "COOKIE_LENGTH",
    "IDENTITY_LENGTH",
    "KEY_LENGTH",
    "MAX_HANDSHAKE_MESSAGE_LENGTH",
    "PROOF_LENGTH",
    "PROTOCOL_VERSION",
    "Confirm",
    "Cookie",
    "Done",
    "FrameKind",
    "Hello",
    "Message",
    "MessageType",
    "Refuse",
    "SessionDetails",
    "Welcome",
    "decode_message",
    "refuse_for",
]
