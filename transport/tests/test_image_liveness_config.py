"""The image liveness timeout is a driver setting (Aeron's ``aeron.image.liveness.timeout``):
``DriverConfig(image_liveness_timeout_ns=...)``, 10 s by default, at least 4 s (twice the
longest idle heartbeat interval a channel may ask). Main had no such setting: every UDP image
timed out after a fixed 10 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.errors import ChannelError

DEADLINE_S = 60.0  # a loaded 2-core machine


def test_an_image_of_a_silent_publisher_goes_after_the_configured_liveness(
    tmp_path: Path,
) -> None:
    timeout_ns = 4_000_000_000
    receiving = DriverConfig(
        directory=tmp_path / "sub", image_liveness_timeout_ns=timeout_ns, write_counters_file=False
    )
    # the publisher's driver runs only when this test steps it: it falls silent at will
    sending = DriverConfig(
        threading_mode="invoker", directory=tmp_path / "pub", write_counters_file=False
    )
    with Driver(receiving) as sub_driver, Driver(sending) as pub_driver:
        sub = sub_driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 7)
        port = sub.local_endpoints[0][1]
        pub_driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 7)
        deadline = time.monotonic() + DEADLINE_S
        while not sub.images:
            assert time.monotonic() < deadline, "no image"
            if pub_driver.do_work() == 0:
                pub_driver.idle(0.005)
        [log] = sub.image_logs()
        assert log.liveness_timeout_ns == timeout_ns  # the driver's setting reached the image
        # silent from here on (no data, no heartbeat): the image goes after the timeout
        deadline = time.monotonic() + DEADLINE_S
        while sub.images:
            assert time.monotonic() < deadline, "the silent publisher's image stayed"
            time.sleep(0.05)
    assert DriverConfig().image_liveness_timeout_ns == 10_000_000_000  # Aeron's default


@pytest.mark.parametrize("value", [0, -1, 1_000_000_000, 3_999_999_999, 4.5e9, True, "10s"])
def test_an_image_liveness_timeout_too_short_or_not_whole_ns_is_refused(value: object) -> None:
    with pytest.raises(ChannelError) as refused:
        DriverConfig(image_liveness_timeout_ns=value)  # type: ignore[arg-type]
    assert refused.value.name == "image_liveness_timeout_ns"
    assert "at least 4000000000" in str(refused.value)
