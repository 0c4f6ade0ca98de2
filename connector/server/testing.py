"""Testing helpers for the stream server (shipped like ``trio.testing``): reading replayed
messages back with the transport's own term reader, and running a server in a child process."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aeron_spark.connector.client import ClientSettings, ReplayBlock, StreamClient
from aeron_spark.connector.server.config import ServerConfig
from aeron_spark.connector.server.framing import Framer
from aeron_spark.connector.server.server import StreamServer
from aeron_spark.connector.server.stat import read_snapshot
from aeron_spark.handshake.keystore import client_public_key_hex
from aeron_spark.transport import Driver, DriverConfig, Publication
from aeron_spark.transport.archive import RecordingStore
from aeron_spark.transport.protocol.frames import DataFlags
from aeron_spark.transport.protocol.logbuffer import LogGeometry
from aeron_spark.transport.protocol.term import FragmentAssembler, Header, read_term
from aeron_spark.transport.testing import free_udp_port, sweep_dead


@dataclass(frozen=True)
class Message:
    position: int  # start of the message's first frame
    end_position: int  # end of its last frame (aligned)
    payload: bytes
    reserved_value: int


_BEGIN = int(DataFlags.BEGIN)
_END = int(DataFlags.END)


def messages_of(
    blocks: Iterable[ReplayBlock], initial_term_id: int, term_length: int
) -> list[Message]:
    """Reassembled messages with their positions, read with the transport's term reader."""
    shift = term_length.bit_length() - 1
    out: list[Message] = []
    starts: dict[int, int] = {}

    def on_fragment(payload: memoryview, header: Header) -> None:
        start = starts.pop(header.session_id, None)
        out.append(
            Message(
                header.fragment_position if start is None else start,
                header.position,
                bytes(payload),
                header.reserved_value,
            )
        )

    assembler = FragmentAssembler(on_fragment)

    def tracking(payload: memoryview, header: Header) -> None:
        # the flags as plain ints: ``int & DataFlags.X`` made an enum each time (a fifth of the
        # time of reading back the 100,000s of messages of test_server_crash)
        flags = header.flags
        if flags & _BEGIN and not flags & _END:  # a fragmented message's BEGIN
            starts[header.session_id] = header.fragment_position
        assembler(payload, header)

    for block in blocks:
        data = memoryview(bytes(block.data))
        header = Header(initial_term_id, shift)
        offset = 0
        while offset < len(data):
            _, offset_after = read_term(data, offset, tracking, 1 << 30, header)
            assert offset_after > offset, "replay block holds an incomplete frame"
            offset = offset_after
    return out


def client_for(endpoint: str, encryption: bool = False, timeout_s: float = 30.0) -> StreamClient:
    return StreamClient.connect(
        ClientSettings(endpoint=endpoint, encryption=encryption, timeout_s=timeout_s)
    )


@contextlib.contextmanager
def server_process(
    directory: str, extra: Iterable[str] = (), nofile: tuple[int, int] | None = None
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A server in its own process on a free port; yields (process, endpoint). ``nofile``:
    the ``(soft, hard)`` RLIMIT_NOFILE it starts with (as ``prlimit --nofile`` would set)."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

    code = (
        "import sys; from aeron_spark.connector.server import server_main; "
        "sys.exit(server_main(sys.argv[1:]))"
    )
    log_path = f"{directory}.{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                "--dir",
                directory,
                "--port",
                "0",
                "--no-encryption",
                *extra,
            ],
            stdout=log,
            stderr=log,
            env=dict(os.environ),
            preexec_fn=limit if nofile is not None else None,
        )
    try:
        endpoint = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and endpoint is None and proc.poll() is None:
            with open(log_path) as fh:
                for line in fh.read().splitlines():
                    if "listening on" in line:
                        endpoint = line.split("listening on ")[1].split()[0]
            time.sleep(0.05)
        assert endpoint, (
            f"server did not start (exit {proc.poll()}): {open(log_path).read()[-2000:]}"
        )
        yield proc, endpoint
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        sweep_dead()  # what the killed server's driver left in /dev/shm (its IPC reply log)
        # the log lies beside the directory, which may be a tmpfs mount point or the temporary
        # directory itself: it goes with the server (runs left one per server in /tmp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log_path)


# A client process holding N sessions to ENDPOINT: each publishes one message to STREAM, then
# it prints "ready"; each line read from stdin makes every session list STREAM's recordings and
# prints {"recordings": [count per session], "reconnects": [per session]} (one JSON line).
_CLIENT_PROCESS = """
import json, sys
from aeron_spark.connector.client import ClientSettings, StreamClient
endpoint, n, stream = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
settings = ClientSettings(endpoint=endpoint, encryption=False, timeout_s=60)
clients = [StreamClient.connect(settings) for _ in range(n)]
for c in clients:
    c.publish(stream, [b"x"])
print("ready", flush=True)
for line in sys.stdin:
    got = [len(c.list_recordings([stream])) for c in clients]
    again = [c.reconnects for c in clients]
    print(json.dumps({"recordings": got, "reconnects": again}), flush=True)
"""


@dataclass
class ClientProcess:
    """A client in a process of its own (:func:`client_process`): kill it, stop it, ask it."""

    proc: subprocess.Popen[str]

    def readline(self, timeout_s: float = 120.0) -> str:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout_s)
        assert ready, f"the client process said nothing in {timeout_s} s (exit {self.proc.poll()})"
        line = out.readline()
        assert line, f"the client process ended (exit {self.proc.wait(30)})"
        return line.strip()

    def ask(self) -> dict[str, list[int]]:
        """Every session lists the stream's recordings: what each got, and its reconnects."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("list\n")
        self.proc.stdin.flush()
        answer: dict[str, list[int]] = json.loads(self.readline())
        return answer


@contextlib.contextmanager
def client_process(endpoint: str, sessions: int, stream: int) -> Iterator[ClientProcess]:
    """A plain (unsealed) client process with ``sessions`` sessions, each having published
    one message to ``stream``; killed (resumed first if stopped) at the end, what its driver
    left in /dev/shm swept."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLIENT_PROCESS, endpoint, str(sessions), str(stream)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    client = ClientProcess(proc)
    try:
        assert client.readline() == "ready"
        yield client
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process must be able to die
            proc.kill()
        proc.wait(30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        sweep_dead()  # a killed client's IPC logs


@dataclass(frozen=True)
class UdpSocketRow:
    """One IPv4 UDP socket as ``/proc/net/udp`` shows it: the kernel's own count of the
    datagrams it dropped for it (its receive buffer was full)."""

    inode: int
    local: tuple[str, int]
    remote: tuple[str, int]  # ("0.0.0.0", 0): not connected
    drops: int

    @property
    def connected(self) -> bool:
        return self.remote != ("0.0.0.0", 0)


def _proc_address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    return socket.inet_ntoa(int(host, 16).to_bytes(4, "little")), int(port, 16)


def udp_sockets_of(pid: int, port: int) -> list[UdpSocketRow]:
    """The IPv4 UDP sockets process ``pid`` holds bound to local ``port``."""
    inodes = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    rows = []
    with open("/proc/net/udp") as fh:
        next(fh)
        for line in fh:
            cols = line.split()
            local = _proc_address(cols[1])
            if int(cols[9]) in inodes and local[1] == port:
                rows.append(
                    UdpSocketRow(int(cols[9]), local, _proc_address(cols[2]), int(cols[-1]))
                )
    return rows


@dataclass
class KeyedServer:
    """A server process run with ``--authorized-keys``: one client key store per name."""

    proc: subprocess.Popen
    endpoint: str
    key_stores: dict[str, str]

    def client(self, name: str, timeout_s: float = 120.0) -> StreamClient:
        """A client holding ``name``'s key (unencrypted, as the server runs)."""
        return StreamClient.connect(
            ClientSettings(
                endpoint=self.endpoint,
                encryption=False,
                key_store_dir=self.key_stores[name],
                timeout_s=timeout_s,
            )
        )


def client_key(directory: str | os.PathLike[str], name: str) -> tuple[str, str]:
    """A client key store (``keys-<name>`` under ``directory``) and its public key (hex)."""
    store = os.path.join(directory, f"keys-{name}")
    return store, client_public_key_hex(store)


def authorized_keys(
    directory: str | os.PathLike[str], grants: dict[str, str]
) -> tuple[Path, dict[str, str]]:
    """Write ``directory``'s ``authorized_keys`` granting each name of ``grants`` its permissions
    (``{"reader": "read=10", "ops": "read=* write=* admin"}``) with the client key store
    :func:`client_key` makes for it (or finds there): the file and each name's key store."""
    stores = {}
    lines = []
    for name, permissions in grants.items():
        stores[name], key = client_key(directory, name)
        lines.append(f"{key} {name} {permissions}\n")
    path = Path(directory) / "authorized_keys"
    path.write_text("".join(lines))
    return path, stores


def authorizing_server(
    directory: str | os.PathLike[str], keys_file: str | os.PathLike[str], **config: Any
) -> StreamServer:
    """An in-process server (started; ``srv`` and ``server-keys`` under ``directory``, terms of
    1 MiB unless ``term_length``) that takes only the client keys ``keys_file`` lists."""
    config.setdefault("term_length", 1 << 20)
    return StreamServer(
        ServerConfig(
            directory=os.path.join(directory, "srv"),
            port=0,
            key_store_dir=os.path.join(directory, "server-keys"),
            authorized_keys_file=os.fspath(keys_file),
            **config,
        )
    ).start()


@contextlib.contextmanager
def ingest_publication(
    directory: str | os.PathLike[str], stream_id: int = 33, **config: Any
) -> Iterator[tuple[StreamServer, Publication]]:
    """An in-process server (``srv`` under ``directory``, unencrypted; ``config``: more of its
    settings) recording ``stream_id`` from its ingest channel on a free loopback port, and a
    plain publication to that channel (no handshake) from a driver of its own."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    settings = ServerConfig(
        directory=os.path.join(directory, "srv"),
        port=0,
        encryption=False,
        ingest_channel=channel,
        ingest_stream_ids=(stream_id,),
        **config,
    )
    with StreamServer(settings) as server, Driver(DriverConfig()) as driver:
        yield server, driver.add_publication(channel, stream_id)


@contextlib.contextmanager
def keyed_server(
    directory: str, grants: dict[str, str], extra: Iterable[str] = ()
) -> Iterator[KeyedServer]:
    """:func:`server_process` with an authorized keys file granting each name of ``grants``
    its permissions (``{"reader": "read=10", "ops": "read=* write=* admin"}``); the key stores,
    the keys file and the server's own key store are made under ``directory``."""
    os.makedirs(directory, exist_ok=True)
    keys_file, stores = authorized_keys(directory, grants)
    options = [
        "--authorized-keys",
        str(keys_file),
        "--key-store",
        os.path.join(directory, "server-keys"),
        *extra,
    ]
    with server_process(os.path.join(directory, "srv"), options) as (proc, endpoint):
        yield KeyedServer(proc, endpoint, stores)


def write_session_recordings(
    directory: str,
    count: int,
    messages: int,
    stream_of: Callable[[int], int] = lambda n: 5,
    term_length: int = 64 * 1024,
) -> None:
    """``count`` finished recordings in a server directory, written as a server writes them (a
    session's publish, mtu 1408): the ``n``-th on stream ``stream_of(n)`` and session ``n + 1``,
    holding ``messages`` messages ``b"m<n>"``. A catalog to start a server on."""
    store = RecordingStore(directory, fsync=False, max_open_files=8)
    for n in range(count):
        stream = stream_of(n)
        rec = store.create(
            stream, n + 1, "session:test", 0, 0, 0, term_length, 1408, time.time_ns()
        )
        framer = Framer(LogGeometry(term_length, 1408, 0), n + 1, stream, 0)
        for position, block in framer.frame([b"m%d" % n] * messages, None):
            rec.append(block, position, time.time_ns())
        rec.stop(time.time_ns())
    store.close(time.time_ns())


def stat_snapshot_after(directory: str, after_s: float, timeout_s: float = 60.0) -> dict[str, Any]:
    """The server's stat snapshot in ``directory`` once it has been written (or confirmed)
    after ``after_s`` (``time.time()``); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            snapshot = read_snapshot(directory)
        except Exception:  # noqa: BLE001 - not written yet
            snapshot = {}
        if snapshot.get("written_at_s", 0) > after_s:
            return snapshot
        assert time.monotonic() < deadline, f"the stat snapshot was not written in {timeout_s} s"
        time.sleep(0.1)
