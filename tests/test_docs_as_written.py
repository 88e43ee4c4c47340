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


# ---------------------------------------------------------------- what deploy.md and README say


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def table_rows(text: str, section: str) -> dict[str, list[str]]:
    """The first table under `## section`, by the backquoted name in its first cell."""
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        name = re.match(r"`(\w+)`", cells[0]) if line.startswith("|") else None
        if name:
            rows[name.group(1)] = cells
    return rows


def test_every_alarm_is_documented_shown_and_has_a_runbook_step() -> None:
    from tests.test_template import alarm_names

    alarms = alarm_names()
    deploy, readme, operations = (
        read("docs/deploy.md"),
        read("README.md"),
        read("docs/operations.md"),
    )
    documented = table_rows(deploy, "Alarms")
    assert set(documented) == set(alarms), "docs/deploy.md's alarm table"
    headings = {
        heading_anchor(line.lstrip("#")): line
        for line in operations.splitlines()
        if line.startswith("### ")
    }
    for name in alarms:
        assert f"`{name}`" in readme, f"README.md does not name {name}"
        [link] = re.findall(r"\(operations\.md#([\w-]+)\)", documented[name][-1])
        assert link in headings, f"{name}: runbook link #{link} is not a heading of operations.md"
        assert f"`{name}`" in headings[link], f"the runbook step for {name} does not name it"


def test_deploy_doc_states_no_stale_count_of_alarms() -> None:
    text = " ".join(read("docs/deploy.md").split())
    counted = re.findall(r"\b(\w+) alarms\b", text)
    numbers = set(NUMBERS) | {"six", "seven", "eight", "nine", "ten", "eleven", "twelve"}
    assert not [word for word in counted if word in numbers or word.isdigit()], counted


def test_deploy_doc_names_every_output() -> None:
    from tests.test_template import template

    text = read("docs/deploy.md")
    outputs = text.split("\nOutputs: ", 1)[1].split("\n\n", 1)[0]
    for name in template()["Outputs"]:
        assert f"`{name}`" in outputs, f"docs/deploy.md's outputs omit {name}"


def test_deploy_doc_says_what_reserved_concurrency_needs() -> None:
    text = " ".join(read("docs/deploy.md").split())
    assert "100 unreserved concurrent executions" in text


def test_the_parameter_table_has_every_parameter_with_its_default() -> None:
    from tests.test_template import template

    rows = table_rows(read("docs/deploy.md"), "Parameters")
    parameters = template()["Parameters"]
    assert set(rows) == set(parameters), "docs/deploy.md's parameter table"
    required = {"DbSecretArn", "LskyTokenSecretArn", "LskyBaseUrl"}  # rules or no default
    for name, param in parameters.items():
        default = rows[name][1]
        if name in required:
            assert default == "(required)", name
        elif param.get("Default", "") == "":
            assert default == "empty", name
        else:
            assert default == f"`{param['Default']}`", (name, default, param["Default"])
        assert all(cell for cell in rows[name][2:]), f"{name}: an empty cell"
        for bound in ("MinValue", "MaxValue"):
            if bound in param:
                assert str(param[bound]) in rows[name][2], (name, bound)
    # A parameter no production operator should turn says so, here and in the template.
    guard = rows["ArchiveAllowPrivateNetworks"][4]
    assert "never set it in production" in guard
    assert "LOCAL TESTING ONLY" in parameters["ArchiveAllowPrivateNetworks"]["Description"]
