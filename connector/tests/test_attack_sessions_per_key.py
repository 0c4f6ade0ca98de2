"""Attack on "what one client may cost others" with ``--authorized-keys``: the session limits
were per server (``--max-clients``, 1024) and per IP address (``--max-per-address``, 256), never
per client key, so one listed key (read permission on one stream is enough) that opened sessions
from four addresses (or four hosts it runs on) held every session the server had, and every
other key was refused (``ServerFullError``) for as long as it kept them: sessions cost it almost
nothing (40 idle sessions: the server from 47 to 49 MiB resident) and keepalives hold them.

Fixed: ``--max-per-key`` (default half of ``--max-clients``), checked in the handshake server's
admission (``handshake/machine.py`` ``ServerCore._admission``) before anything is allocated, as
``max_per_address`` is: the key's next session is refused with ``TOO_MANY_FOR_KEY``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aeron_spark.connector.client import ClientSettings, StreamClient
from aeron_spark.connector.errors import ServerUnavailableError, SessionLostError
from aeron_spark.connector.server.testing import server_process
from aeron_spark.handshake import TooManyForKeyError
from aeron_spark.handshake.keystore import client_public_key_hex


def test_attack_one_key_cannot_hold_every_session(tmp_path: Path) -> None:
    hog, other = str(tmp_path / "keys-hog"), str(tmp_path / "keys-other")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{client_public_key_hex(hog)} hog read=10\n{client_public_key_hex(other)} other read=10\n"
    )
    options = [
        "--authorized-keys",
        str(keys),
        "--key-store",
        str(tmp_path / "server-keys"),
        "--max-clients",
        "8",
    ]
    with server_process(str(tmp_path / "srv"), options) as (_proc, endpoint):

        def connect(key_store: str) -> StreamClient:
            settings = ClientSettings(
                endpoint=endpoint, encryption=False, key_store_dir=key_store, timeout_s=20
            )
            return StreamClient.connect(settings)

        held = []
        try:
            for _ in range(8):  # as many as the server lets it have
                try:
                    held.append(connect(hog))
                    held[-1].call("keepalive")
                except ServerUnavailableError as exc:  # refused: the key's share is full
                    refusal = exc
                    break
            else:
                pytest.fail("one key took every session of the server")
            # the default share: half of --max-clients, and the refusal says which limit
            assert len(held) == 4
            assert "TOO_MANY_FOR_KEY" in str(refusal)
            # a refusal, not retried: not a SessionLostError (as SERVER_FULL is)
            assert isinstance(refusal.__cause__, TooManyForKeyError)
            assert not isinstance(refusal, SessionLostError)
            assert "already has 4 sessions" in str(refusal)
            with connect(other) as c:  # another key still gets a session
                assert c.call("keepalive") is None
        finally:
            for c in held:
                c.close()
