"""Consumers saved before per-client shares (``consumers.msgpack`` entries without a client:
an open server's, before issue 28's shares) are charged to the first client that commits them.
Claiming one is taking a consumer: past ``--max-consumers-per-client`` it is refused as a new
consumer is (``LIMIT_EXCEEDED``, counted in ``new_consumers_refused``). Before, a client could
claim every legacy consumer in the store, however many, past its share.

A real server process on a directory holding such a file, a real session over loopback UDP."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from aeron_spark.connector.errors import LimitExceededError
from aeron_spark.connector.server.testing import client_for, server_process

SHARE = 2  # --max-consumers-per-client here
LEGACY = 5  # consumers in the old file, all without a client


def test_a_client_claims_legacy_consumers_only_up_to_its_share(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    directory.mkdir()
    old = {
        f"query-{n}": {"stream_ids": [10], "updated_s": 1.0, "positions": {}, "owner": ""}
        for n in range(LEGACY)
    }
    (directory / "consumers.msgpack").write_bytes(msgpack.packb(old))
    extra = ["--max-consumers-per-client", str(SHARE)]
    with server_process(str(directory), extra) as (_proc, endpoint):
        with client_for(endpoint) as client:
            claimed, refused = [], []
            for n in range(LEGACY):
                try:
                    client.consumer_commit(f"query-{n}", [10], {})
                    claimed.append(n)
                except LimitExceededError as exc:
                    assert "--max-consumers-per-client" in str(exc), exc
                    refused.append(n)
            # main: all 5 claimed by one client with a share of 2
            assert claimed == list(range(SHARE)), (claimed, refused)
            counters = client.stats()["counters"]
            assert counters.get("new_consumers_refused") == LEGACY - SHARE, counters
            # a consumer it holds already is committed again as before (not a new claim)
            client.consumer_commit("query-0", [10], {})
            # and once it forgets one, it may claim another legacy consumer in its place
            assert client.consumer_forget("query-1")
            client.consumer_commit(f"query-{SHARE}", [10], {})
            with pytest.raises(LimitExceededError):
                client.consumer_commit(f"query-{SHARE + 1}", [10], {})
