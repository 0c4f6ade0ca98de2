"""One UDP socket, IPv4 or IPv6 through the same code path (Aeron's ``UdpChannelTransport``).

The socket is non-blocking; waiting is the agent runner's job (``selectors``). Sends that fail
or are cut short are counted, never raised: UDP is lossy anyway and the protocol recovers.

A run of equal datagrams (the last may be shorter) goes out in one ``sendmsg`` with
``UDP_SEGMENT`` (UDP GSO, Linux 4.18) where the kernel offers it (:meth:`UdpEndpoint.
send_segments`): the kernel cuts it into the same datagrams one ``sendto`` each would send.
Where the kernel refuses a run (no GSO on the route: IPsec, a segment above the path MTU, a
device or socket that cannot; ``gso_fallbacks``) its datagrams go one by one, and that
destination is sent to one by one from then on.

The driver's agents send the control frames of a step (status messages, heartbeats, SETUPs,
NAKs: many at once on an idle driver, whose timers share a grid) through :meth:`UdpEndpoint.queue`
and :meth:`UdpEndpoint.flush` at the end of the step: the frames to one destination build runs
of equal length (the last may be shorter), each run one GSO send of up to ``MAX_SEGMENTS``
datagrams. Every datagram passes the amplification ledger when queued and is counted when sent,
as :meth:`UdpEndpoint.send` does; a run is sent as soon as it is full or a frame of another
length ends it, and a frame to a destination never overtakes an earlier one to it (a direct send
to a destination first sends the run open to it).

Receiving is one datagram per call: Python's socket has no ``recvmmsg``. With UDP GRO
(``DriverConfig.udp_gro``, off by default; Linux 5.0) one ``recvmsg`` may return several equal
datagrams of one sender coalesced by the kernel (a GSO send over loopback arrives whole), their
length in a control message; :meth:`UdpEndpoint.raw_receive` hands them out one datagram a call,
cut where their sender cut them. Without it the kernel cuts any GSO send it delivers to us.
An optional :class:`~aeron_spark.transport.testing.LossInjector` sits between the socket and the
state machines to drop, duplicate and reorder received datagrams in tests.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import socket
import struct
import sys
from collections.abc import Iterable
from typing import Any

from aeron_spark.transport.counters import SystemCounters
from aeron_spark.transport.errors import DriverError, PortInUseError, RemoteProtocolError
from aeron_spark.transport.protocol.segments import MAX_RUN_BYTES, MAX_SEGMENTS
from aeron_spark.transport.uri import Endpoint

RECEIVE_BUFFER_LENGTH = 65536
_TRANSIENT = {
    errno.EAGAIN,
    errno.EWOULDBLOCK,
    errno.ENOBUFS,
    errno.ECONNREFUSED,
    errno.EINTR,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
}

# UDP GSO and GRO (linux/udp.h): the segment length rides in a SOL_UDP control message (a u16
# sent, an int received)
_SOL_UDP = 17
_UDP_SEGMENT = 103
_GSO_SIZE = struct.Struct("=H")
_UDP_GRO = 104
_GRO_SIZE = struct.Struct("=i")
_GRO_ANCILLARY = socket.CMSG_SPACE(_GRO_SIZE.size)
# What a kernel answers a GSO send it will not segment (the datagrams then go one by one)
_GSO_REFUSED = {
    errno.EINVAL,  # a segment past the path MTU, checksums off on the socket (SO_NO_CHECK)
    errno.EIO,  # no checksum offload on the device, IPsec (xfrm) on the route
    errno.EMSGSIZE,
    errno.EOPNOTSUPP,
    errno.ENOPROTOOPT,
}
GSO_REFUSED_MAX = 1024  # destinations remembered as refusing GSO, per socket


def gso_supported(sock: socket.socket) -> bool:
    """Whether the kernel knows ``UDP_SEGMENT`` on this socket (Linux 4.18 and later)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.getsockopt(_SOL_UDP, _UDP_SEGMENT)
    except OSError:
        return False
    return True


# SO_ATTACH_REUSEPORT_CBPF (Linux 4.5): a classic BPF program that picks, in a SO_REUSEPORT
# group, the socket a datagram no connected socket claims goes to; ours returns index 0 (the
# group's first socket: the public one, bound before its connected sockets).
_SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06  # BPF_RET | BPF_K


def _keep_group_to_first(sock: socket.socket) -> None:
    """Make every unconnected datagram of ``sock``'s ``SO_REUSEPORT`` group go to its first
    socket (``sock``, just bound): another process of the same user that binds the same address
    and port with ``SO_REUSEPORT`` (the kernel lets it join the group) then receives nothing,
    instead of a hash-chosen share of the datagrams (HELLOs) meant for us. Connected sockets are
    matched before the program runs (an exact 4-tuple scores higher), so they keep theirs."""
    if not sys.platform.startswith("linux"):
        return
    program = ctypes.create_string_buffer(struct.pack("=HBBI", _BPF_RET_K, 0, 0, 0))
    fprog = struct.pack("@HP", 1, ctypes.addressof(program))  # struct sock_fprog
    # an OSError (no such option) fails the bind: a group left open is what this closes
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, fprog)


def _enable_gro(sock: socket.socket) -> bool:
    """Ask for coalesced receives (``UDP_GRO``, Linux 5.0); whether the kernel took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(_SOL_UDP, _UDP_GRO, 1)
    except OSError:
        return False
    return True


class AmplificationLedger:
    """Bytes received from and sent to each IP address by a driver's guarded sockets: to an
    address not trusted at most ``factor`` times what came from it is sent; the rest is dropped
    and counted. A spoofer that names a victim as its source so gets at most ``factor`` times its
    own traffic sent to the victim.

    Trust is per (address, session id), not per address: a handshake proves that its client
    receives at its address, which exempts that session's streams (its secret session ids) and
    nothing else; every other stream towards that address (a handshake's replies, a HELLO
    stream's status messages, whose session ids a spoofer may choose) stays bounded.

    Received bytes are counted on the receiving thread and sent ones on the sending one (each
    updates its own dict). ``trusted`` counts the trusts of each (address, session id):
    :meth:`trust`/:meth:`distrust` change only their own ids (O(1) a session; they rebuilt a set
    of every trusted pair per call, O(n^2) over n sessions), and the sending thread only asks
    ``in`` of it (one dict lookup, atomic under the GIL), never iterates it.
    """

    def __init__(self, factor: int = 3, max_hosts: int = 65536) -> None:
        self.factor = factor
        self.max_hosts = max_hosts
        self.received: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self.trusted: dict[tuple[str, int], int] = {}  # (address, session id) -> its trusts
        self.drops = 0
        self.dropped_bytes = 0

    def on_receive(self, host: str, length: int) -> None:
        received = self.received
        if len(received) >= self.max_hosts and host not in received:
            received.clear()  # a flood of sources: forget credit (sends get stricter, not looser)
        received[host] = received.get(host, 0) + length

    def may_send(self, host: str, length: int, session_id: int | None = None) -> bool:
        if session_id is not None and (host, session_id) in self.trusted:
            return True
        sent = self.sent
        total = sent.get(host, 0) + length
        if total > self.factor * self.received.get(host, 0):
            self.drops += 1
            self.dropped_bytes += length
            return False
        if len(sent) >= self.max_hosts and host not in sent:
            sent.clear()
            self.received.clear()
        sent[host] = total
        return True

    def trust(self, host: str, session_ids: Iterable[int]) -> None:
        counts = self.trusted
        for sid in session_ids:
            counts[(host, sid)] = counts.get((host, sid), 0) + 1

    def distrust(self, host: str, session_ids: Iterable[int]) -> None:
        counts = self.trusted
        for sid in session_ids:
            left = counts.get((host, sid), 0) - 1
            if left > 0:
                counts[(host, sid)] = left
            else:
                counts.pop((host, sid), None)


def frame_session_id(data: Any) -> int | None:
    """The session id an Aeron frame names (DATA, PAD, SETUP at byte 12; SM, NAK, RTTM at byte
    8), or None for another or a short frame."""
    if len(data) < 16:
        return None
    offset = _SESSION_OFFSET.get(data[6] | (data[7] << 8))
    if offset is None:
        return None
    return _i32_from(data, offset)[0]


_SESSION_OFFSET = {0x00: 12, 0x01: 12, 0x05: 12, 0x02: 8, 0x03: 8, 0x06: 8}
_i32_from = struct.Struct("<i").unpack_from


@functools.lru_cache(maxsize=4096)  # per datagram sent and received on a guarded socket
def host_key(address: Any) -> str:
    host = str(address[0])
    return host[7:] if host.startswith("::ffff:") and "." in host else host


def _sockaddr(endpoint: Endpoint) -> tuple[Any, ...]:
    if endpoint.family == socket.AF_INET6:
        return (endpoint.host, endpoint.port, 0, 0)
    return (endpoint.host, endpoint.port)


class UdpEndpoint:
    """A bound non-blocking UDP socket with counted sends and a preallocated receive buffer."""

    def __init__(
        self,
        bind: Endpoint,
        counters: SystemCounters,
        *,
        so_rcvbuf: int = 0,
        so_sndbuf: int = 0,
        loss: Any = None,
        reuse_port: bool = False,
        connect_to: Any = None,
        gso: bool = True,
        gro: bool = False,
    ) -> None:
        """``reuse_port``: bound with ``SO_REUSEPORT``, so connected sockets of the same user
        may share its address; ``connect_to``: such a socket, connected to that sender's
        address (the kernel hands it every datagram of that 4-tuple, and nothing else)."""
        self.family = bind.family
        self.counters = counters
        try:
            sock = socket.socket(bind.family, socket.SOCK_DGRAM)
        except OSError as exc:
            raise DriverError(f"cannot create a UDP socket for {bind}: {exc}") from exc
        try:
            if bind.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            if so_rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, so_rcvbuf)
            if so_sndbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, so_sndbuf)
            if reuse_port or connect_to is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(_sockaddr(bind))
            if connect_to is not None:
                sock.connect(connect_to)
            elif reuse_port:
                _keep_group_to_first(sock)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            to = f" connected to {connect_to}" if connect_to is not None else ""
            raise DriverError(f"cannot bind UDP socket to {bind}{to}: {exc}") from exc
        self.sock = sock
        self.connected_to = connect_to
        local = sock.getsockname()
        self.local_address: tuple[Any, ...] = local
        self.local_port: int = local[1]
        self.buffer = bytearray(RECEIVE_BUFFER_LENGTH)
        self.view = memoryview(self.buffer)
        self.loss = loss
        self.ledger: AmplificationLedger | None = None  # set on a server's guarded sockets
        self.port_claim: socket.socket | None = None  # claim_port's, closed with the socket
        self._sendto = sock.sendto
        self._sendmsg = sock.sendmsg
        self._recvfrom_into = sock.recvfrom_into
        # runs of datagrams in one GSO send (send_segments); the destinations whose runs the
        # kernel refused go one datagram at a time
        self.gso = gso and gso_supported(sock)
        self.gso_refused: set[Any] = set()
        # the step's queued frames (queue/flush): address -> [run, segment length, datagrams]
        # (an agent's step calls flush() only when some are: an empty one's call a step)
        self.runs: dict[Any, list[Any]] = {}
        # coalesced receives (UDP GRO): the rest of the last one, handed out a datagram a call
        self.gro = gro and _enable_gro(sock)
        self._recvmsg_into = sock.recvmsg_into
        self._buffers = [self.buffer]
        self.gro_segment = 0  # the coalesced datagrams' length while some are left, else 0
        self._segment_at = 0
        self._segment_end = 0
        self._segment_source: Any = None
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data: Any, address: Any) -> None:
        """Send one datagram; failures and short sends are counted, not raised."""
        counters = self.counters
        ledger = self.ledger
        if ledger is not None and not ledger.may_send(
            host_key(address), len(data), frame_session_id(data) if ledger.trusted else None
        ):
            counters.amplification_drops += 1
            return
        if self.runs:
            self._send_open_run(address)
        self._send_unguarded(data, address)

    def queue(self, data: Any, address: Any) -> None:
        """:meth:`send`, perhaps later in this step: the datagram joins the run open to
        ``address`` (copied: ``data`` may be reused once this returns), sent with it as one
        GSO send when the run is full, when a frame of another length ends it, or at
        :meth:`flush`, which the caller's step must reach. Admitted or dropped by the ledger
        now, counted as :meth:`send` counts. Without GSO to ``address``, sent now."""
        ledger = self.ledger
        if ledger is not None:
            # a trusted session's frame (our sessions' every SM and heartbeat) passes without
            # a Python call: frame_session_id and may_send's first check, inline (two calls
            # an idle datagram sent; issue 31)
            host = host_key(address)
            trusted = ledger.trusted
            offset = (
                _SESSION_OFFSET.get(data[6] | (data[7] << 8))
                if trusted and len(data) >= 16
                else None
            )
            if (offset is None or (host, _i32_from(data, offset)[0]) not in trusted) and (
                not ledger.may_send(host, len(data))
            ):
                self.counters.amplification_drops += 1
                return
        if not self.gso or address in self.gso_refused:
            self._send_unguarded(data, address)
            return
        runs = self.runs
        run = runs.get(address)
        length = len(data)
        if run is None:
            runs[address] = [bytearray(data), length, 1]
            return
        buf = run[0]
        segment = run[1]
        if length > segment or len(buf) + length > MAX_RUN_BYTES:
            del runs[address]  # a longer datagram starts a run of its own
            self._send_run(buf, segment, run[2], address)
            runs[address] = [bytearray(data), length, 1]
            return
        buf += data
        count = run[2] + 1
        if length < segment or count >= MAX_SEGMENTS:  # a shorter one can only be the last
            del runs[address]
            self._send_run(buf, segment, count, address)
        else:
            run[2] = count

    def flush(self) -> None:
        """Send every run :meth:`queue` left open (the end of the step that queued them)."""
        runs = self.runs
        if runs:
            self.runs = {}
            for address, (buf, segment, count) in runs.items():
                self._send_run(buf, segment, count, address)

    def _send_open_run(self, address: Any) -> None:
        """The run open to ``address``, sent before anything else goes there."""
        run = self.runs.pop(address, None)
        if run is not None:
            self._send_run(run[0], run[1], run[2], address)

    def _send_run(self, data: Any, segment_length: int, segments: int, address: Any) -> None:
        """Datagrams the ledger admitted: one GSO send, or one ``sendto`` for a single one."""
        if segments == 1:
            self._send_unguarded(data, address)
            return
        counters = self.counters
        length = len(data)
        try:
            sent = self._sendmsg(
                (data,), ((_SOL_UDP, _UDP_SEGMENT, _GSO_SIZE.pack(segment_length)),), 0, address
            )
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                counters.short_sends += segments
            elif exc.errno in _GSO_REFUSED:
                counters.gso_fallbacks += 1
                refused = self.gso_refused
                if len(refused) >= GSO_REFUSED_MAX:
                    refused.clear()
                refused.add(address)
                for at in range(0, length, segment_length):
                    self._send_unguarded(data[at : at + segment_length], address)
            else:
                # refused outright (EPERM, EACCES, an unreachable network): every datagram of
                # the run is lost, counted as :meth:`send` counts each (one a run hid them)
                counters.send_errors += segments
                counters.errors += segments
            return
        counters.gso_sends += 1
        counters.datagrams_sent += segments
        counters.bytes_sent += sent
        if sent != length:
            counters.short_sends += 1

    def send_segments(self, data: Any, segment_length: int, address: Any) -> None:
        """Send ``data`` as datagrams of ``segment_length`` bytes (the last may be shorter): in
        one GSO ``sendmsg`` where the kernel offers it, else one :meth:`send` each. Counted per
        datagram as :meth:`send` counts; a run the kernel refuses is counted in
        ``gso_fallbacks`` and sent one by one. An amplification ledger admits or drops a run
        whole."""
        length = len(data)
        if length <= segment_length:
            self.send(data, address)
            return
        if not self.gso or address in self.gso_refused:
            for at in range(0, length, segment_length):
                self.send(data[at : at + segment_length], address)
            return
        ledger = self.ledger
        if ledger is not None and not ledger.may_send(
            host_key(address), length, frame_session_id(data) if ledger.trusted else None
        ):
            self.counters.amplification_drops += 1
            return
        if self.runs:
            self._send_open_run(address)
        self._send_run(data, segment_length, -(-length // segment_length), address)

    def _send_unguarded(self, data: Any, address: Any) -> None:
        """:meth:`send` past the ledger (a run it admitted whole, sent one by one)."""
        counters = self.counters
        try:
            sent = self._sendto(data, address)
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                counters.short_sends += 1
            else:
                counters.send_errors += 1
                counters.errors += 1
            return
        counters.datagrams_sent += 1
        counters.bytes_sent += sent
        if sent != len(data):
            counters.short_sends += 1

    def receive(self) -> tuple[Any, int, Any] | None:
        """One datagram: ``(buffer, length, source)`` or None when nothing is waiting.

        The buffer is reused by the next call.
        """
        if self.loss is not None:
            return self.loss.receive(self)
        return self.raw_receive()

    def drain(self, handle: Any, now_ns: int, transmit: Any, limit: int) -> int:
        """Up to ``limit`` datagrams, each handed to ``handle(buffer, length, source, now_ns,
        transmit)`` as it is read (the buffer is reused by the next); how many were read. A
        :class:`RemoteProtocolError` from ``handle`` is counted in ``invalid_frames`` and the
        next datagram read. Without a loss hook or GRO, :meth:`raw_receive`'s work inline: one
        Python call a datagram (the handler's), not two (issue 31: an idle stream's every
        status message and heartbeat is a receive)."""
        counters = self.counters
        if self.loss is not None or self.gro:
            receive = self.raw_receive if self.loss is None else self.receive
            read = 0
            while read < limit:
                got = receive()
                if got is None:
                    break
                read += 1
                try:
                    handle(got[0], got[1], got[2], now_ns, transmit)
                except RemoteProtocolError:
                    counters.invalid_frames += 1
            return read
        recv = self._recvfrom_into
        buffer = self.buffer
        view = self.view
        ledger = self.ledger
        read = 0
        while read < limit:
            try:
                length, source = recv(buffer)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno not in _TRANSIENT and not self.closed:
                    counters.receive_errors += 1
                    counters.errors += 1
                break
            read += 1
            counters.datagrams_received += 1
            counters.bytes_received += length
            if ledger is not None:
                # ledger.on_receive, inline (a Python call a datagram received; issue 31)
                host = host_key(source)
                received = ledger.received
                if host in received:
                    received[host] += length
                else:
                    ledger.on_receive(host, length)
            try:
                handle(view, length, source, now_ns, transmit)
            except RemoteProtocolError:
                counters.invalid_frames += 1
        return read

    def raw_receive(self) -> tuple[Any, int, Any] | None:
        if self.gro:
            return self._receive_coalesced()
        try:
            length, source = self._recvfrom_into(self.buffer)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            if exc.errno in _TRANSIENT or self.closed:
                return None  # (closed: a dedicated socket the conductor closed under us)
            self.counters.receive_errors += 1
            self.counters.errors += 1
            return None
        counters = self.counters
        counters.datagrams_received += 1
        counters.bytes_received += length
        if self.ledger is not None:
            self.ledger.on_receive(host_key(source), length)
        return self.view, length, source

    def _receive_coalesced(self) -> tuple[Any, int, Any] | None:
        """:meth:`raw_receive` with UDP GRO: the next datagram of the last coalesced receive,
        else the next receive (one datagram, or several coalesced: the first of them)."""
        counters = self.counters
        segment = self.gro_segment
        if segment:
            at = self._segment_at
            end = self._segment_end
            stop = at + segment
            if stop >= end:
                stop = end
                self.gro_segment = 0
            else:
                self._segment_at = stop
            counters.datagrams_received += 1
            return self.view[at:stop], stop - at, self._segment_source
        while True:
            try:
                length, ancillary, flags, source = self._recvmsg_into(self._buffers, _GRO_ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                if exc.errno in _TRANSIENT:
                    return None
                counters.receive_errors += 1
                counters.errors += 1
                return None
            if flags & socket.MSG_TRUNC:  # coalesced past the buffer: lost (NAKed again)
                counters.receive_errors += 1
                continue
            break
        counters.datagrams_received += 1
        counters.bytes_received += length
        if self.ledger is not None:
            self.ledger.on_receive(host_key(source), length)
        for level, kind, data in ancillary:
            if level == _SOL_UDP and kind == _UDP_GRO and len(data) >= _GRO_SIZE.size:
                segment = _GRO_SIZE.unpack_from(data)[0]
                if 0 < segment < length:
                    counters.gro_receives += 1
                    self.gro_segment = segment
                    self._segment_at = segment
                    self._segment_end = length
                    self._segment_source = source
                    return self.view[:segment], segment, source
        return self.view, length, source

    def close(self) -> None:
        """Close the socket; what the step queued goes first (a closed publication's
        end-of-stream heartbeat, queued in the step that frees its endpoint)."""
        if not self.closed:
            self.flush()
            self.closed = True
            self.sock.close()
            if self.port_claim is not None:
                self.port_claim.close()


def claim_port(bind: Endpoint) -> socket.socket | None:
    """Claim UDP port ``bind.port`` for a server's ``SO_REUSEPORT`` socket, atomically: an
    abstract Unix socket named after the port (Linux; per network namespace, as the port is,
    released when closed or when the process dies, nothing on disk). A second claim of the port
    (any address: a wildcard and a specific one overlap) raises :class:`PortInUseError` while
    the first is held, so two servers started at the same moment cannot both pass the check of
    :func:`port_taken` and share the port (the second silently receiving nothing)."""
    if not sys.platform.startswith("linux"):
        return None  # no abstract names: the check alone, as before
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        lock.bind(f"\0aeron-spark-udp-port-{bind.port}")
    except OSError as exc:
        lock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(bind.host, bind.port) from None
        raise DriverError(f"cannot claim UDP port {bind.port}: {exc}") from exc
    return lock


def port_taken(bind: Endpoint) -> bool:
    """Whether a plain socket (no ``SO_REUSEPORT``) cannot bind ``bind`` now: checked before
    a ``SO_REUSEPORT`` socket binds a fixed port, which would otherwise share it silently with
    another such socket of the same user (a second server started on the same port)."""
    if bind.port == 0:
        return False
    with socket.socket(bind.family, socket.SOCK_DGRAM) as probe:
        try:
            if bind.family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            probe.bind(_sockaddr(bind))
        except OSError:
            return True
    return False


def bind_endpoint_for(remote: Endpoint) -> Endpoint:
    """An ephemeral local address of the same family as ``remote`` (a publication's socket)."""
    if remote.family == socket.AF_INET6:
        return Endpoint("::", 0, socket.AF_INET6)
    return Endpoint("0.0.0.0", 0, socket.AF_INET)


def destination_address(remote: Endpoint) -> tuple[Any, ...]:
    return _sockaddr(remote)


def receiver_window_for(window: int, endpoint: UdpEndpoint) -> int:
    """The receiver window, at most what the socket's receive buffer holds (as Aeron requires):
    a window the kernel cannot buffer turns a burst into socket overflows, i.e. loss. Linux
    reports twice the buffer asked for and charges each datagram more than its payload, so
    half of the reported length is what fits."""
    try:
        buffered = endpoint.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
    except OSError:
        return window
    return max(min(window, buffered), 64 * 1024)
