"""Suite-wide set-up: one private key store for every server and client the tests start.

Servers on one host share one identity (like an SSH host key), so test servers that reuse a port
never look like a changed server key; the store is a fresh directory, never the user's
``~/.aeron-spark/keys``. Set before any SparkSession starts, so Spark's Python workers inherit it.
"""

from __future__ import annotations

import os
import tempfile

os.environ["AERON_SPARK_KEY_STORE"] = tempfile.mkdtemp(prefix="aeron-spark-test-keys-")
