"""The package's import graph: no cycles, no import from a higher layer, no production import of
a ``testing`` module (issue 18). Built with ``ast`` from every module of the package, counting
function-local imports too, so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Folder -> import name, as pyproject's package-dir maps them.
PACKAGE_DIRS = {
    "src/aeron_spark": "aeron_spark",
    "transport": "aeron_spark.transport",
    "handshake": "aeron_spark.handshake",
    "connector": "aeron_spark.connector",
    "connector/pyspark_aeron": "pyspark_aeron",
}
# transport < handshake < connector < entry points; the root's vocabulary sits below them all.
LAYERS = [
    ("root", ("aeron_spark", "aeron_spark.errors", "aeron_spark.counters")),
    ("transport", ("aeron_spark.transport",)),
    ("handshake", ("aeron_spark.handshake",)),
    ("connector", ("aeron_spark.connector",)),
    ("entry", ("aeron_spark.cli", "aeron_spark.demo", "pyspark_aeron")),
]
# Inside the connector: what each part may import of the connector (besides lower layers).
SESSION = "aeron_spark.connector.session"
CONNECTOR_RULES = {
    # part: (prefixes it must never import)
    SESSION: (
        "aeron_spark.connector.client",
        "aeron_spark.connector.server",
        "aeron_spark.connector.local",
        "aeron_spark.connector.formats",
        "aeron_spark.connector.options",
        "aeron_spark.connector.source",
        "aeron_spark.connector.sink",
        "aeron_spark.connector.stores",
    ),
    # the log stores implement the contract the source and the sink are written over (issue
    # 29): they never reach up into the reader, the writer or the data source
    "aeron_spark.connector.stores": (
        "aeron_spark.connector.source",
        "aeron_spark.connector.sink",
        "aeron_spark.connector.datasource",
        "aeron_spark.connector.raw",
    ),
    "aeron_spark.connector.client": ("aeron_spark.connector.server",),
    "aeron_spark.connector.local": ("aeron_spark.connector.server", "aeron_spark.connector.client"),
    "aeron_spark.connector.server": ("aeron_spark.connector.client", "aeron_spark.connector.local"),
    "aeron_spark.connector.formats": (
        "aeron_spark.connector.client",
        "aeron_spark.connector.server",
        "aeron_spark.connector.local",
        "aeron_spark.connector.options",
    ),
    "aeron_spark.connector.options": (
        "aeron_spark.connector.client",
        "aeron_spark.connector.server",
        "aeron_spark.connector.local",
    ),
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, name in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            folders = [base.joinpath(*rel.parts[: i + 1]) for i in range(len(rel.parts) - 1)]
            if "tests" in rel.parts or not all((f / "__init__.py").exists() for f in folders):
                continue
            if rel.parts[0] == "pyspark_aeron" and name != "pyspark_aeron":
                continue  # its own package
            parts = [*rel.parts[:-1], path.stem]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([name, *parts])] = path
    return out


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(name: str) -> str | None:
    """The module of ours ``name`` is (or is in), else None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> list[tuple[str, int, bool]]:
    """(imported module of ours, line, function-local) for each import in ``module``."""
    if module not in _IMPORTS:
        _IMPORTS[module] = list(_scan(module))
    return _IMPORTS[module]


_IMPORTS: dict[str, list[tuple[str, int, bool]]] = {}


def _scan(module: str) -> Iterator[tuple[str, int, bool]]:
    """The imports of ours in ``module``, in ``ast.walk`` order; one breadth-first walk that
    carries down whether a node is under an ``if TYPE_CHECKING`` (either branch: skipped) and
    whether it is inside a function (function-local)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    todo: deque[tuple[ast.AST, bool, bool]] = deque([(tree, False, False)])
    while todo:
        node, type_checking, local = todo.popleft()
        if not type_checking:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _known(alias.name)
                    if target is not None:
                        yield target, node.lineno, local
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(module, node)
                for alias in node.names:
                    target = _known(f"{source}.{alias.name}") or _known(source)
                    if target is not None and target != module:
                        yield target, node.lineno, local
        below = (
            type_checking or isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test),
            local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef),
        )
        todo.extend((child, *below) for child in ast.iter_child_nodes(node))


GRAPH = {m: sorted({t for t, _, _ in imports_of(m)}) for m in MODULES}


def _layer(module: str) -> int:
    best, rank = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank >= 0, module
    return rank


def _is_testing(module: str) -> bool:
    return any(part.startswith("testing") for part in module.split("."))


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_graph_covers_every_layer() -> None:
    assert len(MODULES) > 60
    for _, prefixes in LAYERS:
        assert any(_under(m, p) for m in MODULES for p in prefixes)
    assert "aeron_spark.connector.session.protocol" in GRAPH["aeron_spark.connector.client"]


def test_no_import_cycle() -> None:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in GRAPH[module]:
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_from_a_higher_layer() -> None:
    wrong = [
        f"{m}:{line} imports {t}"
        for m in MODULES
        if not _is_testing(m)
        for t, line, _ in imports_of(m)
        if _layer(t) > _layer(m)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("part", sorted(CONNECTOR_RULES))
def test_connector_parts_import_only_what_is_below_them(part: str) -> None:
    wrong = [
        f"{m}:{line} imports {t}"
        for m in MODULES
        if _under(m, part) and not _is_testing(m)
        for t, line, _ in imports_of(m)
        if any(_under(t, banned) for banned in CONNECTOR_RULES[part])
    ]
    assert not wrong, "\n".join(wrong)


def test_production_code_imports_no_testing_module() -> None:
    wrong = [
        f"{m}:{line} imports {t}"
        for m in MODULES
        if not _is_testing(m)
        for t, line, _ in imports_of(m)
        if _is_testing(t)
    ]
    assert not wrong, "\n".join(wrong)


def test_function_local_imports_of_our_modules_are_only_the_entry_points_lazy_ones() -> None:
    """A lazy import is allowed only where it keeps a command's start fast (the CLI, the demo,
    the server package's ``StreamServer``) or a Spark worker's modules few (the data source,
    the reader, its options); anywhere else it is a cycle waiting to happen."""
    allowed = {
        "aeron_spark.cli",
        "aeron_spark.demo",
        "aeron_spark.connector.server",
        "aeron_spark.connector.server.cli",
        # what a Spark read task's Python worker imports (its function holds the data source,
        # its reader and options are pickled by reference): planning's and other formats'
        # modules are imported where used, issue 31 item 2
        "aeron_spark.connector.datasource",
        "aeron_spark.connector.source",
        "aeron_spark.connector.options",
    }
    wrong = [
        f"{m}:{line} imports {t} inside a function"
        for m in MODULES
        if m not in allowed and not _is_testing(m)
        for t, line, is_local in imports_of(m)
        if is_local
    ]
    assert not wrong, "\n".join(wrong)


ARROW_FREE = (SESSION, "aeron_spark.connector.server")  # the server stages lists, never Arrow


def _names_imported(module: str) -> Iterator[tuple[str, int]]:
    """Every module name ``module`` imports, ours or not, TYPE_CHECKING blocks included."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            yield from ((f"{source}.{alias.name}", node.lineno) for alias in node.names)


def test_the_server_and_the_session_layer_name_no_arrow_type_even_for_type_checking() -> None:
    """The sink's payload runs reach the session layer's ``records`` as the
    ``PayloadBuffers`` protocol, not as an import of ``connector.runs`` (pyarrow)."""
    wrong = [
        f"{m}:{line} imports {name}"
        for m in MODULES
        if any(_under(m, p) for p in ARROW_FREE)
        for name, line in _names_imported(m)
        if any(_under(name, arrow) for arrow in ("aeron_spark.connector.runs", "pyarrow"))
    ]
    assert not wrong, "\n".join(wrong)


def test_importing_the_server_loads_no_pyarrow() -> None:
    code = (
        "import sys, aeron_spark.connector.server.server, aeron_spark.connector.server.cli, "
        "aeron_spark.connector.session.records; "
        "sys.exit(3 if [m for m in sys.modules if m.split('.')[0] == 'pyarrow'] else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
