"""kill -9 of the server during heavy recording, then restart: no complete frame is lost."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
from aeron_spark.connector.errors import ConnectorError
from aeron_spark.connector.server.testing import client_for, messages_of, server_process

STREAM = 10


def _publish_until_killed(endpoint: str, prefix: bytes, acked: list[int], stop: threading.Event):
    """Publish numbered messages in batches; record how many the server acknowledged."""
    try:
        with client_for(endpoint, timeout_s=3) as c:
            n = 0
            while not stop.is_set():
                batch = [prefix + b"%08d" % i + b"." * (i % 200) for i in range(n, n + 500)]
                c.publish(STREAM, batch)
                n += len(batch)
                acked.append(n)
    except ConnectorError:
        pass  # the server was killed under us


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_during_recording_loses_no_complete_frame(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    directory = str(tmp_path / "srv")
    runs: list[tuple[bytes, list[int]]] = []
    for run in range(3):
        with server_process(directory) as (proc, endpoint):
            prefix = b"r%d-" % run
            acked: list[int] = []
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=_publish_until_killed,
                    args=(endpoint, prefix + b"t%d-" % t, acked_t, stop),
                )
                for t, acked_t in enumerate([acked, []])
            ]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.3, 1.5))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            stop.set()
            for t in threads:
                t.join(60)
            runs.append((prefix + b"t0-", acked))
    with server_process(directory) as (_proc, endpoint), client_for(endpoint) as c:
        recs = c.list_recordings([STREAM])
        assert recs, "nothing was recorded"
        contents: dict[bytes, list[bytes]] = {}
        for rec in recs:
            assert rec.stop_position is not None  # recovered recordings are finished
            msgs = messages_of(
                c.replay(rec.recording_id, rec.start_position, rec.recorded_position),
                rec.initial_term_id,
                rec.term_length,
            )
            if msgs:
                key = msgs[0].payload[: msgs[0].payload.index(b"-", 3) + 1]
                contents.setdefault(key, []).extend(m.payload for m in msgs)
        for prefix, acked in runs:
            assert acked, "the publisher had nothing acknowledged before the kill"
            got = contents.get(prefix, [])
            expected_min = acked[-1] if acked else 0
            # every acknowledged message is there, in order, with nothing torn or duplicated
            assert len(got) >= expected_min
            for i, payload in enumerate(got):
                assert payload == prefix + b"%08d" % i + b"." * (i % 200)
