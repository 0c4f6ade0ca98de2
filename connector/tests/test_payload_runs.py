"""The sink's vectorised payload runs give exactly the bytes the per-row path gives: the same
staging records, the same cuts into requests, the same payloads over a session."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient, batched
from aeron_spark.connector.formats import payload_run_from_batch, payloads_from_batch
from aeron_spark.connector.local import write_part
from aeron_spark.connector.runs import PayloadRun
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.session.records import PayloadBuffers, records
from aeron_spark.errors import ConfigurationError


def _joined(pieces: list) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def _batch(values: list, value_type: pa.DataType, reserved: list | None) -> pa.RecordBatch:
    arrays = [pa.array(values, value_type)]
    names = ["value"]
    if reserved is not None:
        arrays.append(pa.array(reserved, pa.int64()))
        names.append("reserved_value")
    return pa.RecordBatch.from_arrays(arrays, names=names)


CASES = {
    "equal lengths": ([b"%03d" % i * 38 + b"xy" for i in range(200)], pa.binary(), None),
    "equal lengths, reserved": (
        [bytes([i % 256]) * 116 for i in range(100)],
        pa.binary(),
        list(range(-50, 50)),
    ),
    "mixed lengths, nulls, empty": (
        [b"a", None, b"", b"bcd" * 100, None, b"e" * 70_000],
        pa.binary(),
        [1, None, 3, 2**62, -1, 0],
    ),
    "text, multibyte, null": (["é", "", None, "日本語" * 10, "x"], pa.string(), None),
    "one payload": ([b"only"], pa.binary(), [7]),
    "large binary": ([b"a" * 10, None, b"bb"], pa.large_binary(), [1, 2, 3]),
    "large string": (["é", None, "xyz"], pa.large_string(), None),
    "none": ([], pa.binary(), []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_lays_out_the_same_records_as_the_payload_list(case: str) -> None:
    values, value_type, reserved = CASES[case]
    batch = _batch(values, value_type, reserved)
    fmt = "text" if value_type in (pa.string(), pa.large_string()) else "binary"
    payloads, rvs = payloads_from_batch(batch, fmt)
    run = payload_run_from_batch(batch)
    assert run.payloads() == payloads
    assert run.reserved_list() == rvs
    assert run.nbytes == sum(map(len, payloads))
    assert _joined(records(run, None)) == _joined(records(payloads, rvs))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_sliced_run_lays_out_its_own_records(case: str) -> None:
    """A slice (an Arrow array with a non-zero offset) reads its own offsets and bytes."""
    values, value_type, reserved = CASES[case]
    batch = _batch(values, value_type, reserved)
    fmt = "text" if value_type in (pa.string(), pa.large_string()) else "binary"
    payloads, rvs = payloads_from_batch(batch, fmt)
    run = payload_run_from_batch(batch)
    for start in range(len(payloads)):
        for stop in (start + 1, len(payloads)):
            piece = run.slice(start, stop)
            assert piece.payloads() == payloads[start:stop]
            want = records(payloads[start:stop], None if rvs is None else rvs[start:stop])
            assert _joined(records(piece, None)) == _joined(want)


@pytest.mark.parametrize(
    "limit,overhead,max_count",
    [(1024, 0, 0), (1024, 16, 0), (120, 16, 0), (50, 0, 0), (10, 3, 0), (1024, 0, 7), (10, 3, 2)],
)
def test_batched_cuts_a_run_where_it_cuts_the_payload_list(
    limit: int, overhead: int, max_count: int
) -> None:
    payloads = [b"x" * (i % 37) for i in range(300)] + [b"y" * 500] + [b"z" * 5] * 40
    rvs = list(range(len(payloads)))
    run = PayloadRun.from_columns(pa.array(payloads, pa.binary()), pa.array(rvs, pa.int64()))
    want = [(b, r) for b, r in batched(payloads, rvs, limit, overhead, max_count) if b]
    got = [
        (piece.payloads(), piece.reserved_list())
        for piece, none in batched([run], None, limit, overhead, max_count)
        if not isinstance(piece, list) or piece
    ]
    assert got == want
    if max_count:  # a request carries at most the payloads the server takes (issue 28)
        assert max(len(b) for b, _ in want) == max_count


def test_batched_keeps_order_around_runs_and_always_gives_a_batch() -> None:
    run = PayloadRun.from_columns(pa.array([b"b", b"c"], pa.binary()), None)
    got = [
        b if isinstance(b, list) else b.payloads()
        for b, _ in batched([b"a", run, b"d"], None, 1024)
    ]
    assert got == [[b"a"], [b"b", b"c"], [b"d"]]
    assert list(batched([], None, 1024)) == [([], None)]
    empty = PayloadRun.from_columns(pa.array([], pa.binary()), None)
    assert [b for b, _ in batched([empty], None, 1024) if len(b)] == []
    with pytest.raises(ConfigurationError):
        list(batched([run], [1, 2], 1024))


def test_write_part_counts_a_runs_payloads_and_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    values, _, reserved = CASES["mixed lengths, nulls, empty"]
    batch = _batch(values, pa.binary(), reserved)
    payloads, rvs = payloads_from_batch(batch, "binary")
    path = tmp_path / "part"
    path.write_bytes(b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    count, nbytes = write_part(fd, batched([payload_run_from_batch(batch)], None, 1000))
    assert (count, nbytes) == (len(payloads), sum(map(len, payloads)))
    assert path.read_bytes() == _joined(records(payloads, rvs))


@pytest.mark.parametrize("local", [True, False])
def test_a_staged_run_commits_the_same_messages(tmp_path, local: bool) -> None:  # type: ignore[no-untyped-def]
    """Over a real server, staged locally and over the session: the committed stream holds the
    payloads and reserved values in order."""
    from aeron_spark.connector.formats import Geometry, iter_messages

    payloads = [b"m%05d" % i * (1 + i % 5) for i in range(3000)] + [b""] * 3
    rvs = list(range(len(payloads)))
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array(payloads[i : i + 700], pa.binary()), pa.array(rvs[i : i + 700], pa.int64())],
            names=["value", "reserved_value"],
        )
        for i in range(0, len(payloads), 700)
    ]
    with StreamServer(ServerConfig(directory=str(tmp_path / "s"), port=0)) as server:
        settings = ClientSettings(endpoint=server.endpoint, max_request_bytes=4096)
        with StreamClient.connect(settings) as client:
            receipt = client.stage(
                "s", 1, 0, 0, 5, (payload_run_from_batch(b) for b in batches), local=local
            )
            assert (client.local_stages, receipt["count"]) == (int(local), len(payloads))
            client.commit("s", 1, 5, [receipt])
            (rec,) = client.list_recordings(stream_ids=[5])
            blocks = client.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            got = [
                (bytes(m.payload), m.reserved_value)
                for m in iter_messages(blocks, Geometry(rec.initial_term_id, rec.term_length))
            ]
    assert got == list(zip(payloads, rvs, strict=True))


def test_a_payload_run_is_the_records_protocol_and_a_list_is_not() -> None:
    """``records`` tells a run from a list of payloads by the named protocol, not by probing."""
    run = PayloadRun.from_columns(pa.array([b"a", b"bc"], pa.binary()), None)
    assert isinstance(run, PayloadBuffers)
    for payloads in ([b"a", b"bc"], (b"a",), [], b"ab", bytearray(b"ab")):
        assert not isinstance(payloads, PayloadBuffers)
    assert _joined(records(run, None)) == _joined(records([b"a", b"bc"], None))
