"""Attacks on an idle session's spaced-out control traffic (fifteenth session: its heartbeats 2 s
apart, its status messages 1 s, both on a 20 ms grid, the server's per-session checks on the
grid too): a client process that is alive but was paused (a stop-the-world pause, ``SIGSTOP``)
for 2 s, idle before and after, on a server with a short lease (``--session-lease-seconds 5``)
keeps its sessions: its last sign before the pause came at most a second before it (the status
messages), so no lease and no 5 s connection timeout runs out; no session is closed, expired or
reopened. (A pause longer than the lease less a second loses them, as README says: a frozen
client loses its sessions a lease after its last sign.)"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.transport.testing import ready_process

# a client process holding 4 idle sessions; a line on stdin makes each publish once more and
# print its reconnect count; it holds them until a second line (its exit closes them: the
# server's last look must come first)
_CLIENT = """
import sys
from aeron_spark.connector.client import ClientSettings, StreamClient
settings = ClientSettings(endpoint=sys.argv[1], encryption=False, timeout_s=60)
clients = [StreamClient.connect(settings) for _ in range(4)]
for c in clients:
    c.publish(10, [b"first"])
print("ready", flush=True)
sys.stdin.readline()
for c in clients:
    c.publish(10, [b"after"])
print("reconnects", sum(c.reconnects for c in clients), flush=True)
sys.stdin.readline()
"""


def test_idle_sessions_of_a_client_paused_2_s_survive_a_5_s_lease(tmp_path: Path) -> None:
    with server_process(str(tmp_path / "srv"), ["--session-lease-seconds", "5"]) as (
        _proc,
        endpoint,
    ):
        with ready_process([sys.executable, "-c", _CLIENT, endpoint]) as client:
            assert client.stdout is not None and client.stdin is not None
            with client_for(endpoint) as observer:
                first = observer.stats()
                before = first["counters"]
                time.sleep(12.0)  # idle: nothing but the transport's signs, past the lease
                client.send_signal(signal.SIGSTOP)
                time.sleep(2.0)
                client.send_signal(signal.SIGCONT)
                time.sleep(2.0)
                client.stdin.write("go\n")
                client.stdin.flush()
                assert client.stdout.readline().strip() == "reconnects 0"
                last = observer.stats()
                after = last["counters"]
                # only now may the client go: it exited right after printing, closing its
                # sessions, and a server that saw that at once (its reply publications' lost
                # signal) closed them before this look (s20's lost-receiver change: "failed
                # 2 of 2", read as live sessions closed; its listener saw nothing during the
                # pause, the four end-of-stream status messages of the client's exit after it)
                client.stdin.write("done\n")
                client.stdin.flush()
            # The client's own four sessions (those publishing stream 10: the observer
            # publishes nothing) are the ones it opened first, none closed, expired or
            # reopened: each is older than the 16 s slept between the two looks less 2 s (one
            # reopened would be as old as the last look's wait at most). (A global
            # count of closed sessions also counted any other session's end, such as an
            # orphan of a retried handshake, and once failed so.)
            mine = [s for s in first["sessions"] if 10 in s["publishing"]]
            still = [s for s in last["sessions"] if 10 in s["publishing"]]
            assert len(mine) == len(still) == 4, (first["sessions"], last["sessions"])
            ages = sorted(s["age_s"] for s in still)
            assert ages[0] >= 14.0, (ages, last["sessions"])
            assert after["session_leases_renewed_by_transport"] > before.get(
                "session_leases_renewed_by_transport", 0
            )
