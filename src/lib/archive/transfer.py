"""The transfer step: a claimed record's image to Lsky Pro, from bytes in hand, ending in
a Verdict. The bytes are fetched once (or read back from the staged copy) and kept until
they are stored or staged; every wait and every failure after that stages from them.
Runs no SQL on the row; the lane (pause, pacing slots) goes through LaneStore."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from lib.archive import pacing, schedule
from lib.archive import retry as policy
from lib.archive.copier import Copier, LookUp, can_start, sent_of
from lib.archive.lane import HostCondition, host_condition, pause_until
from lib.archive.outcome import Copied, Message, Outcome, Verdict
from lib.archive.staging import StagedCopyMismatch, Staging, keeps_copy, worth_staging
from lib.platform.config import FINISH_RESERVE_MS, Settings
from lib.platform.observability import logger
from lib.platform.redact import outside_text
from lib.platform.s3 import StagedCopyMissing
from lib.state.claim import SentImage, StagedCopy, Task
from lib.state.events import EventKind, EventLog
from lib.state.lane import LaneState, PauseReason
from lib.state.lane_store import LaneStore, Slot, SlotAnswer
from lib.transfer.failures import ArchiveFailure, Failure, Stage
from lib.transfer.held import HeldImage


@dataclass
class _Attempt:
    """One claimed attempt as the step goes through it."""

    task: Task
    message: Message
    lane: LaneState  # as the claim saw it
    claimed_at: float  # time.monotonic() at the claim
    deadline: float
    events: EventLog  # the attempt's story, written by the statement that concludes it
    restage: bool = False  # the row's staged copy is gone: stage the bytes again
    from_staged: bool = False  # the bytes in hand are the staged copy's
    slot_taken: bool = False
    looked_up: bool = False  # an earlier attempt's image was looked for (and not adopted)
    fetch_seconds: float = 0.0  # how long getting the bytes in hand took
    slot_wait_seconds: float = 0.0  # slept for the upload slot
    duplicate_possible: bool = False  # ...but the look-up could not be answered

    def db_now(self) -> datetime:
        """The database's clock (read by the claim) moved on by the time elapsed here."""
        return self.lane.now + timedelta(seconds=time.monotonic() - self.claimed_at)


class Transfer:
    def __init__(
        self, *, settings: Settings, copier: Copier, staging: Staging, lane: LaneStore
    ) -> None:
        self.settings = settings
        self.copier = copier
        self.staging = staging
        self.lanes = lane
        self.timings = pacing.Timings()

    def run(
        self,
        task: Task,
        lane: LaneState,
        message: Message,
        remaining_ms: int,
        events: EventLog | None = None,
    ) -> Verdict:
        """`events`: where the attempt's story is noted (kept in memory until it concludes)."""
        now = time.monotonic()
        deadline = now + (remaining_ms - FINISH_RESERVE_MS) / 1000
        at = _Attempt(task, message, lane, now, deadline, events or EventLog())
        if not can_start(at.deadline):
            # Checked before anything is fetched: the only time an attempt is given back.
            return schedule.no_time_for_transfer()
        if lane.paused:
            # Only a staging claim takes a row while the lane is paused: capture it now.
            return self._capture_and_wait(at)
        if self._paced() and task.booked_at is None and _queued(lane):
            # Others wait for slots already: queue behind them before fetching anything.
            waiting = self._slot_or_wait(at, None)
            if waiting is not None:
                return waiting
        if task.may_be_hosted and task.sent is not None:
            # What the lost upload sent is known: look it up before fetching anything.
            found = self._look_up(at, task.sent, None)
            if isinstance(found, Verdict):
                return found
            at.looked_up, at.duplicate_possible = True, found
        fetching = time.monotonic()
        held = self._hold(at)
        at.fetch_seconds = time.monotonic() - fetching
        self.timings.fetched(at.fetch_seconds)
        if isinstance(held, Verdict):
            return held
        at.events.note(
            EventKind.FETCHED,
            source="staged copy" if at.from_staged else "provider",
            bytes=held.size,
            type=held.image_type.mime_type,
            seconds=at.fetch_seconds,
        )
        try:
            return self._with_bytes(at, held)
        finally:
            held.close()

    # -- the bytes in hand ---------------------------------------------------------------

    def _hold(self, at: _Attempt) -> HeldImage | Verdict:
        """The staged copy read back when the row has one, else the source downloaded."""
        task = at.task
        if task.staged_key is not None:
            if not self.staging.enabled:
                logger.warning("the row has a staged copy but staging is off; using the source")
            else:
                try:
                    held = self.staging.read_back(task, at.deadline)
                except StagedCopyMissing as error:
                    # Expired by the lifecycle rule, or deleted: the source may still work.
                    logger.warning("staged copy missing; using the source", error=str(error))
                    at.events.note(EventKind.FETCHED, source="staged copy", error=str(error))
                    at.restage = True
                except StagedCopyMismatch as error:
                    at.events.note(EventKind.FETCHED, source="staged copy", error=str(error))
                    return _mismatched(str(error))
                else:
                    at.from_staged = True
                    return held
        try:
            return self.copier.fetch(task, at.deadline)
        except ArchiveFailure as error:
            failure = error.failure
            at.events.note(
                EventKind.FETCHED, source="provider", error=failure.message, status=failure.status
            )
            return self._source_failed(at, failure)

    def _source_failed(self, at: _Attempt, failure: Failure) -> Verdict:
        """The download failed. An image an earlier attempt may have stored can still be
        adopted by its name and time; otherwise it is the record's own failure."""
        if at.task.may_be_hosted and not at.looked_up:
            try:
                found = self.copier.find_ours(at.task, None, at.deadline)
            except ArchiveFailure as error:
                _note_look_up(at.events, error.failure.message)
            else:
                _note_look_up(at.events, found)
                if found.adopted is not None:
                    return _archived(found.adopted)
        if at.restage:
            # Said plainly: the copy the row relied on is gone (the bucket's lifecycle rule)
            # and the provider's URL failed too (typically expired: a permanent 403).
            failure = replace(failure, message=f"staged copy gone; {failure.message}")
        # Nothing was sent this attempt: the row keeps what the claim found.
        return self._attempt_failed(at, replace(failure, may_be_hosted=at.task.may_be_hosted))

    def _look_up(
        self, at: _Attempt, sent: SentImage | None, held: HeldImage | None
    ) -> Verdict | bool:
        """Look for the image an earlier attempt may have stored: a Verdict when that ends
        the attempt (adopted, the host refused, a look-up to retry), else whether the
        upload goes on although a duplicate is possible (the last attempt's look-up
        could not be answered: the image is not lost for it)."""
        task = at.task
        try:
            found = self.copier.find_ours(task, sent, at.deadline)
        except ArchiveFailure as error:
            _note_look_up(at.events, error.failure.message)
            if host_condition(error.failure) is not None or task.attempt < (
                self.settings.max_attempts
            ):
                return self._failed(at, error.failure, held)
            logger.warning(
                "the look-up failed on the last attempt; uploading, a duplicate is possible",
                error=error.failure.message,
            )
            return True
        _note_look_up(at.events, found)
        for key, why in found.refused:
            logger.info("an image with the record's name is not ours", key=key, why=why)
        if found.adopted is not None:
            return _archived(found.adopted)
        return False

    def _with_bytes(self, at: _Attempt, held: HeldImage) -> Verdict:
        task = at.task
        if task.may_be_hosted and not at.looked_up:
            found = self._look_up(at, sent_of(held), held)
            if isinstance(found, Verdict):
                return found
            at.duplicate_possible = found
        if self._paced() and not at.slot_taken:
            waiting = self._slot_or_wait(at, held)
            if waiting is not None:
                return waiting
        logger.info(
            "archive started",
            max_attempts=self.settings.max_attempts,
            fetch_seconds=round(at.fetch_seconds, 3),
            slot_wait_seconds=round(at.slot_wait_seconds, 3),
        )
        uploading = time.monotonic()
        try:
            copied = self.copier.upload(task, held, at.deadline)
        except ArchiveFailure as error:
            failure = error.failure
            at.events.note(
                EventKind.UPLOAD_ANSWERED,
                status=failure.status,
                error=failure.message,
                failure=str(failure.kind),
                may_be_hosted=failure.may_be_hosted,
                seconds=time.monotonic() - uploading,
            )
            if at.slot_taken:
                self.lanes.settle_slot(task.record_id, counted=_counted(failure))
            return self._failed(at, failure, held)
        self.timings.uploaded(time.monotonic() - uploading)
        at.events.note(
            EventKind.UPLOAD_ANSWERED,
            status=200,
            key=str(copied.hosted.data.get("key", "")),
            bytes=copied.size,
            seconds=time.monotonic() - uploading,
        )
        return _archived(replace(copied, duplicate_possible=at.duplicate_possible))

    # -- pacing --------------------------------------------------------------------------

    def _paced(self) -> bool:
        return bool(self.settings.rate_limits)

    def _slot_or_wait(self, at: _Attempt, held: HeldImage | None) -> Verdict | None:
        """Take the upload slot (None), sleeping for it only when it is a moment away and
        the budget can pay; else the verdict that waits for it, the attempt given back."""
        limits = self.settings.rate_limits
        # A slot the attempt may sleep for is booked as it is, not rounded up to the whole
        # seconds a held message would need.
        longest = pacing.longest_sleep(
            fetched_seconds=None if held is None else at.fetch_seconds,
            fetch_estimate=self.timings.fetch,
        )
        lead = self.timings.lead
        tolerance = pacing.slot_tolerance(limits)
        for attempt in range(pacing.SLEEP_TRIES):
            slot = self.lanes.take_slot(
                at.task.record_id,
                limits=limits,
                margin=pacing.slot_margin(limits),
                tolerance=tolerance,
                stale=pacing.BOOKING_STALE_SECONDS,
                book_within=pacing.BOOK_WITHIN_SECONDS,
                sleep_within=longest,
                lead=lead,
                upload=self.timings.upload,
            )
            if attempt == 0 and held is not None and at.task.booked_at is not None:
                self.timings.came_back((slot.now - at.task.booked_at).total_seconds())
            _note_slot(at.events, slot)
            if slot.answer is SlotAnswer.GO:
                at.slot_taken = True
                return None
            if slot.answer is SlotAnswer.PAUSED:
                seconds = schedule.paused_for(slot.at, slot.now)
                staged = self._stage(at, held, "lane paused")
                return schedule.wait_for_lane(seconds, at.message, staged=staged)
            wait = slot.wait_seconds
            if (
                held is None
                and slot.answer is SlotAnswer.BOOKED
                and pacing.fetch_first(wait, fetch_estimate=self.timings.fetch)
            ):
                # Booked, its place in the queue kept: fetch now, take the slot after.
                return None
            can_sleep = held is not None and pacing.affordable_sleep(
                wait,
                longest=longest,
                deadline=at.deadline,
                size=held.size,
                staging=self.staging.enabled,
            )
            if not can_sleep:
                booked = slot.answer is SlotAnswer.BOOKED
                # A wait long enough to park may outlast the source URL: stage what is held.
                staged = None if booked else self._stage(at, held, "paced")
                return schedule.wait_for_slot(
                    wait, at.message, booked=booked, early=lead + tolerance, staged=staged
                )
            time.sleep(wait)
            at.slot_wait_seconds += wait
        return schedule.wait_for_slot(0, at.message, booked=True)

    # -- the host and the record's own failures ------------------------------------------

    def _failed(self, at: _Attempt, failure: Failure, held: HeldImage | None) -> Verdict:
        condition = host_condition(failure)
        if condition is not None:
            return self._host_paused(at, condition, failure, held)
        return self._attempt_failed(at, failure, held)

    def _host_paused(
        self, at: _Attempt, condition: HostCondition, failure: Failure, held: HeldImage | None
    ) -> Verdict:
        """The host refused every upload for a while (or until an operator acts): the lane
        pauses, the record pays nothing, and the bytes in hand are staged."""
        now = at.db_now()
        frees_at = None
        if condition.window_seconds is not None and condition.limit is not None:
            frees_at = self.lanes.window_frees_at(condition.window_seconds, condition.limit)
        until = pause_until(
            condition,
            now=now,
            window_frees_at=frees_at,
            max_retry_after_seconds=self.settings.max_retry_after_seconds,
        )
        self.lanes.pause(
            until=until or "infinity",
            reason=condition.reason,
            window=condition.window,
            detail=condition.detail,  # redacted and bounded on its way in
        )
        paused_until = until.isoformat() if until is not None else "until cleared"
        detail = outside_text(condition.detail, schedule.DETAIL_LIMIT)
        logger.warning(
            "upload lane paused; attempt given back",
            reason=str(condition.reason),
            window=condition.window,
            detail=detail,
            paused_until=paused_until,
        )
        at.events.note(
            EventKind.LANE_PAUSED,
            reason=str(condition.reason),
            window=condition.window,
            until=paused_until,
            detail=detail,
        )
        verdict = schedule.wait_for_lane(
            schedule.paused_for(until, now),
            at.message,
            condition=condition,
            # A refusal stored nothing: the next attempt needs no look-up.
            may_be_hosted=failure.may_be_hosted,
            staged=self._stage(at, held, "upload failed"),
        )
        return replace(verdict, sent=_sent(failure, held))

    def _attempt_failed(
        self, at: _Attempt, failure: Failure, held: HeldImage | None = None
    ) -> Verdict:
        """The record's own failure: retried after its backoff, or FAILED (lib.archive.retry)."""
        task, settings = at.task, self.settings
        decision = policy.decide(
            failure,
            attempt=task.attempt,
            max_attempts=settings.max_attempts,
            delays=settings.retry_delays,
            max_retry_after=settings.max_retry_after_seconds,
        )
        error = policy.error_summary(
            failure, attempt=task.attempt, max_attempts=settings.max_attempts
        )
        staged = self._stage(at, held, "upload failed") if worth_staging(failure) else None
        fields = {"error_class": str(decision.error_class), "error": error}
        if decision.action is policy.Action.FAIL:
            return Verdict(
                Outcome.FAILED,
                error,
                may_be_hosted=failure.may_be_hosted,
                staged=staged,
                keep_staged=keeps_copy(failure),
                sent=_sent(failure, held),
                fields=fields,
            )
        return Verdict(
            Outcome.RETRY,
            error,
            decision.delay_seconds,
            may_be_hosted=failure.may_be_hosted,
            staged=staged,
            sent=_sent(failure, held),
            fields=fields,
        )

    # -- staging ---------------------------------------------------------------------------

    def _capture_and_wait(self, at: _Attempt) -> Verdict:
        """Claimed while the lane is paused (staging on, row not staged): the upload must
        wait, the download need not. Captured, then given back to wait for the lane."""
        try:
            staged = self.staging.capture(at.task, at.deadline, "lane paused")
        except ArchiveFailure as error:
            # The download itself failed: the record's own failure, paused lane or not.
            failure = error.failure
            at.events.note(
                EventKind.FETCHED, source="provider", error=failure.message, status=failure.status
            )
            return self._attempt_failed(at, failure)
        _note_staged(at.events, staged, "lane paused")
        return schedule.wait_for_lane(at.lane.paused_for_seconds, at.message, staged=staged)

    def _stage(self, at: _Attempt, held: HeldImage | None, why: str) -> StagedCopy | None:
        """Stage the bytes in hand, unless the row's own copy is where they came from."""
        if held is None or (at.task.staged_key is not None and not at.restage):
            return None
        staged = self.staging.stage(at.task, held, at.deadline, why)
        _note_staged(at.events, staged, why)
        return staged


def _note_staged(events: EventLog, staged: StagedCopy | None, why: str) -> None:
    if staged is not None:
        events.note(
            EventKind.STAGED, key=staged.key, sha256=staged.sha256, bytes=staged.size, why=why
        )


def _note_slot(events: EventLog, slot: Slot) -> None:
    events.note(
        EventKind.SLOT,
        answer=str(slot.answer),
        at=slot.at,
        wait_seconds=None if slot.answer is SlotAnswer.PAUSED else slot.wait_seconds,
    )


def _note_look_up(events: EventLog, found: LookUp | str) -> None:
    """The look-up for an earlier attempt's image: what was adopted and why, what was not
    and why, or the failure (a text)."""
    if isinstance(found, str):
        events.note(EventKind.LOOKED_UP, error=found)
        return
    adopted = found.adopted
    events.note(
        EventKind.LOOKED_UP,
        adopted=None if adopted is None else str(adopted.hosted.data.get("key", "")),
        why=found.why or None,
        duplicates=list(adopted.duplicates) if adopted is not None else [],
        refused=[f"{key}: {why}" for key, why in found.refused],
    )


def _queued(lane: LaneState) -> bool:
    return lane.queue_end is not None and lane.queue_end > lane.now


def _sent(failure: Failure, held: HeldImage | None) -> SentImage | None:
    """What the failed upload sent, kept for the look-up when Lsky may have stored it."""
    if held is None or not failure.may_be_hosted or failure.stage is not Stage.UPLOAD:
        return None
    return sent_of(held)


def _counted(failure: Failure) -> bool:
    """Whether a failed upload counts against Lsky's windows: all but a rate-limit
    refusal, which Lsky's limiter answers before storing anything."""
    condition = host_condition(failure)
    return condition is None or condition.reason is not PauseReason.RATE_LIMIT


def _archived(copied: Copied) -> Verdict:
    return Verdict(
        Outcome.ARCHIVED,
        copied.hosted.url,
        copied=copied,
        fields={"bytes": copied.size, "mime_type": copied.hosted.mime_type},
    )


def _mismatched(error: str) -> Verdict:
    """The staged copy is not what was captured: never archived. Our fault, not the
    record's: the attempt is given back and the row forgets the copy (the source next)."""
    logger.error("staged copy does not match what was captured; dropped", error=error)
    return Verdict(
        Outcome.OWN_FAULT,
        f"staging error: {error}",
        schedule.OWN_FAULT_RETRY_SECONDS,
        forget_staged=True,
        metrics=("StagingError", "StagedCopyMismatch"),
        fields={"error": error},
    )
