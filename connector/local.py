"""Short-circuit reads and writes: a client that sees the server's directory reads recordings
and writes its staged sink parts there itself.

Reads.

A replay carries every byte through the server's event loop, the UDP transport and the
session's sealing; a reader that sees the server's directory can read the same frames with
``pread``. The server stays in charge of *what* is read: the client asks it (``local_read``, a
request on its authenticated session) for a range; the server checks it like a replay (stream
allowed, frame boundaries within what is visible, not purged) and answers with the recording's
directory and the path and value of a random token it wrote at start. The client reads the token
file: the same value proves it sees the server's files (same host, or a shared volume), anything
else (no such file, another value: another host, a container without the volume) makes it replay
over the session instead.

The blocks are the ones a replay gives (whole raw frames, PAD frames left out, one term at most,
never spanning two entries of the recording's time index), so the rows built from them are the
same, timestamps included. Recorded bytes never change once written (recordings only grow, and
a purge deletes whole segments), so a range the server checked reads the same until a purge
removes its segment, which raises :class:`~aeron_spark.connector.errors.PurgedError` as a replay
would.

Writes (sink staging). A sink task asks (``local_stage``, on its session) for its part; the
server (re)creates the part file empty for that session and answers with its path and the token.
A task that sees the token and may open the file for writing writes the records itself, in the
staging layout (:func:`~aeron_spark.connector.session.records.records`), fsyncs and closes it, and
says ``local_stage_done`` with the count and bytes it wrote; the server reads every record back
(a part that does not check out is deleted and the stage fails, naming what differed) and
completes the part as if the task had sent its rows over the session. A task that cannot open
the file stages over its session (the first stage call recreates the part).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from aeron_spark.connector.errors import ServerError, from_archive
from aeron_spark.connector.runs import PayloadRun
from aeron_spark.connector.session.records import records
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.transport.archive import ArchiveError, Recording

#: Bytes read per block (a replay's default ``max_block_bytes``).
BLOCK_BYTES = 1024 * 1024
#: Payload bytes a task lays out and writes at a time into a part it stages locally.
WRITE_BATCH_BYTES = 4 * 1024 * 1024

_seen_lock = threading.Lock()
_seen: dict[tuple[str, str], bool] = {}


def sees_server_files(where: dict[str, Any]) -> bool:
    """Whether this process reads the token the server wrote (cached per path and value)."""
    key = (str(where["token_path"]), str(where["token"]))
    with _seen_lock:
        known = _seen.get(key)
    if known is not None:
        return known
    try:
        with open(key[0]) as fh:
            ok = fh.read() == key[1]
    except (OSError, UnicodeDecodeError):
        ok = False
    with _seen_lock:
        _seen[key] = ok
    return ok


def open_part(where: dict[str, Any] | None) -> int | None:
    """A descriptor to append to the part the server created for a local stage, or None
    (no local writes, another host, or no permission to write the file)."""
    if where is None or not sees_server_files(where):
        return None
    try:
        return os.open(str(where["path"]), os.O_WRONLY | os.O_APPEND)  # never created here
    except OSError:
        return None


def write_part(
    fd: int, batches: Iterable[tuple[list[bytes] | PayloadRun, list[int] | None]]
) -> tuple[int, int]:
    """Write batches of payloads and their reserved values (``client.batched``) as staging
    records to ``fd``; fsync and close it. Returns (count, payload bytes)."""
    count = nbytes = 0
    try:
        with os.fdopen(fd, "wb", closefd=False) as fh:
            for payloads, reserved_values in batches:
                fh.writelines(records(payloads, reserved_values))
                count += len(payloads)
                nbytes += (
                    payloads.nbytes if isinstance(payloads, PayloadRun) else sum(map(len, payloads))
                )
            fh.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
    return count, nbytes


def read_blocks(
    directory: str, recording_id: int, start: int, end: int, block_bytes: int = BLOCK_BYTES
) -> Iterator[Any]:
    """:class:`~aeron_spark.connector.session.replay.ReplayBlock` s covering exactly
    ``[start, end)`` of the recording in ``directory`` (a range the server checked)."""
    try:
        rec = Recording.open_read_only(directory, start, end)
    except ArchiveError as exc:
        raise from_archive(exc) from None
    try:
        if rec.d.recording_id != recording_id:
            raise ServerError(
                f"local read: {directory} holds recording {rec.d.recording_id}, not {recording_id}"
            )
        position = start
        while position < end:
            try:
                block_end, frames, ts = rec.read(position, block_bytes, end)
            except ArchiveError as exc:
                raise from_archive(exc) from None
            except OSError as exc:
                raise ServerError(
                    f"local read of recording {recording_id} at {position} failed: {exc}"
                ) from exc
            if block_end <= position:
                raise ServerError(
                    f"local read: recording {recording_id} has no complete frame at {position} "
                    f"although the server reported it readable to {end} (damaged segment file?)"
                )
            yield ReplayBlock(position, frames, ts, block_end)
            position = block_end
    finally:
        rec.close()


__all__ = [
    "BLOCK_BYTES",
    "WRITE_BATCH_BYTES",
    "open_part",
    "read_blocks",
    "sees_server_files",
    "write_part",
]
