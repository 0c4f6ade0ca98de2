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
