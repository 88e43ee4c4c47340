"""The transfer step: a claimed record's image to Lsky Pro (or to the staging bucket while
the host cannot take it), ending in a Verdict. Runs no SQL on the row; the lane's
pause and pacing go through lib.state.lane_store."""

from __future__ import annotations

import time
from dataclasses import replace

from lib.archive import retry as policy
from lib.archive import schedule
from lib.archive.copier import Copier, can_start
from lib.archive.lane import HostCondition, host_condition, pause_until
from lib.archive.outcome import Copied, Message, Outcome, Verdict
from lib.archive.pacing import db_now, reserve_upload
from lib.archive.staging import Staging, keeps_copy, worth_staging
from lib.platform.config import FINISH_RESERVE_MS, Settings
from lib.platform.observability import logger
from lib.platform.s3 import StagedCopyMissing
from lib.state.claim import Task
from lib.state.lane import LaneState, PauseReason
from lib.state.lane_store import LaneStore
from lib.transfer.failures import ArchiveFailure, Failure
from lib.transfer.imagetype import DownloadedImage


class Transfer:
    def __init__(
        self, *, settings: Settings, copier: Copier, staging: Staging, lane: LaneStore
    ) -> None:
        self.settings = settings
        self.copier = copier
        self.staging = staging
        self.lane = lane

    def run(self, task: Task, lane: LaneState, message: Message, remaining_ms: int) -> Verdict:
        claimed_at = time.monotonic()
        deadline = claimed_at + (remaining_ms - FINISH_RESERVE_MS) / 1000
        if not can_start(deadline):
            # Checked before anything is fetched: the only time an attempt is given back.
            return schedule.no_time_for_transfer()
        if lane.paused:
            # Only a staging claim takes a row while the lane is paused: capture it now.
            return self._capture_and_wait(task, lane, message, deadline)
        if self.settings.rate_limits:
            closed_until = reserve_upload(
                self.lane, self.settings.rate_limits, lane, claimed_at, deadline
            )
            if closed_until is not None:
                now = db_now(lane, claimed_at)
                pacing = HostCondition(PauseReason.PACING, "pacing: LSKY_RATE_LIMITS")
                try:
                    key = self.staging.capture(task, deadline, "pacing")
                except ArchiveFailure as error:
                    return self._attempt_failed(error.failure, task)
                return schedule.wait_for_lane(
                    schedule.paused_for(closed_until, now),
                    message,
                    condition=pacing,
                    staged_key=key,
                )
        logger.info("archive started", max_attempts=self.settings.max_attempts)
        rescue = _Rescue(self.staging, task, deadline)
        try:
            copied = self._copy(task, deadline, rescue)
        except ArchiveFailure as error:
            return self._failed(
                error.failure,
                task=task,
                lane=lane,
                message=message,
                claimed_at=claimed_at,
                rescue=rescue,
            )
        return Verdict(
            Outcome.ARCHIVED, copied.hosted.url, copied=copied, fields=_copy_fields(copied)
        )

    def _capture_and_wait(
        self, task: Task, lane: LaneState, message: Message, deadline: float
    ) -> Verdict:
        """Claimed while the lane is paused (staging on, row not staged): the upload must
        wait, the download need not. Captured, then given back to wait for the lane."""
        try:
            key = self.staging.capture(task, deadline, "lane paused")
        except ArchiveFailure as error:
            # The download itself failed: the record's own failure, paused lane or not.
            return self._attempt_failed(error.failure, task)
        return schedule.wait_for_lane(lane.paused_for_seconds, message, staged_key=key)

    def _copy(self, task: Task, deadline: float, rescue: _Rescue) -> Copied:
        """From the row's staged copy when it has one, else from the source URL."""
        if task.staged_key is not None:
            if not self.staging.enabled:
                logger.warning("the row has a staged copy but staging is off; using the source")
            else:
                try:
                    return self.copier.copy_staged(task, deadline)
                except StagedCopyMissing as error:
                    # Expired by the lifecycle rule, or deleted: the source may still work.
                    logger.warning("staged copy missing; using the source", error=str(error))
                    rescue.restage = True
        return self.copier.copy(task, deadline, on_spool_failed=rescue.spool_failed)

    def _failed(
        self,
        failure: Failure,
        *,
        task: Task,
        lane: LaneState,
        message: Message,
        claimed_at: float,
        rescue: _Rescue,
    ) -> Verdict:
        staged = rescue.after(failure)
        condition = host_condition(failure)
        if condition is not None:
            now = db_now(lane, claimed_at)
            until = pause_until(condition, now=now, upload_times=lane.upload_times)
            self.lane.pause(
                until=until or "infinity",
                reason=condition.reason,
                window=condition.window,
                detail=condition.detail[:200],
            )
            logger.warning(
                "upload lane paused; attempt given back",
                reason=str(condition.reason),
                window=condition.window,
                detail=condition.detail[:200],
                paused_until=until.isoformat() if until is not None else "until cleared",
            )
            return schedule.wait_for_lane(
                schedule.paused_for(until, now),
                message,
                condition=condition,
                # A refusal stored nothing: the next attempt needs no look-up.
                may_be_hosted=failure.may_be_hosted,
                staged_key=staged,
            )
        return self._attempt_failed(failure, task, staged)

    def _attempt_failed(self, failure: Failure, task: Task, staged: str | None = None) -> Verdict:
        """The record's own failure: retried after its backoff, or FAILED (lib.archive.retry)."""
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
        fields = {"error_class": str(decision.error_class), "error": error}
        if decision.action is policy.Action.FAIL:
            return Verdict(
                Outcome.FAILED,
                error,
                may_be_hosted=failure.may_be_hosted,
                staged_key=staged,
                keep_staged=keeps_copy(failure),
                fields=fields,
            )
        return Verdict(
            Outcome.RETRY,
            error,
            decision.delay_seconds,
            may_be_hosted=failure.may_be_hosted,
            staged_key=staged,
            fields=fields,
        )


def _copy_fields(copied: Copied) -> dict[str, object]:
    return {"bytes": copied.size, "mime_type": copied.hosted.mime_type}


class _Rescue:
    """One attempt's staging after a failed upload: the spooled image is staged as it is;
    a streamed one, whose body is spent, is downloaded again into the bucket."""

    def __init__(self, staging: Staging, task: Task, deadline: float) -> None:
        self.staging = staging
        self.task = task
        self.deadline = deadline
        self.restage = False  # the row's staged copy turned out to be missing
        self.tried = False
        self.key: str | None = None

    @property
    def wanted(self) -> bool:
        return self.staging.enabled and (self.task.staged_key is None or self.restage)

    def spool_failed(self, image: DownloadedImage, failure: Failure) -> None:
        if not self.wanted or not worth_staging(failure):
            return
        self.tried = True
        self.key = self.staging.stage(self.task, image, self.deadline, "upload failed")

    def after(self, failure: Failure) -> str | None:
        """The key staged for this failure, if it is worth one (see worth_staging)."""
        if self.key is not None or self.tried or not self.wanted or not worth_staging(failure):
            return self.key
        task = self.task if not self.restage else replace(self.task, staged_key=None)
        try:
            return self.staging.capture(task, self.deadline, "upload failed")
        except ArchiveFailure:
            # The source failed this time: the upload's failure is what the row records.
            return None
