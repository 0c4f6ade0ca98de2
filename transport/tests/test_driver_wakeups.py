"""What an idle or closing driver wakes up for (the handshake benchmark's CPU, issue 19).

A client that connects and closes fast left three costs in every driver step, found by counting
the runner's wake-ups and profiling its thread (~11 ms of driver CPU per handshake):

* a closed subscription with a ``control`` address (every handshake client's reply and session
  subscription) kept its elicit deadline in ``next_deadline_ns`` although ``do_work`` elicits
  nothing for it: the runner's deadline stayed in the past and it stepped without sleeping
  until the images had sent their EOS SMs (~a quarter of a second per closed subscription);
* a socket whose last subscription was gone stayed open, and read in every step, until the
  conductor's next housekeeping tick (up to a second: ~60 dead sockets at 40 connects/s);
* a driver with any IPC resource (every handshake server: it listens on IPC too) woke every
  millisecond although the IPC resources' own timers run at 20 ms and 100 ms.

Stepped by hand at a fixed time (nothing here depends on the machine's speed): the clock never
reaches the conductor's tick, so only the receiver can have closed the socket.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.agents import AgentRunner
from aeron_spark.transport.driver.conductor import (
    IPC_POLL_INTERVAL_NS,
    DriverConductor,
    ImageLimits,
)
from aeron_spark.transport.protocol.frames import SetupFrame
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest

SENDER = ("127.0.0.1", 41000)
CONTROL = ("127.0.0.1", 41001)


def _sent(log: list[bytes]) -> Any:
    return lambda data, address: log.append(bytes(data))


def test_a_closed_subscriptions_elicit_deadline_does_not_keep_the_receiver_awake() -> None:
    now = 1_000_000_000
    wire: list[bytes] = []
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10, control_address=CONTROL)
    dispatcher.add(interest)
    dispatcher.do_work(now, _sent(wire))  # elicits a SETUP from the control address
    setup = SetupFrame(0, 3, 10, 7, 7, 64 * 1024, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SENDER, now, _sent(wire))
    assert interest.images
    dispatcher.do_work(now, _sent(wire))  # the image's first SM
    dispatcher.remove(interest, now)
    later = now + 500_000_000  # past the interest's elicit deadline
    dispatcher.do_work(later, _sent(wire))  # the image's first EOS SM
    assert interest.images, "the image is still sending its EOS SMs"
    # nothing is due now: the receiver may sleep until the next EOS SM
    assert dispatcher.do_work(later, _sent(wire)) == 0
    assert dispatcher.next_deadline_ns(later) > later


def test_a_socket_is_closed_in_the_step_after_its_last_subscription_is_gone() -> None:
    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    driver.start()
    try:
        now = time.monotonic_ns()
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
        other = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 11)
        driver.do_work(now)  # the conductor's tick is due once, now; its next is a second on
        assert len(driver._receiver.endpoints) == 2
        (endpoint,) = [
            ep.endpoint for ep in driver._receiver.endpoints if ep.dispatcher.interests.get(10)
        ]
        sub.close()
        for _ in range(3):
            driver.do_work(now)  # same instant: the conductor's tick is not due again
        assert len(driver._receiver.endpoints) == 1, "the dead socket is still read every step"
        assert endpoint.closed
        assert other.channel and not other.is_closed
    finally:
        driver.close()


class _Resource:
    """An IPC resource (the conductor only calls ``do_work``) that counts its steps."""

    def __init__(self) -> None:
        self.steps = 0

    def do_work(self, now_ns: int) -> int:
        self.steps += 1
        return 0


def test_an_idle_conductor_with_ipc_resources_wakes_at_their_timers_pace() -> None:
    conductor = DriverConductor(
        SystemCounters(),
        lambda bind, config: None,  # type: ignore[arg-type,return-value]  # opens no socket here
        image_limits=ImageLimits(16 * 1024 * 1024, 65504, 64, 16, 16),
        retransmit_linger_ns=0,
        counters_interval_ns=1_000_000_000,
    )
    conductor.add_ipc(_Resource())
    now = 5_000_000_000
    conductor.do_work(now)  # housekeeping tick: the next one is a second on
    assert conductor.next_deadline_ns(now) == now + IPC_POLL_INTERVAL_NS
    assert IPC_POLL_INTERVAL_NS >= 10_000_000  # not every millisecond
    # the housekeeping tick is never postponed by the IPC interval: stepped 5 ms before the
    # tick, the resource is due 10 ms on, the tick first
    conductor.do_work(now + 995_000_000)
    assert conductor.next_deadline_ns(now + 995_000_000) == now + 1_000_000_000


def test_an_idle_driver_with_an_ipc_subscription_sleeps(tmp_path: Any) -> None:
    """A real driver thread: its runner's steps over a third of a second, idle but for an IPC
    subscription. Waking every millisecond made ~300 (each step a Python pass over every agent);
    at the IPC resources' pace it is ~30. The bound counts wake-ups, it times nothing: a slow
    or loaded machine only makes fewer."""
    driver = Driver(DriverConfig(directory=tmp_path, write_counters_file=False)).start()
    try:
        sub = driver.add_subscription("aeron:ipc", 10)
        resource = _Resource()
        driver._conductor.add_ipc(resource)
        time.sleep(0.05)  # let the runner settle into its idle loop
        before = resource.steps
        time.sleep(0.3)
        steps = resource.steps - before
        assert steps <= 100, f"{steps} wake-ups in 0.3 s of idleness"
        sub.close()
    finally:
        driver.close()


def test_an_ipc_scan_parses_only_its_own_streams_names(tmp_path: Any, monkeypatch: Any) -> None:
    """The IPC directory is shared by every stream and keeps what dead processes left (639
    files in this machine's default directory): each handshake server's IPC HELLO subscription
    parsed every name every 20 ms (~7 ms a scan, a third of a core per idle server)."""
    from aeron_spark.transport.ipc import subscription as ipc_subscription
    from aeron_spark.transport.ipc.logfile import file_name, ipc_directory

    folder = ipc_directory(tmp_path)
    folder.mkdir(parents=True)
    for i in range(300):
        (folder / file_name(1000 + i % 7, i)).touch()  # other streams' (left-over) files
    parsed: list[str] = []
    real_parse = ipc_subscription.parse_name

    def counting_parse(name: str) -> Any:
        parsed.append(name)
        return real_parse(name)

    monkeypatch.setattr(ipc_subscription, "parse_name", counting_parse)
    driver = Driver(
        DriverConfig(threading_mode="invoker", directory=tmp_path, write_counters_file=False)
    )
    driver.start()
    try:
        pub = driver.add_publication("aeron:ipc", 10)
        sub = driver.add_subscription("aeron:ipc", 10)
        deadline = time.monotonic() + 60.0  # bounded for a loaded machine
        while not sub.images and time.monotonic() < deadline:
            driver.do_work()
            sub.wait(0.05)
        assert sub.images and sub.images[0].session_id == pub.session_id
        assert parsed and all(name.startswith("pub_10_") for name in parsed), parsed[:3]
    finally:
        driver.close()


def test_a_subscription_added_while_the_receiver_computes_its_deadline() -> None:
    """A handshake server adds a subscription for a new stream id on its shared socket with
    every session, from its own thread, while the driver thread computes its next deadline: the
    dispatcher iterated its live dict of stream ids and the driver thread died ("dictionary
    changed size during iteration"; seen under the profiler). The interleaving is driven here:
    the image's check runs the other thread's add(). (The deadline is now read from a heap,
    not from a walk of the stream ids; the add is driven where the receiver still walks: its
    step of the image, and the removal of finished interests after it.)"""
    now = 1_000_000_000
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10)
    dispatcher.add(interest)
    setup = SetupFrame(0, 3, 10, 7, 7, 64 * 1024, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SENDER, now, _sent([]))
    (image,) = interest.images.values()
    dispatcher.do_work(now, _sent([]))
    added = StreamInterest(11)
    real_needs_work = image.needs_work

    def add_meanwhile() -> bool:
        if 11 not in dispatcher.interests:
            dispatcher.add(added)  # what the other thread does at this moment
        return bool(real_needs_work())

    image.needs_work = add_meanwhile  # type: ignore[method-assign]
    image.kick()
    dispatcher.remove(StreamInterest(12), now)  # a finished interest: the step walks them
    dispatcher.do_work(now, _sent([]))
    assert dispatcher.next_deadline_ns(now) > now
    assert dispatcher.interests[11] == (added,)


def test_a_step_reads_only_the_sockets_that_have_datagrams(monkeypatch: Any) -> None:
    """Every step tried a receive on every socket (the handshake client's driver: ~10 sockets,
    most of them closing subscriptions' sending their EOS status messages; ~800 failed
    ``recvfrom`` calls per connect). The runner now polls which are readable (one epoll_wait)
    and the agents read those."""
    import socket

    from aeron_spark.transport.driver.endpoint import UdpEndpoint

    driver = Driver(DriverConfig(threading_mode="invoker", write_counters_file=False))
    driver.start()
    reads: list[int] = []
    real_drain = UdpEndpoint.drain  # what a step reads a socket with

    def counting_drain(self: UdpEndpoint, *args: Any) -> Any:
        reads.append(self.local_port)
        return real_drain(self, *args)

    try:
        subs = [driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10) for _ in range(10)]
        now = time.monotonic_ns()
        driver.do_work(now)
        monkeypatch.setattr(UdpEndpoint, "drain", counting_drain)
        driver.do_work(now)
        assert reads == [], "a step with no datagram anywhere read sockets"
        host, port = subs[3].local_endpoints[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.sendto(b"\x00" * 32, (host, port))  # a malformed frame: read, counted, dropped
        deadline = time.monotonic() + 60.0  # bounded for a loaded machine
        while not reads and time.monotonic() < deadline:
            driver.do_work(now)
        assert set(reads) == {port}, f"read {sorted(set(reads))}, the datagram went to {port}"
    finally:
        driver.close()


def test_an_ipc_subscription_lists_its_directory_only_when_it_changed(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Each scan (every 20 ms) listed the whole shared directory; now only when its mtime moved
    since a listing that left nothing to retry (or once a second). The mtime is set into the
    past by hand, so the test does not wait for file times to settle."""
    import os

    from aeron_spark.transport.ipc.logfile import file_name, ipc_directory

    folder = ipc_directory(tmp_path)
    folder.mkdir(parents=True)
    for i in range(50):
        (folder / file_name(1000 + i % 7, i)).touch()
    settled = time.time_ns() - 10 * 1_000_000_000
    os.utime(folder, ns=(settled, settled))
    listings: list[str] = []
    real_listdir = os.listdir

    def counting_listdir(path: Any) -> list[str]:
        listings.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", counting_listdir)
    driver = Driver(
        DriverConfig(threading_mode="invoker", directory=tmp_path, write_counters_file=False)
    )
    driver.start()
    # a starting driver sweeps what dead processes left (one listing, of every stream's files);
    # what this test counts is the subscription's own listings from here on
    assert len(listings) <= 1
    listings.clear()
    try:
        sub = driver.add_subscription("aeron:ipc", 10)  # lists once, at once
        assert len(listings) == 1
        now = time.monotonic_ns()
        for step in range(1, 11):
            driver.do_work(now + step * 25_000_000)  # ten scans due, within the second
        assert len(listings) == 1, "the unchanged directory was listed again"
        pub = driver.add_publication("aeron:ipc", 10)  # creates a file: the mtime moves
        deadline = time.monotonic() + 60.0  # bounded for a loaded machine
        while not sub.images and time.monotonic() < deadline:
            driver.do_work()
            sub.wait(0.05)
        assert sub.images and sub.images[0].session_id == pub.session_id
        assert len(listings) >= 2
    finally:
        driver.close()


def test_an_image_closed_before_its_first_sm_lets_the_receiver_sleep_through_its_eos() -> None:
    """Closing an image before its first status message went out (the subscription closed
    right after its SETUP arrived) must not leave that first SM scheduled: needs_work() would
    stay true and the receiver would step without sleeping until the image's EOS SMs end."""
    now = 1_000_000_000
    wire: list[bytes] = []
    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(10, control_address=CONTROL)
    dispatcher.add(interest)
    setup = SetupFrame(0, 3, 10, 7, 7, 64 * 1024, 1408).encode()
    dispatcher.on_datagram(setup, len(setup), SENDER, now, _sent(wire))
    (image,) = interest.images.values()
    assert image.status_messages_sent == 0  # no SM yet
    dispatcher.remove(interest, now)
    dispatcher.do_work(now, _sent(wire))  # DRAINING: the first EOS SM
    assert image.is_closing and not image.is_done
    assert not image.needs_work(), "an EOS SM is due at its deadline, not now"
    assert dispatcher.do_work(now, _sent(wire)) == 0
    assert dispatcher.next_deadline_ns(now) > now


def test_subscription_wait_returns_for_an_image_that_came_just_before_the_call(
    tmp_path: Any,
) -> None:
    """A caller checks ``sub.images`` (none), the image arrives, then the caller waits: the wait
    must return at once, not sleep until its timeout (it compared against the images it saw
    on entry, which already held the new one). Same for data arriving before the call."""
    with Driver(DriverConfig(threading_mode="shared", directory=tmp_path)) as driver:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 10)
        port = sub.local_endpoints[0][1]
        seen = list(sub.images)  # the caller's check: nothing yet
        assert seen == []
        pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 10)
        deadline = time.monotonic() + 60.0  # a bound for a loaded machine; ends when it holds
        while not sub._images and time.monotonic() < deadline:  # the image arrives meanwhile
            time.sleep(0.001)
        assert sub._images
        assert sub.wait(5.0), "the image that came before the call was missed until the timeout"
        # data: the caller polled (nothing), then a message arrives before its wait
        got: list[bytes] = []
        assert sub.poll(lambda p, h: got.append(bytes(p)), 10) == 0
        while pub.offer(b"x") < 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        while not sub.has_data() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sub.wait(5.0)
        pub.close()
        sub.close()


def test_an_idle_driver_sleeps_until_a_real_deadline_and_a_new_ipc_log_wakes_it(
    tmp_path: Any,
) -> None:
    """What an idle stream server's driver holds (issue 31 item 4): an IPC subscription with no
    image (the handshake's IPC HELLO), a UDP publication with no destination yet (its reply
    publication) and a UDP subscription with no image. The runner woke ~95 times a second for
    them: the conductor stepped the IPC subscription every 10 ms to scan for log files, the
    publication's SETUP deadline came every 100 ms with nowhere to send it, and the runner
    never slept longer than 100 ms. Now it sleeps until its housekeeping tick (a second) and an
    inotify watch of the IPC directory wakes it for a new log file. Counted by the kernel (the
    thread's voluntary context switches) over two seconds; a loaded machine makes fewer."""
    from aeron_spark.transport.testing import free_udp_port, running_threads, thread_wakeups

    others = running_threads()  # e.g. a client driver an earlier test left to be reused
    config = DriverConfig(directory=tmp_path, write_counters_file=False)
    driver = Driver(config).start()
    other = Driver(config).start()  # another client's driver over the same IPC directory
    try:
        sub = driver.add_subscription("aeron:ipc", 12)
        port = free_udp_port()
        nowhere = driver.add_publication(
            f"aeron:udp?control=127.0.0.1:{port}|control-mode=manual", 13
        )
        udp_sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", 14)
        time.sleep(0.3)  # the first SETUP, scan and registrations

        def arrived() -> int:
            return sum(d.counters.snapshot()["datagrams_received"] for d in (driver, other))

        before, datagrams = thread_wakeups(("aeron-driver",), others), arrived()
        time.sleep(2.0)
        wakeups = thread_wakeups(("aeron-driver",), others) - before
        datagrams = arrived() - datagrams
        # both drivers' threads (one name): a housekeeping tick a second each, nothing else;
        # before: ~190 and ~20. A datagram that reaches the drivers' ports is work, not a tick:
        # in a long test run an earlier test's lingering publication may still send to a port
        # number free_udp_port() hands out again (as for the idle stream server, CI stop 36).
        assert wakeups <= 12 + 2 * datagrams, (
            f"two idle drivers woke {wakeups} times in 2 s ({datagrams} datagrams arrived)"
        )
        pub = other.add_publication("aeron:ipc", 12)
        deadline = time.monotonic() + 60.0  # a bound for a loaded machine; ends when it holds
        while not sub.images and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sub.images and sub.images[0].session_id == pub.session_id
        pub.close()
        nowhere.close()
        udp_sub.close()
        sub.close()
    finally:
        other.close()
        driver.close()


class _Idle:
    """An agent with nothing to do for ten seconds."""

    def do_work(self, now_ns: int) -> int:
        return 0

    def next_deadline_ns(self, now_ns: int) -> int:
        return now_ns + 10_000_000_000

    def has_work(self) -> bool:
        return False

    def filenos(self) -> list[Any]:
        return []


def test_a_sleeping_runner_is_sent_one_wake_up_byte_for_a_burst_of_wake_ups() -> None:
    """Issue 31: a server's loop offering replies to many sessions in one pass woke its
    sleeping driver once per publication (a ``send`` on the wake-up socket pair each, until
    the driver thread got the GIL back): one byte ends the sleep; the wake-ups after it, until
    the runner sleeps again, send nothing. A wake-up after that next sleep began sends again."""
    runner = AgentRunner("test", [_Idle()], lambda exc: None)
    try:
        for round_ in (1, 2):
            sleeper = threading.Thread(target=runner.idle, args=(10.0,))
            sleeper.start()
            deadline = time.monotonic() + 20
            while not runner.sleeping:
                assert time.monotonic() < deadline, "the runner never went to sleep"
                time.sleep(0.001)
            for _ in range(20):
                runner.wake()
            sleeper.join(20)
            assert not sleeper.is_alive()
            assert runner.wakeups_sent == round_
    finally:
        runner.close()


def _ipc_conductor(tmp_path: Any) -> tuple[DriverConductor, AgentRunner, Any, list[BaseException]]:
    """A conductor watching ``tmp_path``'s IPC directory (as a threaded driver's does), run by
    a runner stepped by hand on a made-up clock: its polls of the watch are real ``epoll``s."""
    from aeron_spark.transport.ipc.logfile import ipc_directory, make_folder
    from aeron_spark.transport.ipc.watch import open_watch

    counters = SystemCounters()
    conductor = DriverConductor(
        counters,
        lambda bind, config: None,  # type: ignore[arg-type,return-value]  # opens no socket here
        image_limits=ImageLimits(16 * 1024 * 1024, 65504, 64, 16, 16),
        retransmit_linger_ns=0,
        counters_interval_ns=1_000_000_000,
    )
    make_folder(ipc_directory(tmp_path))
    watch = open_watch(ipc_directory(tmp_path), counters)
    assert watch is not None, "inotify is available on the machines this suite runs on"
    conductor.watch_ipc(watch)
    errors: list[BaseException] = []
    return conductor, AgentRunner("test-conductor", [conductor], errors.append), watch, errors


class _Counts:
    """How often the conductor stepped each kind of IPC resource and read the watch
    (wrapping the real methods: the counts are the calls the driver made)."""

    def __init__(self, monkeypatch: Any) -> None:
        from aeron_spark.transport.ipc.publication import IpcPublicationLog
        from aeron_spark.transport.ipc.subscription import IpcSubscriptionMedia
        from aeron_spark.transport.ipc.watch import DirectoryWatch

        self.calls = {"publication": 0, "subscription": 0, "watch": 0}
        for name, cls, method in (
            ("publication", IpcPublicationLog, "do_work"),
            ("subscription", IpcSubscriptionMedia, "do_work"),
            ("watch", DirectoryWatch, "drain"),
        ):
            monkeypatch.setattr(cls, method, self._counting(name, getattr(cls, method)))

    def _counting(self, name: str, real: Any) -> Any:
        calls = self.calls

        def counted(*args: Any) -> Any:
            calls[name] += 1
            return real(*args)

        return counted

    def take(self) -> dict[str, int]:
        got = dict(self.calls)
        for name in self.calls:
            self.calls[name] = 0
        return got


def test_an_idle_driver_steps_ipc_resources_and_reads_its_watch_only_when_due(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Issue 31 (the empty step): every driver step read the IPC directory's inotify watch
    (a failed ``read``) and stepped every IPC resource (a handshake server's HELLO
    subscription and reply publication), whatever woke it: a third of a step that had nothing
    to do, and a busy server wakes thousands of times a second for its sockets. Now the watch
    is read when the runner's poll finds it readable, and a resource is stepped at its own
    deadline (the publication's heartbeat every 100 ms; a subscription with no image has none)
    or when kicked (a new log file). Counted over a made-up second in which the driver is
    woken every millisecond (as for the other agents' datagrams): before, 1,000 reads of the
    watch and 2,000 resource steps; now none but the ten heartbeats. The liveness duties keep
    their pace: the publication's heartbeat, and the subscription's slot heartbeat once it has
    an image (polled every duty interval)."""
    from aeron_spark.transport import ipc
    from aeron_spark.transport.uri import ChannelConfig

    counts = _Counts(monkeypatch)
    conductor, runner, watch, errors = _ipc_conductor(tmp_path)
    config = ChannelConfig.from_uri("aeron:ipc?term-length=65536")
    liveness = 10_000_000_000
    sub = ipc.add_subscription(
        config, 10, directory=tmp_path, liveness_timeout_ns=liveness, watch=watch
    )
    reply = ipc.add_publication(config, 11, directory=tmp_path, liveness_timeout_ns=liveness)
    later: Any = None
    try:
        conductor.add_ipc(sub)
        conductor.add_ipc(reply)
        ms = 1_000_000
        start = time.monotonic_ns()
        runner.do_work(start)  # both stepped once (added), the reply's file read off the watch
        start += 25 * ms  # the directory's change is scanned a scan interval after the last
        runner.do_work(start)
        assert not sub.images
        counts.take()
        for i in range(1, 1001):
            runner.do_work(start + i * ms)
        idle = counts.take()
        assert idle["watch"] == 0, f"the watch was read {idle['watch']} times, never readable"
        assert idle["subscription"] == 0, "a subscription with no image has no deadline"
        assert 9 <= idle["publication"] <= 11, f"{idle['publication']} steps for 10 heartbeats"
        assert reply.log.heartbeat_ns >= start + 900 * ms, "the publication's heartbeat lagged"
        # a readiness event: a log file for the subscription's stream comes
        later = ipc.add_publication(config, 10, directory=tmp_path, liveness_timeout_ns=liveness)
        now = start + 1020 * ms
        runner.do_work(now)
        event = counts.take()
        assert event["watch"] == 1 and event["subscription"] == 1, event
        assert [image.session_id for image in sub.images] == [later.session_id]
        # with an image, the subscription is polled every duty interval (10 ms): its slot's
        # heartbeat keeps the publisher's view of it live; the watch is still never read
        for i in range(1, 1001):
            runner.do_work(now + i * ms)
        busy = counts.take()
        assert busy["watch"] == 0
        assert 95 <= busy["subscription"] <= 101, busy
        (image,) = sub.images
        slots = later.log.live_slots(now + 1000 * ms, liveness)
        assert len(slots) == 1
        assert later.log.read_slot(slots[0])[1] >= now + 900 * ms, "the slot's heartbeat lagged"
        assert errors == []
    finally:
        sub.close()
        reply.close()
        if later is not None:
            later.close()
        runner.close()
        conductor.release_all(errors.append)
