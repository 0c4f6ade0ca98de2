"""Large messages (issue 31, item 5): the limit is known to the client, configurable, and a
message over it is refused before anything is sent; a large message is sent in chunks cut from
it as they go, never copied whole.

Aeron's largest message is ``min(term_length / 8, 16 MiB)`` (``FrameDescriptor.
computeMaxMessageLength``): 8 MiB with the server's default 64 MiB terms, 16 MiB from 128 MiB.
Before, the client encoded the whole request (a second copy of the message), sent it in chunks,
the server reassembled and decoded it, and only then refused it (a 256 MiB publish peaked at
850 MB in the client); the server's term length could not be set from the command line.

Every test runs against ``aeron-spark server`` in its own process (so what ``tracemalloc``
sees here is the client alone) and counts: bytes, counters, traced allocations, never time.
"""

from __future__ import annotations

import os
import tracemalloc

import pytest

from aeron_spark.connector.errors import ErrorCode, PayloadTooLargeError
from aeron_spark.connector.server.testing import client_for, messages_of, server_process
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto

MIB = 1024 * 1024


def _received(client) -> dict[str, int]:
    """What the server saw: its counters that any publish moves, its recordings, and the bytes
    its transport received."""
    stats = client.stats()
    counters = stats["counters"]
    return {
        "messages_published": counters["messages_published"],
        "bytes_published": counters["bytes_published"],
        "protocol_errors": counters["protocol_errors"],
        "request_errors": counters["request_errors"],
        "chunks_discarded": counters["chunks_discarded"],
        "recordings": stats["store"]["recordings"],
        "bytes_received": stats["transport"]["bytes_received"],
    }


def test_a_message_over_the_limit_is_refused_before_anything_is_sent(tmp_path) -> None:
    """Default terms (64 MiB): 8 MiB is the largest message. A 9 MiB publish is refused by the
    client, naming size and limit, and the server receives none of it (on the old code it was
    sent whole, a recording made, and refused after reassembly)."""
    with server_process(str(tmp_path / "srv")) as (_, endpoint):
        client = client_for(endpoint)
        try:
            before = _received(client)
            with pytest.raises(PayloadTooLargeError) as refused:
                client.publish(10, [b"small", bytes(9 * MIB)])
            assert refused.value.code is ErrorCode.PAYLOAD_TOO_LARGE
            assert refused.value.details["length"] == 9 * MIB
            assert refused.value.details["limit"] == 8 * MIB
            after = _received(client)
            # the client's two questions (its limit, the stats) are all that arrived: a few
            # hundred bytes, not 9 MiB
            received = after.pop("bytes_received") - before.pop("bytes_received")
            assert received < 64 * 1024, received
            assert after == before
            assert refused.value.details["index"] == 1
            assert client.messages_refused == 1
            assert client.message_limit(10) == 8 * MIB
            # a sink task staging over its session is refused the same way, before sending
            before = _received(client)
            with pytest.raises(PayloadTooLargeError):
                client.stage("sink", 0, 0, 0, 10, iter([bytes(9 * MIB)]), local=False)
            after = _received(client)
            assert after.pop("bytes_received") - before.pop("bytes_received") < 64 * 1024
            assert after == before and client.messages_refused == 2
            # the session is clean: a message at the limit goes through
            assert client.publish(10, [bytes(8 * MIB)]) > 0
        finally:
            client.close()


def test_term_length_raises_the_limit_and_such_a_message_round_trips(tmp_path) -> None:
    """``--term-length 128M`` takes Aeron's largest, 16 MiB (a 12 MiB message is recorded and
    replayed whole); ``--stream-term-length`` sets one stream's (256 KiB terms: 32 KiB)."""
    extra = ["--term-length", "128M", "--stream-term-length", "11=256K"]
    with server_process(str(tmp_path / "srv"), extra) as (_, endpoint):
        client = client_for(endpoint)
        try:
            assert client.message_limit(10) == 16 * MIB
            assert client.message_limit(11) == 32 * 1024
            payload = os.urandom(12 * MIB)
            end = client.publish(10, [payload], [7])
            (rec,) = client.list_recordings([10])
            assert rec.term_length == 128 * MIB and rec.recorded_position == end
            blocks = list(client.replay(rec.recording_id, rec.start_position, end))
            (got,) = messages_of(blocks, rec.initial_term_id, rec.term_length)
            assert got.payload == payload and got.reserved_value == 7
            with pytest.raises(PayloadTooLargeError) as refused:
                client.publish(11, [bytes(40 * 1024)])
            assert refused.value.details["limit"] == 32 * 1024
            assert client.list_recordings([11]) == []
            # Aeron's cap holds whatever the term: past 16 MiB is refused
            with pytest.raises(PayloadTooLargeError):
                client.publish(10, [bytes(16 * MIB + 1)])
        finally:
            client.close()


def test_publishing_a_large_message_holds_chunks_not_copies(tmp_path) -> None:
    """The client's allocations while publishing an 8 MiB message (the payload made before):
    a few of its session's chunks (1 MiB: the chunk, the session frame, its sealed copy and the
    cipher's buffer), not a copy of the message (the old client encoded the whole request
    first, then cut it: 12 MiB)."""
    with server_process(str(tmp_path / "srv")) as (_, endpoint):
        client = client_for(endpoint)
        try:
            client.publish(10, [bytes(64 * 1024)])  # the limit is asked once per session
            payload = os.urandom(8 * MIB)
            tracemalloc.start()
            try:
                client.publish(10, [payload])
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            chunk = client.max_message_length
            assert peak <= 5 * chunk, (peak, chunk)
        finally:
            client.close()


def test_the_chunker_holds_one_chunk_whatever_the_message() -> None:
    """Encoding a 16 MiB publish as parts and cutting them into 1 MiB chunks allocates about
    one chunk at a time; the chunks are byte for byte those of the whole encoded request."""
    payload = os.urandom(16 * MIB)
    args = {"stream_id": 10, "payloads": [b"a", payload, b"b" * 100], "reserved_values": [1, 2, 3]}
    tracemalloc.start()
    try:
        parts = proto.encode_request_parts(5, "publish", args)
        count = 0
        for chunk in chunking.split_parts(parts, MIB, 9):
            count += 1
            del chunk
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 17
    assert peak <= 2 * MIB + 64 * 1024, peak
    whole = proto.encode_request(5, "publish", args)
    assert b"".join(parts) == whole
    assert [bytes(c) for c in chunking.split_parts(parts, MIB, 9)] == list(
        chunking.split(whole, MIB, 9)
    )


def test_term_length_options_reach_the_config_and_bad_ones_are_usage_errors(
    tmp_path, capsys
) -> None:
    """``--term-length`` / ``--stream-term-length`` set the recordings' term lengths and so the
    limits; a term length that is no power of two from 64K to 1G, a malformed pair or a stream
    given twice is refused before the server starts (exit 2), naming what was wrong."""
    from aeron_spark.cli import main as cli_main
    from aeron_spark.connector.server.cli import build_parser, config_from_args

    args = build_parser().parse_args(
        ["--dir", str(tmp_path), "--term-length", "256M", "--stream-term-length", "11=1M"]
    )
    config = config_from_args(args)
    assert config.term_length == 256 * MIB and config.stream_term_lengths == ((11, MIB),)
    assert config.max_message_length_for(10) == 16 * MIB  # Aeron's cap, not 256M / 8
    assert config.max_message_length_for(11) == 128 * 1024
    assert config.mtu_for(11) == 65504
    directory = tmp_path / "data"
    for bad, named in (
        (["--term-length", "100M"], "term_length=104857600"),
        (["--term-length", "2G"], "term_length"),
        (["--stream-term-length", "11"], "STREAM=BYTES"),
        (["--stream-term-length", "11=3M"], "term length of stream 11"),
        (["--stream-term-length", "11=1M", "--stream-term-length", "11=2M"], "distinct"),
    ):
        assert cli_main(["server", "--dir", str(directory), *bad]) == 2
        assert named in capsys.readouterr().err
        assert not directory.exists()
