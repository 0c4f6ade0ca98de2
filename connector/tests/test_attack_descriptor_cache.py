"""Attacks on the recording-file cache at a third of the descriptor limit (fifteenth session:
a publishing recording keeps three files, segment, index and acked end): under a low limit one
client making a recording on each of many streams, while another replays every one of them,
must get no EMFILE anywhere (the cache evicts what nobody uses; a file in use is never closed
under a replay), and a newcomer still connects and publishes."""

from __future__ import annotations

import threading
from pathlib import Path

from aeron_spark.connector.server.testing import client_for, messages_of, server_process


def _replayed(client, stream: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    out: list[bytes] = []
    for rec in client.list_recordings([stream]):
        blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
        out += [m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)]
    return out


def test_many_recordings_written_and_replayed_at_once_under_a_low_descriptor_limit(
    tmp_path: Path,
) -> None:
    streams = range(100, 220)  # 120 recordings, 360 files, through a cache of 42 (limit 128)
    errors: list[BaseException] = []
    with server_process(str(tmp_path / "srv"), nofile=(128, 128)) as (proc, endpoint):
        with client_for(endpoint) as writer:
            for s in streams[:20]:
                writer.publish(s, [b"%d-first" % s])

            def reader() -> None:
                try:
                    with client_for(endpoint) as client:
                        for _ in range(3):
                            for s in streams[:20]:
                                assert _replayed(client, s)[0] == b"%d-first" % s
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            thread = threading.Thread(target=reader)
            thread.start()
            for s in streams:
                writer.publish(s, [b"%d-second" % s])
            thread.join(600)
            assert not errors, errors[0]
            with client_for(endpoint) as newcomer:
                newcomer.publish(999, [b"newcomer"])
                assert _replayed(newcomer, 999) == [b"newcomer"]
            for s in streams:
                want = [b"%d-first" % s] if s in streams[:20] else []
                assert _replayed(writer, s) == [*want, b"%d-second" % s]
            stats = writer.stats()
        assert proc.poll() is None
    assert stats["counters"].get("too_many_open_files_errors", 0) == 0
    assert stats["store"]["open_files_capacity"] == 128 // 3  # a third of the limit
    assert stats["store"]["open_files"] <= stats["store"]["open_files_capacity"]
