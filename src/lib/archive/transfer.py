"""The transfer step: a claimed record's image to Lsky Pro, from bytes in hand, ending in
a Verdict. The bytes are fetched once (or read back from the staged copy) and kept until
they are stored or staged; every wait and every failure after that stages from them.
Runs no SQL on the row; the lane (pause, pacing slots) goes through LaneStore."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from lib.archive import pacing, schedule, story
from lib.archive import retry as policy
from lib.archive.copier import Copier, can_start, sent_after, sent_of
from lib.archive.copies import kept_copy
from lib.archive.lane import HostCondition, host_condition, pause_until
from lib.archive.original_step import OriginalStep
from lib.archive.originals import Keeping, Originals
from lib.archive.outcome import Message, Outcome, Verdict, archived
from lib.archive.relaying import relay_gate
from lib.archive.restoring import damaged_copy_listed
from lib.archive.staging import (
    Staging,
    keeps_copy,
    worth_staging,
)
from lib.platform.config import FINISH_RESERVE_MS, Settings
from lib.platform.observability import logger
from lib.ratelimit import limiter, margins
from lib.state.claim import Restoring, SentImage, StagedCopy, Task
from lib.state.events import EventLog
from lib.state.lane import LaneState
from lib.state.lane_store import LaneStore, SlotAnswer
from lib.transfer.failures import ArchiveFailure, Failure
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
    from_original: bool = False  # ...or a restore's original
    slot_taken: bool = False
    looked_up: bool = False  # an earlier attempt's image was looked for (and not adopted)
    fetch_seconds: float = 0.0  # how long getting the bytes in hand took
    slot_wait_seconds: float = 0.0  # slept for the upload slot
    upload_started: float | None = None  # time.monotonic(), when relayed (lib.archive.relaying)
    duplicate_possible: bool = False  # ...but the look-up could not be answered
    keeping: Keeping | None = None  # the original's write beside the upload

    def db_now(self) -> datetime:
        """The database's clock (read by the claim) moved on by the time elapsed here."""
        return self.lane.now + timedelta(seconds=time.monotonic() - self.claimed_at)


class Transfer:
    def __init__(
        self,
        *,
        settings: Settings,
        copier: Copier,
        staging: Staging,
        lane: LaneStore,
        originals: Originals,
    ) -> None:
        self.settings = settings
        self.copier = copier
        self.staging = staging
        self.lanes = lane
        self.original = OriginalStep(originals, staging)
        self.timings = pacing.Timings()

    def run(
        self, task: Task, lane: LaneState, message: Message, remaining_ms: int, events: EventLog
    ) -> Verdict:
        now = time.monotonic()
        deadline = now + (remaining_ms - FINISH_RESERVE_MS) / 1000
        at = _Attempt(task, message, lane, now, deadline, events)
        if not can_start(at.deadline):
            # Checked before anything is fetched: the only time an attempt is given back.
            return schedule.no_time_for_transfer()
        if lane.paused:
            # Only a staging claim takes a row while the lane is paused: capture it now.
            waiting = schedule.wait_for_lane(lane.paused_for_seconds, message)
            return self._keep_while_waiting(at, waiting, "lane paused")
        if self._paced() and task.booked_at is None and lane.queued and not task.may_be_hosted:
            # Others wait for slots already: queue behind them before fetching anything,
            # unless it may be hosted already; a record that must wait keeps its image.
            queued = self._slot_or_wait(at, None)
            if queued is not None:
                return self._keep_while_waiting(at, queued, "queued for a slot")
        if task.restore is not None and (blocked := _restore_blocked(self, at, task.restore)):
            return blocked
        if task.may_be_hosted and task.sent is not None:
            # What the lost upload sent is known: look it up before fetching anything.
            found = self._look_up(at, task.sent, None)
            if isinstance(found, Verdict):
                return self.original.adopted(at, found, None)
            at.looked_up, at.duplicate_possible = True, found
        fetching = time.monotonic()
        held = self._hold(at)
        at.fetch_seconds = time.monotonic() - fetching
        self.timings.fetched(at.fetch_seconds)
        if isinstance(held, Verdict):
            return held
        story.fetched(
            at.events, held, from_staged=at.from_staged, from_original=at.from_original,
            seconds=at.fetch_seconds,
        )  # fmt: skip
        try:
            return self._with_bytes(at, held)
        finally:
            held.close()

    # -- the bytes in hand ---------------------------------------------------------------

    def _hold(self, at: _Attempt) -> HeldImage | Verdict:
        """A copy we keep read back (lib.archive.copies), else the source downloaded."""
        kept = kept_copy(self.staging, self.original.originals, at)
        if kept is not None:
            return self._attempt_failed(at, kept) if isinstance(kept, Failure) else kept
        try:
            gate, beside = relay_gate(at, self), self.original.relayed(at)
            return self.copier.fetch(at.task, at.deadline, gate=gate, beside=beside)
        except ArchiveFailure as error:
            story.source_failed(at.events, error.failure)
            return self._source_failed(at, error.failure)

    def _keep_while_waiting(self, at: _Attempt, waiting: Verdict, why: str) -> Verdict:
        """A record that must wait (a paused lane, others queued for slots), nothing
        fetched: with staging on, its image is captured now and kept (the URL may expire
        or serve once); a gone one fails the record now, and gives back any booking."""
        try:
            staged = self.staging.capture(at.task, at.deadline, why)
        except ArchiveFailure as error:
            story.source_failed(at.events, error.failure)
            # No look-up while it must wait (a paused lane asks Lsky nothing): the row keeps
            # what the claim found, and its next attempt looks when it may upload.
            failure = replace(error.failure, may_be_hosted=at.task.may_be_hosted)
            return self._attempt_failed(at, failure)
        if staged is None:
            return waiting
        story.staged(at.events, staged, why)
        return replace(waiting, staged=staged)

    def _source_failed(self, at: _Attempt, failure: Failure) -> Verdict:
        """The download failed. An image an earlier attempt may have stored can still be
        adopted by its name and time; otherwise it is the record's own failure."""
        if at.task.may_be_hosted and not at.looked_up:
            try:
                found = self.copier.find_ours(at.task, None, at.deadline)
            except ArchiveFailure as error:
                story.looked_up(at.events, error.failure.message)
            else:
                story.looked_up(at.events, found)
                if found.adopted is not None:
                    return self.original.adopted(at, archived(found.adopted), None)
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
            story.looked_up(at.events, error.failure.message)
            if host_condition(error.failure) is not None or task.attempt < (
                self.settings.max_attempts
            ):
                return self._failed(at, error.failure, held)
            logger.warning(
                "the look-up failed on the last attempt; uploading, a duplicate is possible",
                error=error.failure.message,
            )
            return True
        story.looked_up(at.events, found)
        for key, why in found.refused:
            logger.info("an image with the record's name is not ours", key=key, why=why)
        if found.adopted is not None:
            return archived(found.adopted)
        return False

    def _with_bytes(self, at: _Attempt, held: HeldImage) -> Verdict:
        task = at.task
        if task.may_be_hosted and not at.looked_up:
            found = self._look_up(at, sent_of(held), held)
            if isinstance(found, Verdict):
                return self.original.adopted(at, found, held)
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
        uploading = at.upload_started or time.monotonic()  # from its slot to its answer
        self.original.start(at, held)
        try:
            copied = self.copier.upload(task, held, at.deadline)
        except ArchiveFailure as error:
            self.original.dropped(at)
            story.upload_failed(at.events, error.failure, seconds=time.monotonic() - uploading)
            # Lsky counts stored images: the slot stays if it may have stored this one.
            verdict = self._failed(at, error.failure, held)
            return replace(verdict, counted=error.failure.may_be_hosted)
        self.timings.uploaded(time.monotonic() - uploading)
        story.upload_answered(at.events, copied, seconds=time.monotonic() - uploading)
        copied = self.original.kept(at, replace(copied, duplicate_possible=at.duplicate_possible))
        return archived(copied)

    # -- pacing --------------------------------------------------------------------------

    def _paced(self) -> bool:
        return bool(self.settings.rate_limits)

    def _slot_or_wait(self, at: _Attempt, held: HeldImage | None) -> Verdict | None:
        """Take the upload slot (None), sleeping for it only when it is a moment away and
        the budget can pay; else the verdict that waits for it, the attempt given back."""
        limits = limiter.pacing_windows(self.settings.rate_limits, self.settings.lsky_timezone)
        # A slot the attempt may sleep for is booked as it is, not rounded up to the whole
        # seconds a held message would need.
        longest = pacing.longest_sleep(
            fetched_seconds=None if held is None else at.fetch_seconds,
            fetch_estimate=self.timings.fetch,
        )
        # With staging on a record that waits keeps its image (it is staged before it does).
        lead = self.timings.lead(image_kept=self.staging.enabled)
        tolerance = margins.slot_tolerance(limits)
        for attempt in range(pacing.SLEEP_TRIES):
            slot = self.lanes.take_slot(
                at.task.record_id,
                limits=limits,
                margin=margins.slot_margin(limits),
                tolerance=tolerance,
                stale=pacing.BOOKING_STALE_SECONDS,
                book_within=pacing.BOOK_WITHIN_SECONDS,
                sleep_within=longest,
                lead=lead,
                upload=self.timings.upload + pacing.ANSWER_SLACK_SECONDS,
                zone=self.settings.lsky_timezone,
            )
            if attempt == 0 and held is not None and at.task.booked_at is not None:
                self.timings.came_back((slot.now - at.task.booked_at).total_seconds())
            story.slot(at.events, slot)
            if slot.answer is SlotAnswer.GO:
                at.slot_taken = True
                return None
            if slot.answer is SlotAnswer.PAUSED:
                seconds = schedule.paused_for(slot.at, slot.now)
                staged = _stage(self.staging, at, held, "lane paused")
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
                booked, early = slot.answer is SlotAnswer.BOOKED, lead + tolerance
                verdict = schedule.wait_for_slot(wait, at.message, booked=booked, early=early)
                # Waiting, it may outwait the source URL: stage the bytes in hand.
                return replace(verdict, staged=_stage(self.staging, at, held, "paced"))
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
        frees_at = _window_frees(self.lanes, condition, self.settings.lsky_timezone, at.task)
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
        fields = story.lane_paused(at.events, condition, until)
        logger.warning("upload lane paused; attempt given back", **fields)
        verdict = schedule.wait_for_lane(
            schedule.paused_for(until, now),
            at.message,
            condition=condition,
            # A refusal stored nothing: the next attempt needs no look-up.
            may_be_hosted=failure.may_be_hosted,
            staged=_stage(self.staging, at, held, "upload failed"),
        )
        return replace(verdict, sent=sent_after(failure, held))

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
        staged = _stage(self.staging, at, held, "upload failed") if worth_staging(failure) else None
        fail = decision.action is policy.Action.FAIL
        return Verdict(
            Outcome.FAILED if fail else Outcome.RETRY,
            error,
            0 if fail else decision.delay_seconds,
            may_be_hosted=failure.may_be_hosted,
            staged=staged,
            keep_staged=fail and keeps_copy(failure),
            sent=sent_after(failure, held),
            fields={"error_class": str(decision.error_class), "error": error},
        )


def _stage(staging: Staging, at: _Attempt, held: HeldImage | None, why: str) -> StagedCopy | None:
    """Stage the bytes in hand, unless the row's own copy is where they came from."""
    if held is None or (at.task.staged_key is not None and not at.restage):
        return None
    staged = staging.stage(at.task, held, at.deadline, why)
    story.staged(at.events, staged, why)
    return staged


def _restore_blocked(transfer: Transfer, at: _Attempt, restore: Restoring) -> Verdict | None:
    """A restore Lsky would dedupe onto the damaged copy's file fails
    (docs/explanation/audit-and-repair.md)."""
    if not restore.old_key:
        return None
    try:
        failure = damaged_copy_listed(transfer.copier, at.task, restore.old_key, at.deadline)
    except ArchiveFailure as error:
        story.looked_up(at.events, error.failure.message)
        return transfer._failed(at, error.failure, None)
    return None if failure is None else transfer._attempt_failed(at, failure)


def _window_frees(lanes: LaneStore, named: HostCondition, zone: str, task: Task) -> datetime | None:
    """When the window Lsky named in a refusal frees, by the ledger (None: no window)."""
    if named.window_seconds is None or named.limit is None:
        return None
    name, seconds, limit = named.window, named.window_seconds, named.limit
    return lanes.window_frees_at(seconds, limit, window=name, zone=zone, record_id=task.record_id)
