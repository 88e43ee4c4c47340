"""One PostgreSQL connection per Lambda container, reopened when it drops.

Autocommit, named parameters, statements prepared once per connection (one round trip
each); `run` retries once on a fresh connection. docs/reference/database.md says why.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import pg8000.exceptions
import pg8000.native

from lib.platform.config import DatabaseConfig
from lib.platform.errors import DatabaseUnavailable
from lib.platform.observability import logger
from lib.platform.redact import outside_text
from lib.platform.secrets import DatabaseParams, database_params

# Three separate limits. Connecting (TCP, TLS, authentication) must be quick: a reconnect
# may happen after the transfer, inside the time kept to record it.
CONNECT_TIMEOUT_SECONDS = 5
# A statement is limited by the server (statement_timeout), which cancels it with SQLSTATE
# 57014 and keeps the session: a slow statement is not a lost connection.
STATEMENT_TIMEOUT_MS = 15_000
# The socket waits this much longer than statement_timeout: a read still waiting after the
# server should have cancelled the statement means the server or the path is gone.
SOCKET_TIMEOUT_MARGIN_SECONDS = 5.0
# With no statement timeout (migrations) the socket waits forever, so TCP keepalive is what
# notices a peer that vanished: first probe after a minute idle, gone after six misses.
KEEPALIVE_IDLE_SECONDS = 60
KEEPALIVE_INTERVAL_SECONDS = 10
KEEPALIVE_PROBES = 6
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


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a server error (pg8000 keeps the fields in args[0]), else None."""
    detail = error.args[0] if error.args else None
    return str(detail.get("C")) if isinstance(detail, dict) and detail.get("C") else None


def is_connection_lost(error: BaseException) -> bool:
    """The session is gone (network error, socket timeout, server shutdown): reconnect.

    A statement the server cancelled (57014, statement_timeout) is not in these classes:
    the session is fine, and running the same slow statement again would only wait twice.
    """
    if isinstance(error, pg8000.exceptions.InterfaceError | OSError):
        return True
    code = sqlstate(error)
    return code is not None and code.startswith(_CONNECTION_LOST_CLASSES)


def describe(error: BaseException) -> str:
    """A one-line, secret-free description of a database error (no DSN, no parameters)."""
    detail = error.args[0] if error.args else None
    if isinstance(detail, dict):
        return f"{detail.get('C', '?')}: {outside_text(detail.get('M', 'database error'), 200)}"
    return f"{type(error).__name__}: {outside_text(error, 200)}"


def ssl_option(sslmode: str, root_cert: str | None = None) -> ssl.SSLContext | bool | None:
    """pg8000's `ssl_context` for a libpq-style sslmode.

    pg8000 itself reads False as "no TLS" and None as "try TLS, stay plain if the
    server refuses" (libpq's prefer); a context means TLS or nothing. verify-full trusts
    `root_cert` (a CA bundle file, e.g. RDS's) instead of the system's CAs when given.
    """
    if sslmode == "disable":
        return False
    if sslmode == "prefer":
        return None
    if sslmode == "verify-full":
        return ssl.create_default_context(cafile=root_cert)
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


@dataclass(frozen=True)
class Session:
    """Limits set on every connection a Database opens, reconnects included (0: none)."""

    statement_timeout_ms: int = STATEMENT_TIMEOUT_MS
    lock_timeout_ms: int = 0

    @property
    def socket_timeout(self) -> float | None:
        """How long one read may wait once connected: past the server's own limit."""
        if self.statement_timeout_ms <= 0:
            return None
        return self.statement_timeout_ms / 1000 + SOCKET_TIMEOUT_MARGIN_SECONDS

    @property
    def sql(self) -> str:
        # One simple-protocol message, so one round trip for both settings.
        return (
            f"SET statement_timeout = {int(self.statement_timeout_ms)}; "
            f"SET lock_timeout = {int(self.lock_timeout_ms)}"
        )


# The functions' and archive-ctl's sessions.
HANDLER_SESSION = Session()
# archive-ctl migrate: no statement or socket timeout, because building an index
# CONCURRENTLY on a large live table can take minutes. Its default lock_timeout is the
# short one it uses for statements that need the table's ACCESS EXCLUSIVE lock: waiting
# longer would queue the generation service's reads and writes behind the request
# (lib.cli.migrate raises it only for steps that let them through).
MIGRATION_LOCK_TIMEOUT_MS = 300
MIGRATION_SESSION = Session(statement_timeout_ms=0, lock_timeout_ms=MIGRATION_LOCK_TIMEOUT_MS)


class Connect(Protocol):
    def __call__(
        self,
        params: DatabaseParams,
        *,
        application_name: str,
        session: Session,
        ssl_root_cert: str | None,
    ) -> pg8000.native.Connection: ...


def _tune_keepalive(sock: socket.socket) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Linux names; elsewhere the system's defaults (hours) stay.
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_SECONDS),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_SECONDS),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def open_connection(
    params: DatabaseParams,
    *,
    application_name: str,
    session: Session = HANDLER_SESSION,
    ssl_root_cert: str | None = None,
) -> pg8000.native.Connection:
    # pg8000's `timeout` is the socket's timeout for the whole session, not just for
    # connecting: it is used for the connection and its startup only, then replaced.
    conn = pg8000.native.Connection(
        user=params.user,
        password=params.password,
        host=params.host,
        port=params.port,
        database=params.database,
        ssl_context=ssl_option(effective_sslmode(params), ssl_root_cert),
        timeout=CONNECT_TIMEOUT_SECONDS,
        application_name=application_name,
        tcp_keepalive=True,
    )
    try:
        # Part of connecting: a reconnected session gets the same limits as the first.
        conn.run(session.sql)
        sock: socket.socket = conn._usock  # pg8000 offers no public handle
        _tune_keepalive(sock)
        sock.settimeout(session.socket_timeout)
    except BaseException:
        with contextlib.suppress(Exception):  # the socket may already be broken
            conn.close()
        raise
    return conn


class Database:
    """A lazily opened connection with reconnect; safe to share across invocations."""

    def __init__(
        self,
        config: DatabaseConfig,
        *,
        application_name: str = "image-archive",
        session: Session = HANDLER_SESSION,
        connect: Connect = open_connection,
        reconnect: bool = True,
    ) -> None:
        self._config = config
        self._application_name = application_name
        self.session = session
        # False for a session whose state must not be lost silently (migrate's advisory
        # lock): a lost connection then raises DatabaseUnavailable instead of running the
        # statement again on a new session.
        self._reconnect = reconnect
        self._connect_fn = connect
        self._conn: pg8000.native.Connection | None = None
        self._prepared: dict[str, pg8000.native.PreparedStatement] = {}
        self._lock = threading.Lock()
        self.connections_opened = 0
        self.statements_run = 0

    def _connect(self) -> pg8000.native.Connection:
        def connect(params: DatabaseParams) -> pg8000.native.Connection:
            return self._connect_fn(
                params,
                application_name=self._application_name,
                session=self.session,
                ssl_root_cert=self._config.ssl_root_cert,
            )

        try:
            conn = connect(database_params(self._config))
        except pg8000.exceptions.DatabaseError as error:
            if sqlstate(error) not in _AUTH_FAILED or not self._config.secret_arn:
                raise
            # The password may have been rotated since the secret was cached.
            conn = connect(database_params(self._config, force=True))
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
                    if attempt == 2 or not self._reconnect:
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
            if sqlstate(error) not in _STALE_STATEMENT:
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
