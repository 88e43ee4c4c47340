"""Settings read from the environment (the contract in DESIGN.md).

Numbers follow the seed worker: an invalid value (zero, negative, not a number)
falls back to its default with a warning, so a typo in a console never stops
archiving. A missing *required* value is one clear ConfigError naming it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from lib.platform.errors import ConfigError
from lib.platform.sqs import MAX_VISIBILITY_SECONDS

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_RETRY_DELAYS = (30, 120, 600)
# The archive function's timeout (120 s in template.yaml) plus a margin; the queue's
# visibility timeout (720 s) is longer, so a crashed attempt's lock has expired by
# the time its message comes back.
DEFAULT_LOCK_TTL_SECONDS = 180
# Lambda does not tell a function its own timeout through the environment (only sam
# local sets AWS_LAMBDA_FUNCTION_TIMEOUT), so the template passes ArchiveFunction's.
DEFAULT_FUNCTION_TIMEOUT_SECONDS = 120
# The archive worker stops transfers this long before Lambda's hard timeout, to leave
# time to record the outcome (lib.archive.worker reads it from here).
FINISH_RESERVE_MS = 15_000
DEFAULT_MAX_IMAGE_BYTES = 50 * 1024 * 1024
# Sweeper: a PENDING row is re-sent once its due time is this far past (the queue
# normally delivers within seconds of it)...
DEFAULT_SWEEP_GRACE_SECONDS = 300
# ...and not more often than this per row, so a slow consumer is not flooded.
DEFAULT_REQUEUE_INTERVAL_SECONDS = 900
DEFAULT_SWEEP_MAX_ROWS = 5000
# A Retry-After from Lsky or a proxy in front of it pauses every upload: at most an hour
# unless the operator says otherwise (1 .. 43200).
DEFAULT_MAX_RETRY_AFTER_SECONDS = 3600
DEFAULT_LSKY_TIMEZONE = "Asia/Shanghai"  # Lsky Pro's config/app.php: 'timezone' => 'PRC'


@dataclass(frozen=True)
class DatabaseConfig:
    """Where the connection comes from: a URL (local, tests) or a Secrets Manager secret."""

    url: str | None = field(default=None, repr=False)
    secret_arn: str | None = None
    sslmode: str | None = None
    # A CA bundle file for verify-full (RDS: global-bundle.pem); None: the system's CAs.
    ssl_root_cert: str | None = None


@dataclass(frozen=True)
class Settings:
    lsky_base_url: str
    database: DatabaseConfig
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_delays: tuple[int, ...] = DEFAULT_RETRY_DELAYS
    lock_ttl_seconds: int = DEFAULT_LOCK_TTL_SECONDS
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    allow_private_networks: tuple[IPNetwork, ...] = ()
    lsky_strategy_id: int | None = None
    lsky_album_id: int | None = None
    dlq_url: str | None = None
    # Resolved lazily by lib.platform.secrets (a secret is fetched only when needed).
    lsky_token: str | None = field(default=None, repr=False)
    lsky_token_secret_arn: str | None = None
    # Proactive pacing (LSKY_RATE_LIMITS): (window seconds, uploads) pairs; empty = off.
    rate_limits: tuple[tuple[int, int], ...] = ()
    # ARCHIVE_STAGING_BUCKET: where images are captured while the host cannot take them
    # (lib.archive.staging); None = no staging.
    staging_bucket: str | None = None
    # ARCHIVE_MAX_RETRY_AFTER_SECONDS: the longest pause a Retry-After may impose.
    max_retry_after_seconds: int = DEFAULT_MAX_RETRY_AFTER_SECONDS
    # LSKY_TIMEZONE: the zone Lsky lists an image's `date` in (its config/app.php).
    lsky_timezone: str = DEFAULT_LSKY_TIMEZONE


@dataclass(frozen=True)
class SweeperSettings:
    database: DatabaseConfig
    queue_url: str
    grace_seconds: int = DEFAULT_SWEEP_GRACE_SECONDS
    requeue_interval_seconds: int = DEFAULT_REQUEUE_INTERVAL_SECONDS
    max_rows: int = DEFAULT_SWEEP_MAX_ROWS
    # Shared with the archive function: the sweeper must agree with its claim on
    # when a lock has expired and on when the attempts are used up.
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lock_ttl_seconds: int = DEFAULT_LOCK_TTL_SECONDS
    # Optional: with them the sweeper probes an account-paused lane (GET /api/v1/profile).
    lsky_base_url: str | None = None
    lsky_token: str | None = field(default=None, repr=False)
    lsky_token_secret_arn: str | None = None


def _warn(message: str, *args: object) -> None:
    # The standard logger of the service's name: the one Powertools' Logger formats
    # (lib.platform.observability), without importing it back into this module.
    logging.getLogger(service_name()).warning(message, *args)


def service_name(env: Mapping[str, str] | None = None) -> str:
    return _text(os.environ if env is None else env, "POWERTOOLS_SERVICE_NAME") or "image-archive"


def metrics_namespace(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return _text(env, "POWERTOOLS_METRICS_NAMESPACE") or "ImageArchive"


def tracing_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Tracing is opt-in (POWERTOOLS_TRACE_DISABLED=false): the X-Ray SDK costs cold start."""
    env = os.environ if env is None else env
    return (_text(env, "POWERTOOLS_TRACE_DISABLED") or "true").lower() in ("0", "false")


def _text(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, with empty and blank treated as unset (templates pass '')."""
    value = env.get(name, "").strip()
    return value or None


def positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _text(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value > 0:
        return value
    _warn("invalid %s=%r, using default %s", name, raw, default)
    return default


def bounded_int(env: Mapping[str, str], name: str, default: int, *, maximum: int) -> int:
    """A positive int (the contract's fallback for zero, negative or not a number); one
    above `maximum` is refused at start-up, naming the variable."""
    value = positive_int(env, name, default)
    if value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}")
    return value


def time_zone(env: Mapping[str, str], name: str) -> str:
    """An IANA zone name (Asia/Shanghai, UTC); an unknown one fails at start-up."""
    raw = _text(env, name) or DEFAULT_LSKY_TIMEZONE
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ConfigError(f"{name} is not a time zone name (e.g. Asia/Shanghai)") from error
    return raw


def optional_id(env: Mapping[str, str], name: str) -> int | None:
    raw = _text(env, name)
    if raw is None:
        return None
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    _warn("invalid %s=%r, ignoring it", name, raw)
    return None


def retry_delays(env: Mapping[str, str], name: str = "ARCHIVE_RETRY_DELAYS") -> tuple[int, ...]:
    raw = _text(env, name)
    if raw is None:
        return DEFAULT_RETRY_DELAYS
    try:
        delays = tuple(int(part) for part in raw.split(","))
    except ValueError:
        delays = ()
    # SQS caps a visibility timeout at 12 hours.
    if delays and all(0 < delay <= MAX_VISIBILITY_SECONDS for delay in delays):
        return delays
    _warn("invalid %s=%r, using default %s", name, raw, DEFAULT_RETRY_DELAYS)
    return DEFAULT_RETRY_DELAYS


def networks(env: Mapping[str, str], name: str) -> tuple[IPNetwork, ...]:
    raw = _text(env, name)
    if raw is None:
        return ()
    parsed: list[IPNetwork] = []
    for part in raw.split(","):
        try:
            parsed.append(ipaddress.ip_network(part.strip(), strict=False))
        except ValueError:
            _warn("invalid network %r in %s, ignoring it", part.strip(), name)
    return tuple(parsed)


def check_lock_ttl(env: Mapping[str, str], lock_ttl: int) -> None:
    """Warn when a lock can expire while its attempt may still be running: the sweeper
    would then send the row again and a second invocation upload the image twice."""
    timeout = positive_int(
        env, "ARCHIVE_FUNCTION_TIMEOUT_SECONDS", DEFAULT_FUNCTION_TIMEOUT_SECONDS
    )
    reserve = FINISH_RESERVE_MS // 1000
    if lock_ttl <= timeout + reserve:
        _warn(
            "ARCHIVE_LOCK_TTL_SECONDS=%s does not exceed ARCHIVE_FUNCTION_TIMEOUT_SECONDS=%s "
            "plus the %s s finish reserve: a lock can expire while its attempt still runs",
            lock_ttl,
            timeout,
            reserve,
        )


def require_one_of(env: Mapping[str, str], *names: str) -> None:
    if not any(_text(env, name) for name in names):
        raise ConfigError(f"missing required setting: set {' or '.join(names)}")


RATE_WINDOWS = {
    "second": 1,
    "minute": 60,
    "hour": 3_600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,
}


def rate_limits(
    env: Mapping[str, str], name: str = "LSKY_RATE_LIMITS"
) -> tuple[tuple[int, int], ...]:
    """ "20/minute,100/hour" -> ((60, 20), (3600, 100)); "10/30 seconds" is 10 per 30 s.
    A bad part is skipped with a warning naming it."""
    raw = _text(env, name)
    if raw is None:
        return ()
    limits: list[tuple[int, int]] = []
    for part in raw.split(","):
        match = _RATE.fullmatch(part.strip().lower())
        if match and int(match.group(1)) > 0 and int(match.group(2) or 1) > 0:
            seconds = int(match.group(2) or 1) * RATE_WINDOWS[match.group(3)]
            limits.append((seconds, int(match.group(1))))
        else:
            _warn("invalid part %r of %s=%r, ignoring it", part.strip(), name, raw)
    return tuple(sorted(limits))


_RATE = re.compile(r"(\d+)\s*/\s*(\d+)?\s*(second|minute|hour|day|week|month)s?")


# S3's rules for a bucket name (the plain name, not an ARN or a URL).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def staging_bucket(env: Mapping[str, str], name: str = "ARCHIVE_STAGING_BUCKET") -> str | None:
    """The staging bucket's name; a value that cannot be one turns staging off with a
    warning (archiving goes on as without staging) rather than stopping every archive."""
    raw = _text(env, name)
    if raw is None:
        return None
    if _BUCKET_NAME.match(raw):
        return raw
    _warn("invalid %s=%r (a bucket name, not an ARN or URL): staging is off", name, raw)
    return None


SSL_MODES = ("disable", "prefer", "require", "verify-full")


def load_database_config(env: Mapping[str, str] | None = None) -> DatabaseConfig:
    env = os.environ if env is None else env
    require_one_of(env, "DATABASE_URL", "DB_SECRET_ARN")
    sslmode = _text(env, "DB_SSLMODE")
    if sslmode is not None and sslmode not in SSL_MODES:
        raise ConfigError(f"DB_SSLMODE must be one of {', '.join(SSL_MODES)}")
    root_cert = _text(env, "DB_SSL_ROOT_CERT")
    if root_cert is not None:
        # Checked here: at connect time a missing file would look like a lost connection.
        if not Path(root_cert).is_file():
            raise ConfigError(f"DB_SSL_ROOT_CERT: no such file: {root_cert}")
        if sslmode != "verify-full":
            _warn(
                "DB_SSL_ROOT_CERT=%r is used only with DB_SSLMODE=verify-full (DB_SSLMODE=%s)",
                root_cert,
                sslmode or "unset",
            )
    return DatabaseConfig(
        url=_text(env, "DATABASE_URL"),
        secret_arn=_text(env, "DB_SECRET_ARN"),
        sslmode=sslmode,
        ssl_root_cert=root_cert,
    )


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for the archive function; raises ConfigError naming what is missing."""
    env = os.environ if env is None else env
    base_url = _text(env, "LSKY_BASE_URL")
    if base_url is None:
        raise ConfigError("missing required setting: LSKY_BASE_URL")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError("LSKY_BASE_URL must start with http:// or https://")
    database = load_database_config(env)
    require_one_of(env, "LSKY_TOKEN", "LSKY_TOKEN_SECRET_ARN")
    lock_ttl = lock_ttl_seconds(env)
    check_lock_ttl(env, lock_ttl)
    return Settings(
        lsky_base_url=base_url.rstrip("/"),
        database=database,
        max_attempts=positive_int(env, "ARCHIVE_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
        retry_delays=retry_delays(env),
        lock_ttl_seconds=lock_ttl,
        max_image_bytes=positive_int(env, "ARCHIVE_MAX_IMAGE_BYTES", DEFAULT_MAX_IMAGE_BYTES),
        allow_private_networks=networks(env, "ARCHIVE_ALLOW_PRIVATE_NETWORKS"),
        lsky_strategy_id=optional_id(env, "LSKY_STRATEGY_ID"),
        lsky_album_id=optional_id(env, "LSKY_ALBUM_ID"),
        dlq_url=_text(env, "ARCHIVE_DLQ_URL"),
        lsky_token=_text(env, "LSKY_TOKEN"),
        lsky_token_secret_arn=_text(env, "LSKY_TOKEN_SECRET_ARN"),
        rate_limits=rate_limits(env),
        staging_bucket=staging_bucket(env),
        max_retry_after_seconds=bounded_int(
            env,
            "ARCHIVE_MAX_RETRY_AFTER_SECONDS",
            DEFAULT_MAX_RETRY_AFTER_SECONDS,
            maximum=MAX_VISIBILITY_SECONDS,
        ),
        lsky_timezone=time_zone(env, "LSKY_TIMEZONE"),
    )


def load_sweeper_settings(env: Mapping[str, str] | None = None) -> SweeperSettings:
    """Settings for the sweeper function; raises ConfigError naming what is missing."""
    env = os.environ if env is None else env
    queue_url = _text(env, "ARCHIVE_QUEUE_URL")
    if queue_url is None:
        raise ConfigError("missing required setting: ARCHIVE_QUEUE_URL")
    if not queue_url.startswith(("http://", "https://")):
        raise ConfigError("ARCHIVE_QUEUE_URL must be a queue URL (https://sqs...), not an ARN")
    lock_ttl = lock_ttl_seconds(env)
    check_lock_ttl(env, lock_ttl)
    return SweeperSettings(
        database=load_database_config(env),
        queue_url=queue_url,
        grace_seconds=positive_int(env, "ARCHIVE_SWEEP_GRACE_SECONDS", DEFAULT_SWEEP_GRACE_SECONDS),
        requeue_interval_seconds=positive_int(
            env, "ARCHIVE_REQUEUE_INTERVAL_SECONDS", DEFAULT_REQUEUE_INTERVAL_SECONDS
        ),
        max_rows=positive_int(env, "ARCHIVE_SWEEP_MAX_ROWS", DEFAULT_SWEEP_MAX_ROWS),
        max_attempts=positive_int(env, "ARCHIVE_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
        lock_ttl_seconds=lock_ttl,
        lsky_base_url=(_text(env, "LSKY_BASE_URL") or "").rstrip("/") or None,
        lsky_token=_text(env, "LSKY_TOKEN"),
        lsky_token_secret_arn=_text(env, "LSKY_TOKEN_SECRET_ARN"),
    )


@dataclass(frozen=True)
class QueueUrls:
    """The archive queue and its DLQ as configured; None where unset."""

    queue: str | None
    dlq: str | None


def queue_urls(env: Mapping[str, str] | None = None) -> QueueUrls:
    """ARCHIVE_QUEUE_URL and ARCHIVE_DLQ_URL, neither required (archive-ctl's defaults)."""
    env = os.environ if env is None else env
    return QueueUrls(queue=_text(env, "ARCHIVE_QUEUE_URL"), dlq=_text(env, "ARCHIVE_DLQ_URL"))


def lock_ttl_seconds(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_LOCK_TTL_SECONDS alone, for readers that need no other setting."""
    env = os.environ if env is None else env
    return positive_int(env, "ARCHIVE_LOCK_TTL_SECONDS", DEFAULT_LOCK_TTL_SECONDS)
