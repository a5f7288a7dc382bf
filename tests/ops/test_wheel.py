"""The built wheel holds every module of the source tree, and the Alembic environment
and versions that live at the top level in migrations/ as ``gpusched.migrations``; once
installed, it migrates a database with ``gpusched db upgrade``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from gpusched.db.migrate import alembic_config, current
from tests.pg import ScratchPostgres

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}{result.stderr}"
    return result


def _expected_files() -> set[str]:
    """What the wheel must hold: the package's modules and data, and migrations/ under
    gpusched/migrations/."""
    wanted = {"gpusched/py.typed"}
    for path in (ROOT / "gpusched").rglob("*.py"):
        wanted.add(path.relative_to(ROOT).as_posix())
    for path in (ROOT / "migrations").rglob("*"):
        if path.suffix in (".py", ".mako"):
            wanted.add("gpusched/" + path.relative_to(ROOT).as_posix())
    return wanted


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built offline from a copy of the source tree (the build writes beside
    its sources)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("gpusched", "migrations", "scripts"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
          "--no-build-isolation", "--wheel-dir", str(out), str(src)])
    (built,) = out.glob("gpusched-*.whl")
    return built


def test_the_wheel_holds_every_module_and_the_migrations(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    versions = [n for n in names if n.startswith("gpusched/migrations/versions/")
                and n.endswith(".py") and not n.endswith("__init__.py")]
    assert len(versions) >= 12
    assert {"gpusched/migrations/env.py", "gpusched/migrations/script.py.mako"} <= names
    missing = sorted(_expected_files() - names)
    assert not missing, f"not in the wheel (list the package in pyproject.toml): {missing}"
    assert not [n for n in names if n.startswith("migrations/")]
    scripts = {n.rsplit("/", 1)[-1] for n in names if ".data/scripts/" in n}
    assert scripts == {p.name for p in (ROOT / "scripts").iterdir()}
    assert {"gsubmit", "gqueue", "gcancel", "gsrun", "galloc"} <= scripts


def test_an_installed_wheel_migrates_a_database(wheel: Path, tmp_path: Path,
                                                postgres: ScratchPostgres) -> None:
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
          "--target", str(target), str(wheel)])
    env = {**os.environ, "PYTHONPATH": str(target)}
    found = _run([sys.executable, "-P", "-c",
                  "import gpusched.migrations as m; print(m.__file__)"],
                 env=env, cwd=tmp_path).stdout.strip()
    assert found == str(target / "gpusched" / "migrations" / "__init__.py")
    url = postgres.empty_database()
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None and current(url) is None
    shown = _run([sys.executable, "-P", "-m", "gpusched.cli.gpusched", "db", "upgrade",
                  "--database-url", url], env=env, cwd=tmp_path).stdout
    assert shown.strip() == f"database at revision {head}"
    assert current(url) == head
