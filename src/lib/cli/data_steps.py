"""`archive-ctl migrate`'s data steps that outlive a run: the notes it keeps in
image_archive_migration_steps (lib.platform.migration_plan plans from them) and the
may-be-hosted marking they guard, resumed after the last batch a stopped run got through
(docs/explanation/live-migration.md, "Rows an older release may have uploaded")."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pg8000.exceptions

from lib.cli.context import CommandError
from lib.cli.words import plural
from lib.platform import migration_file as mf
from lib.platform import migration_plan as mp
from lib.platform.db import Database
from lib.platform.grants import is_permission_denied
from lib.state.queries import QUERIES

T = TypeVar("T")
FIRST_ID = -(2**63)  # keyset paging starts below every bigint id


class Steps(Protocol):
    """What the marking needs of the migration: its session, and how it runs batches and
    brief statements (lib.cli.migrate.Migration)."""

    db: Database

    def batches(self, step: mp.Step, query: str, *, start: int, **params: Any) -> int: ...

    def brief(self, step: mp.Step, call: Callable[[], T]) -> T: ...


def mark_may_be_hosted(migration: Steps, step: mp.Step, *, after: int | None) -> str:
    """The marking, after the id an earlier run got through; its note deleted when done."""
    start = FIRST_ID if after is None else after
    marked = migration.batches(step, "mark_may_be_hosted", start=start, step_name=mp.MARK_STEP)
    done = QUERIES["finish_migration_step"]
    migration.brief(step, functools.partial(migration.db.run, done, step=mp.MARK_STEP))
    resumed = "" if after is None else f", resumed after id {after}"
    return f": {plural(marked, 'row')} marked{resumed}"


def would_mark(db: Database, catalog: mp.Catalog, after: int | None) -> str:
    """What the marking would do, for --dry-run (`after`: an earlier run's progress)."""
    if not catalog.has_column(mf.RECORDS, "archive_attempts"):
        return "(not counted: archive_attempts is added in the same run)"
    if not catalog.has_column(mf.RECORDS, mp.MAY_BE_HOSTED_COLUMN):
        [[count]] = db.run(QUERIES["count_may_have_uploaded"])
        return f"{plural(count, 'row')} would be marked"
    [[count]] = db.run(QUERIES["count_left_to_mark"], after=FIRST_ID if after is None else after)
    return f"{plural(count, 'row')} would be marked (the rest of an earlier run's marking)"


def unfinished_steps(db: Database, catalog: mp.Catalog) -> tuple[dict[str, int | None], mp.Catalog]:
    """The data steps an earlier run left unfinished (the last id each got to), and the
    catalog that says so: the project's table is read, never the records (no lock)."""
    if mp.STEPS_TABLE not in catalog.tables:
        return {}, catalog
    try:
        rows = db.run(QUERIES["unfinished_migration_steps"])
    except pg8000.exceptions.DatabaseError as error:
        if not is_permission_denied(error):
            raise
        raise CommandError(
            f"42501: {mp.STEPS_TABLE} may not be read by this role: migrate needs the"
            " tables' owner (run `archive-ctl migrate` as the table's owner)"
        ) from None
    progress = {str(step): None if after is None else int(after) for step, after in rows}
    return progress, dataclasses.replace(catalog, unfinished=frozenset(progress))
