"""One server per data directory: a second server on the same ``--dir`` is refused at start,
with an error naming the directory and the pid holding it, and the first keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from aeron_spark.connector.errors import DirectoryInUseError, ServerUnavailableError
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import client_for, server_process


def _config(directory: str) -> ServerConfig:
    return ServerConfig(
        directory=directory, port=0, encryption=False, term_length=1024 * 1024, mtu=8192
    )


def test_second_server_in_process_is_refused_and_first_keeps_serving(tmp_path) -> None:
    directory = str(tmp_path / "data")
    with StreamServer(_config(directory)) as first:
        second = StreamServer(_config(directory))
        with pytest.raises(DirectoryInUseError) as info:
            second.start()
        err = info.value
        assert isinstance(err, ServerUnavailableError)  # what a failed start() raises
        assert directory in str(err) and f"pid {os.getpid()}" in str(err)
        assert err.directory == directory and err.pid == os.getpid()
        second.close()  # nothing to close: it never started
        with client_for(first.endpoint) as client:  # the first one was not disturbed
            end = client.publish(10, [b"x" * 100] * 50)
            (rec,) = client.list_recordings(stream_ids=[10])
            assert rec.recorded_position == end
    # released at close: the directory can be served again, with what was recorded
    with StreamServer(_config(directory)) as again:
        with client_for(again.endpoint) as client:
            (rec,) = client.list_recordings(stream_ids=[10])
            assert rec.recorded_position == end


def _cli_server(directory: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "aeron_spark.cli",
            "server",
            "--dir",
            directory,
            "--port",
            "0",
            "--no-encryption",
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.mark.slow
def test_second_server_process_exits_1_naming_directory_and_holder(tmp_path) -> None:
    directory = str(tmp_path / "data")
    with server_process(directory) as (first, endpoint):
        with client_for(endpoint) as client:
            end = client.publish(10, [b"y" * 200] * 100)
        second = _cli_server(directory)  # would run forever if it were allowed to start
        assert second.returncode == 1, second.stderr
        assert "in use by another stream server" in second.stderr
        assert directory in second.stderr and f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None
        with client_for(endpoint) as client:  # the first one still serves what it recorded
            (rec,) = client.list_recordings(stream_ids=[10])
            assert rec.recorded_position == end
            second_end = client.publish(10, [b"z"])  # a new session: a second recording
        first.send_signal(signal.SIGKILL)  # the kernel drops the lock of a dead process
        first.wait(30)
    with server_process(directory) as (_, endpoint):
        with client_for(endpoint) as client:
            recs = client.list_recordings(stream_ids=[10])
            assert sorted(r.recorded_position for r in recs) == sorted([end, second_end])
