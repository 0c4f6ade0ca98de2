"""Attack: retention runs pile up on the commit worker, outside the fair queue.

The commit worker runs the clients' deferred requests in turn (``fairqueue.py``) and, on every
gc tick, the retention policy (``Retention.run``), which was submitted to the worker directly on
each tick whether the last one had run or not. A run walks every consumer for every recording
(``ConsumerRegistry.hold``): a client that creates many consumers (and recordings) makes a run
longer than the gc interval (10 s by default), and from then on one more run was queued on
every tick than the worker finished: the queue grew without bound and every client's commit,
scan and consumer commit waited behind all the runs queued before it, longer on each tick.
Fixed: a tick submits a run only when none is queued or running (a tick that finds one is
counted, ``retention_ticks_skipped``), so a request waits behind one run at most.

Here the gc interval is 10 ms and 6,000 consumers (written to ``consumers.msgpack`` before the
start, through the server's own registry) over 12 recordings make a run several times longer
than that. The bound is in runs' lengths, measured in the same run: runs go back to back while
the test sleeps, so a run lasts the window over the runs finished in it, and a commit may wait
for the run under way and one queued behind it, then do its own work. Counting the runs finished
between two stats requests (the earlier form of this test) also counts the runs that go by while
the requests travel: on a fast machine a run is ~10 ms and five finished around a 47 ms commit.
A real in-process server, a real session over loopback UDP."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.retention import ConsumerRegistry

TERM = 64 * 1024
CONSUMERS = 6000
STREAMS = tuple(range(40, 52))  # a recording each


def _runs(client: StreamClient) -> int:
    return int(client.stats()["counters"]["retention_runs"])


def test_attack_retention_runs_do_not_pile_up_before_a_commit(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    registry = ConsumerRegistry(str(directory))
    for n in range(CONSUMERS):  # what a client's consumer_commits leave in the file
        registry.consumers[f"c{n}"] = _consumer(f"c{n}")
    registry._save()
    config = ServerConfig(
        directory=str(directory),
        port=0,
        term_length=TERM,
        mtu=1408,
        retention_bytes=TERM,
        gc_interval_ns=10_000_000,
        encryption=False,
    )
    with (
        StreamServer(config) as server,
        StreamClient.connect(
            ClientSettings(endpoint=server.endpoint, encryption=False, timeout_s=60.0)
        ) as client,
    ):
        ends = {stream: client.publish(stream, [b"row"]) for stream in STREAMS}
        rec = client.list_recordings([STREAMS[0]])[0].recording_id
        time.sleep(0.5)  # ticks go by: on main each one queued another run
        window_started, runs_at_start = time.monotonic(), _runs(client)
        before = runs_at_start
        while before - runs_at_start < 2 or time.monotonic() - window_started < 1.0:
            # at least two whole runs in the window, however loaded the machine: with none the
            # window's length would stand for a run's and make the bound tighter than a run
            assert time.monotonic() - window_started < 60.0, (runs_at_start, before)
            time.sleep(0.05)
            before = _runs(client)
        run_s = (time.monotonic() - window_started) / (before - runs_at_start)
        started = time.monotonic()
        client.consumer_commit("honest", [STREAMS[0]], {rec: ends[STREAMS[0]]})
        commit_s = time.monotonic() - started
        during = _runs(client) - before
        skipped = client.stats()["counters"].get("retention_ticks_skipped")
        print(
            "retention backlog",
            json.dumps(
                {
                    "retention_runs_before_the_commit": during,
                    "commit_s": round(commit_s, 3),
                    "run_s": round(run_s, 3),
                    "retention_ticks_skipped": skipped,
                    "load_average": os.getloadavg(),
                }
            ),
        )
        # behind the run under way and at most one more, then its own rewrite of the consumers'
        # file (on main: behind every run queued since the start, dozens)
        assert commit_s <= 3 * run_s + 0.5, (commit_s, run_s, during)
        assert skipped, skipped  # the ticks that found a run queued were counted


def _consumer(cid: str):  # type: ignore[no-untyped-def]
    from aeron_spark.connector.server.retention import Consumer

    return Consumer(cid, STREAMS, {}, time.time() + 3600, "", "10.0.0.1")
