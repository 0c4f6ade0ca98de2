"""Whole SBE messages (header, root block, repeating groups, var data) to Arrow rows and back.

A run of messages whose template has a fixed block (no groups, no var data) is decoded and
encoded as one byte matrix (:mod:`.block`), no Python per message. Messages with groups or var
data are walked one by one to find where each block and each var field lies (Python per message,
and per group entry only for groups that themselves hold groups or data); every block found is
then decoded with all the others of its kind in one matrix, never field by field.

Evolution as the SBE standard defines it: the header's ``blockLength`` and ``version`` are the
acting ones. A longer block (a newer writer) is read up to our block length and the rest skipped;
a shorter one (an older writer) reads as if zero-padded, and every field whose ``sinceVersion`` is
above the message's version (or that lies past its acting block) is null; groups and var data
newer than the message are null. Group entries use their own header's ``blockLength`` the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aeron_spark.transport.sbe.block import BlockDecoder, BlockEncoder, arrow_type
from aeron_spark.transport.sbe.errors import OtherTemplateError, SbeDecodeError, SbeEncodeError
from aeron_spark.transport.sbe.schema import (
    PRIMITIVES,
    Block,
    Data,
    Message,
    Node,
    Schema,
    parse_schema,
)

Payload = bytes | bytearray | memoryview


def _unpacker(composite: Node, names: tuple[str, ...], order: str) -> struct.Struct:
    """A struct reading ``names`` (integer members of ``composite``) in that order."""
    by_name = {c.name: c for c in composite.children}
    fmt, at = order, 0
    members = sorted((by_name[n].offset, n) for n in names)
    codes = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i", "u8": "Q", "i8": "q"}
    for offset, n in members:
        fmt += "x" * (offset - at) + codes[PRIMITIVES[by_name[n].primitive][0]]
        at = offset + by_name[n].size
    return struct.Struct(fmt)


def _ordered(names: tuple[str, ...], composite: Node) -> list[str]:
    by_name = {c.name: c for c in composite.children}
    return sorted(names, key=lambda n: by_name[n].offset)


@dataclass
class _Level:
    """Where the blocks of one block layout (the root, or one group) were found."""

    block: Block
    runs: list[tuple[Payload, int, int, int, int]] = field(default_factory=list)
    # (buffer, start, acting block length, count, version) per run of consecutive entries
    counts: list[int] = field(default_factory=list)  # entries per parent (-1: absent)
    groups: list[_Level] = field(default_factory=list)
    data: list[list[Payload | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.groups = [_Level(g) for g in self.block.groups]
        self.data = [[] for _ in self.block.data]


class MessageCodec:
    """Decoder and encoder of one message template of a schema."""

    def __init__(self, schema: Schema, message: Message, raw_enums: bool = False) -> None:
        self.schema = schema
        self.message = message
        self.raw_enums = raw_enums
        order = schema.byte_order
        self.header_length = schema.header_length
        names = ("blockLength", "templateId", "schemaId", "version")
        self._header_names = _ordered(names, schema.header)
        self._header = _unpacker(schema.header, names, order)
        header_block = Block("header", self.header_length, schema.header.children)
        self._header_decoder = BlockDecoder(header_block.fields, self.header_length, order, True)
        self._header_encoder = BlockEncoder(header_block.fields, self.header_length, order, True)
        self._decoders: dict[int, BlockDecoder] = {}
        self._encoders: dict[int, BlockEncoder] = {}
        self._dims: dict[int, tuple[struct.Struct, list[str]]] = {}
        self._lengths: dict[int, struct.Struct] = {}
        self._walk_setup(message)
        self.arrow_schema = pa.schema(_block_fields(message, raw_enums))

    def _walk_setup(self, block: Block) -> None:
        order = self.schema.byte_order
        self._decoders[id(block)] = BlockDecoder(
            block.fields, block.block_length, order, self.raw_enums
        )
        self._encoders[id(block)] = BlockEncoder(
            block.fields, block.block_length, order, self.raw_enums
        )
        for g in block.groups:
            names = ("blockLength", "numInGroup")
            self._dims[id(g)] = (_unpacker(g.dimension, names, order), _ordered(names, g.dimension))
            self._walk_setup(g)
        for d in block.data:
            code = {"uint8": "B", "uint16": "H", "uint32": "I"}[d.length_primitive]
            self._lengths[id(d)] = struct.Struct(order + code)

    @property
    def fixed(self) -> bool:
        return self.message.fixed

    @property
    def message_length(self) -> int:
        """Bytes of one message of a fixed template, header included."""
        return self.header_length + self.message.block_length

    # --- decode ------------------------------------------------------------------------------

    def headers(self, payloads: Sequence[Payload]) -> list[tuple[int, int, int, int]]:
        """(blockLength, templateId, schemaId, version) of each message."""
        out = []
        unpack = self._header.unpack_from
        pos = [
            self._header_names.index(n)
            for n in ("blockLength", "templateId", "schemaId", "version")
        ]
        for i, p in enumerate(payloads):
            if len(p) < self.header_length:
                raise SbeDecodeError(
                    f"message {i} has {len(p)} bytes, shorter than the "
                    f"{self.header_length}-byte message header",
                    index=i,
                )
            h = unpack(p)
            out.append((h[pos[0]], h[pos[1]], h[pos[2]], h[pos[3]]))
        return out

    def decode(self, payloads: Sequence[Payload]) -> tuple[pa.RecordBatch, np.ndarray]:
        """Rows of the messages of this template, and the indices of the other messages (other
        templates or schemas), which are left out."""
        n = len(payloads)
        if n and self.fixed:
            length = len(payloads[0])
            if all(len(p) == length for p in payloads):
                flat = np.frombuffer(b"".join(payloads), np.uint8)
                return self.decode_matrix(flat.reshape(n, length))
        heads = self.headers(payloads)
        m = self.message
        others = [i for i, (_, t, s, _) in enumerate(heads) if t != m.id or s != self.schema.id]
        if others:
            skip = set(others)
            keep = [i for i in range(n) if i not in skip]
            payloads = [payloads[i] for i in keep]
            heads = [heads[i] for i in keep]
        root = _Level(m)
        h = self.header_length
        for i, (p, (bl, _, _, version)) in enumerate(zip(payloads, heads, strict=True)):
            try:
                end = self._walk(root, p, h, bl, version)
            except struct.error:
                end = len(p) + 1
            if end > len(p):
                raise SbeDecodeError(
                    f"message {i} (template {m.id}) is {len(p)} bytes long, "
                    "shorter than its block, groups and data say",
                    index=i,
                    template_id=m.id,
                )
        return self._batch(root, len(payloads)), np.array(others, dtype=np.int64)

    def decode_matrix(self, matrix: np.ndarray) -> tuple[pa.RecordBatch, np.ndarray]:
        """Messages of equal length as the rows of a uint8 matrix: all vectorised for a fixed
        template. Returns the rows of this template and the indices of the others."""
        n, length = matrix.shape
        h = self.header_length
        if length < h:
            raise SbeDecodeError(
                f"messages of {length} bytes are shorter than the {h}-byte message header", index=0
            )
        head = self._header_decoder.decode(
            np.ascontiguousarray(matrix[:, :h]), np.zeros(n, np.int64), np.full(n, h, np.int64)
        )
        cols = {c.name: i for i, c in enumerate(self.schema.header.children)}

        def col(name: str) -> np.ndarray:
            return head[cols[name]].to_numpy(zero_copy_only=False).astype(np.int64)

        template, schema_id = col("templateId"), col("schemaId")
        mine = (template == self.message.id) & (schema_id == self.schema.id)
        others = np.flatnonzero(~mine)
        if not self.fixed:
            batch, _ = self.decode([bytes(r) for r in matrix[mine]])
            return batch, others
        acting = col("blockLength")[mine]
        versions = col("version")[mine]
        rows = matrix[mine] if len(others) else matrix
        short = acting > length - h
        if short.any():
            i = int(np.flatnonzero(mine)[np.argmax(short)])
            raise SbeDecodeError(
                f"message {i} (template {self.message.id}) is {length} bytes, "
                f"shorter than its header's block length {int(acting.max())}",
                index=i,
                template_id=self.message.id,
            )
        blocks = _fit_blocks(rows, h, acting, self.message.block_length)
        columns = self._decoders[id(self.message)].decode(blocks, versions, acting)
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema), others

    def _walk(self, level: _Level, buf: Payload, pos: int, bl: int, version: int) -> int:
        level.runs.append((buf, pos, bl, 1, version))
        pos += bl
        return self._walk_tail(level, buf, pos, version)

    def _walk_tail(self, level: _Level, buf: Payload, pos: int, version: int) -> int:
        block = level.block
        for g, sub in zip(block.groups, level.groups, strict=True):
            if g.since_version > version:
                sub.counts.append(-1)
                continue
            unpack, names = self._dims[id(g)]
            dim = dict(zip(names, unpack.unpack_from(buf, pos), strict=True))
            pos += g.dimension.size
            gbl, count = dim["blockLength"], dim["numInGroup"]
            sub.counts.append(count)
            if g.fixed:
                sub.runs.append((buf, pos, gbl, count, version))
                pos += gbl * count
            else:
                for _ in range(count):
                    pos = self._walk(sub, buf, pos, gbl, version)
        for d, values in zip(block.data, level.data, strict=True):
            if d.since_version > version:
                values.append(None)
                continue
            (size,) = self._lengths[id(d)].unpack_from(buf, pos)
            pos += d.prefix_size
            values.append(buf[pos : pos + size])
            pos += size
        return pos

    def _batch(self, root: _Level, n: int) -> pa.RecordBatch:
        columns = self._level_columns(root)
        return (
            pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)
            if n
            else pa.RecordBatch.from_pylist([], schema=self.arrow_schema)
        )

    def _level_columns(self, level: _Level) -> list[pa.Array]:
        block = level.block
        ours = block.block_length
        versions, acting, parts = [], [], []
        for buf, start, bl, count, version in level.runs:
            if count == 0:
                continue
            data = (
                np.frombuffer(buf, np.uint8, count=bl * count, offset=start)
                if bl
                else np.zeros(0, np.uint8)
            )
            parts.append(_fit(data.reshape(count, bl), ours))
            versions.append(np.full(count, version, np.int64))
            acting.append(np.full(count, bl, np.int64))
        if parts:
            matrix = (
                np.ascontiguousarray(np.concatenate(parts))
                if len(parts) > 1
                else np.ascontiguousarray(parts[0])
            )
            v, a = np.concatenate(versions), np.concatenate(acting)
        else:
            matrix = np.zeros((0, ours), np.uint8)
            v = a = np.zeros(0, np.int64)
        columns = self._decoders[id(block)].decode(matrix, v, a)
        for g, sub in zip(block.groups, level.groups, strict=True):
            entries = pa.StructArray.from_arrays(
                self._level_columns(sub), fields=_block_fields(g, self.raw_enums)
            )
            counts = np.array(sub.counts, np.int64)
            offsets = np.zeros(len(counts) + 1, np.int32)
            np.cumsum(np.maximum(counts, 0), out=offsets[1:])
            absent = counts < 0
            columns.append(
                pa.ListArray.from_arrays(
                    pa.array(offsets), entries, mask=pa.array(absent) if absent.any() else None
                )
            )
        for d, values in zip(block.data, level.data, strict=True):
            columns.append(_var_array(d, values))
        return columns

    # --- encode ------------------------------------------------------------------------------

    def encode(self, batch: pa.RecordBatch | pa.Table) -> list[bytes]:
        """One message per row (header included). Every value is checked before any message is
        built: a value that does not fit raises :class:`SbeEncodeError` naming column and row."""
        matrix, pieces = self._encode(batch)
        if pieces is None:
            data = matrix.tobytes()
            size = matrix.shape[1]
            return [data[i : i + size] for i in range(0, len(data), size)]
        return [bytes(row) + tail for row, tail in zip(matrix, pieces, strict=True)]

    def encode_matrix(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """Fixed templates: the messages as the rows of one uint8 matrix (vectorised)."""
        matrix, pieces = self._encode(batch)
        if pieces is not None:
            raise SbeEncodeError(
                f"message {self.message.name} has groups or var data: use encode()",
                column=None,
                row=None,
            )
        return matrix

    def _encode(self, batch: pa.RecordBatch | pa.Table) -> tuple[np.ndarray, list[bytes] | None]:
        n = batch.num_rows
        columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        known = {f.name for f in self.arrow_schema}
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise SbeEncodeError(
                f"column {unknown[0]!r} is no field of message "
                f"{self.message.name} (it has {', '.join(sorted(known))})",
                column=unknown[0],
                row=None,
            )
        m = self.message
        head = {
            "blockLength": pa.array(np.full(n, m.block_length, np.int64)),
            "templateId": pa.array(np.full(n, m.id, np.int64)),
            "schemaId": pa.array(np.full(n, self.schema.id, np.int64)),
            "version": pa.array(np.full(n, self.schema.version, np.int64)),
        }
        header = self._header_encoder.encode(head, n)
        body = self._encoders[id(m)].encode(columns, n)
        matrix = np.concatenate([header, body], axis=1) if body.shape[1] else header
        if m.fixed:
            return np.ascontiguousarray(matrix), None
        return matrix, self._tails(m, columns, n, np.arange(n), "")

    def _tails(
        self, block: Block, columns: dict, n: int, rows: np.ndarray, path: str
    ) -> list[bytes]:
        """The bytes after each entry's block: its groups then its var data."""
        tails: list[list[bytes]] = [[] for _ in range(n)]
        for g in block.groups:
            arr = columns.get(g.name)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            name = path + g.name
            if arr is None:
                counts = np.zeros(n, np.int64)
                entries: dict = {}
                m = 0
            else:
                if not pa.types.is_list(arr.type) or not pa.types.is_struct(arr.type.value_type):
                    raise SbeEncodeError(
                        f"column {name!r}: expected an array of structs "
                        f"(group {g.name}), not {arr.type}",
                        column=name,
                        row=None,
                    )
                counts = pa.compute.fill_null(pa.compute.list_value_length(arr), 0).to_numpy()
                counts = counts.astype(np.int64)
                flat = arr.flatten()
                m = len(flat)
                entries = dict(zip([f.name for f in flat.type], flat.flatten(), strict=True))
                known = {f.name for f in _block_fields(g, self.raw_enums)}
                unknown = [c for c in entries if c not in known]
                if unknown:
                    raise SbeEncodeError(
                        f"column {name}.{unknown[0]!r} is no field of group {g.name}",
                        column=f"{name}.{unknown[0]}",
                        row=None,
                    )
            leaf = g.count_leaf
            high = int(leaf.max_value)
            if (counts > high).any():
                row = int(rows[int(np.argmax(counts > high))])
                raise SbeEncodeError(
                    f"column {name!r}, row {row}: expected at most {high} entries",
                    column=name,
                    row=row,
                )
            entry_rows = np.repeat(rows, counts)
            matrix = self._encoders[id(g)].encode(entries, m, name + ".", entry_rows)
            sub = None if g.fixed else self._tails(g, entries, m, entry_rows, name + ".")
            unpack, names = self._dims[id(g)]
            starts = np.zeros(n + 1, np.int64)
            np.cumsum(counts, out=starts[1:])
            dim = bytearray(g.dimension.size)
            for i in range(n):
                count, s, e = int(counts[i]), int(starts[i]), int(starts[i + 1])
                members = {"blockLength": g.block_length, "numInGroup": count}
                unpack.pack_into(dim, 0, *(members[k] for k in names))
                if sub is None:
                    tails[i].append(bytes(dim) + matrix[s:e].tobytes())
                else:
                    tails[i].append(
                        bytes(dim) + b"".join(matrix[j].tobytes() + sub[j] for j in range(s, e))
                    )
        for d in block.data:
            arr = columns.get(d.name)
            name = path + d.name
            items = [None] * n if arr is None else arr.to_pylist()
            pack = self._lengths[id(d)].pack
            for i, v in enumerate(items):
                if v is None:
                    raw = b""
                elif isinstance(v, str):
                    encoding = (d.encoding or "utf-8") if d.string else "utf-8"
                    try:
                        raw = v.encode(encoding)
                    except (UnicodeEncodeError, LookupError):
                        raise SbeEncodeError(
                            f"column {name!r}, row {int(rows[i])}: expected text that "
                            f"{encoding} can encode, not {v[:40]!r}",
                            column=name,
                            row=int(rows[i]),
                        ) from None
                elif isinstance(v, bytes | bytearray):
                    raw = bytes(v)
                else:
                    raise SbeEncodeError(
                        f"column {name!r}, row {int(rows[i])}: expected text or "
                        f"bytes, not {type(v).__name__}",
                        column=name,
                        row=int(rows[i]),
                    )
                if len(raw) > d.max_length:
                    raise SbeEncodeError(
                        f"column {name!r}, row {int(rows[i])}: expected at "
                        f"most {d.max_length} bytes, not {len(raw)}",
                        column=name,
                        row=int(rows[i]),
                    )
                tails[i].append(pack(len(raw)) + raw)
        return [b"".join(t) for t in tails]


def _fit(matrix: np.ndarray, ours: int) -> np.ndarray:
    """Blocks of another length cut or zero-padded to ours (evolution)."""
    have = matrix.shape[1]
    if have == ours:
        return matrix
    if have > ours:
        return matrix[:, :ours]
    out = np.zeros((len(matrix), ours), np.uint8)
    out[:, :have] = matrix
    return out


def _fit_blocks(rows: np.ndarray, h: int, acting: np.ndarray, ours: int) -> np.ndarray:
    n = len(rows)
    if n and (acting == acting[0]).all():
        b = int(acting[0])
        return np.ascontiguousarray(_fit(rows[:, h : h + b], ours))
    out = np.zeros((n, ours), np.uint8)
    for b in np.unique(acting):
        sel = acting == b
        out[sel] = _fit(rows[sel][:, h : h + int(b)], ours)
    return out


def _var_array(d: Data, values: list[Payload | None]) -> pa.Array:
    lengths = np.array([0 if v is None else len(v) for v in values], np.int64)
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(v for v in values if v is not None)
    absent = np.array([v is None for v in values], bool)
    validity = pa.array(~absent).buffers()[1] if absent.any() else None
    kind = pa.string() if d.string else pa.binary()
    out = pa.Array.from_buffers(
        kind, len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    if d.string:
        if (d.encoding or "").upper() not in ("US-ASCII", "ASCII", "UTF-8", "UTF8"):
            raw = pa.Array.from_buffers(
                pa.binary(), len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
            )
            return pa.array(
                [None if b is None else b.decode(d.encoding or "ascii") for b in raw.to_pylist()],
                pa.string(),
            )
        try:
            out.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise SbeDecodeError(
                f"var data {d.name!r} is not valid {d.encoding} text ({exc})", field=d.name
            ) from None
    return out


def _block_fields(block: Block, raw_enums: bool) -> list[pa.Field]:
    fields = [pa.field(f.name, arrow_type(f, raw_enums)) for f in block.fields]
    for g in block.groups:
        fields.append(pa.field(g.name, pa.list_(pa.struct(_block_fields(g, raw_enums)))))
    for d in block.data:
        fields.append(pa.field(d.name, pa.string() if d.string else pa.binary()))
    return fields


def load(schema: str | Schema, message: str | int, raw_enums: bool = False) -> MessageCodec:
    """The codec of ``message`` (name or template id) of ``schema`` (XML text, path or parsed)."""
    parsed = parse_schema(schema) if isinstance(schema, str) else schema
    return MessageCodec(parsed, parsed.message(message), raw_enums)


__all__ = ["MessageCodec", "OtherTemplateError", "load"]
