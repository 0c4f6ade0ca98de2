"""Golden tests of the SBE engine against the real SbeTool (``uk.co.real-logic:sbe-all``, pinned
in ``sbe_tool.py``): Java codecs generated from our own schemas (``data/sbe/``) and compiled with
javac, driven by our harness (``data/sbe/harness/``) over thousands of messages, both ways:

- bytes the Java encoders write decode in our engine to the values they were given;
- bytes our encoder writes decode in the Java decoders to the values we gave (and are byte for
  byte what the Java encoders write);
- evolution: Java v1 messages decode in our v0 reader, our v0 messages in the Java v1 decoders.

Values: hypothesis-drawn rows (edges) plus seeded random rows (bulk). Skips when java/javac or the
jar cannot be had, except with ``AERON_INTEROP_REQUIRED=1`` (CI), where it fails.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sbe_tool  # noqa: E402
import sbe_values as sv  # noqa: E402

from aeron_spark.transport import sbe  # noqa: E402

HARNESS = sv.DATA / "harness"
SCHEMAS = {
    "v1": sv.DATA / "golden-v1.xml",
    "be": sv.DATA / "golden-be.xml",
    "venue": sv.DATA / "golden-venue.xml",  # includes golden-venue-types.xml
}
JAVA_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def java() -> Path:
    """Generated codecs and the harness, compiled (cached under .cache/sbe by input hash)."""
    jar = sbe_tool.ready_jar()

    def build(tmp: Path) -> None:
        generated = tmp / "generated"
        for schema in SCHEMAS.values():
            subprocess.run(
                [
                    "java",
                    f"-Dsbe.output.dir={generated}",
                    "-Dsbe.target.language=Java",
                    "-Dsbe.validation.stop.on.error=true",
                    "-Dsbe.xinclude.aware=true",
                    "-jar",
                    str(jar),
                    str(schema),
                ],
                check=True,
                timeout=JAVA_TIMEOUT_S,
                capture_output=True,
            )
        sources = [str(p) for p in generated.rglob("*.java")] + [
            str(p) for p in HARNESS.glob("*.java")
        ]
        subprocess.run(
            ["javac", "-nowarn", "-cp", str(jar), "-d", str(tmp), *sources],
            check=True,
            timeout=JAVA_TIMEOUT_S,
            capture_output=True,
        )

    inputs = sorted([*sv.DATA.glob("golden-*.xml"), *HARNESS.glob("*.java")])
    return sbe_tool.cached_build(
        "build", (p.name.encode() + p.read_bytes() for p in inputs), "Harness.class", build
    )


def _run(build: Path, args: list[str], data: bytes) -> bytes:
    cp = f"{build}:{sbe_tool.JAR}"
    # Agrona (SbeTool's buffers) reads Unsafe from java.base on Java 17+
    done = subprocess.run(
        [
            "java",
            "--add-exports",
            "java.base/jdk.internal.misc=ALL-UNNAMED",
            "-cp",
            cp,
            "Harness",
            *args,
        ],
        input=data,
        capture_output=True,
        timeout=JAVA_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout


def _frame(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack("<i", len(p)) + p for p in payloads)


def _unframe(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from("<i", data, at)
        out.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def _rows(codec: sbe.MessageCodec, seed: int, examples: int, bulk: int) -> list[dict]:
    return sv.draw_rows(sv.row_strategy(codec.message), examples) + sv.random_rows(
        codec.message, bulk, seed
    )


def _assert_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sv.normal(g) == w, f"message {i}"


def _assert_tokens(lines: list[str], block: sbe.schema.Block, rows: list[dict]) -> None:
    assert len(lines) == len(rows)
    for i, (line, row) in enumerate(zip(lines, rows, strict=True)):
        assert line.split(" ") == sv.block_tokens(block, row), f"message {i}"


CASES = [
    ("v1", "Tick", 1, 3000),
    ("v1", "Order", 2, 2000),
    ("be", "Quote", 3, 2000),
    ("venue", "Exec", 4, 2000),
]


@pytest.mark.parametrize(("schema", "message", "seed", "bulk"), CASES)
def test_both_ways_against_sbetool(
    java: Path, schema: str, message: str, seed: int, bulk: int
) -> None:
    codec = sbe.load(str(SCHEMAS[schema]), message)
    rows = _rows(codec, seed, 40, bulk)
    batch = pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema)
    ours = codec.encode(batch)
    # our bytes -> Java decoders
    lines = _run(java, [schema, "decode", message], _frame(ours)).decode("ascii").splitlines()
    _assert_tokens(lines, codec.message, rows)
    # Java encoders -> our decoder
    tokens = "\n".join(" ".join(sv.block_tokens(codec.message, r)) for r in rows) + "\n"
    theirs = _unframe(_run(java, [schema, "encode", message], tokens.encode("ascii")))
    decoded, others = codec.decode(theirs)
    assert len(others) == 0
    _assert_rows(decoded.to_pylist(), rows)
    if schema in ("v1", "venue"):  # no gaps in these layouts: every byte is defined
        assert theirs == ours


@pytest.mark.parametrize("message", ["Tick", "Order"])
def test_evolution_against_sbetool(java: Path, message: str) -> None:
    v0 = sbe.load(str(sv.DATA / "golden-v0.xml"), message)
    v1 = sbe.load(str(SCHEMAS["v1"]), message)
    rows = _rows(v1, 7, 20, 1000)
    # a newer writer (Java, v1: longer blocks, more fields and data) read by our v0 reader
    tokens = "\n".join(" ".join(sv.block_tokens(v1.message, r)) for r in rows) + "\n"
    theirs = _unframe(_run(java, ["v1", "encode", message], tokens.encode("ascii")))
    decoded, _ = v0.decode(theirs)
    _assert_rows(decoded.to_pylist(), [sv.project(v0.message, r) for r in rows])
    # an older writer (ours, v0) read by the Java v1 decoders: v1's fields are their null values
    old = [sv.project(v0.message, r) for r in rows]
    ours = v0.encode(pa.RecordBatch.from_pylist(old, schema=v0.arrow_schema))
    lines = _run(java, ["v1", "decode", message], _frame(ours)).decode("ascii").splitlines()
    _assert_tokens(lines, v1.message, [sv.project(v1.message, r) for r in old])
    # and our v1 reader sees the same: fields newer than the message are null
    decoded, _ = v1.decode(ours)
    _assert_rows(decoded.to_pylist(), [sv.project(v1.message, r) for r in old])
