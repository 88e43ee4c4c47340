"""The functions' long-lived parts, built once per Lambda container and reused warm.

Each builder imports what only it needs, so the sweeper's cold start never loads the
archive worker's HTTP stack (urllib3, the Lsky client).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast
from zoneinfo import ZoneInfo

from lib.platform import config
from lib.platform.after_response import AfterResponse, Job
from lib.platform.config import (
    Settings,
    SweeperSettings,
    load_settings,
    load_sweeper_settings,
)
from lib.platform.db import Database
from lib.platform.errors import ConfigError
from lib.platform.eventbridge import EventBus
from lib.platform.observability import metrics
from lib.platform.s3 import StagingBucket
from lib.platform.s3_originals import OriginalsBucket
from lib.platform.secrets import lsky_token
from lib.platform.sqs import Queue
from lib.state.lane_store import LaneStore
from lib.state.outbox import OutboxStore
from lib.state.records import ArchiveRecords
from lib.state.sweeps import SweepRecords

if TYPE_CHECKING:
    from lib.archive.originals import Originals
    from lib.archive.sweeper import Sweeper
    from lib.archive.worker import ArchiveWorker


def build_worker(settings: Settings) -> ArchiveWorker:
    # Deferred: see the module docstring.
    from lib.archive.conclusion import Concluder  # noqa: PLC0415
    from lib.archive.copier import Copier  # noqa: PLC0415
    from lib.archive.staging import Staging  # noqa: PLC0415
    from lib.archive.transfer import Transfer  # noqa: PLC0415
    from lib.archive.worker import ArchiveWorker  # noqa: PLC0415
    from lib.publish.publisher import Publisher  # noqa: PLC0415
    from lib.transfer.download import Downloader  # noqa: PLC0415
    from lib.transfer.lsky import LskyClient  # noqa: PLC0415

    def token(force: bool) -> str:
        return lsky_token(settings.lsky_token, settings.lsky_token_secret_arn, force=force)

    db = Database(settings.database, application_name="image-archive")
    downloader = Downloader(
        max_bytes=settings.max_image_bytes,
        allow_private_networks=settings.allow_private_networks,
    )
    staging = Staging(
        # boto3 is loaded only when the bucket is first used (lib.platform.s3).
        StagingBucket(settings.staging_bucket) if settings.staging_bucket else None,
        downloader=downloader,
        max_image_bytes=settings.max_image_bytes,
    )
    copier = Copier(
        downloader=downloader,
        lsky=LskyClient(
            base_url=settings.lsky_base_url,
            token=token,
            strategy_id=settings.lsky_strategy_id,
            album_id=settings.lsky_album_id,
        ),
        max_image_bytes=settings.max_image_bytes,
        host_timezone=ZoneInfo(settings.lsky_timezone),
    )
    originals = originals_in(settings.originals_bucket, settings.originals_storage_class)
    # Completion events (lib.publish): the statements write them only when published.
    bus = EventBus(settings.event_bus) if settings.event_bus else None
    records = ArchiveRecords(db, publish=bus is not None, paced=bool(settings.rate_limits))
    queue = Queue()
    if settings.rate_limits:
        # Paced, most messages of a backlog are held: the first hold is not late by the
        # client's making (its booking measured the upload from now).
        queue.connect()
    return ArchiveWorker(
        settings=settings,
        records=records,
        transfer=Transfer(
            settings=settings,
            copier=copier,
            staging=staging,
            lane=LaneStore(db),
            originals=originals,
        ),
        concluder=Concluder(
            records=records,
            queue=queue,
            staging=staging,
            dlq_url=settings.dlq_url,
        ),
        publisher=Publisher(bus),
    )


def originals_in(bucket: str | None, storage_class: str) -> Originals:
    """The originals bucket as the archive and the audit use it (None: off)."""
    from lib.archive.originals import Originals  # noqa: PLC0415 - the archive's and the audit's

    # Built without a client: boto3 is loaded by the first original's write or read.
    return Originals(
        OriginalsBucket(bucket, storage_class=storage_class) if bucket is not None else None
    )


def build_sweeper(settings: SweeperSettings) -> Sweeper:
    from lib.archive.sweeper import Sweeper  # noqa: PLC0415

    db = Database(settings.database, application_name="image-archive-sweeper")
    bus = EventBus(settings.event_bus) if settings.event_bus else None
    # Queue's short default timeouts keep a send failure inside the run's time budget.
    return Sweeper(
        settings=settings,
        records=SweepRecords(db, publish=bus is not None, paced=bool(settings.rate_limits)),
        events=None if bus is None else (OutboxStore(db), bus),
        lanes=LaneStore(db),
        queue=Queue(),
        probe=_probe(settings),
    )


def _probe(settings: SweeperSettings) -> Callable[[float], bool] | None:
    """Lsky's profile check for an account-paused lane, when the sweeper knows Lsky.
    urllib3 is imported only then: the sweeper's cold start stays light otherwise."""
    base_url = settings.lsky_base_url
    if base_url is None or not (settings.lsky_token or settings.lsky_token_secret_arn):
        return None
    from lib.transfer.lsky import LskyClient  # noqa: PLC0415

    def token(force: bool) -> str:
        return lsky_token(settings.lsky_token, settings.lsky_token_secret_arn, force=force)

    return LskyClient(base_url=base_url, token=token).account_healthy


@cache
def archive_settings() -> Settings:
    """The archive function's settings, read once a container (at init, in Lambda, for
    the extension): an invalid one is warned about once. Raises ConfigError."""
    return load_settings()


@cache
def archive_worker() -> ArchiveWorker:
    """The container's worker; raises ConfigError (naming the setting) when misconfigured."""
    return build_worker(archive_settings())


@cache
def after_response() -> AfterResponse | None:
    """The extension that publishes the archive function's completion events after its
    response: registered by the first call, at the handler's import (Lambda's init), in
    Lambda with events on. None elsewhere, or refused: the worker publishes before."""
    api = config.lambda_runtime_api()
    if api is None:
        return None
    try:
        events_on = archive_settings().event_bus is not None
    except ConfigError:  # the first invocation fails on it, naming the setting
        return None
    return AfterResponse.register(api) if events_on else None


Handler = TypeVar("Handler", bound=Callable[..., Any])


def publishing_after_response(handler: Handler) -> Handler:
    """The archive handler, handing each invocation's publication to the extension (also
    when it raised: the extension waits for it); the handler itself without one."""
    extension = after_response()
    if extension is None:
        return handler

    @wraps(handler)
    def handing_off(event: Any, context: Any) -> Any:
        try:
            return handler(event, context)
        finally:
            extension.hand_off(context.aws_request_id, _publication())

    return cast(Handler, handing_off)


def _publication() -> Job | None:
    """The events this invocation kept, published; their metrics flushed with them (the
    handler's were flushed before). None: no worker was built."""
    if not archive_worker.cache_info().currsize:
        return None
    worker = archive_worker()

    def publish(remaining_ms: int) -> None:
        worker.publish(remaining_ms)
        if metrics.metric_set:
            metrics.flush_metrics()

    return publish


@cache
def sweeper() -> Sweeper:
    """The container's sweeper; raises ConfigError (naming the setting) when misconfigured."""
    return build_sweeper(load_sweeper_settings())


# How each container part built above it (lib.audit.runtime's auditor) is forgotten:
# registered by the module that builds it, so this one imports nothing from above.
_forgetters: list[Callable[[], None]] = []


def on_reset(forget: Callable[[], None]) -> None:
    """Have `reset` forget a container part built elsewhere too."""
    _forgetters.append(forget)


def reset() -> None:
    """Forget the container's state (tests and local runs that change the environment)."""
    if archive_worker.cache_info().currsize:
        archive_worker().records.db.close()
    if sweeper.cache_info().currsize:
        sweeper().records.db.close()
    archive_settings.cache_clear()
    archive_worker.cache_clear()
    sweeper.cache_clear()
    for forget in _forgetters:
        forget()
