"""A message the ingest channel had only in part when the server was killed never makes the
stream unreadable.

Recordings of the ingest channel (plain Aeron publications, no session) hold the frames as the
publisher sent them; a fragmented message arrives a window at a time. A ``kill -9`` while one
was half-way in left its first fragments at the end of the recording, and recovery stopped the
recording there: every batch read of the stream afterwards failed ("the replayed range ends
inside a fragmented message"), for good. A publisher that outlived the server then sent the rest
of that message into a new recording, which started inside it: every read of that recording,
streaming or batch, failed ("the replayed range starts inside a fragmented message").

Now recovery cuts a trailing incomplete message off an ingest recording
(``store.ingest_tail_bytes_cut``), and a recording of an image that joins inside a message
starts at the image's first message (``store.ingest_head_bytes_skipped``): the message the crash
tore is in neither (it was never acknowledged: its end is past any position the server ever
reported recorded), every other one is read once.

The controlled point: the test's own publication (the transport's, a plain Aeron publisher)
writes whole messages, then the first fragments of a large one (``offer_block``) and never the
rest; the server is killed once the recording holds them.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.driver.client import Publication
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.testing import free_udp_port

STREAM = 33
WHOLE = [b"whole-%03d-" % i + b"w" * (i * 37 % 3000) for i in range(50)]
AFTER = [b"after-%03d-" % i + b"a" * (i * 53 % 2000) for i in range(10)]
FIRST_FRAGMENTS = 20


def _ingest_channel() -> tuple[str, list[str]]:
    """A channel on a free UDP port, and the server options that record STREAM on it."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    return channel, ["--ingest-channel", channel, "--ingest-stream-id", str(STREAM)]


def _torn_message(mtu: int) -> tuple[bytes, bytes]:
    """A 200 kB message framed as a publication of ``mtu`` frames it: its first
    FIRST_FRAGMENTS frames, and the rest (``offer_block`` rewrites positions and ids)."""
    framer = Framer(LogGeometry(16 * 1024 * 1024, mtu, 0), 0, STREAM, 0)
    frames = b"".join(bytes(block) for _, block in framer.frame([b"T" * 200_000]))
    return frames[: FIRST_FRAGMENTS * mtu], frames[FIRST_FRAGMENTS * mtu :]


def _wait_recorded(endpoint: str, position: int, recordings: int) -> None:
    """Until the stream's ``recordings``-th recording holds ``position`` (60 s at most)."""
    deadline = time.monotonic() + 60
    with client_for(endpoint, timeout_s=60) as c:
        while True:
            recs = sorted(c.list_recordings([STREAM]), key=lambda r: r.recording_id)
            if len(recs) >= recordings and recs[recordings - 1].recorded_position >= position:
                return
            assert time.monotonic() < deadline, recs
            time.sleep(0.05)


def _send_torn(pub: Publication, endpoint: str) -> tuple[bytes, bytes]:
    """WHOLE, then the first fragments of a large message (never the rest), published on
    ``pub`` once it connects and recorded: the torn message's first and remaining frames."""
    assert pub.wait_until_connected(60.0)
    for message in WHOLE:
        pub.offer_blocking(message, timeout_s=60.0)
    first, rest = _torn_message(pub.max_payload_length + 32)
    pub.offer_block_blocking(first, timeout_s=60.0)
    _wait_recorded(endpoint, pub.position, 1)
    return first, rest


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _options(endpoint: str) -> dict[str, str]:
    return {"endpoint": endpoint, "streamIds": str(STREAM), "encryption": "false"}


def _batch_read(endpoint: str) -> list[bytes]:
    """``spark.read.format("aeron")`` of the stream, by the source's own reader (no JVM)."""
    from aeron_spark.connector.options import parse_source_options
    from aeron_spark.connector.source import AeronBatchReader

    reader = AeronBatchReader(
        parse_source_options(
            {"endpoint": endpoint, "streamIds": str(STREAM), "encryption": "false"}
        )
    )
    out: list[bytes] = []
    for partition in reader.partitions():
        for batch in reader.read(partition):
            out += batch.column("value").to_pylist()
    return out


def _stream_read(endpoint: str) -> list[bytes]:
    """One micro-batch of ``spark.readStream.format("aeron")`` from the earliest offsets."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from aeron_spark.connector.options import parse_source_options
    from aeron_spark.connector.source import AeronStreamReader

    reader = AeronStreamReader(
        parse_source_options(
            {"endpoint": endpoint, "streamIds": str(STREAM), "encryption": "false"}
        )
    )
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    out: list[bytes] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            out += batch.column("value").to_pylist()
    return out


def _record_then_kill(driver: Driver, directory: str, extra: list[str], channel: str):  # type: ignore[no-untyped-def]
    """WHOLE, then the first fragments of a large message, recorded; then ``kill -9``. Returns
    the publication (still open) and the rest of the torn message's frames."""
    pub = driver.add_publication(channel, STREAM)
    with server_process(directory, extra) as (proc, endpoint):
        _first, rest = _send_torn(pub, endpoint)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    return pub, rest


@pytest.mark.slow
@pytest.mark.parametrize("fsync", [False, True])
def test_a_message_torn_by_kill_9_is_cut_off_the_ingest_recording_at_restart(
    tmp_path, fsync
) -> None:
    directory = str(tmp_path / "srv")
    channel, extra = _ingest_channel()
    extra += ["--fsync"] if fsync else []
    with Driver(DriverConfig()) as driver:
        pub, _rest = _record_then_kill(driver, directory, extra, channel)
        pub.close()  # the publisher never sends the rest
        with server_process(directory, extra) as (_proc, endpoint):
            seen = _batch_read(endpoint)  # main: ControlProtocolError (ends inside a message)
            assert seen == WHOLE, f"{len(seen)} messages"
            with client_for(endpoint) as c:
                (rec,) = c.list_recordings([STREAM])
                (row,) = c.recording_positions([STREAM]).values()
                cut = c.stats()["store"].get("ingest_tail_bytes_cut")
            assert rec.stop_position == row.message_end, (rec, row)  # stops on a boundary
            assert cut == FIRST_FRAGMENTS * (pub.max_payload_length + 32), cut


@pytest.mark.slow
def test_a_publisher_that_outlives_the_server_mid_message_leaves_a_readable_stream(
    tmp_path,
) -> None:
    directory = str(tmp_path / "srv")
    channel, extra = _ingest_channel()
    # the publication is seen unconnected 2 s after the killed server's last status message
    # (the shortest timeout a driver takes; 5 s by default, which the test waited out)
    config = DriverConfig(publication_connection_timeout_ns=2_000_000_000)
    with Driver(config) as driver:
        pub, rest = _record_then_kill(driver, directory, extra, channel)
        # the publication notices its receiver gone, then joins the restarted server where it
        # is: inside the torn message (as a publisher held back by flow control would)
        _wait(lambda: not pub.is_connected, "the publication still connected", 90.0)
        with server_process(directory, extra) as (_proc, endpoint):
            assert pub.wait_until_connected(60.0)
            pub.offer_block_blocking(rest, timeout_s=60.0)
            for message in AFTER:
                pub.offer_blocking(message, timeout_s=60.0)
            _wait_recorded(endpoint, pub.position, 2)
            # main: each read failed (the first recording ends, the second starts, inside it)
            assert _stream_read(endpoint) == WHOLE + AFTER
            assert _batch_read(endpoint) == WHOLE + AFTER
            with client_for(endpoint) as c:
                first, second = sorted(c.list_recordings([STREAM]), key=lambda r: r.recording_id)
                store = c.stats()["store"]
            torn = FIRST_FRAGMENTS * (pub.max_payload_length + 32)
            assert second.start_position == first.stop_position + torn + len(rest), second
            assert store.get("ingest_tail_bytes_cut") == torn, store
            assert store.get("ingest_head_bytes_skipped") == len(rest), store
        pub.close()


@pytest.mark.slow
def test_a_publisher_gone_mid_message_leaves_its_recording_ending_on_its_last_message(
    tmp_path,
) -> None:
    """No crash of the server: the publisher goes away inside a message (closed; a dead one's
    image times out the same way). The recording stopped there too (main: every batch read of
    the stream failed afterwards); now it stops at its last whole message."""
    directory = str(tmp_path / "srv")
    channel, extra = _ingest_channel()
    with Driver(DriverConfig()) as driver, server_process(directory, extra) as (_p, endpoint):
        pub = driver.add_publication(channel, STREAM)
        first, _rest = _send_torn(pub, endpoint)
        pub.close()
        with client_for(endpoint, timeout_s=60) as c:
            _wait(
                lambda: c.list_recordings([STREAM])[0].stop_position is not None,
                "the recording never stopped",
            )
            (rec,) = c.list_recordings([STREAM])
            (row,) = c.recording_positions([STREAM]).values()
            cut = c.stats()["store"].get("ingest_tail_bytes_cut")
        assert _batch_read(endpoint) == WHOLE
        assert rec.stop_position == row.message_end, (rec, row)
        assert cut == len(first), cut
