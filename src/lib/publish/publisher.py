"""The archive function's publisher: the completion events a container's statements wrote,
in one PutEvents right after the conclusion; the ones that went out are deleted by its next
claim. Never in the record's way: it is concluded before, a call is one short try made with
time to spare, and a failed call quiets the container for a while (the outbox keeps all).
Thread-safe: the call may be made by the after-response extension's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from aws_lambda_powertools.metrics import MetricUnit

from lib.platform.aws import error_code
from lib.platform.eventbridge import EventBus
from lib.platform.observability import logger, metrics
from lib.publish.entries import MAX_ENTRIES, Answer, Fate, answers, batches, codes, entry
from lib.state.outbox import OutboxEvent, Publication

# A call is made only with this much of the invocation left: its worst case (one try, the
# client's 1 s connect and 2 s read timeouts) and a margin for the handler's return.
RESERVE_MS = 5_000
# After a call failed (EventBridge unreachable, throttled, refused): no call for this long.
COOLDOWN_SECONDS = 60.0
# Events a container keeps for its next call at most (older ones are the sweeper's), and
# the tries it gives each before leaving it to the sweeper.
MAX_HELD = 50
MAX_TRIES = 3
# Publications waiting for the next claim to record them; past this the oldest are
# forgotten (the sweeper publishes them again: a duplicate, never a loss).
MAX_UNRECORDED = 1_000


@dataclass
class _Held:
    event: OutboxEvent
    collected: float  # time.monotonic() when its statement answered
    tries: int = 0


class Publisher:
    """One per container. `bus` None: events are off, and nothing is ever called."""

    def __init__(
        self, bus: EventBus | None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bus = bus
        self._clock = clock
        self._held: list[_Held] = []
        self._unrecorded: list[Publication] = []
        self._quiet_until = 0.0
        # Held while the lists change, never during the call.
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.bus is not None

    def collect(self, events: list[OutboxEvent]) -> None:
        """Events a statement just wrote (ArchiveRecords.take_outboxed)."""
        now = self._clock()
        with self._lock:
            self._held += [_Held(event, now) for event in events]
            if len(self._held) > MAX_HELD:
                del self._held[: len(self._held) - MAX_HELD]

    def unrecorded(self) -> list[Publication]:
        """What went out since the last claim: the next claim deletes them."""
        with self._lock:
            return list(self._unrecorded)

    def recorded(self, publications: list[Publication]) -> None:
        """The claim that carried them committed."""
        done = {p.event_id for p in publications}
        with self._lock:
            self._unrecorded = [p for p in self._unrecorded if p.event_id not in done]

    def publish(self, remaining_ms: int) -> None:
        """One PutEvents for the events kept, newest conclusion included, when it can be
        made now; never raises."""
        if self.bus is None:
            return
        with self._lock:
            if not self._held or remaining_ms < RESERVE_MS or self._clock() < self._quiet_until:
                return
            # The newest (this conclusion's first), as many as one call takes.
            sent = batches([h.event for h in self._held[-MAX_ENTRIES:]])[0]
        try:
            results = self.bus.put([entry(event) for event in sent])
        except Exception as error:  # noqa: BLE001 - the outbox keeps them; said and counted
            with self._lock:
                self._quiet_until = self._clock() + COOLDOWN_SECONDS
                self._tried(sent)
            logger.warning(
                "completion events not published; the sweeper publishes them",
                error=type(error).__name__,
                code=error_code(error),
                events=len(sent),
                event_ids=[event.event_id for event in sent],
            )
            metrics.add_metric(name="EventsNotPublished", unit=MetricUnit.Count, value=len(sent))
            return
        found = answers(sent, results)
        with self._lock:
            self._settle(found)
        self._report(found)

    def _settle(self, found: list[Answer]) -> None:
        """The answer applied to what is held (under the lock)."""
        published = {a.event.event_id for a in found if a.fate is Fate.PUBLISHED}
        now = self._clock()
        for held in self._held:
            if held.event.event_id in published:
                # The database's clock: the conclusion's time moved on by ours since.
                at = held.event.created_at + timedelta(seconds=max(now - held.collected, 0.0))
                self._unrecorded.append(Publication(held.event.event_id, at))
        if len(self._unrecorded) > MAX_UNRECORDED:
            del self._unrecorded[: len(self._unrecorded) - MAX_UNRECORDED]
        refused = {a.event.event_id for a in found if a.fate is Fate.REFUSED}
        self._held = [h for h in self._held if h.event.event_id not in published | refused]
        self._tried([a.event for a in found if a.fate is Fate.RETRY])

    def _report(self, found: list[Answer]) -> None:
        published = [a for a in found if a.fate is Fate.PUBLISHED]
        refused = [a for a in found if a.fate is Fate.REFUSED]
        if published:
            metrics.add_metric(name="EventsPublished", unit=MetricUnit.Count, value=len(published))
        missed = [a for a in found if a.fate is not Fate.PUBLISHED]
        if missed:
            # Kept (the outbox has them): retried with the next call, then by the sweeper,
            # which drops an entry EventBridge refuses for good after a few tries.
            logger.warning(
                "PutEvents did not take every completion event; the rest are kept",
                codes=codes(missed),
                errors=[a.error for a in missed][:MAX_ENTRIES],
                event_ids=[a.event.event_id for a in missed],
                refused=len(refused),
            )
            metrics.add_metric(name="EventsNotPublished", unit=MetricUnit.Count, value=len(missed))

    def _tried(self, events: list[OutboxEvent]) -> None:
        ids = {event.event_id for event in events}
        for held in self._held:
            if held.event.event_id in ids:
                held.tries += 1
        self._held = [h for h in self._held if h.tries < MAX_TRIES]
