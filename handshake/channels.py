"""The channels of a handshake and its sessions, for UDP and for IPC (one place, one code path).

UDP (``H`` = host, ``P`` = port, ``C`` = control port)::

    HELLO in     aeron:udp?endpoint=H:P                                  HANDSHAKE_STREAM_ID
    replies      aeron:udp?control=H:C|control-mode=dynamic|session-id=<HELLO image's>
                     |destination-host=<the HELLO image's address>|max-destinations=1
                                                                         REPLY_STREAM_ID
    client->us   aeron:udp?endpoint=H:P|session-id=<secret>              <per-client stream>
                     (read from a socket on H:P connected to the client, see below)
    us->client   aeron:udp?control=H:C|control-mode=dynamic|session-id=<secret>
                     |destination-host=<the HELLO's address>|max-destinations=1
    (a session's four channels also carry idle-heartbeat-interval / idle-sm-interval)

Every HELLO image (a client process's HELLO publication) gets a reply publication of its own,
with the image's session id: its one destination is the first subscription at the image's
address whose SM names that session id (the client's reply subscription names its HELLO
publication's), so a reply reaches the host that sent the HELLO and nobody else. A session's
publication likewise takes exactly one destination: the first SM carrying its own secret session
id from the address whose HELLO opened it (see ``transport/protocol/publication.py``).

Sessions' datagrams and the public ports (UDP): the HELLO subscription opens the socket on
``H:P`` with ``dedicated-sources=N`` (``SO_REUSEPORT``), the control publication the one on
``H:C``; once a session is established the server asks the driver for a socket of its own for
the client on each: on ``H:P`` connected to the address and port the client sends from (its
HELLO and session publications share one socket, so one per client process), on ``H:C`` to the
one it receives on (its reply and session subscriptions share one socket), which its SMs and
NAKs come from. The kernel hands a connected socket every datagram of its 4-tuple, so a flood
of a public port (anyone may send there) overflows the public socket's buffer, not the
sessions'. Why this and not a third port announced in WELCOME: nothing changes on the wire (any
client, old ones included, and a plain Aeron publication see the same ports; no protocol version
bump), a session's socket is reachable only from the client's own address and port (a third
port would be one more public socket, flooded as easily), and it costs two descriptors per client
process, bounded (``max_dedicated_sockets`` in all, both ports, and a share of it per client
address and per client key; past it, or with no descriptor left, a session shares the public
socket as before, counted ``dedicated_sockets_refused``).

IPC (same host, same driver directory; a client names the server by its UDP port, ``ipc:P``)::

    HELLO in     aeron:ipc    HANDSHAKE_STREAM_ID ^ P
    replies      aeron:ipc    REPLY_STREAM_ID ^ P
    client->us   aeron:ipc?session-id=<secret>     us->client   aeron:ipc?session-id=<secret>
"""

from __future__ import annotations

from dataclasses import dataclass

from aeron_spark.handshake.config import HANDSHAKE_STREAM_ID, REPLY_STREAM_ID
from aeron_spark.handshake.messages import SessionDetails

HANDSHAKE_TERM_LENGTH = 64 * 1024
# The largest mtu a HELLO or reply publication may announce: the handshake streams carry small
# messages in small terms, so the public HELLO subscription refuses any bigger SETUP
# (``max-term-length``/``max-mtu``): a stranger cannot make the server map and scan a big log.
HANDSHAKE_MAX_MTU = 8192
HELLO_IMAGES_PER_SOURCE = 4
_HANDSHAKE_BOUNDS = f"max-term-length={HANDSHAKE_TERM_LENGTH}|max-mtu={HANDSHAKE_MAX_MTU}"
# The server's two sockets send an address that has not completed a handshake at most this
# many times the bytes it received from it (a spoofer cannot turn the server into a reflector).
MAX_AMPLIFICATION = 3
_GUARD = f"|max-amplification={MAX_AMPLIFICATION}"
# A session's idle control cadence (both ends are this driver): after the first heartbeat / SM
# that follows data at Aeron's 100 ms / 200 ms, an idle session's heartbeats go 2 s apart and its
# SMs 1 s apart (1.5 datagrams a second each way instead of 15; issue 31). An image still hears
# five heartbeats in its 10 s liveness (the longest interval a channel may ask, a fifth of it)
# and a publication five SMs in its 5 s connection timeout: the SMs are what each end's liveness
# reads first (a dead server is noticed by its client's publication within the 5 s, a session's
# lease is renewed from the newest of either), so they keep a second. A session's datagrams go
# through a socket of its own, which a flood of the public port does not overflow (see below).
SESSION_IDLE_HEARTBEAT = "2s"
SESSION_IDLE_SM = "1s"
_IDLE_PUB = f"|idle-heartbeat-interval={SESSION_IDLE_HEARTBEAT}"
_IDLE_SUB = f"|idle-sm-interval={SESSION_IDLE_SM}"


def _h(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True, slots=True)
class Channels:
    media: str  # "udp" or "ipc"
    host: str
    port: int
    control_port: int
    bind: str = "127.0.0.1"  # where a UDP client binds its subscriptions

    @property
    def hello_stream(self) -> int:
        return HANDSHAKE_STREAM_ID ^ self.port if self.media == "ipc" else HANDSHAKE_STREAM_ID

    @property
    def reply_stream(self) -> int:
        return REPLY_STREAM_ID ^ self.port if self.media == "ipc" else REPLY_STREAM_ID

    # -------------------------------------------------------------- handshake channels

    def hello_sub(
        self,
        max_images: int = 0,
        max_images_per_address: int = 0,
        setups_per_s: int = 0,
        dedicated: int = 0,
    ) -> str:
        """The server's public HELLO subscription: small terms only, one HELLO image per client
        socket (a client publishes one HELLO per socket; allowing a few tolerates a retry), at
        most ``max_images`` at once and ``max_images_per_address`` from one IP address (an
        IPv6 /64 counts as one), at most ``setups_per_s`` new ones a second from one /24 or /64
        (0: no limit). It opens the
        port's socket, which every session's subscription shares; ``dedicated``: that many
        client addresses with a live session may get a connected socket of their own on the
        port (``dedicated-sources``, ``Driver.dedicate_socket``)."""
        if self.media == "ipc":
            return "aeron:ipc"
        limits = "".join(
            f"|{key}={value}"
            for key, value in (
                ("max-images", max_images),
                ("max-images-per-source", HELLO_IMAGES_PER_SOURCE),
                ("max-images-per-address", max_images_per_address),
                ("setups-per-prefix-per-s", setups_per_s),
                ("evict-unvouched", "true"),
                ("dedicated-sources", dedicated),
            )
            if value
        )
        return f"aeron:udp?endpoint={_h(self.host)}:{self.port}|{_HANDSHAKE_BOUNDS}{limits}{_GUARD}"

    def hello_pub(self) -> str:
        if self.media == "ipc":
            return f"aeron:ipc?term-length={HANDSHAKE_TERM_LENGTH}"
        return f"aeron:udp?endpoint={_h(self.host)}:{self.port}|term-length={HANDSHAKE_TERM_LENGTH}"

    def reply_pub(
        self, session_id: int | None = None, client_host: str = "", dedicated: int = 0
    ) -> str:
        """The server's replies: over IPC one publication for all; over UDP one per HELLO
        image, with the image's ``session_id``, whose one destination is at ``client_host``
        (without: the publication that holds the control port, which takes no destination;
        ``dedicated``: that many clients with a live session may get a connected socket of
        their own on the control port, for their SMs and NAKs, as on the port)."""
        if self.media == "ipc":
            return f"aeron:ipc?term-length={HANDSHAKE_TERM_LENGTH}"
        if session_id is None:
            own = f"|dedicated-sources={dedicated}" if dedicated else ""
            return (
                f"aeron:udp?control={_h(self.host)}:{self.control_port}|control-mode=dynamic"
                f"|term-length={HANDSHAKE_TERM_LENGTH}|destination-host=none{own}{_GUARD}"
            )
        return (
            f"aeron:udp?control={_h(self.host)}:{self.control_port}|control-mode=dynamic"
            f"|session-id={session_id}|term-length={HANDSHAKE_TERM_LENGTH}"
            f"|destination-host={_h(client_host)}|max-destinations=1{_GUARD}"
        )

    def reply_sub(self, session_id: int | None = None) -> str:
        """The client's replies; over UDP those of its HELLO publication, ``session_id``."""
        if self.media == "ipc":
            return "aeron:ipc"
        only = f"|session-id={session_id}" if session_id is not None else ""
        return (
            f"aeron:udp?endpoint={_h(self.bind)}:0|control={_h(self.host)}:{self.control_port}"
            f"|control-mode=dynamic{only}|{_HANDSHAKE_BOUNDS}"
        )

    # -------------------------------------------------------------- a session's pair

    def c2s_pub(self, d: SessionDetails) -> str:
        if self.media == "ipc":
            return (
                f"aeron:ipc?session-id={d.c2s_session_id}|mtu={d.mtu}|term-length={d.term_length}"
            )
        return (
            f"aeron:udp?endpoint={_h(self.host)}:{self.port}|session-id={d.c2s_session_id}"
            f"|mtu={d.mtu}|term-length={d.term_length}{_IDLE_PUB}"
        )

    def c2s_sub(self, d: SessionDetails, window: int) -> str:
        if self.media == "ipc":
            return f"aeron:ipc?session-id={d.c2s_session_id}"
        return (
            f"aeron:udp?endpoint={_h(self.host)}:{self.port}|session-id={d.c2s_session_id}"
            f"|rcv-wnd={window}|max-term-length={d.term_length}|max-mtu={d.mtu}{_GUARD}{_IDLE_SUB}"
        )

    def s2c_pub(self, d: SessionDetails, client_host: str | None = None) -> str:
        """The server's publication of a session; over UDP its one destination is the client
        at ``client_host`` (the HELLO's address) whose SM names the secret session id."""
        if self.media == "ipc":
            return (
                f"aeron:ipc?session-id={d.s2c_session_id}|mtu={d.mtu}|term-length={d.term_length}"
            )
        only = f"|destination-host={_h(client_host)}|max-destinations=1" if client_host else ""
        return (
            f"aeron:udp?control={_h(self.host)}:{self.control_port}|control-mode=dynamic"
            f"|session-id={d.s2c_session_id}|mtu={d.mtu}|term-length={d.term_length}{only}{_GUARD}"
            f"{_IDLE_PUB}"
        )

    def s2c_sub(self, d: SessionDetails, window: int, port: int = 0) -> str:
        """The client's session subscription; ``port``: the local port of its reply
        subscription, whose socket it then shares (0: a socket of its own)."""
        if self.media == "ipc":
            return f"aeron:ipc?session-id={d.s2c_session_id}"
        return (
            f"aeron:udp?endpoint={_h(self.bind)}:{port}|control={_h(self.host)}:{self.control_port}"
            f"|control-mode=dynamic|session-id={d.s2c_session_id}|rcv-wnd={window}"
            f"|max-term-length={d.term_length}|max-mtu={d.mtu}{_IDLE_SUB}"
        )


__all__ = ["Channels"]
