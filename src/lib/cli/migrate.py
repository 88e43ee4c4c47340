"""`archive-ctl migrate`: prints or applies the schema statements that lib.platform.schema
loads and runs (one at a time, autocommit, idempotent)."""

from __future__ import annotations

from lib.cli.context import EXIT_OK, Context, out
from lib.platform import schema as migration


def run(ctx: Context) -> int:
    args = ctx.args
    statements = migration.load(migration.schema_files(with_base_schema=args.with_base_schema))
    if args.dry_run:
        for statement in statements:
            out(f"-- {statement.source.name}\n{statement.sql};\n")
        out(f"dry run: {len(statements)} statements, nothing applied")
        return EXIT_OK
    db = ctx.database(migration_session=True)
    dropped = migration.apply(
        db.run, statements, on_statement=lambda s: out(f"  {s.source.name}: {s.summary}")
    )
    for name in dropped:
        out(f"dropped invalid index {name} (left by an interrupted build) and rebuilt it")
    out(f"applied {len(statements)} statements (all idempotent: safe to run again)")
    return EXIT_OK
