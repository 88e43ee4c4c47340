"""The layout's rules, checked: one reader of the environment, one home for the SQL and
the status names, short module docstrings, a docstring for every sub-package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = sorted(SRC.rglob("*.py"))


def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_module_docstrings_are_five_lines_or_less() -> None:
    long = {
        str(path.relative_to(SRC)): len(doc.strip().splitlines())
        for path in MODULES
        if (doc := ast.get_docstring(ast.parse(source(path)), clean=False))
        and len(doc.strip().splitlines()) > 5
    }
    assert long == {}


def test_every_sub_package_says_what_it_owns_in_one_line() -> None:
    packages = [p for p in (SRC / "lib").iterdir() if (p / "__init__.py").exists()]
    assert {p.name for p in packages} >= {"archive", "transfer", "platform", "state", "cli"}
    for package in packages:
        doc = ast.get_docstring(ast.parse(source(package / "__init__.py")))
        assert doc is not None, package.name
        assert len(doc.splitlines()) == 1, package.name


def test_only_config_reads_the_environment() -> None:
    readers = {
        str(path.relative_to(SRC))
        for path in MODULES
        if re.search(r"os\.(environ|getenv)", source(path))
    }
    assert readers == {"lib/platform/config.py"}


def test_only_queries_sql_holds_statements_on_the_records() -> None:
    statement = re.compile(r"(UPDATE|FROM|INTO)\s+image_generation_records\b", re.IGNORECASE)
    holders = {str(p.relative_to(SRC)) for p in MODULES if statement.search(source(p))}
    assert holders == set()
    assert statement.search(source(SRC / "lib" / "sql" / "queries.sql"))


def test_no_bare_archive_status_literals_outside_the_enum() -> None:
    literal = re.compile(r"""["'](PENDING|RUNNING|SUCCEEDED|FAILED)["']""")
    found = {str(path.relative_to(SRC)) for path in MODULES if literal.search(source(path))}
    # dlq.py names SQS move-task states (COMPLETED, CANCELLED, FAILED), not archive ones.
    assert found <= {"lib/state/status.py", "lib/cli/dlq.py"}
