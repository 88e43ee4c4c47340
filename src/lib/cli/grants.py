"""`archive-ctl grants`: checks a role against lib.platform.grants.NEEDS in the live database
and prints the GRANT statements it lacks (exit 1 when anything is missing)."""

from __future__ import annotations

from lib.cli.context import EXIT_ERROR, EXIT_OK, CommandError, Context, out
from lib.platform import grants
from lib.platform.migration_file import load_declaration
from lib.state.queries import QUERIES


def run(ctx: Context) -> int:
    db = ctx.database()
    rows = db.run(QUERIES["role_of"], role=ctx.args.role)
    if not rows:
        raise CommandError(f"there is no role {ctx.args.role!r} in this database cluster")
    [[role, superuser]] = rows
    needed = grants.privileges(load_declaration())
    found = db.run(
        QUERIES["privileges_of"],
        role=role,
        tables=[p.table for p in needed],
        columns=[p.column for p in needed],
        privileges=[p.privilege for p in needed],
    )
    verdict = grants.judge(
        grants.Finding(
            grants.Privilege(table, column, privilege),
            table_exists=bool(table_exists),
            column_exists=bool(column_exists),
            granted=granted,
            schema=schema,
            schema_usage=usage,
        )
        for table, column, privilege, table_exists, column_exists, granted, usage, schema in found
    )
    tables = len({p.table for p in needed})
    if superuser:
        out(f"role {role} is a superuser: it has every privilege (a function should not use one)")
    for missing in verdict.absent:
        out(f"-- {missing} does not exist: run `archive-ctl migrate` first")
    if verdict.complete:
        out(
            f"-- role {role} has all {len(needed)} privileges this release needs on {tables} tables"
        )
        return EXIT_OK
    statements = grants.grant_statements(role, verdict.missing, verdict.schemas_without_usage)
    if statements:
        out(
            f"-- role {role} lacks {len(verdict.missing)} of the {len(needed)} privileges this"
            f" release needs; run as the tables' owner:"
        )
        for statement in statements:
            out(statement)
    return EXIT_ERROR
