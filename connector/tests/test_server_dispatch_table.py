"""The server's dispatch table against the control protocol's schemas (issue 18), and the one
permission column that the dispatch, the read-only refusal and the per-client check read
(issues 18/19)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping

from aeron_spark.connector.server import authz
from aeron_spark.connector.server.core import HANDLERS, WRITE_OPS, ServerCore
from aeron_spark.connector.session import protocol as proto


def test_every_operation_with_a_schema_has_exactly_one_handler_and_a_permission() -> None:
    assert set(HANDLERS) == set(proto.OPS) == set(proto.PERMISSIONS)
    for op, (handler, access) in HANDLERS.items():
        assert handler is getattr(ServerCore, f"_op_{op}")
        assert access is proto.PERMISSIONS[op]
        assert isinstance(access, proto.Access)
        assert isinstance(access.permission, proto.Permission)
    handlers = {name[4:] for name in vars(ServerCore) if name.startswith("_op_")}
    assert handlers == set(proto.OPS)


def test_a_read_only_server_refuses_what_it_refused_before_the_table() -> None:
    assert WRITE_OPS == {
        "publish",
        "stage",
        "local_stage",
        "local_stage_done",
        "commit",
        "abort",
        "purge",
        "consumer_forget",
    }
    admin = {op for op, (_, a) in HANDLERS.items() if a.permission is proto.Permission.ADMIN}
    assert admin == {"purge", "consumer_forget"}


def _dict_literal(tree: ast.Module, name: str) -> ast.Dict:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name:
            assert isinstance(node.value, ast.Dict), f"{name} is not written as one dict literal"
            return node.value
    raise AssertionError(f"no {name} in the module")


def test_every_operation_has_exactly_one_entry_in_the_protocols_permission_column() -> None:
    """A dict literal silently keeps the last of two entries of one key: read the source."""
    tree = ast.parse(inspect.getsource(proto))
    keys = [k.value for k in _dict_literal(tree, "PERMISSIONS").keys if isinstance(k, ast.Constant)]
    assert len(keys) == len(_dict_literal(tree, "PERMISSIONS").keys)  # no ** merges
    assert sorted(keys) == sorted(set(keys)) == sorted(proto.OPS)
    # a read-only server serves what needs nothing or reads, and the one write that changes
    # nothing (the sink asking which batch it committed last); never an admin operation
    assert {
        op
        for op, a in proto.PERMISSIONS.items()
        if a.read_only_serves and a.permission is proto.Permission.WRITE
    } == {"last_committed_batch"}


def test_authz_derives_its_permissions_and_has_no_table_of_its_own() -> None:
    derived = {
        op: None if a.permission is proto.Permission.NONE else a.permission.value
        for op, a in proto.PERMISSIONS.items()
    }
    assert authz.OP_PERMISSION == derived
    # no mapping of operations in the module but the derived one
    for name, value in vars(authz).items():
        if isinstance(value, Mapping) and set(value) & set(proto.OPS):
            assert value is authz.OP_PERMISSION or value is proto.PERMISSIONS, name
    # and no dict literal in its source keyed by an operation (an override, however spelled)
    for node in ast.walk(ast.parse(inspect.getsource(authz))):
        if isinstance(node, ast.Dict):
            named = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            assert not named & set(proto.OPS), f"authz lists operations itself: {named}"
    # what the column says, the check does: NONE needs no grant at all, the rest a grant
    for op, access in proto.PERMISSIONS.items():
        assert authz.allowed(None, op) is (access.permission is proto.Permission.NONE)
