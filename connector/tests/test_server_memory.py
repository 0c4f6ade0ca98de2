"""What a client can make the stream server hold in memory (issue 28, items 2 and 4).

Every attack runs over real sessions against a server in its own process, and the server's peak
resident memory (``VmHWM``) is bounded, not timed:

- a CHUNK header announcing 32 MiB (92 bytes on the wire) made the old server zero-fill 32 MiB,
  per session, until a later chunk or the session's end; now memory is charged as chunks arrive,
  and a header announcing more than a session may send is refused at once;
- the chunks of incomplete messages are bounded per session and across the server (a chunk past
  either is refused with ``LIMIT_EXCEEDED``) and are discarded on the clock, while the client
  keeps its session alive with keepalives;
- a msgpack bomb (a 9.5 MiB request of empty maps) took the old server from 46 to 796 MiB; now
  a control request is at most 64 KiB and a data request is decoded within its operation's
  limits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import msgpack

from aeron_spark.connector.client import StreamClient
from aeron_spark.connector.errors import ErrorCode
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session import protocol as proto

MIB = 1024 * 1024
TIMEOUT_S = 30.0


def _memory_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0])
    return out


def _send(client, message: bytes) -> None:
    """Send one raw message on the client's session (chunked as the client would)."""
    limit = client.max_message_length
    link = client._link
    if len(message) <= limit:
        link.send(message, time.monotonic() + TIMEOUT_S)
    else:
        for chunk in chunking.split(message, limit, 7):
            link.send(chunk, time.monotonic() + TIMEOUT_S)


def _replies_until(client, request_id: int) -> list[proto.Reply]:
    """Every reply on the raw session up to (and with) the one to ``request_id``."""
    deadline = time.monotonic() + TIMEOUT_S
    replies = []
    while True:
        message = client._link.receive(deadline)
        assert message is not None, f"no reply to request {request_id}: {replies}"
        if message[0] != proto.KIND_CONTROL:
            continue
        reply = proto.decode_reply(message)
        replies.append(reply)
        if reply.id == request_id:
            return replies


def _ping(client, request_id: int) -> list[proto.Reply]:
    """A keepalive and its reply: everything sent before it on this session was handled."""
    _send(client, proto.encode_request(request_id, "keepalive", {}))
    return _replies_until(client, request_id)


def _header(total: int, count: int, body: bytes = b"", pid: int = 1, index: int = 0) -> bytes:
    return chunking.CHUNK_HEADER.pack(chunking.KIND_CHUNK, pid, index, count, total) + body


@contextlib.contextmanager
def _chunk_holders(tmp_path: Any, count: int) -> Iterator[tuple[str, list[StreamClient]]]:
    """A server process with 8 MiB for all incomplete messages, 4 MiB per session and a 2 s
    timeout, and ``count`` clients of it (closed at the end): its endpoint and the clients.
    They are one client (one address) whose share is the whole 8 MiB here: the total's bound
    is tested (the share's: test_attack_incomplete_share.py)."""
    options = [
        "--max-incomplete-bytes",
        "8M",
        "--max-incomplete-bytes-per-client",
        "8M",
        "--max-incomplete-bytes-per-session",
        "4M",
        "--incomplete-message-timeout-seconds",
        "2",
    ]
    with server_process(str(tmp_path / "srv"), options) as (_proc, endpoint):
        holders = [client_for(endpoint, timeout_s=TIMEOUT_S) for _ in range(count)]
        try:
            yield endpoint, holders
        finally:
            for c in holders:
                c.close()


def _counters(endpoint: str) -> dict[str, int]:
    with client_for(endpoint, timeout_s=TIMEOUT_S) as c:
        return c.stats()["counters"]


def test_chunk_headers_announcing_memory_make_the_server_allocate_nothing(tmp_path) -> None:
    """Eight sessions each send one 92-byte CHUNK header announcing 32 MiB (the old server
    zero-filled 8 x 32 MiB) and two announce 256 MiB (refused now: PAYLOAD_TOO_LARGE); they keep
    their sessions alive. The server's peak memory grows by less than 48 MiB."""
    with server_process(str(tmp_path / "srv")) as (proc, endpoint):
        attackers = [client_for(endpoint, timeout_s=TIMEOUT_S) for _ in range(10)]
        try:
            for c in attackers:
                _ping(c, 1)
            before = _memory_kib(proc.pid)
            announced = [32 * MIB - 1] * 8 + [256 * MIB] * 2
            for n, (c, total) in enumerate(zip(attackers, announced, strict=True)):
                _send(c, _header(total, 1 << 20, b"\x00" * 64, pid=n + 1))
            refusals = []
            for c in attackers:
                refusals += [r for r in _ping(c, 2) if not r.ok]
            after = _memory_kib(proc.pid)
            grown_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
            assert grown_mib < 48, f"the server's peak memory grew by {grown_mib:.0f} MiB"
            assert [r.error["code"] for r in refusals] == [int(ErrorCode.PAYLOAD_TOO_LARGE)] * 2
            counters = _counters(endpoint)
            assert counters["incomplete_messages_refused"] == 2
        finally:
            for c in attackers:
                c.close()


def test_incomplete_messages_are_bounded_and_expire_on_the_clock(tmp_path) -> None:
    """With 8 MiB for all incomplete messages and 4 MiB per session: a header announcing 5 MiB is
    refused; two sessions hold 3.5 MiB each of a 4 MiB message, so a third session's chunk past
    the 8 MiB is refused (LIMIT_EXCEEDED, counted); the two keep their sessions alive with
    keepalives only, and their messages are discarded on the clock (counted), after which a
    4 MiB publish goes through."""
    with _chunk_holders(tmp_path, 3) as (endpoint, holders):
        piece = holders[0].max_message_length - chunking.CHUNK_HEADER_LENGTH
        total = 4 * MIB
        count = -(-total // piece)
        held = (7 * MIB // 2) // piece  # chunks making about 3.5 MiB

        assert all(r.ok for r in _ping(holders[0], 1))
        _send(holders[0], _header(5 * MIB, 5, b"x" * 16, pid=99))
        (refused,) = [r for r in _ping(holders[0], 2) if not r.ok]
        assert refused.error["code"] == int(ErrorCode.PAYLOAD_TOO_LARGE)

        for n, c in enumerate(holders[:2]):
            for index in range(held):
                _send(c, _header(total, count, b"h" * piece, pid=n + 1, index=index))
            assert all(r.ok for r in _ping(c, 3))
        third = holders[2]
        for index in range(held):
            _send(third, _header(total, count, b"t" * piece, pid=3, index=index))
        refusals = [r for r in _ping(third, 3) if not r.ok]
        assert [r.error["code"] for r in refusals] == [int(ErrorCode.LIMIT_EXCEEDED)]
        assert _counters(endpoint)["incomplete_messages_refused"] == 2

        deadline = time.monotonic() + TIMEOUT_S
        while _counters(endpoint)["incomplete_messages_expired"] < 2:
            for n, c in enumerate(holders[:2]):  # alive, but no further chunk
                assert all(r.ok for r in _ping(c, 10 + n))
            assert time.monotonic() < deadline, "incomplete messages never expired"
            time.sleep(0.2)
        with client_for(endpoint, timeout_s=TIMEOUT_S) as honest:
            payload = b"p" * (2 * MIB)
            assert honest.publish(10, [payload, payload]) > 4 * MIB


def _bomb(request_id: int, op: str, args: dict) -> bytes:
    return bytes((proto.KIND_CONTROL,)) + msgpack.packb(
        {"id": request_id, "op": op, "args": args}, use_bin_type=True
    )


def test_msgpack_bombs_are_refused_within_their_operations_limits(tmp_path) -> None:
    """A 9.5 MiB list_streams of empty maps (the old server: +750 MiB) is refused by its size
    (PAYLOAD_TOO_LARGE on its id); a 7.5 MiB publish of nested lists of empty maps and a commit
    of nested lists are refused by the items budget (CONTROL_PROTOCOL on their ids). The
    server's peak memory grows by less than 96 MiB, and another client's list_streams is served
    meanwhile."""
    with server_process(str(tmp_path / "srv")) as (proc, endpoint):
        with (
            client_for(endpoint, timeout_s=TIMEOUT_S) as attacker,
            client_for(endpoint, timeout_s=TIMEOUT_S) as honest,
        ):
            honest.publish(10, [b"x" * 100] * 10)
            _ping(attacker, 1)
            before = _memory_kib(proc.pid)
            empty_maps = 9_500_000  # one byte each on the wire
            nested = [[{}] * (1 << 16)] * 120  # the payloads one request may carry, 120 times
            bombs = [
                (2, "list_streams", {"x": [{}] * empty_maps}, ErrorCode.PAYLOAD_TOO_LARGE),
                (3, "publish", {"stream_id": 10, "payloads": nested}, ErrorCode.CONTROL_PROTOCOL),
                (
                    4,
                    "commit",
                    {"sink_id": "s", "batch_id": 0, "stream_id": 10, "staged": nested},
                    ErrorCode.CONTROL_PROTOCOL,
                ),
            ]
            replies = []
            for request_id, op, args, _code in bombs:
                _send(attacker, _bomb(request_id, op, args))
                assert [s["stream_id"] for s in honest.list_streams()] == [10]
                replies.append(_replies_until(attacker, request_id)[-1])
            after = _memory_kib(proc.pid)
            grown_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
            assert grown_mib < 96, f"the server's peak memory grew by {grown_mib:.0f} MiB"
            for reply, (_, _, _, code) in zip(replies, bombs, strict=True):
                assert not reply.ok and reply.error["code"] == int(code), reply
            assert all(r.ok for r in _ping(attacker, 5))  # the session still works


def test_a_sessions_logs_hold_what_they_still_need_not_what_went_through(tmp_path) -> None:
    """Issue 31 item 6: a soak's server grew without a plateau. A session's two UDP logs (8 MiB
    terms, three each) kept every page they ever wrote, so a session cost up to 2 x 24 MiB of
    resident memory however slowly its traffic came. 32 MiB published on one session and read
    back by a replay on another: the old server grew by ~48 MiB (two logs filled); now its logs
    give back what was delivered and what no NAK can ask for again."""
    message = b"p" * 1000
    with server_process(str(tmp_path / "srv")) as (proc, endpoint):
        with client_for(endpoint, timeout_s=TIMEOUT_S) as writer:
            with client_for(endpoint, timeout_s=TIMEOUT_S) as reader:
                writer.publish(1, [message] * 100)
                (rec,) = reader.list_recordings([1])
                for _block in reader.replay(rec.recording_id, rec.start_position, None):
                    break  # the replay's path warmed up; not kept open
                before = _memory_kib(proc.pid)["VmRSS"]
                for _ in range(320):  # 100 KB requests: below malloc's mmap threshold
                    end = writer.publish(1, [message] * 100)
                assert end - rec.start_position > 32 * MIB
                read = 0
                for block in reader.replay(rec.recording_id, rec.start_position, end):
                    read += len(block.data)
                assert read >= 32_100 * len(message)
                grown_mib = (_memory_kib(proc.pid)["VmRSS"] - before) / 1024
    assert grown_mib < 16, f"the server's memory grew by {grown_mib:.0f} MiB"
