"""S3's late answers to the originals a success write recorded unconfirmed (their bodies
had gone out whole, S3 had not answered yet): kept by the container until its next claim,
which records them in its own statement, as it does the completion events published
(docs/explanation/staging-and-originals.md). A failure is logged and counted there and
left unconfirmed: S3 may hold the object all the same, and the audit looks."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from aws_lambda_powertools.metrics import MetricUnit

from lib.platform.observability import logger, metrics
from lib.state.claim import Confirmed, is_version

# Answers waiting for the next claim; past this the oldest are forgotten (the audit
# confirms those originals with a HEAD: later, never wrongly).
MAX_UNRECORDED = 1_000


class Confirmations:
    """One per container (lib.archive.originals.Originals); thread-safe: the kept threads
    add, the invocation's thread takes and records."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._answers: list[Confirmed] = []
        self._failures: list[tuple[int, str]] = []  # (record id, why)

    def answered(self, confirmed: Confirmed) -> None:
        if not is_version(confirmed.version_id):  # what no S3 answers: never recorded
            why = f"original {confirmed.key}: S3 answered with an unreadable version"
            self.failed(confirmed.record_id, why)
            return
        with self._lock:
            self._answers.append(confirmed)
            del self._answers[:-MAX_UNRECORDED]
            self._lock.notify_all()

    def failed(self, record_id: int, error: str) -> None:
        with self._lock:
            self._failures.append((record_id, error))
            del self._failures[:-MAX_UNRECORDED]
            self._lock.notify_all()

    def unrecorded(self) -> list[Confirmed]:
        """What the next claim records (lib.state.records.ArchiveRecords.claim)."""
        with self._lock:
            return list(self._answers)

    def recorded(self, done: Sequence[Confirmed], count: int) -> None:
        """The claim carrying `done` committed, confirming `count` rows (the others were
        replaced meanwhile, or confirmed by the audit). Failures are told now, on the
        invocation's thread (its metrics are flushed with it)."""
        with self._lock:
            taken = set(done)
            self._answers = [a for a in self._answers if a not in taken]
            failures, self._failures = self._failures, []
        if count:
            logger.info("originals confirmed by S3's answer", originals=count)
            metrics.add_metric(name="OriginalsConfirmedLater", unit=MetricUnit.Count, value=count)
        for _, error in failures:
            # Never taken for absent: S3 may hold the object; the audit looks (a HEAD).
            logger.error("no answer for an original recorded unconfirmed", error=error)
            metrics.add_metric(name="OriginalsFailed", unit=MetricUnit.Count, value=1)

    def wait(self, record_id: int, timeout: float) -> bool:
        """Whether S3's answer (or failure) for `record_id`'s original is in within
        `timeout` (for tests and the bench: they wait for the event, not the clock)."""

        def arrived() -> bool:
            answers = {a.record_id for a in self._answers}
            return record_id in answers | {r for r, _ in self._failures}

        with self._lock:
            return self._lock.wait_for(arrived, timeout)
