"""The pure side of `archive-ctl migrate`: the migration file as a declaration, the plan from
a catalog to it, the legacy status mapping and the retry pauses."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from lib.cli import legacy_status
from lib.platform import migration_file as mf
from lib.platform import migration_plan as mp
from lib.platform import schema
from lib.publish.entries import DetailType
from lib.state.events import EventKind
from lib.state.status import ArchiveStatus

DECLARATION = mf.load_declaration()
FILE = [s.sql for s in schema.load([schema.ARCHIVE_MIGRATION])]
CONSTRAINT = "image_generation_records_archive_status_check"
KINDS = "image_archive_events_kind_check"
EVENT_KINDS = tuple(str(kind) for kind in EventKind)
# The archive columns the first release added; archive_may_be_hosted came next.
FIRST_RELEASE_COLUMNS = 11
# Rows the project's tables start with, ensured by every run (INSERT ... DO NOTHING).
SEEDS = [
    (mp.Action.SEED, "image_archive_lane"),
    (mp.Action.SEED, "image_archive_queue"),
    (mp.Action.SEED, "image_archive_audit_walk"),
]


def catalog_with(
    *,
    columns: int | None = None,
    indexes: dict[str, bool] | None = None,
    constraint: bool | None = True,
    tables: tuple[str, ...] | None = None,
    kinds: tuple[str, ...] | None = None,
) -> mp.Catalog:
    """A catalog holding the first `columns` archive columns (None: all), every index valid
    unless `indexes` says otherwise, the constraint (None: missing; False: NOT VALID), the
    project tables `tables` (None: every one the file declares) and, with the events' table,
    its kinds' constraint allowing `kinds` (None: the declared ones)."""
    found = {i.name: True for i in DECLARATION.indexes} if indexes is None else indexes
    if tables is None:
        tables = tuple(t.name for t in DECLARATION.tables)
    constraints = {} if constraint is None else {CONSTRAINT: constraint}
    values: dict[str, frozenset[str]] = {}
    if "image_archive_events" in tables:
        constraints[KINDS] = True
        values[KINDS] = frozenset(EVENT_KINDS if kinds is None else kinds)
    return mp.Catalog(
        tables=frozenset({mf.RECORDS, *tables}),
        columns=frozenset(
            {(mf.RECORDS, c.name) for c in DECLARATION.columns_of(mf.RECORDS)[:columns]}
            # A project table that exists has the columns later releases add to it.
            | {(t, c.name) for t in tables for c in DECLARATION.columns_of(t)}
        ),
        indexes=found,
        constraints=constraints,
        constraint_values=values,
    )


def actions(plan: mp.Plan) -> list[tuple[mp.Action, str]]:
    return [(step.action, step.name) for step in plan.steps]


# -- the declaration ---------------------------------------------------------------------


def starting(*words: str) -> list[str]:
    """The file's statements that start with these words (whitespace and case aside)."""
    prefix = " ".join(words).upper()
    return [s for s in FILE if " ".join(s.split()).upper().startswith(prefix)]


def test_the_migration_file_declares_the_archive_schema() -> None:
    # Every statement of the file is one declared object (the constraint: its two DO blocks,
    # plus the psql session's SET and the advisory lock): none is dropped or read twice.
    d = DECLARATION
    declared = len(d.columns) + len(d.indexes) + len(d.tables) + len(d.seeds)
    assert declared + 2 * len(d.constraints) + 2 == len(FILE)
    columns = d.columns_of(mf.RECORDS)
    assert len(columns) == len(starting("ALTER TABLE", mf.RECORDS, "ADD COLUMN"))
    assert columns[0] == mf.Column(mf.RECORDS, "archive_status", "TEXT")
    assert columns[FIRST_RELEASE_COLUMNS] == mf.Column(
        mf.RECORDS, "archive_may_be_hosted", "BOOLEAN NOT NULL DEFAULT false"
    )
    assert mf.Column(mf.RECORDS, "archive_sent", "JSONB") in columns
    assert len(d.indexes) == len(starting("CREATE INDEX")) + len(starting("CREATE UNIQUE INDEX"))
    # On the live table CONCURRENTLY (the parser refuses it otherwise); on the project's own
    # tables a plain build, which is what the file writes there.
    assert all(i.concurrently == (i.table == mf.RECORDS) for i in d.indexes)
    assert "image_generation_records_archive_parked_idx" in {i.name for i in d.indexes}
    assert {i.table for i in d.indexes} - {mf.RECORDS} == {
        "image_archive_uploads",
        "image_archive_events",
        "image_archive_audits",
        "image_archive_outbox",
        "image_archive_originals",
    }
    # The completion events' detail types, like the events' kinds, are the CREATE TABLE's.
    outbox = next(t for t in d.tables if t.name == "image_archive_outbox")
    types = re.search(r"CHECK \(\s*detail_type IN \((.*?)\)\)", outbox.sql, re.S)
    assert types is not None
    assert re.findall(r"'([^']+)'", types.group(1)) == [str(t) for t in DetailType]
    # image_archive_uploads' CHECK on state is part of its CREATE TABLE, not a constraint
    # migrate adds and validates on its own; the events' kinds are (a release adds kinds).
    constraint, kinds_check = d.constraints
    assert constraint.name == CONSTRAINT
    assert mp.status_values(d) == tuple(str(s) for s in ArchiveStatus)
    assert kinds_check.name == "image_archive_events_kind_check"
    assert kinds_check.allowed_values == tuple(str(kind) for kind in EventKind)
    tables = [t.name for t in d.tables]
    assert len(tables) == len(starting("CREATE TABLE"))
    assert tables[0] == "image_archive_lane"
    assert all(t.startswith("image_archive_") for t in tables)
    uploads = next(t for t in d.tables if t.name == "image_archive_uploads")
    assert "CHECK (state IN ('booked', 'taken', 'done'))" in uploads.sql
    assert [s.table for s in d.seeds] == [
        "image_archive_lane",
        "image_archive_queue",
        "image_archive_audit_walk",
    ]
    assert d.lock_key == 1634888552
    assert d.table_names == (mf.RECORDS, *tables)


def test_one_more_column_or_project_table_is_one_more_statement() -> None:
    more = [
        *FILE,
        "ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_note TEXT",
        "CREATE TABLE IF NOT EXISTS image_archive_audit (id BIGINT PRIMARY KEY)",
        "ALTER TABLE image_archive_audit ADD COLUMN IF NOT EXISTS at TIMESTAMPTZ",
        "CREATE INDEX IF NOT EXISTS image_archive_audit_at_idx ON image_archive_audit (at)",
    ]
    declaration = mf.parse_declaration(more)
    plan = mp.plan(declaration, catalog_with())

    assert actions(plan) == [
        (mp.Action.ADD_COLUMNS, mf.RECORDS),
        (mp.Action.CREATE_TABLE, "image_archive_audit"),
        (mp.Action.ADD_COLUMNS, "image_archive_audit"),
        *SEEDS,
        (mp.Action.BUILD_PLAIN_INDEX, "image_archive_audit_at_idx"),
    ]
    # A plain build takes SHARE, which queues that table's writers while it waits.
    assert plan.steps[-1].action.wait is mp.Wait.BRIEF
    assert plan.steps[0].sql == (
        "ALTER TABLE image_generation_records\n    ADD COLUMN IF NOT EXISTS archive_note TEXT"
    )


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        (
            "ALTER TABLE image_generation_records ALTER COLUMN archive_error SET DEFAULT ''",
            "cannot check",
        ),
        ("ALTER TABLE image_generation_records ADD COLUMN archive_note TEXT", "cannot check"),
        (
            "CREATE INDEX IF NOT EXISTS x_idx ON image_generation_records (archived_at)",
            "CONCURRENTLY",
        ),
        ("UPDATE image_archive_lane SET version = 0", "cannot check"),
    ],
)
def test_a_statement_migrate_cannot_check_first_is_refused_by_name(
    statement: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        mf.parse_declaration([*FILE, statement])
    assert "archive_migration.sql" in str(refused.value)


def test_the_lock_and_a_validate_for_each_constraint_are_required() -> None:
    without_lock = [s for s in FILE if "pg_advisory_lock" not in s]
    with pytest.raises(ValueError, match="pg_advisory_lock"):
        mf.parse_declaration(without_lock)
    without_validate = [s for s in FILE if "VALIDATE CONSTRAINT" not in s]
    with pytest.raises(ValueError, match="no VALIDATE"):
        mf.parse_declaration(without_validate)


# -- the plan ----------------------------------------------------------------------------


def test_an_up_to_date_schema_plans_no_change() -> None:
    plan = mp.plan(DECLARATION, catalog_with())
    assert plan.changes == ()
    assert actions(plan) == SEEDS  # INSERT ... DO NOTHING
    # The project tables' plain indexes too: a valid one is never built again (it would ask
    # for SHARE, queueing that table's writers, on every run).
    assert mp.Action.BUILD_PLAIN_INDEX not in {s.action for s in plan.steps}
    assert not mp.legacy_scan_needed(DECLARATION, catalog_with())


def test_a_fresh_adoption_plans_everything_in_order_and_marks_nothing() -> None:
    catalog = mp.Catalog(tables=frozenset({mf.RECORDS}))
    plan = mp.plan(DECLARATION, catalog)

    assert actions(plan) == [
        (mp.Action.ADD_COLUMNS, mf.RECORDS),
        *[(mp.Action.CREATE_TABLE, t.name) for t in DECLARATION.tables],
        # A column a later release added to a project table: after the CREATE TABLEs.
        *[
            (mp.Action.ADD_COLUMNS, t.name)
            for t in DECLARATION.tables
            if DECLARATION.columns_of(t.name)
        ],
        *[(mp.Action.SEED, s.table) for s in DECLARATION.seeds],
        *[
            (mp.Action.BUILD_INDEX if i.concurrently else mp.Action.BUILD_PLAIN_INDEX, i.name)
            for i in DECLARATION.indexes
        ],
        (mp.Action.ADD_CONSTRAINT, CONSTRAINT),
        (mp.Action.VALIDATE_CONSTRAINT, CONSTRAINT),
        (mp.Action.ADD_CONSTRAINT, KINDS),
        (mp.Action.VALIDATE_CONSTRAINT, KINDS),
    ]
    # One lock request for every column.
    columns = DECLARATION.columns_of(mf.RECORDS)
    assert plan.steps[0].sql.count("ADD COLUMN IF NOT EXISTS") == len(columns)
    assert plan.steps[0].detail == ", ".join(c.name for c in columns)
    # A project table's index is built after that table is created.
    for number, step in enumerate(plan.steps):
        if step.action is mp.Action.BUILD_PLAIN_INDEX:
            assert (mp.Action.CREATE_TABLE, step.table) in actions(plan)[:number]
    assert not mp.legacy_scan_needed(DECLARATION, catalog)  # no archive_status yet
    # Only the index builds and VALIDATE may wait long: they let readers and writers by.
    assert [s.action for s in plan.steps if s.action.wait is not mp.Wait.BRIEF] == [
        *[mp.Action.BUILD_INDEX for i in DECLARATION.indexes if i.concurrently],
        mp.Action.VALIDATE_CONSTRAINT,
        mp.Action.VALIDATE_CONSTRAINT,
    ]


def test_an_upgrade_adding_may_be_hosted_marks_the_rows_an_older_release_may_have_uploaded() -> (
    None
):
    older = catalog_with(columns=FIRST_RELEASE_COLUMNS, indexes={}, constraint=None, tables=())
    plan = mp.plan(DECLARATION, older)

    added = [c.name for c in DECLARATION.columns_of(mf.RECORDS)[FIRST_RELEASE_COLUMNS:]]
    assert added[:2] == ["archive_may_be_hosted", "archive_altered"]
    # The marking is noted (its table created first) before the column is added: a run
    # that stops right after the ALTER leaves the note for the next one.
    assert actions(plan)[:3] == [
        (mp.Action.CREATE_TABLE, mp.STEPS_TABLE),
        (mp.Action.NOTE_STEP, mp.MARK_STEP),
        (mp.Action.ADD_COLUMNS, mf.RECORDS),
    ]
    assert plan.steps[2].detail == ", ".join(added)
    assert actions(plan).count((mp.Action.CREATE_TABLE, mp.STEPS_TABLE)) == 1
    assert (mp.Action.MARK_MAY_BE_HOSTED, mf.RECORDS) in actions(plan)
    assert mp.legacy_scan_needed(DECLARATION, older)
    # Once the column exists and no marking is left unfinished, it carries the truth.
    assert (mp.Action.MARK_MAY_BE_HOSTED, mf.RECORDS) not in actions(
        mp.plan(DECLARATION, catalog_with(constraint=None))
    )


def test_a_marking_an_earlier_run_left_unfinished_is_planned_from_its_note() -> None:
    """The column exists (the run that added it stopped after the ALTER, or mid-marking):
    the note in image_archive_migration_steps, not the column's absence, plans the rest."""
    stopped = replace(catalog_with(), unfinished=frozenset({mp.MARK_STEP}))
    assert actions(mp.plan(DECLARATION, stopped)) == [
        *SEEDS,
        (mp.Action.MARK_MAY_BE_HOSTED, mf.RECORDS),
    ]
    # Nothing noted: an up-to-date schema plans no change.
    assert not mp.plan(DECLARATION, catalog_with()).changes
    # A column added with archive_status in the same run (a fresh adoption): no state yet,
    # nothing to note or mark.
    fresh = actions(mp.plan(DECLARATION, catalog_with(columns=0, constraint=None, tables=())))
    assert (mp.Action.NOTE_STEP, mp.MARK_STEP) not in fresh
    assert (mp.Action.MARK_MAY_BE_HOSTED, mf.RECORDS) not in fresh


def test_an_invalid_index_is_dropped_then_built_and_a_not_valid_constraint_only_validated() -> None:
    indexes = {i.name: True for i in DECLARATION.indexes}
    indexes["image_generation_records_archive_failed_idx"] = False
    plan = mp.plan(DECLARATION, catalog_with(indexes=indexes, constraint=False))

    assert actions(plan) == [
        *SEEDS,
        (mp.Action.DROP_INVALID_INDEX, "image_generation_records_archive_failed_idx"),
        (mp.Action.BUILD_INDEX, "image_generation_records_archive_failed_idx"),
        (mp.Action.VALIDATE_CONSTRAINT, CONSTRAINT),
    ]
    assert plan.steps[len(SEEDS)].sql == (
        "DROP INDEX CONCURRENTLY IF EXISTS image_generation_records_archive_failed_idx"
    )


def test_mappable_legacy_values_are_mapped_before_the_constraint() -> None:
    legacy = [mp.LegacyValue("pending", False, 3, "PENDING")]
    plan = mp.plan(DECLARATION, catalog_with(constraint=None), legacy)

    assert actions(plan)[-3:] == [
        (mp.Action.MAP_LEGACY, mf.RECORDS),
        (mp.Action.ADD_CONSTRAINT, CONSTRAINT),
        (mp.Action.VALIDATE_CONSTRAINT, CONSTRAINT),
    ]
    assert "'pending' (without a hosted_image_url) -> PENDING: 3 rows" in plan.steps[-3].detail


def test_an_unmappable_value_refuses_the_plan_and_repairs_only_a_not_valid_constraint() -> None:
    legacy = [
        mp.LegacyValue("CANCELLED", False, 1, None),
        mp.LegacyValue("DONE", True, 2, "SUCCEEDED"),
    ]
    unchecked = catalog_with(columns=FIRST_RELEASE_COLUMNS, constraint=None)
    refused = mp.plan(DECLARATION, unchecked, legacy)
    assert refused.steps == ()
    assert refused.refusal is not None
    assert "'CANCELLED' (without a hosted_image_url): 1 row\n" in refused.refusal
    assert "'DONE' (with a hosted_image_url) -> SUCCEEDED (2 rows)" in refused.refusal

    older = catalog_with(columns=FIRST_RELEASE_COLUMNS, constraint=False)
    repaired = mp.plan(DECLARATION, older, legacy)
    assert actions(repaired) == [(mp.Action.DROP_CONSTRAINT, CONSTRAINT)]
    assert repaired.steps[0].sql == (
        f"ALTER TABLE image_generation_records DROP CONSTRAINT IF EXISTS {CONSTRAINT}"
    )


def test_the_catalog_reads_the_schema_catalog_rows() -> None:
    catalog = mp.Catalog.from_rows(
        [
            ("table", mf.RECORDS, mf.RECORDS, True),
            ("column", "archive_status", mf.RECORDS, True),
            ("index", "i", mf.RECORDS, False),
            ("constraint", CONSTRAINT, mf.RECORDS, True),
        ]
    )
    assert catalog.tables == {mf.RECORDS}
    assert catalog.has_column(mf.RECORDS, "archive_status")
    assert not catalog.has_column("image_archive_lane", "archive_status")
    assert catalog.indexes == {"i": False}
    assert catalog.constraints == {CONSTRAINT: True}


def test_brief_lock_retries_back_off_to_a_few_seconds() -> None:
    assert [mp.backoff_seconds(n) for n in range(1, 8)] == [0.25, 0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


# -- legacy archive_status values ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "hosted", "expected"),
    [
        ("pending", False, ArchiveStatus.PENDING),
        (" Pending ", False, ArchiveStatus.PENDING),
        ("QUEUED", False, ArchiveStatus.PENDING),
        ("retrying", False, ArchiveStatus.PENDING),
        ("processing", False, ArchiveStatus.RUNNING),
        ("in-progress", False, ArchiveStatus.RUNNING),
        ("In Progress", False, ArchiveStatus.RUNNING),
        ("DONE", True, ArchiveStatus.SUCCEEDED),
        ("completed", True, ArchiveStatus.SUCCEEDED),
        ("ARCHIVED", True, ArchiveStatus.SUCCEEDED),
        ("succeeded", True, ArchiveStatus.SUCCEEDED),
        ("ERROR", False, ArchiveStatus.FAILED),
        ("failed", False, ArchiveStatus.FAILED),
        # A success without the URL it produced is not one.
        ("DONE", False, None),
        ("succeeded", False, None),
        # No obvious meaning in this state machine.
        ("CANCELLED", False, None),
        ("SKIPPED", True, None),
        ("", False, None),
    ],
)
def test_legacy_values_map_to_the_state_they_obviously_mean(
    value: str, hosted: bool, expected: ArchiveStatus | None
) -> None:
    assert legacy_status.target(value, hosted=hosted) is expected


def test_the_legacy_scan_rows_are_classified() -> None:
    found = legacy_status.classify([("done", True, 4), ("weird", False, 1)])
    assert found == [
        mp.LegacyValue("done", True, 4, "SUCCEEDED"),
        mp.LegacyValue("weird", False, 1, None),
    ]


def test_a_constraint_whose_allowed_values_differ_is_replaced() -> None:
    # An older release's events table allows fewer kinds: the constraint is dropped, added
    # again NOT VALID with the declared list, and validated (which blocks no writer).
    older = catalog_with(kinds=EVENT_KINDS[:-4])
    plan = mp.plan(DECLARATION, older)

    assert actions(plan) == [
        *SEEDS,
        (mp.Action.DROP_CONSTRAINT, KINDS),
        (mp.Action.ADD_CONSTRAINT, KINDS),
        (mp.Action.VALIDATE_CONSTRAINT, KINDS),
    ]
    assert "'lost_on_host'" in plan.steps[-2].sql
    assert mp.plan(DECLARATION, catalog_with()).changes == ()


def test_the_catalog_reads_a_constraint_s_values_from_its_definition() -> None:
    catalog = mp.Catalog.from_rows(
        [
            (
                "constraint",
                KINDS,
                "image_archive_events",
                True,
                "CHECK ((kind = ANY (ARRAY['enqueued'::text, 'failed'::text])))",
            )
        ]
    )
    assert catalog.constraint_values == {KINDS: frozenset({"enqueued", "failed"})}
    # A catalog row without a definition (an older query) compares nothing.
    assert not mp.Catalog.from_rows([("constraint", KINDS, "t", True)]).constraint_values
