"""Stream server benchmark: ``python -m benchmarks.server`` prints one JSON object.

The server runs in its own process (as in production, and so it does not share the GIL with the
client); the client publishes and replays over a loopback session. The server runs with
``--allow-plain-udp``, so one run measures both kinds of session: **sealed** (AES-GCM, what a
client gets over UDP by default: ``ClientSettings(encryption=True)``, or any client of a server
without ``--allow-plain-udp``) and **plain** (``encryption=False`` against this server), each
on a session of its own, taking turns.

- ``record_100b_msgs_per_s_<kind>`` / ``record_100b_mb_per_s_<kind>``: publishing 100-byte
  messages (recorded by the server, acknowledged per request).
- ``record_64k_mb_per_s_<kind>`` / ``record_64k_msgs_per_s_<kind>``: the same with 64 KiB
  messages, the best of ``--rounds`` rounds, sealed and plain in turns (the order swapped each
  round); ``record_64k_sealed_to_plain`` their ratio.
- ``replay_udp_100b_msgs_per_s_<kind>``: bounded replay of the 100-byte recording.
- ``replay_ipc_100b_msgs_per_s``: the same over an IPC session (same host, ``ipc:<port>``;
  never sealed).

``--profile``: the client's 64 KiB publishes under cProfile (sealed and plain apart), the top
functions by own time in ``profile_64k_<kind>``. Sizes are scaled with ``--scale`` (default
1.0). The JSON includes the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from typing import Any

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import server_process
from aeron_spark.handshake.crypto import SEAL_OVERHEAD

KINDS = ("sealed", "plain")


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


def _top(profile: cProfile.Profile, count: int = 20) -> list[str]:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(count)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def run(scale: float, rounds: int, profile: bool) -> dict[str, object]:
    n_small = int(1_000_000 * scale)
    n_large = int(8_000 * scale)
    small, large = b"s" * 100, b"L" * 65536
    result: dict[str, Any] = {
        "load_average_start": [round(x, 1) for x in os.getloadavg()],
        "messages_100b": n_small,
        "messages_64k": n_large,
        "rounds_64k": rounds,
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        server_process(f"{tmp}/srv", ["--allow-plain-udp"]) as (_p, endpoint),
    ):
        clients = {
            kind: StreamClient.connect(
                ClientSettings(endpoint=endpoint, encryption=kind == "sealed", timeout_s=60)
            )
            for kind in KINDS
        }
        try:
            # a sealed session's messages are SEAL_OVERHEAD bytes shorter than a plain one's
            overhead = clients["plain"].max_message_length - clients["sealed"].max_message_length
            if overhead != SEAL_OVERHEAD:
                raise RuntimeError("the server sealed the plain session: is it --allow-plain-udp?")
            # streams: 100 B on 1 (sealed) / 11 (plain), 64 KiB on 2.. / 12.., warm-up 99 / 98
            base = {"sealed": 0, "plain": 10}
            for kind, client in clients.items():
                _publish(client, 99 - base[kind] // 10, small, 1000)  # warm up
                t = _publish(client, base[kind] + 1, small, n_small)
                result[f"record_100b_msgs_per_s_{kind}"] = round(n_small / t)
                result[f"record_100b_mb_per_s_{kind}"] = round(n_small * 100 / t / 1e6, 1)
            best = dict.fromkeys(KINDS, float("inf"))
            profiles = {kind: cProfile.Profile() for kind in KINDS} if profile else {}
            for round_ in range(rounds):
                order = KINDS if round_ % 2 == 0 else KINDS[::-1]
                for kind in order:
                    stream_id = base[kind] + 2 + round_
                    prof = profiles.get(kind)
                    if prof is not None:
                        prof.enable()
                    t = _publish(clients[kind], stream_id, large, n_large)
                    if prof is not None:
                        prof.disable()
                    best[kind] = min(best[kind], t)
            for kind in KINDS:
                t = best[kind]
                result[f"record_64k_msgs_per_s_{kind}"] = round(n_large / t)
                result[f"record_64k_mb_per_s_{kind}"] = round(n_large * 65536 / t / 1e6, 1)
            result["record_64k_sealed_to_plain"] = round(best["plain"] / best["sealed"], 2)
            for kind, client in clients.items():
                t, nbytes = _replay(client, base[kind] + 1)
                result[f"replay_udp_100b_msgs_per_s_{kind}"] = round(n_small / t)
                result[f"replay_udp_100b_mb_per_s_{kind}"] = round(nbytes / t / 1e6, 1)
            for kind, prof in profiles.items():
                result[f"profile_64k_{kind}"] = _top(prof)
        finally:
            for client in clients.values():
                client.close()
        port = endpoint.rpartition(":")[2]
        ipc_settings = ClientSettings(endpoint=f"ipc:{port}", encryption=False, timeout_s=60)
        with StreamClient.connect(ipc_settings) as client:  # a session over shared memory
            t, nbytes = _replay(client, 1)
            result["replay_ipc_100b_msgs_per_s"] = round(n_small / t)
            result["replay_ipc_100b_mb_per_s"] = round(nbytes / t / 1e6, 1)
    result["load_average_end"] = [round(x, 1) for x in os.getloadavg()]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument(
        "--rounds", type=int, default=2, help="64 KiB rounds, sealed and plain in turns"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the 64 KiB publishes")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    started = time.monotonic()
    result = run(args.scale, args.rounds, args.profile)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
