"""Issue 19, item 4: a Spark source names its client identity (``clientKey``) and reads from a
server that takes only listed keys; an unlisted key is refused with CLIENT_UNKNOWN."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_source_with_client_key_reads_from_an_authorising_server(spark, tmp_path: Path):  # type: ignore[no-untyped-def]
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server import ServerConfig, StreamServer
    from aeron_spark.handshake.keystore import client_public_key_hex

    writer_store, reader_store = str(tmp_path / "writer"), str(tmp_path / "reader")
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        f"{client_public_key_hex(writer_store)} writer write=12\n"
        f"{client_public_key_hex(reader_store)} reader read=12\n"
    )
    reader_key = str(Path(reader_store) / "client.key")  # what every executor host must hold
    config = ServerConfig(
        directory=str(tmp_path / "server"),
        port=0,
        term_length=1024 * 1024,
        mtu=8192,
        key_store_dir=str(tmp_path / "server-keys"),
        authorized_keys_file=str(keys),
    )
    with StreamServer(config) as server:
        settings = ClientSettings(endpoint=server.endpoint, key_store_dir=writer_store)
        with StreamClient.connect(settings) as client:
            client.publish(12, [b"a", b"b", b"c"])

        def read(**options: str):  # type: ignore[no-untyped-def]
            reader = spark.read.format("aeron").option("endpoint", server.endpoint)
            for name, value in {"streamId": "12", **options}.items():
                reader = reader.option(name, value)
            return reader.load()

        rows = read(clientKey=reader_key, keyStore=str(tmp_path / "spark-known")).collect()
        assert sorted(bytes(r.value) for r in rows) == [b"a", b"b", b"c"]
        with pytest.raises(Exception, match="CLIENT_UNKNOWN"):
            read(keyStore=str(tmp_path / "stranger")).collect()
        assert server.snapshot()["handshake"]["clients_refused"] >= 1


def test_sink_with_client_key_commits_its_own_batches_on_an_authorising_server(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path
):
    """Issue 28, item 3: a batch belongs to the key that staged it and is committed by the key
    of the query's driver: with one ``clientKey`` for both, a streaming sink into an authorising
    server commits every batch, exactly once, across a restart from its checkpoint."""
    from aeron_spark.connector.client import ClientSettings, StreamClient
    from aeron_spark.connector.server import ServerConfig, StreamServer
    from aeron_spark.handshake.keystore import client_public_key_hex

    etl_store = str(tmp_path / "etl")
    keys = tmp_path / "authorized_keys"
    keys.write_text(f"{client_public_key_hex(etl_store)} etl read=12,13 write=12,13\n")
    etl_key = str(Path(etl_store) / "client.key")
    config = ServerConfig(
        directory=str(tmp_path / "server"),
        port=0,
        term_length=1024 * 1024,
        mtu=8192,
        key_store_dir=str(tmp_path / "server-keys"),
        authorized_keys_file=str(keys),
    )
    with StreamServer(config) as server:
        settings = ClientSettings(endpoint=server.endpoint, key_store_dir=etl_store)

        def copy(rows: int) -> None:
            with StreamClient.connect(settings) as client:
                client.publish(12, [f"row-{i}".encode() for i in range(rows - 100, rows)])
            query = (
                spark.readStream.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 12)
                .option("clientKey", etl_key)
                .option("keyStore", str(tmp_path / "spark-known"))
                .load()
                .writeStream.format("aeron")
                .option("endpoint", server.endpoint)
                .option("streamId", 13)
                .option("sinkId", "copy-12-13")
                .option("clientKey", etl_key)
                .option("keyStore", str(tmp_path / "spark-known"))
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(300)
            assert query.exception() is None

        copy(100)
        copy(200)  # restarted from the checkpoint: the sink id is still the same key's
        counters = server.snapshot()["counters"]
        assert counters["sink_commits"] >= 2 and counters["requests_not_owner"] == 0
        back = (
            spark.read.format("aeron")
            .option("endpoint", server.endpoint)
            .option("streamId", 13)
            .option("clientKey", etl_key)
            .option("keyStore", str(tmp_path / "spark-known"))
            .load()
        )
        assert sorted(bytes(r.value) for r in back.collect()) == sorted(
            f"row-{i}".encode() for i in range(200)
        )
