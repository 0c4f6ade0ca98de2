"""What is put at ``local-read.token.tmp`` in a stopped server's directory: the server's start
neither hangs on it nor writes through it.

The server proves to local clients that they see its directory with a token it writes at each
start (``local-read.token``, local reads and writes on by default). It wrote it through a fixed
temporary name with a plain ``open(path + ".tmp", "w")``: a FIFO there blocked the start for
good (an open for writing waits for a reader), and a symbolic link there was followed, the file
it named (anywhere the server's user may write) truncated and overwritten with the token. The
data directory hardening (NOT_REGULAR_FILE) covered the files the server reads, not this one it
writes. Real server processes, real files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from aeron_spark.connector.server.store import LOCAL_READ_TOKEN
from aeron_spark.connector.server.testing import client_for, server_process


def _prepared(tmp_path: Path) -> str:
    """A stopped server's directory (made by a first start)."""
    directory = str(tmp_path / "srv")
    with server_process(directory) as (_, endpoint), client_for(endpoint) as client:
        client.publish(5, [b"before"])
    return directory


def _check_started(directory: str) -> None:
    with server_process(directory) as (_, endpoint), client_for(endpoint) as client:
        client.publish(5, [b"after"])  # served
        token = os.path.join(directory, LOCAL_READ_TOKEN)
        st = os.lstat(token)
        assert stat.S_ISREG(st.st_mode), f"{token} is not a regular file ({st.st_mode:o})"
        with open(token) as fh:
            assert len(fh.read()) == 32
    leftovers = [n for n in os.listdir(directory) if n.startswith(LOCAL_READ_TOKEN + ".")]
    assert leftovers == [], leftovers  # what was put there removed, no temporary file left


def test_attack_a_fifo_at_the_tokens_temporary_name_does_not_hang_the_start(
    tmp_path: Path,
) -> None:
    directory = _prepared(tmp_path)
    os.mkfifo(os.path.join(directory, LOCAL_READ_TOKEN + ".tmp"), 0o600)
    _check_started(directory)  # before: "the server did not start" after 60 s (open waited)


def test_attack_a_symlink_at_the_tokens_temporary_name_is_not_written_through(
    tmp_path: Path,
) -> None:
    directory = _prepared(tmp_path)
    victim = tmp_path / "outside" / "precious"
    victim.parent.mkdir()
    victim.write_text("not the server's to write\n")
    os.symlink(victim, os.path.join(directory, LOCAL_READ_TOKEN + ".tmp"))
    _check_started(directory)
    assert victim.read_text() == "not the server's to write\n", (
        f"the server wrote its token through the link: {victim} now holds {victim.read_text()!r}"
    )


def test_attack_a_fifo_at_the_consumers_temporary_name_does_not_hang_the_server(
    tmp_path: Path,
) -> None:
    """The same pattern while the server runs: ``consumers.msgpack`` is rewritten through
    ``consumers.msgpack.tmp`` on every consumer commit. A FIFO put there made the commit's open
    wait for a reader in the server's loop: every session stalled for good."""
    directory = str(tmp_path / "srv")
    victim = tmp_path / "precious"
    victim.write_text("not the server's to write\n")
    with server_process(directory) as (_, endpoint), client_for(endpoint, timeout_s=20.0) as c:
        c.publish(5, [b"x"])
        tmp = os.path.join(directory, "consumers.msgpack.tmp")
        os.mkfifo(tmp, 0o600)
        c.consumer_commit("c1", [5], {0: 1})  # before: no answer in 20 s, the loop stuck
        os.symlink(victim, tmp)  # a link in its place after that commit: not followed either
        c.consumer_commit("c1", [5], {0: 1})
        assert c.publish(5, [b"y"]) > 0  # the loop serves
    assert victim.read_text() == "not the server's to write\n"


def test_attack_a_link_or_fifo_at_a_parts_file_is_not_written_through(tmp_path: Path) -> None:
    """A staged part's ``.open`` file sits in the staging directory, which tasks staging
    locally write (local writes: on by default). One of them put a symbolic link at the name
    of a part it then staged over the session: the server opened it ``open(path, "wb")``,
    truncating and writing the part into whatever the link named (anything the server's user
    may write); a FIFO there stalled the loop for good."""
    directory = str(tmp_path / "srv")
    victim = tmp_path / "precious"
    victim.write_text("not the server's to write\n")
    with server_process(directory) as (_, endpoint), client_for(endpoint, timeout_s=20.0) as c:
        c.publish(5, [b"x"])
        batch = os.path.join(directory, "sink", "staged", b"q".hex(), "3")
        os.makedirs(batch)
        os.symlink(victim, os.path.join(batch, "0-0@5.open"))
        os.mkfifo(os.path.join(batch, "1-0@5.open"), 0o600)
        c.stage("q", 3, 0, 0, 5, [b"payload"], local=False)
        c.stage("q", 3, 1, 0, 5, [b"payload"], local=False)  # before: no reply within 20 s
        assert c.publish(5, [b"y"]) > 0  # the loop serves
    assert victim.read_text() == "not the server's to write\n", (
        f"the server wrote a staged part through the link: {victim.read_bytes()[:60]!r}"
    )
