"""What an installed copy holds: every sub-package of specdec_ext is named in pyproject.toml's package list
(a folder left out installs without its modules, and the package then fails to import outside the source tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> tuple[set[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(setuptools["packages"]), setuptools.get("package-dir", {})


def test_every_subpackage_is_installed():
    packages, _ = _declared()
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "specdec_ext").rglob("__init__.py") if "__pycache__" not in init.parts}
    missing = found - packages
    assert not missing, f"pyproject.toml's [tool.setuptools] packages leaves out {sorted(missing)}"


def test_every_declared_package_exists():
    packages, package_dir = _declared()
    for name in packages:
        folder = package_dir.get(name, name.replace(".", "/"))
        assert (ROOT / folder / "__init__.py").is_file(), f"{name}: {folder}/__init__.py does not exist"
