"""A stream server a test kills (``kill -9``) and starts again on the same ports and data
directory: ``aeron-spark server`` in a child process, optionally inside a network namespace
(:mod:`aeron_spark.transport.testing_netns`). For the tests that a client rides through a
restart or a partition (issue 30)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from aeron_spark.transport.testing import sweep_dead

_CODE = "import sys; from aeron_spark.cli import main; sys.exit(main(sys.argv[1:]))"


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port ``p`` with ``p`` and ``p + 1`` free for UDP on ``host`` (a server's handshake and
    control ports)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as first:
            first.bind((host, 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
                return int(port)
    raise OSError(f"no two consecutive free UDP ports on {host}")


class RestartableServer:
    """``aeron-spark server --dir DIRECTORY --host HOST --port PORT`` (no encryption), started
    by :meth:`start`, killed by :meth:`kill`; ``prefix`` runs it inside a namespace (``ip netns
    exec NS``). Use as a context manager: leaving it kills the process."""

    def __init__(
        self,
        directory: str,
        host: str = "127.0.0.1",
        *,
        prefix: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        self.host = host
        self.port = free_port_pair(host if not prefix else "127.0.0.1")
        self.prefix = list(prefix)
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._timers: list[threading.Timer] = []

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def __enter__(self) -> RestartableServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the server and wait (60 s at most) until it listens."""
        self.starts += 1
        log_path = f"{self.directory}.{self.starts}.log"
        argv = [
            *self.prefix,
            sys.executable,
            "-c",
            _CODE,
            "server",
            "--dir",
            self.directory,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--no-encryption",
            *self.extra,
        ]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=dict(os.environ))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(log_path) as fh:
                if "listening on" in fh.read():
                    return
            time.sleep(0.05)
        with open(log_path) as fh:
            tail = fh.read()[-2000:]
        self.kill()
        raise RuntimeError(f"the server did not start (exit {self.proc.poll()}): {tail}")

    def kill(self) -> None:
        """``kill -9`` and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)
            sweep_dead()  # a killed server closes nothing: its IPC logs would stay in /dev/shm

    def restart_later(self, after_s: float) -> None:
        """:meth:`kill` now and :meth:`start` again ``after_s`` seconds later (a thread)."""
        self.kill()
        timer = threading.Timer(after_s, self.start)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def wait_restarted(self, timeout_s: float = 90.0) -> None:
        for timer in self._timers:
            timer.join(timeout_s)
        self._timers.clear()

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
            timer.join(90)
        self._timers.clear()
        self.kill()
        for n in range(1, self.starts + 1):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.directory}.{n}.log")


__all__ = ["RestartableServer", "free_port_pair"]
