"""Helpers for testing code that uses the transport (like ``trio.testing``).

* :class:`LossConfig` / :class:`LossInjector`: drop, duplicate and reorder received datagrams at
  given rates, from a seeded random generator, between a socket and the state machines (Aeron's
  ``LossGenerator``). Pass ``DriverConfig(loss=LossConfig(...))`` to a driver.
* :class:`DropChosen`: drop the DATA datagrams a test chooses, once each (their retransmissions
  pass), for deterministic loss.
* :class:`ManualClock`: a ``now_ns`` source tests advance by hand.
* :func:`free_udp_port`: a port number that was free a moment ago (prefer binding port 0).
* :class:`Spoofer`: UDP datagrams over IPv4 with a forged source address and port (a raw
  socket: root or CAP_NET_RAW; :func:`spoof_unavailable` says why not), for attack tests.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import socket
import struct
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from aeron_spark.transport.counters import sweep_counter_files
from aeron_spark.transport.driver.driver import default_directory
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.ipc import logfile
from aeron_spark.transport.protocol.frames import DATA_HEADER, FrameType


@dataclass(frozen=True, slots=True)
class LossConfig:
    """Rates (0..1) at which received datagrams are dropped, duplicated or held back a while."""

    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    reorder_rate: float = 0.0
    seed: int = 0
    reorder_depth: int = 3  # a held datagram is released after this many later ones

    def __post_init__(self) -> None:
        for name in ("drop_rate", "duplicate_rate", "reorder_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ChannelError(name, value, "a rate from 0.0 to 1.0")
        if self.reorder_depth < 1:
            raise ChannelError("reorder_depth", self.reorder_depth, "at least 1")

    def receive_hook(self, counters: Any = None) -> LossInjector:
        """The media hook (``transport.api.MediaHook``) a driver installs on each UDP endpoint."""
        return LossInjector(self, counters)


class LossInjector:
    """Sits in an endpoint's receive path; counts what it drops in ``loss_injected_drops``."""

    def __init__(self, config: LossConfig, counters: Any = None) -> None:
        self.config = config
        self.counters = counters
        self.random = random.Random(config.seed)
        self.held: deque[list[Any]] = deque()  # [remaining_count, data, length, source]
        self.ready: deque[tuple[Any, int, Any]] = deque()
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0

    def receive(self, endpoint: Any) -> tuple[Any, int, Any] | None:
        """Next datagram to deliver, after loss, duplication and reordering; None if none."""
        if self.ready:
            return self.ready.popleft()
        cfg = self.config
        rnd = self.random.random
        while True:
            got = endpoint.raw_receive()
            if got is None:
                # Nothing new: release held datagrams so nothing stays stuck forever.
                if self.held:
                    _, data, length, source = self.held.popleft()
                    return data, length, source
                return None
            buf, length, source = got
            if cfg.drop_rate and rnd() < cfg.drop_rate:
                self.dropped += 1
                if self.counters is not None:
                    self.counters.loss_injected_drops += 1
                continue
            for item in self.held:
                item[0] -= 1
            while self.held and self.held[0][0] <= 0:
                _, data, hlen, hsource = self.held.popleft()
                self.ready.append((data, hlen, hsource))
            if cfg.reorder_rate and rnd() < cfg.reorder_rate:
                self.reordered += 1
                self.held.append([cfg.reorder_depth, bytes(buf[:length]), length, source])
                if self.ready:
                    return self.ready.popleft()
                continue
            if cfg.duplicate_rate and rnd() < cfg.duplicate_rate:
                self.duplicated += 1
                copy = bytes(buf[:length])
                self.ready.append((copy, length, source))
                return copy, length, source
            if self.ready:
                self.ready.append((bytes(buf[:length]), length, source))
                return self.ready.popleft()
            return buf, length, source


class DropChosen:
    """A media hook (``DriverConfig(loss=DropChosen(choose))``) that drops the DATA datagrams
    the test chooses, each once: ``choose(header)`` is asked for every DATA datagram not
    dropped before (``header``: ``DATA_HEADER``'s fields of its first frame, a
    ``DataHeader``); a chosen one is dropped the first time and handed on when it comes again
    (a retransmission: its key in ``resent``), or dropped again with ``drop_resent`` (a path
    black-holed, not lossy). Deterministic loss, unlike :class:`LossConfig`'s rates. One
    instance serves every endpoint of the driver (the receiver thread calls it)."""

    def __init__(self, choose: Callable[[DataHeader], bool], drop_resent: bool = False) -> None:
        self.choose = choose
        self.drop_resent = drop_resent
        self.dropped: list[tuple[int, int, int]] = []  # (session id, term id, term offset)
        self.resent: list[tuple[int, int, int]] = []
        self.handed_headers: list[DataHeader] = []  # of the DATA handed on (resent too)

    def receive_hook(self, counters: Any = None) -> DropChosen:
        return self

    def receive(self, endpoint: Any) -> tuple[Any, int, Any] | None:
        while True:
            got = endpoint.raw_receive()
            if got is None:
                return None
            buf, length, _source = got
            if length < DATA_HEADER.size or buf[6] != FrameType.DATA:
                return got
            header = DataHeader(*DATA_HEADER.unpack_from(buf, 0))
            if header.frame_length == 0:
                return got  # a heartbeat
            key = (header.session_id, header.term_id, header.term_offset)
            if key in self.dropped:
                self.resent.append(key)
                if self.drop_resent:
                    continue
            elif self.choose(header):
                self.dropped.append(key)
                continue
            self.handed_headers.append(header)
            return got


class DataHeader(NamedTuple):
    frame_length: int
    version: int
    flags: int
    frame_type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int


def session_publication(
    clock: Any, dest: Any, session_id: int = 5, term_length: int = 64 * 1024, **more: Any
) -> Any:
    """A publication's state of stream 10 (terms of ``term_length`` from term 0, MTU 1408) to
    ``dest`` on ``clock`` (a :class:`ManualClock`): the one the driver-path tests step by hand;
    ``more`` goes to :class:`PublicationState` (flow control, idle heartbeat interval, ...)."""
    from aeron_spark.transport.protocol.publication import PublicationState

    return PublicationState(
        session_id=session_id,
        stream_id=10,
        initial_term_id=0,
        term_id=0,
        term_offset=0,
        term_length=term_length,
        mtu=1408,
        destination=dest,
        now_ns=clock.now_ns,
        **more,
    )


class ManualClock:
    """A clock for stepping sans-I/O machines: ``clock.now_ns``, ``clock.advance(ns)``."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def advance(self, delta_ns: int) -> int:
        self.now_ns += delta_ns
        return self.now_ns

    def __call__(self) -> int:
        return self.now_ns


class Wire:
    """A send function for sans-I/O machines that keeps what they send: ``sent`` holds each
    ``(datagram bytes, address)``; :meth:`take` hands them over and forgets them."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []

    def __call__(self, data: Any, address: Any) -> None:
        self.sent.append((bytes(data), address))

    def take(self) -> list[tuple[bytes, Any]]:
        out, self.sent = self.sent, []
        return out


@contextlib.contextmanager
def ready_process(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A child process (``argv``) whose first line on stdout is ``ready`` once it is set up; it
    then reads what the test writes to its stdin. At the end it is let go on (the test may have
    paused it with ``SIGSTOP``), killed if still running, and reaped."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(30)


def pump(driver: Any, until: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Step an invoker-mode driver until ``until()`` (idling 5 ms when it has nothing to do);
    an ``AssertionError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        if driver.do_work() == 0:
            driver.idle(0.005)


def walked_totals(c: Any) -> dict[str, int]:
    """A driver conductor's counter totals as a walk of every live publication and image finds
    them (what ``totals()`` did before its running totals), plus what retired: their check."""
    from aeron_spark.transport.driver.conductor import dispatcher_counts, publication_counts

    expected = dict(c.retired)
    for ep in c.sender.endpoints:
        for state in ep.publications:
            for name, value in publication_counts(state).items():
                expected[name] = expected.get(name, 0) + value
    for rep in c.receiver.endpoints:
        for name, value in dispatcher_counts(rep).items():
            expected[name] = expected.get(name, 0) + value
    return expected


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port that was free when asked (racy: binding port 0 directly is better)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def message_sizes(seed: int, count: int, max_size: int, min_size: int = 1) -> list[int]:
    """``count`` sizes from ``min_size`` to ``max_size``, log-uniform (many small, some large)."""
    rnd = random.Random(seed)
    low, high = math.log(min_size), math.log(max_size + 1)
    return [min(max_size, int(math.exp(rnd.uniform(low, high)))) for _ in range(count)]


def make_message(index: int, size: int) -> bytes:
    """A message that says which one it is: its index (8 bytes) then a pattern derived from it."""
    head = index.to_bytes(8, "little")
    if size <= 8:
        return head[:size]
    start = index & 0xFF
    body = _PATTERN[start : start + 251]
    reps = (size - 8) // 251 + 1
    return head + (body * reps)[: size - 8]


_PATTERN = bytes(range(256)) * 2


def sweep_dead(directory: Any = None) -> list[str]:
    """What a driver starting now would sweep from ``directory`` (the default driver directory:
    the run's own under pytest): the IPC log buffers and counters files of processes that are
    gone. A test that kills a process (``kill -9`` closes nothing) calls it once the process is
    reaped, so the run leaves nothing in /dev/shm (the root conftest.py checks)."""
    where = default_directory() if directory is None else directory
    removed = logfile.sweep(where, time.monotonic_ns(), 10_000_000_000)
    removed += sweep_counter_files(where)
    # and the folders, when empty, as the killed process's driver would have on close (a live
    # driver watching the ipc folder follows it: ipc/watch.py)
    for folder in (logfile.ipc_directory(where), *(() if directory is not None else (where,))):
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return removed


def running_threads() -> frozenset[int]:
    """The native ids of this process's threads now (to leave out of :func:`thread_wakeups`:
    another test's shared client driver lives on in the process)."""
    import threading

    return frozenset(t.native_id for t in threading.enumerate() if t.native_id is not None)


def thread_wakeups(prefixes: tuple[str, ...], exclude: frozenset[int] = frozenset()) -> int:
    """How many times this process's threads named ``prefixes*`` (but those in ``exclude``,
    :func:`running_threads` before the ones to count started) went to sleep and woke since
    they started (Linux: the sum of their ``voluntary_ctxt_switches``): an idle thread's duty
    cycles, counted by the kernel, not by the code under test. A loaded machine delays wake-ups
    (and a GIL hand-off between two busy threads adds one), it does not add ticks: a fixed tick
    adds one per tick however slow the machine."""
    import threading

    total = 0
    for thread in threading.enumerate():
        if not thread.name.startswith(prefixes) or thread.native_id in (None, *exclude):
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/status") as fh:
                for line in fh:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return total


__all__ = [
    "running_threads",
    "sweep_dead",
    "thread_wakeups",
    "LossConfig",
    "LossInjector",
    "ManualClock",
    "Spoofer",
    "Wire",
    "free_udp_port",
    "make_message",
    "message_sizes",
    "pump",
    "ready_process",
    "spoof_unavailable",
]


def recorded_payloads(frames: bytes, initial_term_id: int, term_length: int) -> list[bytes]:
    """The messages (reassembled payloads) in a run of recorded frames, as a subscriber gets."""
    from aeron_spark.transport import FragmentAssembler, Header  # not at import: no cycle
    from aeron_spark.transport.protocol.term import read_term

    out: list[bytes] = []
    assembler = FragmentAssembler(lambda p, h: out.append(bytes(p)))
    header = Header(initial_term_id, term_length.bit_length() - 1)
    view = memoryview(frames)
    offset = 0
    while offset < len(view):
        _, new = read_term(view, offset, assembler, 1 << 30, header, len(view))
        assert new > offset, f"no frame read at offset {offset}"
        offset = new
    return out


def spoof_unavailable() -> str | None:
    """Why forged datagrams cannot be sent here (None: they can)."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW).close()
    except PermissionError:
        return "raw IPv4 sockets need root or CAP_NET_RAW (CI runs as root)"
    except OSError as exc:
        return f"no raw IPv4 sockets: {exc}"
    return None


class Spoofer:
    """Sends UDP datagrams over IPv4 with any source address and port (the kernel fills in the
    IP checksum, length and id; the UDP checksum is left 0, "none", which IPv4 allows)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.bytes_sent: dict[str, int] = {}  # UDP payload bytes per forged source address

    def send(self, source: tuple[str, int], destination: tuple[str, int], payload: bytes) -> None:
        udp = struct.pack("!HHHH", source[1], destination[1], 8 + len(payload), 0) + payload
        ip = struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + len(udp),
            0,
            0,
            64,
            socket.IPPROTO_UDP,
            0,
            socket.inet_aton(source[0]),
            socket.inet_aton(destination[0]),
        )
        self.sock.sendto(ip + udp, (destination[0], 0))
        self.bytes_sent[source[0]] = self.bytes_sent.get(source[0], 0) + len(payload)

    def close(self) -> None:
        self.sock.close()
