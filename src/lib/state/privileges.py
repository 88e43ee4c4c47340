"""A role's privileges against what this release needs (lib.platform.grants.NEEDS), read
from the live catalog: for `archive-ctl grants`, and to name exactly what a 42501 lacks
wherever one is reported (the archive function, the sweeper, archive-ctl)."""

from __future__ import annotations

from dataclasses import dataclass

from lib.platform import grants
from lib.platform.db import Database
from lib.platform.migration_file import load_declaration
from lib.state.queries import Statements


@dataclass(frozen=True)
class RoleCheck:
    role: str
    superuser: bool
    needed: tuple[grants.Privilege, ...]
    verdict: grants.Verdict


class RolePrivileges(Statements):
    def check(self, role: str | None) -> RoleCheck | None:
        """`role` (None: the connected one) against every privilege the release needs;
        None when there is no such role."""
        rows = self._run("role_of", role=role)
        if not rows:
            return None
        [[name, superuser]] = rows
        needed = tuple(grants.privileges(load_declaration()))
        found = self._run(
            "privileges_of",
            role=name,
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
            for table, column, privilege, table_exists, column_exists, granted, usage, schema in (
                found
            )
        )
        return RoleCheck(str(name), bool(superuser), needed, verdict)


def explain_denial(db: Database, error: BaseException) -> str:
    """A 42501 in words that name the fix: what PostgreSQL said, what the connected role
    lacks of this release's needs (read from the catalog: PostgreSQL names only the table
    when a column privilege is missing) and the `archive-ctl grants` line for that role.
    Any other error, or a catalog that cannot be read: grants.describe_permission_denied."""
    if not grants.is_permission_denied(error):
        return grants.describe_permission_denied(error)
    try:
        check = RolePrivileges(db).check(None)
    except Exception:  # noqa: BLE001 - a diagnosis only: the refusal itself is still named
        return grants.describe_permission_denied(error)
    if check is None:
        return grants.describe_permission_denied(error)
    return grants.describe_permission_denied(error, role=check.role, missing=check.verdict.missing)
