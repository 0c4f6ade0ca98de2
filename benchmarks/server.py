"""Stream server benchmark: ``python -m benchmarks.server`` prints one JSON object.

The server runs in its own process (as in production, and so it does not share the GIL with the
client); the client publishes and replays over a loopback session.

- ``record_100b_msgs_per_s`` / ``record_100b_mb_per_s``: publishing 100-byte messages (recorded
  by the server, acknowledged per request).
- ``record_64k_mb_per_s`` / ``record_64k_msgs_per_s``: the same with 64 KiB messages.
- ``replay_udp_100b_msgs_per_s``: bounded replay of the 100-byte recording over a UDP session.
- ``replay_ipc_100b_msgs_per_s``: the same over an IPC session (same host, ``ipc:<port>``).

Sizes are scaled with ``--scale`` (default 1.0); the whole run stays well within 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import server_process


def _publish(client: StreamClient, stream_id: int, payload: bytes, count: int) -> float:
    started = time.perf_counter()
    client.publish(stream_id, (payload for _ in range(count)))
    return time.perf_counter() - started


def _replay(client: StreamClient, stream_id: int) -> tuple[float, int]:
    (rec,) = client.list_recordings([stream_id])
    started = time.perf_counter()
    nbytes = 0
    for block in client.replay(rec.recording_id, rec.start_position, rec.recorded_position):
        nbytes += len(block.data)
    return time.perf_counter() - started, nbytes


def run(scale: float) -> dict[str, object]:
    n_small = int(1_000_000 * scale)
    n_large = int(8_000 * scale)
    small, large = b"s" * 100, b"L" * 65536
    result: dict[str, object] = {"messages_100b": n_small, "messages_64k": n_large}
    with tempfile.TemporaryDirectory() as tmp, server_process(f"{tmp}/srv") as (_p, endpoint):
        settings = ClientSettings(endpoint=endpoint, encryption=False, timeout_s=60)
        with StreamClient.connect(settings) as client:
            _publish(client, 99, small, 1000)  # warm up
            t = _publish(client, 1, small, n_small)
            result["record_100b_msgs_per_s"] = round(n_small / t)
            result["record_100b_mb_per_s"] = round(n_small * 100 / t / 1e6, 1)
            t = _publish(client, 2, large, n_large)
            result["record_64k_msgs_per_s"] = round(n_large / t)
            result["record_64k_mb_per_s"] = round(n_large * 65536 / t / 1e6, 1)
            t, nbytes = _replay(client, 1)
            result["replay_udp_100b_msgs_per_s"] = round(n_small / t)
            result["replay_udp_100b_mb_per_s"] = round(nbytes / t / 1e6, 1)
        port = endpoint.rpartition(":")[2]
        ipc_settings = ClientSettings(endpoint=f"ipc:{port}", encryption=False, timeout_s=60)
        with StreamClient.connect(ipc_settings) as client:  # a session over shared memory
            t, nbytes = _replay(client, 1)
            result["replay_ipc_100b_msgs_per_s"] = round(n_small / t)
            result["replay_ipc_100b_mb_per_s"] = round(nbytes / t / 1e6, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server")
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.scale)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
