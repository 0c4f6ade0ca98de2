"""Attack on the server's invoker mode (its loop steps its own media driver): one session's
pipelined requests, each heavy but within its operation's limits, stall the driver for every
other client.

A pass of the loop steps the driver between sessions once 5 ms have gone by
(``DRIVER_STEP_INTERVAL_NS``), but a session's own turn takes up to 64 of its messages (4 MiB)
with no step between them. A client with read permission pipelines ``replay_ranges`` requests of
65,536 ranges (262 KB each, ~0.3 s of the loop each on a quiet machine; a session may run 16
replays): one turn took 8 of them, 2.5-3.4 s with no step of the driver (load 1.5), so no status
message, heartbeat or NAK went to any other client meanwhile. Another client over a driver with
the shortest publication connection timeout a driver takes (2 s: ``DriverConfig``, a documented
setting) saw its requests' publication unconnected and lost its session; at the default 5 s the
same happens once the machine is loaded (the turn's wall time grows with the load).

A real server process, real sessions over loopback UDP."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import server_process
from aeron_spark.transport import Driver, DriverConfig

STREAM = 10
RANGES = 65_536  # a replay_ranges request's most (protocol.MAX_POSITIONS)
REQUESTS = 16  # the replays a session may run at once
# the victim: the shortest transport timeouts a driver takes (its session is seen lost 2 s after
# the server's last status message)
VICTIM_DRIVER = DriverConfig(
    write_counters_file=False,
    publication_connection_timeout_ns=2_000_000_000,
    image_liveness_timeout_ns=4_000_000_000,
)


def _settings(endpoint: str, store: Path) -> ClientSettings:
    return ClientSettings(
        endpoint=endpoint, encryption=False, key_store_dir=str(store), timeout_s=120.0
    )


def test_attack_one_sessions_heavy_requests_do_not_stall_the_driver_for_others(
    tmp_path: Path,
) -> None:
    with server_process(str(tmp_path / "srv")) as (_proc, endpoint):
        with (
            Driver(VICTIM_DRIVER) as driver,
            StreamClient.connect(_settings(endpoint, tmp_path / "victim"), driver) as victim,
            StreamClient.connect(_settings(endpoint, tmp_path / "hostile")) as hostile,
        ):
            hostile.publish(STREAM, [b"row"])
            rid = hostile.list_recordings([STREAM])[0].recording_id
            victim.publish(STREAM + 1, [b"first"])
            before = victim.client_counters()["reconnects"]
            done = threading.Event()
            published = [0]
            errors: list[BaseException] = []

            def victim_publishes() -> None:
                # an honest client publishing while the attack runs
                try:
                    while not done.is_set():
                        victim.publish(STREAM + 1, [b"v"])
                        published[0] += 1
                        done.wait(0.05)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            thread = threading.Thread(target=victim_publishes)
            thread.start()
            started = time.monotonic()
            try:
                ranges = [[rid, 0, 0]] * RANGES
                ids = [
                    hostile._send_request("replay_ranges", {"ranges": ranges})
                    for _ in range(REQUESTS)
                ]
                for request_id in ids:
                    hostile._wait_reply(request_id)
            finally:
                done.set()
                thread.join(150)
            attack_s = time.monotonic() - started
            lost = victim.client_counters()["reconnects"] - before
            print(
                "heavy session",
                json.dumps(
                    {
                        "requests": REQUESTS,
                        "ranges_each": RANGES,
                        "attack_s": round(attack_s, 2),
                        "victim_publishes": published[0],
                        "victim_sessions_lost": lost,
                        "victim_errors": [repr(e)[:200] for e in errors],
                        "load_average": os.getloadavg(),
                    }
                ),
            )
            assert not thread.is_alive()
            # on main: the victim's session lost (its publication unconnected 2 s) during a
            # publish, which fails with ServerUnavailableError (a publish is not sent again)
            assert not errors, errors
            assert lost == 0, lost
            assert published[0] > 0
