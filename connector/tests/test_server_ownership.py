"""Issue 28, items 3, 6, 9, 10 and 11: what one listed client may do to another's state, over
real sessions against a real server with ``--authorized-keys``.

- sink batches and sink ids belong to the identity (client key) that staged / first committed
  them; a staged part's stream is fixed when it is staged (item 3);
- a consumer id belongs to the identity that created it; retention counts a consumer only on
  streams its owner may read (item 6);
- ``stats`` and errors show only what the client may read (item 9);
- narrowing a key's permissions ends its replays that are no longer allowed (item 10);
- the authorized keys file is checked by content, and a vanished file is logged and counted
  (item 11).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import (
    NotAuthorisedError,
    StagedDataMissingError,
    UnknownRecordingError,
)
from aeron_spark.connector.server import StreamServer
from aeron_spark.connector.server.testing import (
    authorized_keys,
    authorizing_server,
    client_key,
)

TERM = 64 * 1024


def _client(server: StreamServer, key_store: str) -> StreamClient:
    return StreamClient.connect(
        ClientSettings(
            endpoint=server.endpoint,
            server_key=server.public_key,
            key_store_dir=key_store,
            timeout_s=10,
        )
    )


def _wait_for(condition, timeout_s: float = 10.0, what: str = ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


ROWS = [b"victim-row-%02d" % i for i in range(20)]
EVIL = [b"attack-row-%02d" % i for i in range(20)]  # the same sizes as the victim's rows


def _refused(call, op: str) -> NotAuthorisedError:  # type: ignore[no-untyped-def]
    with pytest.raises(NotAuthorisedError) as error:
        call()
    assert error.value.details["op"] == op, error.value
    return error.value


# ------------------------------------------------------------------ item 3: sink batches


def test_another_client_cannot_commit_drop_abort_or_fill_a_staged_batch(tmp_path: Path) -> None:
    victim, victim_key = client_key(tmp_path, "victim")
    attacker, attacker_key = client_key(tmp_path, "attacker")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{victim_key} victim read=10,11 write=10,11\n{attacker_key} attacker read=10 write=10\n"
    )
    sink = "query@0123456789abcdef"
    with authorizing_server(tmp_path, keys) as server:
        with _client(server, victim) as v, _client(server, attacker) as a:
            # its own commit first: the sink id is the victim's from now on
            first = v.stage(sink, 4, 0, 0, 11, ROWS, local=False)
            assert v.commit(sink, 4, 11, [first])["count"] == 20

            # batch 5: committing the victim's stream-11 part relabelled as stream 10
            staged5 = v.stage(sink, 5, 0, 0, 11, ROWS, local=False)
            _refused(lambda: a.commit(sink, 5, 10, [dict(staged5, stream_id=10)]), "commit")
            # batch 6: an empty commit (would mark the batch done and drop its parts)
            staged6 = v.stage(sink, 6, 0, 0, 11, ROWS, local=False)
            _refused(lambda: a.commit(sink, 6, 10, []), "commit")
            # batch 7: an abort of the victim's parts
            staged7 = v.stage(sink, 7, 0, 0, 11, ROWS, local=False)
            _refused(lambda: a.abort(sink, 7, [dict(staged7, stream_id=10)]), "abort")
            # batch 8: staging rows of the same size into the victim's batch
            staged8 = v.stage(sink, 8, 0, 0, 11, ROWS, local=False)
            _refused(lambda: a.stage(sink, 8, 0, 0, 10, EVIL, local=False), "stage")
            _refused(lambda: a.stage(sink, 8, 1, 0, 10, EVIL, local=False), "stage")
            # nor locally (the part file would be the attacker's to write)
            _refused(
                lambda: a.call(
                    "local_stage", sink_id=sink, batch_id=8, partition_id=0, attempt=1, stream_id=10
                ),
                "local_stage",
            )
            # a batch the victim has not staged yet: its sink id is the victim's
            _refused(lambda: a.stage(sink, 9, 0, 0, 10, EVIL, local=False), "stage")
            _refused(
                lambda: a.commit(sink, 4, 10, [dict(first, stream_id=10)]), "commit"
            )  # a duplicate
            _refused(lambda: a.last_committed_batch(sink), "last_committed_batch")

            # the victim's own commits hold its own rows, in its own stream
            for batch, staged in ((5, staged5), (6, staged6), (7, staged7), (8, staged8)):
                result = v.commit(sink, batch, 11, [staged])
                assert (result["stream_id"], result["count"]) == (11, 20), (batch, result)
            assert v.last_committed_batch(sink) == 8
            assert v.list_recordings([10]) == []  # nothing landed in stream 10
            # the stream of a part is fixed when it is staged: even its owner cannot relabel it
            staged9 = v.stage(sink, 9, 0, 0, 11, ROWS, local=False)
            with pytest.raises(StagedDataMissingError):
                v.commit(sink, 9, 10, [dict(staged9, stream_id=10)])
            staged10 = v.stage(sink, 10, 0, 0, 11, ROWS, local=False)
            counters = server.snapshot()["counters"]  # server-wide: not in a non-admin's stats
            assert counters["requests_not_owner"] == 9

        # the attacker's own sink works as before
        with _client(server, attacker) as a:
            own = a.stage("attacker-sink", 0, 0, 0, 10, EVIL, local=False)
            assert a.commit("attacker-sink", 0, 10, [own])["count"] == 20
    # ownership survives a restart: staged batch 10 and the sink id are still the victim's
    with authorizing_server(tmp_path, keys) as server:
        with _client(server, attacker) as a:
            _refused(lambda: a.commit(sink, 10, 10, [dict(staged10, stream_id=10)]), "commit")
            _refused(lambda: a.abort(sink, 10, []), "abort")
            _refused(lambda: a.commit(sink, 11, 10, []), "commit")
            _refused(lambda: a.stage(sink, 11, 0, 0, 10, EVIL, local=False), "stage")
        with _client(server, victim) as v:
            assert v.commit(sink, 10, 11, [staged10])["count"] == 20


# ------------------------------------------------------------------ item 6: consumers


def test_a_consumer_belongs_to_its_creator_and_holds_only_readable_streams(tmp_path: Path) -> None:
    etl, etl_key = client_key(tmp_path, "etl")
    reader, reader_key = client_key(tmp_path, "reader")
    ops, ops_key = client_key(tmp_path, "ops")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{etl_key} etl read=11\n{reader_key} reader read=10 admin=10\n"
        f"{ops_key} ops read=* write=*\n"
    )
    with authorizing_server(
        tmp_path,
        keys,
        term_length=TERM,
        mtu=1408,
        retention_bytes=2 * TERM,
        gc_interval_ns=50_000_000,
    ) as server:
        with _client(server, etl) as e, _client(server, reader) as r, _client(server, ops) as o:
            e.consumer_commit("etl11", [11], {})  # holds all of stream 11
            o.publish(11, [bytes([i % 256]) * 1000 for i in range(700)])  # ~11 terms
            [eleven] = o.list_recordings([11])
            _refused(lambda: r.consumer_commit("etl11", [10], {}), "consumer_commit")
            _refused(lambda: r.consumer_forget("etl11"), "consumer_forget")

            def held() -> int:
                return int(server.snapshot()["counters"]["retention_held_by_consumers"])

            before = held()
            _wait_for(lambda: held() >= before + 2, what="two retention runs after the attack")
            assert o.list_recordings([11])[0].purged_position == 0  # etl11 still holds it
            assert e.stats()["consumers"][0]["stream_ids"] == [11]
            # its owner may commit it again
            e.consumer_commit("etl11", [11], {eleven.recording_id: 0})
        # the consumer's owner is persisted: still refused after a restart
    with authorizing_server(
        tmp_path,
        keys,
        term_length=TERM,
        mtu=1408,
        retention_bytes=2 * TERM,
        gc_interval_ns=50_000_000,
    ) as server:
        with _client(server, reader) as r:
            _refused(lambda: r.consumer_commit("etl11", [10], {}), "consumer_commit")
        with _client(server, ops) as o:
            before = int(server.snapshot()["counters"]["retention_held_by_consumers"])
            _wait_for(
                lambda: (
                    int(server.snapshot()["counters"]["retention_held_by_consumers"]) >= before + 2
                ),
                what="retention runs",
            )
            assert o.list_recordings([11])[0].purged_position == 0
            # once etl may no longer read stream 11, its consumer holds nothing there
            keys.write_text(
                f"{etl_key} etl read=12\n{reader_key} reader read=10 admin=10\n"
                f"{ops_key} ops read=* write=*\n"
            )
            server.request_reload()
            end = o.list_recordings([11])[0].recorded_position
            target = (end - 2 * TERM) // TERM * TERM
            _wait_for(
                lambda: o.list_recordings([11])[0].purged_position == target,
                what="stream 11 purged to its last two terms",
            )


# ------------------------------------------------------------------ item 9: what stats shows


def test_stats_and_errors_show_only_what_the_client_may_read(tmp_path: Path) -> None:
    keys, stores = authorized_keys(
        tmp_path, {"reader": "read=10", "other": "read=10,11 write=10,11"}
    )
    reader, other = stores["reader"], stores["other"]
    with authorizing_server(tmp_path, keys) as server:
        with _client(server, other) as o, _client(server, reader) as r:
            o.publish(10, [b"ten"])
            o.publish(11, [b"eleven"])
            o.consumer_commit("etl11", [11], {})
            o.consumer_commit("both", [10, 11], {})
            eleven = next(rec for rec in o.list_recordings() if rec.stream_id == 11)
            stats = r.stats()
            assert [s["client"] for s in stats["sessions"]] == ["reader"]  # its own session only
            assert [c["consumer_id"] for c in stats["consumers"]] == ["both"]
            assert stats["consumers"][0]["stream_ids"] == [10]
            assert "handshake" in stats["withheld"]  # other clients' addresses, among others
            for call in (
                lambda: r.position_at(eleven.recording_id, 0),
                lambda: list(r.replay(eleven.recording_id, 0, None)),
                lambda: r.scan(eleven.recording_id, 0),
            ):
                with pytest.raises(UnknownRecordingError) as error:  # as if it did not exist
                    call()
                refused = error.value
                assert "11" not in str(refused) and "stream_id" not in refused.details, refused
                assert refused.message == f"no recording {eleven.recording_id}"
            # a client allowed both streams sees both consumers
            assert [s["client"] for s in o.stats()["sessions"]] == ["other"]
            assert {c["consumer_id"] for c in o.stats()["consumers"]} == {"both", "etl11"}


# ------------------------------------------------------------------ item 10: narrowed keys


def test_a_narrowed_permission_ends_the_keys_replays_no_longer_allowed(tmp_path: Path) -> None:
    keys, stores = authorized_keys(tmp_path, {"reader": "read=11,13", "ops": "read=* write=*"})
    reader, ops = stores["reader"], stores["ops"]
    with authorizing_server(tmp_path, keys) as server:
        with _client(server, ops) as o, _client(server, reader) as r:
            o.publish(11, [b"before"])
            o.publish(13, [b"thirteen"])
            [eleven] = o.list_recordings([11])
            [thirteen] = o.list_recordings([13])
            live = r.replay(eleven.recording_id, 0, None)  # a live replay: follows the stream
            kept = r.replay(thirteen.recording_id, 0, None)
            assert next(live).data and next(kept).data
            authorized_keys(tmp_path, {"reader": "read=12,13", "ops": "read=* write=*"})
            server.request_reload()
            with pytest.raises(NotAuthorisedError, match="replay"):
                for _block in live:
                    o.publish(11, [b"after"])  # keeps data coming while the replay lives
            o.publish(13, [b"still"])
            assert next(kept).data  # the replay it may still read goes on
            assert server.snapshot()["counters"]["replays_revoked"] == 1
            kept.close()


# ------------------------------------------------------------------ item 11: reloads


def test_an_in_place_edit_keeping_size_and_mtime_is_reloaded(tmp_path: Path) -> None:
    reader, reader_key = client_key(tmp_path, "reader")
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"{reader_key} reader read=10\n")
    with authorizing_server(tmp_path, keys) as server:
        assert server.authz is not None
        stamp = os.stat(keys)
        with open(keys, "r+") as fh:  # same inode, same size
            fh.write(f"{reader_key} reader read=11\n")
        os.utime(keys, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert os.stat(keys).st_mtime_ns == stamp.st_mtime_ns
        assert os.stat(keys).st_size == stamp.st_size and os.stat(keys).st_ino == stamp.st_ino
        _wait_for(
            lambda: 11 in server.authz.table[bytes.fromhex(reader_key)].read,
            what="the edit noticed",
        )


def test_a_deleted_keys_file_is_logged_and_counted_and_the_table_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reader, reader_key = client_key(tmp_path, "reader")
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"{reader_key} reader read=10\n")
    with caplog.at_level(logging.ERROR), authorizing_server(tmp_path, keys) as server:

        def failures() -> int:
            return int(server.snapshot()["counters"].get("authorized_keys_reload_failures", 0))

        keys.unlink()
        _wait_for(lambda: failures() == 1, what="the missing file counted")
        assert "authorized keys NOT reloaded" in caplog.text and str(keys) in caplog.text
        with _client(server, reader) as r:  # the previous table stays in force
            assert r.list_streams() == []
        time.sleep(1.2)  # another poll of the still missing file: not counted again
        assert failures() == 1
        keys.write_text(f"{reader_key} reader read=10,11\n")
        _wait_for(
            lambda: 11 in server.authz.table[bytes.fromhex(reader_key)].read,  # type: ignore[union-attr]
            what="the file back",
        )


def test_a_commit_interrupted_before_the_upgrade_is_resumed_from_legacy_part_names(
    tmp_path: Path,
) -> None:
    """A ``begin`` written before issue 28 (no owner) names parts staged as
    ``<partition>-<attempt>.part``: recovery still finds them, so the server starts."""
    import shutil

    from aeron_spark.connector.server.commitlog import CommitLog

    keys, stores = authorized_keys(tmp_path, {"writer": "read=10 write=10"})
    writer = stores["writer"]
    with authorizing_server(tmp_path, keys) as server, _client(server, writer) as w:
        staged = w.stage("old", 3, 0, 0, 10, ROWS, local=False)
        part = server.core.committer.staging.part_path(staged)  # type: ignore[union-attr]
        shutil.copy(part, tmp_path / "part-copy")
        assert w.commit("old", 3, 10, [staged])["count"] == 20
    log_path = str(tmp_path / "srv" / "sink" / "commit.log")
    log = CommitLog(log_path)
    records = log.records
    log.close()
    os.unlink(log_path)
    legacy = CommitLog(log_path)
    for record in records:
        if record["t"] == "begin":  # as written before: no owner, and no done after it
            legacy.append({k: v for k, v in record.items() if k != "owner"})
    legacy.close()
    os.makedirs(os.path.dirname(part), exist_ok=True)
    shutil.copy(tmp_path / "part-copy", os.path.join(os.path.dirname(part), "0-0.part"))
    with authorizing_server(tmp_path, keys) as server, _client(server, writer) as w:
        assert server.snapshot()["counters"]["sink_resumed_commits"] == 1
        assert w.last_committed_batch("old") == 3
        assert w.commit("old", 3, 10, [staged])["count"] == 20  # the recorded result
        [recording] = w.list_recordings([10])
        blocks = list(w.replay(recording.recording_id, 0, recording.recorded_position))
        assert sum(len(b.data) for b in blocks) == recording.recorded_position  # once
