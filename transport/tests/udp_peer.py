"""A publisher in its own process, for the multi-process tests (run: python udp_peer.py ARGS).

Modes:
  stream  CHANNEL STREAM COUNT SEED MAX_SIZE DROP DUP REORDER
          publishes COUNT messages (testing.message_sizes / make_message), prints
          {"event": "done", "position": P}, then keeps serving NAKs until stdin closes.
  torn    CHANNEL STREAM COMPLETE BIG_SIZE
          publishes COMPLETE small messages and one BIG_SIZE message, prints
          {"event": "offered", ...} and serves until killed.
Every line on stdout is one JSON object.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

from aeron_spark.transport import Driver, DriverConfig
from aeron_spark.transport.testing import LossConfig, make_message, message_sizes

STEP_S = 0.005


def say(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def stdin_closed() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and not os.read(sys.stdin.fileno(), 1024)


def serve(driver: Driver, until: float) -> None:
    while time.monotonic() < until and not stdin_closed():
        if driver.do_work() == 0:
            driver.idle(STEP_S)


def stream(
    channel: str,
    stream_id: int,
    count: int,
    seed: int,
    max_size: int,
    drop: float,
    dup: float,
    reorder: float,
) -> None:
    loss = LossConfig(drop, dup, reorder, seed=seed + 1) if (drop or dup or reorder) else None
    config = DriverConfig(
        threading_mode="invoker",
        loss=loss,
        write_counters_file=False,
        retransmit_linger_ns=1_000_000,
    )
    with Driver(config) as d:
        pub = d.add_publication(channel, stream_id)
        deadline = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < deadline:
            d.do_work()
            d.idle(STEP_S)
        say(event="connected", session_id=pub.session_id)
        sizes = message_sizes(seed, count, max_size)
        i = 0
        while i < count:
            if pub.offer(make_message(i, sizes[i])) > 0:
                i += 1
                if i % 64:
                    continue
            if d.do_work() == 0:
                d.idle(0.001)
        say(event="done", position=pub.position, counters=d.counters.snapshot())
        serve(d, time.monotonic() + 600)
        say(event="exit", counters=d.counters.snapshot())


def torn(channel: str, stream_id: int, complete: int, big_size: int) -> None:
    with Driver(DriverConfig(threading_mode="invoker", write_counters_file=False)) as d:
        pub = d.add_publication(channel, stream_id)
        deadline = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < deadline:
            d.do_work()
            d.idle(STEP_S)
        for i in range(complete):
            pub.offer_blocking(make_message(i, 1000), timeout_s=30)
        begin = pub.position
        pub.offer_blocking(make_message(complete, big_size), timeout_s=30)
        say(event="offered", begin=begin, end=pub.position, session_id=pub.session_id)
        serve(d, time.monotonic() + 600)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "stream":
        stream(
            args[0],
            int(args[1]),
            int(args[2]),
            int(args[3]),
            int(args[4]),
            float(args[5]),
            float(args[6]),
            float(args[7]),
        )
    elif mode == "torn":
        torn(args[0], int(args[1]), int(args[2]), int(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")
