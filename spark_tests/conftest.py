"""One SparkSession for the whole test session, and stream servers on loopback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every Spark driver JVM these tests start (the session below, and the examples, the cluster's
# job, the README tour and the Connect server in processes of their own: spark-submit reads it):
# the client compiler only (C2 compiling Spark's code paths of a short test costs more CPU than it
# saves on a 2-core machine) and one GC thread. Measured on three tests of test_source_sink.py at
# load ~10-13: the driver JVM's CPU 30.7 s before, 13.5 s with these.
# java.io.tmpdir and Spark's local directories in the run's own temporary directory (the root
# conftest's TMPDIR, removed with the run): Spark's drivers made spark-*, blockmgr-* and
# liblz4-java-* in /tmp, which Java's default ignores TMPDIR for, and a driver a test kills
# left them there for good (dozens on the project's machine).
# A user's own values are kept; values a parent pytest process set here (the controller of a
# parallel run: its workers inherit its environment) are replaced by this process's, so each
# worker's Spark files land in its own run directory, checked and removed with it.
_RUN_TMP = os.environ.get("TMPDIR", "/tmp")
_SET_MARK = "AERON_SPARK_TEST_SPARK_ENV"  # "<name>=<value>" lines of what a conftest set
_ours = {
    "SPARK_SUBMIT_OPTS": f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.io.tmpdir={_RUN_TMP}",
    "SPARK_LOCAL_DIRS": _RUN_TMP,
}
_set_by_parent = set(os.environ.get(_SET_MARK, "").splitlines())
_set_here = []
for _name, _value in _ours.items():
    if _name not in os.environ or f"{_name}={os.environ[_name]}" in _set_by_parent:
        os.environ[_name] = _value
        _set_here.append(f"{_name}={_value}")
os.environ[_SET_MARK] = "\n".join(_set_here)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")  # 4 attempts per task: failed tasks are retried
        .appName("aeron-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from aeron_spark.connector.datasource import ensure_registered

    ensure_registered(session)  # a no-op for a regular install (README, CI): Spark finds it itself
    yield session
    session.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[object]:
    from aeron_spark.connector.server import ServerConfig, StreamServer

    with StreamServer(
        ServerConfig(directory=str(tmp_path / "server"), port=0, term_length=1024 * 1024, mtu=8192)
    ) as srv:
        yield srv
