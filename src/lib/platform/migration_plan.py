"""What archive_migration.sql declares, what the catalog already has, and the steps between.

Pure: `archive-ctl migrate` reads the catalog, calls `plan`, then runs the steps. Each statement
of the file must have one of the shapes parsed here, so each can be checked before it runs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lib.platform.migration_file import (
    RECORDS,
    STATUS_COLUMN,
    Column,
    Constraint,
    Declaration,
    Index,
    quoted_values,
)

# Added with DEFAULT false: rows an older release left mid-upload need it set (`plan`).
MAY_BE_HOSTED_COLUMN = "archive_may_be_hosted"
MAY_HAVE_UPLOADED = (
    "rows an older release may have uploaded (RUNNING, or PENDING/FAILED after an attempt)"
)
# Data steps a run notes before the change that calls for them and deletes when done, so
# that the next run finishes what a stopped one began (the project's table, read by
# migrate only): one row per step, with its keyset progress.
STEPS_TABLE = "image_archive_migration_steps"
MARK_STEP = "mark_may_be_hosted"

# Waits for a lock that blocks the table's users while it is requested are retried after
# these pauses (attempt 1, 2, ...; the last repeats), each request bounded by the session's
# short lock_timeout: the table is never queued behind us for longer than that at a time.
BACKOFF_SECONDS = (0.25, 0.5, 1.0, 2.0, 3.0)


@dataclass(frozen=True)
class Catalog:
    """What the database has of the declared objects (the `schema_catalog` query's rows)."""

    tables: frozenset[str] = frozenset()
    columns: frozenset[tuple[str, str]] = frozenset()  # (table, column)
    indexes: Mapping[str, bool] = field(default_factory=dict)  # name -> valid
    constraints: Mapping[str, bool] = field(default_factory=dict)  # name -> validated
    # Data steps a run began and did not finish (STEPS_TABLE's rows; empty when it is absent).
    unfinished: frozenset[str] = frozenset()
    # name -> the quoted literals of the constraint's definition (an IN list's values)
    constraint_values: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[object]]) -> Catalog:
        """Rows of (kind, name, table, flag[, definition]): kind is table, column, index or
        constraint; a constraint's definition (pg_get_constraintdef) gives its values."""
        tables: set[str] = set()
        columns: set[tuple[str, str]] = set()
        indexes: dict[str, bool] = {}
        constraints: dict[str, bool] = {}
        values: dict[str, frozenset[str]] = {}
        for kind, name, table, flag, *definition in rows:
            if kind == "table":
                tables.add(str(name))
            elif kind == "column":
                columns.add((str(table), str(name)))
            elif kind == "index":
                indexes[str(name)] = bool(flag)
            elif kind == "constraint":
                constraints[str(name)] = bool(flag)
                if definition and isinstance(definition[0], str):
                    values[str(name)] = frozenset(quoted_values(definition[0]))
        return cls(
            frozenset(tables), frozenset(columns), indexes, constraints, constraint_values=values
        )

    def outdated(self, constraint: Constraint) -> bool:
        """The constraint exists with other allowed values than declared (a release that
        added a value): it is replaced."""
        held = self.constraint_values.get(constraint.name)
        return held is not None and held != frozenset(constraint.allowed_values)

    def has_column(self, table: str, column: str) -> bool:
        return (table, column) in self.columns


@dataclass(frozen=True)
class LegacyValue:
    """An archive_status value outside the CHECK's, with what it maps to (None: it cannot)."""

    value: str
    hosted: bool  # these rows have a hosted_image_url
    rows: int
    target: str | None

    @property
    def label(self) -> str:
        return f"{self.value!r} ({'with' if self.hosted else 'without'} a hosted_image_url)"

    @property
    def counted(self) -> str:
        return f"{self.rows} row{'s' * (self.rows != 1)}"


class Wait(enum.Enum):
    """How a step may wait for its lock, by what the wait does to the table's other users."""

    # Its lock request queues the table's readers and writers behind it (ACCESS EXCLUSIVE,
    # or SHARE for a plain index build): the short lock_timeout, then retried.
    BRIEF = "brief"
    # SHARE UPDATE EXCLUSIVE: reads and writes go on while it waits (index builds, VALIDATE).
    PATIENT = "patient"
    # Row updates in batches of short transactions.
    ROWS = "rows"


class Action(enum.Enum):
    CREATE_TABLE = ("create table", Wait.BRIEF)
    ADD_COLUMNS = ("add columns", Wait.BRIEF)
    SEED = ("ensure rows", Wait.BRIEF)
    NOTE_STEP = ("note the step to finish", Wait.BRIEF)
    MARK_MAY_BE_HOSTED = ("set archive_may_be_hosted on", Wait.ROWS)
    DROP_INVALID_INDEX = ("drop the INVALID index", Wait.PATIENT)
    BUILD_INDEX = ("build index", Wait.PATIENT)  # CONCURRENTLY
    BUILD_PLAIN_INDEX = ("build index", Wait.BRIEF)  # SHARE: only on a project table
    MAP_LEGACY = ("map legacy archive_status values of", Wait.ROWS)
    ADD_CONSTRAINT = ("add constraint NOT VALID", Wait.BRIEF)
    VALIDATE_CONSTRAINT = ("validate constraint", Wait.PATIENT)
    DROP_CONSTRAINT = ("drop constraint", Wait.BRIEF)

    def __init__(self, words: str, wait: Wait) -> None:
        self.words = words
        self.wait = wait


@dataclass(frozen=True)
class Step:
    action: Action
    table: str  # the table whose lock it takes
    name: str  # the table, index or constraint it is about
    sql: str = ""  # the DDL; empty for the batched data steps (named queries)
    detail: str = ""

    @property
    def summary(self) -> str:
        extra = f": {self.detail}" if self.detail else ""
        return f"{self.action.words} {self.name}{extra}"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    # Why migrate stops before changing the schema; `steps` then only repair what an
    # earlier run left behind that hurts the generation service.
    refusal: str | None = None

    @property
    def changes(self) -> tuple[Step, ...]:
        """The steps that change the schema or rows (seeds only ensure rows exist)."""
        return tuple(s for s in self.steps if s.action is not Action.SEED)


def add_columns_sql(table: str, columns: Sequence[Column]) -> str:
    # One statement, so one lock request for every missing column; IF NOT EXISTS because a
    # table created in the same run may already have some of them.
    clauses = ",\n    ".join(f"ADD COLUMN IF NOT EXISTS {c.name} {c.definition}" for c in columns)
    return f"ALTER TABLE {table}\n    {clauses}"


def add_constraint_sql(constraint: Constraint) -> str:
    return (
        f"ALTER TABLE {constraint.table} ADD CONSTRAINT {constraint.name}"
        f" CHECK {constraint.check} NOT VALID"
    )


def validate_constraint_sql(constraint: Constraint) -> str:
    return f"ALTER TABLE {constraint.table} VALIDATE CONSTRAINT {constraint.name}"


def drop_constraint_sql(constraint: Constraint) -> str:
    return f"ALTER TABLE {constraint.table} DROP CONSTRAINT IF EXISTS {constraint.name}"


def drop_index_sql(index: Index) -> str:
    return f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}"


def status_constraints(declaration: Declaration) -> tuple[Constraint, ...]:
    """The CHECK constraints on archive_status, which the legacy values would break."""
    return tuple(
        c for c in declaration.constraints if c.table == RECORDS and STATUS_COLUMN in c.check
    )


def status_values(declaration: Declaration) -> tuple[str, ...]:
    """The archive_status values every CHECK on it allows."""
    constraints = status_constraints(declaration)
    if not constraints:
        return ()
    first, *others = constraints
    return tuple(v for v in first.allowed_values if all(v in c.allowed_values for c in others))


def legacy_scan_needed(declaration: Declaration, catalog: Catalog) -> bool:
    """archive_status exists and a CHECK on it is missing or NOT VALID: its values may break it.
    A validated constraint proves there are none, so an up-to-date table is not scanned."""
    return catalog.has_column(RECORDS, STATUS_COLUMN) and any(
        not catalog.constraints.get(c.name, False) for c in status_constraints(declaration)
    )


def plan(declaration: Declaration, catalog: Catalog, legacy: Sequence[LegacyValue] = ()) -> Plan:
    """The steps from `catalog` to `declaration`, in the order they must run.

    The records' columns first (the step most likely to find the table busy: when it gives
    up, nothing has changed), then the project's tables and their columns, rows, indexes,
    and the constraints last: a VALIDATE that fails (a value written since the check, by a
    release still running) then leaves everything else done.
    """
    unmappable = [v for v in legacy if v.target is None]
    if unmappable:
        return Plan(_repairs(declaration, catalog), refusal=legacy_refusal(legacy))
    marks = _adds_may_be_hosted(declaration, catalog)
    # The marking is noted before the column exists: a run that stops after adding it
    # leaves the note, and the next run, finding the column there, still marks.
    steps = _note(declaration, catalog, MARK_STEP) if marks else []
    steps += _add_columns(declaration, catalog, RECORDS)
    steps += [
        Step(Action.CREATE_TABLE, t.name, t.name, t.sql)
        for t in declaration.tables
        if t.name not in catalog.tables and t.name not in {s.name for s in steps}
    ]
    for table in declaration.table_names:
        if table != RECORDS:
            steps += _add_columns(declaration, catalog, table)
    steps += [Step(Action.SEED, s.table, s.table, s.sql) for s in declaration.seeds]
    if marks or MARK_STEP in catalog.unfinished:
        steps.append(Step(Action.MARK_MAY_BE_HOSTED, RECORDS, RECORDS, detail=MAY_HAVE_UPLOADED))
    for index in declaration.indexes:
        valid = catalog.indexes.get(index.name)
        if valid is False:
            left = "left by an interrupted build; built again next"
            steps.append(
                Step(
                    Action.DROP_INVALID_INDEX, index.table, index.name, drop_index_sql(index), left
                )
            )
        if not valid:
            build = Action.BUILD_INDEX if index.concurrently else Action.BUILD_PLAIN_INDEX
            steps.append(Step(build, index.table, index.name, index.sql))
    if legacy:
        detail = ", ".join(f"{v.label} -> {v.target}: {v.counted}" for v in legacy)
        steps.append(Step(Action.MAP_LEGACY, RECORDS, RECORDS, detail=detail))
    for constraint in declaration.constraints:
        validated = catalog.constraints.get(constraint.name)
        if validated is not None and catalog.outdated(constraint):
            steps.append(
                Step(
                    Action.DROP_CONSTRAINT,
                    constraint.table,
                    constraint.name,
                    drop_constraint_sql(constraint),
                    "its allowed values differ from the declared ones; added again",
                )
            )
            validated = None
        if validated is None:
            steps.append(
                Step(
                    Action.ADD_CONSTRAINT,
                    constraint.table,
                    constraint.name,
                    add_constraint_sql(constraint),
                )
            )
        if not validated:
            steps.append(
                Step(
                    Action.VALIDATE_CONSTRAINT,
                    constraint.table,
                    constraint.name,
                    validate_constraint_sql(constraint),
                )
            )
    return Plan(tuple(steps))


def _add_columns(declaration: Declaration, catalog: Catalog, table: str) -> list[Step]:
    missing = [c for c in declaration.columns_of(table) if not catalog.has_column(table, c.name)]
    if not missing:
        return []
    detail = ", ".join(c.name for c in missing)
    return [Step(Action.ADD_COLUMNS, table, table, add_columns_sql(table, missing), detail)]


def _note(declaration: Declaration, catalog: Catalog, step: str) -> list[Step]:
    """A data step noted as begun (its table created first, when missing)."""
    [table] = [t for t in declaration.tables if t.name == STEPS_TABLE]
    create = (
        []
        if table.name in catalog.tables
        else [Step(Action.CREATE_TABLE, table.name, table.name, table.sql)]
    )
    note = Step(
        Action.NOTE_STEP,
        STEPS_TABLE,
        step,
        detail="a run that stops before it is done leaves the note; the next one finishes it",
    )
    return [*create, note]


def _adds_may_be_hosted(declaration: Declaration, catalog: Catalog) -> bool:
    """The column is added by this run to a table that already has archive states: rows an
    older release left RUNNING or mid-retry must not get the default (false) and be uploaded
    a second time. When the column exists it carries the truth already; when archive_status
    is added too, no row has a state yet."""
    declared = any(c.name == MAY_BE_HOSTED_COLUMN for c in declaration.columns_of(RECORDS))
    return (
        declared
        and RECORDS in catalog.tables
        and not catalog.has_column(RECORDS, MAY_BE_HOSTED_COLUMN)
        and catalog.has_column(RECORDS, STATUS_COLUMN)
    )


def _repairs(declaration: Declaration, catalog: Catalog) -> tuple[Step, ...]:
    """A NOT VALID constraint an earlier run left refuses every UPDATE of the rows with a
    value it does not allow (the generation service's own updates of them included)."""
    return tuple(
        Step(
            Action.DROP_CONSTRAINT,
            c.table,
            c.name,
            drop_constraint_sql(c),
            "NOT VALID, left by an earlier run",
        )
        for c in status_constraints(declaration)
        if catalog.constraints.get(c.name) is False
    )


def legacy_refusal(legacy: Sequence[LegacyValue]) -> str:
    """What an operator reads when values cannot be mapped: each with its count, and what to do."""
    lines = [
        "archive_status holds values the CHECK constraint does not allow and migrate cannot map:"
    ]
    lines += [f"  {v.label}: {v.counted}" for v in legacy if v.target is None]
    lines.append(
        "The schema was left as it was. Set those rows to NULL (never queued), PENDING (archive"
        " again), SUCCEEDED (only with a hosted_image_url) or FAILED, then run migrate again"
        " (docs/reference/database.md, 'Legacy archive_status values')."
    )
    mappable = [v for v in legacy if v.target is not None]
    if mappable:
        lines.append(
            "It maps these by itself: "
            + ", ".join(f"{v.label} -> {v.target} ({v.counted})" for v in mappable)
        )
    return "\n".join(lines)


def backoff_seconds(attempt: int) -> float:
    """The pause after failed attempt number `attempt` (1-based) to get a brief lock."""
    return BACKOFF_SECONDS[min(attempt, len(BACKOFF_SECONDS)) - 1]
