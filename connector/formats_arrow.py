"""The ``arrow`` format: each message is one Arrow IPC stream holding record batches.

Sink: every Arrow batch a task receives is cut into pieces of about ``TARGET_MESSAGE_BYTES`` and
each piece is written as one IPC stream message, so no Python runs per row. Source: each message's
batches are read with zero copy where Arrow can and handed to Spark as they are (cast to the
query's schema when a ``schema`` option asked for different types). The schema is the ``schema``
option (a Spark DDL string) or, without it, the schema of the first message of the streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
from aeron_spark.connector.client import ReplayBlock
from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.formats import Geometry, iter_messages

from aeron_spark.errors import ConfigurationError

TARGET_MESSAGE_BYTES = 64 * 1024  # fits the smallest usual stream (1 MiB terms: 128 KiB messages)


def encode_batches(
    batch: pa.RecordBatch, max_message_bytes: int, compression: str | None = None
) -> Iterator[bytes]:
    """IPC stream messages for ``batch``: pieces of about ``min(TARGET, max)`` bytes each (before
    compression: with ``lz4`` or ``zstd`` each message holds as many rows, in fewer bytes)."""
    if batch.num_rows == 0:
        return
    options = pa.ipc.IpcWriteOptions(compression=compression)
    target = max(1024, min(TARGET_MESSAGE_BYTES, max_message_bytes // 2))
    rows = max(1, int(batch.num_rows * target / max(batch.nbytes, 1)))
    for start in range(0, batch.num_rows, rows):
        piece = batch.slice(start, rows)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, piece.schema, options=options) as writer:
            writer.write_batch(piece)
        data = sink.getvalue().to_pybytes()
        if len(data) > max_message_bytes:
            if piece.num_rows == 1:
                raise ConfigurationError(
                    "format", "arrow",
                    f"rows of at most {max_message_bytes} bytes (one row is {len(data)} bytes)",
                )
            middle = piece.num_rows // 2
            yield from encode_batches(piece.slice(0, middle), max_message_bytes, compression)
            yield from encode_batches(piece.slice(middle), max_message_bytes, compression)
            continue
        yield data


def decode_message(payload: bytes | memoryview, position: int) -> list[pa.RecordBatch]:
    """The batches of one message; a message that is not an Arrow IPC stream names its position."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        return list(reader)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise ControlProtocolError(
            f"the message at position {position} is not an Arrow IPC stream ({exc}); "
            "read it with format=binary"
        ) from exc


def batches_from_blocks(
    blocks: Iterable[ReplayBlock], geometry: Geometry, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages in the replayed blocks, as ``schema``."""
    for message in iter_messages(blocks, geometry):
        for batch in decode_message(message.payload, message.position):
            if batch.schema.equals(schema):
                yield batch
                continue
            try:
                yield pa.RecordBatch.from_arrays(
                    [batch.column(name).cast(field.type) for name, field in zip(
                        schema.names, schema, strict=True
                    )],
                    schema=schema,
                )
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ControlProtocolError(
                    f"the message at position {message.position} has schema "
                    f"{batch.schema.to_string(show_schema_metadata=False)!r}, which does not "
                    f"fit the query's schema {schema.to_string(show_schema_metadata=False)!r}"
                    f" ({exc})"
                ) from exc


def schema_of_payload(payload: bytes | memoryview, position: int) -> pa.Schema:
    """The schema of one arrow-format message (a clear error when it is not Arrow)."""
    decode_message(payload, position)
    return pa.ipc.open_stream(pa.py_buffer(payload)).schema


__all__ = ["batches_from_blocks", "decode_message", "encode_batches", "schema_of_payload"]
