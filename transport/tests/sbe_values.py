"""Test helpers for the SBE engine: hypothesis strategies of rows for any message layout, the
golden harness's token form of a row, and comparisons (used by the test_sbe_* files)."""

from __future__ import annotations

import decimal
import math
import struct
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from aeron_spark.transport.sbe.schema import PRIMITIVES, Block, Node

DATA = Path(__file__).with_name("data") / "sbe"
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


def node_strategy(node: Node) -> st.SearchStrategy:
    if node.constant:
        if node.kind == "scalar" and node.primitive != "char":
            return st.just(
                int(node.const) if node.primitive not in ("float", "double") else float(node.const)
            )
        return st.just(node.const)
    if node.kind == "struct":
        return st.fixed_dictionaries({c.name: node_strategy(c) for c in node.children})
    if node.kind == "set":
        return st.fixed_dictionaries({name: st.booleans() for name, _ in node.values})
    if node.kind == "enum":  # null in required enums too: Java writes NULL_VAL there
        return st.none() | st.sampled_from([name for name, _ in node.values])
    if node.primitive == "char":
        s = st.text(PRINTABLE, min_size=1 if node.optional else 0, max_size=node.length)
    else:
        s = _number(node)
        if node.length != 1:
            return st.lists(s, min_size=node.length, max_size=node.length)
    return st.none() | s if node.optional else s


def _number(node: Node) -> st.SearchStrategy:
    if node.primitive == "float":
        return st.floats(width=32, allow_nan=False)
    if node.primitive == "double":
        return st.floats(allow_nan=False)
    return st.integers(int(node.min_value), int(node.max_value))


def row_strategy(block: Block, max_entries: int = 3) -> st.SearchStrategy:
    parts: dict[str, st.SearchStrategy] = {f.name: node_strategy(f) for f in block.fields}
    for g in block.groups:
        parts[g.name] = st.lists(row_strategy(g, max_entries), max_size=max_entries)
    for d in block.data:
        parts[d.name] = (
            (st.text(PRINTABLE, max_size=40) if _ascii(d.encoding) else st.text(max_size=40))
            if d.string
            else st.binary(max_size=40)
        )
    return st.fixed_dictionaries(parts)


def _ascii(encoding: str | None) -> bool:
    return (encoding or "").upper() in ("US-ASCII", "ASCII")


def draw_rows(strategy: st.SearchStrategy, examples: int, per_example: int = 30) -> list[dict]:
    """Many hypothesis-generated rows, pooled (so one Java process can check them all)."""
    rows: list[dict] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(strategy, min_size=1, max_size=per_example))
    def collect(batch: list[dict]) -> None:
        rows.extend(batch)

    collect()
    return rows


# --- the harness's tokens ---------------------------------------------------------------------


def block_tokens(block: Block, row: dict | None) -> list[str]:
    row = row or {}
    out: list[str] = []
    for f in block.fields:
        out += node_tokens(f, row.get(f.name))
    for g in block.groups:
        entries = row.get(g.name) or []
        out.append(str(len(entries)))
        for e in entries:
            out += block_tokens(g, e)
    for d in block.data:
        value = row.get(d.name)
        raw = (
            b""
            if value is None
            else (value.encode(d.encoding) if isinstance(value, str) else bytes(value))
        )
        out.append("x" + raw.hex())
    return out


def node_tokens(node: Node, value: Any) -> list[str]:
    if node.constant:
        return []
    if node.kind == "struct":
        return [
            t
            for c in node.children
            for t in node_tokens(c, None if value is None else value.get(c.name))
        ]
    if node.kind == "set":
        return ["1" if value and value.get(name) else "0" for name, _ in node.values]
    if node.kind == "enum":
        return [str(int(node.null_value) if value is None else dict(node.values)[value])]
    if node.primitive == "char":
        return ["x" + ("" if value is None else value.encode(node.encoding or "ascii").hex())]
    if node.length != 1:
        return [_number_token(node, v) for v in (value or [None] * node.length)]
    return [_number_token(node, value)]


def _number_token(node: Node, value: Any) -> str:
    if node.primitive == "float":
        v = math.nan if value is None else value
        return str(struct.unpack("<I", struct.pack("<f", v))[0])
    if node.primitive == "double":
        v = math.nan if value is None else value
        return str(struct.unpack("<Q", struct.pack("<d", v))[0])
    return str(int(node.null_value) if value is None else int(value))


# --- comparisons --------------------------------------------------------------------------------


def normal(value: Any) -> Any:
    """Decoded values in the form the strategies generate (decimals as ints)."""
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return int(value)
    return value


def project(block: Block, row: dict) -> dict:
    """``row`` as a reader with layout ``block`` sees it (older: newer fields dropped; newer:
    fields it does not have are None)."""
    out: dict = {}
    for f in block.fields:
        out[f.name] = (
            _project_node(f, row.get(f.name))
            if f.name in row
            else (_project_node(f, None) if f.constant else None)
        )
    for g in block.groups:
        out[g.name] = None if g.name not in row else [project(g, e) for e in row[g.name]]
    for d in block.data:
        out[d.name] = row.get(d.name)
    return out


def _project_node(node: Node, value: Any) -> Any:
    if node.constant:
        return constant_value(node)
    return value


def constant_value(node: Node) -> Any:
    if node.kind == "scalar" and node.primitive != "char":
        return int(node.const) if node.primitive not in ("float", "double") else float(node.const)
    return node.const


def layout_size(primitive: str) -> int:
    return PRIMITIVES[primitive][1]


def random_rows(block: Block, n: int, seed: int, max_entries: int = 3) -> list[dict]:
    """``n`` rows of plain seeded random values over each field's whole range (bulk, fast),
    next to the hypothesis-drawn rows that probe the edges."""
    import random

    rng = random.Random(seed)
    return [_random_row(block, rng, max_entries) for _ in range(n)]


def _random_row(block: Block, rng: Any, max_entries: int) -> dict:
    row = {f.name: _random_node(f, rng) for f in block.fields}
    for g in block.groups:
        row[g.name] = [_random_row(g, rng, max_entries) for _ in range(rng.randint(0, max_entries))]
    for d in block.data:
        size = rng.randint(0, 30)
        row[d.name] = (
            "".join(
                chr(
                    rng.randint(32, 126)
                    if _ascii(d.encoding)
                    else rng.choice((rng.randint(32, 126), rng.randint(0xA0, 0x2FFF)))
                )
                for _ in range(size)
            )
            if d.string
            else rng.randbytes(size)
        )
    return row


def _random_node(node: Node, rng: Any) -> Any:
    if node.constant:
        return constant_value(node)
    if node.kind == "struct":
        return {c.name: _random_node(c, rng) for c in node.children}
    if node.kind == "set":
        return {name: rng.random() < 0.5 for name, _ in node.values}
    if (node.optional or node.kind == "enum") and rng.random() < 0.2:
        return None
    if node.kind == "enum":
        return rng.choice(node.values)[0]
    if node.primitive == "char":
        return "".join(
            rng.choice(PRINTABLE) for _ in range(rng.randint(int(node.optional), node.length))
        )
    if node.length != 1:
        return [_random_number(node, rng) for _ in range(node.length)]
    return _random_number(node, rng)


def _random_number(node: Node, rng: Any) -> Any:
    if node.primitive == "float":
        return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e30, 1e30)))[0]
    if node.primitive == "double":
        return rng.uniform(-1e300, 1e300)
    return rng.randint(int(node.min_value), int(node.max_value))
