"""Key agreement, key derivation and sealing (X25519, HKDF-SHA256, AES-256-GCM).

Key agreement (like Noise NK): the client has a fresh ephemeral key ``ce``; the server has a static
key ``ss`` (the one clients pin) and makes a fresh ephemeral key ``se`` per handshake. Both sides
compute ``dh1 = X25519(ce, se)`` (forward secrecy) and ``dh2 = X25519(ce, ss)`` (only the holder of
the server's static private key can compute it, so a server that completes the handshake proves it
holds the key the client pinned). HKDF-SHA256 over ``dh1 || dh2``, salted with the transcript hash
``SHA-256(HELLO bytes || spk || epk)``, gives:

    handshake key (32)  seals WELCOME's session details and the DONE / CONFIRM proofs
    c2s key (32), s2c key (32), c2s salt (4), s2c salt (4)   per-direction data keys

Sealed session frames are ``counter (8 bytes big-endian) || AES-GCM(key, salt || counter, frame)``.
Counters start at 0 and go up by one per frame. Aeron delivers a session's messages in order and
once, so the receiver demands exactly the next counter: a smaller one is a replay, a larger one a
reordering (or an injected frame), a bad tag is tampering. Each is rejected and counted; the
expected counter only advances on a frame that authenticates.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

from aeron_spark.handshake.errors import RemoteProtocolError
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from aeron_spark.counters import CounterType, counter_set

_INFO = b"aeron-spark handshake v1"
_COUNTER = struct.Struct(">Q")
COUNTER_LENGTH = 8
TAG_LENGTH = 16
SEAL_OVERHEAD = COUNTER_LENGTH + TAG_LENGTH
_NONCE_DETAILS = bytes(12)
_NONCE_DONE = bytes(11) + b"\x01"
_NONCE_CONFIRM = bytes(11) + b"\x02"


def public_bytes(key: X25519PrivateKey | X25519PublicKey) -> bytes:
    pub = key.public_key() if isinstance(key, X25519PrivateKey) else key
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw)


def load_public(data: bytes) -> X25519PublicKey:
    try:
        return X25519PublicKey.from_public_bytes(data)
    except ValueError as exc:
        raise RemoteProtocolError(f"not an X25519 public key: {exc}") from exc


def _exchange(private: X25519PrivateKey, peer: X25519PublicKey) -> bytes:
    try:
        return private.exchange(peer)
    except ValueError as exc:  # a low-order point gives an all-zero secret
        raise RemoteProtocolError(f"unusable X25519 public key: {exc}") from exc


def transcript_hash(hello: bytes, server_key: bytes, ephemeral_key: bytes) -> bytes:
    return hashlib.sha256(hello + server_key + ephemeral_key).digest()


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Everything derived from one handshake (see the module docstring)."""

    transcript: bytes
    handshake_key: bytes
    c2s_key: bytes
    s2c_key: bytes
    c2s_salt: bytes
    s2c_salt: bytes

    def seal_details(self, details: bytes) -> bytes:
        return AESGCM(self.handshake_key).encrypt(_NONCE_DETAILS, details, self.transcript)

    def open_details(self, box: bytes) -> bytes:
        try:
            return AESGCM(self.handshake_key).decrypt(_NONCE_DETAILS, box, self.transcript)
        except InvalidTag as exc:
            raise RemoteProtocolError("WELCOME's session details do not authenticate") from exc

    def done_proof(self) -> bytes:
        return AESGCM(self.handshake_key).encrypt(_NONCE_DONE, b"", self.transcript + b"done")

    def confirm_proof(self) -> bytes:
        return AESGCM(self.handshake_key).encrypt(
            _NONCE_CONFIRM, b"", self.transcript + b"confirm"
        )

    @staticmethod
    def proofs_equal(a: bytes, b: bytes) -> bool:
        return hmac.compare_digest(a, b)

    def client_sealer(self, counters: SealCounters) -> tuple[Sealer, Opener]:
        return (
            Sealer(self.c2s_key, self.c2s_salt),
            Opener(self.s2c_key, self.s2c_salt, counters),
        )

    def server_sealer(self, counters: SealCounters) -> tuple[Sealer, Opener]:
        return (
            Sealer(self.s2c_key, self.s2c_salt),
            Opener(self.c2s_key, self.c2s_salt, counters),
        )


def derive(
    ephemeral: X25519PrivateKey,
    peer_ephemeral: X25519PublicKey,
    static_secret: bytes,
    transcript: bytes,
) -> SessionKeys:
    """Derive the keys of one handshake from ``dh1`` (ephemeral-ephemeral) and ``dh2``."""
    dh1 = _exchange(ephemeral, peer_ephemeral)
    okm = HKDF(algorithm=hashes.SHA256(), length=104, salt=transcript, info=_INFO).derive(
        dh1 + static_secret
    )
    return SessionKeys(
        transcript=transcript,
        handshake_key=okm[0:32],
        c2s_key=okm[32:64],
        s2c_key=okm[64:96],
        c2s_salt=okm[96:100],
        s2c_salt=okm[100:104],
    )


def client_keys(
    client_ephemeral: X25519PrivateKey, hello: bytes, server_key: bytes, ephemeral_key: bytes
) -> SessionKeys:
    dh2 = _exchange(client_ephemeral, load_public(server_key))
    return derive(
        client_ephemeral,
        load_public(ephemeral_key),
        dh2,
        transcript_hash(hello, server_key, ephemeral_key),
    )


def server_keys(
    server_static: X25519PrivateKey,
    server_ephemeral: X25519PrivateKey,
    client_public: bytes,
    hello: bytes,
) -> SessionKeys:
    client = load_public(client_public)
    dh2 = _exchange(server_static, client)
    return derive(
        server_ephemeral,
        client,
        dh2,
        transcript_hash(hello, public_bytes(server_static), public_bytes(server_ephemeral)),
    )


@counter_set(CounterType.SEAL)
@dataclass(slots=True)
class SealCounters:
    """What a session's opener rejected (all kept, never reset)."""

    opened: int = 0
    tampered: int = 0
    replayed: int = 0
    reordered: int = 0
    truncated: int = 0

    def rejected(self) -> int:
        return self.tampered + self.replayed + self.reordered + self.truncated


class Sealer:
    """Seals outgoing frames with a per-direction key, nonce = salt || counter."""

    __slots__ = ("_aead", "_salt", "counter")

    def __init__(self, key: bytes, salt: bytes) -> None:
        self._aead = AESGCM(key)
        self._salt = salt
        self.counter = 0

    def seal(self, frame: bytes | bytearray | memoryview) -> bytes:
        counter = _COUNTER.pack(self.counter)
        self.counter += 1
        return counter + self._aead.encrypt(self._salt + counter, frame, None)


class Opener:
    """Opens incoming sealed frames, demanding exactly the next counter (see module docstring)."""

    __slots__ = ("_aead", "_salt", "expected", "counters")

    def __init__(self, key: bytes, salt: bytes, counters: SealCounters) -> None:
        self._aead = AESGCM(key)
        self._salt = salt
        self.expected = 0
        self.counters = counters

    def open(self, data: bytes | bytearray | memoryview) -> bytes:
        """The frame inside ``data``; raises :class:`RemoteProtocolError` (and counts) otherwise."""
        if len(data) < SEAL_OVERHEAD:
            self.counters.truncated += 1
            raise RemoteProtocolError(f"sealed frame of {len(data)} bytes is too short")
        counter_bytes = bytes(data[:COUNTER_LENGTH])
        (counter,) = _COUNTER.unpack(counter_bytes)
        if counter != self.expected:
            if counter < self.expected:
                self.counters.replayed += 1
                raise RemoteProtocolError(
                    f"replayed frame: counter {counter}, expected {self.expected}"
                )
            self.counters.reordered += 1
            raise RemoteProtocolError(
                f"out-of-order frame: counter {counter}, expected {self.expected}"
            )
        try:
            frame = self._aead.decrypt(self._salt + counter_bytes, data[COUNTER_LENGTH:], None)
        except InvalidTag as exc:
            self.counters.tampered += 1
            raise RemoteProtocolError(f"frame {counter} fails authentication") from exc
        self.expected += 1
        self.counters.opened += 1
        return frame


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """The server's static key pair."""

    private_key: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)

    @property
    def public_key(self) -> bytes:
        return public_bytes(self.private_key)


def fingerprint(public_key: bytes) -> str:
    """A short printable fingerprint of a public key (SHA-256, first 16 bytes, hex)."""
    return hashlib.sha256(public_key).hexdigest()[:32]


__all__ = [
    "SEAL_OVERHEAD",
    "Opener",
    "SealCounters",
    "Sealer",
    "ServerIdentity",
    "SessionKeys",
    "client_keys",
    "fingerprint",
    "public_bytes",
    "server_keys",
]
