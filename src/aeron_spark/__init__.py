"""aeron-spark: Spark Structured Streaming over a pure-Python, wire-compatible Aeron transport.

Layers (each usable on its own, each depending only on the ones below it):

- :mod:`aeron_spark.transport` -- Aeron's UDP wire protocol and IPC, recording and replay.
- :mod:`aeron_spark.handshake` -- secure sessions (X25519 + AES-GCM) over the transport.
- :mod:`aeron_spark.connector` -- the Spark data source/sink ``aeron`` and the stream server.
"""

from aeron_spark.errors import AeronSparkError

__version__ = "0.1.0"
__all__ = ["AeronSparkError", "__version__"]
