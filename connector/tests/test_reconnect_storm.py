"""A reconnect storm: a client process holding 128 sessions is paused (``SIGSTOP``: a long GC
pause, a profiler, a stopped executor) for longer than the server's lease, so the server expires
every one of them; when it goes on, its 128 threads each publish again at once. Every session
must publish again within the bound (each replaced by a new one), without a refusal reaching the
caller: handshakes past the server's pending limit per /24 (``max_pending_per_prefix``, 32) are
refused for the moment (``TOO_MANY_PENDING``) and retried with backoff and jitter, not raised
(they were refused as ``TOO_MANY_FROM_ADDRESS``, which the client took as final). The client's
identity key is read from the key store once per process, not under the store's lock on every
connect. Of the publishes the server acknowledged, none is lost or recorded twice (a publish in
flight when the session went may or may not be recorded: the caller is told, and it appears at
most once)."""

from __future__ import annotations

import json
import select
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from aeron_spark.connector.formats import Geometry, iter_messages
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport.testing import ready_process

SESSIONS = 128
# the child: opens the sessions (each publishes once), says ready, waits for a line, then one
# thread per session publishes once more, trying again only when the session was lost under
# the publish (the caller is told, as ServerUnavailableError caused by SessionLostError); any
# other error is a failure. It prints what was acknowledged, what failed, and its key reads.
_CLIENT = """
import json, sys, threading, time
from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import SessionLostError
from aeron_spark.handshake import keystore
n = int(sys.argv[3])
settings = ClientSettings(endpoint=sys.argv[1], encryption=True, key_store_dir=sys.argv[2],
                          timeout_s=60)
clients = [StreamClient.connect(settings) for _ in range(n)]
acked, maybe, failed = [], [], []
for i, c in enumerate(clients):
    c.publish(1 + i % 4, [f"s{i}-0".encode()])
    acked.append(f"s{i}-0")
reads = getattr(keystore, "private_key_reads", lambda: None)
print("ready", flush=True)
sys.stdin.readline()
reads0 = reads()
lock = threading.Lock()
took = [0.0] * n
t0 = time.monotonic()
def publish(i):
    for attempt in range(20):
        payload = f"s{i}-1-{attempt}"
        try:
            clients[i].publish(1 + i % 4, [payload.encode()])
        except Exception as exc:
            with lock:
                if isinstance(exc.__cause__, SessionLostError):
                    maybe.append(payload)  # in flight when the session went
                    continue
                failed.append(f"{type(exc).__name__}: {exc}"[:200])
                return
        with lock:
            acked.append(payload)
        took[i] = time.monotonic() - t0
        return
threads = [threading.Thread(target=publish, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({
    "acked": acked, "maybe": maybe, "failed": failed,
    "all_published_s": max(took), "reconnects": sum(c.reconnects for c in clients),
    "key_reads": None if reads0 is None else reads() - reads0,
}), flush=True)
for c in clients:
    c.close()
"""


def _line(stream, timeout_s: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, f"no answer from the client process within {timeout_s} s"
    return stream.readline()


def test_a_client_paused_past_the_lease_gets_all_128_sessions_back(tmp_path: Path) -> None:
    with server_process(str(tmp_path / "srv"), ["--session-lease-seconds", "5"]) as (
        _proc,
        endpoint,
    ):
        argv = [sys.executable, "-c", _CLIENT, endpoint, str(tmp_path / "keys"), str(SESSIONS)]
        with ready_process(argv) as client:
            assert client.stdout is not None and client.stdin is not None
            with client_for(endpoint) as observer:
                before = observer.stats()["counters"]
                client.send_signal(signal.SIGSTOP)

                # past the 5 s lease: the server expires every session of the paused process
                # (closed when its transport timed out, or expired when the lease ran out)
                def ended(counters: dict) -> int:
                    return counters["sessions_expired"] + counters["sessions_closed"]

                deadline = time.monotonic() + 30.0
                while (now := ended(observer.stats()["counters"])) < ended(before) + SESSIONS:
                    assert time.monotonic() < deadline, ("sessions not ended", now, ended(before))
                    time.sleep(0.5)
                client.send_signal(signal.SIGCONT)
                client.stdin.write("go\n")
                client.stdin.flush()
                out = json.loads(_line(client.stdout, 120.0))
                assert out["failed"] == [], out["failed"][:5]
                # each session published again well within its timeout (on a new session where
                # the server had ended its old one)
                assert out["all_published_s"] < 60.0, out["all_published_s"]
                assert out["reconnects"] > 0
                # the client's key: read once per process (and not again after the pause)
                assert out["key_reads"] is not None and out["key_reads"] <= 1, out["key_reads"]
                counters = observer.stats()["counters"]
                # what it published, read back from the recordings of its streams
                seen: Counter[str] = Counter()
                for rec in observer.list_recordings(stream_ids=[1, 2, 3, 4]):
                    blocks = observer.replay(
                        rec.recording_id, rec.start_position, rec.recorded_position
                    )
                    geometry = Geometry(rec.initial_term_id, rec.term_length)
                    seen.update(bytes(m.payload).decode() for m in iter_messages(blocks, geometry))
    acked = out["acked"]
    assert len(acked) == 2 * SESSIONS and len(set(acked)) == len(acked)
    assert {p: seen[p] for p in acked if seen[p] != 1} == {}  # acknowledged: exactly once
    assert {p: seen[p] for p in out["maybe"] if seen[p] > 1} == {}  # in flight: at most once
    assert set(seen) <= set(acked) | set(out["maybe"])
    # the server opened (at least) the sessions the client says it opened again
    assert counters["sessions_opened"] >= before["sessions_opened"] + out["reconnects"]
