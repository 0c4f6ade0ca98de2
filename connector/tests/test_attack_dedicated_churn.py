"""Attacks on the dedicated-socket budget and shares of a real server process by churn and by
clients that die: sessions opened and closed fast from many client processes, and client
processes holding dedicated sockets killed with SIGKILL (no goodbye). Every socket must be
closed and every share given back, so that the next clients of the same address get theirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aeron_spark.connector.server.testing import client_for, server_process, udp_sockets_of
from aeron_spark.handshake import client as handshake_client
from aeron_spark.transport.archive.testing import open_fds as _open_fds


def open_fds(pid: int) -> int:
    """The server's descriptors but its spare recording directories' files (held open within
    their budget while sessions come and go, trimmed 60 s after the sessions went: not the
    sockets' descriptors this file counts)."""
    return _open_fds(pid, but_containing="/recordings/spare-")


TIMEOUT_S = 20.0
NOFILE = (64, 160)  # the server raises its soft limit to 160: a budget of 20, shares of 5
SHARE = 160 // 8 // 4
SETTLE_S = 90.0  # bounded wait for dead clients' sessions to go and their sockets to close

# A client process that opens a session, says so and waits to be killed.
HOLDER = """
import sys, time
from aeron_spark.connector.server.testing import client_for
client = client_for(sys.argv[1], timeout_s=20.0)
client.stats()
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _connected(pid: int, port: int) -> list[tuple[str, int]]:
    return [r.remote for p in (port, port + 1) for r in udp_sockets_of(pid, p) if r.connected]


def _settle(pid: int, port: int, baseline: int) -> None:
    deadline = time.monotonic() + SETTLE_S
    while _connected(pid, port) or open_fds(pid) > baseline:
        assert time.monotonic() < deadline, (
            f"{open_fds(pid)} descriptors (before: {baseline}), sockets still connected to "
            f"{_connected(pid, port)}"
        )
        time.sleep(0.2)


def _clients_hold(endpoint: str, pid: int, port: int, count: int) -> int:
    """Open ``count`` client processes (a driver each) at once; how many sockets the server
    has connected to them while they all live. All closed on return."""
    clients, drivers = [], []
    try:
        for _ in range(count):
            handshake_client._shared = None
            client = client_for(endpoint, timeout_s=TIMEOUT_S)
            drivers.append(handshake_client._shared)
            clients.append(client)
            client.stats()
        return len(_connected(pid, port))
    finally:
        handshake_client._shared = None
        for client in clients:
            client.close()
        for driver in drivers:
            if driver is not None:
                driver.close()


@pytest.mark.slow
def test_client_processes_killed_with_sigkill_give_back_their_dedicated_sockets(
    tmp_path: Path,
) -> None:
    """Two client processes of one address hold four dedicated sockets (their address's share
    is five) and are killed with SIGKILL. Once the server has dropped their sessions every one
    of its sockets is closed, and two new client processes of the same address get four."""
    with server_process(str(tmp_path / "srv"), nofile=NOFILE) as (proc, endpoint):
        port = int(endpoint.rsplit(":", 1)[1])
        baseline = open_fds(proc.pid)
        holders = [
            subprocess.Popen(
                [sys.executable, "-c", HOLDER, endpoint],
                stdout=subprocess.PIPE,
                process_group=0,
            )
            for _ in range(2)
        ]
        try:
            for holder in holders:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == b"ready"
            assert len(_connected(proc.pid, port)) == 4
            for holder in holders:
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait(10)
        finally:
            for holder in holders:
                if holder.poll() is None:
                    os.killpg(holder.pid, signal.SIGKILL)
                holder.wait(10)
                if holder.stdout is not None:
                    holder.stdout.close()
        _settle(proc.pid, port, baseline)
        assert _clients_hold(endpoint, proc.pid, port, 2) == 4


@pytest.mark.slow
def test_churn_of_client_processes_leaks_no_socket_and_no_share(tmp_path: Path) -> None:
    """Ten rounds of three client processes of one address opened together and closed at once
    (each round over the address's share of five, so refused, reclaimed and lingering sockets
    mix). Then every socket is closed, the descriptors are those before, the counts agree, and
    the address's next client processes get their whole share."""
    with server_process(str(tmp_path / "srv"), nofile=NOFILE) as (proc, endpoint):
        port = int(endpoint.rsplit(":", 1)[1])
        baseline = open_fds(proc.pid)
        held = [_clients_hold(endpoint, proc.pid, port, 3) for _ in range(10)]
        assert all(h <= SHARE for h in held), held
        _settle(proc.pid, port, baseline)
        assert _clients_hold(endpoint, proc.pid, port, 3) == SHARE
        _settle(proc.pid, port, baseline)
        with client_for(endpoint, timeout_s=TIMEOUT_S) as client:
            counters = client.stats()["transport"]
    # the last client's two sockets still open (or lingering): all the others closed
    assert counters["dedicated_sockets_opened"] - counters["dedicated_sockets_closed"] <= 2
