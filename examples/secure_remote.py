"""A secure remote set-up: a stream server with its own key store, clients pinning its key.

On the server host (once):

    aeron-spark keys show --key-store /srv/aeron-spark/keys      # prints the server's public key
    aeron-spark server --dir /srv/aeron-spark/data --host 0.0.0.0 --port 40123 \\
        --key-store /srv/aeron-spark/keys                        # UDP 40123 and 40124

On the Spark side, pin that key (and refuse anything else):

    .venv/bin/python examples/secure_remote.py --endpoint server-host:40123 --server-key <hex>

Without ``--endpoint`` the example plays both parts on this machine: it starts a server process
with a key store of its own, reads the key with ``aeron-spark keys show`` (the out-of-band step),
writes rows with the sink and reads them back with the source over sealed sessions, and checks that
a client pinning the wrong key is refused. Prints one JSON line, e.g.
{"written": 1000, "read": 1000, "sealed": true, "wrong_key_refused": true}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _start_server(tmp: str, stack: ExitStack) -> tuple[str, str]:
    keys = os.path.join(tmp, "server-keys")
    key = subprocess.run(
        [sys.executable, "-m", "aeron_spark.cli", "keys", "show", "--key-store", keys],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aeron_spark.cli",
            "server",
            "--dir",
            os.path.join(tmp, "data"),
            "--port",
            "0",
            "--key-store",
            keys,
        ],
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    stack.callback(proc.wait, 30)
    stack.callback(proc.terminate)
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"listening on (\S+)", line)
        if found:
            return found.group(1), key
        if not line and proc.poll() is not None:
            break
    raise SystemExit("the stream server did not start")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--endpoint", help="a running server's host:port (default: start one here)")
    p.add_argument("--server-key", help="the server's public key (hex); needed with --endpoint")
    p.add_argument("--stream-id", type=int, default=77)
    p.add_argument("--rows", type=int, default=1000)
    args = p.parse_args()
    if args.endpoint and not args.server_key:
        p.error("--endpoint needs --server-key (from 'aeron-spark keys show' on the server)")

    from pyspark.sql import SparkSession

    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.datasource import ensure_registered
    from aeron_spark.connector.errors import ServerUnavailableError

    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        endpoint, key = (
            (args.endpoint, args.server_key) if args.endpoint else _start_server(tmp, stack)
        )
        client_keys = os.path.join(tmp, "client-keys")
        secure = {
            "endpoint": endpoint,
            "serverKey": key,
            "trustOnFirstUse": "false",
            "keyStore": client_keys,
            "encryption": "true",
        }
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("secure-remote")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        ensure_registered(spark)
        rows = spark.range(args.rows).selectExpr("cast(concat('row-', id) as binary) as value")
        rows.write.format("aeron").options(**secure).option("streamId", args.stream_id).mode(
            "append"
        ).save()
        back = (
            spark.read.format("aeron").options(**secure).option("streamId", args.stream_id).load()
        )
        read = back.filter("value like 'row-%'").count()

        settings = ClientSettings(
            endpoint=endpoint, server_key=key, trust_on_first_use=False, key_store_dir=client_keys
        )
        with StreamClient.connect(settings) as client:
            sealed = bool(getattr(client._link, "encrypted", False))
        try:
            StreamClient.connect(
                ClientSettings(
                    endpoint=endpoint,
                    server_key="00" * 32,
                    trust_on_first_use=False,
                    key_store_dir=client_keys,
                    timeout_s=10,
                )
            ).close()
            refused = False
        except ServerUnavailableError as exc:
            refused = "pinned server_key" in str(exc)
    print(
        json.dumps(
            {"written": args.rows, "read": read, "sealed": sealed, "wrong_key_refused": refused}
        )
    )
    return 0 if read == args.rows and sealed and refused else 1


if __name__ == "__main__":
    raise SystemExit(main())
