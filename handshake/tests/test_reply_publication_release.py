"""A killed client's HELLO reply publication is closed once its HELLO image falls silent, not
when the image's liveness runs out.

Over UDP the server opens one reply publication per HELLO image (one per client process: its
handshakes share a HELLO channel, kept ``hello_linger_s`` after the last for the next one). A
client that closes its channel ends its image at once (end of stream) and the publication goes
with it. A client process that dies (killed, or a Spark worker's ``os._exit``) sends nothing
more: its sessions are reaped once their transport is lost, but its reply publication (a log
buffer and a destination) stayed until the HELLO image's liveness ran out, 10 s after its last
heartbeat, for every such process. The HELLO publication heartbeats every 100 ms while its
process lives: an image silent for 2 s with no handshake in flight on it is a client gone, and
its reply publication is closed then (opened again should the image speak again)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

_CLIENT = """
import sys, time
from aeron_spark.handshake import Client, ClientConfig
client = Client(ClientConfig(key_store_dir=sys.argv[1], timeout_s=60.0))
conn = client.connect(sys.argv[2])
conn.send(b"ping")
assert conn.receive(30) == b"ping"
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_clients_reply_publication_is_closed_before_its_hello_image_expires(
    make_server: Callable[..., Any], tmp_path: Any
) -> None:
    server = make_server()
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENT, str(tmp_path / f"client-{i}"), server.endpoint],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for i in range(3)
    ]
    try:
        for proc in clients:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        inboxes = [i for i in list(server._hellos.values()) if i.reply is not None]
        assert len(inboxes) == 3  # one HELLO image (and reply publication) per client process
        replies = [i.reply for i in inboxes]
        images = [i.image for i in inboxes]
        for proc in clients:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)

        def image_gone() -> bool:
            live = {id(image) for image in server._hello_sub.images}
            return any(id(image) not in live for image in images)

        deadline = time.monotonic() + 60
        while not all(r.is_closed for r in replies) and not image_gone():
            assert time.monotonic() < deadline, "neither closed nor expired"
            time.sleep(0.05)
        # main: the reply publications were closed only when their images expired
        assert all(r.is_closed for r in replies) and not image_gone(), (
            f"closed: {[r.is_closed for r in replies]}, an image expired: {image_gone()}"
        )
        stats = server.stats()
        assert stats["reply_publications"] == 0
        assert stats["reply_publications_closed_silent"] == 3
        # and the sessions of the killed clients are reaped (their publications freed)
        deadline = time.monotonic() + 60
        while server.stats()["connections"]:
            assert time.monotonic() < deadline, "the killed clients' sessions were not reaped"
            time.sleep(0.05)
    finally:
        for proc in clients:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
