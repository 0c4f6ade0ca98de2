"""One error vocabulary and one counter registry across the layers (issue 18, part 3)."""

from __future__ import annotations

import pickle

import pytest

from aeron_spark import errors as root
from aeron_spark.connector import errors as connector_errors
from aeron_spark.connector.client import ClientCounters
from aeron_spark.connector.server import counters as server_counters
from aeron_spark.counters import REGISTRY, CounterMap, CounterType
from aeron_spark.handshake import errors as handshake_errors
from aeron_spark.handshake.client_counters import HandshakeClientCounters
from aeron_spark.handshake.crypto import SealCounters
from aeron_spark.handshake.machine import ServerCounters
from aeron_spark.transport import errors as transport_errors
from aeron_spark.transport.archive import errors as archive_errors
from aeron_spark.transport.counters import SystemCounters


def test_each_layer_subclasses_the_one_local_and_remote_protocol_error() -> None:
    for layer, base in (
        (transport_errors, transport_errors.TransportError),
        (handshake_errors, handshake_errors.HandshakeError),
    ):
        assert issubclass(layer.LocalProtocolError, root.LocalProtocolError)
        assert issubclass(layer.LocalProtocolError, base)
        assert issubclass(layer.RemoteProtocolError, root.RemoteProtocolError)
        assert issubclass(layer.RemoteProtocolError, base)
    assert issubclass(transport_errors.InvalidFrameError, root.RemoteProtocolError)
    assert issubclass(connector_errors.ControlProtocolError, root.RemoteProtocolError)
    with pytest.raises(root.RemoteProtocolError):
        raise handshake_errors.RemoteProtocolError("bad message")


@pytest.mark.parametrize(
    ("archive_cls", "connector_cls", "code"),
    [
        (archive_errors.UnknownRecordingError, connector_errors.UnknownRecordingError, 5),
        (archive_errors.PositionOutOfRangeError, connector_errors.PositionOutOfRangeError, 6),
        (archive_errors.NotFrameBoundaryError, connector_errors.NotFrameBoundaryError, 7),
        (archive_errors.PurgedError, connector_errors.PurgedError, 8),
    ],
)
def test_archive_errors_map_by_code_to_the_wire_class_that_is_also_theirs(
    archive_cls: type, connector_cls: type, code: int
) -> None:
    exc = archive_cls("at 64", position=64, purged_position=128)
    assert isinstance(exc.code, archive_errors.ArchiveErrorCode)
    wire = connector_errors.from_archive(exc)
    assert type(wire) is connector_cls
    assert isinstance(wire, archive_cls)  # one class per meaning: except archive.X catches it
    assert int(wire.code) == code and wire.details == exc.details and wire.message == "at 64"
    assert connector_errors.from_archive(wire) is wire
    again = connector_errors.error_from_wire(wire.to_wire())
    assert type(again) is connector_cls and again.position == 64
    assert type(pickle.loads(pickle.dumps(wire))) is connector_cls


def test_an_archive_error_without_a_wire_class_is_a_server_error() -> None:
    wire = connector_errors.from_archive(archive_errors.ArchiveError("disk says no", segment=3))
    assert type(wire) is connector_errors.ServerError and wire.segment == 3


def test_counter_sets_are_declared_in_one_registry_with_unique_ids() -> None:
    ids = [d.id for d in REGISTRY]
    assert len(ids) == len(set(ids))
    for cls, type_ in (
        (SystemCounters, CounterType.TRANSPORT),
        (ServerCounters, CounterType.HANDSHAKE),
        (SealCounters, CounterType.SEAL),
    ):
        assert cls.counter_type is type_
        assert [d.name for d in cls.descriptors] == [d.name for d in REGISTRY.of_type(type_)]
    # a stream client's counters and the process's handshake client counters, one family
    assert ClientCounters.counter_type is HandshakeClientCounters.counter_type is CounterType.CLIENT
    client_sets = (*HandshakeClientCounters.descriptors, *ClientCounters.descriptors)
    assert sorted(d.id for d in client_sets) == [d.id for d in REGISTRY.of_type(CounterType.CLIENT)]
    for name in (
        *server_counters.CORE_COUNTERS,
        *server_counters.SHELL_COUNTERS,
        *server_counters.SINK_COUNTERS,
    ):
        assert REGISTRY.is_declared(CounterType.SERVER, name)
    assert REGISTRY.snapshot(CounterType.TRANSPORT, SystemCounters(bytes_sent=7))["bytes_sent"] == 7


def test_a_counter_map_refuses_an_undeclared_name_and_shows_optional_ones_once_counted() -> None:
    counters = server_counters.core_counters()
    assert "accept_failures" not in counters
    counters.add("accept_failures")
    counters["requests"] += 2
    assert counters["accept_failures"] == 1 and counters["requests"] == 2
    with pytest.raises(KeyError, match="undeclared SERVER counter 'reqeusts'"):
        counters["reqeusts"] = 1
    assert isinstance(counters, CounterMap) and isinstance(counters, dict)
    # several at once (a publish's): all counted, or none when one name is undeclared
    counters.add_all({"messages_published": 3, "bytes_published": 300, "accept_failures": 1})
    assert (counters["messages_published"], counters["bytes_published"]) == (3, 300)
    assert counters["accept_failures"] == 2
    with pytest.raises(KeyError, match=r"undeclared SERVER counters \['bytes_publised'\]"):
        counters.add_all({"messages_published": 1, "bytes_publised": 100})
    assert counters["messages_published"] == 3 and "bytes_publised" not in counters
    with pytest.raises(KeyError):
        REGISTRY.snapshot(CounterType.SERVER, {"no_such_counter": 1})
