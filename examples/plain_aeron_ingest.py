"""Read with Spark a stream that a *plain* Aeron publication sent: no handshake, no client library.

The stream server records whatever plain Aeron publications send to its ingest channel (a real
Aeron C/Java/C++ publisher works the same way; here the project's own transport plays that part):

    aeron-spark server --dir DATA --ingest-channel aeron:udp?endpoint=127.0.0.1:40456 \\
        --ingest-stream-id 10

    .venv/bin/python examples/plain_aeron_ingest.py          # does all of it on this machine

It starts an embedded server with an ingest channel on a free port, publishes ``--messages``
fragmented and unfragmented messages from a plain publication, waits until the server recorded
them, and reads them back with ``spark.read.format("aeron")``. Prints one JSON line, e.g.
{"published": 5000, "recordings": 1, "read": 5000, "in_order": true, "source": "ingest:..."}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--stream-id", type=int, default=10)
    args = p.parse_args()

    from pyspark.sql import SparkSession

    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.server import ServerConfig, StreamServer
    from aeron_spark.transport import Driver, DriverConfig
    from aeron_spark.transport.testing import free_udp_port

    ingest_port = free_udp_port()
    with (
        tempfile.TemporaryDirectory() as tmp,
        StreamServer(
            ServerConfig(
                directory=os.path.join(tmp, "server"),
                port=0,
                ingest_channel=f"aeron:udp?endpoint=127.0.0.1:{ingest_port}",
                ingest_stream_ids=(args.stream_id,),
            )
        ).start() as server,
    ):
        payloads = [f"tick-{i:07d}|".encode() + b"x" * (i % 3000) for i in range(args.messages)]
        with Driver(DriverConfig(write_counters_file=False)) as driver:  # the "plain Aeron" side
            pub = driver.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{ingest_port}|mtu=1408", args.stream_id
            )
            if not pub.wait_until_connected(30):
                raise SystemExit("the server's ingest channel did not connect")
            for payload in payloads:
                pub.offer_blocking(payload, timeout_s=30)
            end = pub.position
            with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    recs = client.list_recordings([args.stream_id])
                    if recs and max(r.recorded_position for r in recs) >= end:
                        break
                    time.sleep(0.05)
            pub.close()
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("plain-aeron-ingest")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        try:
            spark.sparkContext.setLogLevel("ERROR")
            ensure_registered(spark)
            rows = (
                spark.read.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", args.stream_id)
                .load()
                .select("value", "position", "recording_id")
                .orderBy("position")
                .collect()
            )
        finally:
            spark.stop()
        with StreamClient.connect(ClientSettings(endpoint=server.endpoint)) as client:
            recs = client.list_recordings([args.stream_id])
    got = [bytes(r.value) for r in rows]
    print(
        json.dumps(
            {
                "published": len(payloads),
                "recordings": len(recs),
                "read": len(got),
                "in_order": got == payloads,
                "source": recs[0].source if recs else None,
            }
        )
    )
    return 0 if got == payloads else 1


if __name__ == "__main__":
    raise SystemExit(main())
