"""The server's dispatch table against the control protocol's schemas (issue 18)."""

from __future__ import annotations

from aeron_spark.connector.server.core import HANDLERS, WRITE_OPS, ServerCore
from aeron_spark.connector.session import protocol as proto


def test_every_operation_with_a_schema_has_exactly_one_handler_and_a_permission() -> None:
    assert set(HANDLERS) == set(proto.OPS) == set(proto.PERMISSIONS)
    for op, (handler, permission) in HANDLERS.items():
        assert handler is getattr(ServerCore, f"_op_{op}")
        assert permission is proto.PERMISSIONS[op]
        assert isinstance(permission, proto.Permission)
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
    admin = {op for op, (_, p) in HANDLERS.items() if p is proto.Permission.ADMIN}
    assert admin == {"purge", "consumer_forget"}
