"""The Python peers of the multi-process transport tests die with the process that started them.

``test_two_process_delivery.py``'s publisher (``udp_peer.py``) and ``test_attack_flow_control.py``'s
idle subscriber run in sessions of their own (a test kills their group), so a pytest run killed
with SIGKILL left them running: the publisher offering to a subscriber that is gone, forever, the
subscriber sleeping forever. They are started with ``children.popen`` now (``PR_SET_PDEATHSIG``
from one long-lived spawner thread, as the Java peers are). A real child Python process starts
each, from a thread that ends at once, and is SIGKILLed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from aeron_spark.transport.testing import free_udp_port
from transport.tests import children

ROOT = Path(__file__).resolve().parents[2]

# argv[1]: a directory of the test's own; argv[2]: a free UDP port nobody listens on.
# The peer is started from a thread that ends at once: it must outlive that thread.
STARTERS = {
    "udp_peer": """
from aeron_spark.transport import Driver, DriverConfig
from transport.tests.test_two_process_delivery import Peer
# a subscriber here that never polls: once its window is full the publisher waits, offering,
# in a loop that ends only when every message is sent (on main, never: this process is gone)
driver = Driver(DriverConfig(directory=sys.argv[1])).__enter__()
sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 30)
port = sub.local_endpoints[0][1]
peer = Peer("stream", f"aeron:udp?endpoint=127.0.0.1:{port}", 30, 1_000_000, 1, 100, 0, 0, 0)
assert peer.next_event(120)["event"] == "connected"
started.append(peer.proc)
""",
    "idle_subscriber": """
from transport.tests.test_attack_flow_control import start_idle_subscriber
proc = start_idle_subscriber(Path(sys.argv[1]),
    f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{sys.argv[2]}|control-mode=dynamic|gtag=5")
proc.stdout.readline()  # its port: it is subscribed
started.append(proc)
""",
}
CHILD = """
import sys, threading
from pathlib import Path
started = []
def start():
{body}
t = threading.Thread(target=start)
t.start(); t.join()
print(started[0].pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("peer", sorted(STARTERS))
def test_a_python_peer_dies_when_the_process_that_started_it_is_killed(
    tmp_path: Path, peer: str
) -> None:
    body = "\n".join("    " + line for line in STARTERS[peer].strip().splitlines())
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(body=body), str(tmp_path), str(free_udp_port())],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        assert child.stdout is not None
        pids.append(int(child.stdout.readline()))
        time.sleep(0.5)  # the spawning thread has long ended: the peer still runs
        assert children.running(pids[0]), "the peer died with the thread that started it"
        assert "python" in Path(f"/proc/{pids[0]}/cmdline").read_text()  # past setpriv's exec
        # on main: the peer still ran, orphaned
        assert not children.outliving(child, pids), (
            f"{peer} {pids[0]} outlived the process that started it"
        )
    finally:
        children.reap(child, pids)
