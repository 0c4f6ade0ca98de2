"""The public surface other layers code against stays put (names and call shapes)."""

from __future__ import annotations

import inspect

import aeron_spark.transport as transport
from aeron_spark.transport import Driver, Image, Publication, Subscription
from aeron_spark.transport.api import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
)


def test_exported_names() -> None:
    expected = {
        "Driver",
        "DriverConfig",
        "Publication",
        "Subscription",
        "Image",
        "Header",
        "FragmentAssembler",
        "BufferClaim",
        "ControlledAction",
        "Counters",
        "read_counters",
        "NOT_CONNECTED",
        "BACK_PRESSURED",
        "ADMIN_ACTION",
        "CLOSED",
        "MAX_POSITION_EXCEEDED",
        "TransportError",
        "RemoteProtocolError",
        "ClosedError",
        "NotConnectedError",
        "BackPressuredError",
        "ChannelError",
    }
    assert expected <= set(transport.__all__)
    for name in transport.__all__:
        assert hasattr(transport, name), name


def test_result_codes_are_aerons() -> None:
    assert (NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED) == (
        -1,
        -2,
        -3,
        -4,
        -5,
    )


def test_call_shapes() -> None:
    def params(fn: object) -> list[str]:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]

    assert params(Driver.add_publication) == ["self", "channel", "stream_id", "exclusive"]
    assert params(Driver.add_subscription) == [
        "self",
        "channel",
        "stream_id",
        "on_available_image",
        "on_unavailable_image",
        "admit_source",  # keyword-only: the ingest channel's source filter (issue 28 item 7)
    ]
    # poll (optional, last): the stream server's invoker-mode step that only sends what it
    # offered (issue 31); a caller of do_work(now_ns) is unchanged
    assert params(Driver.do_work) == ["self", "now_ns", "poll"]
    assert params(Publication.offer) == ["self", "payload", "reserved_value"]
    assert params(Publication.offer_blocking) == ["self", "payload", "reserved_value", "timeout_s"]
    assert params(Publication.try_claim) == ["self", "length", "reserved_value"]
    assert params(Publication.wait_until_connected) == ["self", "timeout_s"]
    assert params(Subscription.poll) == ["self", "handler", "fragment_limit"]
    assert params(Subscription.controlled_poll) == ["self", "handler", "fragment_limit"]
    assert params(Subscription.wait) == ["self", "timeout_s"]
    assert params(Image.block_poll) == ["self", "handler", "block_length_limit"]
    for name in ("position", "position_limit", "is_connected", "is_closed", "local_endpoints"):
        assert isinstance(inspect.getattr_static(Publication, name), property), name
    for name in ("images", "is_connected"):
        assert isinstance(inspect.getattr_static(Subscription, name), property), name
    for name in ("position", "is_closed", "is_end_of_stream"):
        assert isinstance(inspect.getattr_static(Image, name), property), name
