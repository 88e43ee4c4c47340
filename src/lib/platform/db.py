"""One PostgreSQL connection per Lambda container, reopened when it drops.

Autocommit, named parameters, statements prepared once per connection (one round trip
each); `run` retries once on a fresh connection. docs/database.md says why.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from typing import Any

import pg8000.exceptions
import pg8000.native

from lib.platform.config import DatabaseConfig
from lib.platform.errors import DatabaseUnavailable
from lib.platform.observability import logger
from lib.platform.secrets import DatabaseParams, database_params

# Short: a reconnect may happen after the transfer, inside the time kept to record it.
CONNECT_TIMEOUT_SECONDS = 5
STATEMENT_TIMEOUT_MS = 15_000
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# SQLSTATEs after which the session is gone: connection exceptions and shutdowns.
_CONNECTION_LOST_CLASSES = ("08", "57P")
_AUTH_FAILED = frozenset({"28P01", "28000"})
# The server no longer has our prepared statement (a pooler reset the session), or its
# cached plan no longer fits the table: prepare it again and run it once more.
_STALE_STATEMENT = frozenset({"26000", "0A000"})
# The service runs a handful of fixed statements; past this, run unprepared rather than
# let ad hoc SQL (operator tooling) pile up statements on the server.
MAX_PREPARED_STATEMENTS = 32


def _sqlstate(error: BaseException) -> str | None:
    detail = error.args[0] if error.args else None
    return str(detail.get("C")) if isinstance(detail, dict) and detail.get("C") else None


def is_connection_lost(error: BaseException) -> bool:
    if isinstance(error, pg8000.exceptions.InterfaceError | OSError):
        return True
    code = _sqlstate(error)
    return code is not None and code.startswith(_CONNECTION_LOST_CLASSES)


def describe(error: BaseException) -> str:
    """A one-line, secret-free description of a database error (no DSN, no parameters)."""
    detail = error.args[0] if error.args else None
    if isinstance(detail, dict):
        return f"{detail.get('C', '?')}: {detail.get('M', 'database error')}"
    return f"{type(error).__name__}: {str(error)[:200]}"


def ssl_option(sslmode: str) -> ssl.SSLContext | bool | None:
    """pg8000's `ssl_context` for a libpq-style sslmode.

    pg8000 itself reads False as "no TLS" and None as "try TLS, stay plain if the
    server refuses" (libpq's prefer); a context means TLS or nothing.
    """
    if sslmode == "disable":
        return False
    if sslmode == "prefer":
        return None
    if sslmode == "verify-full":
        return ssl.create_default_context()
    # require: encrypted, not verified (libpq's semantics for this mode).
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def effective_sslmode(params: DatabaseParams) -> str:
    if params.sslmode:
        return params.sslmode
    local = params.host in LOCAL_HOSTS or params.host.startswith("/")
    return "disable" if local else "prefer"


def open_connection(params: DatabaseParams, *, application_name: str) -> pg8000.native.Connection:
    conn = pg8000.native.Connection(
        user=params.user,
        password=params.password,
        host=params.host,
        port=params.port,
        database=params.database,
        ssl_context=ssl_option(effective_sslmode(params)),
        timeout=CONNECT_TIMEOUT_SECONDS,
        application_name=application_name,
        tcp_keepalive=True,
    )
    # A wedged statement must end before the function times out.
    conn.run(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
    return conn


class Database:
    """A lazily opened connection with reconnect; safe to share across invocations."""

    def __init__(
        self,
        config: DatabaseConfig,
        *,
        application_name: str = "image-archive",
        connect: Callable[..., pg8000.native.Connection] = open_connection,
    ) -> None:
        self._config = config
        self._application_name = application_name
        self._connect_fn = connect
        self._conn: pg8000.native.Connection | None = None
        self._prepared: dict[str, pg8000.native.PreparedStatement] = {}
        self._lock = threading.Lock()
        self.connections_opened = 0
        self.statements_run = 0

    def _connect(self) -> pg8000.native.Connection:
        params = database_params(self._config)
        try:
            conn = self._connect_fn(params, application_name=self._application_name)
        except pg8000.exceptions.DatabaseError as error:
            if _sqlstate(error) not in _AUTH_FAILED or not self._config.secret_arn:
                raise
            # The password may have been rotated since the secret was cached.
            params = database_params(self._config, force=True)
            conn = self._connect_fn(params, application_name=self._application_name)
        self.connections_opened += 1
        return conn

    def run(self, sql: str, **params: Any) -> list[list[Any]]:
        """Run one statement; on a lost connection reconnect and run it once more."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None:
                        self._conn = self._connect()
                    self.statements_run += 1
                    rows = self._execute(self._conn, sql, params)
                except (pg8000.exceptions.Error, OSError) as error:
                    if not is_connection_lost(error):
                        raise
                    self._discard()
                    if attempt == 2:
                        raise DatabaseUnavailable(describe(error)) from None
                    logger.warning("database connection lost, reconnecting", error=describe(error))
                else:
                    return rows
            raise AssertionError("unreachable")  # pragma: no cover

    def _execute(
        self, conn: pg8000.native.Connection, sql: str, params: dict[str, Any]
    ) -> list[list[Any]]:
        if not params:
            # The simple query protocol: one round trip already, nothing to prepare.
            return conn.run(sql) or []
        statement = self._prepared.get(sql)
        if statement is None:
            if len(self._prepared) >= MAX_PREPARED_STATEMENTS:
                return conn.run(sql, **params) or []
            statement = self._prepared[sql] = conn.prepare(sql)
        try:
            return statement.run(**params) or []
        except pg8000.exceptions.DatabaseError as error:
            if _sqlstate(error) not in _STALE_STATEMENT:
                raise
        self._prepared[sql] = statement = conn.prepare(sql)
        return statement.run(**params) or []

    def _discard(self) -> None:
        # Prepared statements live and die with their session.
        self._prepared.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - the socket is already broken; closing is best effort
                logger.debug("closing a broken connection failed")

    def close(self) -> None:
        with self._lock:
            self._discard()
