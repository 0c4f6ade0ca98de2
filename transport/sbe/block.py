"""Fixed blocks (a message's root block, a group's entries) to Arrow columns and back, many at a
time: ``n`` blocks are an ``(n, block_length)`` byte matrix viewed through a numpy structured dtype
with one entry per leaf at its offset, in the schema's byte order. No Python runs per block.

Type mapping (Spark has no unsigned integers, so unsigned types widen to the next signed one and
``uint64`` becomes ``decimal(20,0)``): see :func:`arrow_type`.
"""

from __future__ import annotations

from typing import SupportsInt, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aeron_spark.transport.sbe.errors import SbeDecodeError, SbeEncodeError
from aeron_spark.transport.sbe.schema import PRIMITIVES, Node

_ARROW = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.int16(),
    "uint16": pa.int32(),
    "uint32": pa.int64(),
    "uint64": pa.decimal128(20, 0),
    "float": pa.float32(),
    "double": pa.float64(),
}
_WIDE = {"uint8": np.int16, "uint16": np.int32, "uint32": np.int64}
_VECTOR_ENCODINGS = ("US-ASCII", "ASCII", "UTF-8", "UTF8")


def arrow_type(node: Node, raw_enums: bool = False) -> pa.DataType:
    if node.kind == "struct":
        return pa.struct([pa.field(c.name, arrow_type(c, raw_enums)) for c in node.children])
    if node.kind == "set":
        return pa.struct([pa.field(name, pa.bool_()) for name, _ in node.values])
    if node.kind == "enum":
        return _ARROW.get(node.primitive, pa.int16()) if raw_enums else pa.string()
    if node.primitive == "char":
        return pa.string()
    if node.length != 1:
        return pa.list_(_ARROW[node.primitive])
    return _ARROW[node.primitive]


def block_dtype(fields: tuple[Node, ...], block_length: int, order: str) -> np.dtype:
    """A structured dtype of the non-constant leaves (named ``f0``, ``f1``, ... in leaf order)."""
    names, formats, offsets = [], [], []
    for i, leaf in enumerate(_leaves(fields)):
        if leaf.constant:
            continue
        kind = PRIMITIVES[leaf.primitive][0]
        fmt = np.dtype(order + kind if kind[1] != "1" else kind)
        names.append(f"f{i}")
        formats.append((fmt, (leaf.length,)) if leaf.length != 1 else fmt)
        offsets.append(leaf.offset)
    return np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": max(block_length, 1)}
    )


def _leaves(fields: tuple[Node, ...]) -> list[Node]:
    return [leaf for f in fields for leaf in f.leaves()]


# --- decode --------------------------------------------------------------------------------------


class _BlockLayout:
    """One block layout: its fields, length, numpy dtype and each leaf field's column index."""

    def __init__(
        self, fields: tuple[Node, ...], block_length: int, order: str, raw_enums: bool = False
    ) -> None:
        self.fields = fields
        self.block_length = block_length
        self.dtype = block_dtype(fields, block_length, order)
        self.raw_enums = raw_enums
        self._index = {id(leaf): i for i, leaf in enumerate(_leaves(fields))}


class BlockDecoder(_BlockLayout):
    """Decodes ``(n, block_length)`` byte matrices of one block layout into Arrow columns."""

    def decode(
        self, matrix: np.ndarray, versions: np.ndarray, acting_lengths: np.ndarray
    ) -> list[pa.Array]:
        """``matrix``: C-contiguous uint8 of shape (n, block_length); ``versions`` and
        ``acting_lengths``: int arrays (n,) of each block's message version and encoded length."""
        n = len(matrix)
        if self.block_length == 0:
            view = np.zeros(n, self.dtype)
        else:
            view = matrix.reshape(-1).view(self.dtype)
        return [self._column(f, view, versions, acting_lengths, n) for f in self.fields]

    def _absent(self, node: Node, versions: np.ndarray, acting: np.ndarray) -> np.ndarray | None:
        """Rows where the node is newer than the message (sinceVersion) or past its block."""
        mask = None
        if node.since_version > 0:
            mask = versions < node.since_version
        if not node.constant and node.size:
            beyond = acting < node.offset + node.size
            mask = beyond if mask is None else (mask | beyond)
        if mask is not None and not mask.any():
            return None
        return mask

    def _column(
        self, node: Node, view: np.ndarray, versions: np.ndarray, acting: np.ndarray, n: int
    ) -> pa.Array:
        absent = self._absent(node, versions, acting)
        if node.kind == "struct":
            children = [self._column(c, view, versions, acting, n) for c in node.children]
            t = arrow_type(node, self.raw_enums)
            return pa.StructArray.from_arrays(
                children, fields=list(t), mask=None if absent is None else pa.array(absent)
            )
        if node.constant:
            value = node.const
            if node.kind == "scalar" and node.primitive != "char" and node.primitive != "uint64":
                if node.primitive not in ("float", "double"):
                    value = int(cast("SupportsInt | str", value))
            if node.kind == "enum" and self.raw_enums:
                value = dict(node.values)[str(value)]
            one = pa.array([value], arrow_type(node, self.raw_enums))
            out = one.take(pa.array(np.zeros(n, np.int32)))
            if absent is not None:
                out = pc.if_else(pa.array(absent), pa.nulls(n, out.type), out)
            return out
        raw = view[f"f{self._index[id(node)]}"]
        if node.kind == "set":
            bits = raw.astype(np.uint64)
            children = [
                pa.array(((bits >> np.uint64(bit)) & np.uint64(1)).astype(bool))
                for _, bit in node.values
            ]
            return pa.StructArray.from_arrays(
                children,
                names=[name for name, _ in node.values],
                mask=None if absent is None else pa.array(absent),
            )
        if node.kind == "enum":
            return self._enum(node, raw, absent)
        if node.primitive == "char":
            return self._chars(node, raw.reshape(n, node.length), absent)
        return self._numbers(node, raw, absent, n)

    def _numbers(self, node: Node, raw: np.ndarray, absent: np.ndarray | None, n: int) -> pa.Array:
        values = np.ascontiguousarray(raw)
        if not values.dtype.isnative:
            values = values.astype(values.dtype.newbyteorder("="))
        null = None
        if node.optional:
            if node.primitive in ("float", "double"):
                null = np.isnan(values) if np.isnan(node.null_value) else values == node.null_value
            else:
                null = values == values.dtype.type(node.null_value)
        if null is not None and node.length != 1:
            null = null.all(axis=1)  # an array is null when every element is the null value
        if absent is not None:
            null = absent if null is None else (null | absent)
        if null is not None and not null.any():
            null = None
        wide = _WIDE.get(node.primitive)
        if wide is not None:
            values = values.astype(wide)
        if node.length != 1:
            flat = pa.array(
                values.reshape(-1),
                _ARROW[node.primitive] if node.primitive != "uint64" else pa.uint64(),
            )
            if node.primitive == "uint64":
                flat = flat.cast(_ARROW["uint64"])
            offsets = pa.array(np.arange(0, (n + 1) * node.length, node.length, dtype=np.int32))
            return pa.ListArray.from_arrays(
                offsets, flat, mask=None if null is None else pa.array(null)
            )
        if node.primitive == "uint64":
            return pa.array(values, pa.uint64(), mask=null).cast(_ARROW["uint64"])
        return pa.array(values, _ARROW[node.primitive], mask=null)

    def _chars(self, node: Node, chars: np.ndarray, absent: np.ndarray | None) -> pa.Array:
        """Char arrays to strings, each up to its first NUL (vectorised for ASCII and UTF-8)."""
        n, width = chars.shape
        nul = chars == 0
        lengths = np.where(nul.any(axis=1), nul.argmax(axis=1), width).astype(np.int32)
        null = absent
        if node.optional:
            empty = lengths == 0  # the null value of char is 0: an all-NUL array is null
            null = empty if null is None else (null | empty)
        if null is not None and not null.any():
            null = None
        keep = np.arange(width)[None, :] < lengths[:, None]
        values = chars[keep]  # row-major: the strings one after another
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        validity = None if null is None else pa.array(~null).buffers()[1]
        if (node.encoding or "US-ASCII").upper() in _VECTOR_ENCODINGS:
            out = pa.Array.from_buffers(
                pa.string(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(values.tobytes())]
            )
            try:
                out.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise SbeDecodeError(
                    f"field {node.name!r} is not valid {node.encoding} text ({exc})",
                    field=node.name,
                ) from None
            return out
        binary = pa.Array.from_buffers(
            pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(values.tobytes())]
        )
        return pa.array(
            [None if b is None else b.decode(node.encoding or "ascii") for b in binary.to_pylist()],
            pa.string(),
        )

    def _enum(self, node: Node, raw: np.ndarray, absent: np.ndarray | None) -> pa.Array:
        values = np.ascontiguousarray(raw)
        if not values.dtype.isnative:
            values = values.astype(values.dtype.newbyteorder("="))
        null = values == values.dtype.type(node.null_value)
        if absent is not None:
            null |= absent
        if self.raw_enums:
            wide = _WIDE.get(node.primitive)
            out = values.astype(wide) if wide is not None else values
            return pa.array(out, arrow_type(node, True), mask=null if null.any() else None)
        known = np.array([v for _, v in node.values], dtype=np.int64)
        order = np.argsort(known, kind="stable")
        known_sorted = known[order]
        names = pa.array([node.values[i][0] for i in order], pa.string())
        as64 = values.astype(np.int64)
        index = np.searchsorted(known_sorted, as64)
        index = np.minimum(index, max(len(known) - 1, 0))
        # A value this schema does not know (a newer schema's) reads as null.
        unknown = known_sorted[index] != as64 if len(known) else np.ones(len(values), bool)
        null = null | unknown
        return names.take(pa.array(index.astype(np.int32), mask=null))


# --- encode --------------------------------------------------------------------------------------


class BlockEncoder(_BlockLayout):
    """Fills ``(n, block_length)`` byte matrices from Arrow columns, checking every value fits."""

    def encode(
        self,
        columns: dict[str, pa.Array | None],
        n: int,
        path: str = "",
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """``columns``: field name -> values (None: the column is absent). ``rows`` maps each
        value to the row it belongs to (for errors), default ``range(n)``. Returns the matrix."""
        out = np.zeros(n, self.dtype)
        for node in self.fields:
            self._fill(out, node, columns.get(node.name), n, path + node.name, rows)
        return out.view(np.uint8).reshape(n, self.dtype.itemsize)[:, : self.block_length]

    def _fill(
        self,
        out: np.ndarray,
        node: Node,
        arr: pa.Array | None,
        n: int,
        path: str,
        rows: np.ndarray | None,
    ) -> None:
        if node.constant:
            return
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if node.kind == "struct":
            fields = {}
            if arr is not None:
                if not pa.types.is_struct(arr.type):
                    raise _error(path, None, rows, f"a struct column, not {arr.type}")
                fields = dict(zip([f.name for f in arr.type], arr.flatten(), strict=True))
                if arr.null_count and not _nullable(node):
                    raise _error(
                        path,
                        _first(arr.is_null()),
                        rows,
                        "a value (the field is required, it has no null)",
                    )
            for c in node.children:
                self._fill(out, c, fields.get(c.name), n, f"{path}.{c.name}", rows)
            return
        name = f"f{self._index[id(node)]}"
        if arr is None:
            if node.kind == "set" or not node.optional:
                if node.kind == "set" or node.since_version > 0:
                    return  # no bits / a newer field left at zero is what a v0 writer would do
                raise _error(path, None, rows, "a column (the field is required)")
            out[name] = _null_fill(node)
            return
        if node.kind == "set":
            if not pa.types.is_struct(arr.type):
                raise _error(path, None, rows, f"a struct of booleans, not {arr.type}")
            bits = np.zeros(n, np.uint64)
            by_name = dict(zip([f.name for f in arr.type], arr.flatten(), strict=True))
            for choice, bit in node.values:
                flag = by_name.get(choice)
                if flag is not None:
                    set_bits = pc.fill_null(flag, False).to_numpy(zero_copy_only=False)
                    bits |= set_bits.astype(np.uint64) << np.uint64(bit)
            out[name] = bits
            return
        null = _null_mask(arr)
        if null is not None and not _nullable(node):
            raise _error(
                path, _first(null), rows, "a value (the field is required, it has no null)"
            )
        if node.kind == "enum":
            values = self._enum_values(node, arr, path, rows)
        elif node.primitive == "char":
            out[name] = self._chars(node, arr, n, path, rows).reshape(out[name].shape)
            return
        elif node.length != 1:
            values = self._array_values(node, arr, n, path, rows)
        else:
            values = _numbers(node, arr, path, rows)
        if null is not None:
            fill = node.null_value
            if node.length != 1:
                values[null] = fill
            else:
                values = np.where(
                    null, values.dtype.type(fill) if not np.isnan(fill) else fill, values
                )
        out[name] = values

    def _enum_values(
        self, node: Node, arr: pa.Array, path: str, rows: np.ndarray | None
    ) -> np.ndarray:
        prim = np.dtype(PRIMITIVES[node.primitive][0])
        if self.raw_enums or pa.types.is_integer(arr.type):
            values = pc.fill_null(arr.cast(pa.int64()), int(node.null_value)).to_numpy()
            allowed = np.array([v for _, v in node.values] + [node.null_value], np.int64)
            bad = ~np.isin(values, allowed)
            if bad.any():
                raise _error(path, _first(bad), rows, f"one of {_names(node)} as raw values")
            return values.astype(prim)
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            raise _error(path, None, rows, f"a string column of enum names, not {arr.type}")
        names = pa.array([name for name, _ in node.values], pa.string())
        index = pc.index_in(arr, value_set=names)
        missing = pc.and_(index.is_null(), arr.is_valid()).to_numpy(zero_copy_only=False)
        if missing.any():
            row = _first(missing)
            raise _error(path, row, rows, f"one of {_names(node)}, not {arr[int(row)].as_py()!r}")
        known = np.array([v for _, v in node.values] + [node.null_value], np.int64)
        idx = pc.fill_null(index, len(node.values)).to_numpy(zero_copy_only=False)
        return known[idx].astype(prim)

    def _chars(
        self, node: Node, arr: pa.Array, n: int, path: str, rows: np.ndarray | None
    ) -> np.ndarray:
        width = node.length
        encoding = (node.encoding or "US-ASCII").upper()
        if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):
            raise _error(path, None, rows, f"a string column, not {arr.type}")
        if encoding not in _VECTOR_ENCODINGS:
            arr = pa.array(
                [None if s is None else s.encode(node.encoding) for s in arr.to_pylist()],
                pa.binary(),
            )
        binary = arr.cast(pa.binary())
        offsets = np.frombuffer(binary.buffers()[1], np.int32)[
            binary.offset : binary.offset + n + 1
        ]
        data = binary.buffers()[2]
        values = (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))[
            offsets[0] : offsets[-1]
        ]
        lengths = np.diff(offsets)
        too_long = lengths > width
        if too_long.any():
            row = _first(too_long)
            raise _error(
                path,
                row,
                rows,
                f"at most {width} bytes of {node.encoding}, not {int(lengths[row])}",
            )
        if encoding in ("US-ASCII", "ASCII") and len(values) and values.max() > 0x7F:
            owner = np.repeat(np.arange(n), lengths)
            raise _error(path, int(owner[np.argmax(values > 0x7F)]), rows, "US-ASCII text")
        if node.optional is False and len(values) and not values.all():
            pass  # an embedded NUL ends the string early; allowed, as SbeTool allows it
        if not len(values):
            return np.zeros((n, width), np.uint8)
        # gather each row's first `width` bytes, zero past its length (no Python per row)
        index = (offsets[:-1, None] - offsets[0]) + np.arange(width, dtype=np.int32)[None, :]
        inside = np.arange(width)[None, :] < lengths[:, None]
        np.minimum(index, len(values) - 1, out=index)
        return np.where(inside, values[index], np.uint8(0))

    def _array_values(
        self, node: Node, arr: pa.Array, n: int, path: str, rows: np.ndarray | None
    ) -> np.ndarray:
        if not pa.types.is_list(arr.type) and not pa.types.is_fixed_size_list(arr.type):
            raise _error(path, None, rows, f"an array column of {node.length}, not {arr.type}")
        lengths = pc.fill_null(pc.list_value_length(arr), node.length).to_numpy()
        wrong = lengths != node.length
        if wrong.any():
            row = _first(wrong)
            raise _error(
                path,
                row,
                rows,
                f"an array of exactly {node.length} elements, not {int(lengths[row])}",
            )
        flat = pc.list_flatten(pc.fill_null(arr, pa.scalar([0] * node.length, arr.type)))
        if flat.null_count:
            raise _error(path, None, rows, "arrays without null elements")
        values = _numbers(node, flat, path, None)
        return values.reshape(n, node.length)


def _nullable(node: Node) -> bool:
    if node.kind == "struct":
        return all(_nullable(c) for c in node.children)
    # a required enum holding its null value reads as null (as Java's NULL_VAL): write it back
    return node.optional or node.constant or node.kind in ("set", "enum")


def _null_fill(node: Node) -> object:
    return node.null_value


def _null_mask(arr: pa.Array) -> np.ndarray | None:
    if not arr.null_count:
        return None
    return arr.is_null().to_numpy(zero_copy_only=False)


def _first(mask: np.ndarray | pa.Array) -> int:
    if isinstance(mask, pa.Array | pa.ChunkedArray):
        mask = mask.to_numpy(zero_copy_only=False)
    return int(np.argmax(mask))


def _names(node: Node) -> str:
    return ", ".join(name for name, _ in node.values)


def _error(path: str, index: int | None, rows: np.ndarray | None, expected: str) -> SbeEncodeError:
    row = None if index is None else (int(rows[index]) if rows is not None else index)
    where = f"column {path!r}" + (f", row {row}" if row is not None else "")
    return SbeEncodeError(f"{where}: expected {expected}", column=path, row=row)


def _numbers(node: Node, arr: pa.Array, path: str, rows: np.ndarray | None) -> np.ndarray:
    """Values of a numeric column as the field's numpy type, range-checked (nulls read as 0)."""
    prim = node.primitive
    kind = PRIMITIVES[prim][0]
    target = np.dtype(kind)
    if prim in ("float", "double"):
        if not (
            pa.types.is_floating(arr.type)
            or pa.types.is_integer(arr.type)
            or pa.types.is_decimal(arr.type)
        ):
            raise _error(path, None, rows, f"a number, not {arr.type}")
        values = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        if prim == "float":
            finite = np.isfinite(values)
            big = finite & (np.abs(values) > np.finfo(np.float32).max)
            if big.any():
                raise _error(path, _first(big), rows, "a value a float (32-bit) can hold")
        return values.astype(target)
    if pa.types.is_floating(arr.type):
        raise _error(path, None, rows, f"an integer column, not {arr.type} (cast it)")
    if not (pa.types.is_integer(arr.type) or pa.types.is_decimal(arr.type)):
        raise _error(path, None, rows, f"an integer column, not {arr.type}")
    low, high = int(node.min_value), int(node.max_value)
    if prim == "uint64":
        try:
            values = pc.fill_null(arr.cast(pa.uint64()), 0).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, OverflowError):
            bad = [
                i
                for i, v in enumerate(arr.to_pylist())
                if v is not None and not 0 <= int(v) < 2**64
            ]
            raise _error(
                path, bad[0] if bad else None, rows, f"an integer from {low} to {high}"
            ) from None
        bad_mask = (values > np.uint64(high)) & arr.is_valid().to_numpy(zero_copy_only=False)
        if bad_mask.any():
            raise _error(path, _first(bad_mask), rows, f"an integer from {low} to {high}")
        return values
    try:
        values = pc.fill_null(arr.cast(pa.int64()), low).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, OverflowError):
        bad = [
            i for i, v in enumerate(arr.to_pylist()) if v is not None and not low <= int(v) <= high
        ]
        raise _error(
            path, bad[0] if bad else None, rows, f"an integer from {low} to {high}"
        ) from None
    bad_mask = (values < low) | (values > high)
    if bad_mask.any():
        raise _error(path, _first(bad_mask), rows, f"an integer from {low} to {high}")
    return values.astype(target)


__all__ = ["BlockDecoder", "BlockEncoder", "arrow_type", "block_dtype"]
