"""How each kind of setting is read from the environment's text and checked: numbers fall
back to their default with a warning (the contract), names and patterns that cannot be
right stop the start with a ConfigError naming the variable (never its value).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from lib.platform.errors import ConfigError
from lib.platform.sqs import MAX_VISIBILITY_SECONDS

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Upper bounds of the numbers (template.yaml's patterns spell the same ranges;
# tests/test_template.py checks that the two agree value by value).
# An image spooled without a Content-Length goes to /tmp (512 MB on Lambda by default).
MAX_IMAGE_BYTES_BOUND = 500_000_000
# SQS keeps a message hidden for 12 hours at most.
MAX_DELAY_SECONDS = MAX_VISIBILITY_SECONDS
MAX_SWEEP_SECONDS = 86_400  # grace and requeue interval: beyond a day nothing is "lost"
MAX_SWEEP_ROWS = 1_000_000
MAX_ID = 10**18 - 1  # Lsky's ids are BIGINT: 18 digits at most
DEFAULT_RETRY_DELAYS = (30, 120, 600)
DEFAULT_LSKY_TIMEZONE = "Asia/Shanghai"  # Lsky Pro's config/app.php: 'timezone' => 'PRC'
# The logger Powertools formats (lib.platform.observability) is the standard one of the
# service's name; read here without importing observability back.
SERVICE_LOGGER = "image-archive"


def warn(message: str, *args: object) -> None:
    logging.getLogger(SERVICE_LOGGER).warning(message, *args)


def text(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, with empty and blank treated as unset (templates pass '')."""
    value = env.get(name, "").strip()
    return value or None


# A whole number as the template's patterns spell one: ASCII digits, no sign, no
# leading zero (int() would also take "+5", "1_000" and other scripts' digits).
_WHOLE = re.compile(r"[1-9][0-9]*")


def positive_int(
    env: Mapping[str, str], name: str, default: int, maximum: int | None = None
) -> int:
    raw = text(env, name)
    if raw is None:
        return default
    if _WHOLE.fullmatch(raw) and (maximum is None or int(raw) <= maximum):
        return int(raw)
    bound = f" (a whole number from 1 to {maximum})" if maximum is not None else ""
    warn("invalid %s=%r, using default %s%s", name, raw, default, bound)
    return default


# A decimal number as a template pattern can spell one: digits, an optional fraction.
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]{1,3})?")


def positive_number(env: Mapping[str, str], name: str, default: float, maximum: float) -> float:
    """A number above 0 and at most `maximum` (three decimals at most), else the default
    with a warning, as positive_int."""
    raw = text(env, name)
    if raw is None:
        return default
    if _DECIMAL.fullmatch(raw) and 0 < float(raw) <= maximum:
        return float(raw)
    warn(
        "invalid %s=%r, using default %s (a number above 0, at most %s)",
        name,
        raw,
        default,
        maximum,
    )
    return default


def time_zone(env: Mapping[str, str], name: str) -> str:
    """An IANA zone name (Asia/Shanghai, UTC); an unknown one fails at start-up."""
    raw = text(env, name) or DEFAULT_LSKY_TIMEZONE
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ConfigError(f"{name} is not a time zone name (e.g. Asia/Shanghai)") from error
    return raw


def optional_id(env: Mapping[str, str], name: str) -> int | None:
    raw = text(env, name)
    if raw is None:
        return None
    if _WHOLE.fullmatch(raw) and int(raw) <= MAX_ID:
        return int(raw)
    warn("invalid %s=%r, ignoring it", name, raw)
    return None


def retry_delays(env: Mapping[str, str], name: str = "ARCHIVE_RETRY_DELAYS") -> tuple[int, ...]:
    raw = text(env, name)
    if raw is None:
        return DEFAULT_RETRY_DELAYS
    parts = [part.strip(" ") for part in raw.split(",")]
    if all(_WHOLE.fullmatch(part) and int(part) <= MAX_DELAY_SECONDS for part in parts):
        return tuple(int(part) for part in parts)
    warn(
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
    raw = text(env, name)
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


def require_one_of(env: Mapping[str, str], *names: str) -> None:
    if not any(text(env, name) for name in names):
        raise ConfigError(f"missing required setting: set {' or '.join(names)}")


# What the Lsky client needs: a scheme, a host, and an optional path (no spaces).
_BASE_URL = re.compile(r"https?://[^\s/]+(/\S*)?")


def lsky_base_url(env: Mapping[str, str], name: str = "LSKY_BASE_URL") -> str | None:
    raw = text(env, name)
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
    # Lsky's month is PHP's "-1 month": as long as the month before, 28 to 31 days; pacing
    # keeps the longest (lib.ratelimit.limiter), so no month Lsky counts has more.
    "month": 31 * 86_400,
}
# Lsky's longest window is a month: pacing over a longer one is a typo.
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
    raw = text(env, name)
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
    raw = text(env, name)
    if raw is None:
        return None
    if not is_bucket_name(raw):
        raise ConfigError(f"{name} must be an S3 bucket name (not an ARN or a URL)")
    return raw


def is_bucket_name(raw: str) -> bool:
    """S3's rules for a general purpose bucket's name (a setting, or a row's column)."""
    return not (
        not _BUCKET_NAME.fullmatch(raw)
        or ".." in raw
        or _IP_ADDRESS.fullmatch(raw)
        or raw.startswith(_BUCKET_PREFIXES)
        or raw.endswith(_BUCKET_SUFFIXES)
    )


# An EventBridge bus of this account and region, by name (EventBridge's pattern and length;
# the template's EventBusName takes the same, and grants PutEvents on that bus alone).
_BUS_NAME = re.compile(r"[/.\-_A-Za-z0-9]{1,256}")


def event_bus(env: Mapping[str, str], name: str = "ARCHIVE_EVENT_BUS") -> str | None:
    """The bus completion events go to; None (unset or empty): none are published. A value
    that cannot be a bus name is a ConfigError: the operator expects the events."""
    raw = text(env, name)
    if raw is None:
        return None
    if not _BUS_NAME.fullmatch(raw):
        raise ConfigError(f"{name} must be an EventBridge bus name (letters, digits, /._-)")
    return raw


# Originals are written once and read rarely (an audit's repair): Glacier Instant Retrieval
# by default (docs/performance.md prices each class).
ORIGINALS_STORAGE_CLASSES = ("GLACIER_IR", "STANDARD", "STANDARD_IA", "INTELLIGENT_TIERING")
DEFAULT_ORIGINALS_STORAGE_CLASS = "GLACIER_IR"


def originals_storage_class(
    env: Mapping[str, str], name: str = "ARCHIVE_ORIGINALS_STORAGE_CLASS"
) -> str:
    """The S3 storage class originals are written in (template.yaml's OriginalsStorageClass
    allows the same); anything else a ConfigError."""
    value = text(env, name) or DEFAULT_ORIGINALS_STORAGE_CLASS
    if value not in ORIGINALS_STORAGE_CLASSES:
        raise ConfigError(f"{name} must be one of {', '.join(ORIGINALS_STORAGE_CLASSES)}")
    return value
