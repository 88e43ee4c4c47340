from __future__ import annotations

from collections.abc import Callable

import pytest

from lib.platform.config import (
    DEFAULT_LOCK_TTL_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    load_sweeper_settings,
)
from lib.platform.errors import ConfigError

BASE = {
    "DATABASE_URL": "postgresql://u:p@127.0.0.1:5432/db",
    "ARCHIVE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/archive",
}


def test_defaults() -> None:
    settings = load_sweeper_settings(BASE)
    assert settings.queue_url == BASE["ARCHIVE_QUEUE_URL"]
    assert settings.grace_seconds == 300
    assert settings.requeue_interval_seconds == 900
    assert settings.max_rows == 5000
    assert settings.max_attempts == DEFAULT_MAX_ATTEMPTS
    assert settings.lock_ttl_seconds == DEFAULT_LOCK_TTL_SECONDS
    assert settings.database.url == BASE["DATABASE_URL"]


def test_values_are_read() -> None:
    settings = load_sweeper_settings(
        {
            **BASE,
            "ARCHIVE_SWEEP_GRACE_SECONDS": "60",
            "ARCHIVE_REQUEUE_INTERVAL_SECONDS": "120",
            "ARCHIVE_SWEEP_MAX_ROWS": "250",
            "ARCHIVE_MAX_ATTEMPTS": "5",
            "ARCHIVE_LOCK_TTL_SECONDS": "400",
        }
    )
    assert (settings.grace_seconds, settings.requeue_interval_seconds, settings.max_rows) == (
        60,
        120,
        250,
    )
    assert (settings.max_attempts, settings.lock_ttl_seconds) == (5, 400)


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5"])
def test_invalid_numbers_fall_back_with_a_warning(
    value: str, logs: Callable[[], list[dict[str, object]]]
) -> None:
    settings = load_sweeper_settings({**BASE, "ARCHIVE_SWEEP_MAX_ROWS": value})
    assert settings.max_rows == 5000
    [warning] = [line for line in logs() if line["level"] == "WARNING"]
    assert f"ARCHIVE_SWEEP_MAX_ROWS={value!r}" in str(warning["message"])


def test_blank_values_mean_default() -> None:
    assert load_sweeper_settings({**BASE, "ARCHIVE_SWEEP_GRACE_SECONDS": " "}).grace_seconds == 300


def test_queue_url_is_required() -> None:
    with pytest.raises(ConfigError, match="ARCHIVE_QUEUE_URL"):
        load_sweeper_settings({"DATABASE_URL": BASE["DATABASE_URL"]})
    with pytest.raises(ConfigError, match="ARCHIVE_QUEUE_URL"):
        load_sweeper_settings({**BASE, "ARCHIVE_QUEUE_URL": ""})


def test_an_arn_is_not_a_queue_url() -> None:
    with pytest.raises(ConfigError, match="not an ARN"):
        load_sweeper_settings(
            {**BASE, "ARCHIVE_QUEUE_URL": "arn:aws:sqs:us-east-1:123456789012:archive"}
        )


def test_database_is_required() -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL or DB_SECRET_ARN"):
        load_sweeper_settings({"ARCHIVE_QUEUE_URL": BASE["ARCHIVE_QUEUE_URL"]})


def test_lsky_settings_are_not_needed() -> None:
    # The sweeper never talks to Lsky: its function has no LSKY_* variables.
    load_sweeper_settings(BASE)
