"""Attack: consumer positions (``consumers.msgpack``) grow without a bound.

A consumer's positions merge across commits and are dropped only when their recordings go
(deleted, or purged whole): without retention every recording a consumer ever committed stays
in the file, and a client may hold up to ``--max-consumers-per-client`` consumers, each
committing every recording of its streams. The whole file is rewritten (and fsynced) on every
commit, so its size is every commit's cost. Broken and fixed: nothing bounded the total (on
main the registry took every position; ``max_positions`` did not exist); now
``--max-consumer-positions`` (``ServerConfig.max_consumer_positions``) bounds the positions the
file holds: a commit that would add past it is refused with ``LIMIT_EXCEEDED`` naming the
option, counted (``consumer_commits_refused``), and leaves the file as it was; a commit that
adds nothing (moving known positions) is always taken, and forgetting a consumer or its
recordings going makes room again. Real files, the registry the server uses."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from aeron_spark.connector.errors import LimitExceededError
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.retention import ConsumerRegistry
from aeron_spark.errors import ConfigurationError


def _on_disk(tmp_path: Path) -> int:
    body = msgpack.unpackb((tmp_path / "consumers.msgpack").read_bytes(), strict_map_key=False)
    return sum(len(entry["positions"]) for entry in body.values())


def test_positions_past_the_bound_are_refused_and_counted(tmp_path: Path) -> None:
    registry = ConsumerRegistry(str(tmp_path), max_positions=6)
    registry.commit("a", [10], {rid: 100 for rid in range(4)}, now_s=1.0)
    registry.commit("b", [10], {4: 1, 5: 1}, now_s=1.0)
    assert registry.positions == 6 and _on_disk(tmp_path) == 6
    # a new consumer, or a known one naming a recording it had no position of: refused
    with pytest.raises(LimitExceededError) as refused:
        registry.commit("c", [10], {6: 1}, now_s=2.0)
    assert "--max-consumer-positions" in str(refused.value) and refused.value.limit == 6
    with pytest.raises(LimitExceededError):
        registry.commit("a", [10], {0: 200, 7: 1}, now_s=2.0)
    assert registry.commits_refused == 2
    assert registry.consumers["a"].positions[0] == 100  # the refused commit took nothing
    assert _on_disk(tmp_path) == 6 and "c" not in registry.consumers
    # moving known positions adds nothing: always taken
    registry.commit("a", [10], {0: 300, 1: 300}, now_s=3.0)
    assert registry.consumers["a"].positions[0] == 300
    # room made by forgetting a consumer and by recordings going
    registry.forget("b")
    registry.commit("c", [10], {6: 1}, now_s=4.0)
    assert registry.drop_recordings(lambda rid: rid in (0, 1)) == 2
    registry.commit("c", [10], {7: 1, 8: 1, 9: 1}, now_s=5.0)
    assert registry.positions == 6 == _on_disk(tmp_path)
    # the count is the file's after a restart
    assert ConsumerRegistry(str(tmp_path), max_positions=6).positions == 6


def test_the_bound_is_a_validated_server_option(tmp_path: Path) -> None:
    assert ServerConfig(directory=str(tmp_path), port=0).max_consumer_positions == 1_000_000
    for bad in (0, -1):
        with pytest.raises(ConfigurationError) as refused:
            ServerConfig(directory=str(tmp_path), port=0, max_consumer_positions=bad)
        assert refused.value.name == "max_consumer_positions"
