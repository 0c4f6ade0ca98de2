"""Sink staging and exactly-once commits through a real server (issue 7's server side)."""

from __future__ import annotations

import os
import time

import pytest

from aeron_spark.connector.errors import (
    ControlProtocolError,
    NotAuthorisedError,
    StagedDataMissingError,
)
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import client_for, messages_of

STREAM = 20


def _config(tmp_path, **kw) -> ServerConfig:
    return ServerConfig(
        directory=str(tmp_path / "srv"),
        port=0,
        encryption=False,
        term_length=1024 * 1024,
        mtu=4096,
        **kw,
    )


def _stream_payloads(client, stream_id=STREAM) -> list[bytes]:
    out: list[bytes] = []
    for rec in client.list_recordings([stream_id]):
        blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
        out += [m.payload for m in messages_of(blocks, rec.initial_term_id, rec.term_length)]
    return out


def _staged_parts(config: ServerConfig) -> dict[str, bytes]:
    """The sink's staged part files (a commit deletes them; a crash before "done" would not)."""
    saved = {}
    for root, _dirs, files in os.walk(os.path.join(config.directory, "sink", "staged")):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                saved[os.path.join(root, name)] = fh.read()
    return saved


def _rewind_to_begin(config: ServerConfig, saved: dict[str, bytes]) -> None:
    """The commit log back to the last commit's "begin" (its "done" dropped) and the staged
    parts ``saved`` back in place: a server crashed in the middle of that commit."""
    from aeron_spark.connector.server.commitlog import CommitLog

    log_path = os.path.join(config.directory, "sink", "commit.log")
    records = CommitLog(log_path).records
    assert [r["t"] for r in records] == ["begin", "done"]
    os.unlink(log_path)
    rewound = CommitLog(log_path)
    rewound.append(records[0])
    rewound.close()
    for path, data in saved.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)


def _cut_inside_a_frame(config: ServerConfig, appended: dict) -> None:
    """Half of what a commit ``appended`` to a recording (its result, or one of its streams')
    off the recording's segment, cut inside a frame."""
    rec_dir = os.path.join(config.directory, "recordings", str(appended["recording_id"]))
    (segment,) = [n for n in os.listdir(rec_dir) if n.endswith(".seg")]
    middle = (appended["start_position"] + appended["end_position"]) // 2 + 7
    os.truncate(os.path.join(rec_dir, segment), middle - int(segment[:-4]))


def test_commit_appends_in_partition_order_once(tmp_path) -> None:
    with StreamServer(_config(tmp_path)) as srv, client_for(srv.endpoint) as c:
        assert c.last_committed_batch("q1") is None
        staged = [
            c.stage("q1", 0, p, 0, STREAM, [f"b0-p{p}-{i}".encode() for i in range(3)])
            for p in (2, 0, 1)
        ]
        # a failed first attempt of partition 1 and a speculative duplicate: never committed
        dead = c.stage("q1", 0, 1, 7, STREAM, [b"dead attempt"])
        first = c.commit("q1", 0, STREAM, staged)
        assert first["count"] == 9
        again = c.commit("q1", 0, STREAM, staged)  # e.g. after a driver restart
        assert again == first
        assert c.last_committed_batch("q1") == 0
        assert _stream_payloads(c) == [f"b0-p{p}-{i}".encode() for p in (0, 1, 2) for i in range(3)]
        # the batch's directory, dead attempt included, is gone after the commit
        with pytest.raises(StagedDataMissingError):
            c.commit("q1", 1, STREAM, [dict(dead, batch_id=1)])
        assert c.latest_positions([STREAM]) == {first["recording_id"]: first["end_position"]}


def test_commit_survives_a_server_restart_and_stays_idempotent(tmp_path) -> None:
    config = _config(tmp_path)
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        staged = [c.stage("q", 5, 0, 0, STREAM, [b"x", b"y"])]
        result = c.commit("q", 5, STREAM, staged)
        pending = [c.stage("q", 6, 0, 0, STREAM, [b"z"])]
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        assert c.last_committed_batch("q") == 5
        assert c.commit("q", 5, STREAM, staged) == result  # no second append
        c.commit("q", 6, STREAM, pending)  # staged before the restart, committed after
        assert _stream_payloads(c) == [b"x", b"y", b"z"]


def test_abort_discards_and_commit_of_aborted_part_is_refused(tmp_path) -> None:
    with StreamServer(_config(tmp_path)) as srv, client_for(srv.endpoint) as c:
        staged = [c.stage("q", 1, 0, 0, STREAM, [b"never"])]
        c.abort("q", 1, staged)
        with pytest.raises(StagedDataMissingError):
            c.commit("q", 1, STREAM, staged)
        with pytest.raises(NotAuthorisedError):  # a commit may only name its own batch's parts
            c.commit("q", 2, STREAM, staged)
        assert _stream_payloads(c) == []


def test_unnamed_parts_are_garbage_collected_after_their_lease(tmp_path) -> None:
    config = _config(tmp_path, staging_lease_s=0.2, gc_interval_ns=50_000_000)
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        c.stage("q", 9, 0, 0, STREAM, [b"orphan"])  # its task died before the commit
        staged_root = os.path.join(config.directory, "sink", "staged")
        deadline = time.monotonic() + 30
        while os.listdir(staged_root) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(staged_root) == []
        assert c.stats()["counters"]["sink_parts_garbage_collected"] >= 1


def test_large_stage_is_chunked_and_committed(tmp_path) -> None:
    with StreamServer(_config(tmp_path)) as srv, client_for(srv.endpoint) as c:
        big = [os.urandom(100_000) for _ in range(40)]  # 4 MB: several requests, large messages
        staged = c.stage("big", 0, 0, 0, STREAM, big)
        assert staged["count"] == 40 and staged["bytes"] == 4_000_000
        c.commit("big", 0, STREAM, [staged])
        assert _stream_payloads(c) == big


def test_a_commit_torn_by_a_crash_is_completed_exactly_once_on_restart(tmp_path) -> None:
    config = _config(tmp_path)
    payloads = {p: [f"p{p}-{i}".encode() * 20 for i in range(2000)] for p in range(3)}
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        staged = [c.stage("q", 0, p, 0, STREAM, payloads[p]) for p in range(3)]
        # keep copies of the parts: the commit deletes them, a crash before "done" would not
        saved = _staged_parts(config)
        result = c.commit("q", 0, STREAM, staged)
    # Rewind to "crashed in the middle of the commit": the log has "begin" but not "done", half
    # of the frames reached the segment (cut inside a frame), the staged parts are still there.
    _rewind_to_begin(config, saved)
    _cut_inside_a_frame(config, result)
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        assert c.last_committed_batch("q") == 0
        assert c.commit("q", 0, STREAM, staged) == result
        assert _stream_payloads(c) == payloads[0] + payloads[1] + payloads[2]
        assert c.stats()["counters"]["sink_resumed_commits"] == 1


def test_a_commit_of_several_streams_appends_each_streams_parts_once(tmp_path) -> None:
    """Issue 32: a routing sink stages one part per stream and commits them together (no
    stream_id in the commit); each stream's recording gets its rows, in partition order, once."""
    with StreamServer(_config(tmp_path)) as srv, client_for(srv.endpoint) as c:
        staged = [
            c.stage("r", 0, p, 0, s, [f"s{s}-p{p}-{i}".encode() for i in range(3)])
            for p in (1, 0)
            for s in (31, 32)
        ]
        first = c.commit("r", 0, None, staged)
        assert first["count"] == 12
        assert [(t["stream_id"], t["count"]) for t in first["streams"]] == [(31, 6), (32, 6)]
        assert c.commit("r", 0, None, staged) == first  # a replayed commit appends nothing
        for s in (31, 32):
            assert _stream_payloads(c, s) == [
                f"s{s}-p{p}-{i}".encode() for p in (0, 1) for i in range(3)
            ]
        positions = c.latest_positions([31, 32])
        assert positions == {t["recording_id"]: t["end_position"] for t in first["streams"]}
        # one partition's parts must all come from one attempt
        mixed = [c.stage("r", 1, 0, 0, 31, [b"a"]), c.stage("r", 1, 0, 1, 32, [b"b"])]
        with pytest.raises(ControlProtocolError, match="two attempts of partition 0"):
            c.commit("r", 1, None, mixed)
        # a commit naming one stream still refuses another stream's part (old clients' check)
        with pytest.raises(ControlProtocolError, match="staged for stream 32"):
            c.commit("r", 1, 31, mixed)


def test_a_commit_of_several_streams_torn_by_a_crash_is_completed_on_restart(tmp_path) -> None:
    config = _config(tmp_path)
    payloads = {s: [f"s{s}-{i}".encode() * 20 for i in range(2000)] for s in (31, 32)}
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        staged = [c.stage("q", 0, 0, 0, s, payloads[s]) for s in (31, 32)]
        saved = _staged_parts(config)
        result = c.commit("q", 0, None, staged)
    # crashed after stream 31's frames and half of stream 32's, before "done"
    _rewind_to_begin(config, saved)
    _cut_inside_a_frame(config, result["streams"][1])
    with StreamServer(config) as srv, client_for(srv.endpoint) as c:
        assert c.commit("q", 0, None, staged) == result
        for s in (31, 32):
            assert _stream_payloads(c, s) == payloads[s]
        assert c.stats()["counters"]["sink_resumed_commits"] == 1
