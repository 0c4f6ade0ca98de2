"""Attack: files a local user plants in the sink staging directory (the eighteenth session's
closing note: ``staging.py`` read its owner and part files with plain ``open()``).

- A FIFO in place of a batch's ``owner`` file: ``open()`` for reading waits for a writer, so
  the server's loop hung on the next stage or commit of that batch (no error, no log line).
- A symbolic link in place of a staged part: ``open()`` followed it, so a commit recorded the
  link's target (any file the server may read, of the right size) as the part's rows.

Each is now opened as every file of the data directory is (``diskio.open_regular``: not
blocking, not following a link, checked to be a regular file) and refused with
``NOT_REGULAR_FILE`` naming the file. Real files on a real directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aeron_spark.connector.server.staging import OWNER_FILE, PartKey, StagingStore, _key_dir
from aeron_spark.transport.archive.diskio import NotRegularFileError
from aeron_spark.transport.archive.errors import ArchiveErrorCode

from .test_attack_fifo_state_files import _bounded

OWNER = "ab" * 32


def test_a_fifo_as_a_batch_owner_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    store = StagingStore(str(tmp_path / "staging"))
    store.claim("s", 1, OWNER, "stage")
    owner = Path(_key_dir(store.root, "s", 1)) / OWNER_FILE
    owner.unlink()
    os.mkfifo(owner)
    _result, error = _bounded(lambda: store.check_owner("s", 1, OWNER, "stage"), owner)
    assert isinstance(error, NotRegularFileError), error
    assert error.code is ArchiveErrorCode.NOT_REGULAR_FILE and str(owner) in str(error)


def test_a_symlinked_part_is_refused_not_committed(tmp_path: Path) -> None:
    store = StagingStore(str(tmp_path / "staging"))
    owner = object()
    msg = store.write(owner, PartKey("q", 3, 0, 0), 10, [b"mine"], [1], True)
    assert msg is not None
    path = store.check_part(msg)
    # another part of the same size elsewhere (what the link's planter wants committed)
    other = StagingStore(str(tmp_path / "elsewhere"))
    theirs = other.write(owner, PartKey("q", 3, 0, 0), 10, [b"evil"], [2], True)
    assert theirs is not None
    os.unlink(path)
    os.symlink(other.check_part(theirs), path)
    store.check_part(msg)  # the sizes agree: only reading it tells
    with pytest.raises(NotRegularFileError, match="NOT_REGULAR_FILE") as refused:
        [rows for rows in store.read_part(path)]
    assert path in str(refused.value)
