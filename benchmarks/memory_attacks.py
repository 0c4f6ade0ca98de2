"""What one client can make a stream server hold, and what it costs the others; one JSON object.

    python -m benchmarks.memory_attacks [--seconds S]

A stream server runs in a child process (``connector.server.testing.server_process``). Three
attacks, one after the other, each on a fresh server (issue 28, items 2 and 4):

``headers``        six sessions each send one 92-byte CHUNK header announcing 256 MiB;
``list_streams``   an attacker process sends 9.5 MiB list_streams requests of empty maps, one
                   after the other, for ``--seconds``;
``publish``        the same with 7.5 MiB publish requests whose payloads are 120 lists of 65,536
                   empty maps (the largest list a publish may carry, past its items budget).

For each: the server's resident memory before (``rss_before_mib``) and its peak after
(``hwm_mib``, ``VmHWM``); for the request attacks also an honest client's ``list_streams``
latency meanwhile (p50 / p99 / max ms, calls made) and the bombs the attacker got answered.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from typing import Any

import msgpack

from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto

MIB = 1024 * 1024


def _memory_mib(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) / 1024
    return out


def _send(client: Any, message: bytes) -> None:
    limit, link = client.max_message_length, client._link
    chunks = [message] if len(message) <= limit else chunking.split(message, limit, 7)
    for chunk in chunks:
        link.send(chunk, time.monotonic() + 60)


def _reply(client: Any, request_id: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        message = client._link.receive(deadline)
        if message is None:
            raise TimeoutError(f"no reply to {request_id}")
        if message[0] == proto.KIND_CONTROL and proto.decode_reply(message).id == request_id:
            return


def _bomb(op: str) -> bytes:
    args = (
        {"x": [{}] * 9_500_000}
        if op == "list_streams"
        else {"stream_id": 10, "payloads": [[{}] * (1 << 16)] * 120}
    )
    return bytes((proto.KIND_CONTROL,)) + msgpack.packb(
        {"id": 7, "op": op, "args": args}, use_bin_type=True
    )


def _attack(endpoint: str, op: str, stop: Any, sent: Any) -> None:
    bomb = _bomb(op)
    with client_for(endpoint, timeout_s=60) as attacker:
        while not stop.is_set():
            _send(attacker, bomb)
            _reply(attacker, 7)
            sent.value += 1


def run(mode: str, seconds: float) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as d,
        server_process(os.path.join(d, "srv")) as (proc, endpoint),
        client_for(endpoint, timeout_s=60) as honest,
    ):
        honest.publish(10, [b"x"] * 10)
        out: dict[str, Any] = {"rss_before_mib": _memory_mib(proc.pid)["VmRSS"]}
        if mode == "headers":
            header = chunking.CHUNK_HEADER.pack(chunking.KIND_CHUNK, 1, 0, 1 << 20, 256 * MIB)
            attackers = [client_for(endpoint, timeout_s=60) for _ in range(6)]
            try:
                for c in attackers:
                    _send(c, header + b"\x00" * 64)
                    _send(c, proto.encode_request(2, "keepalive", {}))
                    _reply(c, 2)
            finally:
                for c in attackers:
                    c.close()
        else:
            ctx = multiprocessing.get_context("spawn")
            stop, sent = ctx.Event(), ctx.Value("i", 0)
            attacker = ctx.Process(target=_attack, args=(endpoint, mode, stop, sent))
            attacker.start()
            try:
                while not sent.value and attacker.is_alive():
                    time.sleep(0.05)
                latencies = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    start = time.perf_counter()
                    honest.list_streams()
                    latencies.append(time.perf_counter() - start)
                    time.sleep(0.01)
            finally:
                stop.set()
                attacker.join(120)
            latencies.sort()
            out.update(
                bombs=sent.value,
                list_streams_calls=len(latencies),
                list_streams_p50_ms=round(1000 * statistics.median(latencies), 1),
                list_streams_p99_ms=round(1000 * latencies[int(len(latencies) * 0.99)], 1),
                list_streams_max_ms=round(1000 * latencies[-1], 1),
            )
        out["hwm_mib"] = _memory_mib(proc.pid)["VmHWM"]
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    modes = ("headers", "list_streams", "publish")
    result: dict[str, Any] = {mode: run(mode, args.seconds) for mode in modes}
    result["load_average"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
