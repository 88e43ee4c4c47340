"""Settings read from the environment (the contract in DESIGN.md).

Numbers follow the seed worker: an invalid one (zero, negative, not a number, over
its bound) falls back to its default with a warning; template.yaml refuses each of
them. Any other unusable value, or a missing required one, is a ConfigError naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from lib.platform.env_values import (
    DEFAULT_LSKY_TIMEZONE,
    DEFAULT_ORIGINALS_STORAGE_CLASS,
    DEFAULT_RETRY_DELAYS,
    MAX_DELAY_SECONDS,
    MAX_IMAGE_BYTES_BOUND,
    MAX_SWEEP_ROWS,
    MAX_SWEEP_SECONDS,
    IPNetwork,
    event_bus,
    lsky_base_url,
    networks,
    optional_id,
    originals_storage_class,
    positive_int,
    positive_number,
    rate_limits,
    require_one_of,
    retry_delays,
    staging_bucket,
    text,
    time_zone,
    warn,
)
from lib.platform.errors import ConfigError

DEFAULT_MAX_ATTEMPTS = 3
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
# Sweeper: a record's events are kept this many days after the conclusion they lead to
# (docs/explanation/stories.md), and ten years at most.
DEFAULT_EVENT_RETENTION_DAYS = 30
MAX_EVENT_RETENTION_DAYS = 3650
# Auditor: every archived image's hosted copy is checked at least once in this many days,
# at most this many GETs a second on the host (docs/explanation/audit-and-repair.md).
DEFAULT_AUDIT_DAYS = 30
MAX_AUDIT_DAYS = 3650
DEFAULT_AUDIT_RATE = 5.0
MAX_AUDIT_RATE = 1000.0


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
    # ARCHIVE_EVENT_BUS: where completion events are published (lib.publish); None = none.
    event_bus: str | None = None
    # ARCHIVE_ORIGINALS_BUCKET: where every archived image's original is kept
    # (lib.archive.originals); None = none kept. ARCHIVE_ORIGINALS_STORAGE_CLASS: in which class.
    originals_bucket: str | None = None
    originals_storage_class: str = DEFAULT_ORIGINALS_STORAGE_CLASS


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
    # LSKY_RATE_LIMITS, shared likewise: whether an attempt that vanished took a slot for
    # its upload (paced) or may have uploaded without one.
    rate_limits: tuple[tuple[int, int], ...] = ()
    # Optional: with them the sweeper probes an account-paused lane (GET /api/v1/profile).
    lsky_base_url: str | None = None
    lsky_token: str | None = field(default=None, repr=False)
    lsky_token_secret_arn: str | None = None
    # Shared with the archive function, like max_attempts.
    max_retry_after_seconds: int = DEFAULT_MAX_RETRY_AFTER_SECONDS
    # ARCHIVE_EVENT_RETENTION_DAYS: how long a concluded record's story is kept.
    event_retention_days: int = DEFAULT_EVENT_RETENTION_DAYS
    # Shared with the archive function: the sweeper publishes what it left unpublished.
    event_bus: str | None = None


@dataclass(frozen=True)
class AuditSettings:
    database: DatabaseConfig
    # The archive queue: a restore sends the record's message there.
    queue_url: str
    audit_days: int = DEFAULT_AUDIT_DAYS
    audit_rate: float = DEFAULT_AUDIT_RATE
    # ARCHIVE_ORIGINALS_BUCKET: where originals are kept (None: none kept, none restored from).
    originals_bucket: str | None = None
    originals_storage_class: str = DEFAULT_ORIGINALS_STORAGE_CLASS
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    allow_private_networks: tuple[IPNetwork, ...] = ()
    # ARCHIVE_EVENT_RETENTION_DAYS: the audit's own events go after it, as stories do.
    event_retention_days: int = DEFAULT_EVENT_RETENTION_DAYS

    @property
    def period_seconds(self) -> int:
        return self.audit_days * 86_400


def service_name(env: Mapping[str, str] | None = None) -> str:
    return text(os.environ if env is None else env, "POWERTOOLS_SERVICE_NAME") or "image-archive"


def metrics_namespace(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return text(env, "POWERTOOLS_METRICS_NAMESPACE") or "ImageArchive"


def use_aws_region(env: MutableMapping[str, str] | None = None) -> None:
    """Make boto3 (ours and Powertools') honour AWS_REGION, read first by Lambda, the AWS CLI
    and newer SDKs (boto3: AWS_DEFAULT_REGION only). archive-ctl calls it; Lambda sets both."""
    env = os.environ if env is None else env
    region = text(env, "AWS_REGION")
    if region is not None:
        env["AWS_DEFAULT_REGION"] = region


def tracing_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Tracing is opt-in (POWERTOOLS_TRACE_DISABLED=false): the X-Ray SDK costs cold start."""
    env = os.environ if env is None else env
    return (text(env, "POWERTOOLS_TRACE_DISABLED") or "true").lower() in ("0", "false")


def lambda_runtime_api(env: Mapping[str, str] | None = None) -> str | None:
    """AWS_LAMBDA_RUNTIME_API (host:port): set by Lambda, None anywhere else."""
    return text(os.environ if env is None else env, "AWS_LAMBDA_RUNTIME_API")


def check_lock_ttl(env: Mapping[str, str], lock_ttl: int) -> None:
    """Refuse a lock that an attempt can outlive (another would take the row over and
    spend one of its attempts: our misconfiguration, never the record's to pay; as a
    ConfigError each message is given back whole), and warn when only the finish
    reserve is left: the sweeper may send the row again while its attempt concludes."""
    timeout = positive_int(
        env, "ARCHIVE_FUNCTION_TIMEOUT_SECONDS", DEFAULT_FUNCTION_TIMEOUT_SECONDS
    )
    if lock_ttl <= timeout:
        raise ConfigError(
            f"ARCHIVE_LOCK_TTL_SECONDS={lock_ttl} must exceed "
            f"ARCHIVE_FUNCTION_TIMEOUT_SECONDS={timeout}: a lock would expire under a "
            "running attempt"
        )
    reserve = FINISH_RESERVE_MS // 1000
    if lock_ttl <= timeout + reserve:
        warn(
            "ARCHIVE_LOCK_TTL_SECONDS=%s does not exceed ARCHIVE_FUNCTION_TIMEOUT_SECONDS=%s "
            "plus the %s s finish reserve: a lock can expire while its attempt still runs",
            lock_ttl,
            timeout,
            reserve,
        )


SSL_MODES = ("disable", "prefer", "require", "verify-full")


def load_database_config(env: Mapping[str, str] | None = None) -> DatabaseConfig:
    env = os.environ if env is None else env
    require_one_of(env, "DATABASE_URL", "DB_SECRET_ARN")
    sslmode = text(env, "DB_SSLMODE")
    if sslmode is not None and sslmode not in SSL_MODES:
        raise ConfigError(f"DB_SSLMODE must be one of {', '.join(SSL_MODES)}")
    root_cert = text(env, "DB_SSL_ROOT_CERT")
    if root_cert is not None:
        # Checked here: at connect time a missing file would look like a lost connection.
        if not Path(root_cert).is_file():
            raise ConfigError(f"DB_SSL_ROOT_CERT: no such file: {root_cert}")
        if sslmode != "verify-full":
            warn(
                "DB_SSL_ROOT_CERT=%r is used only with DB_SSLMODE=verify-full (DB_SSLMODE=%s)",
                root_cert,
                sslmode or "unset",
            )
    return DatabaseConfig(
        url=text(env, "DATABASE_URL"),
        secret_arn=text(env, "DB_SECRET_ARN"),
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
        max_attempts=max_attempts(env),
        retry_delays=retry_delays(env),
        lock_ttl_seconds=lock_ttl,
        max_image_bytes=positive_int(
            env, "ARCHIVE_MAX_IMAGE_BYTES", DEFAULT_MAX_IMAGE_BYTES, MAX_IMAGE_BYTES_BOUND
        ),
        allow_private_networks=networks(env, "ARCHIVE_ALLOW_PRIVATE_NETWORKS"),
        lsky_strategy_id=optional_id(env, "LSKY_STRATEGY_ID"),
        lsky_album_id=optional_id(env, "LSKY_ALBUM_ID"),
        dlq_url=text(env, "ARCHIVE_DLQ_URL"),
        lsky_token=text(env, "LSKY_TOKEN"),
        lsky_token_secret_arn=text(env, "LSKY_TOKEN_SECRET_ARN"),
        rate_limits=rate_limits(env),
        staging_bucket=staging_bucket(env),
        max_retry_after_seconds=max_retry_after_seconds(env),
        lsky_timezone=time_zone(env, "LSKY_TIMEZONE"),
        event_bus=event_bus(env),
        originals_bucket=staging_bucket(env, "ARCHIVE_ORIGINALS_BUCKET"),
        originals_storage_class=originals_storage_class(env),
    )


def load_sweeper_settings(env: Mapping[str, str] | None = None) -> SweeperSettings:
    """Settings for the sweeper function; raises ConfigError naming what is missing."""
    env = os.environ if env is None else env
    queue_url = archive_queue_url(env)
    lock_ttl = lock_ttl_seconds(env)
    check_lock_ttl(env, lock_ttl)
    return SweeperSettings(
        database=load_database_config(env),
        queue_url=queue_url,
        grace_seconds=sweep_grace_seconds(env),
        requeue_interval_seconds=requeue_interval_seconds(env),
        max_rows=positive_int(
            env, "ARCHIVE_SWEEP_MAX_ROWS", DEFAULT_SWEEP_MAX_ROWS, MAX_SWEEP_ROWS
        ),
        max_attempts=max_attempts(env),
        lock_ttl_seconds=lock_ttl,
        rate_limits=rate_limits(env),
        # Optional here (only the account probe uses it), but checked like the archive's.
        lsky_base_url=lsky_base_url(env),
        lsky_token=text(env, "LSKY_TOKEN"),
        lsky_token_secret_arn=text(env, "LSKY_TOKEN_SECRET_ARN"),
        max_retry_after_seconds=max_retry_after_seconds(env),
        event_retention_days=event_retention_days(env),
        event_bus=event_bus(env),
    )


def load_audit_settings(
    env: Mapping[str, str] | None = None, *, queue_url: str | None = None
) -> AuditSettings:
    """Settings for the audit function (`queue_url`: archive-ctl's --queue-url instead of
    ARCHIVE_QUEUE_URL); raises ConfigError naming what is missing."""
    env = os.environ if env is None else env
    return AuditSettings(
        database=load_database_config(env),
        queue_url=queue_url or archive_queue_url(env),
        audit_days=audit_days(env),
        audit_rate=positive_number(env, "ARCHIVE_AUDIT_RATE", DEFAULT_AUDIT_RATE, MAX_AUDIT_RATE),
        originals_bucket=staging_bucket(env, "ARCHIVE_ORIGINALS_BUCKET"),
        originals_storage_class=originals_storage_class(env),
        max_image_bytes=positive_int(
            env, "ARCHIVE_MAX_IMAGE_BYTES", DEFAULT_MAX_IMAGE_BYTES, MAX_IMAGE_BYTES_BOUND
        ),
        allow_private_networks=networks(env, "ARCHIVE_ALLOW_PRIVATE_NETWORKS"),
        event_retention_days=event_retention_days(env),
    )


def event_retention_days(env: Mapping[str, str]) -> int:
    return positive_int(
        env, "ARCHIVE_EVENT_RETENTION_DAYS", DEFAULT_EVENT_RETENTION_DAYS, MAX_EVENT_RETENTION_DAYS
    )


def audit_days(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_AUDIT_DAYS alone (the auditor, and `archive-ctl status`)."""
    env = os.environ if env is None else env
    return positive_int(env, "ARCHIVE_AUDIT_DAYS", DEFAULT_AUDIT_DAYS, MAX_AUDIT_DAYS)


def archive_queue_url(env: Mapping[str, str]) -> str:
    """ARCHIVE_QUEUE_URL, required: a queue URL, not an ARN."""
    queue_url = text(env, "ARCHIVE_QUEUE_URL")
    if queue_url is None:
        raise ConfigError("missing required setting: ARCHIVE_QUEUE_URL")
    if not queue_url.startswith(("http://", "https://")):
        raise ConfigError("ARCHIVE_QUEUE_URL must be a queue URL (https://sqs...), not an ARN")
    return queue_url


@dataclass(frozen=True)
class QueueUrls:
    """The archive queue and its DLQ as configured; None where unset."""

    queue: str | None
    dlq: str | None


def queue_urls(env: Mapping[str, str] | None = None) -> QueueUrls:
    """ARCHIVE_QUEUE_URL and ARCHIVE_DLQ_URL, neither required (archive-ctl's defaults)."""
    env = os.environ if env is None else env
    return QueueUrls(queue=text(env, "ARCHIVE_QUEUE_URL"), dlq=text(env, "ARCHIVE_DLQ_URL"))


def max_retry_after_seconds(env: Mapping[str, str]) -> int:
    return positive_int(
        env, "ARCHIVE_MAX_RETRY_AFTER_SECONDS", DEFAULT_MAX_RETRY_AFTER_SECONDS, MAX_DELAY_SECONDS
    )


def pacing_limits(env: Mapping[str, str] | None = None) -> tuple[tuple[int, int], ...]:
    """LSKY_RATE_LIMITS alone (`status`, `backfill`): (window s, uploads) pairs; () if off."""
    return rate_limits(os.environ if env is None else env)


def lock_ttl_seconds(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_LOCK_TTL_SECONDS alone, for readers that need no other setting."""
    env = os.environ if env is None else env
    return positive_int(env, "ARCHIVE_LOCK_TTL_SECONDS", DEFAULT_LOCK_TTL_SECONDS)


def max_attempts(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_MAX_ATTEMPTS alone (the functions, and `archive-ctl show`)."""
    env = os.environ if env is None else env
    return positive_int(env, "ARCHIVE_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)


def sweep_grace_seconds(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_SWEEP_GRACE_SECONDS alone (the sweeper, and `archive-ctl show`)."""
    env = os.environ if env is None else env
    return positive_int(
        env, "ARCHIVE_SWEEP_GRACE_SECONDS", DEFAULT_SWEEP_GRACE_SECONDS, MAX_SWEEP_SECONDS
    )


def requeue_interval_seconds(env: Mapping[str, str] | None = None) -> int:
    """ARCHIVE_REQUEUE_INTERVAL_SECONDS alone (the sweeper, and `archive-ctl show`)."""
    env = os.environ if env is None else env
    return positive_int(
        env, "ARCHIVE_REQUEUE_INTERVAL_SECONDS", DEFAULT_REQUEUE_INTERVAL_SECONDS, MAX_SWEEP_SECONDS
    )
