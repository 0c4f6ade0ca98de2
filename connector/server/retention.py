"""Retention: what the server may purge, and the consumers that hold data back.

A Spark source with a ``consumerId`` reports, at each ``commit(end)``, the positions up to which
it has processed each recording of its streams (``consumer_commit``). The server keeps these in
``<directory>/consumers.msgpack`` (replaced atomically). Its retention policy, run on the garbage
collection tick, purges each recording down to

* the last ``retention_bytes`` bytes, and / or
* what was recorded in the last ``retention_s`` seconds,

rounded down to a term start (a message boundary), and — unless ``retention_respects_consumers``
is off — never past the lowest position any live consumer of that stream has committed (a consumer
of the stream that has not committed a position for a recording holds all of it). A consumer whose
last commit is older than ``consumer_lease_s`` no longer holds anything (a query deleted long ago
must not keep data forever). Active recordings are purged too (only below their recorded end).

With ``--authorized-keys`` a consumer belongs to the client key (``owner``, hex, persisted) that
created it: another key's commit is refused, and so is its forget unless it has admin on every
stream the consumer holds; a consumer recorded without an owner (before issue 28, or by an open
server) is claimed by the first key that commits it and may read all its streams. A consumer
holds a stream only while its owner may read it (``may_read``): narrowing a key's permissions
releases what its consumers held on the streams it lost.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import operator
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgpack

from aeron_spark.connector.errors import (
    ControlProtocolError,
    LimitExceededError,
    NotAuthorisedError,
    ServerError,
)
from aeron_spark.connector.server.counters import retention_counters
from aeron_spark.transport.archive.diskio import create_fresh, read_regular, replace_fresh
from aeron_spark.transport.archive.recordings import fsync_dir

log = logging.getLogger("aeron_spark.connector.server.retention")


@dataclass
class Consumer:
    consumer_id: str
    stream_ids: tuple[int, ...]
    positions: dict[int, int]  # recording id -> committed position
    updated_s: float
    owner: str = ""  # the client key (hex) that created it; "" without --authorized-keys
    # whose share its positions and its place count against: its owner with --authorized-keys,
    # else the address (an IPv6 one's /64) of the session that created it ("" before shares)
    client: str = ""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_change_at_a_time(
    change: Callable[Concatenate[ConsumerRegistry, _P], _R],
) -> Callable[Concatenate[ConsumerRegistry, _P], _R]:
    """The registry's ``change`` made holding its ``_changing`` lock."""

    @functools.wraps(change)
    def locked(self: ConsumerRegistry, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._changing:
            return change(self, *args, **kwargs)

    return locked


_consumer_id = operator.attrgetter("consumer_id")


class ConsumerRegistry:
    """Committed positions of the named consumers, persisted across restarts."""

    def __init__(
        self,
        directory: str,
        max_positions: int | None = None,
        max_positions_per_client: int | None = None,
    ) -> None:
        self.path = os.path.join(directory, "consumers.msgpack")
        self.consumers: dict[str, Consumer] = {}
        # the positions the file holds, all consumers together, and their bound: positions
        # merge across commits and go only with their recordings, and the whole file is
        # rewritten on every commit (before, nothing bounded it: a client's 1,024 consumers
        # committing every recording of their streams, without retention, grew it for good)
        self.max_positions = max_positions
        self.positions = 0
        self.commits_refused = 0  # commits that would have taken it past max_positions
        # one client's share of them (its client key, or its address on an open server): one
        # budget for all let one client hold every position and every other client's commits
        # were refused (test_attack_consumer_positions_share.py)
        self.max_positions_per_client = max_positions_per_client
        self.positions_of: collections.Counter[str] = collections.Counter()
        self.commits_over_share = 0  # commits that would have taken a client past its share
        # new or claimed consumers past max_per_owner of their client
        self.new_consumers_refused = 0
        # consumers per owner (client key hex; "" none), kept as they come and go: the
        # per-client limit was checked by a walk over every consumer on each new one
        self.held: collections.Counter[str] = collections.Counter()
        self.commits = 0
        self.positions_dropped = 0  # of recordings gone (deleted, or finished and purged whole)
        # one change at a time: consumer_commit and consumer_forget run on the commit worker
        # (deferred operations), retention's drop_recordings there too; each writes the whole
        # file from the registry through one temporary name, then changes the registry (two
        # at once: the second's rename found no file, and the file lacked the other's change)
        self._changing = threading.Lock()
        # describe()'s entries by consumer id, with the object each was made of
        self._described: dict[str, tuple[Consumer, dict[str, Any]]] = {}
        try:
            # never blocking (a FIFO put there waited for a writer for good): a file that is
            # not a regular one refuses the start, NOT_REGULAR_FILE naming it
            data = read_regular(self.path)
        except FileNotFoundError:
            return
        try:
            body = msgpack.unpackb(data, raw=False, strict_map_key=False)
            for cid, entry in body.items():
                self.consumers[cid] = Consumer(
                    cid,
                    tuple(entry["stream_ids"]),
                    {int(k): int(v) for k, v in entry["positions"].items()},
                    float(entry["updated_s"]),
                    str(entry.get("owner", "")),
                    str(entry.get("client", entry.get("owner", ""))),
                )
                self._charge(self.consumers[cid], 1)
        except Exception as exc:  # noqa: BLE001 - any damage: the same refusal
            raise ServerError(
                f"the consumers' positions file {self.path} is damaged ({type(exc).__name__}: "
                f"{exc}); the server writes it whole and fsynced, so a failing disk or another "
                "program left it so. Restore it, or move it aside to start without those "
                "consumers (retention then holds nothing for them until each commits again, at "
                "its query's next batch)",
                path=self.path,
            ) from None

    def recording_ids(self) -> set[int]:
        """Every recording a consumer holds a position of."""
        return {rid for c in self.consumers.values() for rid in c.positions}

    @_one_change_at_a_time
    def commit(
        self,
        consumer_id: str,
        stream_ids: Iterable[int],
        positions: dict[Any, Any],
        now_s: float,
        owner: str | None = None,
        may_claim: Callable[[tuple[int, ...]], bool] | None = None,
        max_per_owner: int | None = None,
        client: str = "",
    ) -> None:
        """Record a consumer's positions. ``owner``: the committing client's key (hex; None: no
        ownership, open server): another owner's consumer is refused; one without an owner is
        claimed if ``may_claim(its streams)``. ``client``: whose share a new consumer counts
        against on an open server (its session's address); with ``owner``, the owner's. A new
        consumer, or one it claims (saved without a client), past ``max_per_owner`` consumers of
        its client is refused, as is a commit
        adding positions past the client's share or the total. One change at a time."""
        if not isinstance(consumer_id, str) or not consumer_id or len(consumer_id) > 256:
            raise ControlProtocolError("consumer_commit: consumer_id must be 1..256 characters")
        try:
            parsed = {int(k): int(v) for k, v in positions.items()}
            ids = tuple(sorted({int(s) for s in stream_ids}))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ControlProtocolError(f"consumer_commit: malformed positions ({exc})") from None
        old = self.consumers.get(consumer_id)
        if owner is not None and old is not None and old.owner != owner:
            if old.owner or (may_claim is not None and not may_claim(old.stream_ids)):
                raise _not_owner("consumer_commit", consumer_id)
        # charged to: the owner (with --authorized-keys), else whoever created the consumer; one
        # saved before shares (no client: an open server's) to the first client committing it
        # (all were charged to one "" share nobody holds, already past it after a restart from
        # an old store: every commit adding a position to one was refused for good)
        if owner is not None:
            charged = owner
        else:
            charged = old.client if old is not None and old.client else client
        # a consumer new to this client: a new one, or one it claims (saved before shares, or
        # without an owner): each is a place of its share (claims went past it, without limit)
        taken = old is None or old.client != charged
        if taken and max_per_owner is not None:
            if self.held[charged] >= max_per_owner:
                self.new_consumers_refused += 1
                raise LimitExceededError(
                    f"consumer_commit: a client may hold at most {max_per_owner} consumers "
                    f"(--max-consumers-per-client); forget one (consumer_forget) or reuse an id",
                    limit=max_per_owner,
                )
        merged = dict(old.positions) if old is not None else {}
        for rid, pos in parsed.items():  # a query restarted from an older checkpoint may go back
            merged[rid] = pos
        had = len(old.positions) if old is not None else 0
        total = self.positions - had + len(merged)
        share = self.max_positions_per_client
        if share is not None and len(merged) > had:
            mine = self.positions_of[charged] + len(merged)
            mine -= had if old is not None and old.client == charged else 0
            if mine > share:
                self.commits_over_share += 1
                raise LimitExceededError(
                    f"consumer_commit: a client may hold at most {share} consumer positions "
                    f"(--max-consumer-positions-per-client) and this one holds "
                    f"{self.positions_of[charged]}; forget consumers no longer used "
                    "(consumer_forget), or let retention remove recordings (their positions go "
                    "with them)",
                    limit=share,
                )
        if self.max_positions is not None and total > self.max_positions and len(merged) > had:
            self.commits_refused += 1
            raise LimitExceededError(
                f"consumer_commit: the server keeps at most {self.max_positions} consumer "
                f"positions, all consumers together (--max-consumer-positions), and holds "
                f"{self.positions}; forget consumers no longer used (consumer_forget), or let "
                "retention remove recordings (their positions go with them)",
                limit=self.max_positions,
            )
        kept = owner if owner is not None else (old.owner if old is not None else "")
        new = Consumer(consumer_id, ids, merged, now_s, kept, charged)
        # durable first, then taken: a commit whose file could not be written (full disk, EIO)
        # is answered with an error and must leave the positions as they were (issue: the
        # server went on with positions the client was told were refused)
        self._save(consumer_id, new)
        self.consumers[consumer_id] = new
        if old is not None:
            self._charge(old, -1)
        self._charge(new, 1)
        self.commits += 1

    @_one_change_at_a_time
    def forget(
        self,
        consumer_id: str,
        owner: str | None = None,
        may_override: Callable[[tuple[int, ...]], bool] | None = None,
    ) -> bool:
        """Forget a consumer. With ``owner`` (a client key, hex): another owner's consumer only
        if ``may_override(its streams)`` (admin on all of them). One change at a time."""
        old = self.consumers.get(consumer_id)
        if owner is not None and old is not None and old.owner and old.owner != owner:
            if may_override is None or not may_override(old.stream_ids):
                raise _not_owner("consumer_forget", consumer_id)
        if old is None:
            return False
        self._save(consumer_id, None)  # durable first, then forgotten (as commit)
        del self.consumers[consumer_id]
        self._charge(old, -1)
        return True

    def drop_recordings(self, gone: Callable[[int], bool]) -> int:
        """Drop every consumer's position of a recording that is gone (``gone(recording_id)``:
        deleted, or finished and purged to its end): before, the file kept them for good and
        grew with every recording ever committed. The file is rewritten once, whole and
        fsynced as a commit's, before the registry changes (an ``OSError`` leaves both as they
        were: the next run tries again). Returns the positions dropped."""
        with self._changing:
            kept: dict[str, Consumer] = {}
            dropped = 0
            for cid, c in self.consumers.items():
                positions = {rid: pos for rid, pos in c.positions.items() if not gone(rid)}
                dropped += len(c.positions) - len(positions)
                if len(positions) != len(c.positions):
                    kept[cid] = Consumer(
                        cid, c.stream_ids, positions, c.updated_s, c.owner, c.client
                    )
                else:
                    kept[cid] = c
            if not dropped:
                return 0
            self._write(msgpack.packb({cid: _entry(c) for cid, c in kept.items()}))
            for cid, c in self.consumers.items():
                if kept[cid] is not c:  # lost positions: its client's count with them
                    self._charge(c, -1)
                    self._charge(kept[cid], 1)
            self.consumers = kept
            self.positions_dropped += dropped
            return dropped

    def _charge(self, consumer: Consumer, sign: int) -> None:
        """Count ``consumer`` (``sign`` 1) or take it back (-1) in the totals and its client's
        place and positions; a client that holds nothing takes no entry."""
        n, client = len(consumer.positions), consumer.client
        self.positions += sign * n
        self.held[client] += sign
        self.positions_of[client] += sign * n
        if not self.held[client]:
            del self.held[client]
            self.positions_of.pop(client, None)

    def hold(
        self,
        recording_id: int,
        stream_id: int,
        now_s: float,
        lease_s: float,
        may_read: Callable[[str, int], bool] | None = None,
    ) -> int | None:
        """The lowest position live consumers of ``stream_id`` still need of the recording
        (0 when one of them has no position for it yet); None when nobody holds it. A consumer
        whose owner may not read the stream (``may_read(owner, stream_id)``) holds nothing."""
        held: int | None = None
        for c in list(self.consumers.values()):
            if stream_id not in c.stream_ids or now_s - c.updated_s > lease_s:
                continue
            if may_read is not None and not may_read(c.owner, stream_id):
                continue
            pos = c.positions.get(recording_id, 0)
            held = pos if held is None else min(held, pos)
        return held

    def describe(self, now_s: float) -> list[dict[str, Any]]:
        """Every consumer, its streams, positions and age (``stats``). A consumer's entry is
        made again only when its object changed (every change replaces it: a commit, a drop of
        gone recordings): up to ``max_positions`` positions were rebuilt on the server's loop
        for every ``stats`` request and ``stat.json`` snapshot (~0.57 s at 1,000,000;
        ``test_consumers_describe_cost.py``). Callers do not change what it returns."""
        made = self._described
        fresh: dict[str, tuple[Consumer, dict[str, Any]]] = {}
        rows = []
        for c in sorted(list(self.consumers.values()), key=_consumer_id):
            hit = made.get(c.consumer_id)
            if hit is None or hit[0] is not c:
                hit = (
                    c,
                    {
                        "consumer_id": c.consumer_id,
                        "stream_ids": list(c.stream_ids),
                        "positions": {str(k): v for k, v in sorted(c.positions.items())},
                    },
                )
            fresh[c.consumer_id] = hit
            rows.append({**hit[1], "age_s": round(now_s - c.updated_s, 1)})
        self._described = fresh
        return rows

    def _body(self, changed_id: str | None, changed: Consumer | None) -> bytes:
        """The file's content: the registry with ``changed_id`` set to ``changed`` (None: left
        out), the registry itself untouched."""
        body = {}
        for c in self.consumers.values():
            if c.consumer_id == changed_id:
                continue
            body[c.consumer_id] = _entry(c)
        if changed is not None:
            body[changed.consumer_id] = _entry(changed)
        return msgpack.packb(body)

    def _save(self, changed_id: str | None = None, changed: Consumer | None = None) -> None:
        """Replace the file (atomically, fsynced) by the registry with one consumer changed
        (``changed`` None: forgotten); the registry in memory is changed by the caller once this
        returned. Raises the ``OSError`` of a write that failed, leaving the file as it was: the
        temporary file is removed, and a rename already made when the directory's fsync failed
        is taken back (the old content written again, best effort)."""
        self._write(self._body(changed_id, changed))

    def _write(self, data: bytes) -> None:
        tmp = self.path + ".tmp"
        try:
            with os.fdopen(create_fresh(tmp), "wb") as fh:
                fh.write(data)
                fh.flush()
                # before the rename: else a power cut can leave the new name on an empty or
                # torn file (the rename reaches the disk before the data), which the server
                # cannot read
                os.fsync(fh.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a full disk keeps no half-written file of ours
            raise
        replace_fresh(tmp, self.path)  # losing the newest commit only makes retention keep more
        try:
            fsync_dir(os.path.dirname(self.path) or ".")
        except OSError:
            # the new content is in place but not known durable, and the client is told the
            # commit failed: put back what the registry still holds (if that fails too, a
            # restart may find the refused commit, as it would one whose answer was lost)
            with contextlib.suppress(OSError):
                self._rewrite_current()
            raise

    def _rewrite_current(self) -> None:
        tmp = self.path + ".tmp"
        with os.fdopen(create_fresh(tmp), "wb") as fh:
            fh.write(self._body(None, None))
            fh.flush()
            os.fsync(fh.fileno())
        replace_fresh(tmp, self.path)
        fsync_dir(os.path.dirname(self.path) or ".")


def _entry(c: Consumer) -> dict[str, Any]:
    return {
        "stream_ids": list(c.stream_ids),
        "updated_s": c.updated_s,
        "positions": {str(k): v for k, v in c.positions.items()},
        "owner": c.owner,
        "client": c.client,
    }


def _not_owner(op: str, consumer_id: str) -> NotAuthorisedError:
    return NotAuthorisedError(
        f"NOT_AUTHORISED: {op} refused: consumer {consumer_id!r} belongs to another client",
        op=op,
        reason="not_owner",
    )


@dataclass(frozen=True)
class RetentionPolicy:
    retention_bytes: int | None = None
    retention_s: float | None = None
    respects_consumers: bool = True
    consumer_lease_s: float = 7 * 24 * 3600.0

    @property
    def enabled(self) -> bool:
        return self.retention_bytes is not None or self.retention_s is not None


def purge_target(
    policy: RetentionPolicy,
    rec: dict[str, Any],
    now_wall_ns: int,
    position_at: Callable[[int, int], int],
    hold: int | None,
) -> int | None:
    """The position a recording should be purged to now, or None (nothing to purge).

    ``rec`` is a recording as the store lists it; ``position_at(recording_id, timestamp_ns)`` the
    first position recorded at or after a time; ``hold`` the consumers' lowest position."""
    start, purged = rec["start_position"], rec["purged_position"]
    end = rec["recorded_position"]
    target = purged
    if policy.retention_bytes is not None:
        target = max(target, end - policy.retention_bytes)
    if policy.retention_s is not None:
        cutoff = now_wall_ns - int(policy.retention_s * 1e9)
        target = max(target, position_at(rec["recording_id"], cutoff))
    term = rec["term_length"]
    if target < end:  # a term start is a message boundary; the recorded end is one too
        target = start + (target - start) // term * term
    if policy.respects_consumers and hold is not None:
        target = min(target, max(hold, start))
    target = min(target, end)
    return target if target > purged else None


class Retention:
    """Applies a :class:`RetentionPolicy` to the store on each run; counts what it did."""

    def __init__(
        self,
        policy: RetentionPolicy,
        registry: ConsumerRegistry,
        may_read: Callable[[str, int], bool] | None = None,
    ) -> None:
        self.policy = policy
        self.registry = registry
        self.may_read = may_read  # (consumer owner, stream) -> counts: see ConsumerRegistry.hold
        self.counters = retention_counters()

    def run(self, store: Any, now_wall_ns: int) -> int:
        if not self.policy.enabled:
            return 0
        self.counters["retention_runs"] += 1
        now_s = now_wall_ns / 1e9
        purged = 0
        try:
            recordings = store.list_recordings(None)
        except RuntimeError:  # a recording was created meanwhile (event loop): next tick
            self.counters["retention_errors"] += 1
            return 0
        for rec in recordings:
            hold = self.registry.hold(
                rec["recording_id"],
                rec["stream_id"],
                now_s,
                self.policy.consumer_lease_s,
                self.may_read,
            )
            target = purge_target(self.policy, rec, now_wall_ns, store.position_at, hold)
            unheld = purge_target(
                RetentionPolicy(self.policy.retention_bytes, self.policy.retention_s, False),
                rec,
                now_wall_ns,
                store.position_at,
                None,
            )
            if unheld is not None and (target is None or target < unheld):
                self.counters["retention_held_by_consumers"] += 1
            if target is None:
                continue
            try:
                store.purge(rec["recording_id"], target, 0)
            except Exception:  # noqa: BLE001 - retention must never stop the server
                self.counters["retention_errors"] += 1
                log.exception(
                    "retention could not purge recording %d to %d", rec["recording_id"], target
                )
                continue
            self.counters["retention_purges"] += 1
            self.counters["retention_bytes_purged"] += target - rec["purged_position"]
            purged += 1
        try:  # the positions of recordings now gone (finished and purged whole, or deleted)
            self.registry.drop_recordings(store.recording_gone)
        except OSError:  # a full disk: the positions stay, tried again on the next run
            self.counters["retention_errors"] += 1
            log.exception("retention could not drop the positions of recordings gone")
        return purged


__all__ = ["ConsumerRegistry", "Retention", "RetentionPolicy", "purge_target"]
