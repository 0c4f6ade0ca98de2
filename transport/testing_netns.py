"""Two hosts on a lossy wire, for tests and benchmarks: network namespaces, a veth pair, nftables.

:class:`LossyLink` builds (and always tears down) one veth pair between the caller's namespace
and a new network namespace, or between two new namespaces, each end with an address of a private
/30 not used on this machine, and an nftables ``netdev ingress`` rule on each end that drops the
given percentage of IP packets as they arrive (``numgen random mod 100 < N drop``). Ingress sees
packets before IP reassembly, so a datagram larger than the path MTU is lost when any of its
fragments is, as on a real lossy network. Loss can be changed while the link is up, and the
rules' counters say how many packets and bytes each end dropped.

Names carry the pid and a counter, so concurrent tests (and other users of the machine) do not
collide. A process killed while it holds a link (SIGKILL: a CI timeout, a ``kill -9``) leaves
nothing behind: each link has a guard process (a session of its own, so a kill of the holder's
process group spares it) that removes the link's namespaces, veth end and tables once its
holder is gone (its pipe from the holder reads end of file); and building a link first removes
what links of dead processes left (a guard killed too: :func:`sweep_dead_links`). Everything
needs root, ``ip`` (iproute2) and ``nft`` (nftables); :func:`unavailable_reason` says why a
machine cannot build a link (tests skip with it).

Run a program on a host with ``link.b.command([...])`` (an ``ip netns exec`` prefix, or nothing
for the caller's namespace). :func:`transfer` measures the transport over a link: this process
publishes on host ``a``, a subscriber process on host ``b`` (``python -m
aeron_spark.transport.testing_netns subscribe``) checks every message (index, length and, with
``verify``, every byte) and reports what it got; the publisher's counters and the links' drop
counters come with it.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import random
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from aeron_spark.transport.counters import pid_alive
from aeron_spark.transport.errors import TransportError

_COUNTER = itertools.count(1)

# The write ends of this process's guards' pipes. A child forked without an exec (os.fork,
# multiprocessing's fork) inherits every descriptor, close-on-exec or not: one holding a write
# end kept its guard waiting after the holder died, the link left for as long as the child
# lived. Closed in every forked child (register_at_fork), so only the holder keeps a guard.
_GUARD_PIPES: set[int] = set()
_GUARD_PIPES_LOCK = threading.Lock()


def _close_guard_pipes_in_child() -> None:
    # /dev/null put in its place rather than closed: the child's copy of the link still has
    # the pipe's file object, whose close (or finaliser) must not close a reused number
    if not _GUARD_PIPES:
        return
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for fd in list(_GUARD_PIPES):
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)
    _GUARD_PIPES.clear()


os.register_at_fork(after_in_child=_close_guard_pipes_in_child)
_PROBED: list[str | None] = []


class NetnsError(TransportError):
    """A namespace, veth or nftables command failed (the message has its output)."""


def _run(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def unavailable_reason() -> str | None:
    """None if this machine can build a :class:`LossyLink`, else why not (probed once)."""
    if _PROBED:
        return _PROBED[0]
    reason: str | None = None
    if os.geteuid() != 0:
        reason = "network namespaces and nftables need root (not running as root)"
    elif shutil.which("ip") is None:
        reason = "the ip command (iproute2) is not installed"
    elif shutil.which("nft") is None:
        reason = "the nft command (nftables) is not installed"
    else:
        try:
            with LossyLink(loss_percent=1):
                pass
        except (NetnsError, OSError, subprocess.SubprocessError) as exc:
            reason = f"cannot build a veth link between network namespaces: {exc}"
    _PROBED.append(reason)
    return reason


@dataclass
class Host:
    """One end of the link: its namespace (None: the caller's), device and address."""

    netns: str | None
    device: str
    address: str
    table: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def _nft(self, script: str) -> str:
        return _run(self.command(["nft", "-f", "-"]), stdin=script)

    def _nft_json(self) -> Any:
        return json.loads(_run(self.command(["nft", "-j", "list", "table", "netdev", self.table])))


def _free_subnet() -> ipaddress.IPv4Network:
    used = _run(["ip", "-o", "-4", "addr", "show"])
    taken = [
        ipaddress.ip_interface(word).network
        for line in used.splitlines()
        for word in line.split()
        if "/" in word and word[0].isdigit()
    ]
    rnd = random.Random(os.getpid() * 1000 + next(_COUNTER))
    for _ in range(1000):
        net = ipaddress.IPv4Network(f"10.{rnd.randrange(200, 250)}.{rnd.randrange(256)}.0/30")
        if not any(net.overlaps(other) for other in taken):
            return net
    raise NetnsError("no free 10.200-249.x.0/30 subnet for a test link")


# What one link tagged ``tag`` (``<pid>x<n>``) builds: its namespaces, its veth end in the
# caller's namespace (15 characters at most) and its table there (one in a namespace goes with
# it). Removing any of them that is not there does nothing.
def _teardown_argv(tag: str) -> list[list[str]]:
    return [
        ["nft", "delete", "table", "netdev", f"asloss{tag}"],
        ["ip", "link", "del", f"asa{tag}"[:15]],
        ["ip", "netns", "del", f"asa{tag}"],
        ["ip", "netns", "del", f"asb{tag}"],
    ]


# The guard: waits for end of file on stdin (its holder closed the link, or died), then removes
# what the link built; plain Python, no package import (it starts in a few milliseconds).
_GUARD = """
import json, subprocess, sys
for _ in iter(lambda: sys.stdin.buffer.read(4096), b""):
    pass
for argv in json.loads(sys.argv[1]):
    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
"""

_TAGGED = re.compile(r"as(?:a|b|loss)(\d+)x\d+")


def sweep_dead_links() -> int:
    """Remove what links of processes no longer alive left (their namespaces, veth ends and
    tables: a holder and its guard both killed); returns the links swept."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    words = [line.split()[0] for line in names.splitlines() if line.strip()]
    words += [
        line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line
    ]
    words += [line.split()[-1] for line in tables.splitlines() if line.startswith("table netdev")]
    tags = set()
    for word in words:
        found = _TAGGED.fullmatch(word)
        # a device name is cut at 15 characters: its tag may be too (then only its pid counts)
        if found is not None and not pid_alive(int(found.group(1))):
            tags.add(word[6:] if word.startswith("asloss") else word[3:])
    for tag in tags:
        for argv in _teardown_argv(tag):
            subprocess.run(argv, capture_output=True, timeout=30)
    return len(tags)


class LossyLink:
    """A veth pair between host ``a`` and host ``b`` with nftables loss on arrival at each end.

    ``a`` is the caller's namespace unless ``both_namespaced``; ``b`` is always a new namespace.
    ``mtu`` is the link MTU (1500, as Ethernet). Use as a context manager: leaving it removes the
    namespaces, the veth pair and the nftables tables, even after an error.
    """

    def __init__(
        self, loss_percent: float = 0.0, *, both_namespaced: bool = False, mtu: int = 1500
    ) -> None:
        self.loss_percent = loss_percent
        self.both_namespaced = both_namespaced
        self.mtu = mtu
        tag = f"{os.getpid()}x{next(_COUNTER)}"
        self.tag = tag
        self.namespaces: list[str] = []
        self.a: Host
        self.b: Host
        self._root_device: str | None = None
        self._guard: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LossyLink:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        tag = self.tag
        sweep_dead_links()
        # before anything is built: a kill from here on leaves what was built to the guard
        self._guard = subprocess.Popen(
            [sys.executable, "-c", _GUARD, json.dumps(_teardown_argv(tag))],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._guard.stdin is not None
        with _GUARD_PIPES_LOCK:
            _GUARD_PIPES.add(self._guard.stdin.fileno())
        net = _free_subnet()
        addr_a, addr_b = (str(h) for h in list(net.hosts())[:2])
        ns_b = f"asb{tag}"
        ns_a = f"asa{tag}" if self.both_namespaced else None
        dev_a, dev_b = f"asa{tag}"[:15], f"asb{tag}"[:15]
        for ns in (ns_a, ns_b):
            if ns is not None:
                _run(["ip", "netns", "add", ns])
                self.namespaces.append(ns)
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(
            [
                "ip",
                "link",
                "add",
                dev_a,
                "mtu",
                str(self.mtu),
                "type",
                "veth",
                "peer",
                "name",
                dev_b,
                "mtu",
                str(self.mtu),
            ]
        )
        self._root_device = dev_a
        _run(["ip", "link", "set", dev_b, "netns", ns_b])
        if ns_a is not None:
            _run(["ip", "link", "set", dev_a, "netns", ns_a])
            self._root_device = None
        self.a = Host(ns_a, dev_a, addr_a, f"asloss{tag}")
        self.b = Host(ns_b, dev_b, addr_b, f"asloss{tag}")
        for host in (self.a, self.b):
            prefix = ["ip", "-n", host.netns] if host.netns else ["ip"]
            _run([*prefix, "addr", "add", f"{host.address}/30", "dev", host.device])
            # A GSO send (several datagrams in one sendmsg) crosses a veth pair whole, so the
            # loss rule would drop all its datagrams at once; a wire carries them one by one:
            # one segment per packet makes the kernel cut them before the veth, as a NIC would.
            _run([*prefix, "link", "set", host.device, "gso_max_segs", "1"])
            _run([*prefix, "link", "set", host.device, "up"])
        self.set_loss(self.loss_percent)

    def set_loss(self, percent: float) -> None:
        """Drop ``percent`` % (0..100, whole numbers in 1/100 steps) of IP packets on arrival;
        100 cuts the link (a partition: every IP packet dropped, ARP still answered)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"loss percent {percent} is not in 0..100")
        self.loss_percent = percent
        threshold = round(percent * 100)
        # numgen's values are 0..9999, and nft refuses a constant outside that range: 100 %
        # is a rule without the random match
        chance = "" if threshold >= 10000 else f"numgen random mod 10000 < {threshold} "
        for host in (self.a, self.b):
            host._nft(
                f"table netdev {host.table}\n"
                f"delete table netdev {host.table}\n"
                f"table netdev {host.table} {{\n"
                f"  chain ingress {{\n"
                f'    type filter hook ingress device "{host.device}" priority 0;\n'
                f"    policy accept;\n"
                f"    meta protocol ip {chance}counter drop\n"
                f"  }}\n"
                f"}}\n"
            )

    def dropped(self, host: Host) -> tuple[int, int]:
        """(packets, bytes of IP packets) dropped on arrival at ``host`` since the last set_loss."""
        for item in host._nft_json()["nftables"]:
            rule = item.get("rule")
            if rule is None:
                continue
            for expr in rule["expr"]:
                if "counter" in expr:
                    return int(expr["counter"]["packets"]), int(expr["counter"]["bytes"])
        return 0, 0

    def close(self) -> None:
        """Remove what was built (safe to call twice, and after a partial build)."""
        errors = []
        if self._root_device is not None:
            table = f"asloss{self.tag}"
            subprocess.run(["nft", "delete", "table", "netdev", table], capture_output=True)
            subprocess.run(["ip", "link", "del", self._root_device], capture_output=True)
            self._root_device = None
        for ns in self.namespaces:
            done = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if done.returncode != 0:
                errors.append(done.stderr.strip())
        self.namespaces = []
        guard, self._guard = self._guard, None
        if guard is not None:  # all removed: its teardown finds nothing
            if guard.stdin is not None:
                with _GUARD_PIPES_LOCK:
                    _GUARD_PIPES.discard(guard.stdin.fileno())
                guard.stdin.close()
            try:
                guard.wait(30)
            except subprocess.TimeoutExpired:
                guard.kill()
                guard.wait(30)
        if errors:
            raise NetnsError("; ".join(errors))


# ---------------------------------------------------------------------------- transfers

STREAM_ID = 4242


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _subscribe(host: str, channel_params: str, verify: bool, timeout_s: float) -> None:
    """Child: receive messages made by ``make_message(i, size)`` in order; report them."""
    from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
    from aeron_spark.transport.testing import make_message

    state = {"next": 0, "bad": 0, "bytes": 0, "first": 0, "last": 0}

    def on_message(payload: memoryview, header: Any) -> None:
        index = int.from_bytes(payload[:8], "little") if len(payload) >= 8 else -1
        i = state["next"]
        size = len(payload)
        if index != i and size >= 8 or verify and bytes(payload) != make_message(i, size):
            state["bad"] += 1
        state["next"] = i + 1
        state["bytes"] += size
        now = time.monotonic_ns()
        if not state["first"]:
            state["first"] = now
        state["last"] = now

    config = DriverConfig(threading_mode="invoker", write_counters_file=False)
    with Driver(config) as driver:
        sub = driver.add_subscription(f"aeron:udp?endpoint={host}:0{channel_params}", STREAM_ID)
        _say(port=sub.local_endpoints[0][1])
        assembler = FragmentAssembler(on_message)
        expected: int | None = None
        deadline = time.monotonic() + timeout_s
        stdin = sys.stdin.fileno()
        while time.monotonic() < deadline:
            if expected is None or state["next"] < expected:
                got = sub.poll(assembler, 256)
            else:
                got = 0
            work = driver.do_work() + got
            if expected is not None and state["next"] >= expected:
                break
            if work == 0:
                readable, _, _ = select.select([stdin], [], [], 0)
                if readable:
                    line = os.read(stdin, 64)
                    if not line:
                        break
                    expected = int(line.split()[0])
                driver.idle(0.002)
        _say(
            received=state["next"],
            bad=state["bad"],
            bytes=state["bytes"],
            first_ns=state["first"],
            last_ns=state["last"],
            counters=driver.counters.snapshot(),
        )
        linger = time.monotonic() + 0.2  # EOS SMs and the last SMs go out
        while time.monotonic() < linger:
            if driver.do_work() == 0:
                driver.idle(0.01)


@dataclass
class TransferResult:
    """What one :func:`transfer` measured."""

    size: int
    offered: int
    received: int
    bad: int
    seconds: float  # first offer to last message received
    goodput_mb_per_s: float
    publisher: dict[str, int]  # the publishing driver's counters
    subscriber: dict[str, int]  # the subscribing driver's counters
    dropped_to_b: tuple[int, int]  # (packets, bytes) dropped on arrival at b (data direction)
    dropped_to_a: tuple[int, int]  # (packets, bytes) dropped on arrival at a (SMs, NAKs)
    overflows_b: int  # datagrams b's kernel dropped for a full socket buffer (UDP RcvbufErrors)

    @property
    def lost_bytes(self) -> int:
        """UDP payload bytes dropped on their way to the subscriber (IP/UDP headers taken off)."""
        packets, size = self.dropped_to_b
        return size - 28 * packets

    @property
    def retransmitted_bytes(self) -> int:
        return self.publisher.get("retransmitted_bytes", 0)


def transfer(
    link: LossyLink,
    *,
    size: int,
    count: int | None = None,
    seconds: float | None = None,
    channel_params: str = "|term-length=8m|mtu=1408",
    receiver_window: str = "2m",
    verify: bool = False,
    timeout_s: float = 120.0,
) -> TransferResult:
    """Publish ``count`` messages (or as many as fit in ``seconds``) of ``size`` bytes from host
    ``a`` to a subscriber on host ``b``; wait (bounded by ``timeout_s``) until it has them all.

    Raises :class:`NetnsError` if the subscriber does not report in time.
    """
    from aeron_spark.transport import Driver, DriverConfig
    from aeron_spark.transport.testing import make_message

    if (count is None) == (seconds is None):
        raise ValueError("give exactly one of count and seconds")
    child = subprocess.Popen(
        link.b.command(
            [
                sys.executable,
                "-m",
                "aeron_spark.transport.testing_netns",
                "subscribe",
                link.b.address,
                f"|rcv-wnd={receiver_window}",
                "1" if verify else "0",
                str(timeout_s),
            ]
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout or ()), daemon=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        first = child.stdout.readline()
        if not first:
            err = child.stderr.read() if child.stderr is not None else ""
            raise NetnsError(f"subscriber on {link.b.netns} exited: {err}")
        port = json.loads(first)["port"]
        reader.start()
        before_b, before_a = link.dropped(link.b), link.dropped(link.a)
        overflows_before = udp_receive_buffer_errors(link.b)
        config = DriverConfig(threading_mode="invoker", write_counters_file=False)
        with Driver(config) as driver:
            pub = driver.add_publication(
                f"aeron:udp?endpoint={link.b.address}:{port}{channel_params}", STREAM_ID
            )
            deadline = time.monotonic() + 30
            while not pub.is_connected:
                if time.monotonic() > deadline:
                    raise NetnsError("the subscriber never connected")
                if driver.do_work() == 0:
                    driver.idle(0.005)
            offered = 0
            start = time.monotonic_ns()
            stop = time.monotonic() + seconds if seconds is not None else None
            limit = count if count is not None else 1 << 62
            offer, do_work = pub.offer, driver.do_work
            message = make_message(0, size)
            while offered < limit:
                if stop is not None and offered % 64 == 0 and time.monotonic() >= stop:
                    break
                if offer(message) > 0:
                    offered += 1
                    message = make_message(offered, size)
                    if offered % 32:
                        continue
                if do_work() == 0:
                    driver.idle(0.0005)
            child.stdin.write(f"{offered}\n")
            child.stdin.flush()
            end = time.monotonic() + timeout_s
            while not lines and time.monotonic() < end and child.poll() is None:
                if driver.do_work() == 0:
                    driver.idle(0.002)
            publisher = driver.counters.snapshot()
        if not lines:
            raise NetnsError(
                f"the subscriber did not report within {timeout_s} s "
                f"(offered {offered}); stderr: "
                f"{child.stderr.read() if child.poll() is not None and child.stderr else ''}"
            )
        report = json.loads(lines[0])
        after_b, after_a = link.dropped(link.b), link.dropped(link.a)
        overflows = udp_receive_buffer_errors(link.b) - overflows_before
    finally:
        if child.poll() is None:
            try:
                child.stdin.close()  # type: ignore[union-attr]
                child.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
                child.wait(5)
    elapsed = max((report["last_ns"] - start) / 1e9, 1e-9) if report["last_ns"] else 0.0
    return TransferResult(
        size=size,
        offered=offered,
        received=report["received"],
        bad=report["bad"],
        seconds=elapsed,
        goodput_mb_per_s=report["bytes"] / elapsed / 1e6 if elapsed else 0.0,
        publisher=publisher,
        subscriber=report["counters"],
        dropped_to_b=(after_b[0] - before_b[0], after_b[1] - before_b[1]),
        dropped_to_a=(after_a[0] - before_a[0], after_a[1] - before_a[1]),
        overflows_b=overflows,
    )


def udp_receive_buffer_errors(host: Host) -> int:
    """The kernel's count of UDP datagrams dropped for a full receive buffer in ``host``'s
    namespace (``RcvbufErrors`` of /proc/net/snmp): loss the nftables counters do not see."""
    lines = [
        line.split()
        for line in _run(host.command(["cat", "/proc/net/snmp"])).splitlines()
        if line.startswith("Udp:")
    ]
    names, values = lines[0], lines[1]
    return int(values[names.index("RcvbufErrors")])


__all__ = [
    "Host",
    "LossyLink",
    "NetnsError",
    "TransferResult",
    "sweep_dead_links",
    "transfer",
    "udp_receive_buffer_errors",
    "unavailable_reason",
]


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "subscribe":
        _subscribe(sys.argv[2], sys.argv[3], sys.argv[4] == "1", float(sys.argv[5]))
    else:
        raise SystemExit("usage: python -m aeron_spark.transport.testing_netns subscribe ...")
