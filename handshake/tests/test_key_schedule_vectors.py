"""Known-answer vectors for the handshake of protocol version 5 (issues 19, 22, 28).

Fixed static and ephemeral keys of both sides, a fixed connect key, cookie secret and id
generator go in; the two HELLOs, the COOKIE, the client's identity box, WELCOME, DONE and CONFIRM
bytes, the transcript hash, every derived key and salt and the first sealed frames come out. The
expected values are computed here, independently of the project's code, with a few lines of
``cryptography`` primitives and ``msgpack`` following the design (handshake/crypto.py and
handshake/messages.py docstrings): the identity box under a key from X25519(ce, ss) bound to the
connect key, ``ce``, ``spk`` and the cookie, holding ``cs`` and its proof (an HMAC under
X25519(cs, ss), version 5); the session keys from the four X25519 results
ce·se, ce·ss, cs·ss, cs·se salted with the transcript of the second HELLO. A handful are also
pinned as hex so that a change made to both sides at once is still caught.

The key schedule is version 3's (its HKDF labels say v3); version 4 added the WELCOME's sealed
resumption token; version 5 the identity's proof (label ``client identity v5``) and tokens the
server draws at random and keeps for one HELLO of the same source and client key (so the
WELCOME's ``rt`` is taken from the session here, not computed). This is the one full
known-answer test of the schedule (test_client_auth.py tests the identity box's binding and the
admission around it).
"""

from __future__ import annotations

import hashlib
import hmac
import random

import msgpack
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from aeron_spark.handshake import crypto, machine
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.crypto import (
    SealCounters,
    client_keys,
    open_identity,
    seal_identity,
    server_keys,
    transcript_hash,
)
from aeron_spark.handshake.machine import ClientHandshake, ServerCore

# ------------------------------------------------------------------ fixed inputs

SERVER_STATIC = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
SERVER_EPHEMERAL = X25519PrivateKey.from_private_bytes(bytes(range(101, 133)))
CLIENT_EPHEMERAL = X25519PrivateKey.from_private_bytes(bytes(range(201, 233)))
CLIENT_STATIC = X25519PrivateKey.from_private_bytes(bytes(range(151, 183)))
CONNECT_KEY = 0x0123456789ABCDEF
COOKIE_SECRET = bytes(range(64, 96))
ADDRESS, SOURCE = "10.0.0.1", "10.0.0.1:4000"
NOW_NS = 25_000_000_000  # cookie epoch 2
VERSION = 5
INFO = b"aeron-spark handshake v3"
ID_INFO = b"aeron-spark client identity v5"
PROOF_LABEL = b"aeron-spark client proof v5"

# Pinned outputs for the inputs above (computed once with the independent code below).
PINNED = {
    "transcript": "6b81648026b42a92b203dff40be7ba4b898c087247abb488bf8016878677b274",
    "handshake_key": "e99221a042c07b51fe7c19e7f3bed4a6b133cda4f27ff9dc68787f3954024dea",
    "c2s_key": "55bf1d1b43ba8c0494ad4c03bb42a56b267c38f0f0f0c6915100d17877caf668",
    "s2c_key": "6234daf011231e1f50e20711840b2094b9fdc5b0a4593f54797b9bf3a6a5610e",
    "c2s_salt": "622fc9b3",
    "s2c_salt": "0e78413c",
    "cookie": "6e815998ed0557360ae6cdc6f115d250",
    "identity": (
        "fd5315ceaaae666efacae27431a982cf0de692c75435f503590d2a5142dbef18"
        "2a034c6b26d0468d9fa1d79f71c0e487c33566f03918c2555356d874419faccc"
    ),
}


def _pub(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _pack(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    return private.exchange(X25519PublicKey.from_public_bytes(public))


def _independent_cookie(hello_ck: int, pk: bytes, enc: bool, now_ns: int) -> bytes:
    mac = hmac.new(COOKIE_SECRET, digestmod=hashlib.sha256)
    for part in (
        SOURCE.encode(),
        hello_ck.to_bytes(8, "big"),
        pk,
        bytes([enc]),
        (now_ns // 10_000_000_000).to_bytes(8, "big", signed=True),
    ):
        mac.update(len(part).to_bytes(2, "big") + part)
    return mac.digest()[:16]


def _independent_identity(ck: int, cookie: bytes) -> bytes:
    """The client's static public key sealed for the server, from the design alone."""
    spk, cepk = _pub(SERVER_STATIC), _pub(CLIENT_EPHEMERAL)
    es = _dh(CLIENT_EPHEMERAL, spk)
    assert es == _dh(SERVER_STATIC, cepk)  # the server derives the same secret
    ad = ck.to_bytes(8, "big") + cepk + spk + cookie
    id_key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=hashlib.sha256(ad).digest(), info=ID_INFO
    ).derive(es)
    ss = _dh(CLIENT_STATIC, spk)
    assert ss == _dh(SERVER_STATIC, _pub(CLIENT_STATIC))
    proof = hmac.new(ss, PROOF_LABEL + ad, digestmod=hashlib.sha256).digest()[:16]
    box = AESGCM(id_key).encrypt(bytes(12), _pub(CLIENT_STATIC) + proof, ad)
    assert len(box) == 64 and _pub(CLIENT_STATIC) not in box
    return box


def _independent_schedule(hello: bytes) -> dict[str, bytes]:
    """The key schedule from the design, with nothing of the project's code."""
    spk, epk = _pub(SERVER_STATIC), _pub(SERVER_EPHEMERAL)
    cepk, cspk = _pub(CLIENT_EPHEMERAL), _pub(CLIENT_STATIC)
    transcript = hashlib.sha256(hello + spk + epk).digest()
    dh1 = _dh(CLIENT_EPHEMERAL, epk)  # ce·se
    dh2 = _dh(CLIENT_EPHEMERAL, spk)  # ce·ss
    dh3 = _dh(CLIENT_STATIC, spk)  # cs·ss
    dh4 = _dh(CLIENT_STATIC, epk)  # cs·se
    # The server side of the same four agreements must give the same secrets, and they differ.
    assert dh1 == _dh(SERVER_EPHEMERAL, cepk)
    assert dh2 == _dh(SERVER_STATIC, cepk)
    assert dh3 == _dh(SERVER_STATIC, cspk)
    assert dh4 == _dh(SERVER_EPHEMERAL, cspk)
    assert len({dh1, dh2, dh3, dh4}) == 4
    okm = HKDF(algorithm=hashes.SHA256(), length=104, salt=transcript, info=INFO).derive(
        dh1 + dh2 + dh3 + dh4
    )
    return {
        "transcript": transcript,
        "handshake_key": okm[0:32],
        "c2s_key": okm[32:64],
        "s2c_key": okm[64:96],
        "c2s_salt": okm[96:100],
        "s2c_salt": okm[100:104],
    }


class _FixedEphemeral:
    """Stands in for ``X25519PrivateKey`` inside the server machine: fixed randomness only."""

    @staticmethod
    def generate() -> X25519PrivateKey:
        return SERVER_EPHEMERAL


@pytest.fixture
def handshake(monkeypatch: pytest.MonkeyPatch):
    """One whole handshake with every random input fixed; its messages and both machines."""
    monkeypatch.setattr(machine, "X25519PrivateKey", _FixedEphemeral)
    core = ServerCore(
        ServerConfig(),
        SERVER_STATIC,
        random_bytes=random.Random(22).randbytes,
        authorize={_pub(CLIENT_STATIC)}.__contains__,
    )
    core._cookie_secret = COOKIE_SECRET
    client = ClientHandshake(lambda key: None, static_key=CLIENT_STATIC, encryption=True)
    client.connect_key = CONNECT_KEY
    client._ephemeral = CLIENT_EPHEMERAL
    client.start(NOW_NS)
    wire: dict[str, bytes] = {"hello1": client.hello()}
    with pytest.raises(machine.Rejected) as cookie:
        core.on_hello(ADDRESS, wire["hello1"], NOW_NS, source=SOURCE)
    assert cookie.value.code is None
    wire["cookie"] = cookie.value.reply
    assert client.on_reply(wire["cookie"]) is None
    wire["hello2"] = client.retry_hello
    session = core.on_hello(ADDRESS, wire["hello2"], NOW_NS, source=SOURCE)
    assert session.client_key == _pub(CLIENT_STATIC)
    wire["welcome"] = session.welcome
    assert client.on_reply(wire["welcome"]) == session.details
    wire["done"] = client.done()
    wire["confirm"] = core.on_done(session, wire["done"])
    client.on_confirm(wire["confirm"])
    return wire, client, session


def test_messages_keys_and_proofs_match_the_independent_computation(handshake) -> None:
    wire, client, session = handshake
    pk = _pub(CLIENT_EPHEMERAL)
    hello = {"t": 1, "v": VERSION, "ck": CONNECT_KEY, "pk": pk, "enc": True}
    assert wire["hello1"] == _pack({**hello, "pad": bytes(32)})
    cookie = _independent_cookie(CONNECT_KEY, pk, True, NOW_NS)
    assert wire["cookie"] == _pack(
        {"t": 6, "ck": CONNECT_KEY, "cookie": cookie, "spk": _pub(SERVER_STATIC)}
    )
    assert len(wire["cookie"]) < len(wire["hello1"])  # never more bytes back than sent
    identity = _independent_identity(CONNECT_KEY, cookie)
    assert wire["hello2"] == _pack({**hello, "cookie": cookie, "id": identity})

    want = _independent_schedule(wire["hello2"])
    for keys in (client.keys, session.keys):
        got = {name: getattr(keys, name) for name in want}
        assert got == want

    d = session.details
    details = _pack(
        {
            "cs": d.c2s_session_id,
            "cx": d.c2s_stream_id,
            "ss": d.s2c_session_id,
            "sx": d.s2c_stream_id,
            "enc": True,
            "mml": d.max_message_length,
            "tl": d.term_length,
            "mtu": d.mtu,
            "rt": d.resume_token,
        }
    )
    hk, transcript = AESGCM(want["handshake_key"]), want["transcript"]
    box = hk.encrypt(bytes(12), details, transcript)
    assert wire["welcome"] == _pack(
        {
            "t": 2,
            "ck": CONNECT_KEY,
            "spk": _pub(SERVER_STATIC),
            "epk": _pub(SERVER_EPHEMERAL),
            "box": box,
        }
    )
    done = hk.encrypt(bytes(11) + b"\x01", b"", transcript + b"done")
    confirm = hk.encrypt(bytes(11) + b"\x02", b"", transcript + b"confirm")
    assert wire["done"] == _pack({"t": 4, "proof": done})
    assert wire["confirm"] == _pack({"t": 5, "proof": confirm})


def test_sealed_frames_match_the_independent_computation(handshake) -> None:
    wire, client, session = handshake
    want = _independent_schedule(wire["hello2"])
    c_seal, c_open = client.keys.client_sealer(SealCounters())
    s_seal, s_open = session.keys.server_sealer(SealCounters())
    for counter, frame in enumerate([b"\x00first", b"\x00second"]):
        nonce_counter = counter.to_bytes(8, "big")
        up = nonce_counter + AESGCM(want["c2s_key"]).encrypt(
            want["c2s_salt"] + nonce_counter, frame, None
        )
        down = nonce_counter + AESGCM(want["s2c_key"]).encrypt(
            want["s2c_salt"] + nonce_counter, frame, None
        )
        assert c_seal.seal(frame) == up and s_open.open(up) == frame
        assert s_seal.seal(frame) == down and c_open.open(down) == frame


@pytest.mark.parametrize("into", [True, False], ids=["encrypt-into", "fallback"])
def test_sealing_into_buffers_matches_the_independent_computation(
    handshake, monkeypatch: pytest.MonkeyPatch, into: bool
) -> None:
    """seal_frame / seal_into / open_into (cryptography's encrypt_into and decrypt_into, or
    encrypt and decrypt copied into the buffer on a version without them) give the bytes of
    the independent computation, as seal and open do."""
    monkeypatch.setattr(crypto, "_ENCRYPT_INTO", into and hasattr(AESGCM, "encrypt_into"))
    monkeypatch.setattr(crypto, "_DECRYPT_INTO", into and hasattr(AESGCM, "decrypt_into"))
    wire, client, session = handshake
    want = _independent_schedule(wire["hello2"])
    c_seal, c_open = client.keys.client_sealer(SealCounters())
    s_seal, s_open = session.keys.server_sealer(SealCounters())
    rng = random.Random(5)
    bodies = [b"first", b"", rng.randbytes(70_000), b"x", rng.randbytes(3 * 1024 * 1024)]
    for counter, body in enumerate(bodies):
        frame = b"\x00" + body
        nonce_counter = counter.to_bytes(8, "big")
        up = nonce_counter + AESGCM(want["c2s_key"]).encrypt(
            want["c2s_salt"] + nonce_counter, frame, None
        )
        down = nonce_counter + AESGCM(want["s2c_key"]).encrypt(
            want["s2c_salt"] + nonce_counter, frame, None
        )
        sealed = c_seal.seal_frame(0, body)
        assert isinstance(sealed, memoryview) and sealed == up
        opened = bytearray(len(frame) + 7)
        assert s_open.open_into(sealed, opened) == len(frame)
        assert opened[: len(frame)] == frame
        out = bytearray(len(frame) + crypto.SEAL_OVERHEAD + 3)
        assert s_seal.seal_into(frame, out) == len(down) and out[: len(down)] == down
        assert c_open.open(memoryview(out)[: len(down)]) == frame
    assert c_seal.counter == s_open.expected == s_seal.counter == c_open.expected == len(bodies)


def test_pinned_vectors(handshake) -> None:
    wire, client, session = handshake
    got = _independent_schedule(wire["hello2"])
    got["cookie"] = _independent_cookie(CONNECT_KEY, _pub(CLIENT_EPHEMERAL), True, NOW_NS)
    got["identity"] = _independent_identity(CONNECT_KEY, got["cookie"])
    assert {k: v.hex() for k, v in got.items()} == PINNED
    hello2 = m.decode_message(wire["hello2"])
    assert isinstance(hello2, m.Hello)
    assert {"cookie": hello2.cookie.hex(), "identity": hello2.identity.hex()} == {
        "cookie": PINNED["cookie"],
        "identity": PINNED["identity"],
    }
    for keys in (client.keys, session.keys):
        assert {k: getattr(keys, k).hex() for k in PINNED if hasattr(keys, k)} == {
            k: v for k, v in PINNED.items() if k not in ("cookie", "identity")
        }


def test_crypto_functions_directly_with_fixed_inputs() -> None:
    cookie = bytes(range(16))
    spk, epk = _pub(SERVER_STATIC), _pub(SERVER_EPHEMERAL)
    cepk, cspk = _pub(CLIENT_EPHEMERAL), _pub(CLIENT_STATIC)
    identity = _independent_identity(7, cookie)
    assert seal_identity(CLIENT_EPHEMERAL, CLIENT_STATIC, spk, 7, cookie) == identity
    assert open_identity(SERVER_STATIC, cepk, 7, cookie, identity) == cspk
    hello = _pack(
        {"t": 1, "v": VERSION, "ck": 7, "pk": cepk, "enc": False, "cookie": cookie, "id": identity}
    )
    assert transcript_hash(hello, spk, epk) == hashlib.sha256(hello + spk + epk).digest()
    want = _independent_schedule(hello)
    for keys in (
        client_keys(CLIENT_EPHEMERAL, CLIENT_STATIC, hello, spk, epk),
        server_keys(SERVER_STATIC, SERVER_EPHEMERAL, cepk, cspk, hello),
    ):
        assert {name: getattr(keys, name) for name in want} == want


_BASE_HELLO = {
    "t": 1,
    "v": VERSION,
    "ck": 7,
    "pk": _pub(CLIENT_EPHEMERAL),
    "enc": True,
    "cookie": bytes(16),
    "id": bytes(64),
}
_OTHER_VALUE = {
    "v": 2,
    "ck": 8,
    "pk": _pub(SERVER_STATIC),
    "enc": False,
    "cookie": bytes([1]) + bytes(15),
    "id": bytes([1]) + bytes(63),
}


@pytest.mark.parametrize("changed", sorted(_OTHER_VALUE))
def test_every_hello_field_changes_the_transcript_and_every_key(changed: str) -> None:
    """The transcript covers the whole second HELLO, identity box and cookie included: a
    different value of any field, other inputs the same, gives different keys (so the server
    and a tampered-with client cannot agree)."""
    other = {**_BASE_HELLO, changed: _OTHER_VALUE[changed]}
    spk, epk = _pub(SERVER_STATIC), _pub(SERVER_EPHEMERAL)
    a = client_keys(CLIENT_EPHEMERAL, CLIENT_STATIC, _pack(_BASE_HELLO), spk, epk)
    b = client_keys(CLIENT_EPHEMERAL, CLIENT_STATIC, _pack(other), spk, epk)
    for name in ("transcript", "handshake_key", "c2s_key", "s2c_key", "c2s_salt", "s2c_salt"):
        assert getattr(a, name) != getattr(b, name), name
    assert m.decode_message(_pack(other))  # still a well-formed HELLO


@pytest.mark.parametrize("which", ["ce", "cs", "ss", "se"])
def test_every_key_pair_changes_every_key(which: str) -> None:
    """All four X25519 results are in the schedule: another key in any one of the four roles,
    the HELLO the same, gives other keys on both sides, and each side's keys then only match a
    peer holding the same four keys."""
    hello = _pack(_BASE_HELLO)
    keys = {
        "ce": CLIENT_EPHEMERAL,
        "cs": CLIENT_STATIC,
        "ss": SERVER_STATIC,
        "se": SERVER_EPHEMERAL,
    }
    other = {**keys, which: X25519PrivateKey.from_private_bytes(bytes([77]) * 32)}

    def both(k: dict[str, X25519PrivateKey]):
        mine = client_keys(k["ce"], k["cs"], hello, _pub(k["ss"]), _pub(k["se"]))
        theirs = server_keys(k["ss"], k["se"], _pub(k["ce"]), _pub(k["cs"]), hello)
        assert mine == theirs
        return mine

    a, b = both(keys), both(other)
    for name in ("handshake_key", "c2s_key", "s2c_key", "c2s_salt", "s2c_salt"):
        assert getattr(a, name) != getattr(b, name), name
