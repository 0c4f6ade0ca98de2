"""``archive`` naming several control channels (issue 30, the source over archive replicas):
the option's parsing, the store it gives, the key and end rules of :mod:`...stores.replicas`
(what needs no archive running; the real archives are in ``test_archive_replicas_interop.py``)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from aeron_spark.connector.options import parse_archive_source_options
from aeron_spark.connector.source import stores_of
from aeron_spark.connector.stores import Recording, RecordingIdentity
from aeron_spark.connector.stores.archive import ArchiveStore
from aeron_spark.connector.stores.replicas import (
    ReplicaRange,
    ReplicaStore,
    identity_key,
    in_sync_end,
)
from aeron_spark.errors import ConfigurationError

A = "aeron:udp?endpoint=127.0.0.1:8010"
B = "aeron:udp?endpoint=127.0.0.1:8011"
C = "aeron:udp?endpoint=127.0.0.1:8012|tags=1,2"  # a comma inside a URI is no separator


def _options(archive: str, **more: str):  # type: ignore[no-untyped-def]
    return parse_archive_source_options({"archive": archive, "streamId": "7", **more})


def test_one_control_channel_is_one_archive_as_before() -> None:
    options = _options(A)
    assert options.replicas == () and options.connects == (options.connect,)
    _, stores = stores_of(options)
    assert stores == (ArchiveStore(options.connect, ""),)


def test_several_control_channels_are_one_store_of_replicas_in_preference_order() -> None:
    options = _options(f"{A}, {B} ,{C}", archiveControlStreamId="11", timeoutMs="4000")
    assert [c.control_channel for c in options.connects] == [A, B, C]
    assert {(c.control_stream_id, c.timeout_s) for c in options.connects} == {(11, 4.0)}
    _, stores = stores_of(options)
    (store,) = stores
    assert isinstance(store, ReplicaStore) and store.control_channels == [A, B, C]
    assert pickle.loads(pickle.dumps(store)) == store  # tasks carry it


@pytest.mark.parametrize(
    ("archive", "named"),
    [
        (f"{A},{A}", "twice"),
        (f"{A},aeron:ipc", "aeron:ipc"),
        (f"{A},aeron:udp?control=127.0.0.1:9", "aeron:udp?control=127.0.0.1:9"),
        (f"{A},", A + ","),
    ],
)
def test_a_bad_control_channel_in_the_list_is_named(archive: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        _options(archive)
    assert info.value.name == "archive" and named in str(info.value)


def _rec(store: object, rid: int, end: int) -> Recording:
    return Recording(f"x/{rid}", store, rid, 7, -5, 3, 65536, 1408, 0, 0, end)  # type: ignore[arg-type]


def test_copies_share_one_key_and_the_end_is_what_every_in_sync_copy_holds() -> None:
    a = ArchiveStore(_options(A).connect)
    b = ArchiveStore(_options(B).connect)
    one, two = _rec(a, 1, 4096), _rec(b, 9, 1024)
    assert one.identity == two.identity  # recording ids differ, the identity does not
    assert identity_key(one.identity) == "7/-5/3/0/65536/1408"
    # Both recording (live): the smaller end; a stopped copy as long as the longest counts too.
    assert in_sync_end([one, two], [True, True]) == 1024
    assert in_sync_end([one, two], [False, True]) == 1024
    # A stopped copy shorter than another can never serve the rest: it holds nothing back.
    assert in_sync_end([one, two], [True, False]) == 4096
    assert in_sync_end([one, dataclasses.replace(two, end=4096)], [False, False]) == 4096


def test_a_range_keeps_its_identity_when_split_and_pickled() -> None:
    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    rec = dataclasses.replace(_rec(store, 1, 1 << 20), key="7/-5/3/0/65536/1408")
    part = store.partition(rec, 0, 1 << 20, False)
    assert isinstance(part, ReplicaRange)
    assert part.identity == RecordingIdentity(7, -5, 3, 0, 65536, 1408)
    shares = store.split(part, 4)
    assert len(shares) == 4
    for share in shares:
        again = pickle.loads(pickle.dumps(share))
        assert isinstance(again, ReplicaRange) and again.identity == part.identity
        assert again.store == store


def test_the_probe_wait_is_checked() -> None:
    from aeron_spark.transport.archive.client import ArchiveClientConfig

    assert ArchiveClientConfig(A, timeout_s=30, connect_timeout_s=3).connect_timeout_s == 3
    for bad in (0, -1, "3"):
        with pytest.raises(ConfigurationError, match="connect_timeout_s"):
            ArchiveClientConfig(A, connect_timeout_s=bad)  # type: ignore[arg-type]


def test_a_sink_targets_copies_share_one_key_without_the_session_id() -> None:
    """Each append extends a sink's target with a new session id, which the archive's catalog
    keeps (and each replication's on a copy): a target is known by the sink's alias instead."""
    a = ArchiveStore(_options(A).connect)
    b = ArchiveStore(_options(B).connect)
    alias = "aeron-spark-sink-0123456789abcdef"
    target = dataclasses.replace(_rec(a, 1, 4096), committed_only=True, alias=alias)
    copy = dataclasses.replace(target, store=b, recording_id=4, session_id=77, end=2048)
    assert target.identity == copy.identity
    assert identity_key(copy.identity) == f"7/{alias}/3/0/65536/1408"
    other = dataclasses.replace(copy, alias="aeron-spark-sink-fedcba9876543210")  # another sink
    assert other.identity != target.identity
    assert _rec(a, 1, 4096).identity != target.identity  # a plain recording keeps its session id


def test_the_probe_and_silence_waits_are_checked() -> None:
    from aeron_spark.transport.archive.client import ArchiveClientConfig

    config = ArchiveClientConfig(A, timeout_s=30, silence_timeout_s=1.5)
    assert config.silence_timeout_s == 1.5
    assert ArchiveClientConfig(A).silence_timeout_s is None  # off unless asked
    for bad in (0, -1, "3"):
        with pytest.raises(ConfigurationError, match="silence_timeout_s"):
            ArchiveClientConfig(A, silence_timeout_s=bad)  # type: ignore[arg-type]


def test_a_closed_port_is_refused_at_once_and_remembered() -> None:
    """An archive whose host has nothing on its control port (a process killed -9 on a living
    host): the connect is refused after ``QUICK_S`` (ICMP port unreachable), with a coded error
    naming it, not after the probe wait; an open port (something listening that ignores the
    probe) is not taken for a closed one."""
    import socket

    from aeron_spark.connector.errors import ServerUnavailableError
    from aeron_spark.connector.stores.archive import health
    from aeron_spark.transport.testing import free_udp_port

    closed = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    assert health.refused(closed)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listening:
        listening.bind(("127.0.0.1", 0))
        listening.settimeout(30)
        open_port = f"aeron:udp?endpoint=127.0.0.1:{listening.getsockname()[1]}"
        assert not health.refused(open_port)
        assert listening.recv(64)  # it got the probe: a frame header, which Aeron ignores
    connect = dataclasses.replace(_options(closed).connect, timeout_s=120.0)
    with pytest.raises(ServerUnavailableError, match="port unreachable") as info:
        health.connect(connect)
    assert closed in str(info.value)


def test_the_archives_the_driver_found_failing_go_last_in_its_tasks() -> None:
    from aeron_spark.connector.stores.archive import health
    from aeron_spark.connector.stores.replicas.source import _order

    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    rec = dataclasses.replace(_rec(store, 1, 1 << 20), key="k")
    try:
        health.mark_failed(A)
        part = store.partition(rec, 0, 1 << 20, False)
        assert isinstance(part, ReplicaRange) and part.avoid == (A,)
    finally:
        health.mark_ok(A)
    shipped = pickle.loads(pickle.dumps(store.split(part, 2)[1]))  # a task, another process
    assert isinstance(shipped, ReplicaRange) and shipped.avoid == (A,)
    assert [r.connect.control_channel for r in _order(store.replicas, shipped.avoid)] == [B, A]
    assert [r.connect.control_channel for r in _order(store.replicas)] == [A, B]


def test_a_sink_target_is_read_only_as_far_as_its_min_insync_archives_hold_it() -> None:
    """A sink's target whose last commit needed 2 archives (``insync``, from its markers): the
    end is what 2 of the set hold, an archive missing from the listing holding nothing; with
    ``insync`` 1 (the default, and markers of before) the rule above alone."""
    store = ReplicaStore((ArchiveStore(_options(A).connect), ArchiveStore(_options(B).connect)))
    target = dataclasses.replace(_rec(store, 1, 4096), committed_only=True, alias="s", insync=2)
    primary, copy = target, dataclasses.replace(target, recording_id=2, end=1024)
    # the primary's END of a batch, its copy not begun yet (stopped, behind)
    assert in_sync_end([primary, copy], [False, False], 2) == 1024
    assert in_sync_end([primary, copy], [False, False], 3) == 1024
    # copied: both hold it
    assert in_sync_end([primary, dataclasses.replace(copy, end=4096)], [False, False], 2) == 4096
    # the only archive that answers cannot confirm anything: nothing (its start)
    assert in_sync_end([primary], [False], 2) == primary.start
    # two of three hold it; the third is behind
    third = dataclasses.replace(copy, recording_id=3, end=512)
    assert in_sync_end([primary, copy, third], [False, False, False], 3) == 1024
    assert (
        in_sync_end([primary, dataclasses.replace(copy, end=4096), third], [False] * 3, 3) == 4096
    )
    # minInSyncReplicas 1: as before (the longest stopped copy)
    one = [dataclasses.replace(r, insync=1) for r in (primary, copy)]
    assert in_sync_end(one, [False, False], 2) == 4096
