"""The privileges this release needs (lib.platform.grants): derived from one table and the
migration, rendered as GRANTs, documented as generated; and the words for a 42501."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pg8000.exceptions import DatabaseError

from lib.platform import grants
from lib.platform import migration_file as mf
from lib.platform.grants import Privilege, describe_permission_denied
from lib.platform.schema import split_statements

DECLARATION = mf.load_declaration()
ROOT = Path(__file__).resolve().parents[2]


def documented(path: Path, section: str) -> list[str]:
    """The statements of the ```sql block of `section` in a docs page, whitespace folded."""
    text = path.read_text(encoding="utf-8").split(section, 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```sql\n(.*?)```", text, re.DOTALL)
    return [" ".join(s.split()) + ";" for s in split_statements(block)]


def test_the_needs_cover_every_archive_column_and_every_project_table() -> None:
    needed = grants.privileges(DECLARATION)
    archive = [c.name for c in DECLARATION.columns_of(mf.RECORDS)]
    updates = [p.column for p in needed if p.table == mf.RECORDS and p.privilege == "UPDATE"]
    reads = [p.column for p in needed if p.table == mf.RECORDS and p.privilege == "SELECT"]
    assert updates == archive
    assert reads == ["id", "user_id", "status", "image_url", "started_at", *archive]
    assert Privilege("users", "username", "SELECT") in needed
    # A new image_archive_* table in the migration needs its entry in NEEDS (unless only
    # migrate, the owner, uses it).
    tables = {t.name for t in DECLARATION.tables}
    assert tables - grants.MIGRATE_ONLY <= {n.table for n in grants.NEEDS}
    assert tables >= grants.MIGRATE_ONLY
    assert not grants.MIGRATE_ONLY & {n.table for n in grants.NEEDS}
    assert len(needed) == len(set(needed))


def test_grants_are_one_statement_per_table_in_the_order_needed() -> None:
    missing = [
        Privilege("image_generation_records", "archive_status", "UPDATE"),
        Privilege("image_archive_lane", "", "SELECT"),
        Privilege("image_generation_records", "id", "SELECT"),
        Privilege("image_generation_records", "archived_at", "UPDATE"),
        Privilege("image_archive_lane", "", "UPDATE"),
    ]
    assert grants.grant_statements("archiver", missing, ["app"]) == [
        "GRANT USAGE ON SCHEMA app TO archiver;",
        "GRANT UPDATE (archive_status, archived_at), SELECT (id)"
        " ON image_generation_records TO archiver;",
        "GRANT SELECT, UPDATE ON image_archive_lane TO archiver;",
    ]
    assert grants.grant_statements('Ops "Team"', missing[1:2]) == [
        'GRANT SELECT ON image_archive_lane TO "Ops ""Team""";'
    ]


def test_the_verdict_separates_missing_privileges_from_missing_objects() -> None:
    def finding(p: Privilege, **kw: object) -> grants.Finding:
        fields: dict[str, object] = {
            "table_exists": True,
            "column_exists": True,
            "granted": True,
            "schema": "public",
            "schema_usage": True,
            **kw,
        }
        return grants.Finding(p, **fields)  # type: ignore[arg-type]

    ok = Privilege("users", "id", "SELECT")
    lacking = Privilege("users", "username", "SELECT")
    gone = Privilege("image_generation_records", "archive_staged_at", "UPDATE")
    verdict = grants.judge(
        [
            finding(ok),
            finding(lacking, granted=False, schema_usage=False),
            finding(gone, column_exists=False, granted=None),
        ]
    )
    assert verdict.missing == (lacking,)
    assert verdict.schemas_without_usage == ("public",)
    assert verdict.absent == ("column image_generation_records.archive_staged_at",)
    assert not verdict.complete
    assert grants.judge([finding(ok)]).complete


def test_the_documented_grants_are_what_the_release_needs() -> None:
    """docs/reference/database.md's block (which tests/integration/test_database_grants.py runs the
    functions with) is exactly what `archive-ctl grants` prints for a role without any."""
    expected = grants.grant_statements("image_archive", grants.privileges(DECLARATION))
    assert documented(ROOT / "docs" / "reference" / "database.md", "### Permissions") == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"M": "permission denied for table image_generation_records"},
            "42501: permission denied on table image_generation_records;",
        ),
        (
            {"M": 'permission denied for column "archive_error" of relation "image_archive_x"'},
            "42501: permission denied on column archive_error of table image_archive_x;",
        ),
        (
            {"M": "permission denied for table x", "t": "image_archive_lane", "c": "version"},
            "42501: permission denied on column version of table image_archive_lane;",
        ),
        (
            {"M": "permission denied for schema app"},
            "42501: no USAGE on schema app;",
        ),
        (
            {"M": "must be owner of table image_generation_records"},
            "42501: only the owner of image_generation_records may change it",
        ),
    ],
)
def test_a_permission_error_names_the_table_and_the_column_when_the_server_does(
    fields: dict[str, str], expected: str
) -> None:
    message = describe_permission_denied(DatabaseError({"C": "42501", **fields}))
    assert message.startswith(expected)
    if "owner" not in expected:
        assert "archive-ctl grants --role" in message


def test_other_errors_are_described_as_usual() -> None:
    error = DatabaseError({"C": "57014", "M": "canceling statement due to statement timeout"})
    assert (
        describe_permission_denied(error) == "57014: canceling statement due to statement timeout"
    )


def test_the_grants_table_in_database_md_lists_each_need() -> None:
    """Each need's table, privileges and why, as NEEDS has them (a glossary link in the
    doc reads as its word)."""
    text = (ROOT / "docs" / "reference" / "database.md").read_text(encoding="utf-8")
    text = text.split("## Grants", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| ([A-Z, ]+) \| [^|]* \| ([^|]*) \|$", text, re.MULTILINE)
    assert [
        (
            table,
            tuple(p.strip() for p in privileges.split(",")),
            re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", why),
        )
        for table, privileges, why in rows
    ] == [(need.table, need.privileges, need.why) for need in grants.NEEDS]
