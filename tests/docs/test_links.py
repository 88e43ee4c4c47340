"""Every page is reachable from the index by its links, and every path to a doc that the
code, the template and the build name exists.

tests/docs/test_as_written.py checks that every relative link and its #anchor resolve."""

from __future__ import annotations

import posixpath
import re
import subprocess

from tests.docs.markdown import DOCS, INDEX, ROOT, outside_code_blocks, read

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def links_of(doc: str) -> set[str]:
    """The docs a page links to, as repository paths."""
    here = posixpath.dirname(doc)
    found = set()
    for target in LINK.findall(outside_code_blocks(read(doc))):
        if target.startswith(("http://", "https://")) or not target.endswith(".md"):
            continue
        found.add(posixpath.normpath(posixpath.join(here, target)))
    return found


def reachable(start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for target in links_of(todo.pop()):
            if target in DOCS and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_page_is_reachable_from_the_index() -> None:
    pages = {doc for doc in DOCS if doc.startswith("docs/")}
    assert pages - reachable(INDEX) == set()
    assert INDEX in reachable("README.md")


def test_the_index_links_every_part_and_the_glossary() -> None:
    links = links_of(INDEX)
    for folder in ("getting-started", "how-to", "reference", "explanation"):
        assert any(link.startswith(f"docs/{folder}/") for link in links), folder
    assert "docs/glossary.md" in links


def test_the_reachability_check_sees_an_orphan() -> None:
    """A page nothing links to is not reached (guards the walk)."""
    assert "README.md" not in reachable(INDEX)
    assert len(reachable(INDEX)) > 30


def test_every_doc_the_repository_names_exists() -> None:
    """`docs/….md` in a comment, a docstring, a help text, an error message or the template
    names a page that exists (the pages moved once; a stale path would send a reader
    nowhere)."""
    files = subprocess.run(
        [
            "git",
            "ls-files",
            "src",
            "tests",
            "devkit",
            "bench",
            "scripts",
            "mk",
            "Makefile",
            "template.yaml",
            "pyproject.toml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    named = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in (".png", ".jpg", ".pyc"):
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        named += [(name, doc) for doc in re.findall(r"\bdocs/[\w./-]+?\.md\b", text)]
    assert len(named) > 40, named
    assert [(name, doc) for name, doc in named if not (ROOT / doc).exists()] == []
