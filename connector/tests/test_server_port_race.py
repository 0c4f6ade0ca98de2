"""Two servers started at the same moment on one port: the second fails, naming the port.

A server's public UDP sockets are bound with ``SO_REUSEPORT`` (its per-client connected sockets
share the port), which the kernel lets a second socket of the same user join; so the driver
first checks that a plain socket could bind the port, then binds. Before, the check and the bind
were two steps: two servers started together could both pass the check and both bind, and the
second then received nothing (the group's program hands every datagram to the first socket)
while it said it was listening. Now the port is claimed atomically before the check (an abstract
Unix socket named after the port), and the second fails with ``PORT_IN_USE`` naming the port.

Two real ``aeron-spark server`` processes on the same ``--port``. Each waits, after its check
and before its bind, until both have checked (or the other has exited; bounded), which makes
the interleaving of two servers starting at the same instant certain instead of rare: nothing
else of them is changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from aeron_spark.connector.server.testing import client_for
from aeron_spark.connector.testing_restart import free_port_pair
from aeron_spark.transport.testing import sweep_dead

WAIT_S = 120.0  # bounded wait for both servers to start or one to fail (a loaded machine)
BARRIER_S = 60.0  # how long each waits for the other at its check (bounded)

# the server's own CLI, with a pause between its port check and its bind (see above)
CHILD = """
import os, sys, time
from aeron_spark.transport.driver import driver
barrier, me, port = os.environ["RACE_BARRIER"], os.environ["RACE_ME"], int(os.environ["RACE_PORT"])
checked = driver.port_taken

def port_taken(bind):
    taken = checked(bind)
    if bind.port == port:
        open(os.path.join(barrier, me), "w").close()
        deadline = time.monotonic() + float(os.environ["RACE_WAIT_S"])
        while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    return taken

driver.port_taken = port_taken
from aeron_spark.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_two_servers_started_together_on_one_port_the_second_fails_naming_it(tmp_path) -> None:
    port = free_port_pair()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs, logs = [], []
    try:
        for name in ("one", "two"):
            log_path = tmp_path / f"{name}.log"
            logs.append(log_path)
            env = dict(
                os.environ,
                RACE_BARRIER=str(barrier),
                RACE_ME=name,
                RACE_PORT=str(port),
                RACE_WAIT_S=str(BARRIER_S),
            )
            with open(log_path, "w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", CHILD, "server", "--dir", str(tmp_path / name)]
                        + ["--port", str(port), "--no-encryption"],
                        stdout=log,
                        stderr=log,
                        env=env,
                    )
                )
        deadline = time.monotonic() + WAIT_S
        while True:
            exited = [p for p in procs if p.poll() is not None]
            listening = [i for i, path in enumerate(logs) if "listening on" in path.read_text()]
            if exited:
                (barrier / "exited").touch()  # the other one stops waiting at its check
            if len(exited) + len(listening) == 2:
                break
            assert time.monotonic() < deadline, [path.read_text()[-1000:] for path in logs]
            time.sleep(0.1)
        texts = [path.read_text() for path in logs]
        assert len(listening) == 1, f"both servers say they listen on port {port}: {texts}"
        (failed,) = exited
        assert failed.returncode == 1, texts
        failure = texts[procs.index(failed)]
        assert "PORT_IN_USE" in failure and f"UDP port {port}" in failure, failure
        # the one that started serves
        with client_for(f"127.0.0.1:{port}", timeout_s=60) as client:
            assert client.list_streams() == []
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        sweep_dead()
