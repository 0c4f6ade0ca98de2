"""An honest client leaves no trace in the counters of what strangers sent (issue 33, item 9).

``status_messages_refused`` is the spoofing defence's counter (README, Security model): after one
clean publish it showed 1, because a handshake client's reply subscription asks the server's
reply publication for a SETUP before its HELLO arrives, while its host is not allowed yet. The
request is held and answered as soon as the HELLO makes the host allowed: it is counted as
deferred, and as refused only when its host is not allowed in time.
"""

from __future__ import annotations

import io
import json

from aeron_spark.connector.server import stat_main
from aeron_spark.connector.server.testing import client_for, server_process
from aeron_spark.counters import REGISTRY, CounterType


def test_one_clean_publish_leaves_status_messages_refused_at_zero(tmp_path) -> None:
    with server_process(str(tmp_path / "srv")) as (_, endpoint):
        with client_for(endpoint) as client:
            client.publish(10, [b"tick %d" % i for i in range(1000)])
        out = io.StringIO()
        assert stat_main(["--endpoint", endpoint, "--once", "--json", "--no-encryption"], out) == 0
    handshake = json.loads(out.getvalue())["handshake"]
    assert handshake["status_messages_refused"] == 0, handshake
    # an early request (when the SM outruns the HELLO) is shown apart from refusals
    assert "status_messages_deferred" in handshake, handshake


def test_every_handshake_statistic_stat_shows_is_a_declared_counter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/architecture.md "Counters": every exported name is declared once in the registry.
    The handshake section of ``aeron-spark stat`` exported the HELLO images' statistics
    (``hello_images``, ``hello_images_waiting``, ``hello_images_without_hello``), the reply
    publications', ``pair_address_mismatches``, ``amplification_drops`` and the ``frames_*``
    counts without a declaration (main: undeclared); the text output lists them."""
    with server_process(str(tmp_path / "srv")) as (_, endpoint):
        with client_for(endpoint) as client:
            client.publish(10, [b"x"])
            args = ["--endpoint", endpoint, "--once", "--no-encryption"]
            out = io.StringIO()
            assert stat_main([*args, "--json"], out) == 0
            text = io.StringIO()
            assert stat_main(args, text) == 0
    handshake = json.loads(out.getvalue())["handshake"]
    undeclared = sorted(
        name for name in handshake if not any(REGISTRY.is_declared(t, name) for t in CounterType)
    )
    assert undeclared == [], undeclared
    assert handshake["hello_images"] >= 1  # the client's HELLO image, still open
    section = text.getvalue().split("\nhandshake\n", 1)[1].split("\n\n", 1)[0]
    listed = {line.split()[0] for line in section.splitlines()}
    for name in ("hello_images", "hello_images_waiting", "hello_images_without_hello"):
        assert name in listed, section
