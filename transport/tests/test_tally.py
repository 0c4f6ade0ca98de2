"""Running totals of the transport's counters (issue 31 item 4, tally.py): a counters snapshot
reads them without walking the streams, and they equal the walk after any churn.

Real drivers (invoker mode, stepped by the test), real UDP sockets on loopback."""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.protocol.tally import Tally, attach, counter, counts, detach
from aeron_spark.transport.testing import pump, walked_totals


def _driver() -> Driver:
    return Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))


def _open(
    driver: Driver, n: int, stream_id: int = 10, sub: Any = None, linger: str = ""
) -> tuple[Any, list[Any]]:
    """``n`` publications to a new subscription (or to ``sub``), connected."""
    if sub is None:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", stream_id)
    port = sub.local_endpoints[0][1]
    had = len(sub.images)
    pubs = [
        driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}{linger}", sub.stream_id)
        for _ in range(n)
    ]
    pump(driver, lambda: all(p.is_connected for p in pubs) and len(sub.images) == had + n)
    return sub, pubs


def _python_calls(fn: Any) -> Counter[str]:
    """The Python functions ``fn()`` called on this thread, by name (a profile hook)."""
    calls: Counter[str] = Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            calls[frame.f_code.co_qualname] += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_a_counters_snapshot_walks_no_stream() -> None:
    """The calls a counters snapshot (without positions: a stream server's at many sessions)
    makes do not grow with the streams. Before: ``totals()`` walked every publication and
    image each snapshot (10-13 ms of the server's loop at 1,024 sessions), reading each
    publication's refused, deferred and suppressed counts through its parts' properties."""
    driver = _driver()
    try:
        sub, _ = _open(driver, 2)
        driver.counters.snapshot(positions=False)  # what the first one makes once
        few = _python_calls(lambda: driver.counters.snapshot(positions=False))
        _open(driver, 40, sub=sub)
        many = _python_calls(lambda: driver.counters.snapshot(positions=False))
        assert sum(many.values()) == sum(few.values()), (
            f"a snapshot made {sum(few.values())} Python calls at 2 streams and "
            f"{sum(many.values())} at 42: {dict(many - few)} more"
        )
        assert driver._conductor.totals() == walked_totals(driver._conductor)
    finally:
        driver.close()


# the churn: open n publications to a new subscription, close the oldest publication, close
# the oldest subscription (its publications first), send a message on every live publication
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.integers(1, 3)),
        st.just(("close_pub", 0)),
        st.just(("close_sub", 0)),
        st.just(("send", 0)),
    ),
    min_size=3,
    max_size=7,
)


def _close(driver: Driver, pubs: list[Any]) -> None:
    for pub in pubs:
        pub.close()
    c = driver._conductor
    pump(driver, lambda: not any(p in c.publications for p in pubs), timeout_s=60)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=_STEPS)
def test_running_totals_equal_the_walk_after_churn(steps: list[tuple[str, int]]) -> None:
    """Whatever opens, sends and closes (publications retiring, images going, endpoints
    reaped), the running totals equal a walk of every live stream plus what retired."""
    driver = _driver()
    c = driver._conductor
    try:
        pairs: list[tuple[Any, list[Any]]] = []
        stream_id = 100
        for op, n in steps:
            if op == "open":
                pairs.append(_open(driver, n, stream_id, linger="|linger=0"))
                stream_id += 1
            elif op == "close_pub" and pairs and pairs[0][1]:
                _close(driver, [pairs[0][1].pop(0)])
            elif op == "close_sub" and pairs:
                sub, pubs = pairs.pop(0)
                _close(driver, pubs)
                sub.close()
            elif op == "send":
                for _, pubs in pairs:
                    for pub in pubs:
                        pump(driver, lambda pub=pub: pub.offer(b"m" * 100) > 0)
            for _ in range(3):
                driver.do_work()
            assert c.totals() == walked_totals(driver._conductor), f"after {op} {n}"
        for sub, pubs in pairs:
            _close(driver, pubs)
            sub.close()
        pump(driver, lambda: not c.receive_endpoints, timeout_s=60)
        # everything retired: the running totals hold nothing of a stream that is gone
        assert not any(c.tally.snapshot().values())
        assert c.totals() == walked_totals(driver._conductor) == c.retired
    finally:
        driver.close()


class _Counts:
    sent: int = counter()
    refused: int = counter("refusals")
    waits: int = counter(locked=True)

    def __init__(self) -> None:
        self.sent = 0
        self.refused = 0
        self.waits = 0


def test_a_counted_attribute_moves_its_tally_from_attach_to_detach() -> None:
    tally = Tally()
    a, b = _Counts(), _Counts()
    a.sent += 2  # before attach: added by attach
    attach(tally, a, b)
    assert tally.snapshot() == {"sent": 2, "refusals": 0, "waits": 0}
    a.sent += 1
    b.refused += 4
    b.waits += 1
    assert (a.sent, b.refused, b.waits) == (3, 4, 1)
    assert tally.snapshot() == {"sent": 3, "refusals": 4, "waits": 1}
    detach(a)
    a.sent += 10  # detached: its own count only
    assert a.sent == 13 and counts(a) == {"sent": 13, "refusals": 0, "waits": 0}
    assert tally.snapshot() == {"sent": 0, "refusals": 4, "waits": 1}
