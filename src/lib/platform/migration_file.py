"""What archive_migration.sql declares, read from its statements: the columns, indexes,
constraint, project tables and seed rows. Each statement must have one of the shapes
parsed here (lib.platform.migration_plan plans from the declaration)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from lib.platform import schema

RECORDS = "image_generation_records"
STATUS_COLUMN = "archive_status"

T = TypeVar("T")

_WORD = r"(\w+)"
_SHAPES = {
    "setting": re.compile(r"SET\s", re.I),
    "lock": re.compile(r"SELECT\s+pg_advisory_lock\((\d+)\)$", re.I),
    "column": re.compile(
        rf"ALTER\s+TABLE\s+{_WORD}\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+{_WORD}\s+(.+)$",
        re.I | re.S,
    ),
    "index": re.compile(
        rf"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?IF\s+NOT\s+EXISTS\s+{_WORD}"
        rf"\s+ON\s+{_WORD}",
        re.I,
    ),
    "table": re.compile(rf"CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+{_WORD}", re.I),
    "seed": re.compile(
        rf"INSERT\s+INTO\s+{_WORD}\b.*\bON\s+CONFLICT\b.*\bDO\s+NOTHING$", re.I | re.S
    ),
}
# The CHECK constraint's two DO blocks: add it NOT VALID if missing; validate it.
_ADD_CHECK = re.compile(
    rf"ALTER\s+TABLE\s+{_WORD}\s+ADD\s+CONSTRAINT\s+{_WORD}\s+CHECK\s*(\(.*\))\s*NOT\s+VALID",
    re.I | re.S,
)
_VALIDATE = re.compile(rf"VALIDATE\s+CONSTRAINT\s+{_WORD}", re.I)


def quoted_values(check: str) -> tuple[str, ...]:
    """The quoted literals of a CHECK expression, as written or as the catalog prints it."""
    return tuple(re.findall(r"'([^']*)'", check))


@dataclass(frozen=True)
class Column:
    table: str
    name: str
    definition: str  # type, default, NOT NULL, as written in the file


@dataclass(frozen=True)
class Index:
    name: str
    table: str
    sql: str
    concurrently: bool


@dataclass(frozen=True)
class Constraint:
    name: str
    table: str
    check: str  # the parenthesised CHECK expression

    @property
    def allowed_values(self) -> tuple[str, ...]:
        """The quoted literals of the expression (an IN list's values)."""
        return quoted_values(self.check)


@dataclass(frozen=True)
class Table:
    name: str
    sql: str


@dataclass(frozen=True)
class Seed:
    table: str
    sql: str


@dataclass(frozen=True)
class Declaration:
    """The objects archive_migration.sql creates, in the file's order."""

    lock_key: int
    columns: tuple[Column, ...]
    indexes: tuple[Index, ...]
    constraints: tuple[Constraint, ...]
    tables: tuple[Table, ...]
    seeds: tuple[Seed, ...]

    def columns_of(self, table: str) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.table == table)

    @property
    def table_names(self) -> tuple[str, ...]:
        """Every table the catalog is read for: the records and the project's own."""
        names = [RECORDS, *(t.name for t in self.tables), *(c.table for c in self.columns)]
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class _LockKey:
    key: int


@dataclass(frozen=True)
class _Validated:
    constraint: str


_Item = Column | Index | Table | Seed | Constraint | _LockKey | _Validated


def _item(sql: str) -> _Item | None:
    """What one statement of the file declares (None: a psql session setting); ValueError
    for a shape migrate cannot check against the catalog before running it."""
    upper = sql.upper()
    if _SHAPES["setting"].match(sql):
        return None  # the psql path's own; archive-ctl sets its lock_timeout per step
    if m := _SHAPES["lock"].match(sql):
        return _LockKey(int(m.group(1)))
    if m := _SHAPES["column"].match(sql):
        return Column(m.group(1), m.group(2), " ".join(m.group(3).split()))
    if m := _SHAPES["index"].match(sql):
        if m.group(3) == RECORDS and not m.group(1):
            raise ValueError(f"index {m.group(2)} on the live table must be built CONCURRENTLY")
        return Index(m.group(2), m.group(3), sql, concurrently=bool(m.group(1)))
    if m := _SHAPES["table"].match(sql):
        return Table(m.group(1), sql)
    if m := _SHAPES["seed"].match(sql):
        return Seed(m.group(1), sql)
    if upper.startswith("DO") and "IF NOT EXISTS" in upper and (m := _ADD_CHECK.search(sql)):
        return Constraint(m.group(2), m.group(1), " ".join(m.group(3).split()))
    if upper.startswith(("DO", "ALTER")) and (m := _VALIDATE.search(sql)):
        return _Validated(m.group(1))
    raise ValueError(
        f"archive-ctl migrate cannot check this statement against the catalog before running"
        f" it: {sql.splitlines()[0][:80]!r} (docs/explanation/live-migration.md lists the"
        " shapes it knows)"
    )


def parse_declaration(
    statements: Iterable[str], source: str = "archive_migration.sql"
) -> Declaration:
    """The file's statements as a Declaration; ValueError names any statement of another shape."""
    items: list[_Item] = []
    for sql in statements:
        try:
            item = _item(sql)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
        if item is not None:
            items.append(item)

    def of(kind: type[T]) -> tuple[T, ...]:
        return tuple(i for i in items if isinstance(i, kind))

    lock_keys = of(_LockKey)
    if len(lock_keys) != 1:
        raise ValueError(f"{source}: needs exactly one SELECT pg_advisory_lock(<key>)")
    constraints = of(Constraint)
    unvalidated = {c.name for c in constraints} - {v.constraint for v in of(_Validated)}
    if unvalidated:
        raise ValueError(f"{source}: no VALIDATE for {sorted(unvalidated)}")
    return Declaration(lock_keys[0].key, of(Column), of(Index), constraints, of(Table), of(Seed))


def load_declaration(path: Path = schema.ARCHIVE_MIGRATION) -> Declaration:
    return parse_declaration((s.sql for s in schema.load([path])), source=path.name)
