"""Malformed and unauthorised control requests get typed errors and disturb no other session."""

from __future__ import annotations

import time

import msgpack
import pytest

from aeron_spark.connector.errors import (
    ControlProtocolError,
    NotAuthorisedError,
    UnknownRecordingError,
)
from aeron_spark.connector.server import ServerConfig, StreamServer
from aeron_spark.connector.server.testing import client_for, client_process
from aeron_spark.connector.session import protocol as proto


def _config(tmp_path, **kw) -> ServerConfig:
    return ServerConfig(
        directory=str(tmp_path / "srv"),
        port=0,
        encryption=False,
        term_length=1024 * 1024,
        mtu=4096,
        **kw,
    )


def test_garbage_gets_protocol_errors_and_other_sessions_carry_on(tmp_path) -> None:
    with (
        StreamServer(_config(tmp_path)) as srv,
        client_for(srv.endpoint) as good,
        client_for(srv.endpoint) as bad,
    ):
        good.publish(10, [b"before"])
        live = good.replay(good.list_recordings([10])[0].recording_id, 0, None)
        first = next(live)
        for junk in (b"", b"\x01", b"\x01\xc1", b"\x07garbage", b"\x01" + msgpack.packb([1, 2])):
            bad._send(junk)  # too broken to have an id: answered on id 0, raised by the next call
            with pytest.raises(ControlProtocolError):
                bad.call("keepalive")
        rid = 4_000_000_000
        bad._send(b"\x01" + msgpack.packb({"id": rid, "op": "replay", "args": {"x": 1}}))
        with pytest.raises(ControlProtocolError, match="unknown arguments"):
            bad._wait_reply(rid)
        with pytest.raises(ControlProtocolError, match="unknown operation"):
            bad.call("drop_tables")
        with pytest.raises(ControlProtocolError, match="argument"):
            bad.call("position_at", recording_id="one", timestamp_ns=0)
        with pytest.raises(UnknownRecordingError):
            bad.call("position_at", recording_id=99, timestamp_ns=0)
        # both sessions still work, and the live replay of the good one continues
        assert bad.list_recordings([10])
        good.publish(10, [b"after"])
        seen = [first]
        for block in live:
            seen.append(block)
            if bytes(block.data).find(b"after") >= 0:
                break
        live.close()
        assert b"after" in b"".join(bytes(b.data) for b in seen)
        counters = good.stats()["counters"]
        assert counters["protocol_errors"] >= 6


def test_read_only_server_refuses_writes_with_not_authorised(tmp_path) -> None:
    with StreamServer(_config(tmp_path, read_only=True)) as srv, client_for(srv.endpoint) as c:
        for call in (
            lambda: c.publish(10, [b"x"]),
            lambda: c.stage("s", 0, 0, 0, 10, [b"x"]),
            lambda: c.commit("s", 0, 10, []),
            lambda: c.purge(0, 0),
        ):
            with pytest.raises(NotAuthorisedError):
                call()
        assert c.list_recordings() == []


def test_a_refused_publish_is_raised_when_its_refusal_arrives(tmp_path) -> None:
    """A publish of one request (a list of small messages) refused by the server raises the
    refusal as it arrives: on main the client then waited for a second reply to the same request
    (its settling of a failed publish) and raised only after its whole ``timeout_s`` (30 s);
    every refusal of a small publish (read-only server, stream not allowed, key not allowed)
    took that long. The bound is half the timeout: a refusal's round trip takes milliseconds."""
    timeout_s = 30.0
    with (
        StreamServer(_config(tmp_path, read_only=True)) as srv,
        client_for(srv.endpoint, timeout_s=timeout_s) as c,
    ):
        for _ in range(2):
            began = time.monotonic()
            with pytest.raises(NotAuthorisedError, match="read-only"):
                c.publish(10, [b"x"])
            took = time.monotonic() - began
            assert took < timeout_s / 2, f"the refusal took {took:.1f} s (timeout {timeout_s} s)"
        assert c.list_recordings() == []  # the session is clean: the next call's own reply


def test_streams_outside_the_allowed_set_are_not_authorised(tmp_path) -> None:
    cfg = _config(tmp_path, allowed_stream_ids=frozenset({10}))
    with StreamServer(cfg) as srv, client_for(srv.endpoint) as c:
        c.publish(10, [b"ok"])
        with pytest.raises(NotAuthorisedError):
            c.publish(11, [b"no"])
        with pytest.raises(NotAuthorisedError):
            c.list_recordings([11])


def test_stop_replay_of_another_sessions_replay_does_nothing(tmp_path) -> None:
    with (
        StreamServer(_config(tmp_path)) as srv,
        client_for(srv.endpoint) as a,
        client_for(srv.endpoint) as b,
    ):
        a.publish(10, [b"x"])
        rec = a.list_recordings([10])[0]
        live = a.replay(rec.recording_id, 0, None)
        next(live)
        assert b.call("stop_replay", replay_id=1) is False
        a.publish(10, [b"y"])
        assert b"y" in bytes(next(live).data)
        live.close()


def test_request_encoding_is_checked_before_sending() -> None:
    with pytest.raises(ControlProtocolError):
        proto.decode_request(proto.encode_request(1, "replay", {"recording_id": -1, "start": 0}))


def test_client_reconnects_after_the_server_expired_its_idle_session(tmp_path) -> None:
    """An idle session is expired only once its transport is silent for the lease (an alive
    client's driver keeps it: test_session_liveness.py): SIGSTOP freezes the client process,
    driver included; resumed, its next request goes out on a new session, and works."""
    import os
    import signal
    import time

    cfg = _config(tmp_path, session_lease_ns=1_000_000_000)
    with StreamServer(cfg) as srv, client_process(srv.endpoint, 1, 10) as client:
        assert srv.core is not None
        os.kill(client.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            while srv.core.counters["sessions_expired"] < 1:  # silent: the server expires it
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            os.kill(client.proc.pid, signal.SIGCONT)
        assert client.ask() == {"recordings": [1], "reconnects": [1]}
        assert srv.core.counters["sessions_expired"] == 1


def test_a_failed_publish_leaves_the_session_usable(tmp_path) -> None:
    from aeron_spark.connector.errors import PayloadTooLargeError

    cfg = _config(tmp_path)  # term 1 MiB: messages of at most 128 KiB
    with StreamServer(cfg) as srv, client_for(srv.endpoint) as c:
        with pytest.raises(PayloadTooLargeError):
            c.publish(10, [b"a" * 1000] * 5000 + [b"b" * 200_000] + [b"c"] * 10)
        assert c.publish(10, [b"after"]) > 0


def test_abandoned_replays_leave_no_state_behind(tmp_path) -> None:
    with StreamServer(_config(tmp_path)) as srv, client_for(srv.endpoint) as c:
        c.publish(10, [b"z" * 500] * 5000)
        rec = c.list_recordings([10])[0]
        for _ in range(3):
            blocks = c.replay(rec.recording_id, rec.start_position, rec.recorded_position)
            next(blocks)
            blocks.close()  # stop early: the server stops the replay, late data is dropped
        assert c.latest_positions([10]) == {rec.recording_id: rec.recorded_position}
        assert not c._replies and not c._outstanding and not c._replay_queues
