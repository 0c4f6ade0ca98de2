"""StreamClient settings and connection failures (no server needed)."""

from __future__ import annotations

import pickle
import socket
import time

import pytest

from aeron_spark.connector.client import ClientSettings, RecordingInfo, ReplayBlock, StreamClient
from aeron_spark.connector.errors import ControlProtocolError, ServerUnavailableError
from aeron_spark.errors import ConfigurationError


def test_settings_are_frozen_picklable_and_validated() -> None:
    s = ClientSettings(endpoint="10.0.0.1:4000", encryption=False, timeout_s=3.0)
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(AttributeError):
        s.timeout_s = 1.0  # type: ignore[misc]
    for kwargs, name in [
        ({"endpoint": "nohost"}, "endpoint"),
        ({"endpoint": "h:0"}, "endpoint"),
        ({"endpoint": "h:99999"}, "endpoint"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_in_flight": 0}, "max_in_flight"),
    ]:
        with pytest.raises(ConfigurationError) as info:
            ClientSettings(**kwargs)
        assert info.value.name == name


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), True, "5"])
def test_a_connect_attempt_timeout_that_is_not_a_positive_number_of_seconds_is_refused(
    value: object,
) -> None:
    """``connect_attempt_timeout_s`` bounds one attempt of a reconnect (it was a fixed 5 s)."""
    assert ClientSettings().connect_attempt_timeout_s == 5.0
    assert ClientSettings(connect_attempt_timeout_s=0.5).connect_attempt_timeout_s == 0.5
    with pytest.raises(ConfigurationError) as info:
        ClientSettings(connect_attempt_timeout_s=value)  # type: ignore[arg-type]
    assert info.value.name == "connect_attempt_timeout_s"
    assert "a positive number of seconds" in str(info.value)


def test_connect_to_nothing_fails_typed_within_the_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ServerUnavailableError):
            StreamClient.connect(
                ClientSettings(endpoint=f"127.0.0.1:{port}", encryption=False, timeout_s=1.0)
            )
        assert time.monotonic() - started < 30


def test_wire_values_are_checked() -> None:
    with pytest.raises(ControlProtocolError):
        RecordingInfo.from_wire({"recording_id": 1})
    block = ReplayBlock(0, b"", 0, 0)
    assert pickle.loads(pickle.dumps(block)) == block
