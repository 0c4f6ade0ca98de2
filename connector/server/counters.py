"""The stream server's counters, declared in the one registry (:mod:`aeron_spark.counters`).

The core counts into a :class:`~aeron_spark.counters.CounterMap` of :data:`CORE_COUNTERS` (always
exported) and :data:`SHELL_COUNTERS` (exported once they happen: the I/O shell's failures, which
the shell adds on the loop's thread, and the authorized keys' reloads and revocations, which the
core counts when the shell hands it what a reload gave);
retention into one of :data:`RETENTION_COUNTERS`. :func:`server_counters` is the ``counters``
section of ``stats`` (and so of ``aeron-spark stat``), read through the registry.
"""

from __future__ import annotations

from typing import Any

from aeron_spark.counters import REGISTRY, CounterMap, CounterType

CORE_COUNTERS = (
    "sessions_opened",
    "sessions_closed",
    "sessions_expired",
    # a lease ran out while the session's transport showed its client alive: renewed (issue 31)
    "session_leases_renewed_by_transport",
    "requests",
    "request_errors",
    "protocol_errors",
    "internal_errors",
    "not_authorised",
    "requests_not_authorised",
    "requests_not_owner",
    "replays_started",
    "local_reads_offered",
    "local_reads_refused",
    "local_stages_offered",
    "local_stages_refused",
    "replays_completed",
    "replays_failed",
    "replays_stopped",
    "replays_revoked",
    "replay_bytes",
    "replay_blocks",
    "messages_published",
    "bytes_published",
    "chunks_discarded",
    "incomplete_messages_refused",  # a chunk past the incomplete-message budgets (issue 28)
    # of those, refused for the client's share (--max-incomplete-bytes-per-client)
    "incomplete_messages_over_share",
    "incomplete_messages_expired",  # an incomplete message whose next chunk did not come
    # a deferred request (commit, scan, ...) past MAX_DEFERRED_PER_SESSION queued (requests.py)
    "deferred_requests_refused",
    "storage_full_errors",
    "too_many_open_files_errors",
)
SHELL_COUNTERS = (
    "loop_resource_failures",
    "housekeeping_failures",
    "accept_failures",
    "stat_snapshot_failures",
    # a gc tick that found the last retention run still queued or running: none queued
    "retention_ticks_skipped",
    # with --authorized-keys: ServerCore.keys_reloaded and open_session count these
    "authorized_keys_reloads",
    "authorized_keys_reload_failures",
    "sessions_revoked",
    # replies that waited for a session's reply publication to have a receiver again (its
    # client resubscribing or its status messages lapsed, within the lost grace): episodes
    "replies_awaiting_receiver",
    # replies never sent: their session closed with them queued (its client lost)
    "replies_dropped",
)
# Read from the sink committer and the consumer registry when a snapshot is taken.
SINK_COUNTERS = (
    "consumer_commits",
    # of recordings gone (deleted, or finished and purged whole): dropped from consumers.msgpack
    "consumer_positions_dropped",
    # commits refused past --max-consumer-positions (LIMIT_EXCEEDED)
    "consumer_commits_refused",
    # commits refused past --max-consumer-positions-per-client (one client's share)
    "consumer_commits_over_share",
    # commits of a new consumer past --max-consumers-per-client (LIMIT_EXCEEDED)
    "new_consumers_refused",
    "sink_commits",
    "sink_duplicate_commits",
    "sink_resumed_commits",
    # bytes past sink recordings' committed ends cut at a restart (a failed commit whose cut
    # failed too, or an interrupted one, resumed from its start)
    "sink_tail_bytes_cut",
    "sink_aborts",
    "sink_parts_staged",
    "sink_parts_staged_locally",
    "sink_parts_garbage_collected",
    "sink_failed_commits",
    "sink_stage_failures",
    "sink_forgotten_commits",  # a repeat of a batch below its sink's window (issue 31)
    "sink_commit_log_compactions",
    # refused (a record of the log no longer reads: the log kept) or failed (a full disk)
    "sink_commit_log_compaction_failures",
)
RETENTION_COUNTERS = (
    "retention_runs",
    "retention_purges",
    "retention_bytes_purged",
    "retention_held_by_consumers",
    "retention_errors",
)
for _name in (*CORE_COUNTERS, *SHELL_COUNTERS, *SINK_COUNTERS):
    REGISTRY.register(CounterType.SERVER, _name)
for _name in RETENTION_COUNTERS:
    REGISTRY.register(CounterType.RETENTION, _name)


def core_counters() -> CounterMap:
    return CounterMap(CounterType.SERVER, CORE_COUNTERS, optional=SHELL_COUNTERS)


def retention_counters() -> CounterMap:
    return CounterMap(CounterType.RETENTION, RETENTION_COUNTERS)


def server_counters(
    core: CounterMap, retention: CounterMap, sink: dict[str, Any]
) -> dict[str, int]:
    """The ``counters`` section of ``stats``: core, retention, then sink counts (every name a
    declared one)."""
    counters = REGISTRY.snapshot(CounterType.SERVER, core)
    counters.update(REGISTRY.snapshot(CounterType.RETENTION, retention))
    counters.update(REGISTRY.snapshot(CounterType.SERVER, sink))
    return counters


__all__ = [
    "CORE_COUNTERS",
    "RETENTION_COUNTERS",
    "SHELL_COUNTERS",
    "SINK_COUNTERS",
    "core_counters",
    "retention_counters",
    "server_counters",
]
