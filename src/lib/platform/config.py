"""Settings read from the environment (the contract in DESIGN.md).

Numbers follow the seed worker: an invalid one (zero, negative, not a number, over
its bound) falls back to its default with a warning; template.yaml refuses each of
them. Any other unusable value, or a missing required one, is a ConfigError naming it.
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
# The longest pause a Retry-After header may impose (lane or row): a host asking for
# a day must not stop archiving for a day without an operator seeing it first.
DEFAULT_MAX_RETRY_AFTER_SECONDS = 3600

# Upper bounds of the numbers (template.yaml's patterns spell the same ranges;
# tests/test_template.py checks that the two agree value by value).
# An image spooled without a Content-Length goes to /tmp (512 MB on Lambda by default).
MAX_IMAGE_BYTES_BOUND = 500_000_000
# SQS holds a message's visibility for 12 hours at most.
MAX_DELAY_SECONDS = MAX_VISIBILITY_SECONDS
MAX_SWEEP_SECONDS = 86_400  # grace and requeue interval: beyond a day nothing is "lost"
MAX_SWEEP_ROWS = 1_000_000
MAX_ID = 10**18 - 1  # Lsky's ids are BIGINT: 18 digits at most
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
    # Shared with the archive function, like max_attempts.
    max_retry_after_seconds: int = DEFAULT_MAX_RETRY_AFTER_SECONDS


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


# A whole number as the template's patterns spell one: ASCII digits, no sign, no
# leading zero (int() would also take "+5", "1_000" and other scripts' digits).
_WHOLE = re.compile(r"[1-9][0-9]*")


def positive_int(
    env: Mapping[str, str], name: str, default: int, maximum: int | None = None
) -> int:
    raw = _text(env, name)
    if raw is None:
        return default
    if _WHOLE.fullmatch(raw) and (maximum is None or int(raw) <= maximum):
        return int(raw)
    bound = f" (a whole number from 1 to {maximum})" if maximum is not None else ""
    _warn("invalid %s=%r, using default %s%s", name, raw, default, bound)
    return default


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
    if _WHOLE.fullmatch(raw) and int(raw) <= MAX_ID:
        return int(raw)
    _warn("invalid %s=%r, ignoring it", name, raw)
    return None


def retry_delays(env: Mapping[str, str], name: str = "ARCHIVE_RETRY_DELAYS") -> tuple[int, ...]:
    raw = _text(env, name)
    if raw is None:
        return DEFAULT_RETRY_DELAYS
    parts = [part.strip(" ") for part in raw.split(",")]
    if all(_WHOLE.fullmatch(part) and int(part) <= MAX_DELAY_SECONDS for part in parts):
        return tuple(int(part) for part in parts)
    _warn(
        "invalid %s=%r, using default %s (each delay a whole number from 1 to %s)",
        name,
        raw,
        DEFAULT_RETRY_DELAYS,
        MAX_DELAY_SECONDS,
    )
    return DEFAULT_RETRY_DELAYS


# An IPv4 or IPv6 address with an optional prefix length, before ipaddress checks it.
_NETWORK = re.compile(r"[0-9A-Fa-f:.]+(/(0|[1-9][0-9]{0,2}))?")


def _network(text: str) -> IPNetwork | None:
    if not _NETWORK.fullmatch(text):
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def networks(env: Mapping[str, str], name: str) -> tuple[IPNetwork, ...]:
    """Comma-separated networks; one that is not a network is a ConfigError: the guard
    would otherwise run with a list the operator did not write."""
    raw = _text(env, name)
    if raw is None:
        return ()
    parsed: list[IPNetwork] = []
    for position, part in enumerate(raw.split(","), start=1):
        network = _network(part.strip(" "))
        if network is None:
            # The position, not the value (a ConfigError never quotes one).
            raise ConfigError(
                f"{name}: part {position} is not a network (comma-separated CIDRs, e.g. 10.0.0.0/8)"
            )
        parsed.append(network)
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


# What the Lsky client needs: a scheme, a host, and an optional path (no spaces).
_BASE_URL = re.compile(r"https?://[^\s/]+(/\S*)?")


def lsky_base_url(env: Mapping[str, str], name: str = "LSKY_BASE_URL") -> str | None:
    raw = _text(env, name)
    if raw is None:
        return None
    if not _BASE_URL.fullmatch(raw):
        raise ConfigError(f"{name} must be an http:// or https:// URL with a host")
    return raw.rstrip("/")


RATE_WINDOWS = {
    "second": 1,
    "minute": 60,
    "hour": 3_600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,
}
# Lsky's longest window is a month (30 days here): pacing over a longer one is a typo.
MAX_RATE_WINDOW_SECONDS = 31 * 86_400
MAX_RATE_COUNT = 999_999
_RATE = re.compile(
    r" *([1-9][0-9]*) */ *(?:([1-9][0-9]*) *)?(second|minute|hour|day|week|month)s? *"
)


def rate_limits(
    env: Mapping[str, str], name: str = "LSKY_RATE_LIMITS"
) -> tuple[tuple[int, int], ...]:
    """ "20/minute,100/hour" -> ((60, 20), (3600, 100)); "10/30 seconds" is 10 per 30 s.
    A part that is not one (or a window over 31 days, a count over 999999) is a
    ConfigError: pacing on the other parts alone would be looser than asked."""
    raw = _text(env, name)
    if raw is None:
        return ()
    limits: list[tuple[int, int]] = []
    for position, part in enumerate(raw.split(","), start=1):
        match = _RATE.fullmatch(part)
        count = int(match.group(1)) if match else 0
        seconds = int(match.group(2) or 1) * RATE_WINDOWS[match.group(3)] if match else 0
        if not match or count > MAX_RATE_COUNT or seconds > MAX_RATE_WINDOW_SECONDS:
            raise ConfigError(
                f"{name}: part {position} is not a limit (N/unit or N/M units, unit second "
                f"to month, N at most {MAX_RATE_COUNT}, a window of at most 31 days)"
            )
        limits.append((seconds, count))
    return tuple(sorted(limits))


# S3's rules for a bucket name (the plain name, not an ARN or a URL).
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"[0-9]+(\.[0-9]+){3}")
_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def staging_bucket(env: Mapping[str, str], name: str = "ARCHIVE_STAGING_BUCKET") -> str | None:
    """The staging bucket's name; a value that cannot be one is a ConfigError: the
    operator believes images are protected, so staging must not quietly turn off."""
    raw = _text(env, name)
    if raw is None:
        return None
    if (
        not _BUCKET_NAME.fullmatch(raw)
        or ".." in raw
        or _IP_ADDRESS.fullmatch(raw)
        or raw.startswith(_BUCKET_PREFIXES)
        or raw.endswith(_BUCKET_SUFFIXES)
    ):
        raise ConfigError(f"{name} must be an S3 bucket name (not an ARN or a URL)")
    return raw


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
    base_url = lsky_base_url(env)
    if base_url is None:
        raise ConfigError("missing required setting: LSKY_BASE_URL")
    database = load_database_config(env)
    require_one_of(env, "LSKY_TOKEN", "LSKY_TOKEN_SECRET_ARN")
    lock_ttl = lock_ttl_seconds(env)
    check_lock_ttl(env, lock_ttl)
    return Settings(
        lsky_base_url=base_url,
        database=database,
        max_attempts=positive_int(env, "ARCHIVE_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
        retry_delays=retry_delays(env),
        lock_ttl_seconds=lock_ttl,
        max_image_bytes=positive_int(
            env, "ARCHIVE_MAX_IMAGE_BYTES", DEFAULT_MAX_IMAGE_BYTES, MAX_IMAGE_BYTES_BOUND
        ),
        allow_private_networks=networks(env, "ARCHIVE_ALLOW_PRIVATE_NETWORKS"),
        lsky_strategy_id=optional_id(env, "LSKY_STRATEGY_ID"),
        lsky_album_id=optional_id(env, "LSKY_ALBUM_ID"),
        dlq_url=_text(env, "ARCHIVE_DLQ_URL"),
        lsky_token=_text(env, "LSKY_TOKEN"),
        lsky_token_secret_arn=_text(env, "LSKY_TOKEN_SECRET_ARN"),
        rate_limits=rate_limits(env),
        staging_bucket=staging_bucket(env),
        max_retry_after_seconds=max_retry_after_seconds(env),
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
        grace_seconds=positive_int(
            env, "ARCHIVE_SWEEP_GRACE_SECONDS", DEFAULT_SWEEP_GRACE_SECONDS, MAX_SWEEP_SECONDS
        ),
        requeue_interval_seconds=positive_int(
            env,
            "ARCHIVE_REQUEUE_INTERVAL_SECONDS",
            DEFAULT_REQUEUE_INTERVAL_SECONDS,
            MAX_SWEEP_SECONDS,
        ),
        max_rows=positive_int(
            env, "ARCHIVE_SWEEP_MAX_ROWS", DEFAULT_SWEEP_MAX_ROWS, MAX_SWEEP_ROWS
        ),
        max_attempts=positive_int(env, "ARCHIVE_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
        lock_ttl_seconds=lock_ttl,
        # Optional here (only the account probe uses it), but checked like the archive's.
        lsky_base_url=lsky_base_url(env),
        lsky_token=_text(env, "LSKY_TOKEN"),
        lsky_token_secret_arn=_text(env, "LSKY_TOKEN_SECRET_ARN"),
        max_retry_after_seconds=max_retry_after_seconds(env),
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


def max_retry_after_seconds(env: Mapping[str, str]) -> int:
    return positive_int(
        env,
        "ARCHIVE_MAX_RETRY_AFTER_SECONDS",
        DEFAULT_MAX_RETRY_AFTER_SECONDS,
        MAX_DELAY_SECONDS,
    )


def lock_ttl_seconds(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_LOCK_TTL_SECONDS alone, for readers that need no other setting."""
    env = os.environ if env is None else env
    return positive_int(env, "ARCHIVE_LOCK_TTL_SECONDS", DEFAULT_LOCK_TTL_SECONDS)
