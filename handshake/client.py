"""The handshake client: the I/O around :class:`~.machine.ClientHandshake`.

``Client.connect("host:port")`` (or :func:`connect`) joins the server's reply channel, says HELLO,
checks the server's key against the key store, opens the private pair with the secret session ids,
proves its key with DONE and returns a :class:`~.connection.Connection` once the server confirms.
Every failure is a typed exception (see :mod:`.errors`) and frees everything opened so far.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aeron_spark.handshake.channels import Channels
from aeron_spark.handshake.client_counters import count, handshake_client_counters
from aeron_spark.handshake.config import ClientConfig, is_loopback
from aeron_spark.handshake.connection import Connection
from aeron_spark.handshake.crypto import SealCounters
from aeron_spark.handshake.errors import (
    ConnectionClosedError,
    HandshakeTimeoutError,
    KeyStoreError,
)
from aeron_spark.handshake.hello_channel import HelloChannel, registry
from aeron_spark.handshake.keystore import KeyStore, load_client_key
from aeron_spark.handshake.machine import ClientEvent, ClientHandshake
from aeron_spark.handshake.messages import SessionDetails
from aeron_spark.transport import (
    ClosedError,
    Driver,
    DriverConfig,
    FragmentAssembler,
    TransportError,
)

_driver_lock = threading.Lock()
_shared: Driver | None = None
_process_key: Any = None
#: Handshakes one process runs at once with one server (endpoint); half the server's default
#: ``max_pending_per_prefix`` (32), so two such processes on one host are never refused for it.
#: Per server, not per process: a server that never answers holds only its own slots (one
#: limit for all servers let 16 connects to a silent one fail every other connect waiting).
MAX_CONCURRENT_HANDSHAKES = 16


class _Slot:
    """One connect's claim on a handshake slot of its endpoint: held exactly while it is in
    its endpoint's set (put there, and taken out, by one ``set`` operation each)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key


# how long a waiter for a slot sleeps before it looks again (a release opens the endpoint's
# gate for one waiter at once; another that missed it looks again after this)
_SLOT_POLL_S = 0.05


class _HandshakeSlots:
    """Each server endpoint's :data:`MAX_CONCURRENT_HANDSHAKES` slots, kept while someone holds
    one (an endpoint's entry goes with its last holder: no growth per endpoint).

    Made of C-level steps only (a plain lock taken in a ``with``, ``set.add``/``discard``, a
    lock as the waiters' gate), so an exception a signal handler raises between any two
    bytecodes (Ctrl-C's ``KeyboardInterrupt``) leaves a slot either held by its claim, which
    the caller's ``finally`` gives back (:meth:`release` takes back a held claim only), or not
    taken: before, ``threading.BoundedSemaphore`` (Python code around a ``Condition``) could
    lose a slot taken just before the exception, or keep its condition's lock, and every later
    connect to that endpoint hung in the semaphore for good."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], set[_Slot]] = {}
        self._gates: dict[tuple[str, int], threading.Lock] = {}

    def acquire(self, slot: _Slot, timeout_s: float) -> bool:
        """Take a slot for ``slot`` within ``timeout_s``; call :meth:`release` in a
        ``finally`` around this call too (whatever happened, it gives back only what was
        taken)."""
        key = slot.key
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            with self._lock:
                held = self._held.get(key)
                if held is None:
                    held = self._held[key] = set()
                if len(held) < MAX_CONCURRENT_HANDSHAKES:
                    held.add(slot)  # the one step that takes it
                    return True
                gate = self._gates.get(key)
                if gate is None:
                    gate = self._gates[key] = threading.Lock()
                    gate.acquire()  # closed: a release opens it
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                count("slot_timeouts")  # a registry counter of the process (client_counters)
                return False
            gate.acquire(True, min(remaining, _SLOT_POLL_S))

    def release(self, slot: _Slot) -> None:
        """Give back ``slot``'s slot if it holds one (else nothing)."""
        key = slot.key
        with self._lock:
            held = self._held.get(key)
            if held is None or slot not in held:
                return
            held.discard(slot)
            if not held:
                del self._held[key]
                self._gates.pop(key, None)
            gate = self._gates.get(key)
            if gate is not None and gate.locked():
                gate.release()  # one waiter's turn

    def under_way(self, host: str | None = None, port: int | None = None) -> int:
        """Handshakes holding a slot now: with ``host:port``, or with any server."""
        with self._lock:
            if host is None:
                return sum(map(len, self._held.values()))
            return len(self._held.get((host.lower(), port or 0), ()))


_handshakes = _HandshakeSlots()
log = logging.getLogger(__name__)


def handshakes_under_way(host: str | None = None, port: int | None = None) -> int:
    """How many handshakes of this process hold a slot now (with ``host:port``, or any
    server; each server endpoint has ``MAX_CONCURRENT_HANDSHAKES``)."""
    return _handshakes.under_way(host, port)


def _process_identity(reason: BaseException) -> Any:
    """One identity key for this process, for clients whose key store is unusable."""
    global _process_key
    with _driver_lock:
        if _process_key is None:
            from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

            _process_key = X25519PrivateKey.generate()
            log.warning(
                "no client key (%s): this process uses a key of its own, which servers "
                "with authorized keys refuse; set clientKey / --client-key",
                reason,
            )
        return _process_key


def shared_driver() -> Driver:
    """The process-wide driver clients share (created on first use, closed at exit)."""
    global _shared
    with _driver_lock:
        if _shared is None or _shared.is_closed:
            _shared = Driver(DriverConfig(write_counters_file=False)).start()
            atexit.register(_shared.close)
        return _shared


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port``; ``ipc:port`` names the server listening on ``port`` on this host, reached
    over shared memory (same driver directory)."""
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {endpoint!r} is not host:port with a port 1..65535")
    return host, int(port)


class Client:
    """Connects to handshake servers with one configuration, key store and driver."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        driver: Driver | None = None,
        key_store: KeyStore | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        # its lock waited for within a connect's timeout (another process may hold it for good)
        self.key_store = key_store or KeyStore(
            self.config.key_store_dir, lock_wait_s=self.config.timeout_s
        )
        self._driver = driver
        self._static_key: Any = None

    @property
    def static_key(self) -> Any:
        """This client's identity key (``client_key_file``, else the key store's client.key;
        loaded once, created there on first use). A key store that cannot be created or
        written (a read-only home on an executor) gives a key of this process's own, logged:
        servers without authorized keys take it, the others refuse it (CLIENT_UNKNOWN)."""
        if self._static_key is None:
            path = self.config.client_key_file
            if path:
                self._static_key = load_client_key(path)
            else:
                try:
                    self._static_key = self.key_store.client_private_key()
                except KeyStoreError as exc:
                    if not isinstance(exc.__cause__, OSError):
                        raise  # unsafe permissions, a malformed key: never papered over
                    self._static_key = _process_identity(exc)
        return self._static_key

    @property
    def driver(self) -> Driver:
        return self._driver or shared_driver()

    def connect(
        self,
        endpoint: str,
        *,
        on_disconnect: Callable[[Connection], object] | None = None,
        on_error: Callable[[Connection, BaseException], object] | None = None,
    ) -> Connection:
        host, port = split_endpoint(endpoint)
        # the timeout counts from here: the wait for a slot is part of it (a slot freed late
        # once gave the handshake a whole timeout more)
        deadline = time.monotonic() + self.config.timeout_s
        # at most MAX_CONCURRENT_HANDSHAKES of this process's handshakes with this server at
        # once: the rest wait their turn (within the timeout) instead of being refused by the
        # server's pending limit per /24 and retried (a process that lost all its sessions at
        # once reopens them all); other servers' handshakes do not wait for them
        slot = _Slot((host.lower(), port))
        try:  # the acquire inside: an exception right after it took the slot gives it back
            if not _handshakes.acquire(slot, self.config.timeout_s):
                raise HandshakeTimeoutError(
                    f"no handshake slot of this process's {MAX_CONCURRENT_HANDSHAKES} for "
                    f"{endpoint} came free within timeout_s={self.config.timeout_s} s (all were "
                    "under way)",
                    endpoint,
                )
            # the key store's lock (the client's key, a server's trust) waited for within the
            # connect's deadline too, not a whole timeout from when that wait begins
            with self.key_store.waits_until(deadline):
                return self._attempt(host, port, endpoint, deadline, on_disconnect, on_error)
        finally:
            _handshakes.release(slot)

    def _attempt(
        self,
        host: str,
        port: int,
        endpoint: str,
        deadline: float,
        on_disconnect: Callable[[Connection], object] | None,
        on_error: Callable[[Connection, BaseException], object] | None,
    ) -> Connection:
        attempt = _Attempt(self, host, port, endpoint, deadline)
        try:
            return attempt.run(on_disconnect, on_error)
        except ConnectionClosedError:
            if not attempt.reused_channel or time.monotonic() >= deadline:
                raise
            # A kept HELLO channel whose server went away as this handshake began
            # (restarted on its ports: its replies to our HELLO publication's session id
            # now wait out the old image's cool-down): retired; once more on a fresh one.
            return _Attempt(self, host, port, endpoint, deadline).run(on_disconnect, on_error)

    @classmethod
    def connect_to(cls, endpoint: str, config: ClientConfig | None = None, **kw: Any) -> Connection:
        return cls(
            config, driver=kw.pop("driver", None), key_store=kw.pop("key_store", None)
        ).connect(endpoint, **kw)


def connect(endpoint: str, config: ClientConfig | None = None, **kw: Any) -> Connection:
    """``Client(config).connect(endpoint)``."""
    return Client.connect_to(endpoint, config, **kw)


class _Attempt:
    """One connection attempt; owns what it opens until it hands it to a Connection."""

    def __init__(
        self, client: Client, host: str, port: int, endpoint: str, deadline: float
    ) -> None:
        self.client = client
        self.config = client.config
        self.driver = client.driver
        self.host, self.port = host, port
        self.endpoint = endpoint
        self.control_port = self.config.control_port or port + 1
        # the reply channel's local address is of the server's family: an IPv4 socket never
        # receives from ::1 (issue 28 item 12)
        v6 = ":" in host
        self.bind = (
            ("::1" if v6 else "127.0.0.1") if is_loopback(host) else ("::" if v6 else "0.0.0.0")
        )
        media = "ipc" if host == "ipc" else "udp"
        self.channels = Channels(media, host, port, self.control_port, self.bind)
        self.deadline = deadline  # the connect's: its wait for a slot came out of it
        self.machine = ClientHandshake(
            self._check_key,
            static_key=client.static_key,
            encryption=self.config.encryption,
            timeout_ns=max(int((deadline - time.monotonic()) * 1e9), 1),
            endpoint=endpoint,
        )
        self.opened: list[Any] = []
        self.reused_channel = False  # its HELLO channel was ready before (kept from another)

    def _check_key(self, server_key: bytes) -> None:
        self.client.key_store.check_server(
            self.endpoint,
            server_key,
            pinned=self.config.pinned_key,
            trust_on_first_use=self.config.trust_on_first_use,
        )

    def _open(self, kind: str, channel: str, stream_id: int) -> Any:
        add = self.driver.add_publication if kind == "pub" else self.driver.add_subscription
        resource = add(channel, stream_id)
        self.opened.append(resource)
        return resource

    def _check(self, now_ns: int) -> None:
        """Between waits: the handshake's timeout, and a driver closed under it (its
        publications and subscriptions closed with it, their waits returned at once: the
        connect spun on them, a thread's CPU, until its whole timeout)."""
        self.machine.check_timeout(now_ns)
        if self.driver.is_closed:
            raise ClosedError(f"the driver was closed during the handshake with {self.endpoint}")

    def _wait_until(self, ready: Callable[[], bool], sub: Any | None, pub: Any = None) -> None:
        """Wait for ``ready()``: on ``sub`` (woken by its data and images), on ``pub`` while it
        is not connected (woken by the status message that connects it), else (a connected
        publication back-pressured: nothing wakes us) in short sleeps from 0.1 ms to 2 ms."""
        delay = 0.0001
        while not ready():
            self._check(time.monotonic_ns())
            remaining = max(self.deadline - time.monotonic(), 0.0)
            if sub is not None:
                sub.wait(min(remaining, 0.01))
            elif pub is not None and not pub.is_connected:
                pub.wait_until_connected(min(remaining, 0.01))
            else:
                time.sleep(min(remaining, delay))
                delay = min(delay * 2, 0.002)

    def run(
        self,
        on_disconnect: Callable[[Connection], object] | None,
        on_error: Callable[[Connection, BaseException], object] | None,
    ) -> Connection:
        m = self.machine
        ch = self.channels
        try:
            m.start(time.monotonic_ns())
            # the connect's deadline, not a full timeout from now (a wait for a slot came first)
            m.deadline_ns = min(m.deadline_ns, int(self.deadline * 1e9))
            details, port = self._hello()
            rcv_wnd = self.config.receiver_window_length or details.term_length // 2
            sub = self._open("sub", ch.s2c_sub(details, rcv_wnd, port), details.s2c_stream_id)
            pub = self._open("pub", ch.c2s_pub(details), details.c2s_stream_id)
            self._wait_until(lambda: bool(sub.images), sub)
            self._wait_until(lambda: pub.is_connected, None, pub)
            done = m.done()
            self._wait_until(lambda: pub.offer(done) > 0, None, pub)
            frames: deque[bytes] = deque()
            pair_assembler = FragmentAssembler(lambda p, h: frames.append(bytes(p)))
            while not frames:
                if sub.poll(pair_assembler, 1) == 0:
                    self._wait_until(lambda: sub.has_data() or not sub.images, sub)
                    if not sub.images:
                        raise ConnectionClosedError(
                            f"the server at {self.endpoint} closed the session before confirming"
                        )
            m.on_confirm(frames.popleft())
        except TransportError as exc:
            m.fail(ClientEvent.TRANSPORT_LOST)
            self._close_all()
            raise ConnectionClosedError(f"handshake with {self.endpoint} failed: {exc}") from exc
        except BaseException:
            m.fail(ClientEvent.PROTOCOL_ERROR)
            self._close_all()
            raise
        counters = SealCounters()
        sealer = opener = None
        if details.encryption:
            assert m.keys is not None
            sealer, opener = m.keys.client_sealer(counters)
        conn = Connection(
            pub,
            sub,
            peer=self.endpoint,
            max_message_length=details.max_message_length,
            sealer=sealer,
            opener=opener,
            seal_counters=counters,
            on_disconnect=on_disconnect,
            on_error=on_error,
        )
        conn.server_key = m.server_key  # type: ignore[attr-defined]
        for frame in frames:
            conn.deliver(frame)
        return conn

    def _hello(self) -> tuple[SessionDetails, int]:
        """HELLO (and its COOKIE round) on this process's channel to the server, until the
        WELCOME: the session's details, and the local port of the channel's replies (the
        session's subscription shares that socket, as its publication shares the HELLO
        publication's; 0 over IPC). The channel goes back to the registry as soon as the
        WELCOME is in (a failure of the transport retires it)."""
        m = self.machine
        linger = self.config.hello_linger_s
        shared = self.channels.media == "udp" and linger > 0
        hc = registry.acquire(self.driver, self.channels, shared)
        ok = False
        try:
            # the first HELLO goes as soon as the server's HELLO image is there: the server
            # opens this channel's reply publication for that HELLO (not for the image's
            # SETUP), and its reply waits on that publication until our subscription joins
            self._wait_until(lambda: hc.hello_pub.is_connected, None, hc.hello_pub)
            self.reused_channel = hc.was_ready
            hc.was_ready = True
            hc.register(m.connect_key)
            try:
                self._say(hc, m.hello(hc.resumption(time.monotonic_ns())))
                check = lambda: self._check(time.monotonic_ns())  # noqa: E731
                details = None
                while details is None:
                    details = m.on_reply(hc.receive(m.connect_key, self.deadline, check))
                    if m.retry_hello is not None:  # the server's COOKIE: say HELLO again
                        self._say(hc, m.retry_hello)
                        m.retry_hello = None
            finally:
                hc.unregister(m.connect_key)
            if shared and m.server_key is not None:
                hc.remember(details.resume_token, m.server_key, time.monotonic_ns())
            ok = True
            local = hc.replies.local_endpoints
            return details, (local[0][1] if local and self.channels.media == "udp" else 0)
        except BaseException as exc:
            # refused, or a key we do not trust: the channel itself is fine
            ok = not isinstance(exc, TransportError | ConnectionClosedError | HandshakeTimeoutError)
            raise
        finally:
            registry.release(hc, ok, linger)

    def _say(self, hc: HelloChannel, hello: bytes) -> None:
        self._wait_until(lambda: hc.offer(hello) > 0, None, hc.hello_pub)

    def _close_all(self) -> None:
        for resource in self.opened:
            try:
                resource.close()
            except TransportError:
                pass


__all__ = [
    "Client",
    "HandshakeTimeoutError",
    "connect",
    "handshake_client_counters",
    "shared_driver",
    "split_endpoint",
]
