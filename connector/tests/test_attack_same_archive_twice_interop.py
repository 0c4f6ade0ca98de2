"""One archive named twice (two spellings of its control channel) as a replica of itself
(issue 30): against a real Java ``ArchivingMediaDriver`` (``aeron_peer.java_archives``, free
loopback ports, stopped and removed after). Counted twice, it made ``minInSyncReplicas=2`` hold
with one archive: a commit acknowledged on one host, and a reader of the "set" taking the batch
of that archive alone as held by two. Both are refused with a ConfigurationError naming the two
channels. Skips without Java only; fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeron_spark.connector.options import parse_archive_sink_options
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402
from archive_sink_helpers import commit, read_rows  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aeron_peer.JavaArchive]:
    folder = "same-archive-twice"
    with aeron_peer.module_archives(tmp_path_factory, folder, ["only"], 0x5B1) as (started,):
        yield started


def test_one_archive_named_twice_is_not_two_replicas(archive: aeron_peer.JavaArchive) -> None:
    again = f"{archive.control_channel}|alias=again"  # the same archive, another spelling
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    base = {
        "archive": archive.control_channel,
        "channel": channel,
        "streamId": "6301",
        "sinkId": "twice-6301",
        "timeoutMs": "15000",
    }
    first = [b"first-%03d" % i for i in range(100)]
    commit(parse_archive_sink_options(base), 0, first)  # minInSyncReplicas 1, no replica
    twice = parse_archive_sink_options({**base, "replicas": again, "minInSyncReplicas": "2"})
    with pytest.raises(ConfigurationError) as sink:
        commit(twice, 1, [b"second-%03d" % i for i in range(100)])
    assert sink.value.name == "replicas" and "distinct archives" in str(sink.value)
    assert archive.control_channel in str(sink.value) and again in str(sink.value)
    assert read_rows(archive, 6301) == first  # nothing appended
    with pytest.raises(ConfigurationError) as reader:
        read_rows([archive.control_channel, again], 6301)
    assert reader.value.name == "archive" and "distinct archives" in str(reader.value)
