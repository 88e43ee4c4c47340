"""The schema SQL shipped in lib/sql: the one statement splitter, and the plain runner.

One statement at a time in autocommit (CREATE INDEX CONCURRENTLY refuses a transaction);
devkit applies both files this way, `archive-ctl migrate` parses the migration instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
BASE_SCHEMA = SQL_DIR / "base_schema.sql"
ARCHIVE_MIGRATION = SQL_DIR / "archive_migration.sql"

# An index build that was interrupted (lock timeout, lost connection, Ctrl-C) leaves
# an INVALID index behind, and `CREATE INDEX ... IF NOT EXISTS` would then skip it
# for good. Such leftovers are dropped before the file is applied again.
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE
)
INVALID_INDEXES_SQL = """
SELECT c.relname
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE NOT i.indisvalid AND c.relname = ANY(CAST(:names AS text[]))
"""

# Run before anything else: the session's settings, and the migration's advisory lock.
_PRELUDE = re.compile(r"SET\s|SELECT\s+pg_advisory_lock\(", re.IGNORECASE)

# conn.run / Database.run: (sql, **params) -> rows
Run = Callable[..., Any]


@dataclass(frozen=True)
class Statement:
    source: Path
    sql: str

    @property
    def summary(self) -> str:
        """The statement's first line, for progress output."""
        return self.sql.splitlines()[0][:100]


def split_statements(sql: str) -> list[str]:
    """Split a schema file into statements: on ';' at a line end outside a $$-quoted
    body (a DO block), whole-line comments dropped. Enough for our own SQL files."""
    statements: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        if line.lstrip().startswith("--"):
            continue
        current.append(line)
        inside_body = "\n".join(current).count("$$") % 2 == 1
        if re.search(r";[ \t]*$", line) and not inside_body:
            statement = "\n".join(current).strip()
            current = []
            statement = re.sub(r";[ \t]*$", "", statement).strip()
            if statement:
                statements.append(statement)
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return statements


def schema_files(*, with_base_schema: bool) -> tuple[Path, ...]:
    return (BASE_SCHEMA, ARCHIVE_MIGRATION) if with_base_schema else (ARCHIVE_MIGRATION,)


def load(paths: Sequence[Path]) -> list[Statement]:
    return [
        Statement(path, sql)
        for path in paths
        for sql in split_statements(path.read_text(encoding="utf-8"))
    ]


def concurrent_index_names(statements: Sequence[Statement]) -> list[str]:
    return [m.group(1) for s in statements if (m := _CONCURRENT_INDEX.search(s.sql))]


def apply(
    run: Run,
    statements: Sequence[Statement],
    *,
    on_statement: Callable[[Statement], None] | None = None,
) -> list[str]:
    """Run each statement in order on an autocommit connection; returns the names of
    invalid indexes that were dropped first (normally none). The plain path, as psql -f
    runs the files (devkit's fresh databases); `archive-ctl migrate` plans instead.

    The files' SET statements (lock_timeout) and the advisory lock run before anything
    else, so that they bound and guard the drop of a leftover index as well."""
    settings = [s for s in statements if _PRELUDE.match(s.sql)]
    rest = [s for s in statements if not _PRELUDE.match(s.sql)]

    def execute(statement: Statement) -> None:
        if on_statement is not None:
            on_statement(statement)
        run(statement.sql)

    for statement in settings:
        execute(statement)
    names = concurrent_index_names(statements)
    dropped: list[str] = []
    if names:
        for (name,) in run(INVALID_INDEXES_SQL, names=names) or []:
            # Names come from our own SQL file, matched by \w+: safe to interpolate.
            run(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            dropped.append(str(name))
    for statement in rest:
        execute(statement)
    return dropped
