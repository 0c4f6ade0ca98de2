"""Archive mode of the source without Spark or an archive: its options, the term-aligned
split of ranges, and which frames a split task owns (the messages that begin in its share)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from aeron_spark.connector.client import ReplayBlock
from aeron_spark.connector.formats import Geometry, iter_messages
from aeron_spark.connector.options import (
    ArchiveConnect,
    is_archive_mode,
    parse_archive_source_options,
)
from aeron_spark.connector.source import split_ranges as _split
from aeron_spark.connector.stores.archive import ArchiveRange, ArchiveStore
from aeron_spark.connector.stores.archive import owned as _owned
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client import ReplayedBlock

ARCHIVE = "aeron:udp?endpoint=127.0.0.1:8010"
HEADER = struct.Struct("<iBBhiiiiq")
BEGIN, END = 0x80, 0x40


def test_options_of_archive_mode() -> None:
    assert is_archive_mode({"Archive": ARCHIVE}) and not is_archive_mode({"endpoint": "h:1"})
    o = parse_archive_source_options(
        {
            "archive": ARCHIVE,
            "streamId": "7",
            "channel": " x ",
            "timeoutMs": "5000",
            "format": "json",
            "schema": "a long",
            "maxMessagesPerTrigger": "10",
        }
    )
    assert o.connect == ArchiveConnect(ARCHIVE, 10, None, 5.0)
    assert (o.channel, o.source.stream_ids, o.source.format) == ("x", (7,), "json")
    assert o.source.max_messages_per_trigger == 10


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"archive": "aeron:ipc", "streamId": "1"}, "archive"),
        ({"archive": "h:8010", "streamId": "1"}, "archive"),
        ({"archive": ARCHIVE, "streamId": "1", "endpoint": "h:1"}, "endpoint"),
        ({"archive": ARCHIVE, "streamId": "1", "consumerId": "c"}, "consumerId"),
        ({"archive": ARCHIVE, "streamId": "1", "startingTimestamp": "1"}, "startingTimestamp"),
        (
            {"archive": ARCHIVE, "streamId": "1", "archiveControlStreamId": "x"},
            "archiveControlStreamId",
        ),
        ({"archive": ARCHIVE, "streamId": "1", "bogus": "1"}, "bogus"),
        ({"archive": ARCHIVE}, "streamId"),
    ],
)
def test_bad_options_name_what_is_wrong(options: dict, name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_archive_source_options(options)
    assert info.value.name.lower() == name.lower()


def _range(start: int, end: int, term: int = 1024, limit: int | None = None) -> ArchiveRange:
    return ArchiveRange(
        ArchiveStore(ArchiveConnect(ARCHIVE)),
        "1/2",
        2,
        start,
        end,
        0,
        term,
        False,
        session_id=5,
        stream_id=6,
        limit=end if limit is None else limit,
        exact=limit is None,
    )


def test_split_gives_as_many_shares_as_asked_each_replayed_from_a_term_boundary() -> None:
    # Issue 32 item 7: cuts fell on term boundaries only, so a range within few terms gave
    # fewer partitions than minPartitions asked (4 for 5), though README says "at least".
    parts = _split([_range(100, 5000)], 5)
    assert [(p.start, p.end) for p in parts] == [
        (100, 1056),
        (1056, 2048),
        (2048, 3040),
        (3040, 4000),
        (4000, 5000),
    ]
    assert [p.replay_from for p in parts] == [None, 1024, 2048, 2048, 3072]
    assert all(not p.exact and p.limit == 5000 for p in parts)
    assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))
    small = _split([_range(0, 500)], 4)  # no term boundary inside: replayed from 0
    assert [(p.start, p.end, p.replay_from) for p in small] == [
        (0, 96, None),
        (96, 224, 0),
        (224, 352, 0),
        (352, 500, 0),
    ]
    assert len(_split([_range(0, 96)], 4)) == 3  # one share per 32-byte frame at most
    assert _split([_range(0, 32)], 4) == [_range(0, 32)]


def _frames(sizes_flags: list[tuple[int, int]], start: int = 0) -> tuple[bytes, list[int]]:
    """Frames of payload sizes and flags from ``start`` (term length 1 MiB: one term)."""
    out, positions = bytearray(), []
    at = start
    for size, flags in sizes_flags:
        positions.append(at)
        frame = HEADER.pack(32 + size, 0, flags, 1, at, 5, 6, 0, 0) + bytes([at % 251]) * size
        frame += bytes(-len(frame) % 32)
        out += frame
        at += len(frame)
    return bytes(out), positions


def test_a_task_owns_the_messages_that_begin_in_its_share() -> None:
    # m0 whole; m1 in three fragments; m2 whole; m3 in two fragments; m4 whole.
    layout = [
        (40, BEGIN | END),
        (100, BEGIN),
        (100, 0),
        (100, END),
        (40, BEGIN | END),
        (100, BEGIN),
        (100, END),
        (40, BEGIN | END),
    ]
    data, pos = _frames(layout)
    total = len(data)
    geometry = Geometry(0, 1 << 20)

    def owned(start: int, end: int, cut: int = 96) -> list[int]:
        # The replay from ``start`` to the range end, in blocks of at most ``cut`` bytes.
        at = pos.index(start) if start in pos else 0
        blocks, offset = [], pos[at] if start in pos else start
        while offset < total:
            n = min(cut, total - offset)
            while offset + n < total and offset + n not in pos:
                n += 32
            blocks.append(ReplayedBlock(offset, data[offset : offset + n], offset + n))
            offset += n
        mine = _owned(blocks, _range(start, end, 1 << 20, limit=total))
        rb = [ReplayBlock(b.position, b.data, 0, b.end_position) for b in mine]
        return [m.position for m in iter_messages(rb, geometry)]

    begins = [pos[0], pos[1], pos[4], pos[5], pos[7]]
    assert owned(0, total) == begins
    # A cut inside m1 (at its middle fragment): m1 belongs to the first share only.
    cut = pos[2]
    assert owned(0, cut) == begins[:2]
    assert owned(cut, total) == begins[2:]
    # Cuts at every frame: every message exactly once over the shares.
    for cut in pos[1:]:
        assert owned(0, cut) + owned(cut, total) == begins, cut


def test_shares_cut_inside_frames_own_every_message_once() -> None:
    # A share that starts inside a frame is replayed from the term boundary below it (0 here)
    # and skips what lies before its start: every message exactly once over the shares.
    layout = [(40, BEGIN | END), (100, BEGIN), (100, 0), (100, END), (40, BEGIN | END)] * 3
    data, pos = _frames(layout)
    total = len(data)
    geometry = Geometry(0, 1 << 20)
    begins = [p for p, (_s, flags) in zip(pos, layout, strict=True) if flags & BEGIN]

    def owned(start: int, end: int) -> list[int]:
        edges = [*pos[::2], total]  # blocks of two whole frames, as a replay sends them
        blocks = [ReplayedBlock(a, data[a:b], b) for a, b in zip(edges, edges[1:], strict=False)]
        part = _range(start, end, 1 << 20, limit=total)
        if start:
            part = dataclasses.replace(part, replay_from=0)
        rb = [ReplayBlock(b.position, b.data, 0, b.end_position) for b in _owned(blocks, part)]
        return [m.position for m in iter_messages(rb, geometry)]

    for parts in (3, 5, 7, 11):
        shares = _split([_range(0, total, 1 << 20)], parts)
        assert len(shares) == parts
        got = [m for share in shares for m in owned(share.start, share.end)]
        assert got == begins, parts


def test_archive_sink_options_are_checked_clearly() -> None:
    """The sink in archive mode needs a target channel on the archive's host and a sinkId for
    streaming; stream-server options and a staging stream equal to the target are refused."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from aeron_spark.connector.datasource import AeronDataSource
    from aeron_spark.connector.options import parse_archive_sink_options
    from aeron_spark.connector.sink import AeronBatchWriter, AeronStreamWriter
    from aeron_spark.connector.stores.archive.sink import ArchiveSink

    schema = StructType([StructField("value", BinaryType())])
    base = {"archive": ARCHIVE, "streamId": "1"}
    for make in (
        lambda s: s.writer(schema, False),
        lambda s: s.streamWriter(schema, False),
    ):
        with pytest.raises(ConfigurationError, match="channel on the archive's host") as info:
            make(AeronDataSource(base))
        assert info.value.name == "channel"
    channel = "aeron:udp?endpoint=127.0.0.1:40456|term-length=65536|session-id=7"
    ok = AeronDataSource({**base, "channel": channel, "sinkId": "s"})
    for writer in (ok.writer(schema, False), ok.streamWriter(schema, False)):
        assert isinstance(writer, AeronBatchWriter | AeronStreamWriter)
        assert isinstance(writer.store, ArchiveSink)
    assert isinstance(ok.writer(schema, False), AeronBatchWriter)
    assert isinstance(ok.streamWriter(schema, False), AeronStreamWriter)
    o = parse_archive_sink_options({**base, "channel": channel})
    assert o.channel == "aeron:udp?endpoint=127.0.0.1:40456"  # the sink sets session-id itself
    assert o.term_length == 65536 and o.staging_channel == o.channel
    with pytest.raises(ConfigurationError, match="sinkId"):
        AeronDataSource({**base, "channel": channel}).streamWriter(schema, False)
    with pytest.raises(ConfigurationError, match="overwritten"):
        ok.writer(schema, True)
    bad = [
        ({"channel": "aeron:ipc"}, "channel"),
        ({"channel": channel, "endpoint": "127.0.0.1:1"}, "endpoint"),
        ({"channel": channel, "localWrites": "false"}, "localWrites"),
        ({"channel": channel, "archiveStagingStreamId": "1"}, "archiveStagingStreamId"),
        ({"channel": channel, "archiveStagingStreamId": "x"}, "archiveStagingStreamId"),
        ({"channel": channel, "archiveStagingChannel": "aeron:udp?x=1"}, "archiveStagingChannel"),
    ]
    for extra, name in bad:
        with pytest.raises(ConfigurationError) as info:
            parse_archive_sink_options({**base, **extra})
        assert info.value.name == name, extra
