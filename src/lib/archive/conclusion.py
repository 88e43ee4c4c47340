"""One table from outcome to action, and the one function that carries it out.

For every Outcome: the statement it runs, what happens to the message, the metric, the
log line and whether the attempt counts. docs/explanation/attempt.md prints the table.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive import schedule, story
from lib.archive.archived import image_bytes, report_copy, report_recorded, stored_response
from lib.archive.outcome import Message, Outcome, Result, Verdict
from lib.archive.staging import Staging
from lib.platform.aws import error_code
from lib.platform.observability import logger, metrics
from lib.platform.sqs import Queue
from lib.state.claim import Task
from lib.state.events import EventLog
from lib.state.records import ArchiveRecords
from lib.state.status import WaitReason


class Write(enum.StrEnum):
    """The statement an outcome runs on the row (lib/sql/queries.sql)."""

    NONE = "-"
    SUCCEED = "succeed"
    RETRY = "retry"
    FAIL = "fail"
    RELEASE = "release"  # PENDING again, attempt given back, message kept
    PARK = "release (park)"  # PENDING, attempt given back, no message: the sweeper sends it


class Send(enum.StrEnum):
    """What happens to the message."""

    DELETE = "delete"
    HOLD = "visibility = delay"  # reported as a batch item failure: back after the delay
    DLQ = "to the DLQ, deleted"
    NOW = "visibility 0"


class Level(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Attempt(enum.StrEnum):
    SPENT = "spent"
    GIVEN_BACK = "given back"
    UNTOUCHED = "untouched"  # no attempt was claimed (or the claim already concluded it)


@dataclass(frozen=True)
class Rule:
    write: Write
    send: Send
    metric: str | None
    level: Level
    log: str
    attempt: Attempt


W, S, A = Write, Send, Attempt
INFO, WARNING, ERROR = Level.INFO, Level.WARNING, Level.ERROR
_REFUSED_HOLD = {Outcome.DUPLICATE: Outcome.DUPLICATE}  # a hold refused: parked, or a copy left

CONCLUSIONS: Mapping[Outcome, Rule] = {
    Outcome.ARCHIVED: Rule(W.SUCCEED, S.DELETE, "Archived", INFO, "archive succeeded", A.SPENT),
    Outcome.RETRY: Rule(
        W.RETRY, S.HOLD, "Retried", WARNING, "archive attempt failed, will retry", A.SPENT
    ),
    Outcome.FAILED: Rule(W.FAIL, S.DELETE, "Failed", ERROR, "archive failed", A.SPENT),
    Outcome.DUPLICATE: Rule(W.NONE, S.DELETE, "Duplicate", INFO, "message skipped", A.UNTOUCHED),
    Outcome.EARLY: Rule(
        W.NONE, S.HOLD, None, INFO, "message arrived before the row is due; held back", A.UNTOUCHED
    ),
    Outcome.PAUSED: Rule(
        W.RELEASE, S.HOLD, "LaneHeld", INFO, "upload lane paused; message held", A.GIVEN_BACK
    ),
    Outcome.PARKED: Rule(
        W.PARK,
        S.DELETE,
        "LaneParked",
        INFO,
        "upload lane paused; record parked, the sweeper sends it when due",
        A.GIVEN_BACK,
    ),
    Outcome.RELEASED: Rule(
        W.RELEASE,
        S.HOLD,
        "Released",
        WARNING,
        "not enough time left for an attempt; given back",
        A.GIVEN_BACK,
    ),
    Outcome.OWN_FAULT: Rule(
        W.RELEASE,
        S.HOLD,
        "Unconcluded",
        ERROR,
        "archive stopped by our own fault; attempt given back, message will be redelivered",
        A.GIVEN_BACK,
    ),
    Outcome.UNCONCLUDED: Rule(
        W.NONE,
        S.HOLD,
        "Unconcluded",
        ERROR,
        "attempt not concluded; message will be redelivered",
        A.UNTOUCHED,
    ),
    Outcome.LOST_LOCK: Rule(
        W.NONE,
        S.DELETE,
        "LostLock",
        WARNING,
        "the lock had passed on; our write was not recorded",
        A.UNTOUCHED,
    ),
    Outcome.MALFORMED: Rule(W.NONE, S.DLQ, "Malformed", ERROR, "malformed message", A.UNTOUCHED),
    Outcome.MALFORMED_LEFT: Rule(
        W.NONE,
        S.NOW,
        "Malformed",
        ERROR,
        "malformed message; not sent to the DLQ, left to the redrive policy",
        A.UNTOUCHED,
    ),
}


@dataclass
class Context:
    """The message being concluded, and the row's claim when this attempt won one."""

    message: Message
    owner: str
    record_id: int | None = None
    task: Task | None = None
    received_at: float = field(default_factory=time.monotonic)  # the invocation's start
    # The attempt's story, kept in memory until the statement that concludes it.
    events: EventLog = field(default_factory=EventLog)


class Concluder:
    """Carries out CONCLUSIONS: the only code that writes an attempt's result."""

    def __init__(
        self,
        *,
        records: ArchiveRecords,
        queue: Queue,
        staging: Staging,
        dlq_url: str | None,
    ) -> None:
        self.records = records
        self.queue = queue
        self.staging = staging
        self.dlq_url = dlq_url

    def conclude(self, verdict: Verdict, ctx: Context) -> Result:
        rule = CONCLUSIONS[verdict.outcome]
        staged = verdict.staged
        if not self._write(rule.write, verdict, ctx):
            write = "release" if rule.write is Write.PARK else str(rule.write)
            verdict = Verdict(
                Outcome.LOST_LOCK,
                f"{write} not recorded: lock passed on",
                fields={"error": verdict.detail},
                metrics=verdict.metrics,  # what led here still counts (InternalError...)
                log=f"the lock had passed on; the {write} was not recorded",
            )
            self.staging.discard(None if staged is None else staged.key)
            rule = CONCLUSIONS[Outcome.LOST_LOCK]
        if rule.send is Send.DLQ and not self._to_dlq(ctx.message, verdict.detail):
            verdict = replace(verdict, outcome=Outcome.MALFORMED_LEFT)
            rule = CONCLUSIONS[Outcome.MALFORMED_LEFT]
        if rule.send is Send.HOLD:
            seconds = min(verdict.delay_seconds, schedule.max_hold_seconds(ctx.received_at))
            if not self.delay(ctx.message, seconds):
                verdict = schedule.copy_left(verdict) or self._parked_instead(verdict, ctx)
                rule = CONCLUSIONS[_REFUSED_HOLD.get(verdict.outcome, Outcome.PARKED)]
        elif rule.send is Send.NOW:
            self.delay(ctx.message, 0)
        self._report(rule, verdict, ctx)
        return Result(verdict.outcome, ctx.record_id, verdict.detail)

    # -- the statement -----------------------------------------------------------------

    def _write(self, write: Write, verdict: Verdict, ctx: Context) -> bool:
        """Run the outcome's statement (it writes the attempt's events); False: lock lost."""
        written = self._run_write(write, verdict, ctx)
        if write is not Write.NONE:
            ctx.events.written()
        return written

    def _run_write(self, write: Write, verdict: Verdict, ctx: Context) -> bool:
        task = ctx.task
        if write is Write.NONE:
            return True
        if task is None:
            # Nothing was claimed: the row is written only to say where its message is while
            # it waits (the claim met a pause, or the invocation had no time): parked, none
            # out; or held, back at the row's due time, which the sweeper's lost-message rule
            # reads as the message's return to the queue.
            if write in (Write.PARK, Write.RELEASE) and ctx.record_id is not None:
                self.records.park(
                    ctx.record_id,
                    delay_seconds=verdict.delay_seconds,
                    wait_reason=verdict.wait_reason,
                    detail=story.verdict_detail(verdict),
                    held=write is Write.RELEASE,
                )
            return True
        if write is Write.SUCCEED:
            return self._succeed(verdict, ctx, task)
        if write is Write.RETRY:
            return self.records.retry(
                task,
                owner=ctx.owner,
                error=verdict.detail,
                delay_seconds=verdict.delay_seconds,
                may_be_hosted=_known(verdict.may_be_hosted),
                staged=verdict.staged,
                sent=verdict.sent,
                counted=verdict.counted,
                events=ctx.events.pending(),
                detail=story.verdict_detail(verdict),
            )
        if write is Write.FAIL:
            return self._fail(verdict, ctx, task)
        return self.records.release(
            task,
            owner=ctx.owner,
            delay_seconds=verdict.delay_seconds,
            # Waiting for time or for a slot is nothing gone wrong: the last error stays.
            error=None if verdict.wait_reason in _NOT_ERRORS else verdict.detail,
            park=write is Write.PARK,
            wait_reason=verdict.wait_reason or _GIVEN_BACK_REASONS[verdict.outcome],
            may_be_hosted=verdict.may_be_hosted,
            staged=verdict.staged,
            forget_staged=verdict.forget_staged,
            sent=verdict.sent,
            counted=verdict.counted,
            # Only a held message comes back for its booked slot; a parked row queues afresh.
            keep_booking=verdict.keeps_booking and write is Write.RELEASE,
            events=ctx.events.pending(),
            detail=story.verdict_detail(verdict),
        )

    def _succeed(self, verdict: Verdict, ctx: Context, task: Task) -> bool:
        copied = verdict.copied
        if copied is None:
            raise AssertionError("an ARCHIVED verdict carries the copy")  # pragma: no cover
        recorded = self.records.succeed(
            task,
            owner=ctx.owner,
            hosted_url=copied.hosted.url,
            mime_type=copied.hosted.mime_type,
            response=stored_response(copied),
            altered=None if copied.fidelity is None else copied.fidelity.altered,
            original=copied.original,  # recorded in the same statement
            # An adoption took no slot and is no upload: it stays out of the ledger.
            log_upload=not copied.adopted,
            events=ctx.events.pending(),
            detail=story.archived_detail(copied),
            size=image_bytes(copied),
        )
        # Published (or the row concluded meanwhile): the staged copy has done its job.
        self.staging.discard(task.staged_key)
        report_recorded(copied, recorded, task.restore)
        return True

    def _fail(self, verdict: Verdict, ctx: Context, task: Task) -> bool:
        staged = verdict.staged
        keep = verdict.keep_staged and (staged is not None or task.staged_key is not None)
        written = self.records.fail(
            task,
            owner=ctx.owner,
            error=verdict.detail,
            may_be_hosted=_known(verdict.may_be_hosted),
            keep_staged=keep,
            staged=staged,
            sent=verdict.sent,
            counted=verdict.counted,
            events=ctx.events.pending(),
            detail=story.verdict_detail(verdict),
        )
        if written and not keep:
            self.staging.discard(None if staged is None else staged.key)
            self.staging.discard(task.staged_key)
        return written

    # -- the message -------------------------------------------------------------------

    def delay(self, message: Message, seconds: int) -> bool:
        """Set the message's visibility; False (logged, counted) when SQS refused it while
        the message is still ours to hold. A receipt SQS no longer knows (the message was
        deleted, or its visibility ran out and it went back) has nothing left to change."""
        try:
            self.queue.change_visibility(message.queue_arn, message.receipt_handle, seconds)
        except Exception as error:  # noqa: BLE001 - said and counted; the caller decides
            code = error_code(error)
            logger.warning(
                "could not change message visibility",
                error=type(error).__name__,
                code=code,
                visibility_seconds=seconds,
            )
            metrics.add_metric(name="VisibilityRefused", unit=MetricUnit.Count, value=1)
            return code in _RECEIPT_GONE
        return True

    def _parked_instead(self, verdict: Verdict, ctx: Context) -> Verdict:
        """SQS refused the hold: the message would come back when it pleases. The row is
        parked at its due time instead (the sweeper sends it then) and the message is
        acknowledged, so the row's due time is what happens. Without a row to park (the
        database is down) the message stays, and the lock rule covers the row."""
        if ctx.record_id is None or verdict.outcome is Outcome.UNCONCLUDED:
            return verdict
        if not self.records.park(
            ctx.record_id,
            delay_seconds=verdict.delay_seconds,
            wait_reason=None,
            detail={"visibility_refused": True},
        ):
            return verdict
        log = "message visibility refused; record parked, the sweeper sends it when due"
        return replace(verdict, outcome=Outcome.PARKED, log=log)

    def _to_dlq(self, message: Message, reason: str) -> bool:
        if not self.dlq_url:
            return False
        try:
            self.queue.send(
                self.dlq_url,
                message.body,
                {"archive-error": reason, "source-message-id": message.message_id},
            )
        except Exception as error:  # noqa: BLE001 - fall back to the redrive policy
            logger.warning("could not send to the DLQ", error=type(error).__name__)
            return False
        return True

    # -- the log line and the metrics ----------------------------------------------------

    def _report(self, rule: Rule, verdict: Verdict, ctx: Context) -> None:
        fields: dict[str, Any] = {"outcome": str(verdict.outcome), **verdict.fields}
        if rule.send is Send.HOLD:
            fields["retry_in_seconds"] = verdict.delay_seconds
        if verdict.outcome in (Outcome.UNCONCLUDED, Outcome.OWN_FAULT):
            # After maxReceiveCount receives the redrive policy parks it in the DLQ.
            fields["receive_count"] = ctx.message.receive_count
        if verdict.copied is not None:
            report_copy(verdict.copied)
        getattr(logger, rule.level)(verdict.log or rule.log, **fields)
        for name in (rule.metric, *verdict.metrics):
            if name is not None:
                metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
        if verdict.copied is not None and not verdict.copied.adopted:
            metrics.add_metric(name="ImageBytes", unit=MetricUnit.Bytes, value=verdict.copied.size)


# SQS codes for a receipt that names no message in flight (deleted, back in the queue,
# or a queue that is not there): nothing left to hold, so nothing to park for.
_RECEIPT_GONE = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "InvalidReceiptHandle",
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    }
)

_NOT_ERRORS = frozenset({WaitReason.NO_TIME, WaitReason.PACED})

# Why a row given back (RELEASE, PARK) waits, when the verdict does not say.
_GIVEN_BACK_REASONS: Mapping[Outcome, WaitReason] = {
    Outcome.RELEASED: WaitReason.NO_TIME,
    Outcome.OWN_FAULT: WaitReason.OWN_FAULT,
    Outcome.PAUSED: WaitReason.PAUSED,
    Outcome.PARKED: WaitReason.PAUSED,
}


def _known(may_be_hosted: bool | None) -> bool:
    # A retry or failure that cannot tell records the safe answer: the next attempt looks.
    return True if may_be_hosted is None else may_be_hosted
