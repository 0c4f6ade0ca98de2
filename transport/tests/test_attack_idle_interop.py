"""Attacks on the idle grid with the real Aeron (fifteenth session's idle-cost work): an idle
heartbeat spaced to a channel's ``idle-heartbeat-interval`` (at most 2 s, due on a 20 ms grid,
never later than asked) must keep a real Java subscriber's image alive at its default image
liveness (10 s), and a publication whose channel asks 2 s must not be left by a Java receiver
(whose status messages keep their 200 ms)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import aeron_peer  # noqa: E402
from test_interop_aeron import (  # noqa: E402
    _CONNECT_S,
    _DELIVERY_S,
    _UNAVAILABLE,
    JavaRealDriver,
    _assert_understood_everything,
    _channel,
    _check_real_image,
    _collect_messages,
    _offer_all,
    _start_real_driver,
    _start_real_subscriber,
    our_driver,  # noqa: F401 - fixtures
    our_drivers,  # noqa: F401
    real_stack,  # noqa: F401
)

from aeron_spark.transport import Driver  # noqa: E402
from aeron_spark.transport.testing import free_udp_port  # noqa: E402


def test_our_publication_idle_at_the_longest_interval_keeps_a_java_image_at_its_defaults(
    real_stack: contextlib.ExitStack,  # noqa: F811
    our_driver: Driver,  # noqa: F811
) -> None:
    """``idle-heartbeat-interval=2s`` (the longest allowed) on our side, a Java subscriber at
    the default 10 s image liveness: idle for 12 s, the image stays (no 'Unavailable image'),
    our publication stays connected and a message offered then arrives."""
    real_driver = _start_real_driver(real_stack, "java")
    port, stream_id = free_udp_port(), 1013
    real_sub = _start_real_subscriber(real_driver, _channel(port), stream_id)
    pub = our_driver.add_publication(_channel(port, **{"idle-heartbeat-interval": "2s"}), stream_id)
    try:
        assert pub.wait_until_connected(_CONNECT_S)
        _check_real_image(real_sub, pub, stream_id)
        _offer_all(pub, [b"before the idle spell"], _DELIVERY_S)
        assert _collect_messages(real_sub, 1, _DELIVERY_S)[0][2] == b"before the idle spell"
        time.sleep(0.5)  # the first heartbeat after data (100 ms) went
        sent, started = our_driver.counters.snapshot()["heartbeats_sent"], time.monotonic()
        idle_until = started + 12.0  # past the Java image's 10 s liveness
        while (line := real_sub.next_line(idle_until)) is not None:
            assert not _UNAVAILABLE.match(line), "the Java image timed out while we idled"
        sent = our_driver.counters.snapshot()["heartbeats_sent"] - sent
        idle_s = time.monotonic() - started  # 12 s, longer when a loaded machine is late
        # the spell was idle at the asked interval, one heartbeat each 2 s of the span measured
        # and 2 more (100 ms apart would be ~120; the bound was 8 in a span taken as 12 s)
        assert sent <= idle_s / 2 + 2, (sent, idle_s)
        assert pub.is_connected
        _offer_all(pub, [b"after the idle spell"], _DELIVERY_S)
        got = _collect_messages(real_sub, 1, _DELIVERY_S)
    finally:
        real_sub.stop()
    assert got[0][2] == b"after the idle spell"
    _assert_understood_everything(our_driver)


# A Java publication that offers one message, idles for IDLE_MS watching isConnected() every
# 50 ms (printing "lost" if it ever goes false: the Java sender heard no status message for its
# 5 s connection timeout), then offers a second one and exits.
_IDLE_PUBLISHER = """
import io.aeron.Aeron;
import io.aeron.Publication;
import org.agrona.concurrent.UnsafeBuffer;
import java.nio.ByteBuffer;

public class IdlePublisher {
    public static void main(String[] args) throws Exception {
        String channel = args[0];
        int streamId = Integer.parseInt(args[1]);
        long idleMs = Long.parseLong(args[2]);
        try (Aeron aeron = Aeron.connect(new Aeron.Context());
             Publication pub = aeron.addPublication(channel, streamId)) {
            UnsafeBuffer buf = new UnsafeBuffer(ByteBuffer.allocateDirect(64));
            for (int i = 0; i < 2; i++) {
                byte[] msg = ("idle-" + i).getBytes();
                buf.putBytes(0, msg);
                long deadline = System.currentTimeMillis() + 45000;
                while (pub.offer(buf, 0, msg.length) < 0) {
                    if (System.currentTimeMillis() > deadline) {
                        System.out.println("offer failed");
                        return;
                    }
                    Thread.sleep(10);
                }
                System.out.println("sent " + i);
                if (i == 0) {
                    long until = System.currentTimeMillis() + idleMs;
                    while (System.currentTimeMillis() < until) {
                        if (!pub.isConnected()) {
                            System.out.println("lost");
                        }
                        Thread.sleep(50);
                    }
                    System.out.println("idled");
                }
            }
        }
    }
}
"""


def test_a_java_publication_idle_past_its_connection_timeout_stays_connected_to_our_idle_sms(
    real_stack: contextlib.ExitStack,  # noqa: F811
    our_driver: Driver,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Our subscription at ``idle-sm-interval=1s`` (the longest allowed, on the idle grid): a
    Java publication idle for 8 s (past its 5 s connection timeout) never sees itself
    disconnected, and its next message arrives."""
    real_driver = _start_real_driver(real_stack, "java")
    classes = aeron_peer.compile_java(_IDLE_PUBLISHER, "IdlePublisher", tmp_path / "classes")
    port, stream_id = free_udp_port(), 1014
    sub = our_driver.add_subscription(_channel(port, **{"idle-sm-interval": "1s"}), stream_id)
    got: list[bytes] = []
    assert isinstance(real_driver, JavaRealDriver)
    program = real_driver.java.run(
        "IdlePublisher", classpath=[classes], args=[_channel(port), str(stream_id), "8000"]
    )
    try:
        deadline = time.monotonic() + _DELIVERY_S + 20
        sms: list[int] = []  # status messages sent when each message arrived
        while len(got) < 2:
            assert time.monotonic() < deadline, program.transcript()
            if not sub.poll(lambda payload, header: got.append(bytes(payload)), 10):
                time.sleep(0.02)
            while len(sms) < len(got):
                sms.append(our_driver.counters.snapshot()["status_messages_sent"])
        assert program.wait_exit(_DELIVERY_S) == 0
        program.drain(5)
        said = program.transcript()
    finally:
        program.stop()
    assert got == [b"idle-0", b"idle-1"]
    # the 8 s between them were idle at the asked interval (200 ms apart would be ~40)
    assert sms[1] - sms[0] <= 16, sms
    assert "idled" in said and "lost" not in said, said
    _assert_understood_everything(our_driver)
