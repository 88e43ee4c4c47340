"""The docs' instructions work as written: the make targets they name set up what they use,
what the docs say the stack creates is what the template creates, and every
example a reader would copy runs: Python and SQL blocks against the test services,
archive-ctl lines through the real parser, parameter values through the template."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.docs.markdown import (
    CODE_MAP,
    CONFIGURATION,
    FIRST_DEPLOY,
    INDEX,
    ROOT,
    RUNBOOK,
    STACK,
    anchors,
    every_doc,
    fenced_blocks,
    heading_anchor,
    inline_spans,
    read,
    table_rows,
)
from tests.test_template import translated

# What a fresh clone has that the make targets read (no .venv, no .venv-sam).
BUILD_FILES = (
    "Makefile",
    "mk",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-sam.txt",
    "constraints.txt",
    "pyproject.toml",
    "template.yaml",
    "tests/producer_ts/package.json",
    "tests/producer_ts/package-lock.json",
)


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    assert shutil.which("make"), "make is not installed"
    for name in BUILD_FILES:
        source = ROOT / name
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
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


def test_make_venv_installs_the_checkout_with_its_console_script(fresh_clone: Path) -> None:
    """.venv/bin/archive-ctl after `make venv` (pyproject.toml [project.scripts])."""
    lines = dry_run(fresh_clone, "venv")
    requirements = first(lines, "pip install -q -r requirements-dev.txt")
    assert first(lines, "pip install -q --no-deps -e .") > requirements


def test_sam_build_in_a_fresh_clone_creates_the_sam_venv(fresh_clone: Path) -> None:
    lines = dry_run(fresh_clone, "sam-build")
    assert first(lines, "-m venv .venv-sam") < first(lines, ".venv-sam/bin/sam build")


def test_a_sam_from_elsewhere_needs_no_sam_venv(fresh_clone: Path) -> None:
    lines = dry_run(fresh_clone, "sam-validate", "SAM=/opt/sam/bin/sam")
    assert not any(".venv-sam" in line for line in lines)
    assert first(lines, "/opt/sam/bin/sam validate") >= 0


def test_the_busy_check_is_a_target_of_its_own_outside_make_test(fresh_clone: Path) -> None:
    busy = dry_run(fresh_clone, "test-busy")
    assert first(busy, "-m venv .venv") < first(busy, "scripts/test-busy.sh")
    assert not [line for line in dry_run(fresh_clone, "test") if "test-busy" in line]


@pytest.mark.parametrize(("pytest_command", "code"), [("true", 0), ("false", 1)])
def test_the_busy_check_reports_its_runs_and_stops_its_spinners(
    pytest_command: str, code: int
) -> None:
    env = {**os.environ, "BUSY": "2", "RUNS": "2", "PYTEST": shutil.which(pytest_command) or ""}
    result = subprocess.run(
        [str(ROOT / "scripts" / "test-busy.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stdout.count("== run ") == 2
    [spinning] = re.findall(r"^== spinning: (.*)$", result.stdout, re.M)
    pids = spinning.split()
    assert len(pids) == 2
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []  # all stopped


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def test_the_stack_page_counts_the_iam_roles_the_stack_creates() -> None:
    roles = sorted(
        name for name, r in translated()["Resources"].items() if r["Type"] == "AWS::IAM::Role"
    )
    text = " ".join(read(STACK).split())
    claims = re.findall(r"creates (\w+) IAM roles", text)
    assert claims, f"{STACK} no longer says how many IAM roles the stack creates"
    assert [NUMBERS.get(word) for word in claims] == [len(roles)] * len(claims), roles
    for name in roles:
        assert f"`{name}`" in text, f"{STACK} does not name the role {name}"


# ---------------------------------------------------------------- what deploy.md and README say


def test_every_alarm_is_documented_and_has_a_runbook_step() -> None:
    from tests.test_template import alarm_names

    alarms = alarm_names()
    documented = table_rows(read(STACK), "## Alarms")
    assert set(documented) == set(alarms), f"{STACK}'s alarm table"
    headings = {
        heading_anchor(line.lstrip("#")): line
        for line in read(RUNBOOK).splitlines()
        if line.startswith("## ")
    }
    for name in alarms:
        [link] = re.findall(r"\(\.\./how-to/runbook\.md#([\w-]+)\)", documented[name][-1])
        assert link in headings, f"{name}: runbook link #{link} is not a heading of {RUNBOOK}"
        assert f"`{name}`" in headings[link], f"the runbook step for {name} does not name it"
    # The index sends the reader to that table.
    assert "](reference/stack.md" in read(INDEX)


def test_no_doc_states_a_count_of_alarms() -> None:
    text = " ".join(" ".join(every_doc().values()).split())
    counted = re.findall(r"\b(\w+) alarms\b", text)
    numbers = set(NUMBERS) | {"six", "seven", "eight", "nine", "ten", "eleven", "twelve"}
    assert not [word for word in counted if word in numbers or word.isdigit()], counted


def test_the_stack_page_names_every_output() -> None:
    from tests.test_template import template

    text = read(STACK)
    outputs = text.split("\nOutputs: ", 1)[1].split("\n\n", 1)[0]
    for name in template()["Outputs"]:
        assert f"`{name}`" in outputs, f"{STACK}'s outputs omit {name}"


def test_deploy_doc_says_what_reserved_concurrency_needs() -> None:
    text = " ".join(read(FIRST_DEPLOY).split())
    assert "100 unreserved concurrent executions" in text


def test_the_parameter_table_has_every_parameter_with_its_default() -> None:
    from tests.test_template import template

    rows = table_rows(read(CONFIGURATION), "## Parameters")
    parameters = template()["Parameters"]
    assert set(rows) == set(parameters), f"{CONFIGURATION}'s parameter table"
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


# ---------------------------------------------------------------- examples run as written


def test_python_examples_run_as_written(
    pg_dsn: str, db: Any, queues: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ```python block, executed against the test database and queue; a line
    `expr  # <a Python literal>` must evaluate to that literal."""
    from tests.support import seed_record

    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    monkeypatch.setenv("ARCHIVE_QUEUE_URL", queues.url)
    blocks = [
        (name, body)
        for name, text in every_doc().items()
        for lang, body in fenced_blocks(text)
        if lang == "python"
    ]
    assert blocks, "no Python example found"
    for name, body in blocks:
        for record_id in (123, 124):  # the ids the examples use
            db.run("DELETE FROM image_generation_records WHERE id = :id", id=record_id)
            seed_record(
                db, record_id, image_url="https://cdn.example.com/a.png", archive_status=None
            )
        namespace: dict[str, Any] = {}
        exec(compile(body, f"{name} (python block)", "exec"), namespace)  # noqa: S102
        for line in body.splitlines():
            expression, _, comment = line.partition("  # ")
            try:
                expected = ast.literal_eval(comment.strip())
            except (ValueError, SyntaxError):
                continue
            assert eval(expression, namespace) == expected, (name, line)  # noqa: S307
    sent = sqs.receive_message(QueueUrl=queues.url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(json.loads(m["Body"])["recordId"] for m in sent) == ["123", "124"]


def test_sql_examples_run_as_written(db: Any) -> None:
    """Each ```sql block but the grants (tests/integration/test_database_grants.py runs
    those as the role they create)."""
    blocks = [
        body
        for text in every_doc().values()
        for lang, body in fenced_blocks(text)
        if lang == "sql" and "GRANT" not in body
    ]
    assert blocks, "no SQL example found"
    for body in blocks:
        for statement in filter(None, (s.strip() for s in body.split(";"))):
            db.run(statement)


# Placeholders the docs write where a value goes.
PLACEHOLDERS = {"ID": "123", "RECORD_ID": "123", "WHEN": "24h", "N": "10", "HANDLE": "h"}
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", "2>", "2>&1"}


def archive_ctl_argv(command: str) -> list[str] | None:
    """The arguments after `archive-ctl` in a shell line, or None when it runs no
    archive-ctl (the name only in a comment, or a path)."""
    words = shlex.split(command.split(" # ", 1)[0].removeprefix("$ "), comments=False)
    starts = [i for i, word in enumerate(words) if word.rsplit("/", 1)[-1] == "archive-ctl"]
    if not starts or (starts[0] > 0 and words[starts[0] - 1] not in SHELL_OPERATORS):
        return None
    argv: list[str] = []
    for word in words[starts[0] + 1 :]:
        if word in SHELL_OPERATORS:
            break
        argv.append(PLACEHOLDERS.get(word, word))
    return argv


def archive_ctl_examples() -> list[tuple[str, str, list[str]]]:
    """(doc, line, argv) of every archive-ctl command a reader could copy: lines of shell
    blocks, `$ ` lines of output blocks, and inline spans that are not synopses."""
    found = []
    for name, text in every_doc().items():
        lines = [
            line.strip()
            for lang, body in fenced_blocks(text)
            for line in body.splitlines()
            if lang == "sh" or line.lstrip().startswith("$ ")
        ]
        lines += [span for span in inline_spans(text) if "archive-ctl" in span]
        for line in lines:
            if "[" in line or "..." in line or "…" in line.split("|")[-1]:
                continue  # a synopsis (`requeue --failed [--since WHEN]`), not a command
            argv = archive_ctl_argv(line)
            if argv is not None:
                found.append((name, line, argv))
    return found


def test_archive_ctl_examples_parse_with_the_real_parser() -> None:
    from lib.cli.main import build_parser

    examples = archive_ctl_examples()
    assert len(examples) > 20, examples
    refused = []
    for name, line, argv in examples:
        parser = build_parser()
        try:
            with contextlib.redirect_stderr(io.StringIO()) as errors:
                parser.parse_args(argv)
        except SystemExit:
            # Prose may name the tool, or a command that takes arguments (`archive-ctl
            # enqueue`): words only, and refused only for what is missing.
            named = all(re.fullmatch(r"[a-z-]+", word) for word in argv)
            if not (named and "required" in errors.getvalue()):
                refused.append((name, line, errors.getvalue().strip().splitlines()[-1:]))
    assert not refused, refused


def test_template_values_in_the_docs_pass_the_template_and_the_code() -> None:
    """`Parameter=value` in shell lines (sam deploy --parameter-overrides) and
    `VARIABLE=value` in inline code go through the template's own checks, and a variable's
    value through the code's (tests/test_template.py's table)."""
    from tests.test_template import SETTINGS, config_verdict, template, template_accepts

    parameters = template()["Parameters"]
    by_variable = {setting.variable: setting for setting in SETTINGS}
    checked = []
    for name, text in every_doc().items():
        shell = " ".join(body for lang, body in fenced_blocks(text) if lang == "sh")
        for key, value in re.findall(r"\b([A-Z][A-Za-z0-9]+)=(\S+)", shell):
            if key in parameters:
                checked.append((name, key, value, template_accepts(key, value)))
        for span in inline_spans(text):
            match = re.fullmatch(r"([A-Z][A-Z0-9_]+)=(.+)", span)
            if match and match.group(1) in by_variable:
                setting = by_variable[match.group(1)]
                value = match.group(2)
                ok = template_accepts(setting.parameter, value)
                checked.append((name, setting.variable, value, ok))
                checked.append((name, "code", value, config_verdict(setting, value) == "ok"))
    # The parameter table's examples ("e.g. `20/minute,100/hour` or `10/30 seconds`").
    for parameter, cells in table_rows(read(CONFIGURATION), "## Parameters").items():
        examples = re.findall(r"e\.g\. `([^`]+)`(?: or `([^`]+)`)?", cells[4])
        for value in (v for pair in examples for v in pair if v):
            checked.append((CONFIGURATION, parameter, value, template_accepts(parameter, value)))
    assert {"LskyRateLimits", "DbSslMode", "LSKY_RATE_LIMITS"} <= {c[1] for c in checked}
    assert [c for c in checked if not c[3]] == []


def ignored(path: str) -> bool:
    """Git ignores it: made by running something (bench/results/, src/certs/)."""
    check = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
    return check.returncode == 0


def test_docs_point_only_at_what_the_repository_has() -> None:
    """Links (and their anchors) and backquoted paths name files that exist; no doc
    refers to a design document the repository does not ship."""
    missing = []
    for name, text in every_doc().items():
        here = (ROOT / name).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            document = (here / path).resolve() if path else ROOT / name
            known = document.exists() and (
                not anchor or anchor in anchors(document.read_text(encoding="utf-8"))
            )
            if not known:
                missing.append((name, target))
        for span in inline_spans(text):
            is_path = re.fullmatch(
                r"(src|tests|docs|devkit|bench|scripts|mk|events)/[\w./-]+", span
            )
            if is_path and not (ROOT / span.rstrip("/")).exists() and not ignored(span):
                missing.append((name, span))
        if "DESIGN.md" in text:
            missing.append((name, "DESIGN.md (not in the repository)"))
    assert missing == []


def test_deploy_doc_counts_what_the_migration_declares() -> None:
    from lib.platform.migration_file import RECORDS, load_declaration

    declared = load_declaration()
    text = " ".join(read(FIRST_DEPLOY).split())
    counts = re.search(
        r"\((\d+) columns, (\d+) of them on `(\w+)`, (\d+) indexes, (\d+) constraints?"
        r" and (\d+) project tables\)",
        text,
    )
    assert counts, f"{FIRST_DEPLOY} no longer says what the migration declares"
    assert counts.group(3) == RECORDS
    assert [int(counts.group(n)) for n in (1, 2, 4, 5, 6)] == [
        len(declared.columns),
        len(declared.columns_of(RECORDS)),
        len(declared.indexes),
        len(declared.constraints),
        len(declared.tables),
    ]


def make_targets_named() -> set[str]:
    """Every `make TARGET` the README and docs give a reader."""
    named = set()
    for text in every_doc().values():
        lines = [line for _, body in fenced_blocks(text) for line in body.splitlines()]
        for line in lines + inline_spans(text):
            named |= set(re.findall(r"(?:^|[\s`(])make ([a-z][\w-]*)", line))
    return named


def test_every_make_target_the_docs_name_exists_and_make_help_lists_it(
    fresh_clone: Path,
) -> None:
    named = make_targets_named()
    assert {"local", "test", "help", "bench"} <= named, named
    shown = subprocess.run(
        ["make", "--no-print-directory", "-s", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "make local ARGS=--short" in shown
    for target in sorted(named - {"help"}):
        assert f"make {target} " in shown or f"make {target}," in shown, f"make help: {target}"
        dry_run(fresh_clone, target)  # fails (check=True) on a target make does not know


def test_the_readme_is_a_front_page() -> None:
    """At most 150 lines: what it is, the picture, how to run and deploy it, the figures,
    and links; the rest is in docs/, whose index it links (tests/docs/test_links.py: every
    page is reachable from the index)."""
    lines = read("README.md").splitlines()
    assert len(lines) <= 150, len(lines)
    assert f"]({INDEX})" in read("README.md"), "the README does not link the docs' index"


def code_map() -> dict[str, list[str]]:
    """The code map: folder -> the files its section's table names."""
    rows: dict[str, list[str]] = {}
    folder = None
    for line in read(CODE_MAP).splitlines():
        heading = re.match(r"## `(src/[\w/]+/)`", line)
        if heading:
            folder = heading.group(1)
            rows[folder] = []
        elif line.startswith("## "):
            folder = None
        elif folder and line.startswith("| `"):
            rows[folder] += re.findall(r"^\| `(\w+\.(?:py|sql))` \|", line)
    return rows


def test_the_code_map_names_every_module_where_it_is() -> None:
    rows = code_map()
    assert {"src/lib/state/", "src/lib/archive/", "src/lib/platform/", "src/lib/cli/"} <= set(rows)
    for folder, names in rows.items():
        present = {
            p.name
            for p in (ROOT / folder).iterdir()
            if p.suffix in (".py", ".sql") and p.name not in ("__init__.py", "__main__.py")
        }
        assert set(names) <= present, (folder, sorted(set(names) - present))
        assert present <= set(names), (folder, "not in the code map", sorted(present - set(names)))
