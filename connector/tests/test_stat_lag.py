"""``aeron-spark stat`` shows each consumer's lag (issue 32 item 5): PySpark 4.3 gives a Python
streaming source no metrics hook, so the server says how far each consumerId is behind."""

from __future__ import annotations

import io

from aeron_spark.connector.server import ServerConfig, StreamServer, stat_main
from aeron_spark.connector.server.testing import client_for


def test_stat_shows_each_consumers_bytes_behind_each_recording(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with StreamServer(ServerConfig(directory=str(tmp_path / "s"), port=0)) as server:
        with client_for(server.endpoint, encryption=True) as client:
            client.publish(10, [b"x" * 100] * 50)
            (rec,) = client.list_recordings(stream_ids=[10])
            half = client.scan(rec.recording_id, rec.start_position, max_messages=20).end
            client.consumer_commit("job-a", [10], {rec.recording_id: half})
            client.consumer_commit("job-b", [10], {rec.recording_id: rec.recorded_position})
        out = io.StringIO()
        assert stat_main(["--endpoint", server.endpoint, "--once"], out=out) == 0
    lines = out.getvalue().splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  job-")}
    behind = rec.recorded_position - half
    assert rows["job-a"][1:5] == [
        str(rec.recording_id),
        f"{half:,}",
        f"{rec.recorded_position:,}",
        f"{behind:,}",
    ]
    assert behind == 30 * (rec.recorded_position - rec.start_position) // 50
    assert rows["job-b"][4] == "0"
    assert "consumers (2)" in lines
