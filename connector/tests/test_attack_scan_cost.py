"""Attack on "what one client may cost others" (README "Security model": a client with read
permission sends requests "up to its operation's limits", each costing what a legitimate request
of its size does): one ``scan`` request (43 bytes) of a recording whose messages do not all have
the same length costs the server time quadratic in the messages of each 4 MiB block it reads.

Cause: ``connector/server/scan.py`` ``_uniform_run`` is asked at every whole unfragmented
message how many equal frames follow, and answers by comparing *every* remaining frame of the
block (``np.frombuffer`` over ``(len(frames) - offset) // aligned`` rows, then ``ok.all()`` /
``argmin``) even when the very next frame differs. With messages of alternating lengths each
call walks the rest of the block and takes one message: 2,000 / 4,000 / 8,000 / 16,000 messages
took 0.45 / 1.1 / 3.0 / 12.8 s in ``scan`` (uniform ones: 1-9 ms; load average 17, the shared
2-core machine), and a 4 MiB block of such frames minutes: this test's 174,000 messages
(8.4 MB) got no answer within 60 s (load average 10); 5.6 s with the fix proposed below.
Scans run on the commit worker that every client's sink ``commit``, ``abort``,
``consumer_commit`` and retention share, so a reader stalls them all; an honest source whose
rows vary in length (JSON) pays it at each micro-batch.

Fixed in ``transport/protocol/frames.py`` ``uniform_run`` (which scans, readers and recorders
share): windows that double (16, 32, 64 ... frames) stop at the first mismatch, so a run costs
O(its length), not O(the block); ``transport/tests/test_frame_walks.py`` counts the frames read.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.server.testing import server_process
from aeron_spark.handshake.keystore import client_public_key_hex

# alternating lengths (32- and 64-byte frames): legitimate data, no run of equal messages; two
# 4 MiB blocks of 87,000 frames each (the cost is quadratic in the frames of a block)
ROWS = [b"r" * 20 if i % 2 else b"" for i in range(174_000)]


def _client(endpoint: str, key_store: str, timeout_s: float) -> StreamClient:
    return StreamClient.connect(
        ClientSettings(
            endpoint=endpoint, encryption=False, key_store_dir=key_store, timeout_s=timeout_s
        )
    )


def test_attack_one_scan_of_varied_messages_costs_linear_time(tmp_path: Path) -> None:
    reader, writer = str(tmp_path / "keys-reader"), str(tmp_path / "keys-writer")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{client_public_key_hex(reader)} reader read=10\n"
        f"{client_public_key_hex(writer)} writer read=* write=*\n"
    )
    options = ["--authorized-keys", str(keys), "--key-store", str(tmp_path / "server-keys")]
    with server_process(str(tmp_path / "srv"), options) as (_proc, endpoint):
        with _client(endpoint, writer, 120.0) as w:
            end = w.publish(10, ROWS)
            rec = w.list_recordings([10])[0].recording_id
        # the bound is the client's own timeout (a bounded wait, not a timing): a linear scan
        # of these 8.4 MB takes seconds; the quadratic one many minutes
        with _client(endpoint, reader, 60.0) as r:
            started = time.monotonic()
            result = r.scan(rec, 0)
            print(
                "scan of varied messages",
                json.dumps(
                    {
                        "messages": len(ROWS),
                        "bytes": end,
                        "scan_s": round(time.monotonic() - started, 3),
                        "load_average": os.getloadavg(),
                    }
                ),
            )
            assert result.messages == len(ROWS) and result.end == end, result
