"""Every datagram captured from the real C driver decodes to its listed fields and re-encodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aeron_spark.transport.protocol import frames as f
from aeron_spark.transport.protocol.logbuffer import compute_position, position_bits_to_shift

VECTORS = json.loads((Path(__file__).parent / "data" / "aeron-vectors.json").read_text())["vectors"]

FIELDS = {
    "SETUP": [
        "term_offset",
        "session_id",
        "stream_id",
        "initial_term_id",
        "active_term_id",
        "term_length",
        "mtu",
        "ttl",
        "flags",
    ],
    "SM": [
        "session_id",
        "stream_id",
        "consumption_term_id",
        "consumption_term_offset",
        "receiver_window",
        "receiver_id",
        "flags",
    ],
    "NAK": ["session_id", "stream_id", "term_id", "term_offset", "length", "flags"],
    "RTTM": [
        "session_id",
        "stream_id",
        "echo_timestamp",
        "reception_delta",
        "receiver_id",
        "flags",
    ],
    "DATA": ["term_offset", "session_id", "stream_id", "term_id", "reserved_value", "flags"],
    "PAD": ["term_offset", "session_id", "stream_id", "term_id", "reserved_value", "flags"],
}


def test_every_frame_type_is_covered() -> None:
    seen = {fr["type_name"] for v in VECTORS for fr in v["frames"]}
    assert {"SETUP", "SM", "NAK", "RTTM", "DATA", "PAD"} <= seen


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_decode_matches_capture(vector: dict) -> None:
    raw = bytes.fromhex(vector["udp_payload_hex"])
    decoded = f.decode_datagram(raw)
    assert len(decoded) == len(vector["frames"])
    for frame, expected in zip(decoded, vector["frames"], strict=True):
        assert frame.version == expected["version"]
        if isinstance(frame, f.DataFrame):
            assert frame.length == expected["frame_length"]
            assert frame.frame_type == expected["type"]
            if frame.frame_type == f.FrameType.DATA:
                assert len(frame.payload) == expected["payload_length"]
                assert (
                    frame.payload[: len(expected["payload_prefix_hex"]) // 2].hex()
                    == expected["payload_prefix_hex"]
                )
        else:
            assert frame.TYPE == expected["type"]
        for name in FIELDS[expected["type_name"]]:
            assert getattr(frame, name) == expected[name], name


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_encode_gives_back_the_same_bytes(vector: dict) -> None:
    raw = bytes.fromhex(vector["udp_payload_hex"])
    decoded = f.decode_datagram(raw)
    out = bytearray()
    for frame in decoded:
        if isinstance(frame, f.DataFrame) and frame.frame_type == f.FrameType.PAD:
            out += frame.encode()  # only the PAD header goes on the wire
        elif isinstance(frame, f.DataFrame):
            start = len(out)
            out += frame.encode()
            assert len(out) - start == f.align(max(frame.length, 32))
        else:
            out += frame.encode()
    assert bytes(out) == raw


def test_positions_match_capture() -> None:
    setups = {}
    for v in VECTORS:
        for fr in v["frames"]:
            if fr["type_name"] == "SETUP":
                setups[(v["scenario"], fr["session_id"])] = fr
    checked = 0
    for v in VECTORS:
        for fr in v["frames"]:
            setup = setups.get((v["scenario"], fr.get("session_id")))
            if setup is None or "position" not in fr:
                continue
            shift = position_bits_to_shift(setup["term_length"])
            term_id = fr.get("term_id", fr.get("consumption_term_id"))
            offset = fr.get("term_offset", fr.get("consumption_term_offset"))
            assert (
                compute_position(term_id, offset, shift, setup["initial_term_id"]) == fr["position"]
            )
            checked += 1
    assert checked >= 5
