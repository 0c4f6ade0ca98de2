"""Interoperability with the real Aeron C media driver and its C sample programs.

Runs only when ``AERON_DRIVER_DIR`` names a directory holding ``aeronmd``, ``basic_publisher``,
``basic_subscriber`` and ``streaming_publisher`` from real-logic/aeron's C driver and C samples,
built by whoever runs the tests, outside this repository (nothing of Aeron is kept here; see
``interop_README.md`` beside this file). Every exchange is unicast UDP on 127.0.0.1:

* real publisher (sample program -> real ``aeronmd``) -> our ``Subscription``: every message
  arrives once, in order, byte for byte; default and non-default ``term-length``/``mtu``,
  messages longer than the MTU (fragmented by the real driver, reassembled by our
  ``FragmentAssembler``), enough traffic to rotate terms and hit flow control, and an
  ``init-term-id`` near 2^31 so the int32 term id wraps on the wire.
* our ``Publication`` -> real ``basic_subscriber`` (through a real ``aeronmd``): it reports an image
  with our session id, mtu and term length and prints each of our messages intact; fragmented
  messages are reassembled by the real client; closing our publication makes its image
  unavailable (our EOS is understood).

Each real program runs in its own process group with a bounded wait and is always stopped in a
``finally`` block (SIGINT, then SIGKILL). The real driver uses its own ``AERON_DIR`` under
``/dev/shm``, the shared threading mode and sparse term files, so it stays light on a small
machine.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_PROGRAMS = ("aeronmd", "basic_publisher", "basic_subscriber", "streaming_publisher")
_DIR_ENV = "AERON_DRIVER_DIR"


def _driver_dir_or_skip_reason() -> tuple[Path | None, str]:
    raw = os.environ.get(_DIR_ENV, "")
    if not raw:
        return None, f"{_DIR_ENV} is not set (point it at a directory with {', '.join(_PROGRAMS)})"
    path = Path(raw)
    missing = [p for p in _PROGRAMS if not os.access(path / p, os.X_OK)]
    if missing:
        return None, f"{_DIR_ENV}={raw} lacks executable {', '.join(missing)}"
    return path, ""


AERON_BIN, _SKIP_REASON = _driver_dir_or_skip_reason()
if AERON_BIN is None:
    pytest.skip(_SKIP_REASON, allow_module_level=True)

from aeron_spark.transport import (  # noqa: E402
    Driver,
    DriverConfig,
    FragmentAssembler,
    Header,
    Publication,
    Subscription,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(180)]

_STDBUF = shutil.which("stdbuf")  # line-buffer the samples' stdout (they printf to a pipe)
_PROCESS_STOP_S = 10.0
_CONNECT_S = 15.0
_DELIVERY_S = 60.0


# --------------------------------------------------------------------------- helpers: processes


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealProgram:
    """One real Aeron program in its own process group; stdout lines go to a queue.

    A daemon thread blocks on ``readline`` so waiting for output is a bounded ``Queue.get``.
    ``stop()`` is idempotent and always leaves the process reaped.
    """

    def __init__(self, argv: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        cmd = ([_STDBUF, "-oL", "-eL"] if _STDBUF else []) + argv
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._queue.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self._queue.put(None)

    def next_line(self, deadline: float) -> str | None:
        """The next stdout line, or None at EOF or when ``deadline`` (monotonic) passes."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            line = self._queue.get(timeout=remaining)
        except queue.Empty:
            return None
        if line is None:
            self._queue.put(None)  # keep EOF visible to later callers
            return None
        self.lines.append(line)
        return line

    def wait_for_line(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.next_line(deadline)
            if line is None:
                raise AssertionError(
                    f"{self.name}: no line matching {pattern.pattern!r} within {timeout_s} s "
                    f"(exit code {self.proc.poll()}); output so far:\n" + self.transcript()
                )
            m = pattern.search(line)
            if m:
                return m

    def drain(self, timeout_s: float) -> None:
        """Read whatever is left until EOF (after the process ends) or the timeout."""
        deadline = time.monotonic() + timeout_s
        while self.next_line(deadline) is not None:
            pass

    def transcript(self, last: int = 40) -> str:
        return "\n".join(self.lines[-last:])

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{self.name} did not exit within {timeout_s} s:\n" + self.transcript()
            ) from exc

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=_PROCESS_STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=_PROCESS_STOP_S)
        self._reader.join(timeout=_PROCESS_STOP_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class RealDriver:
    """A running real ``aeronmd`` with its own Aeron directory."""

    aeron_dir: str
    env: dict[str, str]
    programs: list[RealProgram] = field(default_factory=list)

    def run(self, program: str, *args: str) -> RealProgram:
        assert AERON_BIN is not None
        p = RealProgram([str(AERON_BIN / program), "-p", self.aeron_dir, *args], self.env, program)
        self.programs.append(p)
        return p


@pytest.fixture
def real_driver() -> Iterator[RealDriver]:
    assert AERON_BIN is not None
    aeron_dir = f"/dev/shm/aeron-real-interop-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.update(
        {
            "AERON_DIR": aeron_dir,
            "AERON_DIR_DELETE_ON_START": "true",
            "AERON_DIR_DELETE_ON_SHUTDOWN": "true",
            "AERON_THREADING_MODE": "SHARED",
            "AERON_TERM_BUFFER_SPARSE_FILE": "true",
            # aeronmd links libaeron_driver.so; allow it to sit beside the binaries.
            "LD_LIBRARY_PATH": ":".join(filter(None, [str(AERON_BIN), env.get("LD_LIBRARY_PATH")])),
        }
    )
    driver = RealDriver(aeron_dir, env)
    md = RealProgram([str(AERON_BIN / "aeronmd")], env, "aeronmd")
    try:
        cnc = Path(aeron_dir) / "cnc.dat"
        deadline = time.monotonic() + _CONNECT_S
        # The driver writes cnc.dat when ready; the clients would wait for it too, but a
        # driver that fails to start should fail here with its own output.
        while not (cnc.exists() and cnc.stat().st_size > 0):
            if md.proc.poll() is not None or time.monotonic() > deadline:
                md.drain(1.0)
                raise AssertionError("aeronmd did not start:\n" + md.transcript())
            time.sleep(0.02)
        yield driver
    finally:
        for p in driver.programs:
            p.stop()
        md.stop()
        shutil.rmtree(aeron_dir, ignore_errors=True)


@pytest.fixture
def our_driver(tmp_path: Path) -> Iterator[Driver]:
    with Driver(DriverConfig(directory=tmp_path / "aeron-spark")) as d:
        yield d


# --------------------------------------------------------------------------- helpers: our side


@dataclass
class Received:
    payloads: list[bytes] = field(default_factory=list)
    sessions: set[int] = field(default_factory=set)
    streams: set[int] = field(default_factory=set)

    def handler(self, payload: memoryview, header: Header) -> None:
        self.payloads.append(bytes(payload))
        self.sessions.add(header.session_id)
        self.streams.add(header.stream_id)


def _poll_until(
    sub: Subscription, received: Received, done: Callable[[], bool], timeout_s: float
) -> None:
    """Poll ``sub`` through a FragmentAssembler until ``done()`` or the timeout; never spins."""
    assembler = FragmentAssembler(received.handler)
    deadline = time.monotonic() + timeout_s
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if sub.poll(assembler, 256) == 0:
            sub.wait(min(remaining, 0.05))


def _offer_all(pub: Publication, messages: list[bytes], timeout_s: float) -> list[int]:
    """Offer each message, waiting (bounded) through back pressure; returns the positions."""
    return [pub.offer_blocking(msg, timeout_s=timeout_s) for msg in messages]


def _channel(port: int, **params: object) -> str:
    extra = "".join(f"|{k.replace('_', '-')}={v}" for k, v in params.items())
    return f"aeron:udp?endpoint=127.0.0.1:{port}{extra}"


# ----------------------------------------------------------------- (a) real publisher -> our sub

_OFFER = re.compile(r"^offering (\d+)/(\d+) - (.*)$")


def test_basic_publisher_to_our_subscription(real_driver: RealDriver, our_driver: Driver) -> None:
    """The real basic_publisher's 'Hello World! i' messages arrive intact (default settings).

    basic_publisher offers once a second without waiting for a connection, so the first offer may
    be refused with NOT_CONNECTED: we expect exactly the messages it reports as accepted ("yay!").
    """
    port, stream_id, count = _free_udp_port(), 1001, 4
    channel = _channel(port)
    sub = our_driver.add_subscription(channel, stream_id)
    received = Received()
    pub = real_driver.run("basic_publisher", "-c", channel, "-s", str(stream_id), "-m", str(count))
    try:
        _poll_until(sub, received, lambda: pub.proc.poll() is not None, _DELIVERY_S)
        pub.wait_exit(_PROCESS_STOP_S)
        pub.drain(_PROCESS_STOP_S)
        accepted = [
            int(m.group(1)) for m in map(_OFFER.match, pub.lines) if m and "yay!" in m.group(3)
        ]
        expected = [f"Hello World! {i}".encode() for i in accepted]
        _poll_until(sub, received, lambda: len(received.payloads) >= len(expected), 10.0)
    finally:
        pub.stop()
    assert len(accepted) >= count - 1, "real publisher never connected to us:\n" + pub.transcript()
    assert received.payloads == expected
    assert received.streams == {stream_id}
    assert len(received.sessions) == 1


@pytest.mark.parametrize(
    ("params", "length", "count"),
    [
        pytest.param({}, 32, 20_000, id="32B-default-many-frames-per-datagram"),
        pytest.param({}, 5_000, 300, id="5000B-default-mtu-fragmented"),
        pytest.param(
            {"term_length": 131072, "mtu": 4096}, 12_000, 300, id="12000B-term128k-mtu4096-rotating"
        ),
        pytest.param(
            {"term_length": 65536, "mtu": 8192}, 8_192, 100, id="8192B-term64k-mtu8192-max-message"
        ),
        pytest.param(
            {
                "term_length": 65536,
                "init_term_id": 2147483645,
                "term_id": 2147483647,
                "term_offset": 0,
            },
            1_000,
            300,
            id="1000B-term64k-term-id-wrap",
        ),
    ],
)
def test_streaming_publisher_to_our_subscription(
    real_driver: RealDriver, our_driver: Driver, params: dict[str, object], length: int, count: int
) -> None:
    """Every message of the real streaming_publisher arrives once, in order, intact.

    streaming_publisher retries each offer until it succeeds, so all ``count`` messages must
    arrive. Its payload is the message index as a little-endian u64 followed by zero bytes.
    """
    port, stream_id = _free_udp_port(), 1002
    sub = our_driver.add_subscription(_channel(port), stream_id)
    received = Received()
    pub = real_driver.run(
        "streaming_publisher",
        "-c",
        _channel(port, **params),
        "-s",
        str(stream_id),
        "-m",
        str(count),
        "-L",
        str(length),
    )
    try:
        _poll_until(sub, received, lambda: len(received.payloads) >= count, _DELIVERY_S)
        pub.wait_exit(_DELIVERY_S)
        pub.drain(_PROCESS_STOP_S)
    finally:
        pub.stop()
    assert pub.proc.returncode == 0, pub.transcript()
    assert len(received.payloads) == count, (
        f"got {len(received.payloads)} of {count} messages; publisher said:\n{pub.transcript()}"
    )
    zeros = bytes(length - 8)
    for i, payload in enumerate(received.payloads):
        assert len(payload) == length, f"message {i}: {len(payload)} bytes"
        assert int.from_bytes(payload[:8], "little") == i, f"message {i} out of order or duplicated"
        assert payload[8:] == zeros, f"message {i}: corrupted body"
    assert received.streams == {stream_id}
    assert len(received.sessions) == 1


# ----------------------------------------------------------------- (b) our pub -> real subscriber

_SUB_READY = re.compile(r"^Subscription channel status (\d+)")
_AVAILABLE = re.compile(
    r"^Available image on \S+ streamId=(-?\d+) sessionId=(-?\d+) "
    r"mtu=(\d+) term-length=(\d+) from (\S+)"
)
_UNAVAILABLE = re.compile(r"^Unavailable image on \S+ streamId=(-?\d+) sessionId=(-?\d+)")
_MESSAGE = re.compile(r"^Message to stream (-?\d+) from session (-?\d+) \((\d+) bytes\) <<(.*)>>$")


def _text_message(i: int, length: int) -> bytes:
    """A printable message (basic_subscriber prints payloads with %.*s: no NUL, no newline)."""
    head = f"msg-{i:06d}:".encode()
    body = bytes(0x21 + (i + k) % 94 for k in range(max(0, length - len(head))))
    return (head + body)[:length]


def _start_real_subscriber(real_driver: RealDriver, channel: str, stream_id: int) -> RealProgram:
    sub = real_driver.run("basic_subscriber", "-c", channel, "-s", str(stream_id))
    status = sub.wait_for_line(_SUB_READY, _CONNECT_S)
    assert status.group(1) == "1", "real subscriber's channel is not ACTIVE:\n" + sub.transcript()
    return sub


def _collect_messages(
    sub: RealProgram, count: int, timeout_s: float
) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        line = sub.next_line(deadline)
        if line is None:
            raise AssertionError(
                f"real subscriber printed {len(out)} of {count} messages:\n" + sub.transcript()
            )
        m = _MESSAGE.match(line)
        if m:
            body = m.group(4).encode()
            assert len(body) == int(m.group(3)), f"printed length mismatch: {line[:200]}"
            out.append((int(m.group(1)), int(m.group(2)), body))
    return out


@pytest.mark.parametrize(
    ("params", "lengths"),
    [
        pytest.param({}, [1, 20, 1376, 1377, 5000, 40] * 5, id="default-mtu-some-fragmented"),
        pytest.param(
            {"term_length": 131072, "mtu": 8192},
            [100, 8160, 8161, 16384] * 4,
            id="term128k-mtu8192",
        ),
        pytest.param({"term_length": 65536}, [1000] * 300, id="term64k-rotating"),
        pytest.param(
            {
                "term_length": 65536,
                "init_term_id": 2147483645,
                "term_id": 2147483647,
                "term_offset": 0,
            },
            [1000] * 200,
            id="term64k-term-id-wrap",
        ),
    ],
)
def test_our_publication_to_basic_subscriber(
    real_driver: RealDriver, our_driver: Driver, params: dict[str, object], lengths: list[int]
) -> None:
    """The real basic_subscriber sees our image with our settings and prints every message."""
    port, stream_id = _free_udp_port(), 1003
    real_sub = _start_real_subscriber(real_driver, _channel(port), stream_id)
    pub = our_driver.add_publication(_channel(port, **params), stream_id)
    try:
        assert pub.wait_until_connected(_CONNECT_S), "real subscriber never sent a status message"
        image = real_sub.wait_for_line(_AVAILABLE, _CONNECT_S)
        assert int(image.group(1)) == stream_id
        assert int(image.group(2)) == pub.session_id
        assert int(image.group(3)) == pub.mtu == int(params.get("mtu", 1408))  # type: ignore[call-overload]
        assert (
            int(image.group(4))
            == pub.term_length
            == int(params.get("term_length", 16 * 1024 * 1024))
        )  # type: ignore[call-overload]
        messages = [_text_message(i, n) for i, n in enumerate(lengths)]
        _offer_all(pub, messages, _DELIVERY_S)
        got = _collect_messages(real_sub, len(messages), _DELIVERY_S)
    finally:
        real_sub.stop()
    assert [body for _, _, body in got] == messages
    assert {(s, sess) for s, sess, _ in got} == {(stream_id, pub.session_id)}


def test_closing_our_publication_makes_real_image_unavailable(
    real_driver: RealDriver, our_driver: Driver
) -> None:
    """Our end-of-stream on close is understood: the real subscriber's image goes unavailable."""
    port, stream_id = _free_udp_port(), 1004
    real_sub = _start_real_subscriber(real_driver, _channel(port), stream_id)
    pub = our_driver.add_publication(_channel(port, linger="1s"), stream_id)
    try:
        assert pub.wait_until_connected(_CONNECT_S), "real subscriber never sent a status message"
        session_id = pub.session_id
        _offer_all(pub, [b"last words"], _DELIVERY_S)
        got = _collect_messages(real_sub, 1, _DELIVERY_S)
        assert got == [(stream_id, session_id, b"last words")]
        pub.close()
        gone = real_sub.wait_for_line(_UNAVAILABLE, 30.0)
    finally:
        real_sub.stop()
    assert (int(gone.group(1)), int(gone.group(2))) == (stream_id, session_id)
