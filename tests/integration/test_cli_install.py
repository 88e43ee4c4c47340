"""archive-ctl as an installed command: `pip install .` gives an `archive-ctl` on PATH that
finds its SQL and talks to the services (`make venv` installing the checkout is checked in
tests/docs/test_as_written.py). The wheel is built from a copy of the checkout, so the tree
under test stays clean."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from lib import __version__
from tests.support import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=HANG_SECONDS * 3, check=False, **kw
    )


@pytest.mark.slow
def test_pip_install_puts_a_working_archive_ctl_on_path(
    tmp_path: Path, pg_dsn: str, db: Any
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy2(ROOT / name, checkout / name)
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("*.egg-info"))

    built = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", "dist", ".",
                cwd=checkout)  # fmt: skip
    assert built.returncode == 0, built.stderr
    [wheel] = (checkout / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lib/sql/queries.sql" in names
    assert "lib/sql/archive_migration.sql" in names

    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", str(venv)).returncode == 0
    # The wheel's dependencies are this run's own (no index needed): on the new venv's path.
    [packages] = venv.glob("lib/python3*/site-packages")
    (packages / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-deps", str(wheel))  # fmt: skip
    assert installed.returncode == 0, installed.stderr

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "DATABASE_URL": pg_dsn}
    version = run("archive-ctl", "--version", env=env, cwd=tmp_path)
    assert version.stdout == f"archive-ctl {__version__}\n", version.stderr
    # It reads its SQL from the installed package: the plan of an up-to-date schema.
    migrate = run("archive-ctl", "migrate", "--dry-run", env=env, cwd=tmp_path)
    assert migrate.returncode == 0, migrate.stderr
    assert "dry run: 0 changes planned" in migrate.stdout
    where = run(str(venv / "bin" / "python"), "-c", "import lib; print(lib.__file__)", env=env)
    assert where.stdout.startswith(str(packages)), where.stdout  # not the checkout's src/
