"""Issue 19: client authentication and per-stream permissions on the stream server
(``--authorized-keys``): unknown keys refused in the handshake, every request checked, the file
re-read on change with revoked keys' sessions closed, and the permission table itself."""

from __future__ import annotations

import base64
import io
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import (
    NotAuthorisedError,
    ServerUnavailableError,
    UnknownRecordingError,
)
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.authz import OP_PERMISSION, StreamSet, allowed, parse
from aeron_spark.connector.server.stat import stat_main
from aeron_spark.connector.server.testing import (
    authorized_keys,
    authorizing_server,
    client_key,
)
from aeron_spark.errors import ConfigurationError
from aeron_spark.handshake.errors import ClientUnknownError
from aeron_spark.handshake.keystore import KeyStore


def _settings(server: StreamServer, key_store: str, **kw: object) -> ClientSettings:
    return ClientSettings(
        endpoint=server.endpoint,
        server_key=server.public_key,
        key_store_dir=key_store,
        timeout_s=10,
        **kw,
    )  # type: ignore[arg-type]


def _wait_for(condition, timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------ the file and the table


def test_the_file_is_parsed_strictly_and_errors_name_the_line() -> None:
    hexkey, other = "ab" * 32, bytes(range(32))
    table = parse(
        f"# comment\n\n{hexkey} ingest write=10,11\n"
        f"{base64.b64encode(other).decode()} ops read=* write=20-29 admin  # trailing\n"
    )
    assert table[bytes.fromhex(hexkey)].name == "ingest"
    ops = table[other]
    assert 5 in ops.read and 25 in ops.write and 30 not in ops.write and 7 in ops.admin
    for body, why in (
        (f"{hexkey}", "expected"),
        ("zz" * 32 + " a read=1", "neither 64 hex"),
        (f"{hexkey} a read=1-x", "not a stream id"),
        (f"{hexkey} a read=5-1", "low <= high"),
        (f"{hexkey} a delete=1", "unknown permission"),
        (f"{hexkey} a read", "needs a list"),
        (f"{hexkey} a read=1 read=2", "twice"),
        (f"{hexkey} a\n{hexkey} b", "already listed"),
        (f"{hexkey} a\n{'cd' * 32} a", "already used"),
        (f"{hexkey} bad/name", "name"),
    ):
        with pytest.raises(ConfigurationError, match=why) as error:
            parse("# header\n" + body, "keys.txt")
        # the file and the line number are named (the header is line 1)
        assert f"keys.txt:{2 + body.count(chr(10))}" in str(error.value)


_PERMS = st.fixed_dictionaries(
    {
        p: st.one_of(
            st.none(),
            st.just("*"),
            st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), min_size=1, max_size=3).map(
                lambda rs: ",".join(f"{a}-{a + n}" if n else str(a) for a, n in rs)
            ),
        )
        for p in ("read", "write", "admin")
    }
)


@settings(max_examples=300, deadline=None)
@given(
    _PERMS,
    st.sampled_from(sorted(OP_PERMISSION) + ["truncate", "nonsense"]),
    st.one_of(st.none(), st.integers(-2, 50)),
)
def test_permission_table_over_permissions_and_requests(perms, op, stream_id) -> None:
    tokens = " ".join(f"{p}={v}" for p, v in perms.items() if v is not None)
    grant = parse(f"{'ab' * 32} who {tokens}")[bytes.fromhex("ab" * 32)]

    def streams(text: str | None) -> set[int] | str:
        if text is None:
            return set()
        if text == "*":
            return "*"
        out: set[int] = set()
        for item in text.split(","):
            a, _, b = item.partition("-")
            out.update(range(int(a), int(b or a) + 1))
        return out

    # the oracle, written from the table independently of OP_PERMISSION
    read_ops = {
        "list_streams",
        "list_recordings",
        "latest_positions",
        "position_at",
        "scan",
        "replay",
        "local_read",
        "consumer_commit",
        "stats",
        "recording_positions",
        "scan_ranges",
        "local_read_ranges",
        "replay_ranges",
    }
    write_ops = {
        "publish",
        "stage",
        "local_stage",
        "local_stage_done",
        "commit",
        "abort",
        "last_committed_batch",
    }
    admin_ops = {"purge", "consumer_forget"}
    if op in ("keepalive", "stop_replay", "limits"):
        expected = True
    elif op in read_ops | write_ops | admin_ops:
        perm = "read" if op in read_ops else "write" if op in write_ops else "admin"
        held = streams(perms[perm])
        if stream_id is None:
            expected = held == "*" or bool(held)
        else:
            expected = held == "*" or stream_id in held
    else:
        expected = False  # an operation the table does not know is never allowed
    assert allowed(grant, op, stream_id) is expected
    assert allowed(None, op, stream_id) is (op in ("keepalive", "stop_replay", "limits"))


def test_stream_sets() -> None:
    s = StreamSet.parse("10,11,20-29")
    assert 10 in s and 11 in s and 20 in s and 29 in s and 12 not in s and 30 not in s
    assert -3 in StreamSet.parse("-5--1") and 0 not in StreamSet.parse("-5--1")


# ------------------------------------------------------------------ over real sessions


def test_an_unknown_client_key_is_refused_in_the_handshake_before_anything_is_allocated(
    tmp_path: Path,
) -> None:
    reader, reader_key = client_key(tmp_path, "reader")
    stranger, _ = client_key(tmp_path, "stranger")
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"{reader_key} reader read=10\n")
    with authorizing_server(tmp_path, keys) as server:
        with pytest.raises(ServerUnavailableError, match="CLIENT_UNKNOWN") as error:
            StreamClient.connect(_settings(server, stranger))
        assert isinstance(error.value.__cause__, ClientUnknownError)
        hs = server.snapshot()["handshake"]
        assert hs["clients_refused"] == 1 and hs["refused"].get("CLIENT_UNKNOWN") == 1
        assert hs["accepted"] == 0 and hs["pending"] == 0 and hs["connections"] == 0
        assert not server._listener.server.core.session_ids  # no session id was allocated
        with StreamClient.connect(_settings(server, reader)) as client:  # a listed key connects
            assert client.list_streams() == []
        sessions = server.snapshot()["sessions"]
        assert [s.get("client") for s in sessions] == ["reader"]


def test_a_read_only_key_cannot_publish_stage_or_commit_and_sees_only_its_streams(
    tmp_path: Path,
) -> None:
    keys, stores = authorized_keys(
        tmp_path, {"writer": "write=10,11 read=10,11", "reader": "read=10"}
    )
    writer, reader = stores["writer"], stores["reader"]
    with authorizing_server(tmp_path, keys) as server:
        with StreamClient.connect(_settings(server, writer)) as w:
            w.publish(10, [b"ten"])
            w.publish(11, [b"eleven"])
            with pytest.raises(NotAuthorisedError, match="publish on stream 12") as error:
                w.publish(12, [b"twelve"])
            assert error.value.details["stream_id"] == 12 and error.value.details["op"] == "publish"
            staged = w.stage("sink", 1, 0, 0, 10, [b"row"], local=False)
        with StreamClient.connect(_settings(server, reader)) as r:
            for call, op in (
                (lambda: r.publish(10, [b"x"]), "publish"),
                (lambda: r.stage("sink", 2, 0, 0, 10, [b"row"], local=False), "stage"),
                (lambda: r.commit("sink", 1, 10, [staged]), "commit"),
            ):
                with pytest.raises(NotAuthorisedError) as error:
                    call()
                assert error.value.details["op"] == op and error.value.details["stream_id"] == 10
                assert f"{op} on stream 10" in str(error.value) and "'reader'" in str(error.value)
            recording = next(rec for rec in r.list_recordings() if rec.stream_id == 10)
            assert [rec.stream_id for rec in r.list_recordings()] == [10]  # 11 is not shown
            assert [s["stream_id"] for s in r.list_streams()] == [10]
            with pytest.raises(NotAuthorisedError, match="list_recordings on stream 11"):
                r.list_recordings([11])
            with pytest.raises(NotAuthorisedError, match="purge on stream 10"):
                r.purge(recording.recording_id, 0)
            with pytest.raises(NotAuthorisedError, match="consumer_forget on any stream"):
                r.consumer_forget("someone")
            blocks = list(r.replay(recording.recording_id, 0, recording.recorded_position))
            assert blocks  # reading its own stream works
            # local reads and local stages are offered only to sessions allowed the operation
            assert (
                r.call(
                    "local_read",
                    recording_id=recording.recording_id,
                    start=0,
                    end=recording.recorded_position,
                )
                is not None
            )
            with pytest.raises(NotAuthorisedError, match="local_stage on stream 10"):
                r.call(
                    "local_stage",
                    sink_id="sink",
                    batch_id=3,
                    partition_id=0,
                    attempt=0,
                    stream_id=10,
                )
            assert "counters" in r.stats()["withheld"]  # server-wide: for admin keys only
            counters = server.snapshot()["counters"]
        with StreamClient.connect(_settings(server, writer)) as w:
            eleven = next(rec for rec in w.list_recordings() if rec.stream_id == 11)
        with StreamClient.connect(_settings(server, reader)) as r:
            # a recording it may not read is answered as one that does not exist (issue 28)
            with pytest.raises(
                UnknownRecordingError, match=f"^no recording {eleven.recording_id}$"
            ):
                r.call(
                    "local_read",
                    recording_id=eleven.recording_id,
                    start=0,
                    end=eleven.recorded_position,
                )
        assert counters["requests_not_authorised"] == 8
        with StreamClient.connect(_settings(server, writer)) as w:
            assert w.commit("sink", 1, 10, [staged])  # the writer may commit what it staged


def test_a_revoked_keys_open_session_is_closed_when_the_file_changes(tmp_path: Path) -> None:
    keep, keep_key = client_key(tmp_path, "keep")
    gone, gone_key = client_key(tmp_path, "gone")
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"{keep_key} keep read=*\n{gone_key} gone read=* write=*\n")
    with authorizing_server(tmp_path, keys) as server:
        kept = StreamClient.connect(_settings(server, keep))
        revoked = StreamClient.connect(_settings(server, gone))
        revoked.publish(5, [b"before"])
        _wait_for(lambda: len(server.snapshot()["sessions"]) == 2, what="two sessions")
        # A file that does not parse leaves the old table in force.
        keys.write_text(f"{keep_key} keep read=*\nnot a key line\n")
        _wait_for(
            lambda: server.snapshot()["counters"].get("authorized_keys_reload_failures"),
            what="the bad file noticed",
        )
        revoked.publish(5, [b"still allowed"])
        keys.write_text(f"{keep_key} keep read=*\n")
        os.utime(keys, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
        _wait_for(
            lambda: server.snapshot()["counters"].get("sessions_revoked") == 1,
            what="the revoked session closed",
        )
        _wait_for(lambda: not revoked._link.is_connected, what="the client told")

        def stat_counters() -> dict[str, int]:  # what `aeron-spark stat --dir` prints
            out = io.StringIO()
            stat_main(["--dir", server.config.directory, "--once", "--json"], out=out)
            return dict(json.loads(out.getvalue())["counters"])

        _wait_for(lambda: stat_counters().get("sessions_revoked") == 1, what="stat.json rewritten")
        shown = stat_counters()
        assert shown["authorized_keys_reloads"] >= 1  # the good file (once per change seen)
        assert shown["authorized_keys_reload_failures"] >= 1  # the bad one
        with pytest.raises(ServerUnavailableError):
            revoked.publish(5, [b"after"])
        assert kept.list_streams()  # the other session goes on
        with pytest.raises(ServerUnavailableError, match="CLIENT_UNKNOWN"):
            StreamClient.connect(_settings(server, gone))
        # SIGHUP's path: request_reload() re-reads without a change of mtime
        keys.write_text(f"{keep_key} keep read=*\n{gone_key} gone read=*\n")
        server.request_reload()
        _wait_for(
            lambda: server.authz is not None and len(server.authz.table) == 2, what="the reload"
        )
        StreamClient.connect(_settings(server, gone)).close()
        kept.close()
        revoked.close()


def test_without_the_file_any_client_may_connect(tmp_path: Path, caplog) -> None:
    anyone, _ = client_key(tmp_path, "anyone")
    config = ServerConfig(
        directory=str(tmp_path / "srv"),
        port=0,
        term_length=1 << 20,
        key_store_dir=str(tmp_path / "server-keys"),
    )
    with caplog.at_level("WARNING"), StreamServer(config).start() as server:
        with StreamClient.connect(_settings(server, anyone)) as client:
            client.publish(3, [b"x"])
    assert "any client may connect" in caplog.text


def test_an_explicit_client_key_file_is_used(tmp_path: Path) -> None:
    store, key = client_key(tmp_path, "spark")
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"{key} spark read=*\n")
    with authorizing_server(tmp_path, keys) as server:
        settings = _settings(
            server, str(tmp_path / "empty-store"), client_key=str(Path(store) / "client.key")
        )
        with StreamClient.connect(settings) as client:
            assert client.list_streams() == []
        assert not (tmp_path / "empty-store" / "client.key").exists()
    assert KeyStore(store).client_private_key()  # untouched


def test_commit_and_abort_are_checked_against_every_staged_parts_stream(tmp_path: Path) -> None:
    keys, stores = authorized_keys(tmp_path, {"both": "write=10,11", "ten": "write=10"})
    both, ten = stores["both"], stores["ten"]
    with authorizing_server(tmp_path, keys) as server:
        with StreamClient.connect(_settings(server, both)) as c:
            staged = c.stage("sink", 1, 0, 0, 11, [b"row"], local=False)
        with StreamClient.connect(_settings(server, ten)) as c:
            with pytest.raises(NotAuthorisedError, match="abort on stream 11"):
                c.abort("sink", 1, [staged])
            with pytest.raises(NotAuthorisedError, match="commit on stream 11"):
                c.commit("sink", 1, 10, [staged])  # a stream it may write, a part it may not
            assert c.last_committed_batch("sink") is None
        with StreamClient.connect(_settings(server, both)) as c:
            assert c.commit("sink", 1, 11, [staged])


_REQUESTS = st.one_of(
    st.tuples(
        st.sampled_from(["publish", "stage", "local_stage", "local_stage_done"]),
        st.builds(lambda s: {"stream_id": s}, st.integers(0, 40)),
    ),
    st.tuples(
        st.sampled_from(["list_recordings", "latest_positions", "consumer_commit"]),
        st.builds(lambda ids: {"stream_ids": ids}, st.lists(st.integers(0, 40), max_size=3)),
    ),
    st.tuples(
        st.sampled_from(["position_at", "scan", "replay", "local_read", "purge"]),
        st.builds(lambda r: {"recording_id": r}, st.integers(0, 40)),
    ),
    st.tuples(
        st.just("commit"),
        st.builds(
            lambda s, parts: {"stream_id": s, "staged": [{"stream_id": p} for p in parts]},
            st.integers(0, 40),
            st.lists(st.integers(0, 40), max_size=3),
        ),
    ),
    st.tuples(
        st.just("abort"),
        st.builds(
            lambda parts: {"staged": [{"stream_id": p} for p in parts]},
            st.lists(st.integers(0, 40), max_size=3),
        ),
    ),
    st.tuples(
        st.sampled_from(
            [
                "list_streams",
                "stats",
                "keepalive",
                "stop_replay",
                "last_committed_batch",
                "consumer_forget",
            ]
        ),
        st.just({}),
    ),
)


@settings(max_examples=300, deadline=None)
@given(_PERMS, _REQUESTS)
def test_every_request_is_checked_against_every_stream_it_touches(
    tmp_path_factory, perms, request
) -> None:
    from aeron_spark.connector.server.authz import Authorizer

    op, args = request
    tokens = " ".join(f"{p}={v}" for p, v in perms.items() if v is not None)
    path = tmp_path_factory.mktemp("authz") / "keys"
    path.write_text(f"{'ab' * 32} who {tokens}\n")
    authz = Authorizer(str(path))
    key = bytes.fromhex("ab" * 32)

    def stream_of(recording_id: int) -> int:  # recording r holds stream r + 1 here
        return recording_id + 1

    touched = set(args.get("stream_ids") or ())
    touched |= {args["stream_id"]} if "stream_id" in args else set()
    touched |= {args["recording_id"] + 1} if "recording_id" in args else set()
    touched |= {p["stream_id"] for p in args.get("staged", ())}
    grant = authz.table[key]
    expected = all(allowed(grant, op, s) for s in touched) if touched else allowed(grant, op)
    refused: NotAuthorisedError | UnknownRecordingError | None = None
    try:
        authz.check(key, op, args, stream_of)
    except (NotAuthorisedError, UnknownRecordingError) as exc:
        refused = exc
    assert (refused is None) is expected
    if isinstance(refused, UnknownRecordingError):  # its stream, unreadable: as if none existed
        hidden = args["recording_id"] + 1
        assert not allowed(grant, op, hidden) and not allowed(grant, "replay", hidden)
        assert refused.details == {"recording_id": args["recording_id"]}
        assert refused.message == f"no recording {args['recording_id']}"
    elif refused is not None:
        assert refused.details["op"] == op
        bad = refused.details["stream_id"]
        assert (bad in touched and not allowed(grant, op, bad)) or (bad is None and not touched)
    refusal = (NotAuthorisedError, UnknownRecordingError)
    with pytest.raises(refusal) if OP_PERMISSION[op] else nullcontext():
        authz.check(bytes(32), op, args, stream_of)  # an unlisted key: nothing but the free ops


def test_a_commit_of_several_streams_is_checked_on_every_parts_stream(tmp_path: Path) -> None:
    """Issue 32: a routing sink's commit names no stream_id; each staged part's stream is
    checked, so a key narrowed after staging commits nothing, on any stream."""
    keys, stores = authorized_keys(tmp_path, {"writer": "write=10,11 read=10,11"})
    writer = stores["writer"]
    with authorizing_server(tmp_path, keys) as server:
        with StreamClient.connect(_settings(server, writer)) as w:
            staged = [w.stage("route", 1, 0, 0, s, [b"row"], local=False) for s in (10, 11)]
        reloads = server.snapshot()["counters"].get("authorized_keys_reloads", 0)
        authorized_keys(tmp_path, {"writer": "write=10 read=10,11"})
        _wait_for(
            lambda: server.snapshot()["counters"].get("authorized_keys_reloads", 0) > reloads,
            what="the narrowed keys file",
        )
        with StreamClient.connect(_settings(server, writer)) as w:
            with pytest.raises(NotAuthorisedError, match="commit on stream 11"):
                w.commit("route", 1, None, staged)
            assert w.list_recordings([10, 11]) == []  # nothing of the batch appended
            assert w.commit("route", 1, None, staged[:1])["count"] == 1  # its own stream's part


def test_batched_positions_and_ranges_show_and_scan_only_readable_recordings(
    tmp_path: Path,
) -> None:
    keys, stores = authorized_keys(
        tmp_path, {"writer": "write=10,11 read=10,11", "reader": "read=10"}
    )
    writer, reader = stores["writer"], stores["reader"]
    with authorizing_server(tmp_path, keys) as server:
        with StreamClient.connect(_settings(server, writer)) as w:
            w.publish(10, [b"ten"] * 3)
            w.publish(11, [b"eleven"] * 3)
            everything = w.recording_positions()
        ten, eleven = sorted(everything.values(), key=lambda p: p.stream_id)
        with StreamClient.connect(_settings(server, reader)) as r:
            assert list(r.recording_positions()) == [ten.recording_id]  # 11 is not shown
            with pytest.raises(NotAuthorisedError, match="recording_positions on stream 11"):
                r.recording_positions([11])
            mine = (ten.recording_id, 0, ten.message_end)
            assert r.scan_ranges([mine]) == [(ten.message_end, 3)]
            # one range of a recording it may not read: refused as if it did not exist
            with pytest.raises(UnknownRecordingError, match="^no recording ") as error:
                r.scan_ranges([mine, (eleven.recording_id, 0, eleven.message_end)])
            assert "stream 11" not in str(error.value)
