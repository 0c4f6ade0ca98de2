"""Channel parsing is cached (issue 19: a handshake opens four channels per connection) without
changing what a channel means: IP literals and whole IP-only configurations are shared (frozen),
host names are resolved every time, bad channels are refused every time, memory is bounded."""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import pytest

from aeron_spark.transport import uri
from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.uri import ChannelConfig


def test_the_same_ip_channel_text_is_parsed_once_and_shared_frozen() -> None:
    text = "aeron:udp?endpoint=127.0.0.1:40123|control=[::1]:40124|control-mode=dynamic"
    first = ChannelConfig.from_uri(text)
    assert ChannelConfig.from_uri(text) is first
    assert first.endpoint is not None and first.endpoint.address == ("127.0.0.1", 40123)
    assert first.control is not None and first.control.family == socket.AF_INET6
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.mtu = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.endpoint.port = 1  # type: ignore[misc]


def test_a_host_name_is_resolved_on_every_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    real = socket.getaddrinfo

    def counting(host: Any, *args: Any, **kw: Any) -> Any:
        asked.append(host)
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    for _ in range(3):
        config = ChannelConfig.from_uri("aeron:udp?endpoint=localhost:40125")
        assert config.endpoint is not None and config.endpoint.port == 40125
    assert asked == ["localhost"] * 3


def test_bad_channels_are_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ChannelError, match="destination-host"):
            ChannelConfig.from_uri(
                "aeron:udp?control=127.0.0.1:40126|control-mode=dynamic|destination-host=nope"
            )
        with pytest.raises(ChannelError, match="mtu"):
            ChannelConfig.from_uri("aeron:udp?endpoint=127.0.0.1:40127|mtu=1m|term-length=64k")


def test_caches_are_bounded_under_many_distinct_channels() -> None:
    for i in range(uri._CONFIG_CACHE_SIZE + 500):
        host = f"10.{(i >> 8) & 255}.{i & 255}.1"
        ChannelConfig.from_uri(f"aeron:udp?endpoint={host}:{1000 + i}")
    assert len(uri._config_cache) <= uri._CONFIG_CACHE_SIZE
    info = uri._ip_literal.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize


def test_a_session_channel_is_parsed_but_not_kept() -> None:
    before = len(uri._config_cache)
    text = "aeron:udp?endpoint=127.0.0.1:40128|session-id=123456"
    config = ChannelConfig.from_uri(text)
    assert config.session_id == 123456 and text not in uri._config_cache
    assert len(uri._config_cache) <= max(before, uri._CONFIG_CACHE_SIZE)


def test_destination_host_ipv4_mapped_is_plain_ipv4() -> None:
    text = "aeron:udp?control=127.0.0.1:40129|control-mode=dynamic|destination-host=::ffff:10.1.2.3"
    assert ChannelConfig.from_uri(text).destination_host == "10.1.2.3"
