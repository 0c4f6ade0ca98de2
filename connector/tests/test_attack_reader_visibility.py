"""Attack on "what a reader sees" (issue 28 follow-ups, README "Security model"): a client allowed
to read one stream, over a real server process run with ``--authorized-keys``, learnt what other
streams' producers and clients were doing:

- ``stats`` gave it the server's totals: ``store.recordings`` counted every stream's recordings,
  ``counters`` every client's requests, publishes and sink commits, ``handshake`` and
  ``transport`` every client's traffic;
- ``list_recordings`` gave it each producer's address and port (``source``:
  ``session:127.0.0.1:40123``) on the streams it reads, though it may not write them;
- a recording id on a stream it may not read was refused with ``NOT_AUTHORISED`` where an id that
  does not exist was ``UNKNOWN_RECORDING``: it could tell which ids exist.

Fixed in ``authz.py``: ``stats`` narrowed to the streams a key reads and its own sessions, the
server-wide sections only with ``admin`` on every stream (named in ``withheld`` otherwise);
``source`` only to a key that may write the stream (else its kind, ``session``); a recording on
a stream the key may not read is answered exactly as one that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from aeron_spark.connector.errors import ConnectorError, ErrorCode
from aeron_spark.connector.server.testing import KeyedServer, keyed_server

GRANTS = {
    "reader": "read=10",  # reads stream 10 only, writes nothing
    "writer": "read=10,11 write=10,11",
    "ops": "read=* write=* admin",
}
SERVER_WIDE = ("counters", "handshake", "transport", "storage", "limits", "server")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedServer]:
    with keyed_server(str(tmp_path_factory.mktemp("visibility")), GRANTS) as srv:
        with srv.client("writer") as w:
            w.publish(10, [b"ten"] * 3)
            w.publish(11, [b"eleven"] * 3)  # another stream, with its own activity
        yield srv


def _recording(server: KeyedServer, stream_id: int) -> int:
    with server.client("ops") as ops:
        return ops.list_recordings([stream_id])[0].recording_id


def test_attack_a_readers_stats_show_only_its_streams_and_no_server_wide_figures(
    server: KeyedServer,
) -> None:
    with server.client("reader") as r:
        stats = r.stats()
    assert {rec["stream_id"] for rec in stats["recordings"]} == {10}
    assert {s["stream_id"] for s in stats["streams"]} == {10}
    # the store's totals counted every stream's recordings: now only those it reads
    assert stats["store"] == {"recordings": len(stats["recordings"])}
    for section in SERVER_WIDE:  # every client's requests, traffic, handshakes
        assert section not in stats, section
        assert section in stats["withheld"], section
    assert {s["client"] for s in stats["sessions"]} == {"reader"}
    with server.client("ops") as ops:  # admin on every stream: the whole server
        full = ops.stats()
    assert full["store"]["recordings"] >= 2 and "withheld" not in full
    assert full["counters"]["requests"] > 0 and "transport" in full


def test_attack_a_reader_does_not_see_the_producers_address(server: KeyedServer) -> None:
    with server.client("writer") as w:
        (written,) = w.list_recordings([10])
    assert re.fullmatch(r"session:127\.0\.0\.1:\d+", written.source), written.source
    with server.client("reader") as r:
        (read,) = r.list_recordings([10])
        in_stats = [rec["source"] for rec in r.stats()["recordings"]]
    assert read.recording_id == written.recording_id
    assert read.source == "session" and in_stats == ["session"]


def _refusal(server: KeyedServer, op: str, recording_id: int) -> ConnectorError:
    args = {
        "position_at": {"recording_id": recording_id, "timestamp_ns": 0},
        "scan": {"recording_id": recording_id, "start": 0},
        "local_read": {"recording_id": recording_id, "start": 0, "end": 64},
        "scan_ranges": {"ranges": [[recording_id, 0, 64]]},
        "consumer_commit": {
            "consumer_id": "probe",
            "stream_ids": [10],
            "positions": [[recording_id, 0]],
        },
    }[op]
    with server.client("reader") as r:
        with pytest.raises(ConnectorError) as info:
            r.call(op, **args)
    return info.value


@pytest.mark.parametrize(
    "op", ["position_at", "scan", "local_read", "scan_ranges", "consumer_commit"]
)
def test_attack_a_reader_cannot_tell_an_unreadable_recording_from_a_missing_one(
    server: KeyedServer, op: str
) -> None:
    hidden = _recording(server, 11)  # exists, on a stream the reader may not read
    missing = hidden + 1_000_003  # does not exist
    seen = _refusal(server, op, hidden)
    unknown = _refusal(server, op, missing)
    assert unknown.code == ErrorCode.UNKNOWN_RECORDING
    assert seen.code == unknown.code, (seen, unknown)
    assert seen.message.replace(str(hidden), "N") == unknown.message.replace(str(missing), "N")
    assert {k: v for k, v in seen.details.items() if v != hidden} == {
        k: v for k, v in unknown.details.items() if v != missing
    }
