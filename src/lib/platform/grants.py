"""The database privileges this release needs (one table, `NEEDS`), what a role lacks of them
as GRANT statements, and the words for a 42501 refusal. Pure: lib.cli.grants runs the check."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lib.platform.db import describe, sqlstate
from lib.platform.migration_file import RECORDS, Declaration

# Stands for "every column archive_migration.sql adds to image_generation_records", so a
# new archive column is granted without touching this table.
ARCHIVE_COLUMNS = "<archive columns>"


@dataclass(frozen=True)
class Need:
    table: str
    privileges: tuple[str, ...]
    columns: tuple[str, ...]  # empty: on the whole table
    why: str


# What the functions and archive-ctl's commands (all but `migrate`, which needs the table's owner)
# do in the database. A project table (image_archive_*) needs an entry here: a test checks that
# every table the migration creates has one. docs/reference/database.md lists this table.
NEEDS: tuple[Need, ...] = (
    Need(
        RECORDS,
        ("SELECT",),
        ("id", "user_id", "status", "image_url", "started_at", ARCHIVE_COLUMNS),
        "the claim reads the generation's own columns; every statement reads the archive's",
    ),
    Need(
        RECORDS,
        ("UPDATE",),
        (ARCHIVE_COLUMNS,),
        "every state change writes the archive columns and nothing else",
    ),
    Need("users", ("SELECT",), ("id", "username"), "the claim reads the owner's name"),
    Need(
        "image_archive_lane",
        ("SELECT", "UPDATE"),
        (),
        "the upload lane: every claim reads it; pauses and pacing update it",
    ),
    Need(
        "image_archive_uploads",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "the upload ledger: pacing books and takes slots, every upload Lsky may have stored "
        "is logged (unpaced: as its attempt ends, or as the claim or the sweeper takes over "
        "one that vanished), the sweeper rolls old ones up",
    ),
    Need(
        "image_archive_upload_hours",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "hourly counts: uploads per hour beyond the ledger's two hours (day, week, month windows)",
    ),
    Need(
        "image_archive_events",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "every record's story: the statements that change a record add its events, "
        "a conclusion's is marked when its completion event is published, "
        "`archive-ctl show` reads them, the sweeper removes them after the retention",
    ),
    Need(
        "image_archive_originals",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "the kept originals: the success write writes one, a claim confirms it, the audit "
        "adds, replaces, confirms or removes (found absent) one and reads them",
    ),
    Need(
        "image_archive_queue",
        ("SELECT", "UPDATE"),
        (),
        "the queue's receive mark: a claim moves it on, the sweeper's lost-message rule reads it",
    ),
    Need(
        "image_archive_audits",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "the audit's rotation: the success write enrols a record, the auditor takes, judges "
        "and drops (a deleted generation) its rows",
    ),
    Need(
        "image_archive_restores",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "restores under way: the audit and `archive-ctl restore` add them, a restore's claim "
        "reads them, its success write removes them",
    ),
    Need(
        "image_archive_audit_walk",
        ("SELECT", "UPDATE"),
        (),
        "the auditor's walk over older archives: its position",
    ),
    Need(
        "image_archive_outbox",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        (),
        "completion events: a conclusion writes its event, the archive function's next claim "
        "and the sweeper delete the published ones, the sweeper retries the rest",
    ),
)


# Project tables only `archive-ctl migrate` uses (it runs as the owner): no role needs them.
MIGRATE_ONLY: frozenset[str] = frozenset({"image_archive_migration_steps"})


@dataclass(frozen=True)
class Privilege:
    table: str
    column: str  # "" for the whole table
    privilege: str


@dataclass(frozen=True)
class Finding:
    """One needed privilege as the database answered (`privileges_of`)."""

    privilege: Privilege
    table_exists: bool
    column_exists: bool
    granted: bool | None  # None: the table or column is missing
    schema: str | None
    schema_usage: bool | None


@dataclass(frozen=True)
class Verdict:
    missing: tuple[Privilege, ...]
    schemas_without_usage: tuple[str, ...]
    absent: tuple[str, ...]  # tables and columns that do not exist (migrate not run?)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.schemas_without_usage or self.absent)


def privileges(declaration: Declaration, needs: Sequence[Need] = NEEDS) -> list[Privilege]:
    """Every (table, column, privilege) the needs stand for, in their order."""
    archive = [c.name for c in declaration.columns_of(RECORDS)]
    found: list[Privilege] = []
    for need in needs:
        columns = [
            name
            for column in need.columns
            for name in (archive if column == ARCHIVE_COLUMNS else [column])
        ]
        for privilege in need.privileges:
            found += [Privilege(need.table, column, privilege) for column in columns or [""]]
    return list(dict.fromkeys(found))


def judge(findings: Iterable[Finding]) -> Verdict:
    missing: list[Privilege] = []
    schemas: list[str] = []
    absent: list[str] = []
    for f in findings:
        p = f.privilege
        if not f.table_exists:
            absent.append(f"table {p.table}")
        elif not f.column_exists:
            absent.append(f"column {p.table}.{p.column}")
        elif not f.granted:
            missing.append(p)
        if f.schema is not None and f.schema_usage is False:
            schemas.append(f.schema)
    return Verdict(tuple(missing), tuple(dict.fromkeys(schemas)), tuple(dict.fromkeys(absent)))


def quote_ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def grant_statements(
    role: str, missing: Sequence[Privilege], schemas: Sequence[str] = ()
) -> list[str]:
    """The GRANTs that add `missing` to `role`: one statement per table, whole-table
    privileges apart from column lists, in the order they were needed."""
    grantee = quote_ident(role)
    statements = [f"GRANT USAGE ON SCHEMA {quote_ident(s)} TO {grantee}" for s in schemas]
    tables = list(dict.fromkeys(p.table for p in missing))
    for table in tables:
        whole = [p.privilege for p in missing if p.table == table and not p.column]
        by_privilege: dict[str, list[str]] = {}
        for p in missing:
            if p.table == table and p.column:
                by_privilege.setdefault(p.privilege, []).append(p.column)
        if whole:
            statements.append(f"GRANT {', '.join(dict.fromkeys(whole))} ON {table} TO {grantee}")
        if by_privilege:
            lists = ", ".join(
                f"{privilege} ({', '.join(columns)})" for privilege, columns in by_privilege.items()
            )
            statements.append(f"GRANT {lists} ON {table} TO {grantee}")
    return [s + ";" for s in statements]


_DENIED = re.compile(
    r'permission denied for (?:column "?(?P<column>\w+)"? of relation|(?P<kind>\w+))'
    r' "?(?P<name>[\w.]+)"?'
)
_NOT_OWNER = re.compile(r'must be owner of \w+ "?(?P<name>[\w.]+)"?')
# How many missing privileges a 42501's description lists before "and N more".
LISTED_MISSING = 6


def grants_hint(role: str | None) -> str:
    """Where the fix is: the command that prints the GRANT statements a role lacks."""
    command = f"archive-ctl grants --role {quote_ident(role) if role else '<role>'}"
    return f"`{command}` prints the GRANT statements this release needs"


def is_permission_denied(error: BaseException) -> bool:
    """A 42501: the database role lacks a privilege this release needs."""
    return sqlstate(error) == "42501"


def describe_missing(missing: Sequence[Privilege]) -> str:
    """`UPDATE (archive_staged_at, archived_at) on image_generation_records, INSERT on
    image_archive_uploads`: what a role lacks, by table and privilege."""
    groups: dict[tuple[str, str], list[str]] = {}
    for p in missing[:LISTED_MISSING]:
        groups.setdefault((p.table, p.privilege), []).append(p.column)
    words = [
        f"{privilege} ({', '.join(columns)}) on {table}"
        if any(columns)
        else f"{privilege} on {table}"
        for (table, privilege), columns in groups.items()
    ]
    more = len(missing) - LISTED_MISSING
    return ", ".join(words) + (f" and {more} more" if more > 0 else "")


def describe_permission_denied(
    error: BaseException, *, role: str | None = None, missing: Sequence[Privilege] = ()
) -> str:
    """One line for a 42501 (insufficient_privilege) error: the table and, when the server
    names it, the column; what `role` lacks when the caller read it from the catalog
    (lib.state.privileges); and the command that prints the GRANTs. PostgreSQL names only
    the table when a column privilege is missing. Other errors: `describe`."""
    detail = error.args[0] if error.args else None
    if not isinstance(detail, dict) or detail.get("C") != "42501":
        return describe(error)
    message = str(detail.get("M", ""))
    if owner := _NOT_OWNER.search(message):
        return (
            f"42501: only the owner of {owner['name']} may change it"
            " (run `archive-ctl migrate` as the table's owner)"
        )
    hint = grants_hint(role)
    denied = _DENIED.search(message)
    if denied and denied["kind"] == "schema":
        return f"42501: no USAGE on schema {denied['name']}; {hint}"
    table = detail.get("t") or (denied["name"] if denied else None)
    column = detail.get("c") or (denied["column"] if denied else None)
    if table and column:
        what = f"column {column} of table {table}"
    elif table:
        what = f"table {table}"
    else:
        what = f"an object ({message[:120]})"
    lacks = f"; role {role} lacks {describe_missing(missing)}" if role and missing else ""
    return f"42501: permission denied on {what}{lacks}; {hint}"
