"""Data appended while the driver's thread sleeps is sent by the appending thread (issue 31).

A client's every request was two thread hand-offs: the caller woke the driver's thread (a byte
on its wake-up socket pair), which stepped every agent to send one datagram; then the receiver
woke the caller for the reply. Now, on a publication set to ``send_from_caller`` (a client's
session: it waits for the reply next), a caller that finds the sender's runner asleep in
``select`` takes its duty lock and steps the publication's endpoint itself (no byte, no
hand-off); the runner is woken only when it was awake, or must see a deadline earlier than its
sleep's end. A server's loop offering replies to many sessions in a pass leaves it off (one
driver step sends them all).
"""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.driver.agents import AgentRunner
from aeron_spark.transport.protocol.schedule import DueQueue


class _Ticking:
    """An agent due every ``period_ns``: its runner sleeps in short selects."""

    def __init__(self, period_ns: int) -> None:
        self.period_ns = period_ns
        self.steps = 0

    def do_work(self, now_ns: int) -> int:
        self.steps += 1
        return 0

    def next_deadline_ns(self, now_ns: int) -> int:
        return now_ns + self.period_ns

    def has_work(self) -> bool:
        return False

    def filenos(self) -> list[Any]:
        return []


def _asleep(runner: AgentRunner) -> None:
    deadline = time.monotonic() + 20
    while not runner.sleeping:
        assert time.monotonic() < deadline, "the runner never went to sleep"
        time.sleep(0.001)


def test_a_caller_steps_a_sleeping_runner_on_its_own_thread_and_says_when_to_wake_it() -> None:
    runner = AgentRunner("test", [_Ticking(5_000_000_000)], lambda exc: None)
    stepped: list[tuple[int, int]] = []

    def step(now_ns: int, arg: Any) -> None:
        stepped.append((threading.get_ident(), arg))

    runner.start()
    try:
        _asleep(runner)
        far, near = DueQueue(), DueQueue()
        far.schedule("pub", time.monotonic_ns() + 60_000_000_000)  # after the sleep's end
        near.schedule("pub", time.monotonic_ns() + 1_000_000)  # before it: wake the runner
        assert runner.step_asleep(step, 1, far) is True
        assert runner.step_asleep(step, 2, near) is False
        ready: DueQueue[str] = DueQueue()
        ready.ready.append("pub")  # more to send at once: wake the runner
        assert runner.step_asleep(step, 3, ready) is False
        me = threading.get_ident()
        assert stepped == [(me, 1), (me, 2), (me, 3)]
        assert runner.wakeups_sent == 0
    finally:
        runner.stop()
        runner.close()
    # stopped (or never started: invoker mode): never stepped by a caller
    assert runner.step_asleep(step, 4, DueQueue()) is False
    assert len(stepped) == 3


def test_a_caller_does_not_step_an_awake_runner() -> None:
    """The runner holds its duty lock whenever it is not in select: a caller then steps
    nothing (the runner sees the kick itself, or is woken)."""
    runner = AgentRunner("test", [_Ticking(5_000_000_000)], lambda exc: None)
    runner.start()
    try:
        _asleep(runner)
        runner._duty.acquire()  # as the runner's thread holds it between its selects
        try:
            assert runner.step_asleep(lambda now, arg: None, None, DueQueue()) is False
        finally:
            runner._duty.release()
    finally:
        runner.stop()
        runner.close()


def test_offers_from_many_threads_to_a_threaded_driver_arrive_once_in_order() -> None:
    """Callers stepping the sender while it sleeps, racing each other and the driver's thread:
    every message of every publication arrives once, in order, with fewer wake-up bytes than
    offers (~100 of 800 here, 329 on main: a runner that sleeps past a publication's next
    deadline, its heartbeat, is still woken for it)."""
    threads, messages = 4, 200
    with tempfile.TemporaryDirectory() as directory:
        driver = Driver(
            DriverConfig(threading_mode="shared", directory=directory, write_counters_file=False)
        ).start()
        try:
            sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 7)
            channel = f"aeron:udp?endpoint=127.0.0.1:{sub.local_endpoints[0][1]}"
            pubs = [driver.add_publication(channel, 7) for _ in range(threads)]
            for pub in pubs:
                pub.send_from_caller()
            deadline = time.monotonic() + 20
            while not (all(p.is_connected for p in pubs) and len(sub.images) == threads):
                assert time.monotonic() < deadline, "not connected"
                time.sleep(0.005)
            got: dict[int, list[int]] = {p.session_id: [] for p in pubs}
            runner = driver._runners[0]
            wakeups0 = runner.wakeups_sent

            def handler(payload: memoryview, header: Any) -> None:
                got[header.session_id].append(int.from_bytes(payload, "little"))

            def publish(pub: Any) -> None:
                for i in range(messages):
                    while pub.offer(i.to_bytes(4, "little")) < 0:
                        time.sleep(0.001)
                    end = time.monotonic() + 20
                    while len(got[pub.session_id]) <= i and time.monotonic() < end:
                        time.sleep(0.0005)

            workers = [threading.Thread(target=publish, args=(p,)) for p in pubs]
            for w in workers:
                w.start()
            end = time.monotonic() + 60
            while any(len(v) < messages for v in got.values()) and time.monotonic() < end:
                if sub.poll(handler, 64) == 0:
                    sub.wait(0.01)
            for w in workers:
                w.join(30)
            assert got == {p.session_id: list(range(messages)) for p in pubs}
            assert not driver.errors
            # no byte for most offers: the caller sent them (a woken runner costs one each)
            assert runner.wakeups_sent - wakeups0 < threads * messages
        finally:
            driver.close()
