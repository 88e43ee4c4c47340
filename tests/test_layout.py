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


ROOT = SRC.parent

MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def _module_name(path: Path) -> str:
    base = ROOT if path.is_relative_to(ROOT / "devkit") else SRC
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports, deferred (in-function) and TYPE_CHECKING
    imports included: a cycle broken by importing late is still a cycle."""
    names = {_module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        tree = ast.parse(source(path))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module
                if node.level:
                    package = name.split(".")[: -node.level] if node.level else []
                    base = ".".join([*package, node.module])
                targets.add(base)
                targets |= {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_src_or_devkit() -> None:
    paths = [*MODULES, *sorted((ROOT / "devkit").rglob("*.py"))]
    assert cycles(import_graph(paths)) == []


def test_no_module_or_class_too_long_to_read_in_one_sitting() -> None:
    long_modules = {
        str(p.relative_to(SRC)): n
        for p in MODULES
        if (n := len(source(p).splitlines())) > MAX_MODULE_LINES
    }
    long_classes = {
        f"{p.relative_to(SRC)}:{node.name}": span
        for p in MODULES
        for node in ast.walk(ast.parse(source(p)))
        if isinstance(node, ast.ClassDef)
        and (span := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
    }
    assert long_modules == {}
    assert long_classes == {}
