"""The archive function's long-lived parts, built once per Lambda container.

Connections (PostgreSQL, the urllib3 pools) live here so warm invocations reuse them.
"""

from __future__ import annotations

from functools import cache

from lib.archive.worker import ArchiveWorker
from lib.platform.config import Settings, load_settings
from lib.platform.db import Database
from lib.platform.secrets import lsky_token
from lib.platform.sqs import Queue
from lib.state.records import Records
from lib.transfer.download import Downloader
from lib.transfer.lsky import LskyClient


def build_worker(settings: Settings) -> ArchiveWorker:
    def token(force: bool) -> str:
        return lsky_token(settings.lsky_token, settings.lsky_token_secret_arn, force=force)

    return ArchiveWorker(
        settings=settings,
        records=Records(Database(settings.database, application_name="image-archive")),
        downloader=Downloader(
            max_bytes=settings.max_image_bytes,
            allow_private_networks=settings.allow_private_networks,
        ),
        lsky=LskyClient(
            base_url=settings.lsky_base_url,
            token=token,
            strategy_id=settings.lsky_strategy_id,
            album_id=settings.lsky_album_id,
        ),
        queue=Queue(),
    )


@cache
def archive_worker() -> ArchiveWorker:
    """The container's worker; raises ConfigError (naming the setting) when misconfigured."""
    return build_worker(load_settings())


def reset() -> None:
    """Forget the container's state (tests and local runs that change the environment)."""
    if archive_worker.cache_info().currsize:
        archive_worker().records.db.close()
    archive_worker.cache_clear()
