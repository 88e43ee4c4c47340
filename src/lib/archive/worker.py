"""One queue message, start to finish: parse, claim, copy, record.

Every path ends in one Outcome; `Outcome.redelivers` says whether SQS delivers the
message again (after the visibility set here) or it is acknowledged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pg8000.exceptions
from aws_lambda_powertools.metrics import MetricUnit

from lib.archive import retry as policy
from lib.archive.copier import Copied, Copier, can_start
from lib.archive.fidelity import note
from lib.archive.lane import (
    HostCondition,
    host_condition,
    jitter,
    pause_until,
)
from lib.archive.message import MalformedMessage, parse_record_id
from lib.archive.outcome import Message, Outcome, Result
from lib.archive.pacing import db_now, reserve_upload
from lib.archive.reconcile import RESPONSE_KEY
from lib.archive.staging import keeps_copy, worth_staging
from lib.platform.config import FINISH_RESERVE_MS, Settings
from lib.platform.db import describe
from lib.platform.errors import ConfigError, DatabaseUnavailable
from lib.platform.observability import log_unexpected, logger, metrics
from lib.platform.redact import outside_text
from lib.platform.s3 import StagedCopyMissing, StagingError
from lib.platform.sqs import MAX_VISIBILITY_SECONDS, Queue
from lib.state.claim import ClaimSnapshot, Task, blocked_by_lane, early_delay, skip_reason
from lib.state.lane import LaneState, PauseReason
from lib.state.records import ArchiveRecords, Recorded
from lib.transfer.failures import ArchiveFailure, Failure
from lib.transfer.imagetype import DownloadedImage

# An attempt needs at least this much of the invocation left to be worth starting;
# with less, the row is given back without spending an attempt.
MIN_ATTEMPT_MS = 25_000
# How soon a message comes back after the invocation ran out of time.
NO_TIME_RETRY_SECONDS = 5
# A paused lane holds a message (its visibility) for pauses up to this long; longer ones,
# or a message received this often already, park the row instead, so that a long pause
# costs no receives (each one counts towards maxReceiveCount).
HOLD_LIMIT_SECONDS = 900
HOLD_LIMIT_RECEIVES = 3
# How soon a message comes back after our own fault (configuration, a bug): soon enough
# that a fix applies within minutes, slow enough not to spin.
OWN_FAULT_RETRY_SECONDS = 300
# Text from outside in a log line (a host's answer, a message body), once redacted.
LOGGED_DETAIL_LIMIT = 200


class ArchiveWorker:
    def __init__(
        self,
        *,
        settings: Settings,
        records: ArchiveRecords,
        copier: Copier,
        queue: Queue,
    ) -> None:
        self.settings = settings
        self.records = records
        self.copier = copier
        self.queue = queue

    def process(self, message: Message, *, owner: str, remaining_ms: Callable[[], int]) -> Result:
        started = time.monotonic()
        try:
            record_id = parse_record_id(message.body)
        except MalformedMessage as error:
            return self._malformed(message, str(error))
        logger.append_keys(record_id=str(record_id))
        try:
            result = self._archive(message, record_id, owner=owner, remaining_ms=remaining_ms)
        except DatabaseUnavailable as error:
            result = self._unconcluded(message, record_id, "database unavailable", str(error))
        except pg8000.exceptions.DatabaseError as error:
            # The server refused a statement (e.g. the migration was not applied): nothing
            # was concluded, and the SQLSTATE says why without quoting parameters.
            result = self._unconcluded(message, record_id, "database error", describe(error))
        except ConfigError as error:
            # E.g. an unusable database secret: the message names the setting, not the value.
            metrics.add_metric(name="ConfigError", unit=MetricUnit.Count, value=1)
            result = self._unconcluded(message, record_id, "configuration error", str(error))
        except Exception as error:  # noqa: BLE001 - never let a message fail without a log line
            log_unexpected("unexpected error while handling a message", error)
            result = self._unconcluded(message, record_id, "internal error", type(error).__name__)
        finally:
            logger.remove_keys(["record_id", "attempt"])
        metrics.add_metric(
            name="ArchiveDuration",
            unit=MetricUnit.Milliseconds,
            value=round((time.monotonic() - started) * 1000, 1),
        )
        return result

    def _archive(
        self, message: Message, record_id: int, *, owner: str, remaining_ms: Callable[[], int]
    ) -> Result:
        if remaining_ms() < MIN_ATTEMPT_MS:
            # Too late in the invocation to finish a transfer: don't even claim.
            self._delay(message, NO_TIME_RETRY_SECONDS)
            logger.warning("not enough time left to start; redelivering", outcome=Outcome.RELEASED)
            return Result(Outcome.RELEASED, record_id, "not enough time left")
        claim = self.records.claim(
            record_id,
            owner=owner,
            lock_ttl_seconds=self.settings.lock_ttl_seconds,
            max_attempts=self.settings.max_attempts,
            capture_while_paused=self.copier.staging is not None,
        )
        claimed_at = time.monotonic()
        task = claim.task
        if task is None:
            return self._skip(message, record_id, claim.snapshot)
        lane = claim.snapshot.lane or LaneState(now=datetime.now(UTC))
        logger.append_keys(attempt=task.attempt)

        deadline = time.monotonic() + (remaining_ms() - FINISH_RESERVE_MS) / 1000
        if not can_start(deadline):
            # Checked before anything is fetched: the only time an attempt is given back.
            return self._release(message, task, owner)
        if lane.paused:
            # Only a staging claim takes a row while the lane is paused: capture it now.
            return self._capture_while_paused(message, task, owner, lane, deadline)
        if self.settings.rate_limits:
            closed_until = reserve_upload(
                self.records, self.settings.rate_limits, lane, claimed_at, deadline
            )
            if closed_until is not None:
                pacing = HostCondition(PauseReason.PACING, "pacing: LSKY_RATE_LIMITS")
                try:
                    staged = self._capture(task, deadline, "pacing")
                except ArchiveFailure as error:
                    return self._failed_attempt(message, task, owner, error.failure)
                return self._lane_paused(
                    message,
                    task,
                    owner,
                    pacing,
                    until=closed_until,
                    now=db_now(lane, claimed_at),
                    staged_key=staged,
                )
        logger.info("archive started", max_attempts=self.settings.max_attempts)
        rescue = _Rescue(self, task, deadline)
        try:
            copied = self._copy(task, deadline, rescue)
        except ArchiveFailure as error:
            staged = rescue.after(error.failure)
            condition = host_condition(error.failure)
            if condition is not None:
                now = db_now(lane, claimed_at)
                until = pause_until(condition, now=now, upload_times=lane.upload_times)
                self.records.pause_lane(
                    until=until or "infinity",
                    reason=condition.reason,
                    window=condition.window,
                    detail=condition.detail,  # redacted and bounded on its way in
                )
                return self._lane_paused(
                    message,
                    task,
                    owner,
                    condition,
                    until=until,
                    now=now,
                    may_be_hosted=error.failure.may_be_hosted,
                    staged_key=staged,
                )
            return self._failed_attempt(message, task, owner, error.failure, staged_key=staged)
        except StagingError as error:
            # The staged copy (the only one once the URL expired) could not be read: S3's
            # fault or ours, never the record's. No attempt is spent; it comes back.
            metrics.add_metric(name="StagingError", unit=MetricUnit.Count, value=1)
            return self._own_fault(message, task, owner, f"staging error: {error}")
        except ConfigError as error:
            # A bad secret value, fetched lazily: the setting's fault, not the record's.
            metrics.add_metric(name="ConfigError", unit=MetricUnit.Count, value=1)
            return self._own_fault(message, task, owner, f"configuration error: {error}")
        except Exception as error:  # noqa: BLE001 - a bug is ours: no attempt is spent on it
            log_unexpected("unexpected error during archive", error)
            metrics.add_metric(name="InternalError", unit=MetricUnit.Count, value=1)
            return self._own_fault(message, task, owner, f"internal error ({type(error).__name__})")
        return self._succeeded(message, task, owner, copied)

    def _succeeded(self, message: Message, task: Task, owner: str, copied: Copied) -> Result:
        hosted = copied.hosted
        fidelity = copied.fidelity
        try:
            recorded = self.records.succeed(
                task,
                owner=owner,
                hosted_url=hosted.url,
                mime_type=hosted.mime_type,
                response=self._stored_response(copied),
                altered=None if fidelity is None else fidelity.altered,
                # With pacing, the reservation already logged this upload.
                log_upload=not self.settings.rate_limits,
            )
        except (DatabaseUnavailable, pg8000.exceptions.DatabaseError) as error:
            # Stored on Lsky, not recorded: the row stays RUNNING with archive_may_be_hosted
            # set, so the attempt that takes it over finds the image and adopts it.
            detail = error if isinstance(error, DatabaseUnavailable) else describe(error)
            return self._unconcluded(
                message,
                task.record_id,
                "archived on Lsky, but the success could not be recorded",
                str(detail),
                hosted_url=hosted.url,
                hosted_key=str(hosted.data.get("key", "")),
            )
        if task.staged_key is not None:
            # Published (or the row concluded meanwhile): the staged copy has done its job.
            self._discard(task.staged_key)
        if recorded is Recorded.ALREADY_OTHER:
            logger.warning("archived, but another attempt had already archived the record")
        elif recorded is Recorded.AFTER_LOCK_PASSED:
            logger.warning("archived after the lock had passed on; recorded anyway")
        elif recorded is Recorded.ROW_GONE:
            logger.warning("archived, but the record no longer exists", hosted_url=hosted.url)
        self._report_copy(copied)
        logger.info(
            "archive succeeded",
            outcome=Outcome.ARCHIVED,
            recorded=str(recorded),
            bytes=copied.size,
            mime_type=hosted.mime_type,
        )
        metrics.add_metric(name="Archived", unit=MetricUnit.Count, value=1)
        if not copied.adopted:
            metrics.add_metric(name="ImageBytes", unit=MetricUnit.Bytes, value=copied.size)
        return Result(Outcome.ARCHIVED, task.record_id, hosted.url)

    @staticmethod
    def _stored_response(copied: Copied) -> dict[str, Any]:
        """Lsky's `data`, with our note on how the row got it under a key of ours."""
        fidelity = copied.fidelity
        if copied.sent is None or fidelity is None:  # adopted: nothing was sent to compare
            return {**copied.hosted.data, RESPONSE_KEY: {"adopted": True}}
        return {**copied.hosted.data, RESPONSE_KEY: note(copied.sent, fidelity)}

    @staticmethod
    def _report_copy(copied: Copied) -> None:
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
                hosted_key=str(copied.hosted.data.get("key", "")),
            )
            metrics.add_metric(name="Reconciled", unit=MetricUnit.Count, value=1)
        if copied.duplicates:
            # Stored before this look-up existed, or by hand: left for an operator.
            logger.warning(
                "the host holds more than one image for this record",
                hosted_key=str(copied.hosted.data.get("key", "")),
                duplicate_keys=list(copied.duplicates[:10]),
            )

    def _skip(self, message: Message, record_id: int, snapshot: ClaimSnapshot) -> Result:
        """The claim did not win: a copy that came early is held back, anything else is
        a duplicate or a stray and is acknowledged."""
        hold = early_delay(snapshot)
        if hold is not None:
            self._delay(message, hold)
            logger.info(
                "message arrived before the row is due; held back",
                outcome=Outcome.EARLY,
                retry_in_seconds=hold,
            )
            return Result(Outcome.EARLY, record_id, f"due in {hold} s")
        if blocked_by_lane(snapshot) and snapshot.lane is not None:
            return self._wait_for_lane(message, record_id, snapshot.lane)
        reason = skip_reason(snapshot)
        if snapshot.exhausted:
            # The claim itself concluded the row: a failure, not a duplicate.
            logger.warning("archive failed", outcome=Outcome.FAILED, error=reason)
            metrics.add_metric(name="Failed", unit=MetricUnit.Count, value=1)
            return Result(Outcome.FAILED, record_id, reason)
        logger.info("message skipped", outcome=Outcome.DUPLICATE, reason=reason)
        metrics.add_metric(name="Duplicate", unit=MetricUnit.Count, value=1)
        return Result(Outcome.DUPLICATE, record_id, reason)

    def _lane_paused(
        self,
        message: Message,
        task: Task,
        owner: str,
        condition: HostCondition,
        *,
        until: datetime | None,
        now: datetime,
        may_be_hosted: bool | None = None,
        staged_key: str | None = None,
    ) -> Result:
        """The host (or our pacing) closed the lane: the record pays nothing. Its attempt
        is given back (with the copy staged meanwhile), and its message held until the
        lane opens, or parked."""
        # `now` from after any pacing sleep, so the hold ends with the pause, not later.
        seconds = (until - now).total_seconds() if until is not None else math.inf
        park = seconds > HOLD_LIMIT_SECONDS or message.receive_count >= HOLD_LIMIT_RECEIVES
        delay = 0 if until is None else max(1, math.ceil(seconds))
        summary = f"lane paused ({condition.reason}): {condition.detail}"[:300]
        if not self.records.release(
            task,
            owner=owner,
            delay_seconds=delay,
            error=summary,
            park=park,
            # A refusal stored nothing: the next attempt needs no look-up.
            may_be_hosted=may_be_hosted,
            staged_key=staged_key,
        ):
            self._discard(staged_key)
            return self._lost_lock(task, "release", summary)
        if condition.reason is PauseReason.ACCOUNT:
            metrics.add_metric(name="AccountProblem", unit=MetricUnit.Count, value=1)
        elif condition.reason is not PauseReason.PACING:
            metrics.add_metric(name="RateLimited", unit=MetricUnit.Count, value=1)
        logger.warning(
            "upload lane paused; attempt given back",
            reason=str(condition.reason),
            window=condition.window,
            detail=outside_text(condition.detail, LOGGED_DETAIL_LIMIT),
            paused_until=until.isoformat() if until is not None else "until cleared",
        )
        return self._hold_or_park(message, task.record_id, seconds, park=park)

    def _wait_for_lane(self, message: Message, record_id: int, lane: LaneState) -> Result:
        """The claim met a paused lane: wait for it without touching the attempts."""
        seconds = lane.paused_for_seconds
        park = seconds > HOLD_LIMIT_SECONDS or message.receive_count >= HOLD_LIMIT_RECEIVES
        if park:
            due = lane.now + timedelta(seconds=seconds if math.isfinite(seconds) else 0)
            self.records.park(record_id, due=due)
        return self._hold_or_park(message, record_id, seconds, park=park)

    def _hold_or_park(
        self, message: Message, record_id: int, seconds: float, *, park: bool
    ) -> Result:
        if park:
            logger.info(
                "upload lane paused; record parked, the sweeper sends it when due",
                outcome=Outcome.PARKED,
                paused_for_seconds=None if math.isinf(seconds) else round(seconds),
            )
            metrics.add_metric(name="LaneParked", unit=MetricUnit.Count, value=1)
            return Result(Outcome.PARKED, record_id, "parked while the lane is paused")
        hold = min(math.ceil(seconds + jitter(seconds)), MAX_VISIBILITY_SECONDS)
        self._delay(message, hold)
        logger.info(
            "upload lane paused; message held", outcome=Outcome.PAUSED, retry_in_seconds=hold
        )
        metrics.add_metric(name="LaneHeld", unit=MetricUnit.Count, value=1)
        return Result(Outcome.PAUSED, record_id, f"lane paused, back in {hold} s")

    def _failed_attempt(
        self,
        message: Message,
        task: Task,
        owner: str,
        failure: Failure,
        *,
        staged_key: str | None = None,
    ) -> Result:
        """staged_key: a copy staged during this attempt; the row records it, or drops it
        (and the row's own copy) when it fails for good."""
        settings = self.settings
        decision = policy.decide(
            failure,
            attempt=task.attempt,
            max_attempts=settings.max_attempts,
            delays=settings.retry_delays,
        )
        error = policy.error_summary(
            failure, attempt=task.attempt, max_attempts=settings.max_attempts
        )
        if decision.action is policy.Action.FAIL:
            keep = keeps_copy(failure) and (staged_key or task.staged_key) is not None
            if not self.records.fail(
                task,
                owner=owner,
                error=error,
                may_be_hosted=failure.may_be_hosted,
                keep_staged=keep,
                staged_key=staged_key,
            ):
                self._discard(staged_key)
                return self._lost_lock(task, "fail", error)
            if not keep:
                self._discard(staged_key)
                self._discard(task.staged_key)
            logger.error(
                "archive failed",
                outcome=Outcome.FAILED,
                error_class=decision.error_class,
                error=error,
            )
            metrics.add_metric(name="Failed", unit=MetricUnit.Count, value=1)
            return Result(Outcome.FAILED, task.record_id, error)
        delay = decision.delay_seconds
        if not self.records.retry(
            task,
            owner=owner,
            error=error,
            delay_seconds=delay,
            may_be_hosted=failure.may_be_hosted,
            staged_key=staged_key,
        ):
            self._discard(staged_key)
            return self._lost_lock(task, "retry", error)
        self._delay(message, delay)
        logger.warning(
            "archive attempt failed, will retry",
            outcome=Outcome.RETRY,
            error_class=decision.error_class,
            error=error,
            retry_in_seconds=delay,
        )
        metrics.add_metric(name="Retried", unit=MetricUnit.Count, value=1)
        return Result(Outcome.RETRY, task.record_id, error)

    # -- staging (lib.archive.staging): capture now, publish later ------------------------

    def _copy(self, task: Task, deadline: float, rescue: _Rescue) -> Copied:
        """From the row's staged copy when it has one, else from the source URL."""
        if task.staged_key is not None:
            if self.copier.staging is None:
                logger.warning("the row has a staged copy but staging is off; using the source")
            else:
                try:
                    return self.copier.copy_staged(task, deadline)
                except StagedCopyMissing as error:
                    # Expired by the lifecycle rule, or deleted: the source may still work.
                    logger.warning("staged copy missing; using the source", error=str(error))
                    rescue.restage = True
        return self.copier.copy(task, deadline, on_spool_failed=rescue.spool_failed)

    def _capture(self, task: Task, deadline: float, why: str) -> str | None:
        """Download the image into the staging bucket; its key, or None when staging is
        off, the row is staged already, or S3 failed (then it goes on as without staging).
        Raises ArchiveFailure when the download fails (the record's own failure)."""
        if self.copier.staging is None or task.staged_key is not None:
            return None
        try:
            staged = self.copier.capture(task, deadline)
        except StagingError as error:
            return self._staging_failed(error, why)
        return self._staged(staged.key, staged.size, why)

    def _staged(self, key: str, size: int, why: str) -> str:
        logger.info("image staged", staged_key=key, bytes=size, reason=why)
        metrics.add_metric(name="Staged", unit=MetricUnit.Count, value=1)
        return key

    @staticmethod
    def _staging_failed(error: StagingError, why: str) -> None:
        # The record is no worse off than without staging; the alarm is on the metric.
        logger.error("could not stage the image; going on without", error=str(error), reason=why)
        metrics.add_metric(name="StagingFailed", unit=MetricUnit.Count, value=1)

    def _capture_while_paused(
        self, message: Message, task: Task, owner: str, lane: LaneState, deadline: float
    ) -> Result:
        """Claimed while the lane is paused (staging on, row not staged): the upload must
        wait, the download need not. Captured, then given back to wait for the lane."""
        try:
            key = self._capture(task, deadline, "lane paused")
        except ArchiveFailure as error:
            # The download itself failed: the record's own failure, paused lane or not.
            return self._failed_attempt(message, task, owner, error.failure)
        seconds = lane.paused_for_seconds
        park = seconds > HOLD_LIMIT_SECONDS or message.receive_count >= HOLD_LIMIT_RECEIVES
        delay = max(1, math.ceil(seconds)) if math.isfinite(seconds) else 0
        if not self.records.release(
            task, owner=owner, delay_seconds=delay, park=park, staged_key=key
        ):
            self._discard(key)
            return self._lost_lock(task, "release", "captured while the lane is paused")
        return self._hold_or_park(message, task.record_id, seconds, park=park)

    def _discard(self, key: str | None) -> None:
        """Delete a staged copy nobody needs any more; the lifecycle rule is the backstop."""
        if key is None or self.copier.staging is None:
            return
        try:
            self.copier.staging.delete(key)
        except StagingError as error:
            logger.warning("staged copy not deleted (the lifecycle rule will)", error=str(error))

    def _release(self, message: Message, task: Task, owner: str) -> Result:
        # Nothing was fetched: the claim's attempt is handed back.
        if not self.records.release(task, owner=owner, delay_seconds=NO_TIME_RETRY_SECONDS):
            return self._lost_lock(task, "release", "not enough time left")
        self._delay(message, NO_TIME_RETRY_SECONDS)
        logger.warning(
            "not enough time left for an attempt; given back",
            outcome=Outcome.RELEASED,
            retry_in_seconds=NO_TIME_RETRY_SECONDS,
        )
        metrics.add_metric(name="Released", unit=MetricUnit.Count, value=1)
        return Result(Outcome.RELEASED, task.record_id, "not enough time left")

    def _own_fault(self, message: Message, task: Task, owner: str, error: str) -> Result:
        """Our configuration or code failed, not the record: give the attempt back and
        redeliver, so a broken setting cannot walk the backlog to FAILED."""
        delay = OWN_FAULT_RETRY_SECONDS
        # The fault may have struck mid-upload: the next attempt looks the image up first.
        if not self.records.release(
            task, owner=owner, delay_seconds=delay, error=error, may_be_hosted=True
        ):
            return self._lost_lock(task, "release", error)
        self._delay(message, delay)
        logger.error(
            "archive stopped by our own fault; attempt given back, message will be redelivered",
            outcome=Outcome.UNCONCLUDED,
            error=error,
            retry_in_seconds=delay,
            receive_count=message.receive_count,
        )
        metrics.add_metric(name="Unconcluded", unit=MetricUnit.Count, value=1)
        return Result(Outcome.UNCONCLUDED, task.record_id, error)

    @staticmethod
    def _lost_lock(task: Task, write: str, error: str) -> Result:
        """Our write found the lock gone (it expired and another attempt or the sweeper took
        the row): nothing was changed, and whoever holds the row now concludes it."""
        logger.warning(
            f"the lock had passed on; the {write} was not recorded",
            outcome=Outcome.LOST_LOCK,
            error=error,
        )
        metrics.add_metric(name="LostLock", unit=MetricUnit.Count, value=1)
        return Result(Outcome.LOST_LOCK, task.record_id, f"{write} not recorded: lock passed on")

    def _unconcluded(
        self, message: Message, record_id: int, what: str, error: str, **context: Any
    ) -> Result:
        # Whether or not the claim went through, the row is safe: PENDING rows and expired
        # locks are taken over on redelivery (or by the sweeper), attempts untouched
        # unless an attempt really started.
        delay = policy.redelivery_delay(self.settings.lock_ttl_seconds)
        self._delay(message, delay)
        logger.error(
            f"{what}; message will be redelivered",
            outcome=Outcome.UNCONCLUDED,
            error=error,
            retry_in_seconds=delay,
            # After maxReceiveCount receives the redrive policy parks it in the DLQ.
            receive_count=message.receive_count,
            **context,
        )
        metrics.add_metric(name="Unconcluded", unit=MetricUnit.Count, value=1)
        return Result(Outcome.UNCONCLUDED, record_id, error)

    def _malformed(self, message: Message, reason: str) -> Result:
        # The producer's body: anything at all, so redacted before it is cut.
        preview = outside_text(message.body, LOGGED_DETAIL_LIMIT) if message.body else ""
        logger.error(
            "malformed message",
            outcome=Outcome.MALFORMED,
            reason=reason,
            message_id=message.message_id,
            body_preview=preview,
        )
        metrics.add_metric(name="Malformed", unit=MetricUnit.Count, value=1)
        dlq_url = self.settings.dlq_url
        if dlq_url:
            try:
                self.queue.send(
                    dlq_url,
                    message.body,
                    {"archive-error": reason, "source-message-id": message.message_id},
                )
                return Result(Outcome.MALFORMED, None, f"{reason}; moved to the DLQ")
            except Exception as error:  # noqa: BLE001 - fall back to the redrive policy
                logger.warning(
                    "could not send to the DLQ; leaving it to the redrive policy",
                    error=type(error).__name__,
                )
        # Fail it fast so the redrive policy moves it after maxReceiveCount receives.
        self._delay(message, 0)
        return Result(Outcome.MALFORMED_LEFT, None, reason)

    def _delay(self, message: Message, seconds: int) -> None:
        try:
            self.queue.change_visibility(message.queue_arn, message.receipt_handle, seconds)
        except Exception as error:  # noqa: BLE001 - the queue's own visibility timeout still applies
            logger.warning("could not change message visibility", error=type(error).__name__)


class _Rescue:
    """One attempt's staging after a failed upload: the spooled image is staged as it is;
    a streamed one, whose body is spent, is downloaded again into the bucket."""

    def __init__(self, worker: ArchiveWorker, task: Task, deadline: float) -> None:
        self.worker = worker
        self.task = task
        self.deadline = deadline
        self.restage = False  # the row's staged copy turned out to be missing
        self.tried = False
        self.key: str | None = None

    @property
    def wanted(self) -> bool:
        staging = self.worker.copier.staging is not None
        return staging and (self.task.staged_key is None or self.restage)

    def spool_failed(self, image: DownloadedImage, failure: Failure) -> None:
        if not self.wanted or not worth_staging(failure):
            return
        self.tried = True
        try:
            staged = self.worker.copier.stage_spooled(self.task, image, self.deadline)
        except StagingError as error:
            self.worker._staging_failed(error, "upload failed")
            return
        self.key = self.worker._staged(staged.key, staged.size, "upload failed")

    def after(self, failure: Failure) -> str | None:
        """The key staged for this failure, if it is worth one (see worth_staging)."""
        if self.key is not None or self.tried or not self.wanted or not worth_staging(failure):
            return self.key
        task = self.task if not self.restage else _unstaged(self.task)
        try:
            return self.worker._capture(task, self.deadline, "upload failed")
        except ArchiveFailure:
            # The source failed this time: the upload's failure is what the row records.
            return None


def _unstaged(task: Task) -> Task:
    return replace(task, staged_key=None)
