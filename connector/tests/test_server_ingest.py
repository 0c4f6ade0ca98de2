"""A plain Aeron publication (no handshake) on the ingest channel is recorded by the server."""

from __future__ import annotations

import socket
import time

from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import client_for, messages_of
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.api import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_plain_publication_on_the_ingest_channel_is_recorded(tmp_path) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{_free_udp_port()}"
    config = ServerConfig(
        directory=str(tmp_path / "srv"),
        port=0,
        encryption=False,
        ingest_channel=channel,
        ingest_stream_ids=(33,),
    )
    messages = [f"plain-{i}".encode() * (1 + i % 50) for i in range(2000)]
    with StreamServer(config) as srv, Driver(DriverConfig()) as driver:
        pub = driver.add_publication(channel, 33)
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
