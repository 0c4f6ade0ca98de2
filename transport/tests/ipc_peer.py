"""Child process for the IPC tests: ``python ipc_peer.py MODE DIR STREAM [ARGS...]``.

Modes:
  subscribe N SLEEP_S   receive N messages (sleeping SLEEP_S after each poll), print a JSON line
                        with their count, sha256 and whether they were in order, then exit
  hold                  subscribe and never poll (prints "ready"); for back-pressure tests
  publish-torn N        publish N whole messages, then die (os._exit) in the middle of a
                        fragmented one: after its later fragments, before its first frame length
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from aeron_spark.transport import Driver, DriverConfig, FragmentAssembler
from aeron_spark.transport.protocol import term as term_module


def payload(i: int, size: int) -> bytes:
    return i.to_bytes(8, "little") + bytes([i % 251]) * max(0, size - 8)


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
