"""`archive-ctl migrate`: under the migration's advisory lock, reads the catalog, checks the rows,
plans with lib.platform.migration_plan and runs only what is missing, each step with the lock
wait it can afford (docs/explanation/live-migration.md). `--dry-run` stops after the plan."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import pg8000.exceptions

from lib.cli import legacy_status
from lib.cli.context import EXIT_ERROR, EXIT_OK, CommandError, Context
from lib.cli.data_steps import FIRST_ID, mark_may_be_hosted, unfinished_steps, would_mark
from lib.cli.words import plural
from lib.platform import migration_file as mf
from lib.platform import migration_plan as mp
from lib.platform import schema
from lib.platform.db import MIGRATION_LOCK_TIMEOUT_MS, Database, describe, sqlstate
from lib.platform.errors import DatabaseUnavailable
from lib.platform.grants import describe_permission_denied
from lib.state.queries import QUERIES

T = TypeVar("T")

# Rows per batch of the data steps: one short transaction each.
BATCH_ROWS = 5_000
PROGRESS_EVERY_BATCHES = 100
LOCK_POLL_SECONDS = 1.0
# lock_not_available (lock_timeout), deadlock_detected: the statement did nothing; try again.
RETRYABLE = frozenset({"55P03", "40P01"})
CHECK_VIOLATION = "23514"
SAFE_AGAIN = (
    "Running `archive-ctl migrate` again is safe: it checks the catalog first and skips"
    " what exists."
)


def run(ctx: Context) -> int:
    declaration = mf.load_declaration()
    migration = Migration(ctx, ctx.database(migration_session=True), declaration)
    return migration.dry_run() if ctx.args.dry_run else migration.apply()


class Migration:
    def __init__(self, ctx: Context, db: Database, declaration: mf.Declaration) -> None:
        self.ctx = ctx
        self.db = db
        self.declaration = declaration
        self.retry_for = float(ctx.args.retry_for)
        self.wait = float(ctx.args.wait)
        self._lock_timeout_ms = MIGRATION_LOCK_TIMEOUT_MS  # the session's own
        self._progress: dict[str, int | None] = {}  # data steps begun: the last id done

    # -- the two ways through ---------------------------------------------------------

    def apply(self) -> int:
        started = self.ctx.clock()
        self.hold_lock()
        if self.ctx.args.with_base_schema:
            for statement in schema.load([schema.BASE_SCHEMA]):
                self.ctx.progress(f"  {statement.source.name}: {statement.summary}")
                self.db.run(statement.sql)
        catalog = self.catalog()
        legacy = self.legacy(catalog)
        plan = mp.plan(self.declaration, catalog, legacy)
        if plan.refusal is not None:
            for step in plan.steps:  # repairs only: a NOT VALID constraint refusing updates
                self.execute(step, legacy)
            repaired = "".join(
                f"\nDropped the NOT VALID {step.name} an earlier run left: it refused every"
                " update of those rows, the generation service's own included."
                for step in plan.steps
            )
            raise CommandError(plan.refusal + repaired)
        if not plan.changes:
            self.ctx.progress(f"  {self.described(catalog)}")
        for step in plan.steps:
            self.execute(step, legacy)
        seconds = self.ctx.clock() - started
        self.ctx.answer({**_answer(plan, legacy), "dry_run": False, "seconds": round(seconds, 2)})
        if plan.changes:
            self.ctx.say(
                f"migrated in {seconds:.2f} s: {plural(len(plan.changes), 'step')}; the schema "
                "is up to date"
            )
        else:
            self.ctx.say(f"the schema was up to date: nothing to change ({seconds:.2f} s)")
        return EXIT_OK

    def dry_run(self) -> int:
        holder = self.lock_holder()
        if holder:
            self.ctx.progress(
                f"note: another migration is running ({holder}); this plan may be out of date"
            )
        if self.ctx.args.with_base_schema:
            for statement in schema.load([schema.BASE_SCHEMA]):
                self.ctx.say(f"-- {statement.source.name} (first)\n{statement.sql};\n")
        catalog = self.catalog(allow_missing_table=self.ctx.args.with_base_schema)
        legacy = self.legacy(catalog)
        plan = mp.plan(self.declaration, catalog, legacy)
        described = self.described(catalog)
        self.ctx.say(f"  {described}")
        if plan.refusal is not None:
            self.ctx.say(plan.refusal)
        for number, step in enumerate(plan.steps, 1):
            self.ctx.say(f"{number}. {step.summary} [{_WAITS[step.action.wait]}]")
            if step.sql:
                self.ctx.say("   " + step.sql.replace("\n", "\n   ") + ";")
            if step.action is mp.Action.MARK_MAY_BE_HOSTED:
                self.ctx.say(f"   {would_mark(self.db, catalog, self._progress.get(mp.MARK_STEP))}")
        verdict = "would stop before changing the schema" if plan.refusal else "nothing applied"
        self.ctx.say(f"dry run: {plural(len(plan.changes), 'change')} planned, {verdict}")
        self.ctx.answer({**_answer(plan, legacy), "dry_run": True, "catalog": described})
        return EXIT_ERROR if plan.refusal else EXIT_OK

    # -- what is there ----------------------------------------------------------------

    def catalog(self, *, allow_missing_table: bool = False) -> mp.Catalog:
        rows = self.db.run(
            QUERIES["schema_catalog"],
            tables=list(self.declaration.table_names),
            indexes=[i.name for i in self.declaration.indexes],
            constraints=[c.name for c in self.declaration.constraints],
        )
        catalog = mp.Catalog.from_rows(rows)
        if mf.RECORDS not in catalog.tables and not allow_missing_table:
            raise CommandError(
                f"there is no {mf.RECORDS} table here (the generation service's): is this the"
                " right database? For an empty local database use `migrate --with-base-schema`"
            )
        self._progress, catalog = unfinished_steps(self.db, catalog)
        return catalog

    def legacy(self, catalog: mp.Catalog) -> list[mp.LegacyValue]:
        """The status values the CHECK would refuse, looked for before anything changes."""
        if not mp.legacy_scan_needed(self.declaration, catalog):
            return []
        rows = self.db.run(
            QUERIES["legacy_statuses"], allowed=list(mp.status_values(self.declaration))
        )
        found = legacy_status.classify(rows)
        for value in found:
            verdict = f"maps to {value.target}" if value.target else "cannot be mapped"
            self.ctx.progress(f"  archive_status {value.label}: {value.counted}; {verdict}")
        return found

    def described(self, catalog: mp.Catalog) -> str:
        d = self.declaration
        columns = sum(catalog.has_column(c.table, c.name) for c in d.columns)
        indexes = sum(catalog.indexes.get(i.name, False) for i in d.indexes)
        checks = sum(catalog.constraints.get(c.name, False) for c in d.constraints)
        tables = sum(t.name in catalog.tables for t in d.tables)
        return (
            f"catalog: {columns}/{len(d.columns)} columns, {indexes}/{len(d.indexes)} valid"
            f" indexes, {checks}/{len(d.constraints)} validated constraints,"
            f" {tables}/{len(d.tables)} project tables"
        )

    # -- the migration's lock -------------------------------------------------------------

    def hold_lock(self) -> None:
        """The advisory lock every migration takes (archive_migration.sql's too), waited for
        up to --wait seconds; only then is an INVALID index known to be nobody's build."""
        deadline = self.ctx.clock() + self.wait
        reported = None
        while True:
            [[taken]] = self.db.run(QUERIES["migration_lock_try"], key=self.declaration.lock_key)
            if taken:
                return
            holder = self.lock_holder()
            if self.ctx.clock() >= deadline:
                raise CommandError(
                    f"another migration is running ({holder or 'it just finished'}); it is safe"
                    " to run `archive-ctl migrate` again once it finishes"
                )
            if holder and holder != reported:
                self.ctx.progress(
                    f"waiting up to {self.wait:.0f} s for another migration to finish ({holder})"
                )
                reported = holder
            self.ctx.sleep(LOCK_POLL_SECONDS)

    def lock_holder(self) -> str | None:
        rows = self.db.run(QUERIES["migration_lock_holder"], key=self.declaration.lock_key)
        if not rows:
            return None
        pid, since, application = rows[0]
        # pg_stat_activity hides another role's times from a role without pg_read_all_stats.
        when = since.isoformat(timespec="seconds") if isinstance(since, datetime) else "?"
        return f"pid {pid} since {when}, {application or 'no application name'}"

    # -- the steps ------------------------------------------------------------------------

    def execute(self, step: mp.Step, legacy: list[mp.LegacyValue]) -> None:
        started = self.ctx.clock()
        try:
            detail = self._execute(step, legacy)
        except DatabaseUnavailable as error:
            raise CommandError(
                f"{step.summary}: the connection was lost ({error}), and the migration's lock"
                f" with it. {SAFE_AGAIN}"
            ) from None
        except pg8000.exceptions.DatabaseError as error:
            raise CommandError(
                f"{step.summary}: {describe_permission_denied(error)}. {SAFE_AGAIN}"
            ) from None
        seconds = self.ctx.clock() - started
        self.ctx.progress(f"  {step.summary}{detail} ({seconds:.2f} s)")

    def _execute(self, step: mp.Step, legacy: list[mp.LegacyValue]) -> str:
        action = step.action
        if action is mp.Action.NOTE_STEP:
            self.brief(step, lambda: self.db.run(QUERIES["note_migration_step"], step=step.name))
            return ""
        if action is mp.Action.MARK_MAY_BE_HOSTED:
            return mark_may_be_hosted(self, step, after=self._progress.get(mp.MARK_STEP))
        if action is mp.Action.MAP_LEGACY:
            mapped = self.batches(
                step,
                "map_legacy_statuses",
                legacy=[v.value for v in legacy],
                hosted=[v.hosted for v in legacy],
                target=[v.target for v in legacy],
            )
            return f"; {plural(mapped, 'row')} mapped"
        if action.wait is mp.Wait.BRIEF:
            self.brief(step, lambda: self.db.run(step.sql))
        elif action is mp.Action.VALIDATE_CONSTRAINT:
            self.validate(step)
        else:
            self.patient(step)
        return ""

    def brief(self, step: mp.Step, call: Callable[[], T]) -> T:
        """`call` under the short lock_timeout, retried with backoff for up to --retry-for
        seconds: a busy table is never queued behind our lock request for longer than the
        timeout at a time, however long its readers keep it."""
        deadline = self.ctx.clock() + self.retry_for
        for attempt in itertools.count(1):
            self.lock_timeout(MIGRATION_LOCK_TIMEOUT_MS)
            try:
                return call()
            except pg8000.exceptions.DatabaseError as error:
                if sqlstate(error) not in RETRYABLE:
                    raise
                delay = mp.backoff_seconds(attempt)
                holders = self.holders(step.table)
                if self.ctx.clock() + delay > deadline:
                    raise CommandError(
                        f"{step.summary}: {step.table} stayed busy for {self.retry_for:.0f} s"
                        f" ({holders}); {plural(attempt, 'try', 'tries')}, each given up after"
                        f" {MIGRATION_LOCK_TIMEOUT_MS} ms, so its users waited no longer than"
                        f" that. Nothing of this step was applied. {SAFE_AGAIN}"
                    ) from None
                self.ctx.progress(
                    f"    {step.table} is busy ({holders}): try {attempt} gave up after"
                    f" {MIGRATION_LOCK_TIMEOUT_MS} ms, next in {delay:g} s"
                )
                self.ctx.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def patient(self, step: mp.Step) -> None:
        """A step whose wait lets the table's readers and writers through (SHARE UPDATE
        EXCLUSIVE): it may wait up to --wait seconds, e.g. for older transactions to end."""
        self.lock_timeout(int(self.wait * 1000))
        try:
            self.db.run(step.sql)
        except pg8000.exceptions.DatabaseError as error:
            if sqlstate(error) not in RETRYABLE:
                raise
            left = (
                " It left an INVALID index, which the next run drops and builds again."
                if step.action is mp.Action.BUILD_INDEX
                else ""
            )
            raise CommandError(
                f"{step.summary}: waited {self.wait:.0f} s for a lock"
                f" ({self.holders(step.table)}); the table's readers and writers went on"
                f" meanwhile.{left} {SAFE_AGAIN}"
            ) from None

    def validate(self, step: mp.Step) -> None:
        """VALIDATE, or, when it fails, the NOT VALID constraint dropped again: it would refuse
        every UPDATE of a row with a value it does not allow (a value written since the
        check, by a release still running)."""
        try:
            self.patient(step)
        except (CommandError, pg8000.exceptions.DatabaseError) as failure:
            [constraint] = [c for c in self.declaration.constraints if c.name == step.name]
            drop = mp.Step(
                mp.Action.DROP_CONSTRAINT, step.table, step.name, mp.drop_constraint_sql(constraint)
            )
            self.brief(drop, lambda: self.db.run(drop.sql))
            reason = failure if isinstance(failure, CommandError) else describe(failure)
            found = ""
            if (
                isinstance(failure, pg8000.exceptions.DatabaseError)
                and sqlstate(failure) == CHECK_VIOLATION
            ):
                values = self.legacy(self.catalog())
                found = " Values now: " + (
                    ", ".join(f"{v.label}: {v.counted}" for v in values) or "none"
                )
            raise CommandError(
                f"{step.summary} failed ({reason}); the NOT VALID constraint was dropped again,"
                f" so updates of those rows keep working, and everything else is in place.{found}"
                f" {SAFE_AGAIN}"
            ) from None

    def batches(self, step: mp.Step, query: str, *, start: int = FIRST_ID, **params: Any) -> int:
        """A data step as keyset batches of BATCH_ROWS rows after id `start`, each a short
        transaction that waits for row locks as briefly as a brief step waits for the
        table's."""
        after, changed = start, 0
        for batch in itertools.count(1):
            run = functools.partial(
                self.db.run, QUERIES[query], after=after, batch=BATCH_ROWS, **params
            )
            [[last, count]] = self.brief(step, run)
            if last is None:
                return changed
            after, changed = int(last), changed + int(count)
            if batch % PROGRESS_EVERY_BATCHES == 0:
                looked = batch * BATCH_ROWS
                self.ctx.progress(
                    f"    {step.action.words}: {looked} rows looked at, {changed} changed"
                )
        raise AssertionError("unreachable")  # pragma: no cover

    def holders(self, table: str) -> str:
        rows = self.db.run(QUERIES["table_lock_holders"], table=table)
        if not rows:
            return "no lock holder left"
        return "held by " + ", ".join(
            f"pid {pid} ({application or '?'}, {state or '?'}, {max(float(age or 0), 0):.1f} s)"
            for pid, application, state, age in rows
        )

    def lock_timeout(self, milliseconds: int) -> None:
        if milliseconds != self._lock_timeout_ms:
            self.db.run(f"SET lock_timeout = {int(milliseconds)}")
            self._lock_timeout_ms = milliseconds


def _answer(plan: mp.Plan, legacy: list[mp.LegacyValue]) -> dict[str, object]:
    """--json: the plan, applied or not."""
    return {
        "refusal": plan.refusal,
        "changes": len(plan.changes),
        "steps": [
            {"summary": step.summary, "wait": _WAITS[step.action.wait], "sql": step.sql}
            for step in plan.steps
        ],
        "legacy_values": [
            {"value": v.label, "rows": v.counted, "maps_to": v.target} for v in legacy
        ],
    }


_WAITS = {
    mp.Wait.BRIEF: "brief lock: short lock_timeout, retried",
    mp.Wait.PATIENT: "readers and writers go on while it waits",
    mp.Wait.ROWS: f"row batches of {BATCH_ROWS}",
}
