"""Which client address a dedicated-socket share is counted under. One IPv6 host picks its
source addresses from a whole /64 (privacy addresses, or any it adds): before, each IPv6
address had a share of its own, so one host opening sessions from 20 addresses of its /64 took
the server's whole budget of 20 where its address's share was 5. Now an IPv6 client's share is
its /64's (as the HELLO and SETUP rates); IPv4-mapped and plain IPv4 are one address."""

from __future__ import annotations

from aeron_spark.handshake.server import dedicated_share_address
from aeron_spark.transport.driver.agents import DedicatedBudget
from aeron_spark.transport.protocol.publication import host_of


def _taken(budget: DedicatedBudget, hosts: list[str]) -> int:
    return sum(budget.take((("address", dedicated_share_address(h)),)) is None for h in hosts)


def test_the_addresses_of_one_ipv6_64_share_one_dedicated_share() -> None:
    budget = DedicatedBudget(20, {"address": 5})
    assert _taken(budget, [f"2001:db8:0:1::{i:x}" for i in range(1, 21)]) == 5
    assert budget.refused == {"address": 15}
    assert _taken(budget, [f"2001:db8:0:2::{i:x}" for i in range(1, 3)]) == 2  # another /64


def test_an_ipv4_mapped_address_is_the_same_share_as_its_ipv4_address() -> None:
    budget = DedicatedBudget(20, {"address": 2})
    mapped = host_of(("::ffff:10.1.2.3", 4000))
    assert _taken(budget, [mapped, "10.1.2.3", mapped]) == 2
    assert _taken(budget, ["10.1.2.4"]) == 1  # an IPv4 address is its own share, not its /24
