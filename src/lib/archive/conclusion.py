"""One table from outcome to action, and the one function that carries it out.

For every Outcome: the statement it runs, what happens to the message, the metric, the
log line and whether the attempt counts. docs/archive.md prints the table.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.fidelity import note
from lib.archive.outcome import Copied, Message, Outcome, Result, Verdict
from lib.archive.reconcile import RESPONSE_KEY
from lib.archive.staging import Staging
from lib.platform.observability import logger, metrics
from lib.platform.sqs import Queue
from lib.state.claim import Task
from lib.state.records import ArchiveRecords, Recorded


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


class Concluder:
    """Carries out CONCLUSIONS: the only code that writes an attempt's result."""

    def __init__(
        self,
        *,
        records: ArchiveRecords,
        queue: Queue,
        staging: Staging,
        dlq_url: str | None,
        log_uploads: bool,
    ) -> None:
        """log_uploads: the success write logs the upload (pacing logs it at its slot)."""
        self.records = records
        self.queue = queue
        self.staging = staging
        self.dlq_url = dlq_url
        self.log_uploads = log_uploads

    def conclude(self, verdict: Verdict, ctx: Context) -> Result:
        rule = CONCLUSIONS[verdict.outcome]
        if not self._write(rule.write, verdict, ctx):
            write = "release" if rule.write is Write.PARK else str(rule.write)
            verdict = Verdict(
                Outcome.LOST_LOCK,
                f"{write} not recorded: lock passed on",
                fields={"error": verdict.detail},
                log=f"the lock had passed on; the {write} was not recorded",
            )
            self.staging.discard(verdict.staged_key)
            rule = CONCLUSIONS[Outcome.LOST_LOCK]
        if rule.send is Send.DLQ and not self._to_dlq(ctx.message, verdict.detail):
            verdict = replace(verdict, outcome=Outcome.MALFORMED_LEFT)
            rule = CONCLUSIONS[Outcome.MALFORMED_LEFT]
        if rule.send is Send.HOLD:
            self.delay(ctx.message, verdict.delay_seconds)
        elif rule.send is Send.NOW:
            self.delay(ctx.message, 0)
        self._report(rule, verdict, ctx)
        return Result(verdict.outcome, ctx.record_id, verdict.detail)

    # -- the statement -----------------------------------------------------------------

    def _write(self, write: Write, verdict: Verdict, ctx: Context) -> bool:
        """Run the outcome's statement; False when the row's lock had passed on."""
        task = ctx.task
        if write is Write.NONE:
            return True
        if task is None:
            # Nothing was claimed: only a park has a row to write (the claim met a pause).
            if write is Write.PARK and ctx.record_id is not None:
                self.records.park(ctx.record_id, delay_seconds=verdict.delay_seconds)
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
                staged_key=verdict.staged_key,
            )
        if write is Write.FAIL:
            return self._fail(verdict, ctx, task)
        return self.records.release(
            task,
            owner=ctx.owner,
            delay_seconds=verdict.delay_seconds,
            error=verdict.detail if verdict.outcome is not Outcome.RELEASED else None,
            park=write is Write.PARK,
            may_be_hosted=verdict.may_be_hosted,
            staged_key=verdict.staged_key,
        )

    def _succeed(self, verdict: Verdict, ctx: Context, task: Task) -> bool:
        copied = verdict.copied
        if copied is None:
            raise AssertionError("an ARCHIVED verdict carries the copy")  # pragma: no cover
        fidelity = copied.fidelity
        recorded = self.records.succeed(
            task,
            owner=ctx.owner,
            hosted_url=copied.hosted.url,
            mime_type=copied.hosted.mime_type,
            response=stored_response(copied),
            altered=None if fidelity is None else fidelity.altered,
            log_upload=self.log_uploads and not copied.adopted,
        )
        # Published (or the row concluded meanwhile): the staged copy has done its job.
        self.staging.discard(task.staged_key)
        if recorded is not Recorded.UNDER_LOCK:
            _RECORDED_WARNINGS[recorded](copied)
        return True

    def _fail(self, verdict: Verdict, ctx: Context, task: Task) -> bool:
        keep = verdict.keep_staged and (verdict.staged_key or task.staged_key) is not None
        written = self.records.fail(
            task,
            owner=ctx.owner,
            error=verdict.detail,
            may_be_hosted=_known(verdict.may_be_hosted),
            keep_staged=keep,
            staged_key=verdict.staged_key,
        )
        if written and not keep:
            self.staging.discard(verdict.staged_key)
            self.staging.discard(task.staged_key)
        return written

    # -- the message -------------------------------------------------------------------

    def delay(self, message: Message, seconds: int) -> None:
        try:
            self.queue.change_visibility(message.queue_arn, message.receipt_handle, seconds)
        except Exception as error:  # noqa: BLE001 - the queue's own visibility timeout still applies
            logger.warning("could not change message visibility", error=type(error).__name__)

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


def _known(may_be_hosted: bool | None) -> bool:
    # A retry or failure that cannot tell records the safe answer: the next attempt looks.
    return True if may_be_hosted is None else may_be_hosted


def stored_response(copied: Copied) -> dict[str, Any]:
    """Lsky's `data`, with our note on how the row got it under a key of ours."""
    fidelity = copied.fidelity
    if copied.sent is None or fidelity is None:  # adopted: nothing was sent to compare
        return {**copied.hosted.data, RESPONSE_KEY: {"adopted": True}}
    return {**copied.hosted.data, RESPONSE_KEY: note(copied.sent, fidelity)}


def report_copy(copied: Copied) -> None:
    """The warnings and counts a successful copy may deserve besides ARCHIVED's own."""
    fidelity, sent, data = copied.fidelity, copied.sent, copied.hosted.data
    if fidelity is not None and sent is not None and fidelity.altered:
        # Re-encoded (group image quality below 100, a save format) or watermarked.
        logger.warning(
            "archived, but Lsky stored other bytes than the generated image",
            differs=list(fidelity.differs),
            sent_bytes=sent.size,
            sent_md5=sent.md5,
            hosted_md5=str(data.get("md5", "")),
            hosted_size_kb=data.get("size"),
        )
        metrics.add_metric(name="ArchivedAltered", unit=MetricUnit.Count, value=1)
    elif fidelity is not None and fidelity.altered is None:
        logger.warning("Lsky's answer has no md5, sha1 or size: the bytes were not compared")
    if copied.adopted:
        logger.info(
            "an earlier attempt had stored the image; adopted it instead of uploading",
            hosted_key=str(data.get("key", "")),
        )
        metrics.add_metric(name="Reconciled", unit=MetricUnit.Count, value=1)
    if copied.duplicates:
        # Stored before this look-up existed, or by hand: left for an operator.
        logger.warning(
            "the host holds more than one image for this record",
            hosted_key=str(data.get("key", "")),
            duplicate_keys=list(copied.duplicates[:10]),
        )


_RECORDED_WARNINGS: Mapping[Recorded, Callable[[Copied], None]] = {
    Recorded.ALREADY_OTHER: lambda _: logger.warning(
        "archived, but another attempt had already archived the record"
    ),
    Recorded.AFTER_LOCK_PASSED: lambda _: logger.warning(
        "archived after the lock had passed on; recorded anyway"
    ),
    Recorded.ROW_GONE: lambda copied: logger.warning(
        "archived, but the record no longer exists", hosted_url=copied.hosted.url
    ),
    Recorded.ALREADY_THIS: lambda _: None,
}


def hold_seconds(seconds: float) -> int:
    """A visibility in whole seconds, never below one (a zero would spin the message)."""
    return max(1, math.ceil(seconds))
