"""A directory put at a name the server writes through (``diskio.create_fresh``).

The server makes every fixed temporary name of its data directory, and each staged part's
file, with ``create_fresh``: what is there is removed first, never opened nor followed (a FIFO
there hung the loop, a link was written through). A directory there is not removed by
``unlink``: the write failed with a bare ``IsADirectoryError``, an uncoded error the client
saw as text ("consumer_commit failed on the server: IsADirectoryError: [Errno 21] ..."). Such a
file is refused as every other thing not a regular file is: ``NOT_REGULAR_FILE`` naming it, the
server serving on, and the write done once the directory is moved aside. Real server process,
real files (local tasks may write the staging directory; anyone who can write the data
directory can put one at ``consumers.msgpack.tmp``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aeron_spark.connector.errors import ServerError
from aeron_spark.connector.server.testing import client_for, server_process


def test_attack_a_directory_at_the_consumers_temporary_name_is_refused_coded(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "srv")
    with server_process(directory) as (_, endpoint), client_for(endpoint, timeout_s=20.0) as c:
        c.publish(5, [b"x"])
        squat = os.path.join(directory, "consumers.msgpack.tmp")
        os.mkdir(squat)
        with open(os.path.join(squat, "inside"), "w") as fh:
            fh.write("kept\n")
        with pytest.raises(ServerError) as caught:
            c.consumer_commit("c1", [5], {0: 1})
        text = str(caught.value)
        print(f"refused: {text}")
        assert "NOT_REGULAR_FILE" in text and squat in text, text
        assert c.publish(5, [b"y"]) > 0  # the loop serves
        with open(os.path.join(squat, "inside")) as fh:
            assert fh.read() == "kept\n"  # left as it is
        os.rename(squat, squat + ".aside")
        c.consumer_commit("c1", [5], {0: 1})  # moved aside: the commit goes


def test_attack_a_directory_at_a_parts_file_is_refused_coded(tmp_path: Path) -> None:
    directory = str(tmp_path / "srv")
    with server_process(directory) as (_, endpoint), client_for(endpoint, timeout_s=20.0) as c:
        c.publish(5, [b"x"])
        batch = os.path.join(directory, "sink", "staged", b"q".hex(), "3")
        part = os.path.join(batch, "0-0@5.open")
        os.makedirs(part)
        with pytest.raises(ServerError) as caught:
            c.stage("q", 3, 0, 0, 5, [b"payload"], local=False)
        text = str(caught.value)
        print(f"refused: {text}")
        assert "NOT_REGULAR_FILE" in text and part in text, text
        assert c.publish(5, [b"y"]) > 0
        os.rmdir(part)
        c.stage("q", 3, 0, 0, 5, [b"payload"], local=False)  # gone: staged


def test_attack_a_directory_at_the_consumers_file_is_refused_coded(tmp_path: Path) -> None:
    """The variant at the final name: a directory put at ``consumers.msgpack`` while the server
    runs (its start refuses one, ``read_regular``). The rename of the new content onto it failed
    with a bare ``IsADirectoryError`` (main: the client saw 'consumer_commit failed on the
    server: IsADirectoryError: [Errno 21] Is a directory: ...') and left the temporary file
    behind; now ``NOT_REGULAR_FILE`` naming it, the directory left as it is."""
    directory = str(tmp_path / "srv")
    with server_process(directory) as (_, endpoint), client_for(endpoint, timeout_s=20.0) as c:
        c.publish(5, [b"x"])
        squat = os.path.join(directory, "consumers.msgpack")
        os.mkdir(squat)
        with open(os.path.join(squat, "inside"), "w") as fh:
            fh.write("kept\n")
        with pytest.raises(ServerError) as caught:
            c.consumer_commit("c1", [5], {0: 1})
        text = str(caught.value)
        print(f"refused: {text}")
        assert "NOT_REGULAR_FILE" in text and squat in text, text
        assert not os.path.exists(squat + ".tmp")  # no temporary file left behind
        assert c.publish(5, [b"y"]) > 0  # the loop serves
        with open(os.path.join(squat, "inside")) as fh:
            assert fh.read() == "kept\n"  # left as it is
        os.rename(squat, squat + ".aside")
        c.consumer_commit("c1", [5], {0: 1})  # moved aside: the commit goes
        assert c.stats()["consumers"][0]["consumer_id"] == "c1"
