"""``docker-compose.yml`` read as a topology: which named volumes each service mounts, where a
path of a service's container lies on the host when each named volume is a host directory
(``<volumes_root>/<volume>``), and which volumes each Spark worker cannot see.

``spark_tests/test_cluster.py`` runs the demo on one host from this, so that a worker sees only
what the compose file mounts on it (the rest is hidden behind a private tmpfs, see
``spark_tests/_cluster.py``), and checks the file itself.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class Mount:
    volume: str  # a named volume of the file's top-level ``volumes``
    target: str  # where it is in the container


def load(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        compose = yaml.safe_load(fh)  # resolves the file's ``<<: *app`` merge keys
    assert isinstance(compose, dict) and isinstance(compose.get("services"), dict), path
    return compose


def _service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    service = compose["services"].get(name)
    assert isinstance(service, dict), f"no service {name!r} in the compose file"
    return service


def command(compose: dict[str, Any], name: str) -> list[str]:
    cmd = _service(compose, name).get("command", [])
    return [str(c) for c in cmd] if isinstance(cmd, list) else str(cmd).split()


def argument(compose: dict[str, Any], name: str, flag: str) -> str:
    """The value after ``flag`` in a service's command."""
    cmd = command(compose, name)
    assert flag in cmd, f"{name}'s command has no {flag}: {cmd}"
    return cmd[cmd.index(flag) + 1]


def mounts(compose: dict[str, Any], name: str) -> list[Mount]:
    """The named volumes mounted on a service (bind mounts and tmpfs are not named volumes)."""
    named = set(compose.get("volumes") or {})
    out: list[Mount] = []
    for entry in _service(compose, name).get("volumes") or []:
        if isinstance(entry, dict):
            source, target = entry.get("source"), entry.get("target")
        else:
            source, _, rest = str(entry).partition(":")
            target = rest.split(":", 1)[0]
        if source in named and target:
            out.append(Mount(str(source), posixpath.normpath(str(target))))
    return out


def workers(compose: dict[str, Any]) -> list[str]:
    return sorted(n for n in compose["services"] if WORKER_CLASS in command(compose, n))


def mount_of(compose: dict[str, Any], name: str, path: str) -> Mount | None:
    """The named volume holding ``path`` in a service's container (the deepest mount), if any."""
    path = posixpath.normpath(path)
    best: Mount | None = None
    for m in mounts(compose, name):
        if (path == m.target or path.startswith(m.target.rstrip("/") + "/")) and (
            best is None or len(m.target) > len(best.target)
        ):
            best = m
    return best


def host_path(compose: dict[str, Any], name: str, path: str, volumes_root: Path) -> Path:
    """Where a path of a service's container is on the host: ``volumes_root/<volume>/<rest>``."""
    m = mount_of(compose, name, path)
    assert m is not None, (
        f"{path} of {name} is on no named volume: it would be lost with the "
        "container and no other service could see it"
    )
    return volumes_root / m.volume / posixpath.relpath(posixpath.normpath(path), m.target)


def hidden_volumes(compose: dict[str, Any], worker: str) -> list[str]:
    """Named volumes a worker cannot see where the other services see them: not mounted on it,
    or mounted at another path than where every other service has it."""
    targets: dict[str, set[str]] = {}
    for name in compose["services"]:
        for m in mounts(compose, name):
            targets.setdefault(m.volume, set()).add(m.target)
    own = set(mounts(compose, worker))
    return sorted(
        v for v, ts in targets.items() if len(ts) != 1 or Mount(v, next(iter(ts))) not in own
    )
