"""Publish market ticks (JSON, one message each) into a stream of a running stream server.

    .venv/bin/python examples/market_ticks_producer.py --endpoint 127.0.0.1:40123 --stream-id 30

(stream 30 is what examples/market_ticks_job.py reads by default; --backfill-minutes 5 spreads the
ticks' event times over the past 5 minutes, so that the job's watermark closes some minutes.)

Prints one JSON line at the end: {"published": N, "end_position": P}.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from aeron_spark.connector.client import ClientSettings, StreamClient

SYMBOLS = ("AAPL", "MSFT", "NVDA", "AMZN", "GOOG")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--endpoint", default="127.0.0.1:40123", help="stream server (default %(default)s)"
    )
    p.add_argument("--stream-id", type=int, default=30, help="stream (default %(default)s)")
    p.add_argument("--batches", type=int, default=20, help="publish requests to send")
    p.add_argument("--ticks-per-batch", type=int, default=1000, help="ticks per request")
    p.add_argument("--interval-s", type=float, default=0.0, help="pause between batches")
    p.add_argument("--seed", type=int, default=1, help="random seed (default %(default)s)")
    p.add_argument(
        "--backfill-minutes",
        type=float,
        default=0.0,
        help="spread the ticks' event times over this many past minutes (0: now)",
    )
    args = p.parse_args()
    rng = random.Random(args.seed)
    published = 0
    end = 0
    with StreamClient.connect(ClientSettings(endpoint=args.endpoint, timeout_s=60)) as client:
        start = time.time() - args.backfill_minutes * 60
        step = args.backfill_minutes * 60 / max(args.batches, 1)
        for batch in range(args.batches):
            now = start + batch * step if args.backfill_minutes else time.time()
            ticks = [
                json.dumps(
                    {
                        "symbol": rng.choice(SYMBOLS),
                        "price": round(100 + rng.random() * 50, 2),
                        "qty": rng.randint(1, 500),
                        "ts": now,
                    }
                ).encode()
                for _ in range(args.ticks_per_batch)
            ]
            end = client.publish(args.stream_id, ticks)
            published += len(ticks)
            if args.interval_s:
                time.sleep(args.interval_s)
    print(json.dumps({"published": published, "end_position": end}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
