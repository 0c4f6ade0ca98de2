"""What strangers send a real stream server and it refuses shows in ``aeron-spark stat``
(issue 22): a session-0 status message to port + 1, SETUPs on the HELLO stream asking for a
1 GiB term, and more new HELLO streams from one /24 than ``--hellos-per-prefix-per-s`` allows,
all from forged source addresses (raw IPv4 sockets, root)."""

from __future__ import annotations

import io
import json
import time

import pytest

from aeron_spark.connector.server import stat_main
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID
from aeron_spark.transport.protocol.frames import SetupFrame, SmFlags, StatusMessage
from aeron_spark.transport.testing import Spoofer, spoof_unavailable

pytestmark = pytest.mark.skipif(spoof_unavailable() is not None, reason=str(spoof_unavailable()))


def _stat(endpoint: str, *flags: str) -> str:
    out = io.StringIO()
    assert stat_main(["--endpoint", endpoint, "--once", "--no-encryption", *flags], out=out) == 0
    return out.getvalue()


def test_stat_shows_what_the_server_refused_from_strangers(tmp_path) -> None:
    directory = str(tmp_path / "srv")
    with server_process(directory, ["--hellos-per-prefix-per-s", "20"]) as (proc, endpoint):
        host, port = endpoint.rsplit(":", 1)
        server, control = (host, int(port)), (host, int(port) + 1)
        spoofer = Spoofer()
        try:
            with client_for(endpoint) as client:  # a session whose publication a spy wants
                client.publish(10, [b"x"] * 10)
                sm = StatusMessage(0, 0, 0, 0, 1 << 20, 99, flags=SmFlags.SEND_SETUP).encode()
                for i in range(5):
                    spoofer.send(("127.0.6.9", 7000 + i), control, sm)
                for i in range(7):
                    big = SetupFrame(0, 0x5A000000 + i, HANDSHAKE_STREAM_ID, 1, 1, 1 << 30, 1408)
                    spoofer.send((f"127.0.7.{i + 1}", 7000), server, big.encode())
                # 60 new HELLO streams from one /24 (20 a second allowed; every stat below is a
                # session of its own from 127.0.0.1, another /24, at 2 a second)
                for i in range(60):
                    small = SetupFrame(0, 0x5B000000 + i, HANDSHAKE_STREAM_ID, 1, 1, 65536, 1408)
                    spoofer.send((f"127.0.8.{i + 1}", 7000), server, small.encode())
                deadline = time.monotonic() + 20
                while True:
                    snapshot = json.loads(_stat(endpoint, "--json"))
                    hs = snapshot["handshake"]
                    if (
                        hs["status_messages_refused"] >= 5
                        and hs["setups_rejected"] >= 7
                        and hs["setups_rate_limited"] >= 30
                    ):
                        break
                    assert time.monotonic() < deadline, f"refusals not counted: {hs}"
                    time.sleep(0.5)
                text = _stat(endpoint)
                section = text.split("\nhandshake\n", 1)[1]
                for name in (
                    "status_messages_refused",
                    "naks_refused",
                    "data_wrong_source",
                    "setups_rejected",
                    "setups_rate_limited",
                    "images_refused",
                    "amplification_drops",
                    "cookies_sent",
                    "rate_limited",
                    "rate_limited_answered",
                    "pair_address_mismatches",
                    "frames_rejected",
                ):
                    assert f"\n  {name} " in "\n" + section, f"{name} missing from stat"
                assert client.publish(10, [b"y"]) > 0  # the session still works
        finally:
            spoofer.close()
        assert proc.poll() is None
