"""An established session's replay while a public port is flooded; prints one JSON object.

    python -m benchmarks.port_flood [--replay-mib N] [--rounds R]

A stream server runs in a child process. One client publishes ``--replay-mib`` MiB (4 KiB
messages), then for each of ``quiet``, ``port`` (``transport/tests/hostile_peer.py`` floods the
handshake port with valid small SETUPs, mode ``images``) and ``control`` (60 KB datagrams to the
control port, mode ``bulk``) it times a replay of all of it: for the floods once the public
socket's kernel drops rose by 1,000 (``/proc/net/udp``). Reported per mode: replay seconds
(median over rounds), the kernel's drops on the socket the session's datagrams arrive on (its
own since the dedicated sockets; the public one before) and on the public socket.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aeron_spark.connector.server.testing import (
    client_for,
    messages_of,
    server_process,
    udp_sockets_of,
)
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID

PEER = Path(__file__).resolve().parents[1] / "transport" / "tests" / "hostile_peer.py"
STREAM = 10


def _drops(pid: int, port: int) -> tuple[int, int]:
    """(public socket's drops, session socket's drops: a connected one if any, else public)."""
    rows = udp_sockets_of(pid, port)
    public = sum(r.drops for r in rows if not r.connected)
    connected = [r.drops for r in rows if r.connected]
    return public, (sum(connected) if connected else public)


def _replay(client: Any) -> tuple[float, int]:
    started = time.perf_counter()
    count = 0
    for rec in client.list_recordings([STREAM]):
        if rec.recorded_position > rec.start_position:
            blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            count += len(messages_of(blocks, rec.initial_term_id, rec.term_length))
    return time.perf_counter() - started, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.port_flood")
    parser.add_argument("--replay-mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    payloads = [b"%08d" % i + b"." * 4088 for i in range(args.replay_mib * 256)]
    times: dict[str, list[float]] = {"quiet": [], "port": [], "control": []}
    drops: dict[str, list[int]] = {"port": [0, 0], "control": [0, 0]}
    failures = dict.fromkeys(times, 0)
    with tempfile.TemporaryDirectory() as tmp, server_process(f"{tmp}/srv") as (proc, endpoint):
        host, port_text = endpoint.rsplit(":", 1)
        with client_for(endpoint, timeout_s=args.timeout_s) as client:
            client.publish(STREAM, payloads)
            for _ in range(args.rounds):
                for mode in times:
                    if mode == "quiet":
                        seconds, count = _replay(client)
                        times[mode].append(seconds)
                        continue
                    port = int(port_text) + (1 if mode == "control" else 0)
                    peer = subprocess.Popen(
                        [
                            sys.executable,
                            str(PEER),
                            host,
                            str(port),
                            str(HANDSHAKE_STREAM_ID),
                            "3600",
                            "100000" if mode == "port" else "1",
                            "images" if mode == "port" else "bulk",
                            "127.0.2.1",
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    try:
                        peer.stdout.readline()
                        public0, session0 = _drops(proc.pid, port)
                        deadline = time.monotonic() + 60
                        while _drops(proc.pid, port)[0] - public0 < 1000:
                            if time.monotonic() > deadline:
                                break
                            time.sleep(0.1)
                        try:
                            seconds, count = _replay(client)
                            times[mode].append(seconds)
                            if count != len(payloads):
                                failures[mode] += 1
                        except Exception:  # noqa: BLE001 - a lost session is a result here
                            failures[mode] += 1
                        public1, session1 = _drops(proc.pid, port)
                        drops[mode][0] += public1 - public0
                        drops[mode][1] += session1 - session0
                    finally:
                        peer.stdin.close()
                        peer.stdout.readline()
                        peer.wait(30)
    result: dict[str, Any] = {
        "benchmark": "port_flood",
        "replay_mib": args.replay_mib,
        "rounds": args.rounds,
    }
    for mode, values in times.items():
        result[f"{mode}_replay_s"] = round(statistics.median(values), 2) if values else None
        result[f"{mode}_replay_max_s"] = round(max(values), 2) if values else None
        result[f"{mode}_failures"] = failures[mode]
        if mode in drops:
            result[f"{mode}_public_socket_drops"] = drops[mode][0]
            result[f"{mode}_session_socket_drops"] = drops[mode][1]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
