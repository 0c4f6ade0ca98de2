"""Attacks on the consumer registry (README "Security model": a read-only client may "commit its
own consumers' positions for them", i.e. for its streams), over real sessions against a server
process with ``--authorized-keys``.

1. ``consumer_commit`` was checked for read permission on its ``stream_ids`` only: the
   recording ids of its ``positions`` were taken as they came, and merged into the consumer's
   positions (``retention.ConsumerRegistry.commit``) commit after commit. A client allowed to read
   one stream so made the server hold any number of positions for recordings that do not exist:
   20 commits of 65,536 made-up recording ids (1.2 MB each, 25 MB sent) took the server from 48 to
   339 MiB resident (537 MiB peak), wrote a 30 MB ``consumers.msgpack`` (rewritten whole at each
   commit, on the commit worker every writer's sink commits share), and the once-a-second
   ``stat.json`` snapshot, which lists every position on the loop's thread, stalled another
   client's ``list_streams`` for over a minute (load average 21-25, the shared 2-core machine).
   Fixed in ``authz.py``: a position's recording must exist and be of a stream the key may read
   (``request_streams`` adds its stream), so a consumer holds at most one position per readable
   recording.
2. The number of consumers a key may create has no bound (each ``consumer_id`` is a new entry,
   kept for the consumer lease, 7 days by default, and rewritten with all the others at every
   commit). Fixed: ``--max-consumers-per-client`` (1024; all consumers without an owner
   together on an open server): a new consumer past it is refused with ``LIMIT_EXCEEDED``
   (``retention.ConsumerRegistry.commit``).
3. A server without ``--authorized-keys`` kept made-up recording ids too (the existence check
   was authz.py's only): ``ServerCore._op_consumer_commit`` now refuses them
   (``UNKNOWN_RECORDING`` naming the recording).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import (
    LimitExceededError,
    UnknownRecordingError,
)
from aeron_spark.connector.server import ServerConfig
from aeron_spark.connector.server.testing import server_process
from aeron_spark.handshake.keystore import client_public_key_hex

TIMEOUT_S = 60.0


def _keys(tmp_path: Path) -> tuple[str, str, str]:
    """(reader key store, writer key store, authorized keys file): the reader may read stream 10
    only, the writer everything."""
    reader, writer = str(tmp_path / "keys-reader"), str(tmp_path / "keys-writer")
    path = tmp_path / "authorized_keys"
    path.write_text(
        f"{client_public_key_hex(reader)} reader read=10\n"
        f"{client_public_key_hex(writer)} writer read=* write=*\n"
    )
    return reader, writer, str(path)


def _server(tmp_path: Path, keys_file: str, extra: list[str] | None = None):  # type: ignore[no-untyped-def]
    return server_process(
        str(tmp_path / "srv"),
        ["--authorized-keys", keys_file, "--key-store", str(tmp_path / "server-keys")]
        + (extra or []),
    )


def _client(endpoint: str, key_store: str) -> StreamClient:
    return StreamClient.connect(
        ClientSettings(
            endpoint=endpoint, encryption=False, key_store_dir=key_store, timeout_s=TIMEOUT_S
        )
    )


def test_attack_consumer_positions_of_recordings_it_cannot_read_are_refused(
    tmp_path: Path,
) -> None:
    reader, writer, keys_file = _keys(tmp_path)
    with _server(tmp_path, keys_file) as (_proc, endpoint):
        with _client(endpoint, writer) as w, _client(endpoint, reader) as r:
            end10 = w.publish(10, [b"row-%02d" % i for i in range(10)])
            w.publish(11, [b"secret"])
            rec10 = w.list_recordings([10])[0].recording_id
            rec11 = w.list_recordings([11])[0].recording_id

            # 65,536 made-up recording ids: none exists
            made_up = [[(1 << 40) + i, 1 << 40] for i in range(65536)]
            with pytest.raises(UnknownRecordingError) as unknown:
                r.call("consumer_commit", consumer_id="q", stream_ids=[10], positions=made_up)
            # a recording of a stream the reader may not read, under a stream it may read: as if
            # it did not exist (a reader cannot tell which ids exist on other streams)
            with pytest.raises(UnknownRecordingError) as refused:
                r.call(
                    "consumer_commit",
                    consumer_id="q",
                    stream_ids=[10],
                    positions=[[rec10, end10], [rec11, 1 << 40]],
                )
            assert refused.value.details == {"recording_id": rec11}, refused.value
            assert "11" not in str(refused.value).replace(str(rec11), ""), refused.value
            # the same with no stream named at all (an empty stream_ids is accepted)
            with pytest.raises(UnknownRecordingError):
                r.call("consumer_commit", consumer_id="q", stream_ids=[], positions=[[rec11, 64]])

            # what the reader may do still works: its own stream's recording
            r.consumer_commit("q", [10], {rec10: end10})
            consumers = {c["consumer_id"]: c for c in w.stats()["consumers"]}
            assert consumers["q"]["positions"] == {str(rec10): end10}, (consumers, unknown.value)
    registry = tmp_path / "srv" / "consumers.msgpack"
    assert os.path.getsize(registry) < 4096, os.path.getsize(registry)


LIMIT = 64  # the server's --max-consumers-per-client here (each commit rewrites the registry
# whole: up to the default 1024 the test took 70 s at load 14; the bound is the same code)


def test_attack_a_reader_cannot_create_consumers_without_bound(tmp_path: Path) -> None:
    assert ServerConfig(directory=str(tmp_path)).max_consumers_per_client == 1024  # the default
    reader, writer, keys_file = _keys(tmp_path)
    with _server(tmp_path, keys_file, ["--max-consumers-per-client", str(LIMIT)]) as (
        _proc,
        endpoint,
    ):
        with _client(endpoint, writer) as w, _client(endpoint, reader) as r:
            end = w.publish(10, [b"row"])
            rec = w.list_recordings([10])[0].recording_id
            created = 0
            with pytest.raises(LimitExceededError) as refused:
                for n in range(LIMIT + 10):
                    r.consumer_commit(f"made-up-consumer-{n:05d}", [10], {rec: end})
                    created += 1
            assert created == LIMIT, created
            assert f"at most {LIMIT} consumers" in str(refused.value), refused.value
            # the writer (another key) still has its own allowance
            w.consumer_commit("the-writers-own", [10], {rec: end})


def test_attack_an_open_server_refuses_consumer_positions_of_unknown_recordings(
    tmp_path: Path,
) -> None:
    """Without ``--authorized-keys`` the existence check was authz.py's only: made-up recording
    ids were merged into the consumer's positions and kept for the consumer lease."""
    client = str(tmp_path / "keys-client")
    options = ["--key-store", str(tmp_path / "server-keys")]
    with server_process(str(tmp_path / "srv"), options) as (_proc, endpoint):
        with _client(endpoint, client) as c:
            end = c.publish(10, [b"row"])
            rec = c.list_recordings([10])[0].recording_id
            made_up = (1 << 40) + 7
            with pytest.raises(UnknownRecordingError) as unknown:
                c.call(
                    "consumer_commit",
                    consumer_id="q",
                    stream_ids=[10],
                    positions=[[rec, end], [made_up, 64]],
                )
            assert str(made_up) in str(unknown.value), unknown.value
            assert "q" not in {x["consumer_id"] for x in c.stats()["consumers"]}
            c.consumer_commit("q", [10], {rec: end})  # a real recording still works
            consumers = {x["consumer_id"]: x for x in c.stats()["consumers"]}
            assert consumers["q"]["positions"] == {str(rec): end}, consumers
