"""Retention: purge targets, the consumer registry, and a live server purging on its gc tick."""

from __future__ import annotations

import shutil
import threading
import time

import msgpack
import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ControlProtocolError, LimitExceededError, PurgedError
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.retention import ConsumerRegistry, RetentionPolicy, purge_target
from aeron_spark.errors import ConfigurationError

TERM = 64 * 1024


def rec(**kw: int) -> dict:
    base = {
        "recording_id": 1,
        "stream_id": 10,
        "start_position": 0,
        "purged_position": 0,
        "recorded_position": 10 * TERM + 100,
        "term_length": TERM,
    }
    return {**base, **kw}


def no_time(recording_id: int, timestamp_ns: int) -> int:
    raise AssertionError("time retention not configured")


def test_purge_targets_round_to_term_starts_and_respect_holds() -> None:
    by_bytes = RetentionPolicy(retention_bytes=3 * TERM)
    assert purge_target(by_bytes, rec(), 0, no_time, None) == 7 * TERM  # 7*TERM+100 rounded
    assert purge_target(by_bytes, rec(), 0, no_time, 5 * TERM + 64) == 5 * TERM + 64
    assert purge_target(by_bytes, rec(), 0, no_time, 0) is None  # held entirely
    assert purge_target(by_bytes, rec(purged_position=7 * TERM), 0, no_time, None) is None
    ignoring = RetentionPolicy(retention_bytes=3 * TERM, respects_consumers=False)
    assert purge_target(ignoring, rec(), 0, no_time, 0) == 7 * TERM
    everything = RetentionPolicy(retention_bytes=0)
    assert purge_target(everything, rec(), 0, no_time, None) == 10 * TERM + 100  # the end
    start_mid = rec(start_position=TERM // 2, purged_position=TERM // 2)
    assert purge_target(by_bytes, start_mid, 0, no_time, None) == TERM // 2 + 6 * TERM

    def at(recording_id: int, timestamp_ns: int) -> int:
        assert timestamp_ns == 100 * 10**9 - 30 * 10**9
        return 4 * TERM + 32

    by_time = RetentionPolicy(retention_s=30)
    assert purge_target(by_time, rec(), 100 * 10**9, at, None) == 4 * TERM
    assert not RetentionPolicy().enabled


def test_consumer_registry_persists_and_expires(tmp_path) -> None:  # type: ignore[no-untyped-def]
    registry = ConsumerRegistry(str(tmp_path))
    registry.commit("q1", [10], {1: 500, 2: 64}, now_s=1000.0)
    registry.commit("q2", [10, 11], {1: 300}, now_s=1000.0)
    again = ConsumerRegistry(str(tmp_path))
    assert again.hold(1, 10, now_s=1001.0, lease_s=60) == 300
    assert again.hold(2, 10, now_s=1001.0, lease_s=60) == 0  # q2 has not seen recording 2
    assert again.hold(1, 12, now_s=1001.0, lease_s=60) is None  # nobody reads stream 12
    assert again.hold(1, 10, now_s=2000.0, lease_s=60) is None  # both leases ran out
    assert again.forget("q2") and not again.forget("q2")
    assert ConsumerRegistry(str(tmp_path)).hold(1, 10, now_s=1001.0, lease_s=60) == 500
    with pytest.raises(ControlProtocolError):
        again.commit("", [10], {1: 1}, now_s=0)
    with pytest.raises(ConfigurationError, match="retention_bytes"):
        ServerConfig(directory=str(tmp_path), retention_bytes=-1)


def _wait_for(predicate, what: str, timeout_s: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_live_server_purges_what_consumers_have_committed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = ServerConfig(
        directory=str(tmp_path / "s"),
        port=0,
        term_length=TERM,
        mtu=1408,
        retention_bytes=2 * TERM,
        gc_interval_ns=50_000_000,
        encryption=False,
    )
    with (
        StreamServer(config) as server,
        StreamClient.connect(ClientSettings(endpoint=server.endpoint, encryption=False)) as client,
    ):
        client.consumer_commit("reader", [30], {})  # registered before anything is recorded
        client.publish(30, [bytes([i % 256]) * 1000 for i in range(700)])  # ~11 terms
        [info] = client.list_recordings(stream_ids=[30])
        rid, end = info.recording_id, info.recorded_position
        # gc ticks ran (a fixed 0.3 s saw none on a loaded machine): the consumer holds everything
        _wait_for(
            lambda: client.stats()["counters"]["retention_held_by_consumers"] > 0,
            "a gc tick held back by the consumer",
        )
        assert client.list_recordings(stream_ids=[30])[0].purged_position == 0
        stats = client.stats()
        assert stats["consumers"][0]["consumer_id"] == "reader"

        half = client.scan(rid, 0, end, max_messages=350).end  # a message boundary
        client.consumer_commit("reader", [30], {rid: half})
        purged = _wait_for(
            lambda: client.list_recordings(stream_ids=[30])[0].purged_position, "a purge"
        )
        assert purged == half  # below the retention target, held at the committed position
        with pytest.raises(PurgedError):
            list(client.replay(rid, 0, half))
        assert sum(len(b.data) for b in client.replay(rid, half, end)) > 0

        assert client.consumer_forget("reader")  # nobody holds it: down to the last 2 terms
        target = (end - 2 * TERM) // TERM * TERM
        _wait_for(
            lambda: client.list_recordings(stream_ids=[30])[0].purged_position == target,
            "retention to the last two terms",
        )
        assert client.stats()["counters"]["retention_purges"] >= 2


def test_consumers_per_client_are_counted_not_walked(tmp_path) -> None:
    """``--max-consumers-per-client`` reads a count per key (it walked every consumer of every
    client on each new one): the count follows commits, claims, forgets and a restart."""
    registry = ConsumerRegistry(str(tmp_path))
    registry.commit("a1", [10], {1: 0}, 1.0, owner="aa", max_per_owner=2)
    registry.commit("a2", [10], {1: 0}, 1.0, owner="aa", max_per_owner=2)
    registry.commit("old", [10], {1: 0}, 1.0)  # recorded without an owner
    registry.commit("a1", [10], {1: 64}, 2.0, owner="aa", max_per_owner=2)  # not a new one
    assert registry.held == {"aa": 2, "": 1}
    with pytest.raises(LimitExceededError):
        registry.commit("a3", [10], {1: 0}, 1.0, owner="aa", max_per_owner=2)
    registry.commit("old", [10], {1: 0}, 3.0, owner="bb", may_claim=lambda s: True)  # claimed
    assert registry.held == {"aa": 2, "bb": 1}
    assert registry.forget("a2", owner="aa") and not registry.forget("a2", owner="aa")
    assert registry.held == {"aa": 1, "bb": 1}
    registry.commit("a3", [10], {1: 0}, 1.0, owner="aa", max_per_owner=2)
    assert ConsumerRegistry(str(tmp_path)).held == {"aa": 2, "bb": 1}  # as persisted


def _positions(client: StreamClient) -> dict[str, dict[str, int]]:
    return {c["consumer_id"]: c["positions"] for c in client.stats()["consumers"]}


def _stored_positions(directory) -> dict[str, dict[str, int]]:  # type: ignore[no-untyped-def]
    body = msgpack.unpackb((directory / "consumers.msgpack").read_bytes(), raw=False)
    return {cid: dict(entry["positions"]) for cid, entry in body.items()}


def test_positions_of_a_recording_retention_purged_whole_are_dropped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``consumers.msgpack`` kept every consumer's position of every recording ever committed,
    those retention had purged whole (stopped, nothing left) included: it grew without bound.
    A finished recording purged to its end takes its positions with it (the file rewritten
    whole, as a commit does), counted (``consumer_positions_dropped``); a live one's stay."""
    directory = tmp_path / "s"
    config = ServerConfig(
        directory=str(directory),
        port=0,
        term_length=TERM,
        mtu=1408,
        retention_bytes=0,  # everything a consumer has passed
        gc_interval_ns=50_000_000,
        encryption=False,
    )
    with StreamServer(config) as server:
        settings = ClientSettings(endpoint=server.endpoint, encryption=False)
        with StreamClient.connect(settings) as publisher:
            publisher.publish(30, [b"gone"] * 10)
        with StreamClient.connect(settings) as client:
            finished = _wait_for(
                lambda: [r for r in client.list_recordings([30]) if r.stop_position is not None],
                "the publisher's recording to stop",
            )[0]
            client.publish(31, [b"live"] * 10)  # this session's recording stays live
            [live] = client.list_recordings([31])
            client.consumer_commit(
                "reader",
                [30, 31],
                {
                    finished.recording_id: finished.recorded_position,
                    live.recording_id: live.recorded_position,
                },
            )
            _wait_for(
                lambda: all(
                    r.purged_position == r.recorded_position
                    for r in client.list_recordings([30, 31])
                ),
                "both purged to their ends",
            )
            runs = client.stats()["counters"]["retention_runs"]
            _wait_for(
                lambda: client.stats()["counters"]["retention_runs"] >= runs + 2,
                "two more retention runs",
            )
            kept = {str(live.recording_id): live.recorded_position}
            # main: the finished recording's position was kept for good
            assert _positions(client) == {"reader": kept}
            assert _stored_positions(directory) == {"reader": kept}
            assert client.stats()["counters"]["consumer_positions_dropped"] == 1


def test_positions_of_a_deleted_recording_are_dropped_at_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A recording directory deleted while the server was down (an operator freeing space)
    left its consumers' positions in ``consumers.msgpack`` for good; the next start drops them
    (and rewrites the file once)."""
    directory = tmp_path / "s"
    config = ServerConfig(directory=str(directory), port=0, term_length=TERM, encryption=False)
    with StreamServer(config) as server:
        settings = ClientSettings(endpoint=server.endpoint, encryption=False)
        with StreamClient.connect(settings) as client:
            client.publish(30, [b"a"])
            client.publish(31, [b"b"])
            [a] = client.list_recordings([30])
            [b] = client.list_recordings([31])
            client.consumer_commit(
                "reader", [30, 31], {a.recording_id: a.recorded_position, b.recording_id: 0}
            )
    shutil.rmtree(directory / "recordings" / str(b.recording_id))
    config = ServerConfig(directory=str(directory), port=0, term_length=TERM, encryption=False)
    with StreamServer(config) as server:
        settings = ClientSettings(endpoint=server.endpoint, encryption=False)
        with StreamClient.connect(settings) as client:
            kept = {str(a.recording_id): a.recorded_position}
            assert _positions(client) == {"reader": kept}  # main: b's position kept for good
            assert _stored_positions(directory) == {"reader": kept}
            assert client.stats()["counters"]["consumer_positions_dropped"] == 1


def test_retention_waits_its_turn_and_never_piles_up_before_commits(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Retention ran on the commit worker outside the fair queue, one job submitted every gc
    tick whether the last had run or not: a run held up (here the registry's lock, held by the
    test as a slow disk's fsync would hold it) piled one job a tick in front of every client's
    commit, all run before it. Now retention is its own client of the fair queue with at most one
    job queued or running: a commit queued meanwhile waits behind at most one run.

    The runs are counted when the commit reaches the registry (its real ``commit`` called
    through), not when the test sees its effect: runs go every 10 ms once the lock is let go,
    and a test thread a loaded machine holds up for a few ticks counted the runs after the
    commit too. The commit is known queued (the fair queue
    holds it) and 20 ticks are known to have gone by meanwhile, rather than slept for."""
    config = ServerConfig(
        directory=str(tmp_path / "s"),
        port=0,
        term_length=TERM,
        mtu=1408,
        retention_bytes=0,
        gc_interval_ns=10_000_000,
        encryption=False,
    )
    with (
        StreamServer(config) as server,
        StreamClient.connect(ClientSettings(endpoint=server.endpoint, encryption=False)) as client,
    ):
        assert server.core is not None
        core = server.core
        counters, registry = core.retention.counters, core.consumers
        runs_at_commit: list[int] = []
        real_commit = registry.commit

        def commit(*args, **kwargs):  # type: ignore[no-untyped-def]
            runs_at_commit.append(counters["retention_runs"])
            return real_commit(*args, **kwargs)

        monkeypatch.setattr(registry, "commit", commit)
        with registry._changing:  # the next run blocks at its end (drop_recordings)
            # a run started now blocks (counted as it starts); one started before, not yet at
            # the lock, makes the ticks skip (one run at a time), and blocks too
            held, skipped = (
                counters["retention_runs"],
                core.counters.get("retention_ticks_skipped", 0),
            )
            _wait_for(
                lambda: (
                    counters["retention_runs"] > held
                    or core.counters.get("retention_ticks_skipped", 0) >= skipped + 3
                ),
                "a retention run held up",
            )
            committer = threading.Thread(
                target=client.consumer_commit, args=("reader", [30], {}), daemon=True
            )
            committer.start()
            # queued behind the run held up (the only job the fair queue can hold meanwhile:
            # retention's next is not queued while one is)
            _wait_for(lambda: len(server._fair), "the commit queued")
            skipped = core.counters.get("retention_ticks_skipped", 0)
            # ticks go by while it is queued (on main each one queued another run before it)
            _wait_for(
                lambda: core.counters.get("retention_ticks_skipped", 0) >= skipped + 20,
                "20 gc ticks",
            )
            before = counters["retention_runs"]
            assert not runs_at_commit  # behind the run held up
        _wait_for(lambda: runs_at_commit, "the commit to run")
        ran = runs_at_commit[0] - before
        committer.join(60)
        assert not committer.is_alive()
        assert "reader" in registry.consumers
        assert ran <= 1, f"{ran} retention runs went before a commit queued behind one"
