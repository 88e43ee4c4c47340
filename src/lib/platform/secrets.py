"""Secrets for the database and Lsky: plain values locally, Secrets Manager when deployed.

Powertools Parameters caches each secret (5 minutes by default), so warm invocations
do not call Secrets Manager; `force=True` refetches after a rotation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from lib.platform.config import DatabaseConfig
from lib.platform.errors import ConfigError

SECRET_MAX_AGE_SECONDS = 300


@dataclass(frozen=True)
class DatabaseParams:
    host: str
    port: int
    database: str
    user: str
    password: str | None = field(default=None, repr=False)
    sslmode: str | None = None


def _secret(arn: str, *, force: bool) -> str:
    # Deferred imports: Parameters pulls in boto3, which local runs with a plain
    # DATABASE_URL/LSKY_TOKEN never need.
    from aws_lambda_powertools.utilities import parameters  # noqa: PLC0415

    value = parameters.get_secret(arn, max_age=SECRET_MAX_AGE_SECONDS, force_fetch=force)
    return value if isinstance(value, str) else bytes(value).decode()


def _json_secret(arn: str, setting: str, *, force: bool) -> Any:
    """The secret decoded by Parameters' own JSON transform (cached decoded)."""
    from aws_lambda_powertools.utilities import parameters  # noqa: PLC0415
    from aws_lambda_powertools.utilities.parameters.exceptions import (  # noqa: PLC0415
        TransformParameterError,
    )

    try:
        return parameters.get_secret(
            arn, transform="json", max_age=SECRET_MAX_AGE_SECONDS, force_fetch=force
        )
    except TransformParameterError:
        raise ConfigError(f"{setting} does not hold a JSON secret") from None


def parse_database_url(url: str) -> DatabaseParams:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ConfigError("DATABASE_URL must be a postgresql:// URL")
    query = dict(pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair)
    try:
        port = parts.port or 5432
    except ValueError:
        raise ConfigError("DATABASE_URL has an invalid port") from None
    return DatabaseParams(
        host=parts.hostname or "localhost",
        port=port,
        database=unquote(parts.path.lstrip("/")) or "postgres",
        user=unquote(parts.username or "postgres"),
        password=unquote(parts.password) if parts.password is not None else None,
        sslmode=query.get("sslmode"),
    )


def parse_database_secret(secret: Any) -> DatabaseParams:
    """The RDS secret format, decoded: {"username", "password", "host", "port", "dbname"}."""
    if not isinstance(secret, dict):
        raise ConfigError("DB_SECRET_ARN does not hold a JSON object with the connection")
    if not secret.get("host") or not secret.get("username"):
        raise ConfigError("DB_SECRET_ARN secret needs at least host and username")
    return DatabaseParams(
        host=str(secret["host"]),
        port=int(secret.get("port") or 5432),
        database=str(secret.get("dbname") or secret.get("database") or "postgres"),
        user=str(secret["username"]),
        password=str(secret["password"]) if secret.get("password") is not None else None,
    )


def database_params(config: DatabaseConfig, *, force: bool = False) -> DatabaseParams:
    if config.url:
        params = parse_database_url(config.url)
    elif config.secret_arn:
        params = parse_database_secret(
            _json_secret(config.secret_arn, "DB_SECRET_ARN", force=force)
        )
    else:
        raise ConfigError("missing required setting: set DATABASE_URL or DB_SECRET_ARN")
    if config.sslmode:
        params = DatabaseParams(**{**params.__dict__, "sslmode": config.sslmode})
    return params


# What an HTTP header value can carry: printable ASCII without spaces. Checked here, so
# a pasted newline fails as a clear setting error instead of an exception from
# http.client whose message would quote the whole Authorization header.
_TOKEN_SHAPE = re.compile(r"[\x21-\x7e]+")


def lsky_token(token: str | None, secret_arn: str | None, *, force: bool = False) -> str:
    """The Lsky personal token ("<id>|<token>"); a secret may have it plain or as {"token": ...}."""
    if token:
        return _checked_token(token.strip(), "LSKY_TOKEN")
    if not secret_arn:
        raise ConfigError("missing required setting: set LSKY_TOKEN or LSKY_TOKEN_SECRET_ARN")
    text = _secret(secret_arn, force=force).strip()
    if text.startswith("{"):
        try:
            text = str(json.loads(text)["token"]).strip()
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ConfigError("LSKY_TOKEN_SECRET_ARN secret is JSON without a token key") from None
    if not text:
        raise ConfigError("LSKY_TOKEN_SECRET_ARN secret is empty")
    return _checked_token(text, "LSKY_TOKEN_SECRET_ARN")


def _checked_token(token: str, setting: str) -> str:
    if not _TOKEN_SHAPE.fullmatch(token):
        # Never quote the value: it is the secret.
        raise ConfigError(f"{setting} holds characters a token cannot have (spaces, line breaks)")
    return token
