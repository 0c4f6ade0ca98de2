"""Attack: a marker smuggled in through a staging recording.

The archive sink's driver re-publishes each committed staging recording's frames into the target
as recorded, reserved values included (``_Blocks.feed``). Its tasks never stage a frame with the
markers' reserved value (``_payloads`` refuses such rows), so one in a staging recording was put
there by someone else: a sender injecting into the staging stream (plain Aeron UDP, unsigned).
Relayed, it became a BEGIN or END in the target, with the epoch, owner, batch and end the
injector chose: a forged END of a future epoch makes its archive the newest history in every
election (and the acknowledged batches of the others are cut back to it), and a forged END
inside an append a crash tore makes the torn rows look committed. Fixed: the relay refuses a
staging recording holding a marker frame, naming it, and the commit fails (its retry stages
again); nothing of it reaches the target.

Over a real driver: the relay publishes into a real IPC publication and a real subscription
reads what reached it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aeron_spark.connector.archive_markers import (
    END,
    MARKER_RESERVED_VALUE,
    Marker,
    markers_in,
)
from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.stores.archive.sink import _Blocks
from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.protocol.frames import DATA_HEADER, DataFlags, FrameType

STREAM = 4242
WAIT_S = 30.0


def _frame(payload: bytes, rv: int) -> bytes:
    length = 32 + len(payload)
    head = DATA_HEADER.pack(
        length, 0, int(DataFlags.BEGIN | DataFlags.END), int(FrameType.DATA), 0, 0, 0, 0, rv
    )
    return (head + payload).ljust((length + 31) & -32, b"\x00")


@pytest.mark.parametrize("rows", [1, 40])  # 40 rows of one size: the relay's uniform fast path
def test_a_marker_frame_in_a_staging_recording_is_refused_not_relayed(
    tmp_path: Path, rows: int
) -> None:
    forged = Marker(
        END, "sink-identity", 7, 1, 0, 1, digest=b"f" * 8, insync=2, epoch=2**40, owner=666
    ).encode()
    row = b"r" * (len(forged) + 0)  # a row the size of the marker: one frame length for all
    staged = b"".join(_frame(row, 5) for _ in range(rows)) + _frame(forged, MARKER_RESERVED_VALUE)
    got: list[tuple[bytes, int]] = []
    with Driver(DriverConfig(directory=tmp_path / "driver", write_counters_file=False)) as d:
        sub = d.add_subscription("aeron:ipc", STREAM)
        pub = d.add_publication("aeron:ipc", STREAM)
        deadline = time.monotonic() + WAIT_S
        while not pub.is_connected:
            assert time.monotonic() < deadline, "the IPC publication never connected"
            time.sleep(0.01)
        relay = _Blocks(pub, WAIT_S)
        with pytest.raises(ServerUnavailableError, match="marker") as info:
            relay.feed(staged, 12)
            relay.finish(12)
        assert "staging recording 12" in str(info.value)
        relay.flush()
        pub.offer(b"end of test", reserved_value=1)
        assembler = FragmentAssembler(lambda p, hdr: got.append((bytes(p), hdr.reserved_value)))
        deadline = time.monotonic() + WAIT_S
        while not got or got[-1][0] != b"end of test":
            assert time.monotonic() < deadline, got
            sub.poll(assembler, 100)
            time.sleep(0.005)
    # main: the forged END reached the target, a marker to every reader and election
    assert all(rv != MARKER_RESERVED_VALUE for _p, rv in got), len(got)
    assert not markers_in(staged[: rows * len(_frame(row, 5))], 0)
