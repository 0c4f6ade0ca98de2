"""A Spark standalone cluster (one master, N workers) started from the installed PySpark on loopback.

The pip package ships ``bin/spark-class`` but no ``sbin/start-master.sh``; the master and workers
are started as child processes (each in its own process group so it can be stopped with all its
children) with ``SPARK_LOCAL_IP=127.0.0.1``. Readiness is read from the master's JSON status page,
polled with a deadline. This is what ``docker-compose.yml`` runs, without Docker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    return Path(pyspark.__file__).parent


def cluster_env(work_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(work_dir / "logs"),
            "SPARK_WORKER_DIR": str(work_dir / "work"),
            "SPARK_NO_DAEMONIZE": "1",
        }
    )
    return env


@dataclass
class StandaloneCluster:
    work_dir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    master_port: int = field(default_factory=free_port)
    web_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cluster_env(self.work_dir),
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
