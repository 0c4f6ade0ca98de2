"""aeron:ipc between processes through shared log buffer files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aeron_spark.transport import (
    BACK_PRESSURED,
    NOT_CONNECTED,
    Driver,
    DriverConfig,
    DriverError,
    FragmentAssembler,
)

PEER = str(Path(__file__).with_name("ipc_peer.py"))
sys.path.insert(0, str(Path(__file__).parent))
from ipc_peer import payload, random_sizes  # noqa: E402


@pytest.fixture
def ipc_dir(tmp_path: Path) -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = base / f"aeron-spark-test-{os.getpid()}-{time.monotonic_ns()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)  # the driver's directory too, not only its files


def _driver(ipc_dir: Path, **kw: object) -> Driver:
    return Driver(DriverConfig(directory=ipc_dir, write_counters_file=False, **kw))  # type: ignore[arg-type]


def _peer(*args: object) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, PEER, *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _wait_joined(pub, subscribers: int, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Until ``subscribers`` subscriptions have joined the IPC publication (live slots in its log
    file): ``wait_until_connected`` returns at the first one, and a fixed 0.2 s was not enough
    for a child process's driver to scan and join on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while len(pub.log.live_slots(time.monotonic_ns(), pub.liveness_timeout_ns)) < subscribers:
        assert time.monotonic() < deadline, f"fewer than {subscribers} subscribers joined"
        time.sleep(0.01)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def _files(ipc_dir: Path) -> list[str]:
    folder = ipc_dir / "ipc"
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_same_api_as_udp_in_one_process(ipc_dir: Path) -> None:
    with _driver(ipc_dir) as driver:
        pub = driver.add_publication("aeron:ipc?term-length=64k", 7)
        assert pub.offer(b"nobody listens") == NOT_CONNECTED and not pub.is_connected
        sub = driver.add_subscription("aeron:ipc", 7)
        assert pub.wait_until_connected(30)
        got: list[tuple[bytes, int]] = []
        assembler = FragmentAssembler(lambda p, h: got.append((bytes(p), h.reserved_value)))
        for i in range(2000):  # several term rotations of a 64 KiB term
            pub.offer_blocking(payload(i, 1 + i % 3000), reserved_value=i, timeout_s=30)
            sub.poll(assembler, 100)
        while len(got) < 2000:
            if sub.poll(assembler, 100) == 0:
                assert sub.wait(30)
        assert [g[1] for g in got] == list(range(2000))
        assert all(g[0] == payload(i, 1 + i % 3000) for i, g in enumerate(got))
        pub.close()
        deadline = time.monotonic() + 30
        while sub.images and time.monotonic() < deadline:
            sub.wait(0.05)
        assert not sub.images and _files(ipc_dir) == []  # drained, then removed
        sub.close()


def test_100k_messages_of_random_sizes_between_two_processes(ipc_dir: Path) -> None:
    """100,000 messages of 8 B to 40 KB (about 770 MB; the large ones fragmented) arrive
    complete, in order and intact: the subscriber compares each with what was sent (both sides
    draw the sizes from one seed). A SHA-256 of both sides' 770 MB had cost more than the
    transfer itself on a loaded 2-core machine; the comparison is exact and names the first
    message that differs."""
    sizes = random_sizes(7, 100_000)
    child = _peer("check", ipc_dir, 9, len(sizes), 7)
    with _driver(ipc_dir) as driver:
        pub = driver.add_publication("aeron:ipc?term-length=1m", 9)
        assert pub.wait_until_connected(60)  # the peer process starts meanwhile
        for i, size in enumerate(sizes):
            pub.offer_blocking(payload(i, size), timeout_s=30)
        result = _result(child)
        pub.close()
    assert result == {"count": len(sizes), "first_bad": None}
    assert _files(ipc_dir) == []


def test_two_subscribers_at_different_speeds_get_everything_and_the_slow_one_holds_back(
    ipc_dir: Path,
) -> None:
    fast = _peer("subscribe", ipc_dir, 11, 5000, 0)
    slow = _peer("subscribe", ipc_dir, 11, 5000, 0.002)
    pressured = 0
    digest = hashlib.sha256()
    with _driver(ipc_dir) as driver:
        pub = driver.add_publication("aeron:ipc?term-length=64k", 11)
        assert pub.wait_until_connected(60)  # the peer process starts meanwhile
        _wait_joined(pub, 2)  # both have joined at position 0 (nothing is offered before)
        deadline = time.monotonic() + 10
        for i in range(5000):
            data = payload(i, 300)
            digest.update(data)
            while (result := pub.offer(data)) < 0:
                assert result == BACK_PRESSURED, result
                pressured += 1
                time.sleep(0.0005)
                assert time.monotonic() < deadline + 60
        expected = {"count": 5000, "sha256": digest.hexdigest(), "in_order": True}
        assert _result(fast) == expected
        assert _result(slow) == expected
        pub.close()
    assert pressured > 0  # 1.6 MB through a 32 KiB window: the slow reader paced the publisher


def test_publisher_killed_mid_message_never_delivers_the_torn_message(ipc_dir: Path) -> None:
    got: list[bytes] = []
    with _driver(ipc_dir, ipc_liveness_timeout_ns=1_000_000_000) as driver:
        sub = driver.add_subscription("aeron:ipc", 13)
        proc = subprocess.Popen(
            [sys.executable, PEER, "publish-torn", str(ipc_dir), "13", "10"],
            stdin=subprocess.DEVNULL,
        )
        assembler = FragmentAssembler(lambda p, h: got.append(bytes(p)))
        deadline = time.monotonic() + 30
        seen_image = False
        while time.monotonic() < deadline:
            sub.poll(assembler, 100)
            seen_image = seen_image or bool(sub.images)
            if seen_image and not sub.images and proc.poll() is not None:
                break
            sub.wait(0.05)
        assert proc.wait(10) == 0
    assert got == [payload(i, 100) for i in range(10)]
    assert _files(ipc_dir) == []  # the dead publisher's file was cleaned up


def test_subscriber_stalled_while_back_pressured_is_dropped_after_the_liveness_timeout(
    ipc_dir: Path,
) -> None:
    child = _peer("hold", ipc_dir, 15)
    with _driver(ipc_dir, ipc_liveness_timeout_ns=1_000_000_000) as driver:
        pub = driver.add_publication("aeron:ipc?term-length=64k", 15)
        own = driver.add_subscription("aeron:ipc", 15)  # a live reader that keeps up
        assert pub.wait_until_connected(60)  # the peer process starts meanwhile
        _wait_joined(pub, 2)  # the child's subscription too, before it is stopped
        os.kill(child.pid, signal.SIGSTOP)  # alive but silent: only the liveness timeout helps
        try:
            sink = FragmentAssembler(lambda p, h: None)
            sent, pressured_since = 0, None
            deadline = time.monotonic() + 20
            while sent < 2000 and time.monotonic() < deadline:
                if pub.offer(payload(sent, 200)) > 0:
                    sent += 1
                elif pressured_since is None:
                    pressured_since = time.monotonic()
                own.poll(sink, 100)
            assert sent == 2000 and pressured_since is not None
            assert time.monotonic() - pressured_since >= 0.5  # held until the timeout passed
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
        pub.close()
        own.close()
    assert _files(ipc_dir) == []


def test_too_small_a_directory_says_what_to_do(ipc_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from aeron_spark.transport.ipc import logfile

    real = shutil.disk_usage
    monkeypatch.setattr(  # a /dev/shm with 1 MiB free, as in a default docker container's 64 MiB
        logfile.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20)
    )
    with _driver(ipc_dir) as driver, pytest.raises(DriverError) as info:
        driver.add_publication("aeron:ipc?term-length=1m", 17)
    assert "/dev/shm" in str(info.value) and "term-length" in str(info.value)
    assert "directory" in str(info.value) and _files(ipc_dir) == []


def test_a_scan_racing_the_subscriptions_close_claims_no_slot_and_leaks_no_file(
    ipc_dir: Path,
) -> None:
    """The conductor's do_work passed its "closed?" check, then the client thread closed the
    subscription (dropping its image: the file's name is no longer known), then do_work took the
    lock and scanned: it found the still-open publication's file again and claimed a slot for a
    subscription nobody will heartbeat or close again. The publication's close then saw that slot
    live and left the file for a subscriber that never comes (the flaky handshake IPC test)."""
    import threading

    from aeron_spark.transport.ipc.logfile import MAX_SUBSCRIBERS
    from aeron_spark.transport.ipc.publication import IpcPublication
    from aeron_spark.transport.ipc.subscription import IpcSubscription
    from aeron_spark.transport.uri import ChannelConfig

    liveness_ns = 10_000_000_000
    pub = IpcPublication(
        ChannelConfig.from_uri("aeron:ipc?term-length=65536"),
        77,
        ipc_dir,
        liveness_timeout_ns=liveness_ns,
    )
    sub = IpcSubscription(
        ChannelConfig.from_uri("aeron:ipc"), 77, ipc_dir, liveness_timeout_ns=liveness_ns
    )
    assert len(sub.images) == 1 and pub.is_connected

    class Gate:
        """The subscription's lock, telling us when the conductor waits at it."""

        def __init__(self) -> None:
            self.lock = threading.RLock()  # reentrant: the test thread closes while holding it
            self.conductor_waiting = threading.Event()

        def __enter__(self) -> None:
            if threading.current_thread() is conductor:
                self.conductor_waiting.set()
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    gate = Gate()
    sub._media._lock = gate  # type: ignore[attr-defined]
    scan_due = time.monotonic_ns() + 10**9  # past the scan interval: this do_work scans
    conductor = threading.Thread(target=sub.do_work, args=(scan_due,))
    with gate.lock:
        conductor.start()
        assert gate.conductor_waiting.wait(10)  # past its closed check, blocked on the lock
        sub.close()  # the client thread closes meanwhile
    conductor.join(10)
    assert not conductor.is_alive()

    assert sub.images == []
    log = pub.log
    assert [log.read_slot(i)[3] for i in range(MAX_SUBSCRIBERS)] == [0] * MAX_SUBSCRIBERS
    pub.close()
    assert _files(ipc_dir) == []


def test_one_client_api_a_claim_on_ipc_is_made_in_place_and_shown_only_once_committed(
    ipc_dir: Path,
) -> None:
    """IPC's publication, subscription and images are the same classes as UDP's (one client
    API); a claim is a frame reserved in the shared log, which readers pass only when it is
    committed (an aborted one becomes padding they skip), in order with offers around it."""
    from aeron_spark.transport import BufferClaim, Image, Publication, Subscription

    with _driver(ipc_dir, threading_mode="invoker") as driver:
        pub = driver.add_publication("aeron:ipc?term-length=64k", 9)
        sub = driver.add_subscription("aeron:ipc", 9)
        assert isinstance(pub, Publication) and isinstance(sub, Subscription)
        assert pub.wait_until_connected(30) and isinstance(sub.images[0], Image)
        got: list[bytes] = []

        def take(payload: memoryview, header: object) -> None:
            got.append(bytes(payload))

        claim = pub.try_claim(5)
        assert isinstance(claim, BufferClaim)
        claim.buffer[:] = b"first"
        assert sub.poll(take, 10) == 0 and not sub.has_data()  # reserved, not yet written
        claim.commit()
        assert sub.poll(take, 10) == 1 and got == [b"first"]
        aborted = pub.try_claim(4)
        assert isinstance(aborted, BufferClaim)
        aborted.abort()
        assert pub.offer(b"after") > 0
        assert sub.poll(take, 10) == 1 and got == [b"first", b"after"]
        assert sub.images[0].position == pub.position
        with pytest.raises(ValueError, match="one fragment"):
            pub.try_claim(pub.max_payload_length + 1)
        pub.close()
        assert pub.try_claim(1) == -4  # CLOSED


_ENDS_WITHOUT_CLOSING = """
import os, sys
from pathlib import Path
from aeron_spark.transport import Driver, DriverConfig
driver = Driver(DriverConfig(directory=Path(sys.argv[1]), write_counters_file=False)).start()
driver.add_publication("aeron:ipc?term-length=64k", int(sys.argv[2]))
driver.counters.write(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
os._exit(0)  # as Spark's Python workers end: nothing closed, no atexit
"""


def test_a_starting_driver_removes_what_processes_that_never_closed_left(ipc_dir: Path) -> None:
    """A publisher that ends with os._exit (Spark's workers) or is killed closes nothing: its log
    buffer (~200 KB in /dev/shm) stayed for good when no subscriber of its stream came again (a
    run left one per killed server: its handshake reply log). A driver starting on the directory
    removes the logs and counters files of processes that are gone, never a live one's."""
    children = []
    for stream_id in (31, 32):
        child = subprocess.Popen(
            [sys.executable, "-c", _ENDS_WITHOUT_CLOSING, str(ipc_dir), str(stream_id)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        children.append(child)
    with _driver(ipc_dir) as live:
        live.add_publication("aeron:ipc?term-length=64k", 33)  # a live process's: it stays
        children[0].communicate("\n", timeout=60)  # os._exit
        children[1].kill()  # SIGKILL
        children[1].communicate(timeout=60)
        left = sorted(p.name for p in ipc_dir.rglob("*") if p.is_file())
        assert [n.split("_")[1] for n in left if n.startswith("pub_")] == ["31", "32", "33"]
        assert sum(n.startswith("counters-") for n in left) == 2
        with _driver(ipc_dir) as starting:
            starting.start()
            remaining = sorted(p.name for p in ipc_dir.rglob("*") if p.is_file())
            assert remaining == [n for n in left if n.startswith("pub_33_")], remaining
            assert starting.system_counters.stale_files_removed == 4
    assert _files(ipc_dir) == []
