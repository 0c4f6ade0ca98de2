"""One IPC publication's log buffer file: a metadata page and three terms, memory-mapped.

File ``<dir>/ipc/pub_<stream_id>_<session_id>.logbuffer`` (the driver directory defaults to
``/dev/shm/aeron-spark-<user>``)::

    0     magic "ASIPCLB1"        8 bytes
    8     term_length             int32      12  mtu                 int32
    16    session_id              int32      20  stream_id           int32
    24    initial_term_id         int32      28  publisher pid       int32
    32    state                   int32 (1 active, 2 closed: end of stream at ``position``)
    40    position                int64   end of the last complete frame the publisher wrote
    48    publisher heartbeat     int64   CLOCK_MONOTONIC ns (system-wide on Linux)
    64    subscriber slots        MAX_SUBSCRIBERS x 32 bytes:
              +0 position int64, +8 heartbeat int64, +16 pid int32, +20 state int32 (0 free, 1 used)
    4096  term 0, term 1, term 2  (frames exactly as on the wire)

Frames become visible to readers when their ``frame_length`` is written, which the appender does
last, so a publisher killed mid-message never exposes a torn message. Slots are claimed under an
``flock`` of the file; each slot is written only by its subscriber. Invariant: the publisher never
writes more than ``term_length / 2`` beyond the slowest live subscriber, so the term it zeroes on
rotation is one nobody still reads.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import struct
import time
from pathlib import Path

from aeron_spark.transport import counters
from aeron_spark.transport.errors import DriverError
from aeron_spark.transport.protocol import ipc as rules

MAGIC = b"ASIPCLB1"
METADATA_LENGTH = 4096
MAX_SUBSCRIBERS = 64
SLOTS_OFFSET = 64
SLOT_LENGTH = 32
STATE_ACTIVE = rules.LOG_ACTIVE
STATE_CLOSED = rules.LOG_CLOSED

_HEAD = struct.Struct("<8s6i")
# Fields other processes read while we write them are stored with one memcpy of pre-packed bytes:
# struct.pack_into zero-fills its target before writing, so a reader could see a transient 0
# (a dead-looking heartbeat, a join position of 0). _HEAD: magic, term_length, mtu, session,
# stream, initial term id, pid.
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_SLOT = struct.Struct("<qqii")
_SLOT_ARRAY = struct.Struct(f"<qqii{SLOT_LENGTH - _SLOT.size}x")  # the slots, in one pass
OFF_STATE = 32
OFF_POSITION = 40
OFF_HEARTBEAT = 48
# tries to create a log buffer in a folder other processes' drivers remove when it is empty
_CREATE_ATTEMPTS = 16


def ipc_directory(directory: Path) -> Path:
    return Path(directory) / "ipc"


def make_folder(folder: Path, attempts: int = 16, mode: int = 0o777) -> None:
    """``folder.mkdir(parents=True, exist_ok=True)``, again when a closing driver of another
    process removed an empty parent meanwhile (``Driver.close``)."""
    for attempt in range(attempts):
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=mode)
            return
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise


def file_name(stream_id: int, session_id: int) -> str:
    return f"pub_{stream_id}_{session_id}.logbuffer"  # ids may be negative: "_" separates


def parse_name(name: str) -> tuple[int, int] | None:
    if not (name.startswith("pub_") and name.endswith(".logbuffer")):
        return None
    parts = name[4 : -len(".logbuffer")].split("_")
    if len(parts) != 2:
        return None
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether the process that wrote a log file lives (0 or less: never written)."""
    return pid > 0 and counters.pid_alive(pid)


class LogFile:
    """A mapped log buffer file (created by the publisher, opened by subscribers)."""

    def __init__(self, path: Path, fd: int, mapped: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self.map = mapped
        self.view = memoryview(mapped)
        (
            _,
            self.term_length,
            self.mtu,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            self.pid,
        ) = _HEAD.unpack_from(mapped, 0)
        self.terms = [
            self.view[METADATA_LENGTH + i * self.term_length :][: self.term_length]
            for i in range(3)
        ]

    # ---------------------------------------------------------------- create / open

    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        term_length: int,
        mtu: int,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
    ) -> LogFile:
        folder = ipc_directory(directory)
        make_folder(folder)
        size = METADATA_LENGTH + 3 * term_length
        free = shutil.disk_usage(folder.parent).free
        if free < size:
            raise DriverError(
                f"not enough space for an IPC log buffer of {size / 2**20:.1f} MiB in {folder} "
                f"({free / 2**20:.1f} MiB free): enlarge /dev/shm (docker: --shm-size), use a "
                "smaller term-length in the channel, or point the driver directory elsewhere "
                "(DriverConfig(directory=...))"
            )
        path = folder / file_name(stream_id, session_id)
        if path.exists():
            raise DriverError(f"an IPC publication {path.name} already exists")
        # Built under a temporary name and renamed into place once its header is written, so a
        # subscriber never sees (or cleans up) a half-made file.
        building = folder / f".building-{os.getpid()}-{path.name}"
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                fd = os.open(building, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError as exc:
                raise DriverError(f"an IPC publication {path.name} is being created") from exc
            except FileNotFoundError:
                # the folder was empty and a closing driver removed it (see Driver.close): made
                # again; once the file is in it, nobody removes it
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
                make_folder(folder)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise DriverError(
                    f"cannot allocate {size / 2**20:.1f} MiB for {path} ({exc}): enlarge /dev/shm "
                    "or use a smaller term-length / another driver directory"
                ) from exc
            mapped = mmap.mmap(fd, size)
            _HEAD.pack_into(
                mapped,
                0,
                MAGIC,
                term_length,
                mtu,
                session_id,
                stream_id,
                initial_term_id,
                os.getpid(),
            )
            _I32.pack_into(mapped, OFF_STATE, STATE_ACTIVE)
            _I64.pack_into(mapped, OFF_HEARTBEAT, time.monotonic_ns())
            os.rename(building, path)
        except BaseException:
            os.close(fd)
            building.unlink(missing_ok=True)
            raise
        return cls(path, fd, mapped)

    @classmethod
    def open(cls, path: Path) -> LogFile | None:
        """Map an existing file; None if it is not (yet) a complete log buffer."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < METADATA_LENGTH:
                os.close(fd)
                return None
            mapped = mmap.mmap(fd, size)
        except (OSError, ValueError):
            os.close(fd)
            return None
        if mapped[:8] != MAGIC:
            mapped.close()
            os.close(fd)
            return None
        log = cls(path, fd, mapped)
        if size < METADATA_LENGTH + 3 * log.term_length:
            log.close()
            return None
        return log

    # ---------------------------------------------------------------- fields

    @property
    def state(self) -> int:
        return _I32.unpack_from(self.map, OFF_STATE)[0]

    @state.setter
    def state(self, value: int) -> None:
        self.map[OFF_STATE : OFF_STATE + 4] = _I32.pack(value)

    @property
    def position(self) -> int:
        return _I64.unpack_from(self.map, OFF_POSITION)[0]

    @position.setter
    def position(self, value: int) -> None:
        self.map[OFF_POSITION : OFF_POSITION + 8] = _I64.pack(value)

    @property
    def heartbeat_ns(self) -> int:
        return _I64.unpack_from(self.map, OFF_HEARTBEAT)[0]

    @heartbeat_ns.setter
    def heartbeat_ns(self, value: int) -> None:
        self.map[OFF_HEARTBEAT : OFF_HEARTBEAT + 8] = _I64.pack(value)

    # ---------------------------------------------------------------- subscriber slots

    def slot_offset(self, index: int) -> int:
        return SLOTS_OFFSET + index * SLOT_LENGTH

    def read_slot(self, index: int) -> tuple[int, int, int, int]:
        """(position, heartbeat_ns, pid, state)."""
        base = self.slot_offset(index)
        return (
            _I64.unpack_from(self.map, base)[0],
            _I64.unpack_from(self.map, base + 8)[0],
            _I32.unpack_from(self.map, base + 16)[0],
            _I32.unpack_from(self.map, base + 20)[0],
        )

    def claim_slot(self, position: int, now_ns: int, liveness_ns: int) -> int:
        """Take a free (or dead) slot for this process; its index. Under an exclusive flock."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            for index in range(MAX_SUBSCRIBERS):
                _, heartbeat, pid, state = self.read_slot(index)
                if state == rules.SLOT_FREE or not self.slot_live(index, now_ns, liveness_ns):
                    base = self.slot_offset(index)
                    self.map[base : base + 24] = _SLOT.pack(
                        position, now_ns, os.getpid(), rules.SLOT_USED
                    )
                    return index
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        raise DriverError(f"{self.path.name} already has {MAX_SUBSCRIBERS} subscribers")

    def release_slot(self, index: int) -> None:
        base = self.slot_offset(index) + 20
        self.map[base : base + 4] = _I32.pack(rules.SLOT_FREE)

    def set_slot_position(self, index: int, position: int) -> None:
        base = self.slot_offset(index)
        self.map[base : base + 8] = _I64.pack(position)

    def set_slot_heartbeat(self, index: int, now_ns: int) -> None:
        base = self.slot_offset(index) + 8
        self.map[base : base + 8] = _I64.pack(now_ns)

    def slot_live(self, index: int, now_ns: int, liveness_ns: int) -> bool:
        _, heartbeat, pid, state = self.read_slot(index)
        in_use = state == rules.SLOT_USED
        return rules.party_live(in_use, heartbeat, pid, now_ns, liveness_ns, pid_alive)

    def live_slots(self, now_ns: int, liveness_ns: int) -> list[int]:
        """The live subscribers' slots, the 64 read in one pass (the publication's heartbeat
        asks ten times a second: a call and four reads a slot were most of its step)."""
        area = self.view[SLOTS_OFFSET : SLOTS_OFFSET + MAX_SUBSCRIBERS * SLOT_LENGTH]
        used = rules.SLOT_USED
        return [
            i
            for i, (_, heartbeat, pid, state) in enumerate(_SLOT_ARRAY.iter_unpack(area))
            if state == used
            and rules.party_live(True, heartbeat, pid, now_ns, liveness_ns, pid_alive)
        ]

    def publisher_live(self, now_ns: int, liveness_ns: int) -> bool:
        active = self.state == STATE_ACTIVE
        return rules.party_live(active, self.heartbeat_ns, self.pid, now_ns, liveness_ns, pid_alive)

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        self.terms = []
        try:
            self.view.release()
            self.map.close()
        except BufferError:  # a caller still holds a view into a term: the GC unmaps it later
            pass
        try:
            os.close(self._fd)
        except OSError:
            pass

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)


def _building_pid(name: str) -> int | None:
    """The creator's pid of a ``.building-<pid>-<name>`` file (one being made), else None."""
    if not name.startswith(".building-"):
        return None
    pid, _, rest = name[len(".building-") :].partition("-")
    return int(pid) if pid.isdigit() and rest else None


def sweep(directory: Path, now_ns: int, liveness_ns: int) -> list[str]:
    """Remove the log files in ``directory``'s ``ipc`` folder that nobody will use again, of
    every stream; the names removed. A file goes when its publisher closed it or its process is
    gone (a Spark worker ends with ``os._exit``, a server may be killed: they never close) and
    no live subscriber holds a slot (the rule a subscription applies to its own stream's files
    when it finds them); a half-made file when its creator is gone. Run by a driver when it
    starts, so what dead processes left does not pile up in ``/dev/shm``."""
    folder = ipc_directory(directory)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed: list[str] = []
    for name in names:
        building = _building_pid(name)
        if building is not None:
            if not pid_alive(building):
                (folder / name).unlink(missing_ok=True)
                removed.append(name)
            continue
        if parse_name(name) is None:
            continue
        log = LogFile.open(folder / name)
        if log is None:
            continue  # not a complete log buffer (not ours, or being replaced)
        try:
            if log.publisher_live(now_ns, liveness_ns):
                continue
            if log.state == STATE_CLOSED or not pid_alive(log.pid):
                if not log.live_slots(now_ns, liveness_ns):
                    log.unlink()
                    removed.append(name)
        finally:
            log.close()
    return removed


__all__ = [
    "LogFile",
    "file_name",
    "ipc_directory",
    "make_folder",
    "parse_name",
    "pid_alive",
    "sweep",
]
