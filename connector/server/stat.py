"""``aeron-spark stat``: streams, recordings, positions, sessions and counters of a running server.

Like AeronStat reading a driver's CnC file, ``stat --dir DIR`` reads the snapshot a running server
keeps in ``DIR/stat.json`` (and its recordings in ``DIR/stat-recordings.json``), so it needs no
session and works on a server that is too busy to answer. The server looks every second, but
replaces a file (atomically) only when what it says changed: the recordings file when a
recording did, ``stat.json`` when anything but the clock did; otherwise it only sets
``stat.json``'s modification time, which says when the server last confirmed it (the reader
ages ``uptime_s`` and the sessions' and consumers' ``age_s`` by the difference). With 10,000
recordings it rewrote 2.8 MB every second with nothing changed (issue 31 item 4).
``stat --endpoint HOST:PORT`` asks the server over a session instead (the ``stats`` operation).
In a terminal the view is redrawn in place until Ctrl-C; ``--once`` prints one snapshot
(``--json`` as JSON) for scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.server import counters as _declared  # noqa: F401 - declares them
from aeron_spark.connector.session.call import call_once
from aeron_spark.connector.session.settings import add_session_arguments, settings_from_args
from aeron_spark.counters import REGISTRY, CounterType

log = logging.getLogger(__name__)

STAT_FILE = "stat.json"
RECORDINGS_FILE = "stat-recordings.json"
# what changes with the clock alone: not a reason to rewrite the file (the reader ages them)
_AGES = ("sessions", "consumers")
# ``stat.json`` lists at most this many sessions (the first opened; ``sessions_total`` says how
# many there are) and the transport's stream positions only while there are no more sessions
# (``transport_positions_listed``: false): at 2,048 sessions the list and the ~14,000 positions
# were most of what an idle server's snapshot cost, a tenth of its time (issue 31 item 1).
# ``stat --endpoint`` (the ``stats`` request) lists every one.
STAT_LISTED_SESSIONS = 256


def write_snapshot(directory: str, snapshot: dict[str, Any]) -> None:
    """Atomically replace ``DIR/stat.json`` (readers never see a half-written file)."""
    replace_text(os.path.join(directory, STAT_FILE), json.dumps(snapshot, default=str))


def _umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status``; 022 elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


_MODE = 0o666 & ~_umask()  # what open(path, "w") would have given the file


def replace_text(path: str, text: str, rename: Callable[[str, str], None] = os.replace) -> None:
    """Write ``text`` to a new file of a name nobody can have prepared (``mkstemp``: created
    exclusively, never through a symlink; given the mode ``open`` would have, not mkstemp's
    0600, so the users who could read the snapshot still can) and rename it over ``path``
    (``rename(tmp, path)``; if it raises, the new file is removed)."""
    fd, tmp = tempfile.mkstemp(
        prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path) or "."
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), _MODE)
            fh.write(text)
        rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _clockless(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` without what changes with the clock alone (compared, never written)."""
    out = {k: v for k, v in snapshot.items() if k != "written_at_s"}
    server = out.get("server")
    if isinstance(server, dict):
        out["server"] = {k: v for k, v in server.items() if k != "uptime_s"}
    storage = out.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("free_bytes"), int):
        # moved by other processes' writes too: a change under 64 MiB is no reason to rewrite
        out["storage"] = {**storage, "free_bytes": storage["free_bytes"] >> 26}
    for name in _AGES:
        rows = out.get(name)
        if isinstance(rows, list):
            out[name] = [
                {k: v for k, v in r.items() if k != "age_s"} if isinstance(r, dict) else r
                for r in rows
            ]
    return out


class _Stopped(Exception):
    """A write reached its rename after :meth:`SnapshotWriter.close`: dropped, not counted."""


class SnapshotWriter:
    """The server's ``stat.json`` and ``stat-recordings.json`` (see the module): each replaced
    only when what it says changed.

    The server's loop hands each snapshot to :meth:`submit` and goes on: the encoding, the
    comparison and the writes (a replace took 5-30 ms of the loop at 2,048 sessions; issue 31
    item 4) run on one thread of the writer's own, which writes the latest snapshot handed to
    it (one submitted while it writes replaces any still waiting: never a queue). A write that
    fails (a full disk, a directory made read-only) is counted (``failures``) and logged, never
    fatal; the next snapshot is written as usual. :meth:`close` lets the thread finish its
    write (within its timeout) and stops it, then removes the files: a write still under way
    then (a slow disk, a huge recordings list) drops its temporary file when it reaches its
    rename, so nothing is renamed into the directory after ``close`` (the server releases the
    directory to a successor next)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, STAT_FILE)
        self.recordings_path = os.path.join(directory, RECORDINGS_FILE)
        self._recordings: str | None = None  # the recordings text last written
        # the recordings file's generation, also named in stat.json: a reader pairs the two
        # files only when they agree (the server replaces one, then the other). It starts at
        # the clock, so a restarted server's generations are not its predecessor's.
        self.generation = time.time_ns() // 1000
        self._said: str | None = None  # stat.json as last written, less the clock
        # the transport section last written (a dict the caller built for that snapshot): when
        # it differs (a live session's heartbeats count up) the file is rewritten without
        # encoding the snapshot twice (at 2,048 sessions it lists ~14,000 stream positions)
        self._transport: Any = None
        # what it did (tests and benchmarks)
        self.rewrites = 0
        self.recordings_rewrites = 0
        self.touches = 0
        self._swept = False  # temporary files a killed predecessor left: removed at first write
        self.failures = 0  # writes that failed (the server adds them to its counters)
        self.submitted = 0  # snapshots handed to the thread
        self.skipped = 0  # of them, replaced by a newer one before the thread took them
        self.writer_threads: set[int] = set()  # the threads that wrote the files (tests)
        self._cond = threading.Condition()
        self._pending: tuple[dict[str, Any], str] | None = None  # latest wins
        self._closing = False
        # held around each rename and touch: once close has taken it and set _closed, no file
        # of this writer appears or changes in the directory
        self._publish = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._next_log_s = 0.0

    def submit(self, snapshot: dict[str, Any], recordings: str) -> None:
        """Hand a snapshot to the writer's thread (started at the first): never waits for a
        write. ``snapshot`` must not change afterwards (the loop builds a new one each time)."""
        with self._cond:
            if self._closing:
                return
            if self._pending is not None:
                self.skipped += 1
            self._pending = (snapshot, recordings)
            self.submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stat-writer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                taken, self._pending = self._pending, None
            if taken is None:  # closing, nothing left to write
                return
            try:
                self.write(*taken)
            except _Stopped:
                return
            except Exception as exc:  # noqa: BLE001 - counted, never fatal
                self.failures += 1
                now = time.monotonic()
                if now >= self._next_log_s:
                    self._next_log_s = now + 1.0
                    log.warning(
                        "cannot write the stat snapshot (skipped): %s: %s", type(exc).__name__, exc
                    )

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (a write in progress finishes within ``timeout_s``; one waiting is
        dropped), then remove the files: none is written after, even by a write still under
        way (it drops its temporary file at its rename). Returns within ``timeout_s`` unless
        a rename itself is stuck (then that one file is removed when the rename returns)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._pending = None
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        taken = self._publish.acquire(timeout=max(deadline - time.monotonic(), 0.0))
        self._closed = True  # a rename under way (lock not taken) removes its file after
        if taken:
            self._publish.release()
        else:
            log.warning("the stat writer's rename did not return within %.1f s", timeout_s)
        if thread is not None and thread.is_alive():
            log.warning(
                "the stat writer's write was still under way after %.1f s: it is dropped",
                timeout_s,
            )
        self.remove()

    def _rename(self, tmp: str, path: str) -> None:
        """``os.replace(tmp, path)`` unless :meth:`close` has stopped the writer."""
        with self._publish:
            if self._closed:
                raise _Stopped
            os.replace(tmp, path)
            if self._closed:  # close gave up waiting for this rename: it removes its file
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise _Stopped

    def write(self, snapshot: dict[str, Any], recordings: str) -> None:
        """``snapshot`` (everything but the recordings) and ``recordings`` (a JSON list, as
        text: the catalog keeps it encoded and builds a new string only when a recording
        changed, so an unchanged one is the same object)."""
        if not self._swept:  # the first write holds the directory's lock: no other writer
            self._swept = True
            for name in os.listdir(self.directory):
                if name.endswith(".tmp") and name.startswith((STAT_FILE, RECORDINGS_FILE)):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.directory, name))
        if recordings is not self._recordings and recordings != self._recordings:
            generation = self.generation + 1
            replace_text(
                self.recordings_path,
                f'{{"generation": {generation}, "recordings": {recordings}}}',
                self._rename,
            )
            self.generation = generation
            self.recordings_rewrites += 1
        self._recordings = recordings
        self.writer_threads.add(threading.get_ident())
        snapshot = {
            **snapshot,
            "recordings_file": RECORDINGS_FILE,
            "recordings_generation": self.generation,
        }
        transport = snapshot.get("transport")
        if transport is not None and transport != self._transport:
            said = None  # changed: compared again once the transport stands still
        else:
            said = json.dumps(_clockless(snapshot), default=str, sort_keys=True)
            if said == self._said and os.path.exists(self.path):
                with self._publish:
                    if self._closed:
                        raise _Stopped
                    os.utime(self.path)  # confirmed now: the reader ages the clock's fields
                self.touches += 1
                return
        replace_text(self.path, json.dumps(snapshot, default=str), self._rename)
        self._said = said
        self._transport = transport
        self.rewrites += 1

    def remove(self) -> None:
        for path in (self.path, self.recordings_path):
            try:
                os.unlink(path)
            except OSError:
                pass


#: The largest snapshot file a reader takes (the recordings of 10,000 recordings are ~3 MB).
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024


def _open_snapshot_file(path: str) -> Any:
    """``path`` opened for reading if it is a regular file of at most
    :data:`MAX_SNAPSHOT_BYTES`, never through a symlink nor a FIFO (opened non-blocking): the
    server's user can write its directory, and whoever runs ``stat`` (an operator, root) would
    otherwise read ``/dev/zero`` until out of memory, or wait on a FIFO for good."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SNAPSHOT_BYTES:
            raise ServerUnavailableError(
                f"{path} is not a stat snapshot: not a regular file of at most "
                f"{MAX_SNAPSHOT_BYTES} bytes (mode {st.st_mode:o}, {st.st_size} bytes)"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


#: How long a reader waits for the server to finish replacing its two files (it replaces the
#: recordings' file, then stat.json, back to back) before it gives up pairing them.
SETTLE_S = 1.5


def read_snapshot(
    directory: str, max_age_s: float | None = None, settle_s: float = SETTLE_S
) -> dict[str, Any]:
    """The server's snapshot: ``stat.json`` with the recordings of the same snapshot.

    The server replaces ``stat-recordings.json`` and then ``stat.json``; a reader that opens
    them in between, or the server in between (or between its own two replaces), gets the files
    of two snapshots: a recording the streams do not count, positions of one second beside
    consumers of another. Both files carry the snapshot's generation: a reader reads again
    (for up to ``settle_s``) until they agree; if they never do (the server failed to write
    ``stat.json`` after the recordings, or stopped between the two), the snapshot says so
    (``recordings_mismatch``: both generations; ``stale``) rather than pairing them silently."""
    path = os.path.join(directory, STAT_FILE)
    deadline = time.monotonic() + settle_s
    while True:
        try:
            with _open_snapshot_file(path) as fh:
                snapshot = json.load(fh)
                confirmed_s = os.fstat(fh.fileno()).st_mtime
        except FileNotFoundError:
            raise ServerUnavailableError(f"no running server has written {path}") from None
        except OSError as exc:  # a symlink (ELOOP), no permission...
            raise ServerUnavailableError(f"cannot read {path}: {exc}") from exc
        except ValueError as exc:
            raise ServerUnavailableError(f"{path} is not a stat snapshot: {exc}") from exc
        if not isinstance(snapshot, dict):
            raise ServerUnavailableError(f"{path} is not a stat snapshot: not a JSON object")
        recordings_file = snapshot.pop("recordings_file", None)
        wanted = snapshot.pop("recordings_generation", None)
        if recordings_file is None or "recordings" in snapshot:
            break
        name = os.path.basename(str(recordings_file))
        try:
            with _open_snapshot_file(os.path.join(directory, name)) as fh:
                held = json.load(fh)
        except FileNotFoundError:
            snapshot["recordings"] = []  # the server stopped between the two reads
            break
        except OSError as exc:
            raise ServerUnavailableError(f"cannot read {name}: {exc}") from exc
        except ValueError as exc:
            raise ServerUnavailableError(f"{name} is not a stat snapshot: {exc}") from exc
        if isinstance(held, list):  # a server of before the generations
            snapshot["recordings"] = held
            break
        if not isinstance(held, dict) or not isinstance(held.get("recordings"), list):
            raise ServerUnavailableError(f"{name} is not a stat snapshot: no recordings list")
        got = held.get("generation")
        if wanted is None or got == wanted:
            snapshot["recordings"] = held["recordings"]
            break
        if time.monotonic() < deadline:
            time.sleep(0.02)  # the server is between its two replaces: read both again
            continue
        snapshot["recordings"] = held["recordings"]
        snapshot["recordings_mismatch"] = {"stat_json": wanted, "recordings": got}
        snapshot["stale"] = True
        break
    # unchanged since it was written: the server confirmed it at its modification time
    written = snapshot.get("written_at_s", 0)
    if isinstance(written, int | float) and confirmed_s > written:
        _age(snapshot, confirmed_s - written)
        snapshot["written_at_s"] = confirmed_s
    if max_age_s is not None and time.time() - snapshot.get("written_at_s", 0) > max_age_s:
        snapshot["stale"] = True
    return snapshot


def _age(snapshot: dict[str, Any], by_s: float) -> None:
    server = snapshot.get("server")
    if isinstance(server, dict) and isinstance(server.get("uptime_s"), int | float):
        server["uptime_s"] += by_s
    for name in _AGES:
        for row in snapshot.get(name) or []:
            if isinstance(row, dict) and isinstance(row.get("age_s"), int | float):
                row["age_s"] = round(row["age_s"] + by_s, 1)


def _fmt_pos(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _fmt_bytes(value: int | None) -> str:
    if value is None or value < 0:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _fmt_limit(limits: dict[str, Any], which: str) -> str:
    value = limits.get(f"open_files_{which}_limit")
    return "unlimited" if value == -1 else str(value)


def _declared_first(counters: dict[str, Any]) -> list[tuple[str, Any]]:
    """The server's counters through the registry: declared ones in declaration order (server,
    then retention), then any this version does not know (a newer server's), by name."""
    declared = [
        d.name
        for t in (CounterType.SERVER, CounterType.RETENTION)
        for d in REGISTRY.of_type(t)
        if d.name in counters
    ]
    seen = set(declared)
    return [(n, counters[n]) for n in declared] + sorted(
        (n, v) for n, v in counters.items() if n not in seen
    )


def consumer_lag(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Each consumer's lag per recording it committed: recorded bytes beyond its committed
    position (``recorded_position - committed``; None for a recording no longer listed, e.g.
    deleted). Bytes, not messages: counting messages would mean scanning the gap."""
    recorded = {
        str(r["recording_id"]): r["recorded_position"] for r in snapshot.get("recordings", [])
    }
    out = []
    for c in snapshot.get("consumers", []):
        for rid, committed in sorted(c.get("positions", {}).items(), key=lambda kv: int(kv[0])):
            end = recorded.get(str(rid))
            out.append(
                {
                    "consumer_id": c["consumer_id"],
                    "recording_id": int(rid),
                    "committed": committed,
                    "recorded": end,
                    "behind_bytes": None if end is None else max(0, end - committed),
                    "age_s": float(c.get("age_s", 0.0)),
                }
            )
    return out


def render(snapshot: dict[str, Any]) -> str:
    """A plain-text view of one snapshot (what the terminal shows)."""
    lines: list[str] = []
    server = snapshot.get("server", {})
    stale = "  (STALE: the server has stopped updating)" if snapshot.get("stale") else ""
    if snapshot.get("recordings_mismatch"):
        stale = (
            f"  (STALE: the recordings are of another snapshot than the rest, "
            f"{snapshot['recordings_mismatch']}: the server could not finish writing it)"
        )
    lines.append(
        f"aeron-spark server {server.get('endpoint', '?')}  pid {server.get('pid', '?')}  "
        f"dir {server.get('directory', '?')}  up {server.get('uptime_s', 0):.0f}s{stale}"
    )
    storage = snapshot.get("storage")
    if storage:
        below = "  BELOW THE WATERMARK: appends refused" if storage.get("below_watermark") else ""
        lines.append(
            f"storage {storage.get('directory', '?')}: {_fmt_bytes(storage.get('free_bytes'))} "
            f"free, --min-free-bytes {_fmt_bytes(storage.get('min_free_bytes'))}, "
            f"{storage.get('refused_by_watermark', 0):,} refused, "
            f"{storage.get('write_failures', 0):,} write failures{below}"
        )
    limits = snapshot.get("limits")
    if limits:
        lines.append(
            f"open files {limits.get('open_files', '?')} of {_fmt_limit(limits, 'soft')} "
            f"(hard limit {_fmt_limit(limits, 'hard')}; "
            f"{limits.get('open_files_soft_limit_at_start', '?')} at start)"
        )
    lines.append("")
    lines.append("streams")
    lines.append(f"  {'stream':>8} {'recordings':>10} {'active':>6} {'bytes':>16}")
    for s in snapshot.get("streams", []):
        lines.append(
            f"  {s['stream_id']:>8} {s['recordings']:>10} {s['active_recordings']:>6} "
            f"{s['bytes']:>16,}"
        )
    lines.append("")
    lines.append("recordings")
    lines.append(
        f"  {'id':>6} {'stream':>7} {'session':>11} {'purged':>14} {'recorded':>16} "
        f"{'stop':>16}  source"
    )
    for r in snapshot.get("recordings", []):
        lines.append(
            f"  {r['recording_id']:>6} {r['stream_id']:>7} {r['session_id']:>11} "
            f"{_fmt_pos(r['purged_position']):>14} {_fmt_pos(r['recorded_position']):>16} "
            f"{_fmt_pos(r['stop_position']):>16}  {r['source']}"
        )
    lines.append("")
    lags = consumer_lag(snapshot)
    lines.append(f"consumers ({len(snapshot.get('consumers', []))})")
    if lags:
        lines.append(
            f"  {'consumer':<24} {'recording':>9} {'committed':>16} {'recorded':>16} "
            f"{'behind (B)':>16} {'age':>8}"
        )
    for lag in lags:
        lines.append(
            f"  {lag['consumer_id']:<24} {lag['recording_id']:>9} "
            f"{_fmt_pos(lag['committed']):>16} {_fmt_pos(lag['recorded']):>16} "
            f"{_fmt_pos(lag['behind_bytes']):>16} {lag['age_s']:>7.1f}s"
        )
    lines.append("")
    sessions = snapshot.get("sessions", [])
    total = snapshot.get("sessions_total", len(sessions))
    lines.append(
        f"sessions ({total})"
        if total == len(sessions)
        else f"sessions ({total}; the first {len(sessions)} listed: stat --endpoint lists all)"
    )
    for s in sessions:
        lines.append(
            f"  {s['peer']:<28} age {s['age_s']:>7.1f}s  requests {s['requests']:>8}  "
            f"errors {s['errors']:>4}  replays {s['replays']:>2}  "
            f"replayed {s['bytes_replayed']:,} B"
            + (f"  client {s['client']}" if "client" in s else "")
        )
    lines.append("")
    lines.append("counters")
    if snapshot.get("withheld"):  # a client key without admin on every stream
        lines.append(f"  withheld (need admin on every stream): {', '.join(snapshot['withheld'])}")
    for name, value in _declared_first(snapshot.get("counters", {})):
        lines.append(f"  {name:<34} {value:>16,}")
    for name, value in sorted(snapshot.get("store", {}).items()):
        if isinstance(value, int | float):
            lines.append(f"  store.{name:<28} {value:>16,}")
    handshake = snapshot.get("handshake", {})
    if handshake:
        # admissions and everything strangers sent that was refused (issue 22)
        lines.append("")
        lines.append("handshake")
        for name, value in sorted(handshake.items()):
            if isinstance(value, dict):
                for key, count in sorted(value.items()):
                    lines.append(f"  {name + '.' + str(key):<34} {count:>16,}")
            elif isinstance(value, int | float):
                lines.append(f"  {name:<34} {value:>16,}")
    transport = snapshot.get("transport", {})
    if transport:
        lines.append("")
        lines.append("transport")
        for name, value in sorted(transport.items()):
            if ":" not in name and value:
                lines.append(f"  {name:<34} {value:>16,}")
        for name, value in sorted(transport.items()):
            if ":" in name:
                lines.append(f"  {name:<34} {value:>16,}")
        if snapshot.get("transport_positions_listed") is False:
            lines.append(
                f"  (stream positions not listed past {len(sessions)} sessions: "
                "stat --endpoint lists them)"
            )
    return "\n".join(lines) + "\n"


def _source(args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    if args.dir:
        return lambda: read_snapshot(args.dir, max_age_s=max(5.0, 3 * args.interval_s))
    settings = settings_from_args(args)

    def fetch() -> dict[str, Any]:
        return dict(call_once(settings, "stats"))

    return fetch


def stat_main(argv: Sequence[str], out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aeron-spark stat",
        description="Show streams, recordings, positions, sessions and counters of a running "
        "stream server, refreshed in place (Ctrl-C to stop).",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--dir", help="the server's directory (reads its stat.json snapshot)")
    where.add_argument("--endpoint", help="ask a server over a session, host:port")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print JSON")
    parser.add_argument(
        "--interval-s", type=float, default=1.0, help="refresh interval (default %(default)s)"
    )
    add_session_arguments(parser, timeout_s=10.0, endpoint=False, when="with --endpoint: ")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    if not args.dir and not args.endpoint:
        args.endpoint = "127.0.0.1:40123"
    fetch = _source(args)
    if args.once or not out.isatty():
        snapshot = fetch()
        out.write(
            json.dumps(snapshot, indent=1, default=str) + "\n" if args.json else render(snapshot)
        )
        return 0
    try:
        while True:
            try:
                text = render(fetch())
            except ServerUnavailableError as exc:
                text = f"waiting for the server: {exc}\n"
            out.write("\x1b[H\x1b[2J" + text)  # home + clear: redraw in place
            out.flush()
            time.sleep(args.interval_s)
    except KeyboardInterrupt:
        return 0


__all__ = [
    "RECORDINGS_FILE",
    "STAT_FILE",
    "STAT_LISTED_SESSIONS",
    "SnapshotWriter",
    "consumer_lag",
    "read_snapshot",
    "render",
    "stat_main",
    "write_snapshot",
]
