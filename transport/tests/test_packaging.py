"""pyproject.toml lists every package folder, mapped to the right import name."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = config["package-dir"]
    listed = set(config["packages"])
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "tests" in rel.parts or any(part.startswith(".") for part in rel.parts):
                continue
            if any(
                m != name and (ROOT / f).resolve() == init.parent.resolve()
                for m, f in mapping.items()
            ):
                continue
            found.add(".".join((name, *rel.parts)) if rel.parts else name)
    # Folders mapped to their own import name are found through their own mapping entry.
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"
    missing = {p for p in listed if not any(p == n or p.startswith(n + ".") for n in mapping)}
    assert not missing, f"packages without a package-dir mapping: {sorted(missing)}"
