"""Reading a part file's records back (the server, for a local stage's check and for the
commit): what was laid out comes back, runs of equal lengths as arrays, and a block of payloads of
mixed lengths is read looking at each record a bounded number of times."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from aeron_spark.connector.session import records as records_module
from aeron_spark.connector.session.records import RECORD, block_records, records


def _mixed_with_runs() -> tuple[list[bytes], list[int]]:
    """The local stage test's mix of lengths (0 to 9,000 bytes), with runs of equal lengths
    between them: shorter than a run (63), just one (64, 65), long (1,000)."""
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice([0, 3, 116, 700, 9000])) for _ in range(3000)]
    for at, count, length in [(100, 63, 40), (900, 64, 116), (1500, 65, 0), (2200, 1000, 24)]:
        payloads[at:at] = [rng.randbytes(length) for _ in range(count)]
    return payloads, [rng.randrange(-(2**63), 2**63) for _ in payloads]


def _read(block: bytes) -> tuple[list[bytes], list[int], int]:
    got: list[bytes] = []
    rvs: list[int] = []
    reader = block_records(block)
    while True:
        try:
            payloads, reserved = next(reader)
        except StopIteration as end:
            return got, rvs, end.value
        if isinstance(payloads, np.ndarray):  # a run: a row per payload
            got += [row.tobytes() for row in payloads]
            rvs += [int(v) for v in reserved]
        else:
            got += [bytes(p) for p in payloads]
            rvs += list(reserved)


def test_a_block_of_mixed_lengths_reads_back_as_laid_out() -> None:
    payloads, rvs = _mixed_with_runs()
    block = b"".join(bytes(piece) for piece in records(payloads, rvs))
    got, got_rvs, used = _read(block)
    assert used == len(block)
    assert got == payloads and got_rvs == rvs
    # cut inside the last record: the whole ones come back, the rest is left for the next block
    got, got_rvs, used = _read(block[:-5])
    assert got == payloads[:-1] and got_rvs == rvs[:-1]
    assert used == len(block) - RECORD.size - len(payloads[-1])


def test_a_block_of_mixed_lengths_is_read_looking_at_each_record_a_bounded_number_of_times(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """The reader looked for a run of equal lengths at every record by looking at every record
    after it in the block: a 4 MiB block of mixed lengths cost its records times its length
    (seconds per commit of a few thousand rows; the local stage test of 3,000 mixed rows took
    40 s against 9 s for 50,000 equal ones). Counted here: the record headers looked at."""
    payloads, rvs = _mixed_with_runs()
    block = b"".join(bytes(piece) for piece in records(payloads, rvs))
    looked = {"headers": 0}

    class CountingNumpy:
        """numpy for the records module, counting the records each view of the block spans."""

        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

        def frombuffer(self, buf: Any, dtype: Any, count: int, offset: int) -> Any:
            (length, _rv) = RECORD.unpack_from(buf, offset)  # each view starts at a record
            looked["headers"] += count // (RECORD.size + length)
            return np.frombuffer(buf, dtype, count, offset)

    monkeypatch.setattr(records_module, "np", CountingNumpy())
    got, _rvs, used = _read(block)
    assert used == len(block) and got == payloads
    # at most the next 64 records from each record, or twice a run found (and the run's view)
    bound = 2 * 64 * len(payloads)
    assert looked["headers"] <= bound, (
        f"{looked['headers']} record headers looked at to read {len(payloads)} records "
        f"(bound {bound})"
    )
