"""Which archives of a set are worth waiting for: the source's replicas and the sink's share it.

An archive of a set (the source's ``archive`` list, the sink's ``archive`` and ``replicas``) may
be gone (kill -9, a host down) or cut off; the others can serve. Three answers keep a dead one
cheap, and none changes what is read or written (a dead archive is only tried later, or sooner
given up on):

* **refused at once.** A connect that is not answered within :data:`QUICK_S` sends one
  datagram an Aeron receiver ignores (an 8-byte frame header of a type no receiver handles) to
  the archive's control endpoint on a connected UDP socket: a host that has no socket there
  answers with ICMP port unreachable, so a process that died on a living host is known dead
  after :data:`QUICK_S` and a few milliseconds (:func:`refused`). A firewalled or unreachable
  host answers nothing: the connect then waits up to :data:`PROBE_S`.
* **no answer at all is not a slow answer.** A connect of a set waits :data:`PROBE_S` (at most
  ``timeoutMs``), not ``timeoutMs``: a living archive's driver answers a connect's SETUP in
  milliseconds however busy the archive is. A replay whose archive sends nothing at all, not
  even the heartbeats its driver sends every 100 ms of an idle publication, for
  :data:`SILENCE_S` fails then (``ArchiveClientConfig.silence_timeout_s``), while a replay that
  is only slow (heartbeats, no data) still gets ``timeoutMs``.
* **remembered.** An archive that failed is marked for :data:`SKIP_S` seconds in this process
  (:func:`mark_failed`): the source's driver plans its next micro-batches from the others, and
  its partitions carry the driver's marks to the tasks (``avoid``), which run in other
  processes (Spark's Python workers), so a task does not wait on an archive the driver already
  found dead; a marked archive is still tried when no other serves, and asked again (a probe
  of :data:`RECHECK_S`, counted: :func:`rechecks`) when only it can confirm what a caller
  waits for (the source: a sink's batch that fewer archives than its ``minInSyncReplicas``
  hold). The sink keeps its order
  (the configured primary first, and every archive asked in an election) but probes a marked
  archive for :data:`RECHECK_S` only, enough for one that is back to answer.
"""

from __future__ import annotations

import socket
import threading
import time

from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.options import ArchiveConnect
from aeron_spark.connector.stores.archive import source as archive_source
from aeron_spark.transport.archive.client import ArchiveClient, ArchiveTimeoutError
from aeron_spark.transport.protocol.frames import HEADER, FrameType
from aeron_spark.transport.uri import ChannelConfig

PROBE_S = 3.0  # how long a connect of a set waits for an archive that answers nothing
QUICK_S = 0.5  # after this long unanswered, a connect asks the host whether the port is open
SILENCE_S = 1.5  # a replay whose archive sends nothing at all (not even heartbeats) this long
SKIP_S = 30.0  # how long this process tries an archive that failed after the others
RECHECK_S = 1.0  # the sink's probe of an archive that failed lately (a living one answers)
REFUSED_WAIT_S = 0.05  # how long the port probe waits for the ICMP answer

# An Aeron frame header (frame length 8, version 0, flags 0) of the extension type (0xFFFF),
# which no Aeron receiver handles: a valid frame (not counted as invalid), ignored.
_PROBE = HEADER.pack(8, 0, 0, FrameType.EXT)

_failed: dict[str, float] = {}  # control channel -> monotonic time until which it is marked
_failed_lock = threading.Lock()
_rechecks = 0  # marked archives asked again (the source's confirmations, the sink's probes)
_rechecked: dict[str, float] = {}  # control channel -> when the source last asked it again
RECHECK_INTERVAL_S = 5.0  # the source's recheckIntervalMs by default


def count_recheck() -> None:
    """Count one probe of an archive still marked failed: the replicas source's (a sink's
    batch fewer archives than its minInSyncReplicas confirm), the archive sink's (staging, the
    commit's election: :data:`RECHECK_S`); read by :func:`rechecks`."""
    global _rechecks
    with _failed_lock:
        _rechecks += 1


def may_recheck(channel: str, interval_s: float = RECHECK_INTERVAL_S) -> bool:
    """Whether the source may ask a marked archive again now for a confirmation only it can
    give: at most once per ``interval_s`` per archive in this process (an archive really down
    was probed by every planning pass, 0.5-1 s apart, while a reader waited); taken when True."""
    now = time.monotonic()
    with _failed_lock:
        last = _rechecked.get(channel)
        if last is not None and now - last < interval_s:
            return False
        _rechecked[channel] = now
        return True


def rechecks() -> int:
    """How many times this process asked an archive again while it was marked failed."""
    with _failed_lock:
        return _rechecks


def mark_failed(channel: str) -> None:
    with _failed_lock:
        _failed[channel] = time.monotonic() + SKIP_S


def mark_ok(channel: str) -> None:
    with _failed_lock:
        _failed.pop(channel, None)


def is_failed(channel: str) -> bool:
    with _failed_lock:
        until = _failed.get(channel)
        return until is not None and time.monotonic() < until


def failed_now(channels: list[str]) -> tuple[str, ...]:
    """Those of ``channels`` marked failed now (what the driver hands its tasks)."""
    return tuple(c for c in channels if is_failed(c))


def refused(control_channel: str, wait_s: float = REFUSED_WAIT_S) -> bool:
    """Whether the archive's host says nothing listens on its control endpoint (ICMP port
    unreachable to a datagram every Aeron receiver ignores). False when unsure: no answer
    within ``wait_s`` (a living archive, a host that is down, a firewall), or any other error."""
    endpoint = ChannelConfig.from_uri(control_channel).endpoint
    if endpoint is None:
        return False
    try:
        with socket.socket(endpoint.family, socket.SOCK_DGRAM) as sock:
            sock.connect((endpoint.host, endpoint.port))
            sock.settimeout(wait_s)
            for _ in range(2):  # the first answer may come back after the first receive
                sock.send(_PROBE)
                try:
                    sock.recv(64)
                    return False  # someone answered: not a dead port
                except ConnectionRefusedError:
                    return True
                except TimeoutError:
                    continue
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def connect(c: ArchiveConnect, probe_s: float = PROBE_S) -> ArchiveClient:
    """A control session with one archive of a set: refused at once when its port is closed,
    else bounded by ``probe_s`` (at most ``timeoutMs``); its replays fail after
    :data:`SILENCE_S` of silence. Raises as ``ArchiveClient.connect`` does, or
    :class:`ServerUnavailableError` when the port is closed."""
    probe = min(c.timeout_s, probe_s)
    quick = min(probe, QUICK_S)

    def attempt(wait_s: float) -> ArchiveClient:
        return archive_source.connect(
            c, connect_timeout_s=wait_s, silence_timeout_s=min(c.timeout_s, SILENCE_S)
        )

    started = time.monotonic()
    try:
        return attempt(quick)
    except ArchiveTimeoutError as exc:
        if refused(c.control_channel):
            raise ServerUnavailableError(
                f"archive {c.control_channel}: its host answers that nothing listens on the "
                "control endpoint (ICMP port unreachable)"
            ) from exc
        left = probe - (time.monotonic() - started)
        if left <= 0:
            raise
        return attempt(left)


__all__ = [
    "PROBE_S",
    "QUICK_S",
    "RECHECK_INTERVAL_S",
    "RECHECK_S",
    "SILENCE_S",
    "SKIP_S",
    "connect",
    "count_recheck",
    "may_recheck",
    "failed_now",
    "is_failed",
    "mark_failed",
    "mark_ok",
    "rechecks",
    "refused",
]
