"""One queue message, start to finish: parse -> claim -> plan -> transfer -> conclude.

The sequence only calls the steps; each decides in its own module and the conclusion
table (lib.archive.conclusion) carries every outcome out. One guard covers it all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive import schedule
from lib.archive.conclusion import Concluder, Context
from lib.archive.faults import fault_verdict
from lib.archive.message import MalformedMessage, parse_record_id
from lib.archive.outcome import Message, Outcome, Result, Verdict
from lib.archive.transfer import Transfer
from lib.platform.config import Settings
from lib.platform.grants import is_permission_denied
from lib.platform.observability import log_unexpected, logger, metrics
from lib.platform.redact import outside_text
from lib.publish.publisher import Publisher
from lib.state.lane import LaneState
from lib.state.privileges import explain_denial
from lib.state.records import ArchiveRecords


class ArchiveWorker:
    def __init__(
        self,
        *,
        settings: Settings,
        records: ArchiveRecords,
        transfer: Transfer,
        concluder: Concluder,
        publisher: Publisher | None = None,
    ) -> None:
        self.settings = settings
        self.records = records
        self.transfer = transfer
        self.concluder = concluder
        # Completion events (lib.publish); off unless ARCHIVE_EVENT_BUS names a bus.
        self.publisher = publisher or Publisher(None)

    def process(
        self,
        message: Message,
        *,
        owner: str,
        remaining_ms: Callable[[], int],
        publish_now: bool = True,
    ) -> Result:
        """`publish_now` False: the events are kept for `publish`, which the handler has
        run after its response (lib.platform.after_response)."""
        started = time.monotonic()
        ctx = Context(message, owner)
        try:
            verdict = self._attempt(ctx, remaining_ms)
        except Exception as error:  # noqa: BLE001 - the guard: every path ends in a verdict
            verdict = self._fault(error, ctx)
        try:
            result = self.concluder.conclude(verdict, ctx)
        except Exception as error:  # noqa: BLE001 - concluding failed: the last resort
            result = self._conclusion_failed(verdict, ctx, error)
        finally:
            logger.remove_keys(["record_id", "attempt"])
        self._collect()
        if publish_now:
            self.publish(remaining_ms())
        metrics.add_metric(
            name="ArchiveDuration",
            unit=MetricUnit.Milliseconds,
            value=round((time.monotonic() - started) * 1000, 1),
        )
        return result

    def _attempt(self, ctx: Context, remaining_ms: Callable[[], int]) -> Verdict:
        message = ctx.message
        try:
            ctx.record_id = parse_record_id(message.body)
        except MalformedMessage as error:
            return _malformed(message, str(error))
        logger.append_keys(record_id=str(ctx.record_id))
        too_late = schedule.too_late_to_start(remaining_ms())
        if too_late is not None:
            return too_late
        published = self.publisher.unrecorded()
        confirmations = self.transfer.original.originals.confirmations
        confirmed = confirmations.unrecorded()
        claim = self.records.claim(
            ctx.record_id,
            owner=ctx.owner,
            lock_ttl_seconds=self.settings.lock_ttl_seconds,
            max_attempts=self.settings.max_attempts,
            capture_while_paused=self.transfer.staging.enabled,
            message_id=message.message_id,
            receive_count=message.receive_count,
            queue_mark=message.queue_mark,
            published=published,
            confirmed=confirmed,
        )
        self.publisher.recorded(published)
        confirmations.recorded(confirmed, claim.confirmed)
        if claim.task is None:
            return schedule.not_claimed(claim.snapshot, message)
        ctx.task = claim.task
        logger.append_keys(attempt=claim.task.attempt)
        lane = claim.snapshot.lane or LaneState(now=datetime.now(UTC))
        ctx.events.start(lane.now)
        return self.transfer.run(claim.task, lane, message, remaining_ms(), ctx.events)

    def _collect(self) -> None:
        """The completion events this message's statements wrote, kept for `publish`."""
        try:
            self.publisher.collect(self.records.written.take())
        except Exception as error:  # noqa: BLE001 - the outbox keeps them for the sweeper
            log_unexpected("could not keep completion events", error)

    def publish(self, remaining_ms: int) -> None:
        """The events kept, published now: after the conclusion, never in its way
        (lib.publish.publisher); never raises."""
        try:
            self.publisher.publish(remaining_ms)
        except Exception as error:  # noqa: BLE001 - the outbox keeps them for the sweeper
            log_unexpected("could not publish completion events", error)

    def _fault(self, error: Exception, ctx: Context) -> Verdict:
        verdict = self._fault_verdict(error, ctx)
        if "InternalError" in verdict.metrics:
            log_unexpected("unexpected error while handling a message", error)
        return verdict

    def _fault_verdict(self, error: Exception, ctx: Context) -> Verdict:
        # A 42501 is worth a look at the catalog (only then): it names what to grant.
        denial = explain_denial(self.records.db, error) if is_permission_denied(error) else None
        return fault_verdict(
            error,
            claimed=ctx.task is not None,
            lock_ttl_seconds=self.settings.lock_ttl_seconds,
            denial=denial,
        )

    def _conclusion_failed(self, decided: Verdict, ctx: Context, error: Exception) -> Result:
        """A step of the conclusion raised: conclude as our fault instead (attempt given
        back), or, if even that cannot be written, leave it for a redelivery."""
        verdict = self._fault(error, ctx)
        if decided.outcome is Outcome.ARCHIVED and decided.copied is not None:
            # Stored on Lsky, not recorded. Unwritable (the database is gone): the row stays
            # RUNNING with may_be_hosted set (the claim did), and whoever takes it over
            # finds the image and adopts it. Our fault (a grant missing): given back alike.
            hosted = decided.copied.hosted
            stored = {"hosted_url": hosted.url, "hosted_key": str(hosted.data.get("key", ""))}
            verdict = replace(verdict, fields={**verdict.fields, **stored})
            if verdict.outcome is Outcome.UNCONCLUDED:
                what = "archived on Lsky, but the success could not be recorded"
                verdict = replace(verdict, detail=what, log=f"{what}; message will be redelivered")
        try:
            return self.concluder.conclude(verdict, ctx)
        except Exception as again:  # noqa: BLE001 - nothing can be written: SQS redelivers
            # Both failures named: the first is why the attempt could not be concluded (a
            # 42501 names the grant), the second why not even as our fault.
            log_unexpected(
                "could not conclude the attempt; SQS will redeliver it",
                again,
                error=verdict.fields.get("error", verdict.detail),
                conclusion_error=self._fault_verdict(again, ctx).detail,
            )
            self.concluder.delay(ctx.message, verdict.delay_seconds)
            for name in ("Unconcluded", *verdict.metrics):
                metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
            return Result(Outcome.UNCONCLUDED, ctx.record_id, type(again).__name__)


def _malformed(message: Message, reason: str) -> Verdict:
    return Verdict(
        Outcome.MALFORMED,
        reason,
        fields={
            "reason": reason,
            "message_id": message.message_id,
            # The producer's body: anything at all, so redacted before it is cut.
            "body_preview": outside_text(message.body, 200) if message.body else "",
        },
    )
