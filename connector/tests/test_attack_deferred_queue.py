"""Attack on "what one client may cost others" (README "Security model", threat table: any client
with a session "send requests up to its operation's limits"): the server runs ``commit``,
``abort``, ``scan`` and ``consumer_commit`` on one commit worker (``connector/server/server.py``
``StreamServer._defer``: a one-thread ``ThreadPoolExecutor``, first in first out, its queue
unbounded). A session's deferred requests are not answered before the next is read
(``ServerCore.on_message`` returns no reply for them, so ``_serve_sessions`` goes on reading), so
a client allowed only to read one stream pipelines as many ``scan`` requests of a whole recording
as it likes (about 60 bytes each, no reply read), and every other client's sink ``commit`` waits
behind all of them.

A queued request is held decoded (its permission is checked only when the worker runs it),
so the same pipelining holds memory without bound: a ``consumer_commit`` of 65,536 positions is
197 KB on the wire and about 5 MB decoded.

Measured (``python -m pytest --runxfail -s connector/tests/test_attack_deferred_queue.py``,
lines ``deferred flood`` and ``deferred memory``, load average 17-18 on the shared 2-core
machine): 150 scans of 43 bytes (6.5 KB) queued by a reader held a writer's commit for 15.8 s
(one scan alone: 0.13 s), all 150 answered before it; 300 scans then 100 such commits (19.7 MB
sent) took the server from 61 to 433 MiB peak, growing with what is sent.

Fixed in ``requests.py``: a session has at most ``MAX_DEFERRED_PER_SESSION`` (4) deferred
requests queued or running; one more is refused at once with ``LIMIT_EXCEEDED`` on its request id
(``deferred_requests_refused``), so a reader's pipelined scans put at most 4 ahead of another
client's commit and hold at most 4 decoded requests. After the fix (same command, load average
0.2-0.6): the writer's commit took 0.01 s with 4 of the reader's scans answered before it; the
memory attack peaked at 106 MiB from 64 MiB.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ErrorCode
from aeron_spark.connector.server.testing import server_process
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto
from aeron_spark.handshake.keystore import client_public_key_hex

TIMEOUT_S = 120.0
SCANS = 150
# 8 MiB of equal 64-byte frames: the scan's fast (vectorised) path, a few tens of ms a scan
ROWS = [b"r" * 32] * 131_072


def _client(endpoint: str, key_store: str) -> StreamClient:
    return StreamClient.connect(
        ClientSettings(
            endpoint=endpoint, encryption=False, key_store_dir=key_store, timeout_s=TIMEOUT_S
        )
    )


def _drain(client: StreamClient, wait_s: float = 0.0) -> list[proto.Reply]:
    """The replies that have reached the client's raw session (waiting up to ``wait_s``)."""
    replies = []
    deadline = time.monotonic() + wait_s
    while True:
        message = client._link.receive(deadline)
        if message is None:
            return replies
        if message[0] == proto.KIND_CONTROL:
            replies.append(proto.decode_reply(message))


def test_attack_a_readers_pipelined_scans_do_not_hold_back_another_clients_commit(
    tmp_path: Path,
) -> None:
    reader, writer = str(tmp_path / "keys-reader"), str(tmp_path / "keys-writer")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{client_public_key_hex(reader)} reader read=10\n"
        f"{client_public_key_hex(writer)} writer read=* write=*\n"
    )
    options = ["--authorized-keys", str(keys), "--key-store", str(tmp_path / "server-keys")]
    with server_process(str(tmp_path / "srv"), options) as (_proc, endpoint):
        with _client(endpoint, writer) as w, _client(endpoint, reader) as r:
            w.publish(10, ROWS)
            rec = w.list_recordings([10])[0].recording_id

            sink = "honest@0123456789abcdef"
            staged = w.stage(sink, 0, 0, 0, 11, [b"honest"], local=False)
            started = time.monotonic()
            w.scan(rec, 0)  # one scan alone: what a scan costs the worker now
            one_scan_s = time.monotonic() - started

            scan = {"recording_id": rec, "start": 0}
            for n in range(SCANS):  # pipelined, no reply read
                r._link.send(proto.encode_request(1000 + n, "scan", scan), time.monotonic() + 30)
            time.sleep(0.5)  # the server has read them (64 per pass)
            started = time.monotonic()
            w.commit(sink, 0, 11, [staged])
            commit_s = time.monotonic() - started
            first = _drain(r)
            later = _drain(r, 0.2)
            before = [x for x in first if x.ok]
            rest = [x for x in later if x.ok]
            refused = [x for x in first + later if not x.ok]
            print(
                "deferred flood",
                json.dumps(
                    {
                        "scans_queued": SCANS,
                        "request_bytes": len(proto.encode_request(1000, "scan", scan)),
                        "one_scan_s": round(one_scan_s, 3),
                        "honest_commit_s": round(commit_s, 2),
                        "reader_scans_answered_before_it": len(before),
                        "answered_soon_after": len(rest),
                        "load_average": os.getloadavg(),
                    }
                ),
            )
            # one session's queued requests may delay another's by a few, not by all of them
            assert len(before) <= 8, (len(before), commit_s)
            # the others were refused at once, coded, on their own request ids
            assert refused, (len(before), len(rest))
            limit = int(ErrorCode.LIMIT_EXCEEDED)
            assert all(x.error["code"] == limit and x.id >= 1000 for x in refused), refused[0]


def _memory_mib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) // 1024
    return out


def test_attack_a_readers_queued_requests_hold_bounded_memory(tmp_path: Path) -> None:
    reader, writer = str(tmp_path / "keys-reader"), str(tmp_path / "keys-writer")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{client_public_key_hex(reader)} reader read=10\n"
        f"{client_public_key_hex(writer)} writer read=* write=*\n"
    )
    options = ["--authorized-keys", str(keys), "--key-store", str(tmp_path / "server-keys")]
    with server_process(str(tmp_path / "srv"), options) as (proc, endpoint):
        with _client(endpoint, writer) as w, _client(endpoint, reader) as r:
            w.publish(10, ROWS)
            rec = w.list_recordings([10])[0].recording_id
            before = _memory_mib(proc.pid)
            scan = proto.encode_request(1, "scan", {"recording_id": rec, "start": 0})
            for _ in range(2 * SCANS):  # the worker is busy for a while (legitimate scans)
                r._link.send(scan, time.monotonic() + 30)
            # 65,536 positions of the reader's own recording: 197 KB, about 5 MB decoded
            commit = proto.encode_request(
                2,
                "consumer_commit",
                {"consumer_id": "c", "stream_ids": [10], "positions": [[rec, 0]] * 65536},
            )
            sent = 0
            for n in range(100):
                for piece in chunking.split(commit, r.max_message_length, n + 1):
                    r._link.send(piece, time.monotonic() + 60)
                sent += len(commit)
            time.sleep(3.0)  # the server reads what was sent
            after = _memory_mib(proc.pid)
            print(
                "deferred memory",
                json.dumps(
                    {
                        "sent_mb": round(sent / 1e6, 1),
                        "before_mib": before,
                        "after_mib": after,
                        "load_average": os.getloadavg(),
                    }
                ),
            )
            assert after["VmHWM"] - before["VmHWM"] <= 128, (before, after, sent)
