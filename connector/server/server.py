"""The stream server process: the I/O shell around :class:`ServerCore`.

One event-loop thread owns everything (store, committer, sessions, ingest images), so nothing
needs locks: it accepts sessions, feeds their messages to the core, sends replies, pumps replays
while a session's connection is not back-pressured, records ingest images, expires sessions,
collects staged garbage and writes the ``stat.json`` snapshot. When a pass does no work it waits
on the transport (bounded by the next deadline), it never spins.

Shutdown (``close()``, ``SIGTERM``, Ctrl-C): stop accepting, drain what ingest images hold,
stop every recording (so its stop position is final), fsync, close sessions and the driver.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aeron_spark.connector.errors import ConnectorError, PortInUseError, ServerUnavailableError
from aeron_spark.connector.server import stat
from aeron_spark.connector.server.authz import Authorizer
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.core import KeysReloaded, Outcome, ServerCore
from aeron_spark.connector.server.dirlock import DirectoryLock, check_directory
from aeron_spark.connector.server.fairqueue import FairQueue
from aeron_spark.connector.server.resources import (
    DESCRIPTOR_ERRNOS,
    STORAGE_ERRNOS,
    nofile_limits,
    open_fd_count,
    raise_nofile_limit,
)
from aeron_spark.connector.server.schedule import CHECK_GRID_NS, CHECK_INTERVAL_NS, SessionSchedule
from aeron_spark.connector.server.staging import SinkCommitter
from aeron_spark.connector.server.stat import SnapshotWriter
from aeron_spark.connector.server.store import ArchiveStore
from aeron_spark.connector.session import chunking
from aeron_spark.connector.session.link import ServerLink, ServerListener
from aeron_spark.errors import ConfigurationError
from aeron_spark.handshake.connection import Connection
from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.errors import PortInUseError as TransportPortInUseError

log = logging.getLogger(__name__)

_PUMP_BUDGET_BYTES = 4 * 1024 * 1024
_MAX_MESSAGES_PER_PASS = 64
# a session's messages handled per pass stop past this many bytes (the others are served first)
_RECEIVE_BUDGET_BYTES = 4 * 1024 * 1024
# ... and once they took this long (its next request in the next pass, after the other sessions
# and a step of the driver): a turn of up to 64 heavy requests held every other client's requests
# and, in invoker mode, the driver (test_attack_heavy_turn.py, test_attack_invoker_long_session.py)
_TURN_BUDGET_NS = 5_000_000
_STAT_INTERVAL_NS = 1_000_000_000
# the stat snapshot's catalog refresh re-reads at most this many recordings a pass (~15-20 us
# each): at 2,048 live recordings the whole took ~40 ms of one pass (issue 31's publish tail)
STAT_REFRESH_PER_PASS = 128
_FD_RECOUNT_NS = 60_000_000_000
_IDLE_WAIT_S = 0.02
_LIVE_REPLAY_WAIT_S = 0.002
# how often the handshake walks every connection for a lost peer (the loop's checks find them)
_LOST_PEER_WALK_NS = 10 * CHECK_INTERVAL_NS
# the longest an idle pass sleeps with no deadline nearer (stop, SIGHUP and commits wake it)
_MAX_WAIT_S = 1.0
# invoker mode: a pass that runs longer than this steps the driver between the sessions it
# serves (and the replies it delivers), as often as a driver thread got the interpreter lock
# from a busy loop (its switch interval, 5 ms): status messages, heartbeats, NAKs and reads of
# the sockets never wait for a whole long pass
DRIVER_STEP_INTERVAL_NS = 5_000_000


class _SessionIO:
    __slots__ = ("awaiting", "link", "outbound", "payload_ids")

    def __init__(self, link: ServerLink) -> None:
        self.link = link
        self.outbound: deque[bytes] = deque()
        self.payload_ids = 0
        self.awaiting = False  # replies wait for the reply publication's receiver to be back

    def enqueue(self, messages: list[bytes]) -> None:
        """Queue replies, chunking any that exceed the link's maximum message length."""
        limit = self.link.max_message_length
        for message in messages:
            if len(message) <= limit:
                self.outbound.append(message)
            else:
                self.payload_ids += 1
                self.outbound.extend(chunking.split(message, limit, self.payload_ids))


# retention's turn in the fair queue (a session's share is a key in hex or an address)
RETENTION_CLIENT = "<retention>"


class StreamServer:
    """An embeddable stream server. ``start()`` returns once it accepts sessions."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._store: ArchiveStore | None = None
        self._driver: Driver | None = None
        self._listener: ServerListener | None = None
        self.core: ServerCore | None = None
        self._sessions: dict[object, _SessionIO] = {}
        # which sessions a pass serves: signalled, busy, unsignalled (IPC) or due for their
        # check (schedule.py); never every session
        self.schedule = SessionSchedule()
        # sink commits/aborts run here, one at a time, so they never stall the event loop
        self._worker: ThreadPoolExecutor | None = None
        self._deferred: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._fair = FairQueue()  # the deferred jobs, each client's in turn
        # retention is a client of the fair queue with one job queued or running at most (it
        # was submitted to the worker every gc tick: a slow run piled a job a tick in front of
        # every client's commit, test_server_retention)
        self._retention_queued = threading.Event()
        self._started_ns = 0
        self._dir_lock: DirectoryLock | None = None
        self._nofile_at_start = self._nofile = (-1, -1)
        self._next_failure_log_ns = 0
        self.authz: Authorizer | None = None
        self._reload_requested = threading.Event()
        self.stat_writer = SnapshotWriter(config.directory)
        # the stat snapshot is taken a part a pass (_stat_step): the next part (0 the catalog's
        # refresh, 1 the transport's counters, 2 the rest, 3 the write), what is taken
        self._stat_stage = 0
        self._stat_snapshot: dict[str, Any] | None = None
        self._stat_recordings = "[]"  # its recordings section, taken with it
        # the transport's counters for the snapshot, taken a pass before the rest (running
        # totals since issue 31 item 4: the walk of every stream was ~10-20 ms at 1,024-2,048
        # sessions; the positions are still walked, up to STAT_LISTED_SESSIONS sessions)
        self._stat_transport: dict[str, int] | None = None
        self._stat_failures_seen = 0  # the writer's failed writes already counted
        # the open descriptors counted last (listing /proc/self/fd: 30 ms at 5,000 open
        # recording files), recounted only when what opens them moved (_open_files)
        self._fd_count: tuple[int, tuple[int, ...], int] = (-1, (), 0)
        # invoker mode: the driver stepped by the loop (None: it has a thread of its own), and
        # when the loop last stepped it
        self._invoker: Driver | None = None
        self._stepped_ns = 0
        self.driver_steps_in_pass = 0  # steps a long pass took between its sessions (tests)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> StreamServer:
        if self._thread is not None:
            return self
        # made without write for others (whatever the umask), and refused if another user could
        # write there (owner, mode): checked before anything in it is opened
        os.makedirs(self.config.directory, mode=0o755, exist_ok=True)
        check_directory(self.config.directory)
        # before anything in the directory is opened: a second server there is refused
        self._dir_lock = DirectoryLock(self.config.directory).acquire()
        try:
            self._nofile_at_start = nofile_limits()
            self._nofile = raise_nofile_limit()
            if self._nofile != self._nofile_at_start:
                log.info(
                    "raised the open files limit from %s to %s (hard limit %s)",
                    self._nofile_at_start[0],
                    self._nofile[0],
                    self._nofile[1],
                )
            # invoker mode (the default): no driver thread, the loop steps it (_run)
            self._driver = Driver(
                DriverConfig(threading_mode=self.config.driver_threading, write_counters_file=False)
            ).start()
        except BaseException:
            self._release_dir_lock()
            raise
        try:
            self._store = ArchiveStore(self.config, self._driver)
            committer = SinkCommitter(
                os.path.join(self.config.directory, "sink"),
                self._store,
                self.config.max_message_length_for,
            )
            self.core = ServerCore(self.config, self._store, committer)
            # ids the consumers' positions and the sink commit log name are never issued again,
            # even with recordings/ deleted whole (its id mark with it): before the recovery,
            # which may make a recording
            self._store.recordings.issue_past(
                max(
                    self.core.consumers.recording_ids() | committer.recording_ids(),
                    default=-1,
                )
            )
            # then the positions of recordings deleted while it was down (not before: their ids
            # would be issued again)
            self.core.drop_gone_positions()
            committer.recover(time.monotonic_ns())
            self.core.stats_hook = self._extra_stats
            self.core.transport_heard_ns = self._transport_heard_ns
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="aeron-spark-commit")
            self.core.defer = self._defer
            if self._driver.is_invoker:
                # a long request (65,536 ranges) steps the driver between its items when due
                self.core.step_hook = self._step_invoker_if_due
            if self.config.authorized_keys_file is not None:
                self.authz = Authorizer(self.config.authorized_keys_file)
                self.core.authz = self.authz
                log.info(
                    "client keys: %d authorised in %s (others are refused)",
                    len(self.authz.table),
                    self.config.authorized_keys_file,
                )
            else:
                log.warning(
                    "no authorized keys file: any client may connect and read, write "
                    "and purge every stream the settings allow (use --authorized-keys)"
                )
            self._listener = ServerListener(
                self.config.host,
                self.config.port,
                self._driver,
                encryption=self.config.encryption,
                key_store_dir=self.config.key_store_dir,
                allow=self.config.allow,
                deny=self.config.deny,
                max_clients=self.config.max_clients,
                max_per_address=self.config.max_per_address,
                max_per_key=self.config.max_per_key,
                max_dedicated_sockets=self.config.max_dedicated_sockets,
                max_dedicated_per_address=self.config.max_dedicated_per_address,
                max_dedicated_per_key=self.config.max_dedicated_per_key,
                max_pending_per_prefix=self.config.max_pending_per_prefix,
                hellos_per_prefix_per_s=self.config.hellos_per_prefix_per_s,
                allow_plain_udp=self.config.allow_plain_udp,
                reply_on_hello_only=self.config.reply_on_hello_only,
                authorize=self.authz.knows if self.authz is not None else None,
            )
            # the loop is signalled by each session's lost connection (or checks it once a
            # check interval) and closes the lost ones itself (_serve_sessions): the
            # handshake's walk of every connection for a lost peer (twice a second) only a
            # safety net
            self._listener.server.lost_peer_walk_ns = _LOST_PEER_WALK_NS
            # and it leaves a session in its lost grace to the loop's re-check at the grace's
            # end (the walk closed it as any lost one: a client resubscribing lost it)
            self._listener.server.spares_lost = self._in_grace
            self._store.start_ingest(wake=self._wake_loop)
        except BaseException as exc:
            if self._store is not None:
                self._store.close()
            self._driver.close()
            self._release_dir_lock()
            if isinstance(exc, TransportPortInUseError):
                raise PortInUseError(str(exc), host=exc.host, port=exc.port) from None
            raise
        self._started_ns = time.monotonic_ns()
        log.info(
            "stream server at %s (sessions %s), server key %s",
            self._listener.endpoint,
            "sealed" if self.config.encryption else "plain unless a client asks for sealing",
            self._listener.public_key,
        )
        self._thread = threading.Thread(target=self._run, name="aeron-spark-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise ServerUnavailableError("the server did not start in time")
        if self._failure is not None:
            raise ServerUnavailableError(f"the server failed to start: {self._failure}")
        return self

    @property
    def public_key(self) -> str:
        """The server's X25519 public key (hex): what clients pin with ``serverKey``."""
        if self._listener is None:
            raise ServerUnavailableError("the server is not started")
        return self._listener.public_key

    @property
    def endpoint(self) -> str:
        if self._listener is None:
            raise ServerUnavailableError("the server is not started")
        return self._listener.endpoint

    def close(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():  # a join that timed out keeps it for wait()
                self._thread = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server stops (or the timeout passes); True if it stopped."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def __enter__(self) -> StreamServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    # --- event loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        assert self.core is not None and self._store is not None and self._listener is not None
        assert self._driver is not None
        next_gc_ns = next_stat_ns = 0
        listener = self._listener
        invoker = self._invoker = self._driver if self._driver.is_invoker else None
        stepped = False  # the wait ended right after a step of the driver
        try:
            self._started.set()
            while not self._stop.is_set():
                now_ns = time.monotonic_ns()  # the pass's clocks, handed to the core
                wall_ns = time.time_ns()
                try:
                    if invoker is not None:
                        # the driver first (its sockets read, SMs, heartbeats and what the
                        # last pass offered sent), unless the wait just stepped it: what it
                        # delivers signals the sessions this pass serves; the wake-up those
                        # signals gave is this pass's (taken after the step: one given later
                        # ends the next wait)
                        if not stepped:
                            invoker.do_work(now_ns)
                            self._stepped_ns = now_ns
                        stepped = False
                        listener.take_wakeup()
                    work = self._accept(now_ns)
                    work += self._store.record_ingest(now_ns)
                    served = self._serve_sessions(now_ns, wall_ns)
                    work += self._deliver_deferred()
                    # sessions served with nothing left (none busy, none unsignalled) need no
                    # pass right after: what arrives meanwhile signals and ends the wait at
                    # once (SessionSchedule.signal); an empty pass after each request was half
                    # the loop's passes at 2,048 publishing sessions (issue 31)
                    schedule = self.schedule
                    if work or schedule.busy or schedule.unsignalled:
                        work += served
                    for key in self.core.expire(now_ns):
                        io = self._sessions.pop(key, None)
                        self._forget(key)
                        if io is not None:
                            self._close_io(io)
                    if now_ns >= next_gc_ns:
                        self._housekeeping(wall_ns)
                        next_gc_ns = now_ns + self.config.gc_interval_ns
                    if now_ns >= next_stat_ns and self._stat_step(now_ns):
                        # a second apart, one more per 1024 sessions: the snapshot lists every
                        # session and the transport's every stream (issue 31: at 1024 idle
                        # sessions it was a fifth of the server's idle time)
                        spacing = 1 + len(self._sessions) // 1024
                        next_stat_ns = now_ns + _STAT_INTERVAL_NS * spacing
                        if self.authz is not None and self.authz.changed():
                            self._reload_requested.set()
                    if self._reload_requested.is_set():
                        self._reload_authorized_keys(now_ns)
                except OSError as exc:
                    # requests already fail one by one on a full disk or without descriptors;
                    # anything of that kind still escaping is the pass's, not the server's end
                    if exc.errno not in STORAGE_ERRNOS | DESCRIPTOR_ERRNOS:
                        raise
                    self._resource_failure(exc, now_ns)
                    work = 0
                if invoker is not None and invoker.has_work():
                    # what the pass offered (replies) goes out now: not after a wait that
                    # would end at once for it and a whole pass more to reach the step
                    invoker.do_work(poll=False)  # the wait's select finds what came
                    self._stepped_ns = time.monotonic_ns()
                if invoker is not None and invoker.step_again:
                    continue  # IPC resources did work: step again before any wait
                if not work and not self._stop.is_set():
                    wait_s = self._idle_wait_s(min(next_gc_ns, next_stat_ns))
                    if invoker is not None:
                        # the driver's select over its sockets and the wake-up socket, the
                        # driver stepped for what arrives until something is for the loop
                        stepped = listener.wait_stepping(invoker, wait_s)
                        if stepped:
                            self._stepped_ns = time.monotonic_ns()
                    else:
                        listener.wait(wait_s)
        except BaseException as exc:  # the loop must never die silently
            self._failure = exc
            log.exception("stream server loop failed")
            self._started.set()
        finally:
            self._shutdown()

    def _idle_wait_s(self, timer_ns: int) -> float:
        """How long a pass that did no work may sleep (the transport wakes it earlier for a
        HELLO, a session's data or image change, a finished commit): until the next real
        deadline (``timer_ns``: housekeeping or the stat snapshot; a session's check; a
        lease), or a short poll for what cannot signal (busy sessions, IPC sessions, IPC
        ingest, chunked messages on their clock). An idle server used to wake every 20 ms
        whatever it held (issue 31 item 4)."""
        core, schedule = self.core, self.schedule
        assert core is not None and self._store is not None
        if schedule.busy:
            live = any(core.has_replays(k) for k in schedule.busy)
            return _LIVE_REPLAY_WAIT_S if live else _IDLE_WAIT_S
        if schedule.unsignalled or self._store.ingest_polled or core.reassembling:
            return _IDLE_WAIT_S
        deadline = timer_ns
        lease = core.next_deadline_ns()
        if lease is not None:
            # on the checks' grid, rounded up (a lease is never found out before it runs
            # out): leases of idle sessions fall due at their own instants (a minute after
            # each was renewed), one wake-up each at 2,048 sessions, now many to a pass
            lease += -lease % CHECK_GRID_NS
        for at in (schedule.next_check_ns(), lease):
            if at is not None and at < deadline:
                deadline = at
        wait_s = (deadline - time.monotonic_ns()) / 1e9
        return min(max(wait_s, 0.0), _MAX_WAIT_S)

    def request_reload(self) -> None:
        """Re-read the authorized keys file on the loop's next pass (SIGHUP)."""
        self._reload_requested.set()
        if self._listener is not None:
            self._listener.wake()

    def _reload_authorized_keys(self, now_ns: int) -> None:
        """Re-read the authorized keys file (it changed, or SIGHUP); the live sessions of keys
        no longer listed are closed. A file that does not parse leaves the old table."""
        self._reload_requested.clear()
        authz, core = self.authz, self.core
        if authz is None or core is None:
            return
        try:  # the I/O here; the counting and the closing of sessions in the core
            reload = KeysReloaded(removed=frozenset(authz.load()))
        except (ConfigurationError, OSError) as exc:
            reload = KeysReloaded(error=exc)
            log.error("authorized keys NOT reloaded (the previous ones stay in force): %s", exc)
        revoked = core.keys_reloaded(reload, now_ns)
        for key in revoked:
            io = self._sessions.pop(key, None)
            self._forget(key)
            if io is not None:
                self._close_io(io)
        if reload.error is None:
            log.info(
                "authorized keys reloaded: %d keys, %d removed, %d sessions closed",
                len(authz.table),
                len(reload.removed),
                len(revoked),
            )

    def _resource_failure(self, exc: OSError, now_ns: int) -> None:
        assert self.core is not None
        self.core.counters.add("loop_resource_failures")
        if now_ns >= self._next_failure_log_ns:  # at most one line a second
            log.warning("a pass of the server loop failed (serving goes on): %s", exc)
            self._next_failure_log_ns = now_ns + 1_000_000_000

    def _housekeeping(self, wall_ns: int) -> None:
        """Staging gc, retention, stop files a full disk held back. A failure here (disk
        full, no descriptor) is logged and retried on the next tick, never fatal."""
        assert self.core is not None and self._store is not None and self._worker is not None
        try:
            self.core.committer.gc(wall_ns / 1e9, self.config.staging_lease_s)
            self._store.housekeeping()
            if not self.core.retention.policy.enabled:
                pass
            elif self._retention_queued.is_set():  # one run at a time: the tick is skipped
                self.core.counters.add("retention_ticks_skipped")
            else:
                self._retention_queued.set()
                self._queue(RETENTION_CLIENT, functools.partial(self._retention, wall_ns))
        except OSError as exc:
            self.core.counters.add("housekeeping_failures")
            log.warning("housekeeping failed (retried on the next tick): %s", exc)

    def _wake_loop(self) -> None:
        """Wake the loop from another thread (ingest data arrived)."""
        if self._listener is not None:
            self._listener.wake()

    def _retention(self, wall_ns: int) -> None:
        """A retention run (on the commit worker, in retention's turn); the next may be queued
        once it is over."""
        assert self.core is not None and self._store is not None
        try:
            self.core.retention.run(self._store, wall_ns)
        finally:
            self._retention_queued.clear()

    def _defer(self, key: object, job: Any) -> None:
        """Run ``job`` on the commit worker, in its client's turn (``fairqueue.py``)."""
        assert self.core is not None
        session = self.core.sessions.get(key)
        self._queue(session.share if session is not None else "", job)

    def _queue(self, client: str, job: Any) -> None:
        """Queue ``job`` in ``client``'s turn: one worker run is submitted per job, and each
        takes the next client's oldest job; what it returns (an outcome; None: nothing to
        answer, a retention run) goes to the loop."""
        assert self._worker is not None
        self._fair.put(client, job)
        listener = self._listener

        def run() -> None:
            taken = self._fair.take()
            if taken is None:  # pragma: no cover - one run per job put
                return
            outcome = taken()
            if outcome is None:
                return
            self._deferred.put(outcome)  # the outcome only: the loop counts and encodes it
            if listener is not None:
                listener.wake()  # the loop may be asleep for up to _IDLE_WAIT_S

        self._worker.submit(run)

    def _deliver_deferred(self) -> int:
        assert self.core is not None
        if self._deferred.empty():  # most passes: no exception raised to say so
            return 0
        delivered = 0
        while True:
            try:
                outcome = self._deferred.get_nowait()
            except queue.Empty:
                return delivered
            if self._invoker is not None:
                self._step_driver_if_due(self._invoker)
            reply = self.core.complete(outcome)
            io = self._sessions.get(outcome.key)
            if io is not None:  # the session may have gone meanwhile: the reply is dropped
                io.enqueue([reply])
                if not self._flush(io):
                    self.schedule.set_busy(outcome.key, True)
            delivered += 1

    def _accept(self, now_ns: int) -> int:
        assert self.core is not None and self._listener is not None
        accepted = 0
        try:
            links = self._listener.accept(now_ns)
        except OSError as exc:  # e.g. EMFILE: refuse now, accept again on the next pass
            self.core.counters.add("accept_failures")
            log.warning("cannot accept sessions now: %s", exc)
            return 0
        for link in links:
            session = self.core.open_session(
                link, link.peer, link.max_message_length, now_ns, identity=link.client_key
            )
            if session is None:  # its key was removed while its handshake was in flight
                link.close()
                continue
            self._sessions[link] = _SessionIO(link)
            schedule = self.schedule
            signal = functools.partial(self._signalled, link)
            signals = link.on_ready(signal)
            # a client lost by the transport signals too: the session's check is a safety
            # net then, every WATCHED_CHECK_INTERVAL_NS (issue 31: an idle session's check a
            # second, ~20 Python calls, was a sixth of an idle server's CPU at 2,048 sessions)
            watched = signals and link.on_lost(functools.partial(self._lost, link))
            schedule.add(link, now_ns, signals, watched)
            accepted += 1
        return accepted

    def _signalled(self, link: ServerLink) -> None:
        """A session's subscription signalled (a driver thread): queued for the next pass,
        then the loop woken (in that order: a pass woken before the key was queued would find
        nothing and sleep through the signal until its next deadline). Woken only for the
        first key queued since a pass took them (``SessionSchedule.signal``): a later one is
        taken by the pass that wake-up runs, one wake-up for a batch instead of one a message
        (issue 31)."""
        if self.schedule.signal(link):
            listener = self._listener
            if listener is not None:
                listener.wake()

    def _lost(self, link: ServerLink) -> None:
        """A session's reply publication may have lost its client (a driver thread): not a
        verdict, a re-check after a grace (``SessionSchedule.lose``), the loop woken to
        schedule it."""
        if self.schedule.lose(link, time.monotonic_ns()):
            listener = self._listener
            if listener is not None:
                listener.wake()

    def _in_grace(self, conn: Connection) -> bool:
        """A session's connection is in its lost grace (asked by the handshake server's
        walk, for a connection whose publication lost its receiver alone: rare, and few)."""
        schedule = self.schedule
        for key, io in self._sessions.items():
            if io.link.connection is conn:
                # (or its lost signal not yet taken by a pass: its grace begins there)
                return schedule.in_grace(key) or any(k is key for k, _ in schedule.lost)
        return False

    def _transport_heard_ns(self, key: object) -> int | None:
        """When a session's transport last heard its client (asked when its lease runs out):
        an idle client is alive while its driver sends status messages and heartbeats. None
        when replies wait for it behind back pressure: a client that stopped consuming them
        keeps its session only by consuming (``_flush`` renews), not by being alive."""
        io = self._sessions.get(key)
        if io is None or io.outbound:
            return None
        return io.link.last_heard_ns()

    def _forget(self, key: object) -> None:
        """A session is gone: nothing of it is served any more."""
        self.schedule.forget(key)

    def _serve_sessions(self, now_ns: int, wall_ns: int) -> int:
        core = self.core
        assert core is not None
        work = 0
        schedule = self.schedule
        sessions = self._sessions
        due = schedule.due(now_ns)
        checking = schedule.checking
        invoker = self._invoker
        for key in due:
            if invoker is not None:
                self._step_driver_if_due(invoker)
            io = sessions.get(key)
            if io is None:  # pragma: no cover - the schedule forgets every session closed
                schedule.forget(key)
                continue
            link = io.link
            # (a session whose reply publication signalled a loss, lost by that publication
            # alone, is closed only by the re-check at its grace's end: a live client speaks
            # again within it; a CLOSE or its image gone close it at once)
            if not link.is_connected and not (schedule.in_grace(key) and link.awaits_receiver):
                core.close_session(key, now_ns)
                self._close_io(io)
                del sessions[key]
                self._forget(key)
                work += 1
                continue
            if key in checking:
                # due only for its connection check: nothing signalled (a message, an image
                # come or gone), nothing queued, no replay, no input left: nothing to read.
                # (A read here hid a stall over a lossy link: a receive that polled 64
                # fragments of a longer message, made readable at once by a retransmission,
                # said None and left the rest unread with no signal to come; it now reads
                # the whole message, handshake/connection.py)
                continue
            more = False  # input may be left (a pass's budget ran out)
            if self._flush(io):
                received = 0
                # the transport is polled once a pass (again only when that poll was cut at
                # its fragment limit): what arrives after it signals the session for the next
                # pass (on_ready), so polling again after the messages it read found nothing
                # but cost a poll and a liveness check a request (issue 31)
                poll = True
                # a turn ends once it ran _TURN_BUDGET_NS (the rest in the next pass, the other
                # sessions and the driver's step between): one of 64 heavy requests (8 of
                # replay_ranges' 65,536 ranges, 2.5-3.4 s) stepped the driver never, and other
                # clients' sessions were lost (test_attack_invoker_long_session.py); their
                # requests waited behind all of it (test_attack_heavy_turn.py)
                turn_ends_ns = time.monotonic_ns() + _TURN_BUDGET_NS
                # messages a cut turn left read (given before any poll): the turn's poll comes
                # after them, whatever the poll before them said (it polled nothing since, and
                # what arrived meanwhile signalled a serve that took only them: the session
                # stalled for good, a bulk publish back-pressured until its timeout)
                left = link.buffered
                for _ in range(_MAX_MESSAGES_PER_PASS):
                    message = link.receive_nowait(poll)
                    if message is None:
                        more = link.may_have_more  # its polls were cut: read in the next pass
                        break
                    if left:
                        left -= 1  # not polled yet: poll stays True
                    else:
                        poll = link.may_have_more
                    work += 1
                    received += len(message)
                    io.enqueue(core.on_message(key, message, now_ns, wall_ns))
                    if (
                        not self._flush(io)
                        or received >= _RECEIVE_BUDGET_BYTES
                        or time.monotonic_ns() >= turn_ends_ns
                    ):
                        more = True
                        break
                else:
                    more = True
                if not io.outbound and core.has_replays(key):
                    if invoker is not None:
                        self._step_driver_if_due(invoker)
                    out = core.pump(key, _PUMP_BUDGET_BYTES, now_ns)
                    if out:
                        work += 1
                        io.enqueue(out)
                        self._flush(io)
            schedule.set_busy(key, more or bool(io.outbound) or core.has_replays(key))
        return work

    def _step_driver_if_due(self, driver: Driver) -> None:
        """Invoker mode, within a long pass: step the driver when the last step was
        ``DRIVER_STEP_INTERVAL_NS`` ago (what it delivers signals sessions for the next pass)."""
        now_ns = time.monotonic_ns()
        if now_ns - self._stepped_ns >= DRIVER_STEP_INTERVAL_NS:
            driver.do_work(now_ns)
            self._stepped_ns = now_ns
            self.driver_steps_in_pass += 1

    def _step_invoker_if_due(self) -> None:
        """The core's ``step_hook`` in invoker mode: called between the items of a long request."""
        if self._invoker is not None:
            self._step_driver_if_due(self._invoker)

    def _flush(self, io: _SessionIO) -> bool:
        """Send queued messages until back pressure; True when the queue is empty.

        A message that goes out renews the session's lease: the client consumed what was sent
        before (flow control let this one through), so it is alive and progressing, however
        slowly, even if it sends nothing itself.
        """
        link = io.link
        sent = False
        try:
            while io.outbound:
                try:
                    if not link.try_send(io.outbound[0]):
                        # back pressure, or (in the session's lost grace) no receiver now: a
                        # reply waits for its client to come back, not dropped (the grace's
                        # re-check closes the session if it does not)
                        if not io.awaiting and link.awaits_receiver and self.core is not None:
                            io.awaiting = True
                            self.core.counters.add("replies_awaiting_receiver")
                        return False
                except ConnectorError:
                    if self.core is not None:
                        self.core.counters.add("replies_dropped", len(io.outbound))
                    io.outbound.clear()
                    return True
                io.outbound.popleft()
                sent = True
            return True
        finally:
            if sent:
                io.awaiting = False
                if self.core is not None:
                    self.core.renew_lease(link, time.monotonic_ns())

    def _close_io(self, io: _SessionIO) -> None:
        """Close a session's link; replies still queued for it are dropped, counted."""
        if io.outbound and self.core is not None:
            self.core.counters.add("replies_dropped", len(io.outbound))
            io.outbound.clear()
        io.link.close()

    def _open_files(self) -> int:
        """The process's open descriptors, counted again only when something that opens them
        changed (recording files opened or evicted, sessions, handshakes, staged parts) or
        a minute passed: an idle server with 5,000 recording files open spent most of its
        busy time listing ``/proc/self/fd`` every second (issue 31 item 4)."""
        now_ns = time.monotonic_ns()
        count, seen, at_ns = self._fd_count
        files = self._store.recordings.files if self._store is not None else None
        listener = self._listener
        signature = (
            getattr(files, "opens", 0),
            getattr(files, "evictions", 0),
            len(self._sessions),
            len(listener.server.connections) if listener is not None else 0,
            len(listener.server.core.sessions) if listener is not None else 0,
            self.core.committer.staging.parts_staged if self.core is not None else 0,
        )
        if count < 0 or signature != seen or now_ns - at_ns >= _FD_RECOUNT_NS:
            count = open_fd_count()
            self._fd_count = (count, signature, now_ns)
        return count

    def _extra_stats(self, listed: int | None = None) -> dict[str, Any]:
        """The shell's sections of a snapshot; with ``listed`` sessions at most (``stat.json``),
        the transport's stream positions only while the sessions are that few."""
        soft, hard = nofile_limits()
        extra: dict[str, Any] = {
            "server": {
                "endpoint": self.endpoint,
                "pid": os.getpid(),
                "directory": self.config.directory,
                "uptime_s": (time.monotonic_ns() - self._started_ns) / 1e9,
            },
            "limits": {
                "open_files": self._open_files(),
                "open_files_soft_limit": soft,
                "open_files_hard_limit": hard,
                "open_files_soft_limit_at_start": self._nofile_at_start[0],
            },
            "written_at_s": time.time(),
        }
        if self._store is not None:
            extra["storage"] = self._store.space.stats()
        # one transport snapshot for both sections (it walks every stream: issue 31); the
        # stat.json snapshot's was taken a pass before (_stat_step)
        positions = listed is None or len(self._sessions) <= listed
        if not positions:
            extra["transport_positions_listed"] = False
        transport = self._stat_transport if listed is not None else None
        if transport is None and self._driver is not None:
            transport = self._driver.counters.snapshot(positions)
        if self._listener is not None:
            extra["handshake"] = self._listener.stats(transport)
        if transport is not None:
            extra["transport"] = transport
        return extra

    def snapshot(self) -> dict[str, Any]:
        """Everything ``aeron-spark stat`` shows (also written to ``stat.json`` every second)."""
        assert self.core is not None
        return self.core.stats(time.monotonic_ns(), time.time_ns())

    def _stat_step(self, now_ns: int) -> bool:
        """A part of the stat snapshot, a pass each (True once it is written or failed): the
        catalog's live recordings re-read (``STAT_REFRESH_PER_PASS`` a pass), the transport's
        counters taken, then the rest of the snapshot, then it is encoded and written. At
        2,048 sessions the whole took ~100 ms in one pass, every request queued behind it
        (issue 31: a stall past the publish p99 target); in thirds, the refresh of 2,048 live
        recordings was still ~40 ms of one pass; in parts, the sessions are served between
        them.

        Best effort: a snapshot that cannot be taken or written (a full disk, a counter
        read racing the driver thread) is skipped, logged and counted, never fatal."""
        try:
            assert self.core is not None and self._store is not None
            catalog = self._store.catalog
            if self._stat_stage == 0:
                # re-reads live (and purged) recordings only, a part a pass
                if catalog.refresh_some(STAT_REFRESH_PER_PASS):
                    self._stat_stage = 1
                return False
            if self._stat_stage == 1:
                if self._driver is not None:
                    positions = len(self._sessions) <= stat.STAT_LISTED_SESSIONS
                    self._stat_transport = self._driver.counters.snapshot(positions)
                self._stat_stage = 2
                return False
            if self._stat_stage == 2:
                # at most STAT_LISTED_SESSIONS sessions listed (stat.py): at 2,048 sessions the
                # list and the streams' positions were most of an idle snapshot's cost
                taken = self.core.stats(
                    now_ns, time.time_ns(), catalog=False, listed=stat.STAT_LISTED_SESSIONS
                )
                # the streams, the recordings and their total of one catalog state (a refresh
                # between the parts, or recordings made since this one's, would show in one
                # and not the others)
                taken["streams"] = catalog.streams()
                self._stat_recordings = catalog.recordings_json()
                if isinstance(taken.get("store"), dict) and "recordings" in taken["store"]:
                    taken["store"]["recordings"] = sum(s["recordings"] for s in taken["streams"])
                self._stat_snapshot = taken
                self._stat_transport = None
                self._stat_stage = 3
                return False
            snapshot, self._stat_snapshot = self._stat_snapshot, None
            self._stat_stage = 0
            # encoded and written on the writer's thread, each file replaced only when what it
            # says changed (stat.py); the writes that failed there counted here
            writer = self.stat_writer
            writer.submit(snapshot or {}, self._stat_recordings)
            failed = writer.failures
            if failed > self._stat_failures_seen:
                self.core.counters.add("stat_snapshot_failures", failed - self._stat_failures_seen)
            self._stat_failures_seen = failed
        except Exception as exc:  # noqa: BLE001
            self._stat_stage, self._stat_snapshot, self._stat_transport = 0, None, None
            assert self.core is not None
            self.core.counters.add("stat_snapshot_failures")
            if now_ns >= self._next_failure_log_ns:
                log.warning(
                    "cannot write the stat snapshot (skipped): %s: %s", type(exc).__name__, exc
                )
                self._next_failure_log_ns = now_ns + 1_000_000_000
        return True

    def _shutdown(self) -> None:
        now_ns = time.monotonic_ns()
        if self.core is not None:
            for key in list(self._sessions):
                self.core.close_session(key, now_ns)
        for io in self._sessions.values():
            io.link.close()
        self._sessions.clear()
        if self._listener is not None:
            self._listener.close()
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # a commit in progress finishes (it is fsynced)
        if self.core is not None:
            self.core.committer.close()
        if self._store is not None:
            self._store.close()
        if self._driver is not None:
            self._driver.close()
        self.stat_writer.close()  # its thread stopped, then its files removed
        self._release_dir_lock()  # last: everything in the directory is closed

    def _release_dir_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None


__all__ = ["StreamServer"]
