"""What a sink store's ``stage`` needs on an executor, whichever the store: the task's partition
and attempt, the streaming batch id, and a batch's messages in the sink's payload format."""

from __future__ import annotations

import pyarrow as pa
from pyspark import TaskContext

from aeron_spark.connector.formats import payloads_from_batch
from aeron_spark.connector.formats_arrow import encode_batches
from aeron_spark.connector.formats_records import RECORD_FORMATS, encode_rows
from aeron_spark.connector.formats_sbe import SbeOptions, encode_task

ARROW_MESSAGE_BYTES = 128 * 1024  # the largest arrow message; pieces aim at half of it


def sink_payloads(
    batch: pa.RecordBatch, fmt: str, compression: str | None = None, sbe: SbeOptions | None = None
) -> tuple[list[bytes], list[int] | None]:
    """The messages of one sink batch in ``fmt`` (and reserved values, binary/text only)."""
    if sbe is not None:
        return encode_task([batch], sbe), None
    if fmt == "arrow":  # whole batches, no Python per row
        return list(encode_batches(batch, ARROW_MESSAGE_BYTES, compression)), None
    if fmt in RECORD_FORMATS:
        return encode_rows(batch, fmt), None
    return payloads_from_batch(batch, fmt)


def task_attempt() -> tuple[int, int]:
    """This task's partition id and attempt number ((0, 0) outside a Spark task)."""
    ctx = TaskContext.get()
    return (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)


def streaming_batch_id() -> int:
    """The micro-batch id of the streaming write this task is part of."""
    ctx = TaskContext.get()
    batch_text = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    if batch_text is None:
        raise RuntimeError(
            "the streaming batch id is not set on this task "
            "(property streaming.sql.batchId); cannot stage exactly once"
        )
    return int(batch_text)
