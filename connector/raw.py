"""Raw mode of the ``aeron`` sink: rows go straight into an Aeron publication, no server.

With the sink option ``channel`` (an Aeron channel URI such as ``aeron:udp?endpoint=host:port``),
each task publishes its rows, one message per row, on ``channel`` / ``streamId`` through an
in-process transport driver, so a real Aeron subscriber (or any ``aeron-spark`` subscription)
receives them. Back pressure slows the task; nothing is dropped. A task returns only once its
messages were handed to the network (the sender caught up with the publication), then lingers
as Aeron does so retransmits can be served.

Guarantee: **at least once**. There is no server to commit to: a retried task, a speculative
duplicate or a batch re-run after a restart publishes its rows again (each task is its own
publisher session, so a subscriber can tell them apart by session id).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from aeron_spark.connector.errors import ServerUnavailableError
from aeron_spark.connector.options import SinkOptions
from aeron_spark.connector.sink import sink_payloads
from aeron_spark.handshake import shared_driver
from aeron_spark.transport import TransportError

log = logging.getLogger("aeron_spark.connector.raw")


@dataclass
class Published(WriterCommitMessage):
    session_id: int = 0
    messages: int = 0
    end_position: int = 0


def publish_rows(options: SinkOptions, iterator: Iterator[pa.RecordBatch]) -> Published:
    assert options.channel is not None
    timeout_s = options.settings.timeout_s
    pub = shared_driver().add_publication(options.channel, options.stream_id)
    count = 0
    try:
        if not pub.wait_until_connected(timeout_s):
            raise ServerUnavailableError(
                f"no subscriber on {options.channel} stream {options.stream_id} within "
                f"{timeout_s:g} s (raw mode publishes only to a listening subscription)"
            )
        for batch in iterator:
            payloads, reserved = sink_payloads(
                batch, options.format, options.compression, options.sbe
            )
            for i, payload in enumerate(payloads):
                rv = reserved[i] if reserved is not None else 0
                pub.offer_blocking(payload, reserved_value=rv, timeout_s=timeout_s)
                count += 1
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while pub.sender_position < pub.position:  # handed to the network before we report done
            if time.monotonic() > deadline or not pub.is_connected:
                raise ServerUnavailableError(
                    f"raw sink: {pub.position - pub.sender_position} bytes not sent to "
                    f"{options.channel} within {timeout_s:g} s"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        return Published(pub.session_id, count, pub.position)
    except TransportError as exc:
        raise ServerUnavailableError(f"raw sink on {options.channel}: {exc}") from exc
    finally:
        pub.close()


class RawStreamWriter(DataSourceStreamArrowWriter):
    """Streaming raw writes: every micro-batch's rows are published by its tasks."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish_rows(self.options, iterator)

    def commit(self, messages: list, batchId: int) -> None:
        sent = sum(m.messages for m in messages if isinstance(m, Published))
        log.info(
            "aeron raw sink %s: batch %d published %d messages", self.options.channel, batchId, sent
        )

    def abort(self, messages: list, batchId: int) -> None:
        log.warning(
            "aeron raw sink %s: batch %d aborted; messages already published stay "
            "published (at-least-once)",
            self.options.channel,
            batchId,
        )


class RawBatchWriter(DataSourceArrowWriter):
    """``df.write`` in raw mode."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish_rows(self.options, iterator)

    def commit(self, messages: list) -> None:
        sent = sum(m.messages for m in messages if isinstance(m, Published))
        log.info("aeron raw sink %s: published %d messages", self.options.channel, sent)

    def abort(self, messages: list) -> None:
        log.warning(
            "aeron raw sink %s: write aborted; published messages stay published",
            self.options.channel,
        )


__all__ = ["Published", "RawBatchWriter", "RawStreamWriter", "publish_rows"]
