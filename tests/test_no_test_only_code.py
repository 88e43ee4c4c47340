"""Every method and property of a class in src/ has a caller in src/: code that only the
tests call is not part of the service (it drifts from what the service really does)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
# Called by a library, not by our code.
CALLED_BY_LIBRARIES = {
    ("_Pinned", "_new_conn"): "urllib3's HTTPConnection.connect calls the override",
}
# Called by the other half of a change built in two parts: remove the entry with its merge.
CALLED_BY_THE_OTHER_HALF: dict[tuple[str, str], str] = {}


def members_without_a_caller(root: Path) -> list[str]:
    defined: list[tuple[Path, str, str]] = []
    used: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            defined.extend(
                (path, cls.name, node.name)
                for node in cls.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and not node.name.startswith("__")
            )
        for node in ast.walk(tree):
            # A member is reached as an attribute, or by name through getattr().
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                used.add(node.value)
    return [
        f"{path.relative_to(root)}: {cls}.{name}"
        for path, cls, name in defined
        if name not in used
        and (cls, name) not in CALLED_BY_LIBRARIES
        and (cls, name) not in CALLED_BY_THE_OTHER_HALF
    ]


def test_no_class_member_in_src_is_called_only_by_tests() -> None:
    assert members_without_a_caller(SRC) == []


def test_the_scanner_sees_a_member_nobody_calls(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "class A:\n"
        "    def used(self): return self.helper\n"
        "    @property\n"
        "    def helper(self): return 1\n"
        "    def unused(self): return 2\n"
        "class B:\n"
        "    def by_name(self): return 3\n"
        "print(A().used(), getattr(B(), 'by_name')())\n"
    )
    assert members_without_a_caller(tmp_path) == ["m.py: A.unused"]
