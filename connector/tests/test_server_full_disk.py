"""The stream server on a small file system that fills up (issue 15, part 1): publishes, stages
and commits fail with a coded STORAGE_FULL error, nothing acknowledged is lost (also after a
restart), every other session keeps being served, the server keeps running, and publishing
resumes on the same session once space is freed. A real tmpfs is mounted for each test."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from aeron_spark.connector.client import StreamClient
from aeron_spark.connector.errors import ConnectorError
from aeron_spark.connector.server.cli import build_parser, config_from_args
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.stat import render
from aeron_spark.connector.server.testing import client_for, messages_of, server_process
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.testing import MountUnavailable, fill, small_tmpfs

STREAM = 10
STORAGE_FULL = 14  # ErrorCode.STORAGE_FULL on the wire
MIB = 1024 * 1024


def msgs(start: int, count: int) -> list[bytes]:
    return [b"m%08d-" % i + b"x" * 990 for i in range(start, start + count)]


@pytest.fixture
def tmpfs() -> Iterator[str]:
    try:
        with small_tmpfs(4 * MIB) as path:
            yield path
    except MountUnavailable as exc:
        pytest.skip(str(exc))


def replayed(client: StreamClient, source_prefix: str = "session:") -> list[bytes]:
    out: list[bytes] = []
    for rec in client.list_recordings([STREAM]):
        if rec.source.startswith(source_prefix) and rec.recorded_position > rec.start_position:
            blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            out += [m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)]
    return out


def publish_until_refused(client: StreamClient, first: int) -> tuple[int, ConnectorError]:
    """Publish batches of 50 until the server refuses one; (messages acknowledged, error)."""
    acked = first
    for _ in range(400):
        try:
            client.publish(STREAM, msgs(acked, 50))
        except ConnectorError as exc:
            return acked, exc
        acked += 50
    raise AssertionError("the file system never filled up")


def wait_for(condition, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_full_disk_refuses_publishes_coded_keeps_serving_and_loses_nothing_acknowledged(
    tmpfs: str,
) -> None:
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as reader:
        publisher = client_for(endpoint)
        publisher.publish(STREAM, msgs(0, 50))
        filler = fill(tmpfs, leave_bytes=700_000)
        acked, error = publish_until_refused(publisher, 50)

        assert proc.poll() is None, "the server died"
        # every other session goes on: it replays exactly what was acknowledged
        assert replayed(reader) == msgs(0, acked), "acknowledged messages are not on disk"
        assert error.code == STORAGE_FULL, f"not a coded STORAGE_FULL error: {error!r}"
        assert error.details["directory"] == os.path.abspath(tmpfs)
        assert 0 <= error.details["free_bytes"] < 64 * 1024
        # the refused session is refused again, coded (its position did not move on)
        with pytest.raises(ConnectorError) as again:
            publisher.publish(STREAM, msgs(acked, 50))
        assert again.value.code == STORAGE_FULL
        stats = reader.stats()
        assert stats["counters"]["storage_full_errors"] >= 2
        assert stats["storage"]["directory"] == os.path.abspath(tmpfs)

        os.unlink(filler)  # space again: the same session resumes without a restart
        publisher.publish(STREAM, msgs(acked, 50))
        acked += 50
        assert replayed(reader) == msgs(0, acked)

        filler = fill(tmpfs)  # full to the last byte, then the publisher goes away
        publisher.close()
        wait_for(
            lambda: all(r.stop_position is not None for r in reader.list_recordings([STREAM])),
            "the closed session's recording to stop",
        )
        assert proc.poll() is None, "closing a session on a full disk killed the server"
        assert replayed(reader) == msgs(0, acked)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    # a restart on the still full disk: it starts, serves what was acknowledged, refuses appends
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
        assert replayed(client) == msgs(0, acked)  # nothing acknowledged was lost
        with pytest.raises(ConnectorError) as refused:
            client.publish(STREAM, msgs(acked, 50))
        assert refused.value.code == STORAGE_FULL
        os.unlink(filler)
        client.publish(STREAM, msgs(acked, 50))
        assert replayed(client) == msgs(0, acked + 50)
        assert proc.poll() is None


@pytest.mark.slow
def test_below_min_free_bytes_appends_are_refused_before_the_disk_is_full(tmpfs: str) -> None:
    with (
        server_process(tmpfs, ["--min-free-bytes", "1M"]) as (proc, endpoint),
        client_for(endpoint) as client,
    ):
        client.publish(STREAM, msgs(0, 50))
        filler = fill(tmpfs, leave_bytes=1_500_000)
        acked, error = publish_until_refused(client, 50)
        assert error.code == STORAGE_FULL
        assert error.details["reason"] == "WATERMARK"
        assert error.details["min_free_bytes"] == MIB
        assert MIB - 64 * 1024 <= error.details["free_bytes"] < MIB  # refused before full
        storage = client.stats()["storage"]
        assert storage["below_watermark"] is True and storage["min_free_bytes"] == MIB
        text = render(client.stats())
        assert "--min-free-bytes 1.0 MiB" in text and "BELOW THE WATERMARK" in text
        assert "open files" in text
        os.unlink(filler)
        client.publish(STREAM, msgs(acked, 50))
        assert replayed(client) == msgs(0, acked + 50)
        assert proc.poll() is None


@pytest.mark.slow
def test_stage_and_commit_on_a_full_disk_fail_coded_and_commit_once_when_retried(
    tmpfs: str,
) -> None:
    payloads = msgs(0, 400)  # ~400 KB
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
        staged = client.stage("sink-a", 0, 0, 0, STREAM, payloads, local=False)
        filler = fill(tmpfs)
        with pytest.raises(ConnectorError) as stage_error:
            client.stage("sink-a", 1, 0, 0, STREAM, msgs(0, 400), local=False)
        assert stage_error.value.code == STORAGE_FULL
        with pytest.raises(ConnectorError) as commit_error:
            client.commit("sink-a", 0, STREAM, [staged])
        assert commit_error.value.code == STORAGE_FULL
        assert client.last_committed_batch("sink-a") is None
        assert replayed(client, "sink:") == []  # nothing of the failed commit is visible
        assert proc.poll() is None
        os.unlink(filler)
        result = client.commit("sink-a", 0, STREAM, [staged])  # the retry commits it once
        assert result["count"] == len(payloads)
        assert replayed(client, "sink:") == payloads
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    with server_process(tmpfs) as (_proc, endpoint), client_for(endpoint) as client:
        assert replayed(client, "sink:") == payloads
        assert client.last_committed_batch("sink-a") == 0


def test_min_free_bytes_takes_sizes_with_units_and_refuses_nonsense() -> None:
    parse = build_parser().parse_args
    assert config_from_args(parse(["--dir", "d"])).min_free_bytes == 0
    for text, value in (("4096", 4096), ("512M", 512 * MIB), ("2G", 2048 * MIB), ("64KiB", 65536)):
        assert config_from_args(parse(["--dir", "d", "--min-free-bytes", text])).min_free_bytes == (
            value
        )
    with pytest.raises(SystemExit):
        parse(["--dir", "d", "--min-free-bytes", "lots"])
    with pytest.raises(ConfigurationError, match="min_free_bytes"):
        ServerConfig(directory="d", min_free_bytes=-1)


def _consumers(client: StreamClient) -> dict[str, dict[str, int]]:
    return {c["consumer_id"]: c["positions"] for c in client.stats()["consumers"]}


@pytest.mark.slow
def test_a_consumer_commit_that_cannot_be_written_leaves_the_old_positions(tmpfs: str) -> None:
    """``consumers.msgpack`` on a full disk: a consumer_commit or consumer_forget answered with
    STORAGE_FULL changed nothing, in memory (what the server shows and retention honours) or
    after a restart. Before, the registry changed its positions (and added or dropped the
    consumer) first and wrote the file after: the client was told "error" while the server
    went on with the new positions, and a restart brought the old ones back."""
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
        client.publish(STREAM, msgs(0, 3))
        (rec,) = client.list_recordings([STREAM])
        rid, end = rec.recording_id, rec.recorded_position
        client.consumer_commit("kept", [STREAM], {rid: rec.start_position})
        client.consumer_commit("forgotten", [STREAM], {rid: rec.start_position})
        before = _consumers(client)
        filler = fill(tmpfs)  # to the last byte: the registry's next write fails
        for call in (
            lambda: client.consumer_commit("kept", [STREAM], {rid: end}),
            lambda: client.consumer_commit("new", [STREAM], {rid: end}),
            lambda: client.consumer_forget("forgotten"),
        ):
            with pytest.raises(ConnectorError) as refused:
                call()
            assert refused.value.code == STORAGE_FULL, f"not STORAGE_FULL: {refused.value!r}"
            # the client was told "error": the server holds the old positions, no new
            # consumer and the one it did not forget
            assert _consumers(client) == before
        assert client.stats()["counters"]["consumer_commits"] == 2  # the refused not counted
        assert not os.path.exists(os.path.join(tmpfs, "consumers.msgpack.tmp"))
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    os.unlink(filler)
    with server_process(tmpfs) as (proc, endpoint), client_for(endpoint) as client:
        assert _consumers(client) == before  # after a restart too
        client.consumer_commit("kept", [STREAM], {rid: end})  # room again: it is taken
        assert _consumers(client)["kept"] == {str(rid): end}
