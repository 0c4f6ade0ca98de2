"""Attacks on the HELLO reply publication closed after 2 s of silence (fifteenth session).

The server closes a UDP HELLO image's reply publication once the image has been silent for 2 s
with nothing in flight, and opens it again should the image speak. A client process that was
only paused (a stop-the-world pause, a ``SIGSTOP``, a host starved of CPU, a link that lost every
packet for a few seconds) is not gone: its HELLO channel lingers and its next handshake goes
over it. That handshake must still complete, in bounded time."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from aeron_spark.transport.testing import ready_process
from aeron_spark.transport.testing_netns import LossyLink, unavailable_reason

_CLIENT = """
import sys, time
from aeron_spark.handshake import Client, ClientConfig
client = Client(ClientConfig(key_store_dir=sys.argv[1], timeout_s=float(sys.argv[3])))
conn = client.connect(sys.argv[2])
conn.send(b"ping")
assert conn.receive(30) == b"ping"
print("ready", flush=True)
sys.stdin.readline()  # the test paused this process, then let it go on
started = time.monotonic()
try:
    again = client.connect(sys.argv[2])
    again.send(b"pong")
    assert again.receive(30) == b"pong"
    print("connected %.3f" % (time.monotonic() - started), flush=True)
except Exception as exc:
    print("failed %.3f %s: %s" % (time.monotonic() - started, type(exc).__name__, exc), flush=True)
"""


def test_a_paused_client_connects_again_over_its_lingering_hello_channel(
    make_server: Callable[..., Any], tmp_path: Any
) -> None:
    server = make_server()
    argv = [sys.executable, "-c", _CLIENT, str(tmp_path / "client"), server.endpoint, "30"]
    with ready_process(argv) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        closed = server.stats()["reply_publications_closed_silent"]
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while server.stats()["reply_publications_closed_silent"] == closed:
            assert time.monotonic() < deadline, "the paused client's reply publication stayed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline().strip()
        assert line.startswith("connected"), line


netns_reason = unavailable_reason()


@pytest.mark.skipif(netns_reason is not None, reason=netns_reason or "")
def test_a_client_cut_off_for_seconds_mid_handshake_still_connects(
    make_server: Callable[..., Any], tmp_path: Any
) -> None:
    """A link that loses every packet for a few seconds (both ways) while a client's next HELLO
    is in flight: the server's HELLO image falls silent, its reply publication is closed; once
    the link is back the HELLO is recovered by the transport (Aeron's NAK and retransmit) and the
    handshake completes over a reply publication opened anew, within the client's timeout."""
    with LossyLink() as link:
        server = make_server(host=link.a.address)
        argv = [sys.executable, "-c", _CLIENT, str(tmp_path / "client"), server.endpoint, "60"]
        with ready_process(link.b.command(argv)) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            closed = server.stats()["reply_publications_closed_silent"]
            link.set_loss(100)
            proc.stdin.write("go\n")  # its next HELLO goes out into the cut-off link
            proc.stdin.flush()
            deadline = time.monotonic() + 60
            while server.stats()["reply_publications_closed_silent"] == closed:
                assert time.monotonic() < deadline, "the cut-off client's reply stayed open"
                time.sleep(0.05)
            link.set_loss(0)
            line = proc.stdout.readline().strip()
            assert line.startswith("connected"), line
