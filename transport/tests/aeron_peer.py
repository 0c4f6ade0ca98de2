"""The real Aeron (Java, from Maven Central) as a peer for the interop tests and benchmarks.

``python transport/tests/aeron_peer.py fetch`` downloads ``io.aeron:aeron-all:<AERON_VERSION>``
(media driver, client, samples, archive and AeronStat in one jar) with Maven into a cache
directory git ignores (``<repo>/.cache/aeron/``, or ``$AERON_JAR_DIR``) and prints its path.
``python transport/tests/aeron_peer.py path`` prints the jar's path if it is there (exit 1 if not).

Nothing of Aeron is kept in the repository: the jar is fetched, pinned to one version.

The rest of this module starts Java processes against that jar so that they stay light on a
small machine: a media driver in the SHARED threading mode with a backoff idle strategy, its
own ``aeron.dir``, sparse term files, a small heap, the ``--add-opens`` Java 17 needs; every
process in its own process group, stopped with SIGINT then SIGKILL. Used by
``test_interop_aeron.py``, ``spark_tests/test_interop_ingest.py`` and ``benchmarks/transport.py``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__:
    from transport.tests import children
else:  # run as a script (``python transport/tests/aeron_peer.py fetch``): its folder is on sys.path
    import children  # type: ignore[no-redef]

AERON_VERSION = "1.47.3"
ARTIFACT = f"io.aeron:aeron-all:{AERON_VERSION}"
JAR_NAME = f"aeron-all-{AERON_VERSION}.jar"
JAR_DIR_ENV = "AERON_JAR_DIR"
# Set by CI: a missing jar (or Java) fails the interop tests instead of skipping them.
REQUIRED_ENV = "AERON_INTEROP_REQUIRED"
REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_COMMAND = "python transport/tests/aeron_peer.py fetch"

# Java 17: Aeron/Agrona reach into these JDK internals (direct buffers, socket channels).
JVM_FLAGS = (
    "-Xmx256m",
    "-Xss512k",
    "-XX:+UseSerialGC",  # one GC thread: the machine has 2 cores
    "-XX:CICompilerCount=2",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
)
# In a test (pytest sets PYTEST_CURRENT_TEST while one runs) the client compiler only: a test's
# peer lives for seconds, and C2 compiling Aeron's hot paths costs more CPU than it saves on a
# 2-core machine (test_interop_aeron.py at load ~10: 25.8 s of CPU for its processes instead of
# 33.8 s). The benchmarks, which time the Java side, keep the JIT's defaults.
TEST_JVM_FLAGS = ("-XX:TieredStopAtLevel=1",)
STOP_TIMEOUT_S = 10.0
DRIVER_START_S = 30.0


class PeerUnavailable(RuntimeError):
    """The Java peer cannot run here (no Java, no Maven, the jar could not be fetched)."""


def jar_dir() -> Path:
    raw = os.environ.get(JAR_DIR_ENV)
    return Path(raw) if raw else REPO_ROOT / ".cache" / "aeron"


def jar_path() -> Path:
    return jar_dir() / JAR_NAME


def class_data_path() -> Path:
    """The jar's classes as the JVM loaded them, dumped once (a dynamic CDS archive,
    :func:`make_class_data`): a peer started with it maps them instead of loading and verifying
    them from the jar again."""
    return jar_dir() / f"{JAR_NAME}.jsa"


def required() -> bool:
    return os.environ.get(REQUIRED_ENV, "") not in ("", "0", "false", "no")


_fetch_failure: list[str] = []  # the reason of a fetch this process already tried and lost


def unavailable_reason() -> str | None:
    """Why the Java peer cannot run, or None when it can.

    A missing jar is fetched here (once per process) when Maven is on PATH, so the README's test
    command runs the interop tests on any machine that has Java and Maven, not only in CI.
    """
    if shutil.which("java") is None:
        return "no `java` on PATH (Java 17 runs the real Aeron media driver)"
    if not jar_path().is_file():
        if shutil.which("mvn") is None:
            return f"{jar_path()} is missing and there is no `mvn` to fetch it ({FETCH_COMMAND})"
        if not _fetch_failure:
            try:
                fetch()
            except PeerUnavailable as exc:
                _fetch_failure.append(str(exc))
        if _fetch_failure:
            return f"{jar_path()} is missing and fetching it failed: {_fetch_failure[0]}"
    return None


def fetch(directory: Path | None = None, timeout_s: float = 600.0) -> Path:
    """Download the pinned aeron-all jar with Maven into ``directory``; returns its path."""
    directory = directory or jar_dir()
    target = directory / JAR_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeerUnavailable(f"cannot fetch {ARTIFACT}: no `mvn` on PATH")
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "dependency:copy",
        f"-Dartifact={ARTIFACT}",
        f"-DoutputDirectory={directory}",
    ]
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise PeerUnavailable(f"cannot fetch {ARTIFACT}: mvn took over {timeout_s} s") from exc
    if done.returncode != 0 or not target.is_file():
        out = (done.stdout + done.stderr).decode("utf-8", "replace")[-3000:]
        raise PeerUnavailable(
            f"cannot fetch {ARTIFACT} from Maven Central (mvn exit {done.returncode}):\n{out}"
        )
    return target


# --------------------------------------------------------------------------- processes


def require_java(what: str = "the real Aeron (Java)") -> None:
    """In a test: skip when Java or the jar is missing, or fail when ``AERON_INTEROP_REQUIRED``
    says the interop tests must run (CI)."""
    import pytest  # only tests call this; the fetch script runs without pytest

    reason = unavailable_reason()
    if reason is not None:
        message = f"{what} is not available: {reason}"
        if required():
            pytest.fail(f"{REQUIRED_ENV} is set but {message}", pytrace=False)
        pytest.skip(message)


# A peer is in a process group of its own (stop() signals its group): children.popen starts it so
# that it dies with the test process all the same (PR_SET_PDEATHSIG, from one spawner thread).
# Never a session of its own: where the kernel groups CPU time by session (autogroup), each JVM
# in a session of its own got as much CPU as the whole test run, and a parallel run's nice
# levels (root conftest.py) did not reach it: Spark's Python workers, in the run's session, starved.


class PeerProgram:
    """One process in its own process group; its stdout+stderr lines go to a queue.

    A daemon thread blocks on ``readline`` so waiting for output is a bounded ``Queue.get``.
    ``stop()`` is idempotent and always leaves the process reaped.
    """

    def __init__(
        self,
        argv: list[str],
        name: str,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = children.popen(
            argv,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        if stdin is not None:
            # e.g. "n\n" for the samples' "Execute again? (y/n)" prompt (Scanner on System.in).
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(stdin)
            self.proc.stdin.close()
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._queue.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self._queue.put(None)

    def next_line(self, deadline: float) -> str | None:
        """The next output line, or None at EOF or when ``deadline`` (monotonic) passes."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            line = self._queue.get(timeout=remaining)
        except queue.Empty:
            return None
        if line is None:
            self._queue.put(None)  # keep EOF visible to later callers
            return None
        self.lines.append(line)
        return line

    def wait_for_line(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """The first line matching ``pattern``, among those already read or still to come.

        Lines already read count because the samples' output order is not fixed (an image
        that is ready at once may be announced before the subscription reports itself ready).
        """
        for seen in self.lines:
            if m := pattern.search(seen):
                return m
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.next_line(deadline)
            if line is None:
                raise AssertionError(
                    f"{self.name}: no line matching {pattern.pattern!r} within {timeout_s} s "
                    f"(exit code {self.proc.poll()}); output so far:\n" + self.transcript()
                )
            if m := pattern.search(line):
                return m

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{self.name} did not exit within {timeout_s} s:\n" + self.transcript()
            ) from exc

    def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.next_line(deadline) is not None:
            pass

    def transcript(self, last: int = 40, width: int = 300) -> str:
        """The last lines of output for a failure message, long lines cut."""
        return "\n".join(
            line if len(line) <= width else line[:width] + f"... ({len(line)} chars)"
            for line in self.lines[-last:]
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._reader.join(timeout=STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def java_argv(
    main_class: str,
    properties: Mapping[str, object],
    *,
    classpath: list[Path] | None = None,
    args: list[str] | None = None,
    jvm_flags: Sequence[str] = (),
) -> list[str]:
    java = shutil.which("java") or "java"
    cp = os.pathsep.join(str(p) for p in [*(classpath or []), jar_path()])
    props = [f"-D{k}={v}" for k, v in properties.items()]
    flags = [*JVM_FLAGS, *(TEST_JVM_FLAGS if os.environ.get("PYTEST_CURRENT_TEST") else ())]
    flags += jvm_flags
    cds = class_data_path()
    if not classpath and cds.is_file():  # dumped with the jar alone on the class path
        # a JVM of another build ignores the archive; its warning saying so is not printed
        flags += [f"-XX:SharedArchiveFile={cds}", "-Xlog:cds*=off"]
    return [java, *flags, "-cp", cp, *props, main_class, *(args or [])]


def driver_properties(aeron_dir: str, **extra: object) -> dict[str, object]:
    """System properties for a light media driver with its own directory."""
    props: dict[str, object] = {
        "aeron.dir": aeron_dir,
        "aeron.dir.delete.on.start": "true",
        "aeron.dir.delete.on.shutdown": "true",
        "aeron.threading.mode": "SHARED",
        "aeron.shared.idle.strategy": "backoff",
        "aeron.term.buffer.sparse.file": "true",
        "aeron.print.configuration": "false",
        # Only used by channels with cc=cubic: then the receiver sends RTTM requests.
        "aeron.CubicCongestionControl.measureRtt": "true",
    }
    props.update(extra)
    return props


def new_aeron_dir(tag: str = "interop") -> str:
    return f"/dev/shm/aeron-java-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class JavaMediaDriver:
    """A running ``io.aeron.driver.MediaDriver`` and the client programs started against it.

    ``close()`` stops the clients first (SIGINT, then SIGKILL), then the driver, and removes
    the Aeron directory.
    """

    def __init__(self, tag: str = "interop", **properties: object) -> None:
        self.aeron_dir = new_aeron_dir(tag)
        self.properties = driver_properties(self.aeron_dir, **properties)
        self.programs: list[PeerProgram] = []
        self.driver = PeerProgram(
            java_argv("io.aeron.driver.MediaDriver", self.properties), "java-media-driver"
        )
        cnc = Path(self.aeron_dir) / "cnc.dat"
        deadline = time.monotonic() + DRIVER_START_S
        # The driver writes cnc.dat when ready (clients would wait for it too, but a driver that
        # fails to start should fail here, with its own output).
        try:
            while not (cnc.exists() and cnc.stat().st_size > 0):
                if self.driver.proc.poll() is not None or time.monotonic() > deadline:
                    self.driver.drain(1.0)
                    raise RuntimeError(
                        "the Java media driver did not start:\n" + self.driver.transcript()
                    )
                time.sleep(0.02)
        except BaseException:
            self.close()
            raise

    def client_properties(self, **props: object) -> dict[str, object]:
        base: dict[str, object] = {
            "aeron.dir": self.aeron_dir,
            "aeron.sample.idleStrategy": "backoff",
        }
        base.update(props)
        return base

    def run(
        self,
        main_class: str,
        properties: Mapping[str, object] | None = None,
        *,
        classpath: list[Path] | None = None,
        args: list[str] | None = None,
        stdin: bytes | None = None,
        name: str | None = None,
    ) -> PeerProgram:
        argv = java_argv(
            main_class,
            self.client_properties(**(properties or {})),
            classpath=classpath,
            args=args,
        )
        program = PeerProgram(argv, name or main_class.rsplit(".", 1)[-1], stdin=stdin)
        self.programs.append(program)
        return program

    def close(self) -> None:
        for p in self.programs:
            p.stop()
        self.driver.stop()
        shutil.rmtree(self.aeron_dir, ignore_errors=True)

    def __enter__(self) -> JavaMediaDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JavaArchive:
    """A running ``io.aeron.archive.ArchivingMediaDriver`` (media driver and archive in one
    JVM) with a UDP control request channel on ``127.0.0.1:<control_port>``: what a team running
    Aeron in production has. Sleeping idle strategies (2 cores); ``close()`` stops it (SIGINT,
    then SIGKILL) and removes its Aeron directory (the archive directory is the caller's).
    ``kill()`` is a kill -9 (the archive gone without a goodbye)."""

    def __init__(
        self,
        archive_dir: Path,
        control_port: int,
        archive_id: int = 0,
        tag: str = "archive",
        *,
        classpath: list[Path] | None = None,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
        wait: bool = True,
        jvm_flags: Sequence[str] = (),
        **properties: object,
    ) -> None:
        """``classpath``: more entries before the jar (classes of our own the archive loads,
        e.g. an authenticator named by ``aeron.archive.authenticator.supplier``). ``host``: the
        address of its control channel (and, unless ``properties`` say otherwise, of its
        replication and control response channels); ``prefix``: runs it inside a network
        namespace (``ip netns exec NS``, :mod:`aeron_spark.transport.testing_netns`).
        ``wait=False``: returns once the JVM is started; the caller then calls
        :meth:`wait_started` (several archives start at once: :func:`archive_set`)."""
        self._restart = (tag, classpath, dict(properties))
        self.aeron_dir = new_aeron_dir(tag)
        self.archive_dir = archive_dir
        self.control_port = control_port
        self.archive_id = archive_id
        self.host = host
        self.prefix = list(prefix)
        self.control_channel = f"aeron:udp?endpoint={host}:{control_port}"
        sleeping = "org.agrona.concurrent.SleepingMillisIdleStrategy"
        props = driver_properties(self.aeron_dir, **{"aeron.shared.idle.strategy": sleeping})
        props.update(
            {
                "aeron.archive.dir": str(archive_dir),
                "aeron.archive.control.channel": self.control_channel,
                "aeron.archive.replication.channel": f"aeron:udp?endpoint={host}:0",
                "aeron.archive.recording.events.enabled": "false",
                "aeron.archive.threading.mode": "SHARED",
                "aeron.archive.idle.strategy": sleeping,
                "aeron.archive.id": archive_id,
                "aeron.archive.segment.file.length": 1 << 20,
                # A local recording (a spy) counts as a subscriber: a publisher recorded in the
                # archive's own driver (RecordedBasicPublisher) can publish with no one else on.
                "aeron.spies.simulate.connection": "true",
            }
        )
        props.update(properties)
        if host != "127.0.0.1" and "aeron.archive.control.response.channel" in props:
            props["aeron.archive.control.response.channel"] = f"aeron:udp?endpoint={host}:0"
        self.properties = props
        self.program = PeerProgram(
            [
                *self.prefix,
                *java_argv(
                    "io.aeron.archive.ArchivingMediaDriver",
                    props,
                    classpath=classpath,
                    jvm_flags=jvm_flags,
                ),
            ],
            f"java-{tag}",
        )
        self._started_at = time.monotonic()
        if wait:
            self.wait_started()

    def wait_started(self, timeout_s: float = DRIVER_START_S) -> None:
        """Until the archive answers on its control port (bounded: ``timeout_s`` from its
        start); closes it and raises if it exits or the bound passes."""
        mark = self.archive_dir / "archive-mark.dat"
        control_port, host = self.control_port, self.host
        deadline = self._started_at + timeout_s
        try:
            while not (mark.exists() and mark.stat().st_size > 0):
                if self.program.proc.poll() is not None or time.monotonic() > deadline:
                    self.program.drain(1.0)
                    raise RuntimeError(
                        "the Java archive did not start:\n" + self.program.transcript()
                    )
                time.sleep(0.05)
            # the mark comes before the control subscription binds its port: until it does, a
            # connect is refused (ICMP port unreachable), which clients of a set of archives take
            # for a dead archive
            while not udp_port_bound(control_port, host):
                if self.program.proc.poll() is not None or time.monotonic() > deadline:
                    self.program.drain(1.0)
                    raise RuntimeError(
                        "the Java archive did not bind its control port:\n"
                        + self.program.transcript()
                    )
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    def kill(self) -> None:
        if self.program.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.program.proc.pid, signal.SIGKILL)
            self.program.proc.wait(timeout=STOP_TIMEOUT_S)

    def restart_after_kill(self, tag: str | None = None) -> JavaArchive:
        """A new archive on this one's directory, control port, host and properties, after
        :meth:`kill`: a killed archive's mark file says "active" for 10 s more, and a restart
        before then is refused ("active Mark file detected"); an operator who knows it is dead
        removes it, as this does. The caller stops the new one."""
        if self.program.proc.poll() is None:
            raise RuntimeError("restart_after_kill: the archive still runs (kill() it first)")
        shutil.rmtree(self.aeron_dir, ignore_errors=True)
        (self.archive_dir / "archive-mark.dat").unlink(missing_ok=True)
        old_tag, classpath, properties = self._restart
        return JavaArchive(
            self.archive_dir,
            self.control_port,
            self.archive_id,
            tag=tag or f"{old_tag}-restarted",
            classpath=classpath,
            host=self.host,
            prefix=self.prefix,
            **properties,
        )

    def close(self) -> None:
        self.program.stop()
        shutil.rmtree(self.aeron_dir, ignore_errors=True)

    def __enter__(self) -> JavaArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# What an archive needs to replicate from another (it connects to the source as a client of
# its own): answers on loopback.
REPLICATION_CLIENT_PROPS = {
    "aeron.archive.control.response.channel": "aeron:udp?endpoint=127.0.0.1:0"
}


def udp_port_bound(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something receives on the UDP ``port``: a datagram no Aeron receiver handles (an
    8-byte frame header of the extension type) is not answered with ICMP port unreachable."""
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        s.settimeout(0.05)
        try:
            s.send(struct.pack("<iBBH", 8, 0, 0, 0xFFFF))
            s.recv(64)
        except ConnectionRefusedError:
            return False
        except TimeoutError:
            return True
    return True


def free_udp_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def archive_set(
    root: Path,
    archives: Sequence[tuple[str, int]],
    *,
    extra: Mapping[str, Mapping[str, object]] | None = None,
    classpaths: Mapping[str, list[Path]] | None = None,
    hosts: Mapping[str, tuple[str, Sequence[str]]] | None = None,
) -> Iterator[dict[str, JavaArchive]]:
    """Several real archives at once (a primary and its replicas; issue 30): each
    ``(name, archive id)`` an :class:`JavaArchive` in ``root/<name>`` on a free control port,
    able to replicate from the others (:data:`REPLICATION_CLIENT_PROPS`), with its ``extra``
    properties and ``classpaths`` entries, and ``hosts`` ((address, ``ip netns exec`` prefix):
    another host, e.g. a network namespace; default loopback); by name, in the order given.
    Every one is stopped (and its Aeron directory removed) at the end, also when one fails to
    start, or was killed."""
    extra = extra or {}
    classpaths = classpaths or {}
    hosts = hosts or {}
    started: dict[str, JavaArchive] = {}
    try:
        # every JVM started before waiting for any: their start-ups (class loading, the
        # driver's and the archive's files) overlap instead of adding up
        for name, archive_id in archives:
            host, prefix = hosts.get(name, ("127.0.0.1", ()))
            started[name] = JavaArchive(
                root / name,
                free_udp_port(host) if not prefix else free_udp_port(),
                archive_id,
                tag=f"set-{name}",
                classpath=classpaths.get(name),
                host=host,
                prefix=prefix,
                wait=False,
                **{**REPLICATION_CLIENT_PROPS, **extra.get(name, {})},
            )
        for archive in started.values():  # as long as one after the other would have had
            archive.wait_started(DRIVER_START_S * len(started))
        yield started
    finally:
        for archive in started.values():
            archive.close()


# the sink replicas' name for the same properties
LOOPBACK_CLIENT_PROPS = REPLICATION_CLIENT_PROPS


@contextlib.contextmanager
def java_archives(
    root: Path, names: list[str], first_id: int = 1, **properties: object
) -> Iterator[list[JavaArchive]]:
    """:func:`archive_set` by a list of names (ids ``first_id``, ``first_id + 1``...), each
    with the same extra ``properties``; the archives in that order, the k-th on loopback address
    ``127.0.0.<k+1>``: as on hosts of their own, a sink stages on the same port of whichever is
    primary, and two archives on one address could both want that port (one refused it with
    "Address already in use" while the other still recorded there after a promotion)."""
    archives = [(name, first_id + k) for k, name in enumerate(names)]
    hosts = {name: (f"127.0.0.{k + 1}", ()) for k, name in enumerate(names)}
    extra = {name: properties for name in names}
    with archive_set(root, archives, extra=extra, hosts=hosts) as started:
        yield [started[name] for name in names]


@contextlib.contextmanager
def module_archives(
    tmp_path_factory: Any, folder: str, names: list[str], first_id: int
) -> Iterator[list[JavaArchive]]:
    """:func:`java_archives` for a module-scoped fixture (``tmp_path_factory`` is pytest's):
    Java required (skips without it, fails under ``AERON_INTEROP_REQUIRED``), the archives in
    a fresh temporary ``folder``."""
    require_java()
    with java_archives(tmp_path_factory.mktemp(folder), names, first_id) as started:
        yield started


def make_class_data() -> Path | None:
    """:func:`class_data_path` made if missing (by :data:`FETCH_COMMAND`, after the jar): an
    archive started and stopped with ``-XX:ArchiveClassesAtExit``, the dump tried by a JVM
    before it takes the final name (os.replace: no JVM ever maps a partly written one, which
    would crash it). Measured at load 13-14: an archive's JVM start 0.36-0.60 s of CPU with
    it, 0.61-1.19 s without. None when it cannot be made (the peers then start without it)."""
    import tempfile

    target = class_data_path()
    if target.is_file():
        return target
    dump = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            archive = JavaArchive(
                Path(tmp) / "archive",
                free_udp_port(),
                1,
                tag="class-data",
                jvm_flags=[f"-XX:ArchiveClassesAtExit={dump}"],
            )
            archive.close()  # SIGINT: a normal exit, which writes the dump
            if not dump.is_file():
                return None
            java = shutil.which("java") or "java"
            check = subprocess.run(  # exits 0 at once (it names the argument it cannot read)
                [java, *JVM_FLAGS, f"-XX:SharedArchiveFile={dump}", "-Xshare:on", "-cp"]
                + [str(jar_path()), "io.aeron.samples.AeronStat", "--help"],
                cwd=tmp,  # a crash's hs_err file goes with it
                capture_output=True,
                timeout=60,
                check=False,
            )
        if check.returncode != 0:
            return None
        os.replace(dump, target)
        return target
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return None
    finally:
        dump.unlink(missing_ok=True)


def compile_java(source: str, class_name: str, out_dir: Path) -> Path:
    """Compile one class of our own against the jar into ``out_dir`` (returns it, a classpath
    entry). For peers the samples do not cover."""
    javac = shutil.which("javac")
    if javac is None:
        raise PeerUnavailable("no `javac` on PATH (a JDK, not only a JRE, is needed)")
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / f"{class_name}.java"
    src.write_text(source)
    done = subprocess.run(
        [javac, "-nowarn", "-cp", str(jar_path()), "-d", str(out_dir), str(src)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"javac {src} failed:\n" + done.stderr.decode("utf-8", "replace"))
    return out_dir


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("fetch", "path"):
        print(f"usage: {FETCH_COMMAND} | python transport/tests/aeron_peer.py path")
        return 2
    if argv[0] == "path":
        if jar_path().is_file():
            print(jar_path())
            return 0
        print(f"{jar_path()} is missing; run `{FETCH_COMMAND}`", file=sys.stderr)
        return 1
    try:
        print(fetch())
    except PeerUnavailable as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    cds = make_class_data()
    # stdout is the jar's path alone (callers read it); what became of the archive on stderr
    print(
        f"class data archive: {cds}" if cds else "no class data archive: the peers start without",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# --------------------------------------------------------------------------- the driver's CnC file

_CNC_END_OF_METADATA = 128  # align(5 ints + 3 longs, 2 cache lines)
_METADATA_RECORD = 512  # Agrona CountersReader: state, type id, deadline, key, label
_VALUE_RECORD = 128
_LABEL_OFFSET = 128
_RECORD_ALLOCATED = 1


def read_cnc(aeron_dir: str) -> tuple[dict[str, int], str]:
    """The real driver's counters (label -> value; labels repeated get their values summed) and
    the text of its first error-log entry ("" when the driver logged no error), read from its
    ``cnc.dat`` (Aeron's CnC layout, version 0.2.x)."""
    data = (Path(aeron_dir) / "cnc.dat").read_bytes()
    version = int.from_bytes(data[0:4], "little")
    if version >> 16 != 0 or (version >> 8) & 0xFF != 2:
        raise RuntimeError(f"unexpected CnC version {version:#x} in {aeron_dir}")
    to_driver, to_clients, meta_len, values_len, error_len = (
        int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "little") for i in range(5)
    )
    meta_at = _CNC_END_OF_METADATA + to_driver + to_clients
    values_at = meta_at + meta_len
    error_at = values_at + values_len
    counters: dict[str, int] = {}
    for counter_id in range(meta_len // _METADATA_RECORD):
        rec = meta_at + counter_id * _METADATA_RECORD
        state = int.from_bytes(data[rec : rec + 4], "little", signed=True)
        if state == 0:
            break  # records are allocated in order; the rest is unused
        if state != _RECORD_ALLOCATED:
            continue
        label_len = int.from_bytes(data[rec + _LABEL_OFFSET : rec + _LABEL_OFFSET + 4], "little")
        label_at = rec + _LABEL_OFFSET + 4
        label = data[label_at : label_at + label_len].decode("ascii", "replace")
        value_at = values_at + counter_id * _VALUE_RECORD
        value = int.from_bytes(data[value_at : value_at + 8], "little", signed=True)
        counters[label] = counters.get(label, 0) + value
    # Distinct error log record: length, count, last and first timestamps, then the text.
    first_len = int.from_bytes(data[error_at : error_at + 4], "little") if error_len else 0
    first_error = data[error_at + 24 : error_at + first_len].decode("ascii", "replace")
    return counters, first_error


def assert_driver_clean(aeron_dir: str) -> None:
    """The real driver counted no invalid packet, no error, no error frame and logged no error."""
    counters, first_error = read_cnc(aeron_dir)
    bad = {
        k: v
        for k, v in counters.items()
        if v and (k == "Invalid packets" or k.startswith("Errors") or k.startswith("Error Frames"))
    }
    assert not bad and not first_error, (
        f"the real Aeron driver complained: {bad} {first_error[:2000]}"
    )
