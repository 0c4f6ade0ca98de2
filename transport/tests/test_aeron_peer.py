"""The fetch command for the real Aeron jar fails loudly (CI relies on it) and caches its jar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PEER = Path(__file__).with_name("aeron_peer.py")


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PEER), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_fetch_without_maven_fails_with_a_clear_message(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin"), "AERON_JAR_DIR": str(tmp_path)}
    done = _run("fetch", env=env)
    assert done.returncode == 1
    assert "ERROR: cannot fetch io.aeron:aeron-all:1.47.3: no `mvn` on PATH" in done.stderr
    assert not list(tmp_path.glob("*.jar"))


def test_path_reports_a_missing_jar_and_how_to_fetch_it(tmp_path: Path) -> None:
    done = _run("path", env={**os.environ, "AERON_JAR_DIR": str(tmp_path)})
    assert done.returncode == 1
    assert "aeron-all-1.47.3.jar is missing" in done.stderr
    assert "python transport/tests/aeron_peer.py fetch" in done.stderr


def test_fetch_keeps_a_jar_already_there(tmp_path: Path) -> None:
    """A cached jar is used as is: no Maven run (PATH has none), same path printed."""
    jar = tmp_path / "aeron-all-1.47.3.jar"
    jar.write_bytes(b"PK\x03\x04 cached")
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin"), "AERON_JAR_DIR": str(tmp_path)}
    done = _run("fetch", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(jar)
    assert jar.read_bytes() == b"PK\x03\x04 cached"
