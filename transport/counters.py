"""Named counters of a driver, like Aeron's system counters, and their on-disk snapshot.

System counters are plain integer attributes of :class:`SystemCounters` (the driver's agents add
to them from one thread each; readers take a :meth:`Counters.snapshot`), declared as
``CounterType.TRANSPORT`` counters in the one registry (:mod:`aeron_spark.counters`).
Per-stream positions (publisher limit, sender position, receiver high-water mark, subscriber
position) are read from the live publications and images at snapshot time.

A running driver writes its snapshot as JSON to ``<driver directory>/counters-<pid>-<n>.json`` about
once a second (written to a temporary file and renamed, so a reader never sees half a file);
:func:`read_counters` reads every such file of a directory from another process (``aeron-spark
stat``). Files of processes that no longer exist are skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from aeron_spark.counters import REGISTRY, CounterType, counter_set

COUNTERS_FILE_PREFIX = "counters-"
_INSTANCES = itertools.count(1)


@counter_set(CounterType.TRANSPORT)
@dataclass(slots=True)
class SystemCounters:
    """Driver-wide counts of everything sent, received, dropped or retried."""

    bytes_sent: int = 0
    bytes_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    naks_sent: int = 0
    naks_received: int = 0
    retransmits_sent: int = 0
    retransmitted_bytes: int = 0
    retransmits_suppressed: int = 0  # NAKed ranges not resent: lingering or over the window
    status_messages_sent: int = 0
    status_messages_received: int = 0
    heartbeats_sent: int = 0
    heartbeats_received: int = 0
    setups_sent: int = 0
    setups_received: int = 0
    setups_rejected: int = 0  # SETUPs asking for a term length or mtu above the configured bound
    images_refused: int = 0  # SETUPs past a subscription's image limits (in all / per source)
    images_evicted: int = 0  # unvouched images evicted for a new sender at an image limit
    invalid_frames: int = 0
    short_sends: int = 0
    send_errors: int = 0
    receive_errors: int = 0
    errors: int = 0
    flow_control_over_runs: int = 0
    flow_control_under_runs: int = 0
    unknown_session_data: int = 0
    data_wrong_source: int = 0  # DATA for an image from another source than its SETUP's
    status_messages_refused: int = 0  # SMs from a source that may not be a destination
    amplification_drops: int = 0  # sends to an unproven address past 3x what came from it
    naks_refused: int = 0  # NAKs from a source that is not a destination of the publication
    setups_rate_limited: int = 0  # SETUPs past a subscription's new images per /24 per second
    setups_source_refused: int = 0  # SETUPs from a host a subscription does not admit
    gaps_filled: int = 0
    back_pressure_events: int = 0
    images_created: int = 0
    images_removed: int = 0
    publications_created: int = 0
    subscriptions_created: int = 0
    loss_injected_drops: int = 0
    stale_files_removed: int = 0  # IPC log / counters files of dead processes, swept at start
    # SETUP requests held for a host not allowed yet (a handshake client's first SM precedes its
    # HELLO); answered once allowed, else counted in status_messages_refused
    status_messages_deferred: int = 0
    # connected sockets of their own given to trusted senders (dedicated-sources; a handshake
    # server's sessions), those not given (at the channel's limit, or no descriptor left: the
    # sender stays on the shared socket) and those closed after their last user
    dedicated_sockets_opened: int = 0
    dedicated_sockets_refused: int = 0
    dedicated_sockets_closed: int = 0
    gso_sends: int = 0  # sends of several datagrams at once (UDP GSO); datagrams_sent counts each
    gso_fallbacks: int = 0  # GSO sends the kernel refused, their datagrams sent one by one
    gro_receives: int = 0  # receives that carried several datagrams (UDP GRO, when enabled)
    # dedicated sockets refused because their peer's share of the budget was full (a handshake
    # server's per client address and per client key shares; also in dedicated_sockets_refused)
    dedicated_sockets_over_share: int = 0
    # overflows of the IPC directory's inotify queue (events lost: the directory watched anew
    # and every IPC subscription rescans it once)
    ipc_watch_overflows: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Counters:
    """What ``driver.counters`` returns: system counters plus per-stream positions."""

    def __init__(
        self,
        system: SystemCounters,
        streams: Callable[[], dict[str, int]],
        totals: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.system = system
        self._streams = streams
        self._totals = totals
        self.instance = next(_INSTANCES)

    def snapshot(self, positions: bool = True) -> dict[str, int]:
        """System counters (name -> value) and positions keyed ``<kind>:<session>:<stream>``
        (not when ``positions`` is False: a walk of every stream, seven keys a session on a
        stream server: issue 31)."""
        values = REGISTRY.snapshot(CounterType.TRANSPORT, self.system)
        if self._totals is not None:
            for name, value in self._totals().items():
                values[name] = values.get(name, 0) + value
        if positions:
            values.update(self._streams())
        return values

    def file_path(self, directory: Path) -> Path:
        """``directory/counters-<pid>-<driver number>.json``: one file per driver."""
        return directory / f"{COUNTERS_FILE_PREFIX}{os.getpid()}-{self.instance}.json"

    def write(self, directory: Path) -> Path:
        """Write the snapshot to :meth:`file_path` atomically; returns the path."""
        path = self.file_path(directory)
        tmp = path.with_suffix(".tmp")
        payload = {"pid": os.getpid(), "time_ns": time.time_ns(), "counters": self.snapshot()}
        text = json.dumps(payload, sort_keys=True)
        for attempt in range(3):
            directory.mkdir(parents=True, exist_ok=True)
            try:
                tmp.write_text(text)
                break
            except FileNotFoundError:  # another closing driver removed the empty directory
                if attempt == 2:
                    raise
        os.replace(tmp, path)
        return path


def read_counters(directory: str | Path) -> list[dict[str, Any]]:
    """Counter snapshots of the live drivers that publish into ``directory``.

    Each item is ``{"pid": int, "time_ns": int, "counters": {name: value}}``; files left by dead
    processes and files being replaced are skipped.
    """
    result: list[dict[str, Any]] = []
    base = Path(directory)
    if not base.is_dir():
        return result
    for path in sorted(base.glob(f"{COUNTERS_FILE_PREFIX}*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = data.get("pid")
        if not isinstance(pid, int) or not pid_alive(pid):
            continue
        result.append(data)
    return result


def sweep_counter_files(directory: str | Path) -> list[str]:
    """Remove the counters files (and their half-written ``.tmp``) that dead processes left in
    ``directory`` (a killed driver never removes its own); the names removed."""
    removed: list[str] = []
    base = Path(directory)
    try:
        paths = list(base.glob(f"{COUNTERS_FILE_PREFIX}*"))
    except OSError:
        return removed
    for path in paths:
        pid = path.name[len(COUNTERS_FILE_PREFIX) :].partition("-")[0]
        if path.suffix in (".json", ".tmp") and pid.isdigit() and not pid_alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
