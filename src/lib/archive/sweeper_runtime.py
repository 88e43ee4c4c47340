"""The sweeper function's long-lived parts, built once per Lambda container.

Kept apart from lib.archive.runtime so the sweeper's cold start does not import the
archive worker's HTTP stack (urllib3, the Lsky client).
"""

from __future__ import annotations

from functools import cache

from lib.archive.sweeper import Sweeper, SweepStore
from lib.platform.config import SweeperSettings, load_sweeper_settings
from lib.platform.db import Database
from lib.platform.sqs import Queue


def build_sweeper(settings: SweeperSettings) -> Sweeper:
    return Sweeper(
        settings=settings,
        store=SweepStore(Database(settings.database, application_name="image-archive-sweeper")),
        # Queue's short default timeouts keep a send failure inside the run's time
        # budget (see sweep_policy.SEND_RESERVE_MS).
        queue=Queue(),
    )


@cache
def sweeper() -> Sweeper:
    """The container's sweeper; raises ConfigError (naming the setting) when misconfigured."""
    return build_sweeper(load_sweeper_settings())


def reset() -> None:
    """Forget the container's state (tests and local runs that change the environment)."""
    if sweeper.cache_info().currsize:
        sweeper().store.db.close()
    sweeper.cache_clear()
