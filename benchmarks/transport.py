"""Transport benchmark: two processes over UDP loopback; prints one JSON object.

    python -m benchmarks.transport [--seconds S] [--pingpong-rounds N] [--only-pingpong]
        [--real-aeron [--java-driver-idle backoff|yield|sleep-ms|spin]]
    python -m benchmarks.transport --compare-gso [--seconds S] [--rounds N]
    python -m benchmarks.transport --sessions 256 [--session-seconds 10] [--rounds N] [--python P]

* Throughput (``udp_<size>_msgs_per_s`` and ``..._mb_per_s``): this process publishes messages of
  one size for ``--seconds`` as fast as flow control allows; a child process subscribes and
  reports how many messages it received and when the last one arrived. Rate = messages received /
  (last arrival - first offer); both clocks are the system-wide monotonic clock. Sizes: 32 B,
  1 KiB and 8 KiB at the default MTU (1408), 64 KiB at ``mtu=65504``.
* Ping-pong (``pingpong_p50_us``, ``pingpong_p99_us``): 32-byte messages bounced by the child on
  a second stream; round-trip times of ``--pingpong-rounds`` rounds after a warm-up.
* With ``--real-aeron`` (the jar from ``python transport/tests/aeron_peer.py fetch``), in the same
  run: the real Java ``io.aeron.samples.Ping`` against our pong, our ping against the real
  ``Pong``, and ``Ping`` against ``Pong`` on one real Java media driver (SHARED threading,
  ``--java-driver-idle``), each with the same rounds, warm-up and 32-byte messages;
  ``pingpong_p50_ratio_*_to_java`` divide each p50 by the Java <-> Java p50 (above 1: slower
  than Java <-> Java). The Java samples busy-spin (their idle strategy is fixed), so on a
  2-core machine they compete with the driver thread and with each other: compare ratios from
  one run, on an otherwise idle machine.

* ``--compare-gso``: only throughput, 1 KiB, 8 KiB and 64 KiB messages at the default MTU
  (1408; 64 MiB terms for 64 KiB), each size run ``--rounds`` times with the publisher's UDP GSO
  off (every datagram its own ``sendto``) and on (``DriverConfig.udp_gso``), the two taking
  turns (the order swapped each round), and a third contender ``on_gro``: GSO on and the
  subscriber taking coalesced receives (``DriverConfig.udp_gro``). Per size and contender: the
  best msgs/s, and the median
  CPU time per message of the publishing process (user + system, from the first offer to the
  last byte sent: the offers, the sender, the syscalls) and of the subscribing process (from its
  first message to its last); ``..._on_to_off`` the ratios (msgs/s: above 1 is faster; CPU:
  below 1 is cheaper; ``..._on_gro_to_off`` the same for the third).

* ``--sessions N``: the datagram path of N sessions with our session channels' shape (issue
  31: the stream server's), CPU per message of each driver and datagrams per message: a
  "server" and a "client" invoker-mode driver in one process on a made-up clock (20 ms steps, so
  the figures do not depend on the machine's speed or load but through the CPU time itself);
  each session's client publication (``session-id``, ``idle-heartbeat-interval=2s``) sends one
  100-byte request a (made-up) second to the server's subscription on one shared port
  (``idle-sm-interval=1s``), which answers a 100-byte reply on a ``control-mode=dynamic``
  publication to the client's subscription (one shared port too). The thread CPU spent inside
  each driver's ``do_work`` over ``--session-seconds`` of publishing, net of its idle rate (4
  idle seconds before), per message; its idle CPU per session-second; the datagrams each
  driver sent and received per message net of idle (``S_...`` the server's, ``C_...`` the
  client's). ``--python OTHER`` runs it also under another interpreter (another checkout's
  venv, e.g. main's), the two in turns ``--rounds`` times (medians): this file is run under it
  as a script, against that checkout's transport.

Both sides run the driver in invoker mode (no driver thread: the application loop steps the
driver itself), with 2 MiB socket buffers. Terms are 16 MiB (default) except 64 KiB messages,
which use 64 MiB terms so a message fits (max message = term/8). Numbers depend heavily on what
else runs on the machine; the JSON includes the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.driver.endpoint import UdpEndpoint
from aeron_spark.transport.protocol.frames import StatusMessage
from aeron_spark.transport.protocol.publication import PublicationState
from aeron_spark.transport.testing import free_udp_port
from aeron_spark.transport.uri import Endpoint

STREAM = 1001
PONG_STREAM = 1002
SIZES = [("32b", 32, 1408), ("1k", 1024, 1408), ("8k", 8192, 1408), ("64k", 65536, 65504)]


def _driver(gso: bool = True) -> Driver:
    return Driver(DriverConfig(threading_mode="invoker", write_counters_file=False, udp_gso=gso))


# ---------------------------------------------------------------------------- child side


def child_subscribe(port_out: Any, expected_seconds: float, gro: bool = False) -> None:
    config = DriverConfig(threading_mode="invoker", write_counters_file=False, udp_gro=gro)
    with Driver(config) as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0|rcv-wnd=2m", STREAM)
        _say(port=sub.local_endpoints[0][1])
        count = 0
        last = 0.0
        first = 0.0
        idle_since = time.monotonic()
        ends = [0]
        cpu_first = cpu_last = 0.0
        process_time = time.process_time

        def handler(payload: memoryview, header: Any) -> None:
            # Count whole messages (END fragments), not fragments.
            if header.buffer[header.offset + 5] & 0x40:
                ends[0] += 1

        limit = 1 << 16
        deadline = time.monotonic() + expected_seconds + 60
        while time.monotonic() < deadline:
            n = sub.poll(handler, limit)
            work = d.do_work() + n
            if n:
                count = ends[0]
                last = time.monotonic()
                cpu_last = process_time()
                if not first:
                    first = last
                    cpu_first = cpu_last
            if work == 0:
                if count and time.monotonic() - last > 1.0:
                    break  # the publisher has stopped
                d.idle(0.001)
                if not count:
                    idle_since = time.monotonic()
        _say(
            count=count,
            first=first,
            last=last,
            idle_since=idle_since,
            cpu_s=cpu_last - cpu_first,
            counters=d.counters.snapshot(),
        )


def child_pong() -> None:
    with _driver() as d:
        sub = d.add_subscription("aeron:udp?endpoint=127.0.0.1:0", STREAM)
        _say(port=sub.local_endpoints[0][1])
        pong_port = int(sys.stdin.readline())
        pub = d.add_publication(f"aeron:udp?endpoint=127.0.0.1:{pong_port}", PONG_STREAM)

        def echo(payload: memoryview, header: Any) -> None:
            while pub.offer(payload) < 0:
                d.do_work()

        deadline = time.monotonic() + 120
        last = time.monotonic()
        while time.monotonic() < deadline:
            n = sub.poll(echo, 16)
            if n:
                last = time.monotonic()
            if d.do_work() + n == 0:
                if time.monotonic() - last > 5.0 and pub.is_connected:
                    break
                d.idle(0.0005)
        _say(done=True)


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------- parent side


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.transport", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("benchmark child exited early")
    return json.loads(line)


def throughput(
    size: int, mtu: int, seconds: float, gso: bool = True, gro: bool = False
) -> dict[str, float]:
    child = _spawn("--child", "subscribe", "--seconds", str(seconds), *(["--gro"] if gro else []))
    try:
        port = _read(child)["port"]
        term = "64m" if size > 16384 else "16m"
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}|mtu={mtu}|term-length={term}"
        payload = bytes(size)
        with _driver(gso) as d:
            pub = d.add_publication(channel, STREAM)
            deadline = time.monotonic() + 30
            while not pub.is_connected:
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark subscriber never connected")
                d.do_work()
                d.idle(0.001)
            offer = pub.offer
            do_work = d.do_work
            sent = 0
            cpu = os.times()
            start = time.monotonic()
            stop = start + seconds
            clock = time.monotonic
            while clock() < stop:
                for _ in range(256):
                    if offer(payload) < 0:
                        break
                    sent += 1
                if do_work() == 0:
                    d.idle(0.0005)
            # Let the last messages drain to the subscriber.
            drain_until = time.monotonic() + 2.0
            while time.monotonic() < drain_until and pub.sender_position < pub.position:
                if do_work() == 0:
                    d.idle(0.001)
            after = os.times()
            counters = d.counters.snapshot()
            report = _read(child)
            linger_until = time.monotonic() + 0.2
            while time.monotonic() < linger_until:
                do_work()
                d.idle(0.01)
    finally:
        child.kill()
        child.wait(10)
    elapsed = max(report["last"] - start, 1e-9)
    received = report["count"]
    return {
        "msgs_per_s": received / elapsed,
        "mb_per_s": received * size / elapsed / 1e6,
        "sent": sent,
        "received": received,
        "seconds": elapsed,
        "sender_cpu_s": after.user - cpu.user + after.system - cpu.system,
        "sender_sys_s": after.system - cpu.system,
        "receiver_cpu_s": report["cpu_s"],
        "gso_sends": counters["gso_sends"],
        "gso_fallbacks": counters["gso_fallbacks"],
        "datagrams_sent": counters["datagrams_sent"],
        "gro_receives": report["counters"]["gro_receives"],
    }


GSO_SIZES = [("1k", 1024, 1408), ("8k", 8192, 1408), ("64k", 65536, 1408)]


def sender_cpu(size: int, mtu: int, megabytes: float, gso: bool) -> dict[str, float]:
    """CPU time of the send path alone, one process: offers, the publication's sender and the
    socket's sends (loopback delivery included), to a socket nobody reads (the kernel drops
    what overflows it); status messages fed by hand so flow control never waits."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    endpoint = UdpEndpoint(
        Endpoint("0.0.0.0", 0, socket.AF_INET), SystemCounters(), so_sndbuf=2 << 20, gso=gso
    )
    try:
        address = sink.getsockname()
        term = (64 if size > 16384 else 16) << 20
        pub = PublicationState(
            session_id=1, stream_id=STREAM, initial_term_id=0, term_id=0, term_offset=0,
            term_length=term, mtu=mtu, destination=address, now_ns=0,
        )  # fmt: skip
        send, segments = endpoint.send, endpoint.send_segments if endpoint.gso else None

        def status(position: int) -> None:
            sm = StatusMessage(1, STREAM, position >> pub.shift, position & (term - 1), term, 1)
            pub.on_status_message(sm, address, 0)

        pub.send(0, send, segments)
        status(0)
        payload = bytes(size)
        count = int(megabytes * 1e6 / size)
        before = resource.getrusage(resource.RUSAGE_SELF)
        offer = pub.offer
        for _ in range(count):
            while offer(payload) < 0:
                pub.send(0, send, segments)
                status(pub.sender_position)
        while pub.sender_position < pub.position:
            pub.send(0, send, segments)
            status(pub.sender_position)
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        endpoint.close()
        sink.close()
    system = after.ru_stime - before.ru_stime
    cpu = after.ru_utime - before.ru_utime + system
    return {
        "cpu_us_per_msg": cpu / count * 1e6,
        "sys_us_per_msg": system / count * 1e6,
        "datagrams_sent": endpoint.counters.datagrams_sent,
        "gso_sends": endpoint.counters.gso_sends,
    }


def compare_gso(seconds: float, rounds: int) -> dict[str, Any]:
    """Each size with UDP GSO off and on, taking turns (see the module's docstring)."""
    result: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for name, size, mtu in GSO_SIZES:
        runs: dict[str, list[dict[str, float]]] = {"off": [], "on": [], "on_gro": []}
        for r in range(rounds):
            order = ("off", "on", "on_gro") if r % 2 == 0 else ("on_gro", "on", "off")
            for mode in order:
                runs[mode].append(
                    throughput(size, mtu, seconds, gso=mode != "off", gro=mode == "on_gro")
                )
        summary: dict[str, float] = {}
        for mode, rs in runs.items():
            prefix = f"udp_{name}_gso_{mode}"
            per_msg = sorted(x["sender_cpu_s"] / max(x["sent"], 1) * 1e6 for x in rs)
            sys_per_msg = sorted(x["sender_sys_s"] / max(x["sent"], 1) * 1e6 for x in rs)
            rcv_per_msg = sorted(x["receiver_cpu_s"] / max(x["received"], 1) * 1e6 for x in rs)
            summary[f"{prefix}_msgs_per_s"] = round(max(x["msgs_per_s"] for x in rs))
            summary[f"{prefix}_mb_per_s"] = round(max(x["mb_per_s"] for x in rs), 1)
            summary[f"{prefix}_sender_cpu_us_per_msg"] = round(per_msg[len(per_msg) // 2], 2)
            summary[f"{prefix}_sender_sys_us_per_msg"] = round(
                sys_per_msg[len(sys_per_msg) // 2], 2
            )
            summary[f"{prefix}_receiver_cpu_us_per_msg"] = round(
                rcv_per_msg[len(rcv_per_msg) // 2], 2
            )
        for what in ("msgs_per_s", "sender_cpu_us_per_msg", "receiver_cpu_us_per_msg"):
            off = summary[f"udp_{name}_gso_off_{what}"]
            for mode in ("on", "on_gro"):
                on = summary[f"udp_{name}_gso_{mode}_{what}"]
                summary[f"udp_{name}_{what}_{mode}_to_off"] = round(on / off, 3) if off else 0.0
        # the send path alone (CPU time, so less at the mercy of the machine's load)
        alone: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for r in range(rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                alone[mode].append(sender_cpu(size, mtu, 20.0, gso=mode == "on"))
        for mode, rs in alone.items():
            for what in ("cpu_us_per_msg", "sys_us_per_msg"):
                values = sorted(x[what] for x in rs)
                summary[f"udp_{name}_send_path_gso_{mode}_{what}"] = round(
                    values[len(values) // 2], 2
                )
        off = summary[f"udp_{name}_send_path_gso_off_cpu_us_per_msg"]
        on = summary[f"udp_{name}_send_path_gso_on_cpu_us_per_msg"]
        summary[f"udp_{name}_send_path_cpu_on_to_off"] = round(on / off, 3) if off else 0.0
        result.update(summary)
        details[name] = runs
        details[f"{name}_send_path"] = alone
    result["details"] = details
    return result


def _ping_rounds(
    ping_channel: str,
    pong_channel: str,
    rounds: int,
    warmup: int,
    on_pong_port: Callable[[int], None] | None = None,
) -> list[int]:
    """Our ping: send 32 bytes on ``ping_channel``, wait for the echo on ``pong_channel``;
    round-trip times (ns) of ``rounds`` rounds after ``warmup``."""
    with _driver() as d:
        pong = d.add_subscription(pong_channel, PONG_STREAM)
        if on_pong_port is not None:
            on_pong_port(pong.local_endpoints[0][1])
        pub = d.add_publication(ping_channel, STREAM)
        deadline = time.monotonic() + 30
        while not (pub.is_connected and pong.is_connected):
            if time.monotonic() > deadline:
                raise RuntimeError("ping-pong peers never connected")
            d.do_work()
            d.idle(0.001)
        payload = bytearray(32)
        got = [0]

        def on_pong(p: memoryview, h: Any) -> None:
            got[0] += 1

        samples: list[int] = []
        for i in range(warmup + rounds):
            got[0] = 0
            t0 = time.perf_counter_ns()
            while pub.offer(payload) < 0:
                d.do_work()
            d.do_work()
            while got[0] == 0:
                if pong.poll(on_pong, 1) == 0 and d.do_work() == 0:
                    d.idle(0.0002)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t0)
    return samples


def _summary(samples_ns: list[int], rounds: int) -> dict[str, float]:
    samples_ns = sorted(samples_ns)
    return {
        "p50_us": samples_ns[len(samples_ns) // 2] / 1000,
        "p99_us": samples_ns[int(len(samples_ns) * 0.99)] / 1000,
        "rounds": rounds,
    }


def pingpong(rounds: int, warmup: int = 500) -> dict[str, float]:
    """Ours <-> ours: this process pings, a child process (its own driver) pongs."""
    child = _spawn("--child", "pong")
    try:
        port = _read(child)["port"]

        def tell_child(pong_port: int) -> None:
            assert child.stdin is not None
            child.stdin.write(f"{pong_port}\n")
            child.stdin.flush()

        samples = _ping_rounds(
            f"aeron:udp?endpoint=127.0.0.1:{port}",
            "aeron:udp?endpoint=127.0.0.1:0",
            rounds,
            warmup,
            tell_child,
        )
    finally:
        child.kill()
        child.wait(10)
    return _summary(samples, rounds)


# ------------------------------------------------------------- against the real Aeron (Java)


def _aeron_peer() -> Any:
    """``transport/tests/aeron_peer.py`` (the real Aeron jar, fetched with Maven)."""
    tests = Path(__file__).resolve().parents[1] / "transport" / "tests"
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import aeron_peer

    return aeron_peer


def _java_ping(
    java: Any, ping_port: int, pong_port: int, rounds: int, warmup: int
) -> dict[str, float]:
    """The real ``io.aeron.samples.Ping`` (32-byte messages); its HdrHistogram, in us."""
    ping = java.run(
        "io.aeron.samples.Ping",
        {
            "aeron.sample.ping.channel": f"aeron:udp?endpoint=127.0.0.1:{ping_port}",
            "aeron.sample.pong.channel": f"aeron:udp?endpoint=127.0.0.1:{pong_port}",
            "aeron.sample.ping.streamId": STREAM,
            "aeron.sample.pong.streamId": PONG_STREAM,
            "aeron.sample.messages": rounds,
            "aeron.sample.messageLength": 32,
            "aeron.sample.warmup.iterations": 1,
            "aeron.sample.warmup.messages": warmup,
        },
        stdin=b"n\n",  # answers "Execute again? (y/n)"
    )
    if ping.wait_exit(180) != 0:
        raise RuntimeError("the Java Ping failed:\n" + ping.transcript())
    ping.drain(5)
    # HdrHistogram rows: value(us) percentile total-count 1/(1-percentile)
    rows: list[tuple[float, float]] = []
    for line in ping.lines:
        parts = line.split()
        if len(parts) == 4:
            try:
                rows.append((float(parts[0]), float(parts[1])))
            except ValueError:
                continue
    if not rows:
        raise RuntimeError("no histogram in the Java Ping's output:\n" + ping.transcript())

    def at(q: float) -> float:
        return next(v for v, p in rows if p >= q)

    return {"p50_us": at(0.5), "p99_us": at(0.99), "rounds": rounds}


def _pong_properties(ping_port: int, pong_port: int) -> dict[str, object]:
    return {
        "aeron.sample.ping.channel": f"aeron:udp?endpoint=127.0.0.1:{ping_port}",
        "aeron.sample.pong.channel": f"aeron:udp?endpoint=127.0.0.1:{pong_port}",
        "aeron.sample.ping.streamId": STREAM,
        "aeron.sample.pong.streamId": PONG_STREAM,
    }


def pingpong_real_aeron(
    rounds: int, warmup: int = 500, driver_idle: str = "backoff"
) -> dict[str, Any]:
    """Java Ping <-> our pong, our ping <-> Java Pong, and Java <-> Java (both samples on one
    Java media driver), on this machine in this run."""
    peer = _aeron_peer()
    reason = peer.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"--real-aeron: {reason}")
    out: dict[str, Any] = {"aeron_version": peer.AERON_VERSION, "java_driver_idle": driver_idle}
    driver_props = {"aeron.shared.idle.strategy": driver_idle}
    # Java Ping -> our pong (a child process with its own driver).
    with peer.JavaMediaDriver(tag="bench", **driver_props) as java:
        child = _spawn("--child", "pong")
        try:
            port = _read(child)["port"]
            pong_port = free_udp_port()
            assert child.stdin is not None
            child.stdin.write(f"{pong_port}\n")
            child.stdin.flush()
            out["java_ping_ours_pong"] = _java_ping(java, port, pong_port, rounds, warmup)
        finally:
            child.kill()
            child.wait(10)
    # Our ping -> Java Pong.
    with peer.JavaMediaDriver(tag="bench", **driver_props) as java:
        ping_port, pong_port = free_udp_port(), free_udp_port()
        java.run("io.aeron.samples.Pong", _pong_properties(ping_port, pong_port))
        samples = _ping_rounds(
            f"aeron:udp?endpoint=127.0.0.1:{ping_port}",
            f"aeron:udp?endpoint=127.0.0.1:{pong_port}",
            rounds,
            warmup,
        )
        out["ours_ping_java_pong"] = _summary(samples, rounds)
    # Java Ping <-> Java Pong (one Java media driver, as Aeron is usually run on one host).
    with peer.JavaMediaDriver(tag="bench", **driver_props) as java:
        ping_port, pong_port = free_udp_port(), free_udp_port()
        java.run("io.aeron.samples.Pong", _pong_properties(ping_port, pong_port))
        out["java_java"] = _java_ping(java, ping_port, pong_port, rounds, warmup)
    return out


# ---------------------------------------------------------------------------- sessions

MS = 1_000_000


def session_datagrams(sessions: int, seconds: int) -> dict[str, Any]:
    """The ``--sessions`` rig (module doc), in this process."""
    cfg = DriverConfig(threading_mode="invoker", write_counters_file=False)
    server, client = Driver(cfg), Driver(cfg)
    try:
        return _session_rig(server, client, sessions, seconds)
    finally:
        server.close()
        client.close()


def open_session_streams(
    server: Driver, client: Driver, k: int
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """``k`` session-shaped stream pairs between two drivers, on our sessions' channels: a
    request stream client -> server and a reply stream back (dynamic MDC control), each with
    the sessions' idle heartbeat and SM intervals. Returns the server's request
    subscriptions, the client's request publications, the server's reply publications and
    the client's reply subscriptions."""
    subs, requests, replies, reply_subs = [], [], [], []
    port = 0
    for i in range(k):
        sub = server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}|session-id={1000 + i}|idle-sm-interval=1s"
            "|rcv-wnd=4m",
            100 + i,
        )
        port = port or sub.local_endpoints[0][1]
        subs.append(sub)
        requests.append(
            client.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{port}|session-id={1000 + i}"
                "|idle-heartbeat-interval=2s|term-length=8m",
                100 + i,
            )
        )
    control = free_udp_port()
    back = 0
    for i in range(k):
        replies.append(
            server.add_publication(
                f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic"
                f"|session-id={5000 + i}|idle-heartbeat-interval=2s|term-length=8m",
                5000 + i,
            )
        )
        sub = client.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{back}|control=127.0.0.1:{control}"
            f"|control-mode=dynamic|session-id={5000 + i}|idle-sm-interval=1s|rcv-wnd=4m",
            5000 + i,
        )
        back = back or sub.local_endpoints[0][1]
        reply_subs.append(sub)
    return subs, requests, replies, reply_subs


def _session_rig(server: Driver, client: Driver, k: int, seconds: int) -> dict[str, Any]:
    subs, requests, replies, reply_subs = open_session_streams(server, client, k)
    clock = [time.monotonic_ns()]
    cpu = {"S": 0.0, "C": 0.0}
    thread_time = time.thread_time

    def step() -> None:
        now = clock[0]
        a = thread_time()
        server.do_work(now)
        b = thread_time()
        client.do_work(now)
        cpu["S"] += b - a
        cpu["C"] += thread_time() - b

    def answer(i: int) -> Callable[[memoryview, Any], None]:
        def handler(payload: memoryview, header: Any) -> None:
            while replies[i].offer(b"r" * 100) < 0:
                step()

        return handler

    handlers = [answer(i) for i in range(k)]
    answered = [0]

    def on_reply(payload: memoryview, header: Any) -> None:
        answered[0] += 1

    deadline = time.monotonic() + 120
    while not all(p.is_connected for p in requests + replies):
        if time.monotonic() > deadline:
            raise RuntimeError("the sessions never connected")
        clock[0] += 20 * MS
        step()
    for _ in range(200):  # settle: past the first SMs and heartbeats
        clock[0] += 20 * MS
        step()

    def counts(d: Driver) -> dict[str, int]:
        snap = d.counters.snapshot()
        keys = ("datagrams_sent", "datagrams_received", "status_messages_sent", "heartbeats_sent")
        return {key: snap.get(key, 0) for key in keys}

    def run(run_seconds: int, publish: bool) -> dict[str, Any]:
        c0, s0, k0 = dict(cpu), counts(server), counts(client)
        sent = 0
        for _ in range(run_seconds):
            for tick in range(50):
                if publish:
                    for i in range(tick, k, 50):  # each session once a second, spread out
                        if requests[i].offer(b"q" * 100) < 0:
                            raise RuntimeError("a request was refused")
                        sent += 1
                step()
                for i, sub in enumerate(subs):
                    sub.poll(handlers[i], 10)
                for sub in reply_subs:
                    sub.poll(on_reply, 10)
                clock[0] += 20 * MS
        s1, k1 = counts(server), counts(client)
        return {
            "cpu_S": cpu["S"] - c0["S"],
            "cpu_C": cpu["C"] - c0["C"],
            "sent": sent,
            "S": {key: s1[key] - s0[key] for key in s1},
            "C": {key: k1[key] - k0[key] for key in k1},
        }

    idle_s = 4
    idle = run(idle_s, False)
    busy = run(seconds, True)
    n = busy["sent"]
    scale = seconds / idle_s
    out: dict[str, Any] = {"sessions": k, "messages": n, "replies": answered[0]}
    for side in ("S", "C"):
        net = busy[f"cpu_{side}"] - idle[f"cpu_{side}"] * scale
        out[f"{side}_driver_us_per_message"] = round(1e6 * net / n, 1)
        out[f"{side}_idle_us_per_session_s"] = round(1e6 * idle[f"cpu_{side}"] / idle_s / k, 1)
        for key in busy[side]:
            value = (busy[side][key] - idle[side][key] * scale) / n
            out[f"{side}_{key}_per_message"] = round(value, 2)
        datagrams = busy[side]["datagrams_sent"] + busy[side]["datagrams_received"]
        out[f"{side}_us_per_datagram"] = round(1e6 * busy[f"cpu_{side}"] / datagrams, 1)
    return out


def compare_sessions(sessions: int, seconds: int, rounds: int, other: str | None) -> dict[str, Any]:
    """The rig in a child process (this interpreter, and ``other`` in turns): medians."""
    contenders = {"this": sys.executable}
    if other:
        contenders["other"] = other
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for name, python in order:
            out = subprocess.run(
                [
                    python,
                    os.path.abspath(__file__),
                    "--child",
                    "sessions",
                    "--sessions",
                    str(sessions),
                    "--session-seconds",
                    str(seconds),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=900,
            ).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    result: dict[str, Any] = {"rounds": runs}
    for name, got in runs.items():
        for key in got[0]:
            if isinstance(got[0][key], (int, float)):
                result[f"{name}_{key}"] = statistics.median(g[key] for g in got)
    if other:
        for side in ("S", "C"):
            key = f"{side}_driver_us_per_message"
            result[f"{side}_driver_cpu_this_to_other"] = round(
                result[f"this_{key}"] / result[f"other_{key}"], 2
            )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="publishing time per size")
    parser.add_argument("--pingpong-rounds", type=int, default=5000)
    parser.add_argument(
        "--real-aeron",
        action="store_true",
        help="also ping-pong against the real Aeron (Java, fetched with "
        "`python transport/tests/aeron_peer.py fetch`): ratios ours/Java in one run",
    )
    parser.add_argument(
        "--java-driver-idle",
        default="backoff",
        help="idle strategy of the Java media driver (SHARED mode): backoff (default), "
        "yield, sleep-ms, spin (busy-spins a core)",
    )
    parser.add_argument(
        "--only-pingpong", action="store_true", help="skip the throughput measurements"
    )
    parser.add_argument(
        "--compare-gso",
        action="store_true",
        help="only throughput of 1k/8k/64k messages at mtu 1408, UDP GSO off and on taking turns",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="--compare-gso, --sessions: runs per contender"
    )
    parser.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="only the datagram path of N sessions shaped as the stream server's: driver CPU "
        "and datagrams per message, on a made-up clock",
    )
    parser.add_argument(
        "--session-seconds", type=int, default=10, help="--sessions: publishing seconds"
    )
    parser.add_argument(
        "--python",
        help="--sessions: also run it under this interpreter (another checkout's venv), in turns",
    )
    parser.add_argument(
        "--child", choices=["subscribe", "pong", "sessions"], help=argparse.SUPPRESS
    )
    parser.add_argument("--gro", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "subscribe":
        child_subscribe(None, args.seconds, args.gro)
        return
    if args.child == "pong":
        child_pong()
        return
    if args.child == "sessions":
        print(json.dumps(session_datagrams(args.sessions, args.session_seconds)))
        return
    result: dict[str, Any] = {"load_average_at_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    if args.sessions:
        result.update(
            compare_sessions(args.sessions, args.session_seconds, args.rounds, args.python)
        )
        result["load_average_at_end"] = os.getloadavg()[0]
        result["mode"] = "two invoker drivers in one process, a made-up clock, UDP loopback"
        print(json.dumps(result))
        return
    if args.compare_gso:
        result.update(compare_gso(args.seconds, args.rounds))
        result["load_average_at_end"] = os.getloadavg()[0]
        result["mode"] = "invoker (no driver thread), two processes, UDP loopback"
        print(json.dumps(result))
        return
    details: dict[str, Any] = {}
    for name, size, mtu in [] if args.only_pingpong else SIZES:
        r = throughput(size, mtu, args.seconds)
        details[name] = r
        result[f"udp_{name}_msgs_per_s"] = round(r["msgs_per_s"])
        result[f"udp_{name}_mb_per_s"] = round(r["mb_per_s"], 1)
    p = pingpong(args.pingpong_rounds)
    result["pingpong_p50_us"] = round(p["p50_us"], 1)
    result["pingpong_p99_us"] = round(p["p99_us"], 1)
    if args.real_aeron:
        real = pingpong_real_aeron(args.pingpong_rounds, driver_idle=args.java_driver_idle)
        details["pingpong_real_aeron"] = real
        result["aeron_version"] = real["aeron_version"]
        for key in ("java_ping_ours_pong", "ours_ping_java_pong", "java_java"):
            result[f"pingpong_{key}_p50_us"] = round(real[key]["p50_us"], 1)
            result[f"pingpong_{key}_p99_us"] = round(real[key]["p99_us"], 1)
        java_p50 = real["java_java"]["p50_us"]
        # ratio > 1: slower than Java <-> Java on this machine, in this run
        result["pingpong_p50_ratio_ours_to_java"] = round(p["p50_us"] / java_p50, 2)
        for key in ("java_ping_ours_pong", "ours_ping_java_pong"):
            result[f"pingpong_p50_ratio_{key}_to_java"] = round(real[key]["p50_us"] / java_p50, 2)
    result["details"] = details
    result["mode"] = "invoker (no driver thread), two processes, UDP loopback"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
