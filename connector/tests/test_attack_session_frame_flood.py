"""A hostile, authorised client floods its session with frames that are no request (PONGs
nobody asked for, without end) while another client publishes: the server keeps serving the
other, holds none of the flood, and counts it (``pongs_unsolicited``). Its loop reads a session
at most 8 polls of frames that complete no message a pass (``handshake/connection.py``
``MAX_POLLS_PER_RECEIVE``), the rest in the next pass. Real UDP on 127.0.0.1, a server process.
"""

from __future__ import annotations

import threading
from pathlib import Path

from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.handshake.connection import _PONG


def test_attack_a_frame_flood_holds_nothing_and_others_are_served(tmp_path: Path) -> None:
    stop = threading.Event()
    sent = [0]
    with server_process(str(tmp_path / "srv")) as (proc, endpoint):
        with client_for(endpoint) as hostile, client_for(endpoint) as honest:
            conn = hostile._link.connection

            def flood() -> None:
                while not stop.is_set():
                    if conn._offer(_PONG, b"x" * 512):  # no ping asked for it
                        sent[0] += 1
                    else:
                        stop.wait(0.0005)

            thread = threading.Thread(target=flood, daemon=True)
            thread.start()
            try:
                for i in range(100):  # while the flood goes on
                    honest.publish(7, [b"m%d" % i])
            finally:
                stop.set()
                thread.join(30)
            stats = honest.stats()
        assert proc.poll() is None
    dropped = stats["handshake"]["pongs_unsolicited"]
    print(f"flood sent {sent[0]} PONGs, server dropped {dropped}")
    assert sent[0] > 0 and 0 < dropped <= sent[0]
