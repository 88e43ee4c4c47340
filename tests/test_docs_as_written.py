"""The docs' instructions work as written: the make targets they name set up what they use,
and what docs/deploy.md says the stack creates is what the template creates."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_template import translated

ROOT = Path(__file__).resolve().parents[1]
# What a fresh clone has that the make targets read (no .venv, no .venv-sam).
BUILD_FILES = (
    "Makefile",
    "mk",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-sam.txt",
    "constraints.txt",
    "template.yaml",
)


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    assert shutil.which("make"), "make is not installed"
    for name in BUILD_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        else:
            shutil.copy2(source, tmp_path / name)
    return tmp_path


# Variables the Makefile takes from the environment; a developer's (or this test run's,
# e.g. SAM for tests/test_template.py) must not leak into the fresh clone's run.
MAKE_VARIABLES = ("SAM", "VENV", "SAM_VENV", "PY", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")


def dry_run(directory: Path, *args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.splitlines()


def first(lines: list[str], fragment: str) -> int:
    matches = [i for i, line in enumerate(lines) if fragment in line]
    assert matches, f"{fragment!r} is not in:\n" + "\n".join(lines)
    return matches[0]


def test_template_check_in_a_fresh_clone_creates_the_venvs_it_runs(fresh_clone: Path) -> None:
    lines = dry_run(fresh_clone, "template-check")
    assert first(lines, "-m venv .venv") < first(lines, ".venv/bin/cfn-lint")
    assert first(lines, "-m venv .venv-sam") < first(lines, ".venv-sam/bin/sam validate")


def test_sam_build_in_a_fresh_clone_creates_the_sam_venv(fresh_clone: Path) -> None:
    lines = dry_run(fresh_clone, "sam-build")
    assert first(lines, "-m venv .venv-sam") < first(lines, ".venv-sam/bin/sam build")


def test_a_sam_from_elsewhere_needs_no_sam_venv(fresh_clone: Path) -> None:
    lines = dry_run(fresh_clone, "sam-validate", "SAM=/opt/sam/bin/sam")
    assert not any(".venv-sam" in line for line in lines)
    assert first(lines, "/opt/sam/bin/sam validate") >= 0


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def test_deploy_doc_counts_the_iam_roles_the_stack_creates() -> None:
    roles = sorted(
        name for name, r in translated()["Resources"].items() if r["Type"] == "AWS::IAM::Role"
    )
    text = " ".join((ROOT / "docs" / "deploy.md").read_text(encoding="utf-8").split())
    claims = re.findall(r"creates (\w+) IAM roles", text)
    assert claims, "docs/deploy.md no longer says how many IAM roles the stack creates"
    assert [NUMBERS.get(word) for word in claims] == [len(roles)] * len(claims), roles
    for name in roles:
        assert f"`{name}`" in text, f"docs/deploy.md does not name the role {name}"
