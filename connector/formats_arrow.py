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

from aeron_spark.connector.errors import ControlProtocolError
from aeron_spark.connector.formats import Geometry, iter_messages
from aeron_spark.connector.session.replay import ReplayBlock
from aeron_spark.errors import ConfigurationError

# Pieces aim at 60 KiB of rows, so that a message with its IPC framing (schema, metadata,
# padding: about 1 KiB for a few columns) fits one frame of the largest usual mtu (65504, what the
# server's recordings use: 65472 bytes of payload) and is read back without reassembly; it also
# fits the smallest usual stream (1 MiB terms: 128 KiB messages).
TARGET_MESSAGE_BYTES = 60 * 1024


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
                    "format",
                    "arrow",
                    f"rows of at most {max_message_bytes} bytes (one row is {len(data)} bytes)",
                )
            middle = piece.num_rows // 2
            yield from encode_batches(piece.slice(0, middle), max_message_bytes, compression)
            yield from encode_batches(piece.slice(middle), max_message_bytes, compression)
            continue
        yield data


_CONTINUATION = b"\xff\xff\xff\xff"
_EOS = _CONTINUATION + bytes(4)


class _SchemaCache:
    """Schemas by the bytes of their IPC schema message: a stream's messages repeat the same one,
    so it is parsed once, not once per message."""

    LIMIT = 64

    def __init__(self) -> None:
        self._by_bytes: dict[bytes, pa.Schema] = {}

    def get(self, message: memoryview) -> pa.Schema:
        key = bytes(message)
        schema = self._by_bytes.get(key)
        if schema is None:
            schema = pa.ipc.read_schema(pa.py_buffer(key))
            if len(self._by_bytes) >= self.LIMIT:
                self._by_bytes.clear()
            self._by_bytes[key] = schema
        return schema


def _decode_one_batch(view: memoryview, schemas: _SchemaCache) -> list[pa.RecordBatch] | None:
    """The one record batch of a message laid out as the sink writes it (schema, one record batch,
    end of stream), read with the schema from the cache; None for any other layout (dictionaries,
    several batches, no continuation markers): the general reader takes those."""
    if len(view) < 16 or view[:4] != _CONTINUATION:
        return None
    schema_end = 8 + int.from_bytes(view[4:8], "little")
    if schema_end + 8 > len(view) or view[schema_end : schema_end + 4] != _CONTINUATION:
        return None
    buffer = pa.py_buffer(view)
    message = pa.ipc.read_message(buffer.slice(schema_end))
    if message.type != "record batch":
        return None
    end = schema_end + 8 + int.from_bytes(view[schema_end + 4 : schema_end + 8], "little")
    tail = view[end + message.body.size :]
    if len(tail) not in (0, 8) or (len(tail) == 8 and tail != _EOS):
        return None
    return [pa.ipc.read_record_batch(message, schemas.get(view[:schema_end]))]


def decode_message(
    payload: bytes | bytearray | memoryview, position: int, schemas: _SchemaCache | None = None
) -> list[pa.RecordBatch]:
    """The batches of one message; a message that is not an Arrow IPC stream names its position."""
    try:
        if schemas is not None:
            batches = _decode_one_batch(memoryview(payload), schemas)
            if batches is not None:
                return batches
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
    """Arrow batches of the messages in the replayed blocks, as ``schema``, coalesced into
    batches of about :data:`COALESCE_ROWS` rows (see :func:`coalesce`)."""
    return coalesce(_message_batches(blocks, geometry, schema))


# Spark takes a Python source's Arrow batches one by one, at a cost per batch: a trivial source
# reaches a noop sink at 1.9 M rows/s (116 B rows) in batches of 383 rows, one ~60 KiB message's
# worth, and at 2.3-2.4 M rows/s in batches of 4,096 or 65,536 (local[2], one run). Copying the
# rows into larger batches costs about 0.1 s of CPU per million such rows here, so the net gain
# is small (arrow source 0.60-0.73 of that source with, 0.61-0.66 without, interleaved runs).
COALESCE_ROWS = 8192
COALESCE_BYTES = 8 * 1024 * 1024


def coalesce(
    batches: Iterable[pa.RecordBatch], rows: int = COALESCE_ROWS, nbytes: int = COALESCE_BYTES
) -> Iterator[pa.RecordBatch]:
    """The same rows in the same order: small consecutive batches of one schema concatenated
    until a batch holds at least ``rows`` rows or ``nbytes`` bytes; large ones pass as they are,
    empty ones are left out."""
    pending: list[pa.RecordBatch] = []
    pending_rows = pending_bytes = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        # the buffers' size (a slice counts its whole buffers): RecordBatch.nbytes costs ~14 µs
        size = batch.get_total_buffer_size()
        large = batch.num_rows >= rows or size >= nbytes
        if pending and (large or not batch.schema.equals(pending[0].schema)):
            yield _concat(pending)
            pending, pending_rows, pending_bytes = [], 0, 0
        if large:
            yield batch
            continue
        pending.append(batch)
        pending_rows += batch.num_rows
        pending_bytes += size
        if pending_rows >= rows or pending_bytes >= nbytes:
            yield _concat(pending)
            pending, pending_rows, pending_bytes = [], 0, 0
    if pending:
        yield _concat(pending)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _message_batches(
    blocks: Iterable[ReplayBlock], geometry: Geometry, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    schemas = _SchemaCache()
    for message in iter_messages(blocks, geometry):
        for batch in decode_message(message.payload, message.position, schemas):
            if batch.schema.equals(schema):
                yield batch
                continue
            try:
                yield pa.RecordBatch.from_arrays(
                    [
                        batch.column(name).cast(field.type)
                        for name, field in zip(schema.names, schema, strict=True)
                    ],
                    schema=schema,
                )
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ControlProtocolError(
                    f"the message at position {message.position} has schema "
                    f"{batch.schema.to_string(show_schema_metadata=False)!r}, which does not "
                    f"fit the query's schema {schema.to_string(show_schema_metadata=False)!r}"
                    f" ({exc})"
                ) from exc


def schema_of_payload(payload: bytes | bytearray | memoryview, position: int) -> pa.Schema:
    """The schema of one arrow-format message (a clear error when it is not Arrow)."""
    decode_message(payload, position)
    return pa.ipc.open_stream(pa.py_buffer(payload)).schema


__all__ = [
    "batches_from_blocks",
    "coalesce",
    "decode_message",
    "encode_batches",
    "schema_of_payload",
]
