"""One SparkSession for the whole test session, and stream servers on loopback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


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
