from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path

import pytest

from lib.platform.config import (
    DEFAULT_LOCK_TTL_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    FINISH_RESERVE_MS,
    QueueUrls,
    load_database_config,
    load_settings,
    load_sweeper_settings,
    lock_ttl_seconds,
    queue_urls,
)
from lib.platform.env_values import DEFAULT_RETRY_DELAYS
from lib.platform.errors import ConfigError

BASE = {
    "DATABASE_URL": "postgresql://u:p@127.0.0.1:5432/db",
    "LSKY_BASE_URL": "https://img.example.com/",
    "LSKY_TOKEN": "1|abc",
}


def test_defaults() -> None:
    settings = load_settings(BASE)
    assert settings.lsky_base_url == "https://img.example.com"
    assert settings.max_attempts == DEFAULT_MAX_ATTEMPTS == 3
    assert settings.retry_delays == DEFAULT_RETRY_DELAYS == (30, 120, 600)
    assert settings.lock_ttl_seconds == DEFAULT_LOCK_TTL_SECONDS
    assert settings.max_image_bytes == 52_428_800
    assert settings.lsky_strategy_id is None
    assert settings.allow_private_networks == ()


def test_values_are_read() -> None:
    settings = load_settings(
        {
            **BASE,
            "ARCHIVE_MAX_ATTEMPTS": "5",
            "ARCHIVE_RETRY_DELAYS": "10, 20,40",
            "ARCHIVE_LOCK_TTL_SECONDS": "200",
            "ARCHIVE_MAX_IMAGE_BYTES": "1000",
            "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128",
            "LSKY_STRATEGY_ID": "2",
            "LSKY_ALBUM_ID": "7",
            "ARCHIVE_DLQ_URL": "http://127.0.0.1:1/000/dlq",
        }
    )
    assert settings.max_attempts == 5
    assert settings.retry_delays == (10, 20, 40)
    assert settings.lock_ttl_seconds == 200
    assert settings.max_image_bytes == 1000
    assert settings.allow_private_networks == (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    assert (settings.lsky_strategy_id, settings.lsky_album_id) == (2, 7)
    assert settings.dlq_url == "http://127.0.0.1:1/000/dlq"


@pytest.mark.parametrize(
    ("name", "value", "attribute", "default"),
    [
        ("ARCHIVE_MAX_ATTEMPTS", "0", "max_attempts", 3),
        ("ARCHIVE_MAX_ATTEMPTS", "-2", "max_attempts", 3),
        ("ARCHIVE_MAX_ATTEMPTS", "three", "max_attempts", 3),
        ("ARCHIVE_LOCK_TTL_SECONDS", "1.5", "lock_ttl_seconds", DEFAULT_LOCK_TTL_SECONDS),
        ("ARCHIVE_MAX_IMAGE_BYTES", "", "max_image_bytes", 52_428_800),
        ("ARCHIVE_RETRY_DELAYS", "30,abc", "retry_delays", (30, 120, 600)),
        ("ARCHIVE_RETRY_DELAYS", "30,0", "retry_delays", (30, 120, 600)),
        ("ARCHIVE_RETRY_DELAYS", "50000", "retry_delays", (30, 120, 600)),
        ("LSKY_STRATEGY_ID", "x", "lsky_strategy_id", None),
        ("LSKY_STRATEGY_ID", "0", "lsky_strategy_id", None),
    ],
)
def test_invalid_numbers_fall_back_to_defaults(
    name: str,
    value: str,
    attribute: str,
    default: object,
    logs: Callable[[], list[dict[str, object]]],
) -> None:
    settings = load_settings({**BASE, name: value})
    assert getattr(settings, attribute) == default
    warnings = [str(line["message"]) for line in logs() if line["level"] == "WARNING"]
    if value:  # the warning names the variable and the value it rejected
        [warning] = warnings
        assert f"{name}={value!r}," in warning
    else:  # empty is unset: the default, silently
        assert warnings == []


@pytest.mark.parametrize(
    "value", ["127.0.0.0/8,10.0.0.300", "10.0.0.0/33", "127.0.0.0/8,", "10.0.0.0/08", "::g/64"]
)
def test_an_invalid_network_stops_the_start_naming_its_variable(value: str) -> None:
    # Skipping the part would run the guard with a list the operator did not write.
    with pytest.raises(ConfigError, match="ARCHIVE_ALLOW_PRIVATE_NETWORKS: part ") as raised:
        load_settings({**BASE, "ARCHIVE_ALLOW_PRIVATE_NETWORKS": value})
    assert value not in str(raised.value)  # a ConfigError names, never quotes


def test_networks_may_be_spaced_and_written_without_a_prefix() -> None:
    settings = load_settings({**BASE, "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8, 10.0.0.1"})
    assert settings.allow_private_networks == (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("10.0.0.1/32"),
    )


@pytest.mark.parametrize(
    ("overrides", "ttl", "timeout"),
    [
        ({"ARCHIVE_LOCK_TTL_SECONDS": "121"}, 121, 120),
        ({"ARCHIVE_LOCK_TTL_SECONDS": "135"}, 135, 120),  # equal is not enough
        ({"ARCHIVE_FUNCTION_TIMEOUT_SECONDS": "170"}, DEFAULT_LOCK_TTL_SECONDS, 170),
        (
            {"ARCHIVE_LOCK_TTL_SECONDS": "600", "ARCHIVE_FUNCTION_TIMEOUT_SECONDS": "590"},
            600,
            590,
        ),
    ],
)
@pytest.mark.parametrize("load", [load_settings, load_sweeper_settings])
def test_a_lock_ttl_that_does_not_outlast_an_attempt_is_warned_about(
    overrides: dict[str, str],
    ttl: int,
    timeout: int,
    load: Callable[[dict[str, str]], object],
    logs: Callable[[], list[dict[str, object]]],
) -> None:
    settings = load({**BASE, "ARCHIVE_QUEUE_URL": "https://sqs.invalid/1/q", **overrides})
    assert settings.lock_ttl_seconds == ttl  # a warning, not a change
    [warning] = [str(line["message"]) for line in logs() if line["level"] == "WARNING"]
    assert f"ARCHIVE_LOCK_TTL_SECONDS={ttl} " in warning
    assert f"ARCHIVE_FUNCTION_TIMEOUT_SECONDS={timeout} " in warning
    assert f"{FINISH_RESERVE_MS // 1000} s finish reserve" in warning


@pytest.mark.parametrize(
    ("overrides", "ttl", "timeout"),
    [
        ({"ARCHIVE_LOCK_TTL_SECONDS": "120"}, 120, 120),
        ({"ARCHIVE_LOCK_TTL_SECONDS": "2"}, 2, 120),
        ({"ARCHIVE_FUNCTION_TIMEOUT_SECONDS": "300"}, DEFAULT_LOCK_TTL_SECONDS, 300),
    ],
)
@pytest.mark.parametrize("load", [load_settings, load_sweeper_settings])
def test_a_lock_ttl_an_attempt_can_outlive_is_refused(
    overrides: dict[str, str], ttl: int, timeout: int, load: Callable[[dict[str, str]], object]
) -> None:
    # Another attempt would take the row over and spend an attempt of the record's: a
    # ConfigError gives every message back whole instead.
    with pytest.raises(ConfigError) as refused:
        load({**BASE, "ARCHIVE_QUEUE_URL": "https://sqs.invalid/1/q", **overrides})
    assert f"ARCHIVE_LOCK_TTL_SECONDS={ttl} must exceed" in str(refused.value)
    assert f"ARCHIVE_FUNCTION_TIMEOUT_SECONDS={timeout}:" in str(refused.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the template's numbers: 180 > 120 + 15
        {"ARCHIVE_LOCK_TTL_SECONDS": "136"},
        {"ARCHIVE_LOCK_TTL_SECONDS": "400", "ARCHIVE_FUNCTION_TIMEOUT_SECONDS": "300"},
    ],
)
def test_a_lock_ttl_that_outlasts_an_attempt_is_quiet(
    overrides: dict[str, str], logs: Callable[[], list[dict[str, object]]]
) -> None:
    load_settings({**BASE, **overrides})
    load_sweeper_settings({**BASE, "ARCHIVE_QUEUE_URL": "https://sqs.invalid/1/q", **overrides})
    assert [line for line in logs() if line["level"] == "WARNING"] == []


def test_a_typo_in_the_function_timeout_is_named_and_the_default_used(
    logs: Callable[[], list[dict[str, object]]],
) -> None:
    load_settings({**BASE, "ARCHIVE_FUNCTION_TIMEOUT_SECONDS": "12O"})
    [warning] = [str(line["message"]) for line in logs() if line["level"] == "WARNING"]
    assert warning == "invalid ARCHIVE_FUNCTION_TIMEOUT_SECONDS='12O', using default 120"


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ("LSKY_BASE_URL", "LSKY_BASE_URL"),
        ("DATABASE_URL", "DATABASE_URL or DB_SECRET_ARN"),
        ("LSKY_TOKEN", "LSKY_TOKEN or LSKY_TOKEN_SECRET_ARN"),
    ],
)
def test_missing_required_setting_is_one_clear_error(missing: str, named: str) -> None:
    env = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError, match=f"missing required setting: (set )?{named}"):
        load_settings(env)


def test_secret_arns_satisfy_requirements() -> None:
    settings = load_settings(
        {
            "LSKY_BASE_URL": "https://img.example.com",
            "DB_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:db",
            "LSKY_TOKEN_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:lsky",
            "DATABASE_URL": "",
        }
    )
    assert settings.database.secret_arn is not None
    assert settings.database.url is None


def test_bad_sslmode_and_base_url_are_clear() -> None:
    with pytest.raises(ConfigError, match="DB_SSLMODE"):
        load_settings({**BASE, "DB_SSLMODE": "sometimes"})
    with pytest.raises(ConfigError, match="LSKY_BASE_URL"):
        load_settings({**BASE, "LSKY_BASE_URL": "img.example.com"})


def test_repr_hides_credentials() -> None:
    settings = load_settings(BASE)
    assert "abc" not in repr(settings)
    assert ":p@" not in repr(settings)


def test_queue_urls_are_optional_and_blank_means_unset() -> None:
    assert queue_urls({}) == QueueUrls(queue=None, dlq=None)
    assert queue_urls({"ARCHIVE_QUEUE_URL": " https://q ", "ARCHIVE_DLQ_URL": " "}) == QueueUrls(
        queue="https://q", dlq=None
    )


def test_lock_ttl_alone_falls_back_like_the_functions_settings() -> None:
    assert lock_ttl_seconds({}) == DEFAULT_LOCK_TTL_SECONDS
    assert lock_ttl_seconds({"ARCHIVE_LOCK_TTL_SECONDS": "0"}) == DEFAULT_LOCK_TTL_SECONDS
    assert lock_ttl_seconds({"ARCHIVE_LOCK_TTL_SECONDS": "240"}) == 240


def test_db_ssl_root_cert_is_read_for_verify_full(
    tmp_path: Path, logs: Callable[[], list[dict[str, object]]]
) -> None:
    bundle = tmp_path / "global-bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    config = load_database_config(
        {**BASE, "DB_SSLMODE": "verify-full", "DB_SSL_ROOT_CERT": f" {bundle} "}
    )
    assert config.ssl_root_cert == str(bundle)
    assert load_database_config(BASE).ssl_root_cert is None
    assert load_database_config({**BASE, "DB_SSL_ROOT_CERT": ""}).ssl_root_cert is None
    assert [line for line in logs() if line["level"] == "WARNING"] == []


def test_a_missing_db_ssl_root_cert_file_is_a_clear_startup_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"
    env = {**BASE, "DB_SSLMODE": "verify-full", "DB_SSL_ROOT_CERT": str(missing)}
    with pytest.raises(ConfigError, match=f"DB_SSL_ROOT_CERT: no such file: {missing}"):
        load_database_config(env)


@pytest.mark.parametrize("sslmode", [None, "require", "prefer"])
def test_db_ssl_root_cert_without_verify_full_is_warned_about(
    sslmode: str | None, tmp_path: Path, logs: Callable[[], list[dict[str, object]]]
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    env = {**BASE, "DB_SSL_ROOT_CERT": str(bundle)}
    if sslmode:
        env["DB_SSLMODE"] = sslmode
    load_database_config(env)
    [warning] = [str(line["message"]) for line in logs() if line["level"] == "WARNING"]
    assert f"DB_SSL_ROOT_CERT={str(bundle)!r}" in warning
    assert f"DB_SSLMODE={sslmode or 'unset'}" in warning


def test_the_longest_retry_after_is_read_by_both_functions(
    logs: Callable[[], list[dict[str, object]]],
) -> None:
    sweeper_env = {**BASE, "ARCHIVE_QUEUE_URL": "https://sqs.invalid/1/q"}
    assert load_settings(BASE).max_retry_after_seconds == 3600
    assert load_sweeper_settings(sweeper_env).max_retry_after_seconds == 3600
    env = {"ARCHIVE_MAX_RETRY_AFTER_SECONDS": "900"}
    assert load_settings({**BASE, **env}).max_retry_after_seconds == 900
    assert load_sweeper_settings({**sweeper_env, **env}).max_retry_after_seconds == 900
    # More than SQS can hold a message for: the default, and a warning naming it.
    too_long = {"ARCHIVE_MAX_RETRY_AFTER_SECONDS": "43201"}
    assert load_settings({**BASE, **too_long}).max_retry_after_seconds == 3600
    [warning] = [str(line["message"]) for line in logs() if line["level"] == "WARNING"]
    assert warning.startswith("invalid ARCHIVE_MAX_RETRY_AFTER_SECONDS='43201', using default")
