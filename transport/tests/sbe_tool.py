"""The real SbeTool (``uk.co.real-logic:sbe-all``, pinned) for the golden tests, and Java codecs
generated from our own test schemas.

    python transport/tests/sbe_tool.py fetch     # download the pinned jar into .cache/sbe/

The jar comes from Maven Central over HTTPS (checked against its published SHA-1), or through
``mvn dependency:copy`` when the direct download fails. Tests call :func:`jar` (None when it
cannot be had: they skip, except with ``AERON_INTEROP_REQUIRED=1``, where they fail).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
SBE_VERSION = "1.38.1"
CACHE = ROOT / ".cache" / "sbe"
JAR = CACHE / f"sbe-all-{SBE_VERSION}.jar"
URL = (
    "https://repo1.maven.org/maven2/uk/co/real-logic/sbe-all/"
    f"{SBE_VERSION}/sbe-all-{SBE_VERSION}.jar"
)
FETCH_TIMEOUT_S = 60


def _download() -> None:
    with urllib.request.urlopen(URL + ".sha1", timeout=FETCH_TIMEOUT_S) as r:
        expected = r.read().decode().split()[0].strip()
    with urllib.request.urlopen(URL, timeout=FETCH_TIMEOUT_S) as r:
        data = r.read()
    got = hashlib.sha1(data).hexdigest()  # noqa: S324 - Maven Central publishes SHA-1
    if got != expected:
        raise RuntimeError(f"{URL}: SHA-1 {got}, Maven Central says {expected}")
    tmp = JAR.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(JAR)


def _mvn() -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact=uk.co.real-logic:sbe-all:{SBE_VERSION}",
                f"-DoutputDirectory={out}",
            ],
            check=True,
            timeout=300,
            stdout=subprocess.DEVNULL,
        )
        shutil.copy(Path(out) / JAR.name, JAR)


def fetch() -> Path:
    """The pinned jar in the cache, downloaded when missing. Raises when it cannot be had."""
    if JAR.exists():
        return JAR
    CACHE.mkdir(parents=True, exist_ok=True)
    errors = []
    for how in (_download, _mvn):
        try:
            how()
            return JAR
        except Exception as exc:  # noqa: BLE001 - try the next way, report all
            errors.append(f"{how.__name__}: {exc}")
    raise RuntimeError(f"cannot fetch sbe-all {SBE_VERSION}: " + "; ".join(errors))


def required() -> bool:
    return os.environ.get("AERON_INTEROP_REQUIRED") == "1"


def java_ready() -> str | None:
    """None when java and javac are on PATH, else what is missing."""
    missing = [t for t in ("java", "javac") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


def unavailable(reason: str) -> NoReturn:
    """Skip the calling test for ``reason`` (fail it with ``AERON_INTEROP_REQUIRED=1``)."""
    import pytest  # noqa: PLC0415 - tests only: ``fetch`` runs without pytest

    if required():
        pytest.fail(f"AERON_INTEROP_REQUIRED=1 but {reason}")
    pytest.skip(reason)


def ready_jar() -> Path:
    """The pinned jar, with java and javac on PATH; else :func:`unavailable`."""
    missing = java_ready()
    if missing:
        unavailable(missing)
    try:
        return fetch()
    except RuntimeError as exc:
        unavailable(str(exc))


def cached_build(
    name: str, inputs: Iterable[bytes], done: str, build: Callable[[Path], None]
) -> Path:
    """``CACHE/<name>-<hash>`` (the hash of the SbeTool version and ``inputs``): made, when its
    file ``done`` is missing, by ``build(directory)`` into a temporary directory renamed there."""
    digest = hashlib.sha256(SBE_VERSION.encode())
    for data in inputs:
        digest.update(data)
    built = CACHE / f"{name}-{digest.hexdigest()[:16]}"
    if not (built / done).exists():
        tmp = built.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        shutil.rmtree(built, ignore_errors=True)
        tmp.rename(built)
    return built


def main(argv: list[str]) -> int:
    if argv[1:] != ["fetch"]:
        print(__doc__)
        return 2
    print(fetch())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
