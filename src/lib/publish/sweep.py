"""The sweeper's part of the completion events: what the functions left in the outbox is
published once older than the grace period, in bounded pages; what went out leaves it, what
EventBridge refuses for good is dropped after a few tries; the outbox's oldest age is
reported (EventsUnpublished, its alarm).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from aws_lambda_powertools.metrics import MetricUnit

from lib.platform.aws import error_code
from lib.platform.eventbridge import EventBus
from lib.platform.observability import logger, metrics
from lib.platform.redact import outside_text
from lib.publish.entries import Answer, Fate, answers, batches, codes, entry
from lib.state.outbox import Missed, OutboxStore, OutboxSummary, Page, Publication

# Events taken a statement (ten PutEvents calls at most), and a run's bound.
PAGE_SIZE = 100
MAX_EVENTS_PER_RUN = 2_000
# A page is kept this long from a second sweeper; longer than a run (60 s timeout).
LEASE_SECONDS = 120
# A page is started only with this much of the run left: ten calls' worst case (one try,
# 1 s connect and 2 s read timeouts each) and the settling statement.
PAGE_RESERVE_MS = 35_000
LOGGED_EVENTS = 50  # event ids a log line names at most


@dataclass
class PublishReport:
    """What a run did with the outbox (the sweep summary's events_* fields)."""

    published: int = 0
    dropped: int = 0
    missed: int = 0
    waiting: int | None = None  # after the run, counted up to OutboxSummary.limit
    oldest_age_seconds: float | None = None

    def as_dict(self) -> dict[str, int | float | None]:
        return {
            "events_published": self.published,
            "events_dropped": self.dropped,
            "events_missed": self.missed,
            "events_waiting": self.waiting,
            "events_oldest_age_seconds": self.oldest_age_seconds,
        }


def publish_leftovers(
    store: OutboxStore,
    bus: EventBus,
    *,
    grace_seconds: int,
    own: Sequence[str],
    remaining_ms: Callable[[], int],
) -> PublishReport:
    """Publish the outbox's due events (and `own`, those this run's statements wrote) while
    time is left; stops at a call that fails (EventBridge is down: the next run tries)."""
    report = PublishReport()
    own_left = list(own)
    while report.published + report.missed + report.dropped < MAX_EVENTS_PER_RUN:
        if remaining_ms() < PAGE_RESERVE_MS:
            break
        page = store.take(
            grace_seconds=grace_seconds,
            lease_seconds=LEASE_SECONDS,
            limit=PAGE_SIZE,
            own=own_left,
        )
        own_left = []
        if not page.events:
            break
        failed = _publish_page(store, bus, page, report)
        if failed or len(page.events) < PAGE_SIZE:
            break
    _report(store, report)
    return report


def _publish_page(store: OutboxStore, bus: EventBus, page: Page, report: PublishReport) -> bool:
    """One page, batch by batch, settled in one statement; True when a call failed."""
    taken = time.monotonic()
    published: list[Publication] = []
    missed: list[Answer] = []
    failure: Exception | None = None
    for batch in batches(page.events):
        if failure is None:
            try:
                results = bus.put([entry(event) for event in batch])
            except Exception as error:  # noqa: BLE001 - the events stay; said and counted
                failure = error
            else:
                # When PutEvents answered, in the database's clock (the page's read, on).
                at = (page.now or batch[0].created_at) + timedelta(seconds=time.monotonic() - taken)
                for answer in answers(batch, results):
                    if answer.fate is Fate.PUBLISHED:
                        published.append(Publication(answer.event.event_id, at))
                    else:
                        missed.append(answer)
                continue
        reason = outside_text(f"{error_code(failure) or type(failure).__name__}: call failed", 200)
        missed += [Answer(event, Fate.RETRY, reason) for event in batch]
    dropped = [_missed(a) for a in missed if a.dropped]
    settled = store.settle(
        published=published,
        missed=[_missed(a) for a in missed if not a.dropped],
        dropped=dropped,
    )
    report.published += settled.published
    report.missed += settled.missed
    report.dropped += settled.dropped
    _log(missed, dropped, failure)
    return failure is not None


def _missed(answer: Answer) -> Missed:
    return Missed(answer.event.event_id, answer.error, answer.fate is Fate.REFUSED)


def _log(missed: list[Answer], dropped: list[Missed], failure: Exception | None) -> None:
    if failure is not None:
        logger.warning(
            "could not publish completion events; the next sweep tries again",
            error=type(failure).__name__,
            code=error_code(failure),
        )
    elif missed:
        logger.warning(
            "PutEvents did not take every completion event; the rest are kept",
            codes=codes(missed),
            event_ids=[a.event.event_id for a in missed][:LOGGED_EVENTS],
        )
    for item in dropped:
        # Refused for good, time after time: the entry itself (its detail) is at fault.
        logger.error(
            "completion event dropped: EventBridge refuses it",
            event_id=item.event_id,
            reason=item.error,
        )
    if dropped:
        metrics.add_metric(name="EventsDropped", unit=MetricUnit.Count, value=len(dropped))


def _report(store: OutboxStore, report: PublishReport) -> None:
    summary: OutboxSummary = store.summary()
    report.waiting = summary.waiting
    report.oldest_age_seconds = summary.oldest_age_seconds
    metrics.add_metric(name="EventsPublished", unit=MetricUnit.Count, value=report.published)
    # EventsUnpublished feeds EventsUnpublishedAlarm: 0 when the outbox is empty.
    metrics.add_metric(
        name="EventsUnpublished", unit=MetricUnit.Seconds, value=summary.oldest_age_seconds
    )
    metrics.add_metric(name="EventsWaiting", unit=MetricUnit.Count, value=summary.waiting)
