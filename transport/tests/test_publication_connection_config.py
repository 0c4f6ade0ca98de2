"""The publication connection timeout is a driver setting (Aeron's
``aeron.publication.connection.timeout``): ``DriverConfig(publication_connection_timeout_ns=...)``,
5 s by default, at least 2 s (twice the longest interval between an idle image's status
messages). Main had no such setting: every UDP publication lost a silent receiver after a fixed
5 s (``CONNECTION_TIMEOUT_NS``), and so did every test that waits for a killed peer to be seen
gone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.protocol.flow_control import CONNECTION_TIMEOUT_NS

DEADLINE_S = 60.0  # a loaded 2-core machine


@pytest.mark.parametrize("channel", ["unicast", "dynamic-mdc"])
def test_a_publication_whose_receiver_falls_silent_is_unconnected_after_the_configured_timeout(
    tmp_path: Path, channel: str
) -> None:
    timeout_ns = 2_000_000_000
    sending = DriverConfig(
        directory=tmp_path / "pub",
        publication_connection_timeout_ns=timeout_ns,
        write_counters_file=False,
    )
    # the receiver's driver runs only when this test steps it: it falls silent at will
    receiving = DriverConfig(
        threading_mode="invoker", directory=tmp_path / "sub", write_counters_file=False
    )
    with Driver(sending) as pub_driver, Driver(receiving) as sub_driver:
        if channel == "unicast":
            sub = sub_driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 7)
            port = sub.local_endpoints[0][1]
            pub = pub_driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 7)
        else:
            pub = pub_driver.add_publication(
                "aeron:udp?control=127.0.0.1:0|control-mode=dynamic", 7
            )
            control = pub.local_endpoints[0][1]
            sub_driver.add_subscription(
                f"aeron:udp?endpoint=127.0.0.1:0|control=127.0.0.1:{control}", 7
            )
        deadline = time.monotonic() + DEADLINE_S
        while not pub.is_connected:
            assert time.monotonic() < deadline, "never connected"
            if sub_driver.do_work() == 0:
                sub_driver.idle(0.005)
        state = pub.state  # the driver's setting reached the publication's receivers
        assert state.flow.connection_timeout_ns == timeout_ns
        assert state.dests.connection_timeout_ns == timeout_ns
        heard = pub.last_status_ns
        assert heard is not None
        # silent from here on (no status message): the publication is unconnected after it
        deadline = time.monotonic() + DEADLINE_S
        while pub.is_connected:
            assert time.monotonic() < deadline, "the silent receiver stayed connected"
            time.sleep(0.02)
        assert time.monotonic_ns() - heard > timeout_ns
        if channel == "dynamic-mdc":
            deadline = time.monotonic() + DEADLINE_S
            while pub.destinations:  # the dynamic destination goes with the same timeout
                assert time.monotonic() < deadline, "the silent destination stayed"
                time.sleep(0.02)
    assert DriverConfig().publication_connection_timeout_ns == CONNECTION_TIMEOUT_NS
    assert CONNECTION_TIMEOUT_NS == 5_000_000_000  # Aeron's default


@pytest.mark.parametrize("value", [0, -1, 1_000_000_000, 1_999_999_999, 2.5e9, True, "5s"])
def test_a_publication_connection_timeout_too_short_or_not_whole_ns_is_refused(
    value: object,
) -> None:
    with pytest.raises(ChannelError) as refused:
        DriverConfig(publication_connection_timeout_ns=value)  # type: ignore[arg-type]
    assert refused.value.name == "publication_connection_timeout_ns"
    assert "at least 2000000000" in str(refused.value)
