"""Two boundaries the import graph cannot see (issue 29), checked with ``ast`` over every module of
the package (the modules ``test_import_graph`` walks; tests excluded):

* the Aeron wire format lives in one module, ``transport/protocol/frames.py`` (as Aeron C keeps it
  in ``aeron_udp_protocol.h``): no other module declares a frame header layout (a ``struct``
  format starting with the common header's ``i B B h``, or a numpy dtype with the data header's
  fields) or spells the DATA flags as literals (``0xC0``, or ``0x80`` / ``0x40`` / ``0x20`` used
  on something named flags);
* no module reads or writes another module's private names: ``obj._name`` where ``obj`` is not
  ``self`` / ``cls`` / ``super()`` and ``_name`` is nothing the module itself defines (a function,
  class, module or class name, an argument, a ``self._name`` attribute or a ``__slots__`` entry),
  and ``from module import _name``. The few exceptions are listed below, each with its reason.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

from connector.tests.test_import_graph import MODULES, ROOT

WIRE_FORMAT_MODULE = "aeron_spark.transport.protocol.frames"

# A struct format that starts with the common frame header (frame_length i32, version u8, flags
# u8, type i16), whole or from the version on: a frame layout.
_FRAME_LAYOUT = re.compile(r"^[<=]?\s*(i\s*)?B\s*B\s*[hH]")  # Aeron's is little-endian
_STRUCT_CALLS = {"Struct", "pack", "pack_into", "unpack", "unpack_from", "iter_unpack", "calcsize"}
_DATA_HEADER_FIELDS = {"term_offset", "session_id", "stream_id", "term_id", "reserved_value"}
_DATA_FLAGS = {0x80, 0x40, 0x20, 0xC0}

# Known cases in files other engineers are rewriting this session (issue 29's other items), as
# "file: finding" without the line; each names the branch that owns the file. The lead removes an
# entry once that branch lands without it (the test fails on an entry that is no longer found).
KNOWN_WIRE_FORMAT: dict[str, str] = {}
KNOWN_PRIVATE: dict[str, str] = {}

# Private names of other libraries that are their public API, or that they give no public name
# for. Every entry says why.
ALLOWED_PRIVATE: dict[str, str] = {
    "_asdict": "collections.namedtuple's documented API (underscored not to clash with fields)",
    "_replace": "collections.namedtuple's documented API",
    "_fields": "collections.namedtuple's documented API",
    "_getframe": "sys._getframe: CPython's documented way to read a caller's frame",
    "_ArgumentGroup": "argparse gives the type add_argument_group() returns no public name",
}


def _rel(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _mentions_flags(node: ast.AST) -> bool:
    return "flag" in ast.unparse(node).lower()


def wire_format_declarations(module: str) -> Iterator[str]:
    """Where ``module`` declares a frame layout or spells DATA flags itself."""
    source = MODULES[module].read_text()
    tree = _tree(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in _STRUCT_CALLS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str | bytes):
                fmt = first.value if isinstance(first.value, str) else first.value.decode()
                if _FRAME_LAYOUT.match(fmt):
                    yield f"{node.lineno}: struct layout {fmt!r} (a frame header)"
        if isinstance(node, ast.Call) and _call_name(node) == "dtype" and node.args:
            first = node.args[0]
            if isinstance(first, ast.List | ast.Tuple):
                names = {
                    e.elts[0].value
                    for e in first.elts
                    if isinstance(e, ast.Tuple)
                    and e.elts
                    and isinstance(e.elts[0], ast.Constant)
                    and isinstance(e.elts[0].value, str)
                }
                if len(names & _DATA_HEADER_FIELDS) >= 2:
                    yield f"{node.lineno}: numpy dtype with the data header's fields"
        if isinstance(node, ast.Constant) and node.value == 0xC0 and type(node.value) is int:
            text = ast.get_source_segment(source, node) or ""
            if text.lower() == "0xc0":
                yield f"{node.lineno}: the literal 0xC0 (DataFlags.UNFRAGMENTED)"
        flag_literals: list[ast.AST] = []
        if isinstance(node, ast.BinOp | ast.Compare):
            operands = (
                [node.left, node.right]
                if isinstance(node, ast.BinOp)
                else [node.left, *node.comparators]
            )
            flag_literals = [o for o in operands if _is_flag_literal(o)]
            others = [o for o in operands if not _is_flag_literal(o)]
            if flag_literals and not any(_mentions_flags(o) for o in others):
                flag_literals = []
        elif isinstance(node, ast.Assign):
            flag_literals = [v for v in ast.walk(node.value) if _is_flag_literal(v)]
            if flag_literals and not any(_mentions_flags(t) for t in node.targets):
                flag_literals = []
        for literal in flag_literals:
            assert isinstance(literal, ast.Constant)
            yield f"{literal.lineno}: flag literal {literal.value:#x} (use frames.DataFlags)"


def _is_flag_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value in _DATA_FLAGS


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_names(tree: ast.Module) -> set[str]:
    """The names a module defines itself (so ``other._x`` of one of its own classes is fine)."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            own.update(
                c.value
                for c in ast.walk(node.value)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
    return own


def private_accesses(module: str) -> Iterator[str]:
    """Where ``module`` reaches into another module's private names."""
    tree = _tree(module)
    own = _own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "super"
            ):
                continue
            if node.attr in own or node.attr in ALLOWED_PRIVATE:
                continue
            yield f"{node.lineno}: {ast.unparse(node)}"
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _is_private(alias.name) and alias.name not in ALLOWED_PRIVATE:
                    yield f"{node.lineno}: from {node.module} import {alias.name}"


def _findings(check, known: dict[str, str]) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    """(findings not known, known entries no longer found)."""
    found: list[str] = []
    seen: set[str] = set()
    for module in sorted(MODULES):
        rel = _rel(module)
        for hit in check(module):
            line, _, what = hit.partition(": ")
            key = f"{rel}: {what}"
            if key in known:
                seen.add(key)
            else:
                found.append(f"{rel}:{line}: {what}")
    return found, sorted(set(known) - seen)


def test_only_the_wire_format_module_declares_frame_layouts_and_flags() -> None:
    found, clean = _findings(
        lambda m: [] if m == WIRE_FORMAT_MODULE else wire_format_declarations(m),
        KNOWN_WIRE_FORMAT,
    )
    assert not found, "declare these in transport/protocol/frames.py:\n" + "\n".join(found)
    assert not clean, f"no longer needed in KNOWN_WIRE_FORMAT: {clean}"


def test_no_module_reads_another_modules_private_names() -> None:
    found, clean = _findings(private_accesses, KNOWN_PRIVATE)
    assert not found, "give the owner a public name for:\n" + "\n".join(found)
    assert not clean, f"no longer needed in KNOWN_PRIVATE: {clean}"


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """Each check finds a planted case (so a broken walk cannot pass by finding nothing)."""
    planted = textwrap.dedent(
        """
        import struct
        import numpy as np
        from somewhere import _hidden
        H = struct.Struct("<iBBhiiiiq")
        T = struct.Struct("<BBhiiiiq")
        D = np.dtype([("length", "<i4"), ("term_offset", "<i4"), ("session_id", "<i4")])
        WHOLE = 0xC0
        def f(header, driver):
            if header.flags & 0x80:
                driver._wake()
        """
    )
    path = tmp_path / "planted.py"
    path.write_text(planted)
    MODULES["planted"] = path
    try:
        wire = list(wire_format_declarations("planted"))
        private = list(private_accesses("planted"))
    finally:
        del MODULES["planted"]
    assert len(wire) == 5, wire
    assert len(private) == 2, private
