"""Attack: one client fills ``--max-consumer-positions`` for everyone.

The committed consumer positions ``consumers.msgpack`` keeps (``--max-consumer-positions``,
1,000,000) were one budget for all clients together (``retention.ConsumerRegistry``): one
authorised but hostile client committing every recording of its streams under many consumer ids
took it all, and every other client's consumer commit was then refused with ``LIMIT_EXCEEDED``
(so their queries' retention holds stopped moving, and a new query's consumer could not be
created at all). Fixed: one client holds at most ``--max-consumer-positions-per-client``
positions (half of the total by default, as ``--max-per-key`` is half of ``--max-clients``),
counted by its client key on a server with ``--authorized-keys`` and by its address (an IPv6
one's /64, as ``--max-per-address`` counts sessions) on an open one; past its share a commit is
refused with ``LIMIT_EXCEEDED`` naming that option and counted
(``consumer_commits_over_share``), and the total stays bounded as before.

Real server processes, real sessions over loopback UDP."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import LimitExceededError
from aeron_spark.connector.server.testing import keyed_server, server_process

TOTAL = 8  # --max-consumer-positions here (the bound is the same code at 1,000,000)
STREAMS = (10, 11, 12, 13)  # a recording each: a consumer of all four holds four positions


def _fill(client: StreamClient, recordings: dict[int, int], prefix: str) -> LimitExceededError:
    """Commit consumers of every recording until the server refuses one; the refusal."""
    for n in range(TOTAL + 1):
        try:
            client.consumer_commit(f"{prefix}-{n}", list(STREAMS), recordings)
        except LimitExceededError as exc:
            return exc
    raise AssertionError(f"{TOTAL + 1} consumers of {len(recordings)} positions all taken")


def _recordings(client: StreamClient) -> dict[int, int]:
    ends = {stream: client.publish(stream, [b"row"]) for stream in STREAMS}
    return {r.recording_id: ends[r.stream_id] for r in client.list_recordings(list(STREAMS))}


def test_attack_one_key_cannot_take_every_consumer_position(tmp_path: Path) -> None:
    grants = {"hostile": "read=* write=*", "victim": "read=* write=* admin"}
    extra = ["--max-consumer-positions", str(TOTAL)]
    with keyed_server(str(tmp_path), grants, extra) as server:
        with server.client("hostile") as hostile, server.client("victim") as victim:
            recordings = _recordings(hostile)
            refused = _fill(hostile, recordings, "hostile")
            # the other key's query still gets its consumer (on main: LIMIT_EXCEEDED, the
            # hostile key held all 8)
            rec, end = next(iter(recordings.items()))
            victim.consumer_commit("victims-query", [STREAMS[0]], {rec: end})
            assert "--max-consumer-positions-per-client" in str(refused), refused
            assert refused.limit == TOTAL // 2, refused
            stats = victim.stats()
            held = {c["consumer_id"]: len(c["positions"]) for c in stats["consumers"]}
            assert held.pop("victims-query") == 1, held
            assert sum(held.values()) == TOTAL // 2, held  # the hostile key's share, no more
            assert stats["counters"]["consumer_commits_over_share"] == 1, stats["counters"]
            # moving positions it holds is always taken, share full or not
            hostile.consumer_commit("hostile-0", list(STREAMS), recordings)


def test_attack_one_address_cannot_take_every_consumer_position_on_an_open_server(
    tmp_path: Path,
) -> None:
    """Without ``--authorized-keys`` a client may make a key per session: the share is its
    address's. The server listens on ``::`` (both families): one client comes from 127.0.0.1,
    the other from ::1, two addresses of one host."""
    extra = ["--host", "::", "--key-store", str(tmp_path / "server-keys")]
    with server_process(
        str(tmp_path / "srv"), [*extra, "--max-consumer-positions", str(TOTAL)]
    ) as (
        _proc,
        endpoint,
    ):
        port = endpoint.rsplit(":", 1)[1]

        def client(host: str) -> StreamClient:
            return StreamClient.connect(
                ClientSettings(
                    endpoint=f"{host}:{port}",
                    encryption=False,
                    key_store_dir=str(tmp_path / "keys-client"),
                    timeout_s=60.0,
                )
            )

        with client("127.0.0.1") as hostile, client("[::1]") as victim:
            recordings = _recordings(hostile)
            refused = _fill(hostile, recordings, "hostile")
            rec, end = next(iter(recordings.items()))
            victim.consumer_commit("victims-query", [STREAMS[0]], {rec: end})
            assert "--max-consumer-positions-per-client" in str(refused), refused
            # the hostile address's other sessions share its share
            with client("127.0.0.1") as again:
                with pytest.raises(LimitExceededError):
                    again.consumer_commit("hostile-more", [STREAMS[0]], {rec: end})


def test_attack_one_address_cannot_take_every_consumer_on_an_open_server(tmp_path: Path) -> None:
    """``--max-consumers-per-client`` counted every client of an open server together: one
    address creating that many consumers left no consumer to any other client. Now it is one
    address's (as the positions' share)."""
    extra = ["--host", "::", "--key-store", str(tmp_path / "server-keys")]
    with server_process(str(tmp_path / "srv"), [*extra, "--max-consumers-per-client", "3"]) as (
        _proc,
        endpoint,
    ):
        port = endpoint.rsplit(":", 1)[1]
        settings = {
            "encryption": False,
            "key_store_dir": str(tmp_path / "keys-client"),
            "timeout_s": 60.0,
        }
        with (
            StreamClient.connect(ClientSettings(endpoint=f"127.0.0.1:{port}", **settings)) as a,
            StreamClient.connect(ClientSettings(endpoint=f"[::1]:{port}", **settings)) as b,
        ):
            end = a.publish(10, [b"row"])
            rec = a.list_recordings([10])[0].recording_id
            for n in range(3):
                a.consumer_commit(f"hostile-{n}", [10], {rec: end})
            with pytest.raises(LimitExceededError) as refused:
                a.consumer_commit("hostile-3", [10], {rec: end})
            assert "at most 3 consumers" in str(refused.value), refused.value
            assert "--max-consumers-per-client" in str(refused.value), refused.value
            b.consumer_commit("victims-query", [10], {rec: end})  # on main: LIMIT_EXCEEDED
            # the refusal is counted, apart from the positions' (main: no counter at all)
            counters = b.stats()["counters"]
            assert counters.get("new_consumers_refused") == 1, counters
            assert counters["consumer_commits_over_share"] == 0, counters


def test_shares_survive_a_restart(tmp_path: Path) -> None:
    """Whose share a consumer counts against is kept in ``consumers.msgpack``: after a restart
    a client's share is still full, and forgetting its consumers gives it back."""
    from aeron_spark.connector.server.retention import ConsumerRegistry

    registry = ConsumerRegistry(str(tmp_path), max_positions=8, max_positions_per_client=4)
    registry.commit("a1", [10], {1: 1, 2: 1, 3: 1}, now_s=1.0, client="10.0.0.1")
    registry.commit("b1", [10], {1: 1}, now_s=1.0, client="10.0.0.2")
    again = ConsumerRegistry(str(tmp_path), max_positions=8, max_positions_per_client=4)
    assert again.positions_of == {"10.0.0.1": 3, "10.0.0.2": 1}
    with pytest.raises(LimitExceededError):
        again.commit("a2", [10], {4: 1, 5: 1}, now_s=2.0, client="10.0.0.1")
    # another client committing a's consumer charges a (the consumer's creator), not itself
    with pytest.raises(LimitExceededError):
        again.commit("a1", [10], {4: 1, 5: 1}, now_s=2.0, client="10.0.0.2")
    assert again.commits_over_share == 2 and again.positions == 4
    again.forget("a1")
    again.commit("a2", [10], {4: 1, 5: 1, 6: 1, 7: 1}, now_s=3.0, client="10.0.0.1")
    assert again.positions_of == {"10.0.0.1": 4, "10.0.0.2": 1} and again.positions == 5


def test_consumers_saved_before_shares_move_to_the_client_that_commits_them(
    tmp_path: Path,
) -> None:
    """A ``consumers.msgpack`` written by a server before per-client shares (each entry
    ``stream_ids``, ``updated_s``, ``positions``, ``owner`` "": an open server's) held three
    queries' consumers of 3 positions each, 9 together, within that server's total. Restarted
    with a share of 4 a client, each legacy consumer is charged to the first client that commits
    it (its address): before, all were charged to one nobody's "" share, already past its 4, so
    every legacy consumer's commit adding a position was refused for good."""
    from aeron_spark.connector.server.retention import ConsumerRegistry

    old = {
        f"query-{n}": {
            "stream_ids": [10],
            "updated_s": 1.0,
            "positions": {str(100 * n + k): 64 for k in range(3)},
            "owner": "",
        }
        for n in range(3)
    }
    (tmp_path / "consumers.msgpack").write_bytes(msgpack.packb(old))
    registry = ConsumerRegistry(str(tmp_path), max_positions=16, max_positions_per_client=4)
    assert registry.positions == 9
    # each query's driver (its own address) commits one more recording of its consumer
    for n in range(3):
        positions = {**{100 * n + k: 128 for k in range(3)}, 100 * n + 3: 0}
        registry.commit(f"query-{n}", [10], positions, 2.0, client=f"10.0.0.{n + 1}")
    assert registry.positions_of == {f"10.0.0.{n + 1}": 4 for n in range(3)}
    assert registry.commits_over_share == 0
    # charged to its client now: past that client's share it is refused as any consumer
    with pytest.raises(LimitExceededError, match="max-consumer-positions-per-client"):
        registry.commit("query-0", [10], {999: 0}, 3.0, client="10.0.0.1")
    # and the store, reloaded, keeps whom each is charged to
    again = ConsumerRegistry(str(tmp_path), max_positions=16, max_positions_per_client=4)
    assert again.positions_of == registry.positions_of
