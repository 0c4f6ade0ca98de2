"""Sink staging files and the commit log, on a real directory."""

from __future__ import annotations

import os
import time

import pytest

from aeron_spark.connector.errors import ControlProtocolError, StagedDataMissingError
from aeron_spark.connector.server.commitlog import CommitLog
from aeron_spark.connector.server.staging import PartKey, StagingStore


def test_commit_log_survives_reopen_and_cuts_a_torn_tail(tmp_path) -> None:
    path = str(tmp_path / "commit.log")
    log = CommitLog(path)
    for i in range(5):
        log.append({"t": "done", "batch_id": i, "sink_id": "s"})
    log.close()
    size = os.path.getsize(path)
    with open(path, "ab") as fh:  # a crash in the middle of the next record
        fh.write(b"\x40\x00\x00\x00\x01\x02\x03\x04partial")
    again = CommitLog(path)
    assert [r["batch_id"] for r in again.records] == [0, 1, 2, 3, 4]
    assert again.torn_bytes_truncated == len(b"\x40\x00\x00\x00\x01\x02\x03\x04partial")
    assert os.path.getsize(path) == size
    again.append({"t": "done", "batch_id": 5, "sink_id": "s"})
    again.close()
    assert [r["batch_id"] for r in CommitLog(path).records] == [0, 1, 2, 3, 4, 5]


def test_commit_log_stops_at_a_corrupt_record(tmp_path) -> None:
    path = str(tmp_path / "commit.log")
    log = CommitLog(path)
    log.append({"t": "done", "batch_id": 1})
    log.append({"t": "done", "batch_id": 2})
    log.close()
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF  # flip a bit in the last body: its crc no longer matches
    open(path, "wb").write(data)
    assert [r["batch_id"] for r in CommitLog(path).records] == [1]


def test_stage_write_read_and_retry_truncates(tmp_path) -> None:
    store = StagingStore(str(tmp_path))
    owner_a, owner_b = object(), object()
    assert store.write(owner_a, PartKey("q", 3, 0, 0), 10, [b"a", b"bb"], None, False) is None
    # the same attempt restaged by a new session (a retried stage call) starts over
    store.write(owner_b, PartKey("q", 3, 0, 0), 10, [b"x"], [7], False)
    msg = store.write(owner_b, PartKey("q", 3, 0, 0), 10, [b"yy", b""], [8, 9], True)
    assert msg == {
        "sink_id": "q",
        "batch_id": 3,
        "partition_id": 0,
        "attempt": 0,
        "stream_id": 10,
        "part": "0-0",
        "count": 3,
        "bytes": 3,
    }
    path = store.check_part(msg)
    got = [(p, r) for ps, rs in store.read_part(path) for p, r in zip(ps, rs, strict=True)]
    assert got == [(b"x", 7), (b"yy", 8), (b"", 9)]
    with pytest.raises(StagedDataMissingError):
        store.check_part(dict(msg, count=4))
    with pytest.raises(ControlProtocolError):
        store.check_part(dict(msg, part="1-0"))
    assert store.discard("q", 3, [msg]) == 1
    with pytest.raises(StagedDataMissingError, match="not on the server"):
        store.check_part(msg)


def test_gc_deletes_only_expired_unprotected_parts(tmp_path) -> None:
    store = StagingStore(str(tmp_path))
    owner = object()
    old = store.write(owner, PartKey("q", 1, 0, 0), 10, [b"old"], None, True)
    kept = store.write(owner, PartKey("q", 2, 0, 0), 10, [b"in-commit"], None, True)
    store.write(owner, PartKey("q", 3, 0, 0), 10, [b"open"], None, False)
    for msg in (old, kept):
        path = store.part_path(msg)
        os.utime(path, (1000.0, 1000.0))
    now = 1000.0 + 3600
    assert store.gc(now, lease_s=60, protected={("q", 2)}) == 1
    assert not os.path.exists(store.part_path(old))
    assert os.path.exists(store.part_path(kept))
    # the open part of a live session survives; once the session is gone it expires too
    store.release_owner(owner)
    assert store.gc(time.time() + 7200, lease_s=60, protected={("q", 2)}) == 1
    assert store.gc(time.time() + 7200, lease_s=60, protected=set()) == 1
    assert os.listdir(str(tmp_path)) == []


def test_read_part_gives_runs_of_equal_payloads_as_arrays_in_order(tmp_path) -> None:
    import numpy as np

    store = StagingStore(str(tmp_path / "staging"))
    owner = object()
    payloads = [b"a" * 10] * 100 + [b"odd"] + [bytes([i % 256]) * 116 for i in range(5000)]
    payloads += [b"", b"tail"] * 3
    rvs = list(range(len(payloads)))
    msg = None
    for start in range(0, len(payloads), 1000):  # several stage calls
        chunk = payloads[start : start + 1000]
        final = start + 1000 >= len(payloads)
        msg = store.write(owner, PartKey("u", 1, 0, 0), 10, chunk, rvs[start : start + 1000], final)
    got_payloads: list[bytes] = []
    got_rvs: list[int] = []
    arrays = 0
    for ps, rs in store.read_part(store.check_part(msg)):
        if isinstance(ps, np.ndarray):
            arrays += 1
            got_payloads += [row.tobytes() for row in ps]
        else:
            got_payloads += [bytes(p) for p in ps]
        got_rvs += [int(r) for r in rs]
    assert got_payloads == payloads and got_rvs == rvs
    assert arrays >= 2  # the 10-byte run and the 116-byte run took the array path


@pytest.mark.parametrize("block", [7, 12, 13, 100, 4096, 1 << 20])
def test_read_part_across_block_boundaries(tmp_path, monkeypatch, block: int) -> None:  # type: ignore[no-untyped-def]
    """Records straddling the reads' block boundaries (headers and payloads cut anywhere,
    records longer than a block) come back whole and in order; a torn tail is an error."""
    import random

    import numpy as np

    from aeron_spark.connector.server import staging

    monkeypatch.setattr(staging, "_READ_BLOCK_BYTES", block)
    rnd = random.Random(block)
    payloads = [rnd.randbytes(rnd.choice([0, 1, 5, 11, 12, 300, 5000])) for _ in range(400)]
    payloads += [b"u" * 20] * 200 + [rnd.randbytes(70_000)]
    rvs = [rnd.randrange(-(2**63), 2**63) for _ in payloads]
    store = StagingStore(str(tmp_path / "staging"))
    msg = store.write(object(), PartKey("u", 1, 0, 0), 10, payloads, rvs, True)
    path = store.check_part(msg)
    got_payloads: list[bytes] = []
    got_rvs: list[int] = []
    for ps, rs in store.read_part(path):
        if isinstance(ps, np.ndarray):
            got_payloads += [row.tobytes() for row in ps]
        else:
            got_payloads += [bytes(p) for p in ps]
        got_rvs += [int(r) for r in rs]
    assert got_payloads == payloads and got_rvs == rvs

    with open(path, "r+b") as fh:  # tear the last record
        fh.truncate(os.path.getsize(path) - 3)
    with pytest.raises(StagedDataMissingError, match="ends inside a record"):
        for _ in store.read_part(path):
            pass


@pytest.mark.parametrize("with_rvs", [False, True])
def test_large_payloads_are_staged_one_by_one_with_the_same_records(tmp_path, with_rvs) -> None:  # type: ignore[no-untyped-def]
    import random

    import numpy as np

    rnd = random.Random(7)
    calls = [
        [rnd.randbytes(rnd.randrange(4096, 70_000)) for _ in range(30)],  # large: one by one
        [rnd.randbytes(rnd.randrange(0, 100)) for _ in range(300)],  # small: gathered
        [b"x" * 61_736] * 70,
    ]  # equal and large (arrow messages)
    store = StagingStore(str(tmp_path / "staging"))
    owner = object()
    msg = None
    for i, payloads in enumerate(calls):
        rvs = [rnd.randrange(-(2**63), 2**63) for _ in payloads] if with_rvs else None
        calls[i] = (payloads, rvs or [0] * len(payloads))  # type: ignore[call-overload]
        msg = store.write(owner, PartKey("u", 1, 0, 0), 10, payloads, rvs, i == len(calls) - 1)
    expected = [p for ps, _ in calls for p in ps]  # type: ignore[misc]
    expected_rvs = [r for _, rs in calls for r in rs]  # type: ignore[misc]
    assert msg["count"] == len(expected) and msg["bytes"] == sum(map(len, expected))
    got: list[bytes] = []
    got_rvs: list[int] = []
    for ps, rs in store.read_part(store.check_part(msg)):
        got += (
            [row.tobytes() for row in ps] if isinstance(ps, np.ndarray) else [bytes(p) for p in ps]
        )
        got_rvs += [int(r) for r in rs]
    assert got == expected and got_rvs == expected_rvs


def test_a_batchs_owner_file_goes_with_its_last_part_and_refuses_other_owners(tmp_path) -> None:
    from aeron_spark.connector.errors import NotAuthorisedError
    from aeron_spark.connector.server.staging import OWNER_FILE

    store = StagingStore(str(tmp_path))
    session = object()
    msg = store.write(session, PartKey("q", 1, 0, 0), 10, [b"x"], None, True, identity="aa")
    batch_dir = os.path.dirname(store.part_path(msg))
    assert sorted(os.listdir(batch_dir)) == ["0-0@10.part", OWNER_FILE]
    assert store.batch_owner("q", 1) == "aa"
    with pytest.raises(NotAuthorisedError, match="belongs to another client") as error:
        store.write(object(), PartKey("q", 1, 1, 0), 10, [b"y"], None, True, identity="bb")
    assert error.value.details["reason"] == "not_owner"
    with pytest.raises(NotAuthorisedError):
        store.open_local(object(), PartKey("q", 1, 2, 0), 10, identity="bb")
    store.write(object(), PartKey("q", 1, 1, 0), 10, [b"z"], None, True)  # no ownership: open
    for name in os.listdir(batch_dir):
        os.utime(os.path.join(batch_dir, name), (1000.0, 1000.0))
    assert store.gc(1000.0 + 3600, lease_s=60, protected=set()) == 2  # the parts
    assert os.listdir(str(tmp_path)) == []  # and the owner file with them
    assert store.batch_owner("q", 1) is None


def test_a_crafted_part_name_is_refused_and_deletes_nothing(tmp_path) -> None:
    store = StagingStore(str(tmp_path / "staged"))
    msg = store.write(object(), PartKey("q", 1, 0, 0), 10, [b"x"], None, True)
    victim = tmp_path / "elsewhere@10.part"
    victim.write_bytes(b"keep")
    crafted = dict(msg, part="../../../elsewhere")
    with pytest.raises(ControlProtocolError, match="does not match its partition and attempt"):
        store.discard("q", 1, [crafted])
    assert victim.read_bytes() == b"keep" and os.path.exists(store.part_path(msg))
