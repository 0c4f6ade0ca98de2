"""Known-answer vectors for the handshake key schedule (issue 22).

Fixed static and ephemeral keys, a fixed connect key, cookie secret and id generator go in; the
HELLO, COOKIE, WELCOME, DONE and CONFIRM bytes, the transcript hash, every derived key and salt
and the first sealed frame come out. The expected values are computed here, independently of the
project's code, with a few lines of ``cryptography`` primitives and ``msgpack`` following the
design (handshake/crypto.py and handshake/messages.py docstrings), and a handful are also pinned
as hex so that a change made to both sides at once is still caught.
"""

from __future__ import annotations

import hashlib
import hmac
import random

import msgpack
import pytest
from aeron_spark.handshake import machine
from aeron_spark.handshake import messages as m
from aeron_spark.handshake.config import ServerConfig
from aeron_spark.handshake.crypto import SealCounters, client_keys, server_keys, transcript_hash
from aeron_spark.handshake.machine import ClientHandshake, ServerCore
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

# ------------------------------------------------------------------ fixed inputs

SERVER_STATIC = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
SERVER_EPHEMERAL = X25519PrivateKey.from_private_bytes(bytes(range(101, 133)))
CLIENT_EPHEMERAL = X25519PrivateKey.from_private_bytes(bytes(range(201, 233)))
CONNECT_KEY = 0x0123456789ABCDEF
COOKIE_SECRET = bytes(range(64, 96))
ADDRESS, SOURCE = "10.0.0.1", "10.0.0.1:4000"
NOW_NS = 25_000_000_000  # cookie epoch 2
INFO = b"aeron-spark handshake v1"

# Pinned outputs for the inputs above (computed once with the independent code below).
PINNED = {
    "transcript": "da836cd50933eec185b8447c711d8b880775907fd7f2210fb91aa49acb2e730b",
    "handshake_key": "8ca2518a03bbc0f9631baf161cca4e28afdfbd0ce8110af43877364b63fb30c3",
    "c2s_key": "1b4ab001ab54a6bad95fee36d6126d599666e26421de228164b9c249917a59ed",
    "s2c_key": "2f66f60333fe174778325ae7d28b4e2d3738b03f54c2d924fa34d040e3f1cca4",
    "c2s_salt": "1033b0fa",
    "s2c_salt": "d20fcd92",
    "cookie": "6e815998ed0557360ae6cdc6f115d250",
}


def _pub(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _pack(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


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


def _independent_schedule(hello: bytes) -> dict[str, bytes]:
    """The key schedule from the design, with nothing of the project's code."""
    spk, epk = _pub(SERVER_STATIC), _pub(SERVER_EPHEMERAL)
    transcript = hashlib.sha256(hello + spk + epk).digest()
    dh1 = CLIENT_EPHEMERAL.exchange(X25519PublicKey.from_public_bytes(epk))
    dh2 = CLIENT_EPHEMERAL.exchange(X25519PublicKey.from_public_bytes(spk))
    # The server side of the same two agreements must give the same secrets.
    assert dh1 == SERVER_EPHEMERAL.exchange(CLIENT_EPHEMERAL.public_key())
    assert dh2 == SERVER_STATIC.exchange(CLIENT_EPHEMERAL.public_key())
    okm = HKDF(algorithm=hashes.SHA256(), length=104, salt=transcript, info=INFO).derive(
        dh1 + dh2
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
    core = ServerCore(ServerConfig(), SERVER_STATIC, rng=random.Random(22).randrange)
    core._cookie_secret = COOKIE_SECRET
    client = ClientHandshake(lambda key: None, encryption=True)
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
    wire["welcome"] = session.welcome
    assert client.on_reply(wire["welcome"]) == session.details
    wire["done"] = client.done()
    wire["confirm"] = core.on_done(session, wire["done"])
    client.on_confirm(wire["confirm"])
    return wire, client, session


def test_messages_keys_and_proofs_match_the_independent_computation(handshake) -> None:
    wire, client, session = handshake
    pk = _pub(CLIENT_EPHEMERAL)
    hello = {"t": 1, "v": 2, "ck": CONNECT_KEY, "pk": pk, "enc": True}
    assert wire["hello1"] == _pack(hello)
    cookie = _independent_cookie(CONNECT_KEY, pk, True, NOW_NS)
    assert wire["cookie"] == _pack({"t": 6, "ck": CONNECT_KEY, "cookie": cookie})
    assert wire["hello2"] == _pack({**hello, "cookie": cookie})

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


def test_pinned_vectors(handshake) -> None:
    wire, client, _ = handshake
    got = _independent_schedule(wire["hello2"])
    got["cookie"] = _independent_cookie(CONNECT_KEY, _pub(CLIENT_EPHEMERAL), True, NOW_NS)
    assert {k: v.hex() for k, v in got.items()} == PINNED
    assert {k: getattr(client.keys, k).hex() for k in PINNED if k != "cookie"} == {
        k: v for k, v in PINNED.items() if k != "cookie"
    }


def test_crypto_functions_directly_with_fixed_inputs() -> None:
    hello = _pack({"t": 1, "v": 2, "ck": 7, "pk": _pub(CLIENT_EPHEMERAL), "enc": False})
    spk, epk = _pub(SERVER_STATIC), _pub(SERVER_EPHEMERAL)
    assert transcript_hash(hello, spk, epk) == hashlib.sha256(hello + spk + epk).digest()
    want = _independent_schedule(hello)
    for keys in (
        client_keys(CLIENT_EPHEMERAL, hello, spk, epk),
        server_keys(SERVER_STATIC, SERVER_EPHEMERAL, _pub(CLIENT_EPHEMERAL), hello),
    ):
        assert {name: getattr(keys, name) for name in want} == want


@pytest.mark.parametrize("changed", ["v", "ck", "pk", "enc"])
def test_every_hello_field_changes_the_transcript_and_every_key(changed: str) -> None:
    """The transcript covers the whole HELLO: a different value of any field, other inputs the
    same, gives different keys (so the server and a tampered-with client cannot agree)."""
    base = {"t": 1, "v": 2, "ck": 7, "pk": _pub(CLIENT_EPHEMERAL), "enc": True}
    other = dict(base)
    other[changed] = {"v": 3, "ck": 8, "pk": _pub(SERVER_STATIC), "enc": False}[changed]
    spk, epk = _pub(SERVER_STATIC), _pub(SERVER_EPHEMERAL)
    a = client_keys(CLIENT_EPHEMERAL, _pack(base), spk, epk)
    b = client_keys(CLIENT_EPHEMERAL, _pack(other), spk, epk)
    for name in ("transcript", "handshake_key", "c2s_key", "s2c_key"):
        assert getattr(a, name) != getattr(b, name), name
    assert m.decode_message(_pack(other))  # still a well-formed HELLO
