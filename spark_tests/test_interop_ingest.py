"""A real Aeron producer -> our stream server's ingest channel -> Spark, byte for byte.

The producer is the real Java ``StreamingPublisher`` sample on the real Java media driver
(``io.aeron:aeron-all`` from Maven Central, see ``transport/tests/aeron_peer.py``); the stream
server records its image from ``--ingest-channel`` (``ServerConfig.ingest_channel``) and
``spark.read.format("aeron")`` reads the recording back. Skips when the jar is not fetched,
fails instead when ``AERON_INTEROP_REQUIRED`` is set (as in CI).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport" / "tests"))
import aeron_peer  # noqa: E402
from aeron_peer import JavaMediaDriver  # noqa: E402

from aeron_spark.connector.client import ClientSettings, StreamClient  # noqa: E402
from aeron_spark.connector.server import ServerConfig, StreamServer  # noqa: E402
from aeron_spark.transport.testing import free_udp_port  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(300)]

_WAIT_S = 60.0


@pytest.mark.parametrize(
    ("uri_params", "count", "length"),
    [
        pytest.param("", 3000, 3000, id="default-fragmented"),
        # 64 KiB terms from term id 2^31-3: the int32 term id wraps, the recording starts at
        # position 131072 and ends after many term rotations (padding at term ends).
        pytest.param(
            "|term-length=65536|mtu=4096|init-term-id=2147483645|term-id=2147483647|term-offset=0",
            2000,
            1000,
            id="term64k-mtu4096-term-id-wrap",
        ),
    ],
)
def test_real_java_publisher_ingest_read_back_by_spark(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path, uri_params: str, count: int, length: int
) -> None:
    aeron_peer.require_java()
    port, stream_id = free_udp_port(), 10
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    config = ServerConfig(
        directory=str(tmp_path / "server"),
        port=0,
        ingest_channel=channel,
        ingest_stream_ids=(stream_id,),
    )
    with StreamServer(config).start() as server, JavaMediaDriver(tag="ingest") as java:
        pub = java.run(
            "io.aeron.samples.StreamingPublisher",
            {
                "aeron.sample.channel": channel + uri_params,
                "aeron.sample.streamId": stream_id,
                "aeron.sample.messages": count,
                "aeron.sample.messageLength": length,
            },
            stdin=b"n\n",  # answers "Execute again? (y/n)"
        )
        assert pub.wait_exit(_WAIT_S) == 0, pub.transcript()
        # The publication closed: its EOS ends the server's image, which stops the recording.
        with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
            deadline = time.monotonic() + _WAIT_S
            while True:
                recs = client.list_recordings([stream_id])
                if recs and all(r.stop_position is not None for r in recs):
                    break
                assert time.monotonic() < deadline, f"recording never stopped: {recs}"
                time.sleep(0.1)
        rows = (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", stream_id)
            .load()
            .select("value", "position", "recording_id", "session_id")
            .orderBy("position")
            .collect()
        )
    [rec] = recs
    assert rec.source.startswith("ingest:"), rec
    assert rec.mtu == (4096 if "mtu=4096" in uri_params else 1408)
    if "init-term-id" in uri_params:
        assert rec.initial_term_id == 2147483645 and rec.start_position == 2 * 65536
    # StreamingPublisher's message i: i as a little-endian u64, then zero bytes.
    expected = [i.to_bytes(8, "little") + bytes(length - 8) for i in range(count)]
    got = [bytes(r.value) for r in rows]
    assert len(got) == count
    assert got == expected
    assert {r.recording_id for r in rows} == {rec.recording_id}
    assert {r.session_id for r in rows} == {rec.session_id}
