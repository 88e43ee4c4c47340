"""One queue message, start to finish: parse, claim, download, upload, record.

Every path ends in exactly one of: acknowledged (archived, failed for good, duplicate,
malformed and parked in the DLQ) or redelivered (retry after a delay, or could not be
concluded). Redelivery is the batch-item failure the handler reports to Lambda.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

import pg8000.exceptions
from aws_lambda_powertools.metrics import MetricUnit

from lib.archive import retry as policy
from lib.archive.budget import download_needs, time_left, upload_needs
from lib.archive.message import MalformedMessage, parse_record_id
from lib.archive.naming import hosted_file_name
from lib.platform.config import FINISH_RESERVE_MS, Settings
from lib.platform.db import describe
from lib.platform.errors import ConfigError, DatabaseUnavailable, ServiceError
from lib.platform.observability import log_unexpected, logger, metrics
from lib.platform.sqs import Queue
from lib.state.claim import ClaimSnapshot, Task, early_delay, skip_reason
from lib.state.records import ArchiveRecords
from lib.transfer.download import Downloader, ImageStream, spool
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.imagetype import ImageType
from lib.transfer.lsky import HostedImage, LskyClient

# An attempt needs at least this much of the invocation left to be worth starting;
# with less, the row is given back without spending an attempt.
MIN_ATTEMPT_MS = 25_000
# How soon a message comes back after the invocation ran out of time.
NO_TIME_RETRY_SECONDS = 5


class Outcome(enum.StrEnum):
    ARCHIVED = "archived"
    RETRY = "retry"
    FAILED = "failed"
    DUPLICATE = "duplicate"
    EARLY = "early"  # a copy that came during the row's backoff: held until due
    MALFORMED = "malformed"  # moved to the DLQ with its reason
    # Malformed, but the DLQ send failed: redelivered at once, so the redrive policy parks it.
    MALFORMED_LEFT = "malformed_left"
    RELEASED = "released"  # given back unspent: not enough time left
    UNCONCLUDED = "unconcluded"  # database unreachable or a bug: SQS redelivers, then the DLQ

    @property
    def redelivers(self) -> bool:
        """The one ack-or-redeliver rule: SQS delivers these again after the visibility
        the worker set; every other outcome is acknowledged (deleted)."""
        return self in _REDELIVERED


_REDELIVERED = frozenset(
    {Outcome.RETRY, Outcome.EARLY, Outcome.RELEASED, Outcome.UNCONCLUDED, Outcome.MALFORMED_LEFT}
)


class Redelivered(ServiceError):
    """Raised for Powertools' batch processor: report the message as a batch item failure."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.outcome}: {result.detail}")
        self.result = result


@dataclass(frozen=True)
class Message:
    message_id: str
    body: str
    receipt_handle: str
    queue_arn: str
    receive_count: int = 1


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    record_id: int | None = None
    detail: str = ""


class ArchiveWorker:
    def __init__(
        self,
        *,
        settings: Settings,
        records: ArchiveRecords,
        downloader: Downloader,
        lsky: LskyClient,
        queue: Queue,
    ) -> None:
        self.settings = settings
        self.records = records
        self.downloader = downloader
        self.lsky = lsky
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
        )
        task = claim.task
        if task is None:
            return self._skip(message, record_id, claim.snapshot)
        logger.append_keys(attempt=task.attempt)

        deadline = time.monotonic() + (remaining_ms() - FINISH_RESERVE_MS) / 1000
        logger.info("archive started", max_attempts=self.settings.max_attempts)
        try:
            hosted, size = self._transfer(task, deadline)
        except ArchiveFailure as error:
            if error.failure.kind is Kind.NO_TIME:
                return self._release(message, task, owner, error.failure.message)
            return self._failed_attempt(message, task, owner, error.failure)
        except ConfigError as error:
            # A bad secret value (fetched lazily); its message names the setting, not the value.
            failure = Failure(Stage.UPLOAD, Kind.BAD_RESPONSE, f"configuration: {error}")
            return self._failed_attempt(message, task, owner, failure)
        except Exception as error:  # noqa: BLE001 - a bug must spend an attempt, not loop forever
            log_unexpected("unexpected error during archive", error)
            failure = Failure(
                Stage.DOWNLOAD, Kind.BAD_RESPONSE, f"internal error ({type(error).__name__})"
            )
            return self._failed_attempt(message, task, owner, failure)

        held_lock = self.records.succeed(
            task,
            owner=owner,
            hosted_url=hosted.url,
            mime_type=hosted.mime_type,
            response=hosted.data,
        )
        if held_lock is None:
            logger.warning("archived, but the row had already succeeded elsewhere")
        elif not held_lock:
            logger.warning("archived after the lock had passed on; recorded anyway")
        logger.info(
            "archive succeeded", outcome=Outcome.ARCHIVED, bytes=size, mime_type=hosted.mime_type
        )
        metrics.add_metric(name="Archived", unit=MetricUnit.Count, value=1)
        metrics.add_metric(name="ImageBytes", unit=MetricUnit.Bytes, value=size)
        return Result(Outcome.ARCHIVED, task.record_id, hosted.url)

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
        reason = skip_reason(snapshot)
        logger.info("message skipped", outcome=Outcome.DUPLICATE, reason=reason)
        metrics.add_metric(name="Duplicate", unit=MetricUnit.Count, value=1)
        return Result(Outcome.DUPLICATE, record_id, reason)

    def _transfer(self, task: Task, deadline: float) -> tuple[HostedImage, int]:
        """Download and upload, by `deadline`. Raises ArchiveFailure; Kind.NO_TIME means
        nothing that could not finish was started, so the attempt is given back.

        With a Content-Length the upload starts as the download does: the multipart body
        is generated from the download as it arrives, so neither memory nor /tmp holds
        the image and the two transfers overlap. Without one the body's length is only
        known at its end, so the image is spooled first (memory up to 1 MiB, then /tmp).
        """
        if time_left(deadline) < download_needs(0) + upload_needs(0):
            raise fail(Stage.DOWNLOAD, Kind.NO_TIME, "not enough time left to start a transfer")
        with contextlib.ExitStack() as streams:
            stream = streams.enter_context(
                self.downloader.open(task.image_url, deadline=deadline - upload_needs(0))
            )
            declared = stream.declared_length
            # The sequential estimate even when streaming: pessimistic on purpose (a
            # transfer given back unspent costs a few seconds; one cut off costs an attempt).
            size = declared if declared is not None else self.settings.max_image_bytes
            if time_left(deadline) < download_needs(declared or 0) + upload_needs(size):
                raise fail(
                    Stage.DOWNLOAD,
                    Kind.NO_TIME,
                    f"not enough time left to transfer a {declared}-byte image",
                )
            filename = self._filename(task, stream.image_type)
            if declared is not None:
                return self._stream(
                    task, streams, stream, size=declared, filename=filename, deadline=deadline
                )
            # The spooled body must end early enough to leave the upload its share.
            stream.set_deadline(deadline - upload_needs(size))
            image = spool(stream)
        try:
            if time_left(deadline) < upload_needs(image.size):
                raise fail(Stage.UPLOAD, Kind.NO_TIME, "not enough time left to upload")
            return self.lsky.upload(image, filename=filename, deadline=deadline), image.size
        finally:
            image.close()

    def _stream(
        self,
        task: Task,
        streams: contextlib.ExitStack,
        stream: ImageStream,
        *,
        size: int,
        filename: str,
        deadline: float,
    ) -> tuple[HostedImage, int]:
        """Upload straight from the download (`size`: its Content-Length). The body must
        end in time for Lsky to store the file and answer; a body that breaks off aborts
        the upload with it."""
        stream.set_deadline(deadline - upload_needs(0))

        def reopen() -> ImageStream:
            # Only after a 401 with a rotated token: the first body is spent, so fetch the
            # image again (Lsky stored nothing), if there is still time for both ways.
            if time_left(deadline) < download_needs(size) + upload_needs(size):
                raise fail(Stage.UPLOAD, Kind.NO_TIME, "not enough time left to upload again")
            return streams.enter_context(
                self.downloader.open(task.image_url, deadline=deadline - upload_needs(0))
            )

        hosted = self.lsky.upload_stream(
            stream,
            size=size,
            mime_type=stream.image_type.mime_type,
            filename=filename,
            deadline=deadline,
            reopen=reopen,
        )
        return hosted, size

    @staticmethod
    def _filename(task: Task, image_type: ImageType) -> str:
        return hosted_file_name(
            username=task.username,
            user_id=task.user_id,
            record_id=task.record_id,
            started_at=task.started_at,
            extension=image_type.extension,
        )

    def _failed_attempt(self, message: Message, task: Task, owner: str, failure: Failure) -> Result:
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
            self.records.fail(task, owner=owner, error=error)
            logger.error(
                "archive failed",
                outcome=Outcome.FAILED,
                error_class=decision.error_class,
                error=error,
            )
            metrics.add_metric(name="Failed", unit=MetricUnit.Count, value=1)
            return Result(Outcome.FAILED, task.record_id, error)
        self.records.retry(task, owner=owner, error=error, delay_seconds=decision.delay_seconds)
        self._delay(message, decision.delay_seconds)
        logger.warning(
            "archive attempt failed, will retry",
            outcome=Outcome.RETRY,
            error_class=decision.error_class,
            error=error,
            retry_in_seconds=decision.delay_seconds,
        )
        metrics.add_metric(name="Retried", unit=MetricUnit.Count, value=1)
        return Result(Outcome.RETRY, task.record_id, error)

    def _release(self, message: Message, task: Task, owner: str, reason: str) -> Result:
        # Nothing that could not finish was started: the claim's attempt is handed back.
        self.records.release(task, owner=owner, delay_seconds=NO_TIME_RETRY_SECONDS)
        self._delay(message, NO_TIME_RETRY_SECONDS)
        logger.warning(
            "not enough time left for an attempt; given back",
            outcome=Outcome.RELEASED,
            reason=reason,
            retry_in_seconds=NO_TIME_RETRY_SECONDS,
        )
        metrics.add_metric(name="Released", unit=MetricUnit.Count, value=1)
        return Result(Outcome.RELEASED, task.record_id, "not enough time left")

    def _unconcluded(self, message: Message, record_id: int, what: str, error: str) -> Result:
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
        )
        metrics.add_metric(name="Unconcluded", unit=MetricUnit.Count, value=1)
        return Result(Outcome.UNCONCLUDED, record_id, error)

    def _malformed(self, message: Message, reason: str) -> Result:
        preview = message.body[:120] if message.body else ""
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
