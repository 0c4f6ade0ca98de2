"""HELLO images are bounded per IPv6 /64, not per address, over a real veth link (root).

A handshake server's HELLO subscription takes at most ``max_per_address`` images (one per
client socket's SETUP) from one client address (``max-images-per-address``), so a stranger
sending SETUPs for new session ids cannot fill the server's image budget alone. The handshake
counts an IPv6 client's /64 as one address (``max_per_address``, the pending handshakes, HELLO
rates, dedicated sockets): one host picks its source addresses from a whole /64. The transport
counted HELLO images per exact address: a host with eight addresses of one /64 held eight times
the images allowed. Loopback gives one IPv6 address (``::1``), so the server runs in a network
namespace with a /64 on one end of a veth pair and the client in another with eight addresses of
that /64 on the other end; both namespaces and the pair are removed by the test.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces and veth pairs need root and iproute2",
)

MAX_PER_ADDRESS = 2
CLIENT_HOSTS = range(2, 10)  # ::2 .. ::9, one /64
SESSIONS_EACH = 2  # each address's share under the old per-address count


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"ip {' '.join(argv)}: {done.stderr.strip()}"


class Link:
    """Two namespaces joined by a veth pair, ``prefix::1/64`` in ``server``, ``prefix::2..9``
    in ``client`` (no duplicate address detection: usable at once)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}x{random.randrange(1000)}"
        self.server, self.client = f"ash6s{tag}", f"ash6c{tag}"
        words = [random.randrange(65536) for _ in range(3)]  # a random ULA /64
        self.prefix = f"fd{random.randrange(256):02x}:" + ":".join(f"{w:x}" for w in words)
        self.made: list[str] = []

    def __enter__(self) -> Link:
        try:
            for ns in (self.server, self.client):
                _ip("netns", "add", ns)
                self.made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip(
                "-n",
                self.server,
                "link",
                "add",
                "v6s",
                "type",
                "veth",
                "peer",
                "name",
                "v6c",
                "netns",
                self.client,
            )
            _ip("-n", self.server, "addr", "add", f"{self.prefix}::1/64", "dev", "v6s", "nodad")
            for k in CLIENT_HOSTS:
                _ip(
                    "-n",
                    self.client,
                    "addr",
                    "add",
                    f"{self.prefix}::{k}/64",
                    "dev",
                    "v6c",
                    "nodad",
                )
            _ip("-n", self.server, "link", "set", "v6s", "up")
            _ip("-n", self.client, "link", "set", "v6c", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for ns in reversed(self.made):  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made.clear()

    def run(self, ns: str, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], text=True, **kw)


# a handshake server on [prefix::1], answering "state" on stdin with its HELLO images' sources
_SERVER = """
import json, sys
from aeron_spark.handshake import Server, ServerConfig
config = ServerConfig(
    key_store_dir=sys.argv[2], host=sys.argv[1], ipc=False, max_per_address=int(sys.argv[3])
)
server = Server(config, on_message=None).start()
print(json.dumps({"port": server.port}), flush=True)
for line in sys.stdin:
    stats = server.stats()
    sources = [image._state.source_address[0] for image in server._hello_sub.images]
    keep = ("images_created", "images_refused", "images_evicted", "setups_rate_limited")
    print(json.dumps({"sources": sources, **{k: stats[k] for k in keep}}), flush=True)
server.close()
"""

# SETUPs for new HELLO sessions from sockets bound to each of the client's addresses
_CLIENT = """
import socket, sys
from aeron_spark.handshake.channels import HANDSHAKE_TERM_LENGTH
from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID
from aeron_spark.transport.protocol.frames import SetupFrame
server = (sys.argv[1], int(sys.argv[2]))
hosts, each = sys.argv[3].split(","), int(sys.argv[4])
session = 0x5A000000
for host in hosts:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        for _ in range(each):
            session += 1
            frame = SetupFrame(0, session, HANDSHAKE_STREAM_ID, 7, 7, HANDSHAKE_TERM_LENGTH, 1408)
            s.sendto(frame.encode(), server)
print("sent", flush=True)
"""


@pytest.fixture
def link() -> Iterator[Link]:
    with Link() as made:
        yield made


def _ask(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("state\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, "the server process ended"
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_hello_images_from_one_ipv6_64_are_bounded_as_one_address(
    link: Link, tmp_path: Path
) -> None:
    env = dict(os.environ, AERON_SPARK_DIR=str(tmp_path / "driver"))
    server = link.run(
        link.server,
        [
            sys.executable,
            "-c",
            _SERVER,
            f"{link.prefix}::1",
            str(tmp_path / "keys"),
            str(MAX_PER_ADDRESS),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert server.stdout is not None
        port = json.loads(server.stdout.readline() or "{}").get("port")
        assert port, "the server did not start"
        hosts = ",".join(f"{link.prefix}::{k}" for k in CLIENT_HOSTS)
        sent = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                link.client,
                sys.executable,
                "-c",
                _CLIENT,
                f"{link.prefix}::1",
                str(port),
                hosts,
                str(SESSIONS_EACH),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert sent.stdout.strip() == "sent", sent.stderr[-2000:]
        total = len(CLIENT_HOSTS) * SESSIONS_EACH
        deadline = time.monotonic() + 60.0  # every SETUP handled (made, refused or evicting)
        while True:
            state = _ask(server)
            handled = (
                state["images_created"] + state["images_refused"] + state["setups_rate_limited"]
            )
            if handled >= total:
                break
            assert time.monotonic() < deadline, f"the server handled {handled} of {total}: {state}"
            time.sleep(0.05)
        ours = [s for s in state["sources"] if s.startswith(link.prefix)]
        # main: 16 images, two from each of the eight addresses of the one /64
        assert len(ours) <= MAX_PER_ADDRESS, (len(ours), state)
        assert state["images_refused"] + state["images_evicted"] >= total - MAX_PER_ADDRESS, state
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()
