"""A Spark standalone cluster (one master, N workers) from the installed PySpark on loopback.

The pip package ships ``bin/spark-class`` but no ``sbin/start-master.sh``; the master and workers
are started as child processes (each in its own process group so it can be stopped with all its
children) with ``SPARK_LOCAL_IP=127.0.0.1``. Readiness is read from the master's JSON status page,
polled with a deadline. Each process dies with the one that started it
(``transport.tests.children``: a killed pytest run left a cluster running). This is what
``docker-compose.yml`` runs, without Docker.

As in containers, each worker has directories of its own (``worker-N/``: its work directory,
Spark's local directories and ``TMPDIR``), and shares with the job only what it is told to: a
worker given ``hidden`` directories runs in its own mount namespace where each of them is covered
by an empty private tmpfs (what a container that does not mount a volume sees at that path: its
own directory, whose writes no other process sees). That needs root (CAP_SYS_ADMIN) and
``unshare`` from util-linux.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from transport.tests import children


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    return Path(pyspark.__file__).parent


def cluster_env(work_dir: Path) -> dict[str, str]:
    """The environment of one cluster process whose own directories are under ``work_dir``."""
    for sub in ("logs", "work", "local", "tmp"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(work_dir / "logs"),
            "SPARK_WORKER_DIR": str(work_dir / "work"),  # executors' working directories
            "SPARK_LOCAL_DIRS": str(work_dir / "local"),  # shuffle and spill files
            "TMPDIR": str(work_dir / "tmp"),  # Python workers' temporary files
            "SPARK_NO_DAEMONIZE": "1",
            # the master's and workers' own JVMs (not the executors'): bookkeeping only, so one
            # GC thread, no C2 compiler, a small heap. Measured (a cluster registered, then 20 s
            # idle, load ~30): 26.1 s of their CPU before, 13.6 s with these; registered in
            # 62 s before, 38 s with them
            "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss512k",
            "SPARK_DAEMON_MEMORY": "256m",
        }
    )
    return env


def can_hide_directories() -> str | None:
    """None when private mounts work here, else why not (a skip reason)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "mount",
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "aeron-spark-probe",
            "/mnt",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"cannot make a private mount namespace here (needs root): {probe.stderr.strip()}"
    return None


def hiding(hidden: list[Path], argv: list[str]) -> list[str]:
    """``argv`` run in a mount namespace of its own where each of ``hidden`` is an empty tmpfs."""
    if not hidden:
        return argv
    mounts = " && ".join(
        f"mount -t tmpfs -o size=512m,mode=0755 aeron-spark-hidden {shlex.quote(str(d))}"
        for d in hidden
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f"{mounts} && exec {shlex.join(argv)}",
    ]


@dataclass
class StandaloneCluster:
    work_dir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    master_port: int = field(default_factory=free_port)
    web_port: int = field(default_factory=free_port)
    # per worker: host directories it must not see (each covered by its own private tmpfs)
    hidden: list[list[Path]] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, args: list[str], hidden: list[Path] | None = None) -> None:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        for d in hidden or []:
            d.mkdir(parents=True, exist_ok=True)  # the mount point
        proc = children.popen(  # dies with the test process, even a SIGKILLed one
            hiding(hidden or [], cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cluster_env(self.work_dir / name),
            start_new_session=True,
        )
        log.close()
        self.processes.append(proc)

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.web_port),
            ],
        )
        for i in range(self.workers):
            self._spawn(
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--webui-port",
                    str(free_port()),
                    self.master_url,
                ],
                self.hidden[i] if i < len(self.hidden) else None,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(
                        f"a cluster process exited early; see logs in {self.work_dir}"
                    )
            if self.alive_workers() >= self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"{self.workers} workers did not register within {timeout_s} s; logs in {self.work_dir}"
        )

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=2) as r:
                status = json.load(r)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.processes:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
