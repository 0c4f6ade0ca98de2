"""archiveCredentials / archiveCredentialsFile against a real Aeron Archive that authenticates
(``ArchivingMediaDriver`` from the pinned aeron-all jar with our
``transport/tests/java/TestArchiveAuthenticator.java``, compiled by the fixture; free loopback
port, stopped and removed in a ``finally``): the archive sink appends with the credentials from
a file, the archive source reads the rows back through ``AeronBatchReader`` with them as text
(and as a file), and wrong or missing credentials fail with the archive's coded
``ArchiveAuthenticationError``, the secret in no error and no log. Skips without Java only;
fails instead with ``AERON_INTEROP_REQUIRED`` (CI).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from aeron_spark.connector.options import parse_archive_sink_options, parse_archive_source_options
from aeron_spark.connector.source import AeronBatchReader
from aeron_spark.connector.stores.archive import sink as archive_sink
from aeron_spark.transport.archive.client import ArchiveAuthenticationError, ArchiveErrorCode
from aeron_spark.transport.testing import free_udp_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "transport" / "tests"))
import aeron_peer  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(300)]
SECRET = "aeron-spark-connector-secret-" + secrets.token_hex(8)  # fresh: found anywhere = leak
STREAM_ID = 2301


@dataclass
class AuthArchive:
    peer: aeron_peer.JavaArchive
    secret_file: Path


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthArchive]:
    aeron_peer.require_java()
    if aeron_peer.shutil.which("javac") is None:
        message = "no `javac` (a JDK) to compile java/TestArchiveAuthenticator.java"
        if aeron_peer.required():
            pytest.fail(f"{aeron_peer.REQUIRED_ENV} is set but {message}", pytrace=False)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("archive-credentials")
    java = ROOT / "transport" / "tests" / "java" / "TestArchiveAuthenticator.java"
    classes = aeron_peer.compile_java(java.read_text(), "TestArchiveAuthenticator", root / "c")
    secret_file = root / "secret"
    secret_file.write_text(SECRET + "\n")  # a trailing newline, as editors leave it
    (root / "archive-secret").write_text(SECRET)
    with aeron_peer.JavaArchive(
        root / "archive",
        free_udp_port(),
        0xC4ED,
        tag="connector-credentials",
        classpath=[classes],
        **{
            "aeron.archive.authenticator.supplier": "TestArchiveAuthenticator",
            "aeronspark.test.secret.file": str(root / "archive-secret"),
        },
    ) as peer:
        yield AuthArchive(peer, secret_file)


def _read(archive: AuthArchive, **credentials: str) -> list[bytes]:
    options = {
        "archive": archive.peer.control_channel,
        "streamId": str(STREAM_ID),
        "timeoutMs": "30000",
        **credentials,
    }
    reader = AeronBatchReader(parse_archive_source_options(options), None)
    # what Spark ships to the tasks: the reader's partitions, pickled
    parts = [pickle.loads(pickle.dumps(p)) for p in reader.partitions()]
    out: list[bytes] = []
    for part in parts:
        for batch in reader.read(part):
            out.extend(batch.column("value").to_pylist())
    return out


def test_sink_and_source_with_credentials_and_refused_without(
    archive: AuthArchive, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sink = parse_archive_sink_options(
        {
            "archive": archive.peer.control_channel,
            "channel": f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
            "streamId": str(STREAM_ID),
            "sinkId": "credentials",
            "timeoutMs": "30000",
            "archiveCredentialsFile": str(archive.secret_file),
        }
    )
    sink = pickle.loads(pickle.dumps(sink))  # the tasks' copy
    rows = [f"row-{i}".encode() for i in range(50)]
    staged = archive_sink.stage(
        sink, "id", 0, iter([pa.record_batch({"value": pa.array(rows, pa.binary())})])
    )
    stats = archive_sink.commit_batch(sink, "id", 0, [dataclasses.replace(staged, partition=0)])
    assert stats.appended_rows == 50
    assert _read(archive, archiveCredentials=SECRET) == rows
    assert _read(archive, archiveCredentialsFile=str(archive.secret_file)) == rows
    shown: list[str] = []
    for credentials in ({"archiveCredentials": "wrong-" + SECRET[::-1]}, {}):
        with pytest.raises(ArchiveAuthenticationError) as info:
            _read(archive, **credentials)
        assert info.value.archive_code is ArchiveErrorCode.AUTHENTICATION_REJECTED
        shown += [str(info.value), repr(info.value), repr(info.value.details)]
        shown.append(str(pickle.loads(pickle.dumps(info.value))))
    shown.append(caplog.text)
    for text in shown:
        assert SECRET not in text and SECRET[::-1] not in text, text
