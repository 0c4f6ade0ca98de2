"""Key agreement, key derivation and sealing (X25519, HKDF-SHA256, AES-256-GCM).

Keys (protocol version 3, mutual authentication like Noise XK/IK): the client has a fresh
ephemeral key ``ce`` and a static identity key ``cs`` (its key store's ``client.key``); the server
has a static key ``ss`` (the one clients pin) and makes a fresh ephemeral key ``se`` per handshake.

1. The client's first HELLO carries ``ce``'s public key only. The server's COOKIE answer carries
   ``ss``'s public key ``spk``, which the client checks (pinned or remembered) before it uses it.
2. The client's second HELLO carries its identity sealed for the server only, with a proof
   that it holds ``cs``'s private key (protocol version 5, as Noise IK's ``ss`` token)::

       es      = X25519(ce, ss)
       ad      = connect key (8 bytes, big-endian) || ce public || spk || cookie
       id_key  = HKDF-SHA256(es, salt = SHA-256(ad), info = "aeron-spark client identity v5")
       proof   = HMAC-SHA256(X25519(cs, ss), "aeron-spark client proof v5" || ad), first 16
       id      = AES-256-GCM(id_key, nonce 0, plaintext = cs public || proof, ad)  (64 bytes)

   A passive observer sees neither ``cs`` nor anything linkable to it (``ce`` is fresh for every
   handshake); the cookie in ``ad`` ties the box to one cookie, so a box lifted into another
   HELLO does not open. The server opens it, checks the proof (only the holders of ``cs``'s or
   ``ss``'s private key can make it: a listed client's *public* key is not enough) and refuses
   an unlisted key (``CLIENT_UNKNOWN``), all before it allocates anything.
3. Both sides compute four X25519 results and HKDF-SHA256 over ``dh1 || dh2 || dh3 || dh4``,
   salted with the transcript hash ``SHA-256(second HELLO bytes || spk || epk)`` (``epk`` = ``se``
   public), info ``"aeron-spark handshake v3"``::

       dh1 = X25519(ce, se)   forward secrecy
       dh2 = X25519(ce, ss)   only the holder of the server's static private key
       dh3 = X25519(cs, ss)   only the holder of the client's static private key (and the server)
       dh4 = X25519(cs, se)   the client's key bound to this handshake's fresh server key

   giving::

       handshake key (32)  seals WELCOME's session details and the DONE / CONFIRM proofs
       c2s key (32), s2c key (32), c2s salt (4), s2c salt (4)   per-direction data keys

   A server that completes the handshake proves it holds ``ss``; a client that sends a correct
   DONE (and every sealed frame after it) proves it holds ``cs``'s private key *for this
   handshake* (``dh4`` mixes in the server's fresh ``se``). A recorded second HELLO replayed by
   someone else is either refused (its cookie is bound to the source address and port and to
   10-20 s) or gets a WELCOME it cannot open, and never a DONE the server accepts: without
   ``ce`` (and ``cs``) there is no ``dh1`` (and ``dh3``/``dh4``).

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
import threading
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from aeron_spark.counters import CounterType, counter_set
from aeron_spark.handshake.errors import RemoteProtocolError

_INFO = b"aeron-spark handshake v3"
_ID_INFO = b"aeron-spark client identity v5"
_PROOF_LABEL = b"aeron-spark client proof v5"
PROOF_LENGTH = 16
IDENTITY_BOX_LENGTH = 32 + PROOF_LENGTH + 16
_COUNTER = struct.Struct(">Q")
COUNTER_LENGTH = 8
TAG_LENGTH = 16
SEAL_OVERHEAD = COUNTER_LENGTH + TAG_LENGTH
_NONCE_DETAILS = bytes(12)
_NONCE_IDENTITY = bytes(12)
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
        return AESGCM(self.handshake_key).encrypt(_NONCE_CONFIRM, b"", self.transcript + b"confirm")

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


def derive(dh: bytes, transcript: bytes) -> SessionKeys:
    """Derive the keys of one handshake from the concatenated X25519 results ``dh``."""
    okm = HKDF(algorithm=hashes.SHA256(), length=104, salt=transcript, info=_INFO).derive(dh)
    return SessionKeys(
        transcript=transcript,
        handshake_key=okm[0:32],
        c2s_key=okm[32:64],
        s2c_key=okm[64:96],
        c2s_salt=okm[96:100],
        s2c_salt=okm[100:104],
    )


def _identity_aead(
    es: bytes, connect_key: int, ephemeral_public: bytes, server_key: bytes, cookie: bytes
) -> tuple[AESGCM, bytes]:
    ad = connect_key.to_bytes(8, "big") + ephemeral_public + server_key + cookie
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=hashlib.sha256(ad).digest(), info=_ID_INFO
    ).derive(es)
    return AESGCM(key), ad


def _proof(static_secret: bytes, ad: bytes) -> bytes:
    return hmac.new(static_secret, _PROOF_LABEL + ad, hashlib.sha256).digest()[:PROOF_LENGTH]


def seal_identity(
    client_ephemeral: X25519PrivateKey,
    client_static: X25519PrivateKey,
    server_key: bytes,
    connect_key: int,
    cookie: bytes,
) -> bytes:
    """The client's static public key and the proof that it holds its private key, sealed for
    the holder of ``server_key`` (step 2)."""
    return seal_identity_keeping(client_ephemeral, client_static, server_key, connect_key, cookie)[
        0
    ]


def seal_identity_keeping(
    client_ephemeral: X25519PrivateKey,
    client_static: X25519PrivateKey,
    server_key: bytes,
    connect_key: int,
    cookie: bytes,
) -> tuple[bytes, tuple[bytes, bytes]]:
    """:func:`seal_identity`, and the two X25519 results it took (ce·ss, cs·ss), which the key
    schedule needs again (``client_keys(..., known=)``)."""
    server = load_public(server_key)
    es = _exchange(client_ephemeral, server)
    aead, ad = _identity_aead(es, connect_key, public_bytes(client_ephemeral), server_key, cookie)
    static = _exchange(client_static, server)
    proof = _proof(static, ad)
    return aead.encrypt(_NONCE_IDENTITY, public_bytes(client_static) + proof, ad), (es, static)


def open_identity(
    server_static: X25519PrivateKey,
    ephemeral_public: bytes,
    connect_key: int,
    cookie: bytes,
    box: bytes,
) -> bytes:
    """The client's static public key out of a HELLO's identity box (see
    :func:`open_identity_keeping`)."""
    return open_identity_keeping(server_static, ephemeral_public, connect_key, cookie, box)[0]


def open_identity_keeping(
    server_static: X25519PrivateKey,
    ephemeral_public: bytes,
    connect_key: int,
    cookie: bytes,
    box: bytes,
) -> tuple[bytes, tuple[bytes, bytes]]:
    """The client's static public key out of a HELLO's identity box, its proof checked; raises
    :class:`RemoteProtocolError` if it does not open, is not an X25519 public key or its proof
    is not made with that key's private key."""
    es = _exchange(server_static, load_public(ephemeral_public))
    aead, ad = _identity_aead(
        es, connect_key, ephemeral_public, public_bytes(server_static), cookie
    )
    try:
        plain = aead.decrypt(_NONCE_IDENTITY, box, ad)
    except InvalidTag as exc:
        raise RemoteProtocolError("the HELLO's client identity does not authenticate") from exc
    client_static, proof = plain[:32], plain[32:]
    static = _exchange(server_static, load_public(client_static))
    if len(proof) != PROOF_LENGTH or not hmac.compare_digest(proof, _proof(static, ad)):
        raise RemoteProtocolError(
            "the HELLO's client identity carries no proof of its private key (a public key "
            "alone is not an identity)"
        )
    return client_static, (es, static)


def client_keys(
    client_ephemeral: X25519PrivateKey,
    client_static: X25519PrivateKey,
    hello: bytes,
    server_key: bytes,
    ephemeral_key: bytes,
    known: tuple[bytes, bytes] | None = None,
) -> SessionKeys:
    """``known``: ce·ss and cs·ss if already computed (:func:`seal_identity_keeping`)."""
    ss, se = load_public(server_key), load_public(ephemeral_key)
    dh2, dh3 = known or (_exchange(client_ephemeral, ss), _exchange(client_static, ss))
    dh = _exchange(client_ephemeral, se) + dh2 + dh3 + _exchange(client_static, se)
    return derive(dh, transcript_hash(hello, server_key, ephemeral_key))


def server_keys(
    server_static: X25519PrivateKey,
    server_ephemeral: X25519PrivateKey,
    client_public: bytes,
    client_static_public: bytes,
    hello: bytes,
    known: tuple[bytes, bytes] | None = None,
) -> SessionKeys:
    """``known``: ss·ce and ss·cs if already computed (:func:`open_identity_keeping`)."""
    ce, cs = load_public(client_public), load_public(client_static_public)
    dh2, dh3 = known or (_exchange(server_static, ce), _exchange(server_static, cs))
    dh = _exchange(server_ephemeral, ce) + dh2 + dh3 + _exchange(server_ephemeral, cs)
    return derive(
        dh, transcript_hash(hello, public_bytes(server_static), public_bytes(server_ephemeral))
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
    # PONG frames no ping of the session's end asked for (dropped: never kept)
    pongs_unsolicited: int = 0

    def rejected(self) -> int:
        return self.tampered + self.replayed + self.reordered + self.truncated


# Recent cryptography versions (48 here) write AES-GCM's output into a buffer of the caller's
# (``encrypt_into`` / ``decrypt_into``); older ones return new bytes, then copied into it.
_ENCRYPT_INTO = hasattr(AESGCM, "encrypt_into")
_DECRYPT_INTO = hasattr(AESGCM, "decrypt_into")
# Sealer.seal_frame's buffers are kept per thread (not per session: a server with many
# sessions keeps one pair) up to this size; a larger frame gets buffers of its own. A session's
# frames are at most its publication's max message (1 MiB for the stream server's 8 MiB terms).
KEEP_BUFFER_BYTES = 2 * 1024 * 1024


class _Buffers(threading.local):
    """One thread's buffers for :meth:`Sealer.seal_frame` (plaintext, sealed frame)."""

    def __init__(self) -> None:
        self.plain = memoryview(bytearray(0))
        self.sealed = memoryview(bytearray(0))


_BUFFERS = _Buffers()


class Sealer:
    """Seals outgoing frames with a per-direction key, nonce = salt || counter.

    :meth:`seal` returns new bytes; :meth:`seal_frame` seals ``kind || body`` into buffers
    kept for the calling thread (no concatenation, no copy of the output: the bytes go straight
    from AES-GCM to where the caller reads them), the same bytes :meth:`seal` gives for
    ``kind + body``."""

    __slots__ = ("_aead", "_salt", "counter")

    def __init__(self, key: bytes, salt: bytes) -> None:
        self._aead = AESGCM(key)
        self._salt = salt
        self.counter = 0

    def seal(self, frame: bytes | bytearray | memoryview) -> bytes:
        counter = _COUNTER.pack(self.counter)
        self.counter += 1
        return counter + self._aead.encrypt(self._salt + counter, frame, None)

    def seal_into(self, frame: bytes | bytearray | memoryview, out: bytearray | memoryview) -> int:
        """Seal ``frame`` into the start of ``out`` (at least ``len(frame) + SEAL_OVERHEAD``
        bytes, not overlapping ``frame``); returns the sealed length. The same bytes as
        :meth:`seal`."""
        length = len(frame) + SEAL_OVERHEAD
        if len(out) < length:
            raise ValueError(f"a sealed frame of {length} bytes does not fit {len(out)} bytes")
        view = out if isinstance(out, memoryview) else memoryview(out)
        counter = self.counter
        counter_bytes = _COUNTER.pack(counter)
        view[:COUNTER_LENGTH] = counter_bytes
        nonce = self._salt + counter_bytes
        if _ENCRYPT_INTO:
            self._aead.encrypt_into(nonce, frame, None, view[COUNTER_LENGTH:length])
        else:  # pragma: no cover - a cryptography without it
            view[COUNTER_LENGTH:length] = self._aead.encrypt(nonce, frame, None)
        self.counter = counter + 1
        return length

    def seal_frame(self, kind: int, body: bytes | bytearray | memoryview) -> memoryview:
        """The sealed frame of ``kind`` (one byte) then ``body``, in the calling thread's
        buffer: valid until this thread's next call, of any sealer (the caller copies it out
        at once, as a publication's ``offer`` does)."""
        n = 1 + len(body)
        buffers = _BUFFERS
        plain = buffers.plain
        sealed = buffers.sealed
        if len(plain) < n:
            # new buffers (a view handed out earlier may still be held: never resized)
            plain = memoryview(bytearray(n))
            sealed = memoryview(bytearray(n + SEAL_OVERHEAD))
            if n <= KEEP_BUFFER_BYTES:
                buffers.plain, buffers.sealed = plain, sealed
        plain[0] = kind
        plain[1:n] = body
        length = self.seal_into(plain[:n], sealed)
        return sealed[:length]


class Opener:
    """Opens incoming sealed frames, demanding exactly the next counter (see module docstring)."""

    __slots__ = ("_aead", "_salt", "expected", "counters")

    def __init__(self, key: bytes, salt: bytes, counters: SealCounters) -> None:
        self._aead = AESGCM(key)
        self._salt = salt
        self.expected = 0
        self.counters = counters

    def _check(self, data: bytes | bytearray | memoryview) -> bytes:
        """The counter bytes of ``data`` if it is the next frame; raises (and counts) else."""
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
        return counter_bytes

    def open(self, data: bytes | bytearray | memoryview) -> bytes:
        """The frame inside ``data``; raises :class:`RemoteProtocolError` (and counts) otherwise."""
        counter_bytes = self._check(data)
        if not isinstance(data, memoryview):
            data = memoryview(data)
        try:
            frame = self._aead.decrypt(self._salt + counter_bytes, data[COUNTER_LENGTH:], None)
        except InvalidTag as exc:
            self.counters.tampered += 1
            raise RemoteProtocolError(f"frame {self.expected} fails authentication") from exc
        self.expected += 1
        self.counters.opened += 1
        return frame

    def open_into(self, data: bytes | bytearray | memoryview, out: bytearray | memoryview) -> int:
        """:meth:`open` into the start of ``out`` (at least ``len(data) - SEAL_OVERHEAD`` bytes,
        not overlapping ``data``); returns the frame's length. For a frame that does not
        authenticate the bytes it would take in ``out`` are zeroed (``decrypt_into`` writes
        the plaintext before it checks the tag: none of it is left behind)."""
        length = len(data) - SEAL_OVERHEAD
        if length >= 0 and len(out) < length:
            raise ValueError(f"a frame of {length} bytes does not fit {len(out)} bytes")
        counter_bytes = self._check(data)
        view = data if isinstance(data, memoryview) else memoryview(data)
        target = out if isinstance(out, memoryview) else memoryview(out)
        nonce = self._salt + counter_bytes
        try:
            if _DECRYPT_INTO:
                self._aead.decrypt_into(nonce, view[COUNTER_LENGTH:], None, target[:length])
            else:  # pragma: no cover - a cryptography without it
                target[:length] = self._aead.decrypt(nonce, view[COUNTER_LENGTH:], None)
        except InvalidTag as exc:
            target[:length] = bytes(length)
            self.counters.tampered += 1
            raise RemoteProtocolError(f"frame {self.expected} fails authentication") from exc
        self.expected += 1
        self.counters.opened += 1
        return length


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
    "IDENTITY_BOX_LENGTH",
    "KEEP_BUFFER_BYTES",
    "SEAL_OVERHEAD",
    "Opener",
    "SealCounters",
    "Sealer",
    "ServerIdentity",
    "SessionKeys",
    "client_keys",
    "fingerprint",
    "open_identity",
    "open_identity_keeping",
    "seal_identity_keeping",
    "seal_identity",
    "public_bytes",
    "server_keys",
]
