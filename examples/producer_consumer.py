"""Transport only, no Spark and no server: a publication and a subscription over UDP loopback.

    .venv/bin/python examples/producer_consumer.py --messages 10000

Prints {"sent": N, "received": N, "in_order": true}.

One thread both publishes and consumes, so it polls its subscription whenever the publication is
back-pressured: the receiver advertises more window only as the subscriber consumes, and a
publisher that waited without polling would wait for itself (BackPressuredError).
"""

from __future__ import annotations

import argparse
import json
import time

from aeron_spark.transport import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    Driver,
    DriverConfig,
    FragmentAssembler,
)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--size", type=int, default=3000, help="bytes per message (> MTU is fragmented)")
    args = p.parse_args()
    received: list[int] = []

    def on_message(payload, header) -> None:  # type: ignore[no-untyped-def]
        received.append(int.from_bytes(payload[:8], "little"))

    with Driver(DriverConfig()) as driver:
        sub = driver.add_subscription("aeron:udp?endpoint=127.0.0.1:0", stream_id=1001)
        host, port = sub.local_endpoints[0]
        pub = driver.add_publication(f"aeron:udp?endpoint={host}:{port}", stream_id=1001)
        if not pub.wait_until_connected(10.0):
            raise SystemExit("publication did not connect within 10 s")
        assembler = FragmentAssembler(on_message)
        filler = bytes(max(0, args.size - 8))
        for i in range(args.messages):
            message = i.to_bytes(8, "little") + filler
            stalled_since = time.monotonic()
            while (result := pub.offer(message)) < 0:
                if result not in (BACK_PRESSURED, ADMIN_ACTION):
                    raise SystemExit(f"offer of message {i} failed: {result}")
                # back-pressured: consume what arrived, so the receiver opens its window again
                if sub.poll(assembler, 100) > 0:
                    stalled_since = time.monotonic()
                elif time.monotonic() - stalled_since > 10.0:
                    raise SystemExit(f"message {i}: no progress for 10 s (back-pressured)")
                else:
                    sub.wait(0.001)
            sub.poll(assembler, 100)
        deadline = time.monotonic() + 30.0
        while len(received) < args.messages and time.monotonic() < deadline:
            if sub.poll(assembler, 1000) == 0:
                sub.wait(0.05)
    print(
        json.dumps(
            {
                "sent": args.messages,
                "received": len(received),
                "in_order": received == list(range(args.messages)),
            }
        )
    )
    return 0 if received == list(range(args.messages)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
