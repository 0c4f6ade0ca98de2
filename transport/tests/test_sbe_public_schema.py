"""Interop on large public schemas: the SBE message schemas the real Aeron ships in its jar on
Maven Central (``io.aeron:aeron-all``, pinned in ``aeron_peer.py``): ``aeron-cluster-codecs.xml``
and ``aeron-archive-codecs.xml`` (Apache-2.0; read from the jar, not kept in this repository).

For every message type of each: rows of random values over every field's range (groups, var data,
enums with nulls, sets) are encoded by our engine, decoded by SbeTool's on-the-fly decoder (Java,
from the same XML: ``data/sbe/otf/OtfDump.java``) to the values we wrote, and decoded back by our
engine to the same rows. (Java-encoded bytes of these schemas are decoded by our archive client in
the interop tests against the real archive; the golden suite checks Java -> us on our schemas.)

Skips without java/javac or the jars, except with ``AERON_INTEROP_REQUIRED=1`` (CI): fails.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import aeron_peer  # noqa: E402
import sbe_tool  # noqa: E402
import sbe_values as sv  # noqa: E402

from aeron_spark.transport import sbe  # noqa: E402

SCHEMAS = ("cluster/aeron-cluster-codecs.xml", "archive/aeron-archive-codecs.xml")
OTF = sv.DATA / "otf" / "OtfDump.java"
TOKENS = sv.DATA / "harness" / "Tokens.java"
JAVA_TIMEOUT_S = 180
ROWS_PER_MESSAGE = 60


@pytest.fixture(scope="module")
def otf() -> Path:
    """OtfDump compiled against the pinned SbeTool (cached under .cache/sbe by input hash)."""
    jar = sbe_tool.ready_jar()

    def build(tmp: Path) -> None:
        subprocess.run(
            ["javac", "-nowarn", "-cp", str(jar), "-d", str(tmp), str(OTF), str(TOKENS)],
            check=True,
            timeout=JAVA_TIMEOUT_S,
            capture_output=True,
        )

    inputs = (path.read_bytes() for path in (OTF, TOKENS))
    return sbe_tool.cached_build("otf", inputs, "OtfDump.class", build)


@pytest.fixture(scope="module")
def schemas() -> Iterator[dict[str, Path]]:
    """The public schemas, extracted from the pinned aeron-all jar into a temporary directory."""
    reason = aeron_peer.unavailable_reason()
    if reason is not None:
        sbe_tool.unavailable(reason)
    with tempfile.TemporaryDirectory() as out, zipfile.ZipFile(aeron_peer.jar_path()) as jar:
        paths = {}
        for name in SCHEMAS:
            target = Path(out) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(jar.read(name))
            paths[name] = target
        yield paths


def _otf(build: Path, schema: Path, payloads: list[bytes]) -> list[str]:
    done = subprocess.run(
        [
            "java",
            "--add-exports",
            "java.base/jdk.internal.misc=ALL-UNNAMED",
            "-cp",
            f"{build}:{sbe_tool.JAR}",
            "OtfDump",
            str(schema),
        ],
        input=b"".join(len(p).to_bytes(4, "little") + p for p in payloads),
        capture_output=True,
        timeout=JAVA_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode("ascii").splitlines()


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_message_of_a_public_schema(otf: Path, schemas: dict[str, Path], name: str) -> None:
    schema = sbe.parse_schema(str(schemas[name]))
    assert len(schema.messages) >= 30  # a large schema: every message type is checked below
    payloads: list[bytes] = []
    expected: list[list[str]] = []
    for seed, message in enumerate(schema.messages):
        codec = sbe.MessageCodec(schema, message)
        rows = sv.random_rows(message, ROWS_PER_MESSAGE, seed)
        ours = codec.encode(pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema))
        decoded, others = codec.decode(ours)
        assert len(others) == 0
        assert [sv.normal(r) for r in decoded.to_pylist()] == rows, message.name
        payloads += ours
        expected += [sv.block_tokens(message, r) for r in rows]
    lines = _otf(otf, schemas[name], payloads)
    assert len(lines) == len(expected)
    for i, (line, want) in enumerate(zip(lines, expected, strict=True)):
        got = line.split(" ") if line else []
        assert got == want, f"message {i} ({schema.messages[i // ROWS_PER_MESSAGE].name})"
