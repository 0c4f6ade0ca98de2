"""The network a SETUP's sender is accounted in (``setups-per-prefix-per-s``): /24 for IPv4 and
IPv4-mapped IPv6, /64 for IPv6; IPv6 parses are cached per address, bounded (issue 19)."""

from __future__ import annotations

from aeron_spark.transport.protocol import receiver
from aeron_spark.transport.protocol.receiver import source_prefix


def test_prefixes_of_ipv4_mapped_and_ipv6_senders() -> None:
    assert source_prefix(("10.1.2.3", 4000)) == "10.1.2"
    assert source_prefix(("::ffff:10.1.2.3", 4000)) == "10.1.2"
    assert source_prefix(("2001:db8:0:1::5", 4000)) == "2001:db8:0:1::/64"
    assert source_prefix(("fe80::1%eth0", 4000)) == "fe80::/64"
    assert source_prefix(("not:an:address", 4000)) == "not:an:address"


def test_the_ipv6_cache_is_bounded_under_many_senders() -> None:
    for i in range(1, 6001):
        assert source_prefix((f"2001:db8:{i:x}::1", 1)) == f"2001:db8:{i:x}::/64"
    info = receiver._v6_prefix.cache_info()
    assert info.maxsize is not None and info.currsize <= info.maxsize
