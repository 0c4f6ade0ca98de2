"""Short-circuit reads from the server's segment files, against replays over real loopback
sessions."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

from aeron_spark.connector.errors import (
    ErrorCode,
    NotAuthorisedError,
    NotFrameBoundaryError,
    PositionOutOfRangeError,
    PurgedError,
    ServerError,
    UnknownRecordingError,
)
from aeron_spark.connector.formats import Geometry, batches_from_blocks
from aeron_spark.connector.local import read_blocks
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.store import LOCAL_READ_TOKEN
from aeron_spark.connector.server.testing import client_for, messages_of
from aeron_spark.transport.archive import Recording
from aeron_spark.transport.archive import errors as archive_errors

STREAM = 10
TERM = 1024 * 1024


def _server(tmp_path, **kw) -> StreamServer:
    config = ServerConfig(
        directory=str(tmp_path / "srv"), port=0, encryption=False, term_length=TERM, mtu=4096, **kw
    )
    return StreamServer(config)


def _publish(server: StreamServer, count: int = 20_000, seed: int = 3):
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.choice([0, 17, 116, 900, 5000, 20_000])) for _ in range(count)]
    with client_for(server.endpoint) as c:
        for i in range(0, count, 2000):  # several appends: several time-index entries
            c.publish(STREAM, payloads[i : i + 2000], reserved_values=range(i, i + 2000))
        (rec,) = c.list_recordings([STREAM])
    return rec, payloads


def _rows(blocks, rec) -> pa.Table:
    geometry = Geometry(rec.initial_term_id, rec.term_length)
    return pa.Table.from_batches(
        list(batches_from_blocks(blocks, rec.recording_id, geometry, False))
    )


def test_local_reads_give_the_rows_a_replay_gives(tmp_path) -> None:
    with _server(tmp_path) as server:
        rec, payloads = _publish(server)
        assert rec.recorded_position > 3 * TERM  # the ranges below cross terms
        with client_for(server.endpoint) as c:
            replayed = messages_of(
                c.replay(rec.recording_id, rec.start_position, rec.recorded_position),
                rec.initial_term_id,
                rec.term_length,
            )
            assert [m.payload for m in replayed] == payloads
            bounds = [m.position for m in replayed] + [rec.recorded_position]
            rng = random.Random(5)
            ranges = [(bounds[0], bounds[-1])] + [
                tuple(sorted(rng.sample(bounds, 2))) for _ in range(6)
            ]
            for start, end in ranges:
                local = _rows(c.read_range(rec.recording_id, start, end), rec)
                remote = _rows(c.read_range(rec.recording_id, start, end, local=False), rec)
                assert local.num_rows == bounds.index(end) - bounds.index(start)
                assert local.equals(remote)  # values, positions, timestamps, reserved values
            assert c.local_reads == len(ranges) and c.replays == len(ranges)
            stats = c.stats()
        assert stats["counters"]["local_reads_offered"] == len(ranges)


def test_a_reader_that_does_not_see_the_servers_files_replays(tmp_path) -> None:
    with _server(tmp_path) as server:
        rec, payloads = _publish(server, count=500)
        token_path = os.path.join(server.config.directory, LOCAL_READ_TOKEN)
        with open(token_path, "w") as fh:  # what another host's file at that path would hold
            fh.write("someone else's token")
        with client_for(server.endpoint) as c:
            blocks = c.read_range(rec.recording_id, rec.start_position, rec.recorded_position)
            got = messages_of(blocks, rec.initial_term_id, rec.term_length)
            assert [m.payload for m in got] == payloads
            assert (c.local_reads, c.replays) == (0, 1)


@pytest.mark.parametrize("writes", [True, False])
def test_a_server_with_local_reads_off_says_nowhere(tmp_path, writes) -> None:
    with _server(tmp_path, local_reads=False, local_writes=writes) as server:
        rec, payloads = _publish(server, count=500)
        token = os.path.join(server.config.directory, LOCAL_READ_TOKEN)
        assert os.path.exists(token) == writes  # left only when nothing local is allowed
        with client_for(server.endpoint) as c:
            assert c.call("local_read", recording_id=rec.recording_id, start=0, end=0) is None
            blocks = c.read_range(rec.recording_id, rec.start_position, rec.recorded_position)
            assert [m.payload for m in messages_of(blocks, rec.initial_term_id, TERM)] == payloads
            assert (c.local_reads, c.replays) == (0, 1)
            # the call above and read_range
            assert c.stats()["counters"]["local_reads_refused"] == 2


def test_the_server_checks_a_local_range_as_it_checks_a_replay(tmp_path) -> None:
    with _server(tmp_path) as server:
        rec, _ = _publish(server, count=500)
        with client_for(server.endpoint) as c:
            with pytest.raises(NotFrameBoundaryError):
                c.read_range(rec.recording_id, rec.start_position + 32, rec.recorded_position)
            with pytest.raises(PositionOutOfRangeError):
                c.read_range(rec.recording_id, 0, rec.recorded_position + 4096)
            assert c.local_reads == 0
    # the same directory served with only another stream allowed
    with _server(tmp_path, allowed_stream_ids=frozenset({STREAM + 1})) as server:
        with client_for(server.endpoint) as c:
            with pytest.raises(NotAuthorisedError, match=f"stream {STREAM}"):
                c.read_range(rec.recording_id, rec.start_position, rec.recorded_position)
            assert c.local_reads == 0


def test_a_segment_purged_after_the_check_is_reported_as_purged(tmp_path) -> None:
    with _server(tmp_path) as server:
        rec, _ = _publish(server, count=500)
        with client_for(server.endpoint) as c:
            blocks = c.read_range(rec.recording_id, rec.start_position, rec.recorded_position)
            directory = os.path.join(server.config.directory, "recordings", str(rec.recording_id))
            # what a purge does to a segment between the server's check and the read
            for name in os.listdir(directory):
                if name.endswith(".seg"):
                    os.unlink(os.path.join(directory, name))
            with pytest.raises(PurgedError, match="gone"):
                next(iter(blocks))


def test_read_only_recordings_read_what_the_writer_reads_and_cannot_write(tmp_path) -> None:
    with _server(tmp_path) as server:
        rec, _ = _publish(server, count=300)
        directory = os.path.join(server.config.directory, "recordings", str(rec.recording_id))
        reader = Recording.open_read_only(directory)
        try:
            end, frames, ts = reader.read(rec.start_position, 64 * 1024, rec.recorded_position)
            with client_for(server.endpoint) as c:
                first = next(iter(c.replay(rec.recording_id, rec.start_position, end)))
            assert (bytes(first.data), first.timestamp_ns, first.end_position) == (
                frames,
                ts,
                end,
            )
            with reader._segment(0) as fd, pytest.raises(OSError):
                os.write(fd, b"x")
        finally:
            reader.close()
        with pytest.raises(archive_errors.UnknownRecordingError, match="no recording") as info:
            Recording.open_read_only(str(tmp_path / "nothing"))
        assert type(info.value) is archive_errors.UnknownRecordingError
        # through the connector the archive's error is the wire's own, with its code
        with pytest.raises(UnknownRecordingError, match="no recording") as coded:
            list(read_blocks(str(tmp_path / "nothing"), rec.recording_id, 0, 64))
        assert type(coded.value) is UnknownRecordingError
        assert coded.value.code is ErrorCode.UNKNOWN_RECORDING
        with pytest.raises(ServerError, match="holds recording") as wrong:
            list(read_blocks(directory, rec.recording_id + 1, 0, 64))
        assert type(wrong.value) is ServerError and wrong.value.code is ErrorCode.INTERNAL
