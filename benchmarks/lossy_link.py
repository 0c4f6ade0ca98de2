"""The transport over a lossy link between two hosts; prints one JSON object.

    sudo python -m benchmarks.lossy_link [--seconds S] [--losses 0,1,5,10]
        [--sizes 32,1024,8192,65536] [--repeats N] [--window 4m]

Two hosts: this process in the root network namespace and a subscriber process in a new one,
joined by a veth pair (1,500-byte MTU) whose ends drop the given percentage of arriving IP
packets (nftables, :mod:`aeron_spark.transport.testing_netns`). For each loss rate and message
size this process publishes for ``--seconds`` as fast as flow control allows (8 MiB terms, mtu
1408, the receiver window of ``--window``; sessions use half their 8 MiB term) and waits until the
subscriber has every message, in order. Figures per case:

* ``goodput_mb_per_s``: message bytes delivered / (last delivery - first offer);
* ``vs_loss_free``: that goodput over the loss-free goodput of the same size;
* ``retransmit_overhead``: bytes retransmitted / bytes delivered;
* ``retransmitted_per_lost``: bytes retransmitted / bytes the link dropped on the way to the
  subscriber (1.0 is ideal; above 1 are duplicate retransmits);
* ``naks``: NAKs the publisher received.

With ``--repeats N`` each case runs N times, interleaved, and the median goodput is kept. Needs
root, iproute2 and nftables. Numbers depend on what else runs on the machine: the JSON has the
load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from aeron_spark.transport.testing_netns import LossyLink, transfer, unavailable_reason


def _case(link: LossyLink, loss: float, size: int, seconds: float, window: str) -> dict[str, Any]:
    link.set_loss(loss)
    r = transfer(
        link,
        size=size,
        seconds=seconds,
        channel_params="|term-length=8m|mtu=1408",
        receiver_window=window,
        timeout_s=max(60.0, seconds * 20),
    )
    delivered = r.received * size
    return {
        "goodput_mb_per_s": round(r.goodput_mb_per_s, 2),
        "messages": r.received,
        "complete": r.received == r.offered and r.bad == 0,
        "seconds": round(r.seconds, 2),
        "retransmitted_bytes": r.retransmitted_bytes,
        "lost_bytes": r.lost_bytes,
        "lost_packets": r.dropped_to_b[0],
        "retransmit_overhead": round(r.retransmitted_bytes / delivered, 4) if delivered else None,
        "retransmitted_per_lost": (
            round(r.retransmitted_bytes / r.lost_bytes, 2) if r.lost_bytes else None
        ),
        "naks": r.publisher.get("naks_received", 0),
        "retransmits_suppressed": r.publisher.get("retransmits_suppressed", 0),
        "socket_overflows": r.overflows_b,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="publishing time per case")
    parser.add_argument("--losses", default="0,1,5,10", help="loss percentages, comma separated")
    parser.add_argument("--sizes", default="32,1024,8192,65536", help="message sizes in bytes")
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (median kept)")
    parser.add_argument("--window", default="4m", help="receiver window (rcv-wnd)")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(json.dumps({"skipped": reason}))
        return 2
    losses = [float(x) for x in args.losses.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    started = time.monotonic()
    result: dict[str, Any] = {
        "load_average_at_start": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "seconds_per_case": args.seconds,
        "repeats": args.repeats,
        "window": args.window,
        "link": "veth, 1500-byte MTU, nftables ingress drop at both ends; mtu 1408, 8 MiB terms",
    }
    cases: dict[str, dict[str, Any]] = {}
    with LossyLink(0) as link:
        runs: dict[tuple[int, float], list[dict[str, Any]]] = {}
        for _ in range(args.repeats):
            for size in sizes:
                for loss in losses:
                    runs.setdefault((size, loss), []).append(
                        _case(link, loss, size, args.seconds, args.window)
                    )
    for size in sizes:
        base = None
        for loss in losses:
            rs = sorted(runs[(size, loss)], key=lambda r: r["goodput_mb_per_s"])
            median = rs[len(rs) // 2]
            median["goodput_runs"] = [r["goodput_mb_per_s"] for r in runs[(size, loss)]]
            median["complete"] = all(r["complete"] for r in rs)
            if loss == 0:
                base = median["goodput_mb_per_s"]
            if base:
                median["vs_loss_free"] = round(median["goodput_mb_per_s"] / base, 2)
            cases[f"{size}b_{loss:g}pct"] = median
            result[f"goodput_{size}b_{loss:g}pct_mb_per_s"] = median["goodput_mb_per_s"]
    result["cases"] = cases
    result["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
