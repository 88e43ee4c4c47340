"""`archive-ctl grants`: checks a role against lib.platform.grants.NEEDS in the live database
(lib.state.privileges) and prints the GRANT statements it lacks; the exit code tells a
script which case it is (all there, privileges missing, no such role, schema not migrated)."""

from __future__ import annotations

from lib.cli.context import (
    EXIT_MISSING_GRANTS,
    EXIT_NO_ROLE,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    Context,
    note,
)
from lib.cli.words import plural
from lib.platform import grants


def run(ctx: Context) -> int:
    asked: str | None = ctx.args.role
    check = ctx.privileges().check(asked)
    if check is None:
        note(f"archive-ctl: error: there is no role {asked!r} in this database cluster")
        ctx.answer({"role": asked, "exists": False})
        return EXIT_NO_ROLE
    role, verdict = check.role, check.verdict
    statements = grants.grant_statements(role, verdict.missing, verdict.schemas_without_usage)
    tables = len({p.table for p in check.needed})
    ctx.answer(
        {
            "role": role,
            "exists": True,
            "superuser": check.superuser,
            "needed": len(check.needed),
            "missing": [
                {"table": p.table, "column": p.column or None, "privilege": p.privilege}
                for p in verdict.missing
            ],
            "schemas_without_usage": list(verdict.schemas_without_usage),
            "absent": list(verdict.absent),
            "statements": statements,
        }
    )
    if check.superuser:
        ctx.say(
            f"role {role} is a superuser: it has every privilege (a function should not use one)"
        )
    for missing in verdict.absent:
        ctx.say(f"-- {missing} does not exist: run `archive-ctl migrate` first")
    if verdict.complete:
        ctx.say(
            f"-- role {role} has all {plural(len(check.needed), 'privilege')} this release "
            f"needs on {plural(tables, 'table')}"
        )
        return EXIT_OK
    if statements:
        ctx.say(
            f"-- role {role} lacks {len(verdict.missing)} of the "
            f"{plural(len(check.needed), 'privilege')}"
            " this release needs; run as the tables' owner:"
        )
        for statement in statements:
            ctx.say(statement)
    return EXIT_NOT_MIGRATED if verdict.absent else EXIT_MISSING_GRANTS
