"""Child process for the IPC tests: ``python ipc_peer.py MODE DIR STREAM [ARGS...]``.

Modes:
  subscribe N SLEEP_S   receive N messages (sleeping SLEEP_S after each poll), print a JSON line
                        with their count, sha256 and whether they were in order, then exit
  check N SEED          receive N messages, each compared with what the publisher sent
                        (``payload(i, random_sizes(SEED, N)[i])``), print a JSON line with their
                        count and the first one that differed (null if none), then exit
  hold                  subscribe and never poll (prints "ready"); for back-pressure tests
  publish-torn N        publish N whole messages, then die (os._exit) in the middle of a
                        fragmented one: after its later fragments, before its first frame length
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.protocol import term as term_module


def payload(i: int, size: int) -> bytes:
    return i.to_bytes(8, "little") + bytes([i % 251]) * max(0, size - 8)


def random_sizes(seed: int, count: int) -> list[int]:
    """Message sizes from a few bytes to 40 KB (fragmented), the same in both processes."""
    rng = random.Random(seed)
    return [rng.choice((8, 40, 500, 1400, 3000, 9000, 40_000)) for _ in range(count)]


def main() -> None:
    mode, directory, stream = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = DriverConfig(
        directory=directory, write_counters_file=False, ipc_liveness_timeout_ns=1_000_000_000
    )
    with Driver(config) as driver:
        if mode == "subscribe":
            count, sleep_s = int(sys.argv[4]), float(sys.argv[5])
            sub = driver.add_subscription("aeron:ipc", stream)
            digest = hashlib.sha256()
            state = {"n": 0, "order": True}

            def on_message(data: memoryview, header: object) -> None:
                if int.from_bytes(data[:8], "little") != state["n"]:
                    state["order"] = False
                digest.update(data)
                state["n"] += 1

            assembler = FragmentAssembler(on_message)
            print("ready", flush=True)
            deadline = time.monotonic() + 120
            while state["n"] < count and time.monotonic() < deadline:
                if sub.poll(assembler, 256) == 0:
                    sub.wait(0.05)
                elif sleep_s:
                    time.sleep(sleep_s)
            print(
                json.dumps(
                    {"count": state["n"], "sha256": digest.hexdigest(), "in_order": state["order"]}
                ),
                flush=True,
            )
            sub.close()
        elif mode == "check":
            count, seed = int(sys.argv[4]), int(sys.argv[5])
            sizes = random_sizes(seed, count)
            sub = driver.add_subscription("aeron:ipc", stream)
            result: dict[str, object] = {"count": 0, "first_bad": None}

            def on_checked(data: memoryview, header: object) -> None:
                n = result["count"]
                assert isinstance(n, int)
                # bytes(data) == ...: a copy and a memcmp (a memoryview compares item by item)
                if result["first_bad"] is None and (
                    n >= count or bytes(data) != payload(n, sizes[n])
                ):
                    result["first_bad"] = {
                        "index": n,
                        "length": len(data),
                        "head": bytes(data[:16]).hex(),
                    }
                result["count"] = n + 1

            checker = FragmentAssembler(on_checked)
            print("ready", flush=True)
            deadline = time.monotonic() + 120
            while result["count"] < count and time.monotonic() < deadline:  # type: ignore[operator]
                if sub.poll(checker, 256) == 0:
                    sub.wait(0.05)
            print(json.dumps(result), flush=True)
            sub.close()
        elif mode == "hold":
            sub = driver.add_subscription("aeron:ipc", stream)
            print("ready", flush=True)
            time.sleep(120)
        elif mode == "publish-torn":
            count = int(sys.argv[4])
            pub = driver.add_publication("aeron:ipc?term-length=64k|mtu=1408", stream)
            assert pub.wait_until_connected(30)
            for i in range(count):
                pub.offer_blocking(payload(i, 100), timeout_s=30)
            calls = {"n": 0}
            original = term_module._i32_into
            big = payload(count, 5000)  # 4 fragments at mtu 1408

            def dying(buffer: object, offset: int, value: int) -> None:
                calls["n"] += 1
                if calls["n"] == 4:  # fragments 2..4 written, the first's length is next
                    os._exit(0)
                original(buffer, offset, value)

            term_module._i32_into = dying
            pub.offer(big)
            raise SystemExit("unreachable: the publisher should have died mid-message")


if __name__ == "__main__":
    main()
