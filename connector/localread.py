"""Short-circuit reads: a client on the server's host reads a recording's segment files itself.

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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from aeron_spark.connector.errors import ServerError, from_archive
from aeron_spark.transport.archive import ArchiveError, Recording

#: Bytes read per block (a replay's default ``max_block_bytes``).
BLOCK_BYTES = 1024 * 1024

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


def read_blocks(
    directory: str, recording_id: int, start: int, end: int, block_bytes: int = BLOCK_BYTES
) -> Iterator[Any]:
    """:class:`~aeron_spark.connector.client.ReplayBlock` s covering exactly ``[start, end)``
    of the recording in ``directory`` (a range the server checked)."""
    from aeron_spark.connector.client import ReplayBlock

    try:
        rec = Recording.open_read_only(directory)
    except ArchiveError as exc:
        raise from_archive(exc) from None
    try:
        if rec.d.recording_id != recording_id:
            raise ServerError(
                f"local read: {directory} holds recording {rec.d.recording_id}, "
                f"not {recording_id}"
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


__all__ = ["BLOCK_BYTES", "read_blocks", "sees_server_files"]
