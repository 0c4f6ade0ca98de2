"""Trusting and distrusting a session's streams with the amplification ledger costs the same
whatever the number of trusted sessions (the eighteenth session's closing note).

``AmplificationLedger.trust``/``distrust`` rebuilt a frozenset of every trusted (address,
session id) on each call (a handshake server calls them once per session opened and closed):
O(n) a call, O(n^2) over n sessions. That copy is C work no bytecode count sees, so the work is
counted as the memory a call allocates at its peak (tracemalloc: deterministic, not a time).
A real driver with a guarded socket (``max-amplification=3``) holds the ledger.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from aeron_spark.transport import Driver, DriverConfig


@pytest.fixture
def driver() -> Iterator[Driver]:
    d = Driver(DriverConfig(write_counters_file=False)).start()
    try:
        d.add_subscription("aeron:udp?endpoint=127.0.0.1:0|max-amplification=3", 10)
        assert d.amplification is not None
        yield d
    finally:
        d.close()


def _host(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def _peak_bytes_of_one_more_session(driver: Driver, n: int) -> int:
    """Trust ``n`` sessions (two session ids each, as a handshake's pair), then the peak bytes
    allocated by trusting and distrusting one more (the least of 8 rounds: a dict that grows
    now and then is amortised O(1), not the O(n) copy of every call)."""
    for i in range(n):
        driver.trust_host(_host(i), (2 * i + 1, 2 * i + 2))
    peaks = []
    tracemalloc.start()
    try:
        for round_ in range(8):
            ids = (-2 * round_ - 1, -2 * round_ - 2)
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            driver.trust_host("192.0.2.1", ids)
            driver.distrust_host("192.0.2.1", ids)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    for i in range(n):
        driver.distrust_host(_host(i), (2 * i + 1, 2 * i + 2))
    return min(peaks)


def test_trusting_one_session_costs_the_same_whatever_the_number_trusted(driver: Driver) -> None:
    small = _peak_bytes_of_one_more_session(driver, 32)
    large = _peak_bytes_of_one_more_session(driver, 512)
    # main: each call copied every trusted pair (2 per session) into a new frozenset
    assert large < 2 * small + 1024, (small, large)


def test_trust_is_counted_per_session_and_bounds_only_the_others(driver: Driver) -> None:
    ledger = driver.amplification
    assert ledger is not None
    ledger.on_receive("10.0.0.9", 100)
    assert not ledger.may_send("10.0.0.9", 1000, 7)  # 10x what it sent: dropped
    driver.trust_host("10.0.0.9", (7, 8))
    driver.trust_host("10.0.0.9", (7,))  # a second handshake naming 7 (counted twice)
    assert ledger.may_send("10.0.0.9", 1000, 7) and ledger.may_send("10.0.0.9", 1000, 8)
    assert not ledger.may_send("10.0.0.9", 1000, 9)  # another stream to it: still bounded
    assert not ledger.may_send("10.0.0.10", 1000, 7)  # the same id to another host: bounded
    driver.distrust_host("10.0.0.9", (7, 8))
    assert ledger.may_send("10.0.0.9", 1000, 7)  # still trusted once
    assert not ledger.may_send("10.0.0.9", 1000, 8)
    driver.distrust_host("10.0.0.9", (7,))
    assert not ledger.may_send("10.0.0.9", 1000, 7)
    assert not ledger.trusted
