"""Handshake benchmark over UDP loopback; prints one JSON object.

    python -m benchmarks.handshake [--connects N] [--seconds S] [--messages-mb MB] [--auth-keys N]

A child process runs three handshake servers: one with the default configuration (sealed, 1 MiB
session terms) for the connect figures, and a sealed and a plain one with 8 MiB session terms that
count what they receive and answer a final message with the byte count. This process is the
client:

* ``connect_p50_ms`` / ``connect_p99_ms``: ``--connects`` sequential connect+close cycles (HELLO,
  WELCOME, private pair, DONE, CONFIRM), timed from the call to the returned connection.
* ``first_connect_ms``: the first connect of this process to the server (a host the server has
  not seen: its first SETUP request for the replies comes before its HELLO makes it allowed).
* ``handshakes_per_s``: ``--threads`` client threads connecting and closing for ``--seconds``;
  completed handshakes / elapsed.
* ``auth_*``: the same two figures against a fourth server that takes only listed client keys
  (an authorized keys file of ``--auth-keys`` keys, the client's among them, loaded with the
  stream server's parser), measured in the same run, alternating with the open server
  (``--rounds`` each, medians), and ``auth_to_open_*`` ratios. Every handshake (protocol
  version 3) proves the client's key; the open server just does not check it against a list.
* ``cpu_ms_per_handshake_open`` / ``_auth``: CPU time of one whole handshake, client and server
  machines in memory (no transport), so it does not depend on the machine's load.
* ``process_cpu_ms_per_handshake_open`` / ``_auth``: CPU time both processes (every thread:
  the client's and the servers' drivers too) used per handshake during the rate runs (median
  of the rounds). ``cpus * 1000 / this`` bounds the handshakes a second the machine can do
  however little the connect waits.
* ``encrypted_<size>_mb_per_s`` / ``plain_<size>_mb_per_s`` and ``encrypted_to_plain_<size>_ratio``
  for 1 KiB and 64 KiB messages: one connection sends ``--messages-mb`` MB; the rate is bytes
  acknowledged by the server / elapsed. Sealed and plain runs alternate (``--rounds`` each) so both
  see the same machine; the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from aeron_spark.handshake import Client, ClientConfig, Connection, Server, ServerConfig
from aeron_spark.handshake.crypto import public_bytes
from aeron_spark.handshake.keystore import KeyStore
from benchmarks._proc import cpu_s


def _say(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


# ---------------------------------------------------------------------------- child: servers


def serve(key_dir: str, keys_file: str) -> None:
    from aeron_spark.connector.server.authz import Authorizer

    authz = Authorizer(keys_file)
    received: dict[int, int] = {}

    def on_message(conn: Connection, message: bytes) -> None:
        if message[:4] == b"END?":
            conn.send(str(received.pop(id(conn), 0)).encode())
        else:
            received[id(conn)] = received.get(id(conn), 0) + len(message)

    big = dict(session_term_length=8 * 1024 * 1024, max_per_address=1024, max_pending=1024)
    sealed = Server(
        ServerConfig(key_store_dir=key_dir, encryption=True, **big), on_message=on_message
    ).start()
    plain = Server(
        # loopback is a trusted network here: without allow_plain_udp the session is sealed
        ServerConfig(key_store_dir=key_dir, encryption=False, allow_plain_udp=True, **big),
        on_message=on_message,
    ).start()
    defaults = Server(ServerConfig(key_store_dir=key_dir, max_per_address=1024)).start()
    auth = Server(
        ServerConfig(key_store_dir=key_dir, max_per_address=1024), authorize=authz.knows
    ).start()
    _say(
        sealed=sealed.endpoint,
        plain=plain.endpoint,
        defaults=defaults.endpoint,
        auth=auth.endpoint,
        authorized_keys=len(authz.table),
    )
    sys.stdin.readline()  # until the parent closes our stdin
    for server in (sealed, plain, defaults, auth):
        server.close()


# ---------------------------------------------------------------------------- parent: clients


def _connect_latencies(client: Client, endpoint: str, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        conn = client.connect(endpoint)
        out.append(time.perf_counter() - t0)
        conn.close()
    return out


def _handshake_rate(
    client: Client, endpoint: str, threads: int, seconds: float, server_pid: int
) -> tuple[float, float]:
    """Handshakes a second, and the CPU milliseconds both processes (this client and the
    servers' child, every thread) spent per handshake meanwhile."""
    cpu0 = time.process_time() + cpu_s(server_pid)
    done = [0] * threads
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        while time.monotonic() < stop:
            client.connect(endpoint).close()
            done[i] += 1

    t0 = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - t0
    cpu = time.process_time() + cpu_s(server_pid) - cpu0
    return sum(done) / elapsed, cpu / max(sum(done), 1) * 1000


def _cpu_per_handshake(authorize: bool, count: int = 500) -> float:
    """CPU milliseconds of one whole handshake, both sides, in memory (sans-I/O machines):
    what the key agreement and admission cost without the transport or the machine's load."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from aeron_spark.handshake.machine import ClientHandshake, Rejected, ServerCore

    identity = X25519PrivateKey.generate()
    listed = {public_bytes(identity)}
    config = ServerConfig(
        max_pending=count + 1,
        max_clients=count + 1,
        max_per_address=count + 1,
        hellos_per_prefix_per_s=1e9,
    )
    core = ServerCore(
        config, X25519PrivateKey.generate(), authorize=listed.__contains__ if authorize else None
    )
    t0 = time.process_time()
    for _ in range(count):
        client = ClientHandshake(lambda key: None, static_key=identity)
        client.start(0)
        try:
            core.on_hello("10.0.0.1", client.hello(), 0, source="10.0.0.1:1")
        except Rejected as cookie:
            client.on_reply(cookie.reply or b"")
        assert client.retry_hello is not None
        session = core.on_hello("10.0.0.1", client.retry_hello, 0, source="10.0.0.1:1")
        client.on_reply(session.welcome)
        client.on_confirm(core.on_done(session, client.done()))
        core.release(session)
    return (time.process_time() - t0) / count * 1000


def _throughput(conn: Connection, size: int, total_bytes: int) -> float:
    payload = os.urandom(size)
    count = max(total_bytes // size, 1)
    t0 = time.perf_counter()
    for _ in range(count):
        conn.send(payload, timeout_s=30.0)
    conn.send(b"END?", timeout_s=30.0)
    reply = conn.receive(60.0)
    elapsed = time.perf_counter() - t0
    if reply is None or int(reply) != count * size:
        raise RuntimeError(f"server acknowledged {reply!r}, expected {count * size}")
    return count * size / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=int, default=300)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages-mb", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--auth-keys", type=int, default=1000)
    parser.add_argument(
        "--serve", nargs=2, metavar=("KEY_DIR", "KEYS_FILE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        keys_file = os.path.join(tmp, "authorized_keys")
        mine = public_bytes(KeyStore(os.path.join(tmp, "cli")).client_private_key())
        with open(keys_file, "w") as fh:
            for i in range(args.auth_keys - 1):
                fh.write(f"{os.urandom(32).hex()} other{i} read=*\n")
            fh.write(f"{mine.hex()} bench read=* write=*\n")
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.handshake",
                "--serve",
                os.path.join(tmp, "srv"),
                keys_file,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            endpoints = json.loads(child.stdout.readline())
            client = Client(ClientConfig(key_store_dir=os.path.join(tmp, "cli")))
            plain_client = Client(
                ClientConfig(key_store_dir=os.path.join(tmp, "cli"), encryption=False)
            )
            t0 = time.perf_counter()
            client.connect(endpoints["defaults"]).close()  # warm up both drivers
            first_connect_ms = (time.perf_counter() - t0) * 1000
            client.connect(endpoints["auth"]).close()
            figures: dict[str, dict[str, list[float]]] = {
                "open": {"rate": [], "p50": [], "p99": [], "cpu": []},
                "auth": {"rate": [], "p50": [], "p99": [], "cpu": []},
            }
            per_round = max(args.connects // args.rounds, 1)
            for _ in range(args.rounds):
                for kind in ("open", "auth"):
                    endpoint = endpoints["defaults" if kind == "open" else "auth"]
                    lat = sorted(_connect_latencies(client, endpoint, per_round))
                    figures[kind]["p50"].append(lat[len(lat) // 2] * 1000)
                    figures[kind]["p99"].append(lat[max(int(len(lat) * 0.99) - 1, 0)] * 1000)
                    rate, cpu_ms = _handshake_rate(
                        client, endpoint, args.threads, args.seconds / args.rounds, child.pid
                    )
                    figures[kind]["rate"].append(rate)
                    figures[kind]["cpu"].append(cpu_ms)
            med = {k: {f: statistics.median(v) for f, v in d.items()} for k, d in figures.items()}
            result: dict[str, Any] = {
                "handshakes_per_s": round(med["open"]["rate"], 1),
                "connect_p50_ms": round(med["open"]["p50"], 3),
                "connect_p99_ms": round(med["open"]["p99"], 3),
                "auth_handshakes_per_s": round(med["auth"]["rate"], 1),
                "auth_connect_p50_ms": round(med["auth"]["p50"], 3),
                "auth_connect_p99_ms": round(med["auth"]["p99"], 3),
                "auth_to_open_handshakes_ratio": round(
                    med["auth"]["rate"] / med["open"]["rate"], 3
                ),
                "auth_to_open_p50_ratio": round(med["auth"]["p50"] / med["open"]["p50"], 3),
                "authorized_keys": endpoints["authorized_keys"],
                "process_cpu_ms_per_handshake_open": round(med["open"]["cpu"], 2),
                "process_cpu_ms_per_handshake_auth": round(med["auth"]["cpu"], 2),
                "cpu_ms_per_handshake_open": round(_cpu_per_handshake(False), 3),
                "cpu_ms_per_handshake_auth": round(_cpu_per_handshake(True), 3),
                "first_connect_ms": round(first_connect_ms, 3),
                "connects_timed": per_round * args.rounds,
                "handshake_threads": args.threads,
            }
            sealed = client.connect(endpoints["sealed"])
            plain = plain_client.connect(endpoints["plain"])
            assert sealed.encrypted and not plain.encrypted
            for name, size in (("1k", 1024), ("64k", 65536)):
                total = int(args.messages_mb * 1e6 / (8 if size == 1024 else 1))
                runs: dict[str, list[float]] = {"encrypted": [], "plain": []}
                for _ in range(args.rounds):
                    runs["plain"].append(_throughput(plain, size, total))
                    runs["encrypted"].append(_throughput(sealed, size, total))
                enc, pln = statistics.median(runs["encrypted"]), statistics.median(runs["plain"])
                result[f"encrypted_{name}_mb_per_s"] = round(enc, 1)
                result[f"plain_{name}_mb_per_s"] = round(pln, 1)
                result[f"encrypted_to_plain_{name}_ratio"] = round(enc / pln, 3)
            sealed.close()
            plain.close()
            result["load_average_at_start"] = load
            result["cpus"] = os.cpu_count()
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
