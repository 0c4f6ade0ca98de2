"""A plain Aeron publication (no handshake) on the ingest channel is recorded by the server."""

from __future__ import annotations

import time

import pytest

from aeron_spark.connector.server import StreamServer
from aeron_spark.connector.server.testing import client_for, ingest_publication, messages_of
from aeron_spark.transport.api import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED


def test_plain_publication_on_the_ingest_channel_is_recorded(tmp_path) -> None:
    messages = [f"plain-{i}".encode() * (1 + i % 50) for i in range(2000)]
    with ingest_publication(tmp_path) as (srv, pub):
        assert pub.wait_until_connected(30.0)
        deadline = time.monotonic() + 60
        for msg in messages:
            while (result := pub.offer(msg)) < 0:
                assert result in (BACK_PRESSURED, ADMIN_ACTION, NOT_CONNECTED)
                assert time.monotonic() < deadline
                time.sleep(0.001)
        end = pub.position
        with client_for(srv.endpoint) as c:
            while True:
                recs = c.list_recordings([33])
                if recs and recs[0].recorded_position >= end:
                    break
                assert time.monotonic() < deadline, recs
                time.sleep(0.05)
            (rec,) = recs
            assert rec.session_id == pub.session_id
            got = messages_of(
                c.replay(rec.recording_id, rec.start_position, end),
                rec.initial_term_id,
                rec.term_length,
            )
            assert [m.payload for m in got] == messages


def _ingest_outcome(srv: StreamServer, pub, stream_id: int) -> tuple[int, list]:
    """Offer to the ingest channel until the server either refused the publisher's SETUP or
    recorded its messages (bounded); returns (SETUPs refused for their source, recordings)."""
    deadline = time.monotonic() + 30
    n = 0
    while True:
        snap = srv.snapshot()
        refused = snap["transport"].get("setups_source_refused", 0)
        recordings = [r for r in snap["recordings"] if r["stream_id"] == stream_id]
        if refused or any(r["recorded_position"] > r["start_position"] for r in recordings):
            return refused, recordings
        assert time.monotonic() < deadline, "neither refused nor recorded"
        pub.offer(b"from-outside-%d" % n)
        n += 1
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("allow", "deny", "ingest_allow", "recorded"),
    [
        (("127.0.0.2/32",), (), (), False),  # outside --allow (issue 28, item 7)
        ((), ("127.0.0.0/8",), (), False),  # denied
        ((), (), ("127.0.0.2/32",), False),  # outside --ingest-allow
        (("127.0.0.0/8",), (), ("::ffff:127.0.0.1/128",), True),  # inside both
    ],
)
def test_the_ingest_channel_records_only_admitted_sources(
    tmp_path, allow, deny, ingest_allow, recorded
) -> None:
    """The ingest channel applies the server's allow/deny lists and its own ingest allow list at
    SETUP: a plain publisher (no key, no handshake) from another source gets no image, so it is
    never recorded (the old server recorded it), and the refusal is counted."""
    more = {"ingest_allow": ingest_allow} if ingest_allow else {}
    with ingest_publication(tmp_path, allow=allow, deny=deny, **more) as (srv, pub):
        refused, recordings = _ingest_outcome(srv, pub, 33)
        if recorded:
            assert recordings and not refused
            assert pub.is_connected
        else:
            assert not recordings, f"a publisher from 127.0.0.1 was recorded: {recordings}"
            assert refused >= 1
            assert not pub.is_connected
            assert srv.snapshot()["store"]["ingest_images"] == 0
