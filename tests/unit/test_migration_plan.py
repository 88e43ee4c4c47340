"""The pure side of `archive-ctl migrate`: the migration file as a declaration, the plan from
a catalog to it, the legacy status mapping and the retry pauses."""

from __future__ import annotations

import pytest

from lib.cli import legacy_status
from lib.platform import migration_plan as mp
from lib.platform import schema
from lib.state.status import ArchiveStatus

DECLARATION = mp.load_declaration()
FILE = [s.sql for s in schema.load([schema.ARCHIVE_MIGRATION])]
CONSTRAINT = "image_generation_records_archive_status_check"


def catalog_with(
    *,
    columns: int = 15,
    indexes: dict[str, bool] | None = None,
    constraint: bool | None = True,
    tables: tuple[str, ...] = ("image_archive_lane",),
) -> mp.Catalog:
    """A catalog holding the first `columns` archive columns, every index valid unless
    `indexes` says otherwise, the constraint (None: missing; False: NOT VALID)."""
    found = {i.name: True for i in DECLARATION.indexes} if indexes is None else indexes
    return mp.Catalog(
        tables=frozenset({mp.RECORDS, *tables}),
        columns=frozenset(
            (mp.RECORDS, c.name) for c in DECLARATION.columns_of(mp.RECORDS)[:columns]
        ),
        indexes=found,
        constraints={} if constraint is None else {CONSTRAINT: constraint},
    )


def actions(plan: mp.Plan) -> list[tuple[mp.Action, str]]:
    return [(step.action, step.name) for step in plan.steps]


# -- the declaration ---------------------------------------------------------------------


def test_the_migration_file_declares_the_archive_schema() -> None:
    columns = DECLARATION.columns_of(mp.RECORDS)
    assert len(columns) == 15
    assert columns[0] == mp.Column(mp.RECORDS, "archive_status", "TEXT")
    assert (
        mp.Column(mp.RECORDS, "archive_may_be_hosted", "BOOLEAN NOT NULL DEFAULT false") in columns
    )
    assert len(DECLARATION.indexes) == 6
    assert all(i.concurrently and i.table == mp.RECORDS for i in DECLARATION.indexes)
    [constraint] = DECLARATION.constraints
    assert constraint.name == CONSTRAINT
    assert mp.status_values(DECLARATION) == tuple(str(s) for s in ArchiveStatus)
    assert [t.name for t in DECLARATION.tables] == ["image_archive_lane"]
    assert [s.table for s in DECLARATION.seeds] == ["image_archive_lane"]
    assert DECLARATION.lock_key == 1634888552
    assert DECLARATION.table_names == (mp.RECORDS, "image_archive_lane")


def test_one_more_column_or_project_table_is_one_more_statement() -> None:
    more = [
        *FILE,
        "ALTER TABLE image_generation_records ADD COLUMN IF NOT EXISTS archive_note TEXT",
        "CREATE TABLE IF NOT EXISTS image_archive_audit (id BIGINT PRIMARY KEY)",
        "ALTER TABLE image_archive_audit ADD COLUMN IF NOT EXISTS at TIMESTAMPTZ",
        "CREATE INDEX IF NOT EXISTS image_archive_audit_at_idx ON image_archive_audit (at)",
    ]
    declaration = mp.parse_declaration(more)
    plan = mp.plan(declaration, catalog_with())

    assert actions(plan) == [
        (mp.Action.ADD_COLUMNS, mp.RECORDS),
        (mp.Action.CREATE_TABLE, "image_archive_audit"),
        (mp.Action.ADD_COLUMNS, "image_archive_audit"),
        (mp.Action.SEED, "image_archive_lane"),
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
        mp.parse_declaration([*FILE, statement])
    assert "archive_migration.sql" in str(refused.value)


def test_the_lock_and_a_validate_for_each_constraint_are_required() -> None:
    without_lock = [s for s in FILE if "pg_advisory_lock" not in s]
    with pytest.raises(ValueError, match="pg_advisory_lock"):
        mp.parse_declaration(without_lock)
    without_validate = [s for s in FILE if "VALIDATE CONSTRAINT" not in s]
    with pytest.raises(ValueError, match="no VALIDATE"):
        mp.parse_declaration(without_validate)


# -- the plan ----------------------------------------------------------------------------


def test_an_up_to_date_schema_plans_no_change() -> None:
    plan = mp.plan(DECLARATION, catalog_with())
    assert plan.changes == ()
    assert actions(plan) == [(mp.Action.SEED, "image_archive_lane")]  # INSERT ... DO NOTHING
    assert not mp.legacy_scan_needed(DECLARATION, catalog_with())


def test_a_fresh_adoption_plans_everything_in_order_and_marks_nothing() -> None:
    catalog = mp.Catalog(tables=frozenset({mp.RECORDS}))
    plan = mp.plan(DECLARATION, catalog)

    assert [step.action for step in plan.steps] == [
        mp.Action.ADD_COLUMNS,
        mp.Action.CREATE_TABLE,
        mp.Action.SEED,
        *[mp.Action.BUILD_INDEX] * 6,
        mp.Action.ADD_CONSTRAINT,
        mp.Action.VALIDATE_CONSTRAINT,
    ]
    assert plan.steps[0].sql.count("ADD COLUMN IF NOT EXISTS") == 15  # one lock request
    assert not mp.legacy_scan_needed(DECLARATION, catalog)  # no archive_status yet
    assert [s.action.wait for s in plan.steps if s.action.wait is mp.Wait.BRIEF] == [
        mp.Wait.BRIEF
    ] * 4


def test_an_upgrade_adding_may_be_hosted_marks_the_rows_an_older_release_may_have_uploaded() -> (
    None
):
    older = catalog_with(columns=11, indexes={}, constraint=None, tables=())
    plan = mp.plan(DECLARATION, older)

    assert plan.steps[0].detail == (
        "archive_may_be_hosted, archive_altered, archive_staged_key, archive_staged_at"
    )
    assert (mp.Action.MARK_MAY_BE_HOSTED, mp.RECORDS) in actions(plan)
    assert mp.legacy_scan_needed(DECLARATION, older)
    # Once the column exists it carries the truth: never marked again.
    assert (mp.Action.MARK_MAY_BE_HOSTED, mp.RECORDS) not in actions(
        mp.plan(DECLARATION, catalog_with(constraint=None))
    )


def test_an_invalid_index_is_dropped_then_built_and_a_not_valid_constraint_only_validated() -> None:
    indexes = {i.name: True for i in DECLARATION.indexes}
    indexes["image_generation_records_archive_failed_idx"] = False
    plan = mp.plan(DECLARATION, catalog_with(indexes=indexes, constraint=False))

    assert actions(plan)[1:] == [
        (mp.Action.DROP_INVALID_INDEX, "image_generation_records_archive_failed_idx"),
        (mp.Action.BUILD_INDEX, "image_generation_records_archive_failed_idx"),
        (mp.Action.VALIDATE_CONSTRAINT, CONSTRAINT),
    ]
    assert plan.steps[1].sql == (
        "DROP INDEX CONCURRENTLY IF EXISTS image_generation_records_archive_failed_idx"
    )


def test_mappable_legacy_values_are_mapped_before_the_constraint() -> None:
    legacy = [mp.LegacyValue("pending", False, 3, "PENDING")]
    plan = mp.plan(DECLARATION, catalog_with(constraint=None), legacy)

    assert actions(plan)[-3:] == [
        (mp.Action.MAP_LEGACY, mp.RECORDS),
        (mp.Action.ADD_CONSTRAINT, CONSTRAINT),
        (mp.Action.VALIDATE_CONSTRAINT, CONSTRAINT),
    ]
    assert "'pending' (without a hosted_image_url) -> PENDING: 3 rows" in plan.steps[-3].detail


def test_an_unmappable_value_refuses_the_plan_and_repairs_only_a_not_valid_constraint() -> None:
    legacy = [
        mp.LegacyValue("CANCELLED", False, 1, None),
        mp.LegacyValue("DONE", True, 2, "SUCCEEDED"),
    ]
    refused = mp.plan(DECLARATION, catalog_with(columns=11, constraint=None), legacy)
    assert refused.steps == ()
    assert refused.refusal is not None
    assert "'CANCELLED' (without a hosted_image_url): 1 row\n" in refused.refusal
    assert "'DONE' (with a hosted_image_url) -> SUCCEEDED (2 rows)" in refused.refusal

    repaired = mp.plan(DECLARATION, catalog_with(columns=11, constraint=False), legacy)
    assert actions(repaired) == [(mp.Action.DROP_CONSTRAINT, CONSTRAINT)]
    assert repaired.steps[0].sql == (
        f"ALTER TABLE image_generation_records DROP CONSTRAINT IF EXISTS {CONSTRAINT}"
    )


def test_the_catalog_reads_the_schema_catalog_rows() -> None:
    catalog = mp.Catalog.from_rows(
        [
            ("table", mp.RECORDS, mp.RECORDS, True),
            ("column", "archive_status", mp.RECORDS, True),
            ("index", "i", mp.RECORDS, False),
            ("constraint", CONSTRAINT, mp.RECORDS, True),
        ]
    )
    assert catalog.tables == {mp.RECORDS}
    assert catalog.has_column(mp.RECORDS, "archive_status")
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
