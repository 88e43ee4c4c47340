"""A throwaway PostgreSQL cluster for tests and local runs.

`PostgresCluster` runs initdb into a temporary directory and starts `postgres`
on 127.0.0.1 with a free port, trust authentication and durability switched
off (nothing here needs to survive a crash). It takes about a second.

initdb and postgres refuse to run as root. When we are root (CI containers,
this dev box) both run as the `postgres` system user, with the temporary
directories chowned to it; Popen's `user=`/`group=` do the setuid after fork.

Run `python -m devkit.postgres` for a cluster with the project schema applied
that stays up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import pg8000.native

from devkit._cli import exit_cleanly_on_signals
from lib.platform import schema as migrate

__all__ = [
    "PostgresCluster",
    "apply_schema",
    "connect",
    "find_bindir",
    "schema_statements",
]

NOT_FOUND_MESSAGE = (
    "PostgreSQL server binaries not found: install postgresql "
    "(apt-get install -y postgresql) or set TEST_DATABASE_URL"
)

# Kept under its old name for callers of devkit; the one splitter lives in lib.migrate.
schema_statements = migrate.split_statements

# Durability is pointless for a cluster that is deleted on exit, and turning it
# off makes initdb + schema + TRUNCATE-per-test noticeably faster.
_SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "listen_addresses": "127.0.0.1",
    "max_connections": "50",
    "log_min_messages": "warning",
}

_START_TIMEOUT = 30.0


def find_bindir(
    pg_config: str | None = "pg_config", debian_root: Path = Path("/usr/lib/postgresql")
) -> Path:
    """Directory holding initdb/postgres/pg_ctl, or RuntimeError with a hint.

    `pg_config --bindir` first (it may come from libpq-dev without a server, so
    check that initdb is really there), then the newest Debian-style
    /usr/lib/postgresql/<major>/bin. The arguments exist for tests.
    """
    candidates: list[Path] = []
    pg_config = shutil.which(pg_config) if pg_config else None
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(out.stdout.strip()))

    def major(bindir: Path) -> float:
        try:
            return float(bindir.parent.name)
        except ValueError:
            return -1.0

    candidates += sorted(debian_root.glob("*/bin"), key=major, reverse=True)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "postgres", "pg_ctl")):
            return bindir
    raise RuntimeError(NOT_FOUND_MESSAGE)


def free_port() -> int:
    """A port that was free a moment ago (postgres must bind it itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def connect(dsn: str, **kwargs: Any) -> Any:
    """A `pg8000.native.Connection` for a postgresql:// URL (autocommit)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"not a postgresql:// URL: {parts.scheme}://...")
    return pg8000.native.Connection(
        user=unquote(parts.username or "postgres"),
        password=unquote(parts.password) if parts.password is not None else None,
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        database=unquote(parts.path.lstrip("/")) or "postgres",
        **kwargs,
    )


def apply_schema(dsn: str) -> None:
    """Apply base_schema.sql then archive_migration.sql, one statement at a time.

    pg8000.native runs each statement outside a transaction block, which
    CREATE INDEX CONCURRENTLY requires. Both files are idempotent; the splitter
    and runner are the ones `archive-ctl migrate` uses (lib.platform.schema).
    """
    conn = connect(dsn)
    try:
        migrate.apply(conn.run, migrate.load(migrate.schema_files(with_base_schema=True)))
    finally:
        conn.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresCluster:
    """initdb + postgres in a temp dir; `with PostgresCluster() as pg: pg.dsn`."""

    def __init__(self, *, port: int | None = None, user: str = "postgres") -> None:
        self._requested_port = port
        self.superuser = user
        self.port = 0
        self.bindir: Path | None = None
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._run_as: dict[str, Any] = {}
        self._log_path: Path | None = None

    # -- public API -------------------------------------------------------

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        if not self.port:
            raise RuntimeError("cluster is not started")
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> PostgresCluster:
        if self._process is not None:
            return self
        self.bindir = find_bindir()
        self._run_as = self._privilege_drop()
        self._root = Path(tempfile.mkdtemp(prefix="devkit-pg-"))
        atexit.register(self.stop)
        try:
            self._initdb()
            attempts = 1 if self._requested_port else 3
            for attempt in range(attempts):
                self.port = self._requested_port or free_port()
                try:
                    self._launch()
                    break
                except _PortTaken:
                    # free_port() is racy: someone grabbed it before postgres
                    # bound it. A fresh port almost always fixes that.
                    if attempt == attempts - 1:
                        raise RuntimeError(
                            f"PostgreSQL could not bind 127.0.0.1:{self.port}"
                        ) from None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Immediate shutdown and delete everything; safe to call twice."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            assert self.bindir is not None
            assert self._root is not None
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [
                        str(self.bindir / "pg_ctl"),
                        "stop",
                        "-D",
                        str(self._datadir),
                        "-m",
                        "immediate",
                        "-s",
                    ],
                    capture_output=True,
                    timeout=10,
                    check=False,
                    cwd=self._root,
                    **self._run_as,
                )
            # pg_ctl normally suffices; SIGQUIT is the same immediate shutdown
            # sent directly, and SIGKILL the last resort (it can leave
            # orphaned backends, hence not first).
            for escalate in (None, signal.SIGQUIT, signal.SIGKILL):
                if escalate is not None:
                    with contextlib.suppress(OSError):
                        process.send_signal(escalate)
                try:
                    process.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def create_database(self, name: str) -> str:
        """Create `name` if it does not exist; returns its DSN."""
        conn = connect(self.dsn)
        try:
            exists = conn.run("SELECT 1 FROM pg_database WHERE datname = :name", name=name)
            if not exists:
                conn.run(f"CREATE DATABASE {_quote_ident(name)}")
        finally:
            conn.close()
        return self.dsn_for(name)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------

    @property
    def _datadir(self) -> Path:
        assert self._root is not None
        return self._root / "data"

    @property
    def _sockdir(self) -> Path:
        assert self._root is not None
        return self._root / "sock"

    def _privilege_drop(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError(
                "running as root, and initdb refuses root: create a 'postgres' system user "
                "(the postgresql package does) or set TEST_DATABASE_URL"
            ) from None
        # extra_groups=[] drops root's supplementary groups too.
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def _chown(self, path: Path) -> None:
        if self._run_as:
            os.chown(path, self._run_as["user"], self._run_as["group"])

    def _initdb(self) -> None:
        assert self.bindir is not None
        assert self._root is not None
        self._chown(self._root)
        self._sockdir.mkdir(mode=0o700)
        self._chown(self._sockdir)
        result = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self._datadir),
                "-U",
                self.superuser,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",  # always available, and no collation surprises
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=self._root,  # the postgres user may not be able to read our cwd
            env=_child_env(),
            timeout=120,
            **self._run_as,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}): {result.stderr.strip()}")

    def _launch(self) -> None:
        assert self.bindir is not None
        assert self._root is not None
        self._log_path = self._root / f"postgres-{self.port}.log"
        args = [
            str(self.bindir / "postgres"),
            "-D",
            str(self._datadir),
            "-p",
            str(self.port),
            "-k",
            str(self._sockdir),
        ]
        for key, value in _SERVER_SETTINGS.items():
            args += ["-c", f"{key}={value}"]
        with self._log_path.open("wb") as log:
            # Our own fd, inherited across the setuid: the log needs no chown.
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._root,
                env=_child_env(),
                start_new_session=True,  # Ctrl-C in a terminal must not kill it first
                **self._run_as,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + _START_TIMEOUT
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                log = self._read_log()
                self._process = None
                if "could not bind" in log or "Address already in use" in log:
                    raise _PortTaken
                raise RuntimeError(f"postgres exited during startup:\n{log}")
            try:
                connect(self.dsn, timeout=2).close()
            except Exception as exc:  # "starting up", connection refused, ...
                last_error = exc
                time.sleep(0.02)
            else:
                return
        raise RuntimeError(
            f"postgres did not accept connections within {_START_TIMEOUT:.0f}s "
            f"({last_error!r}):\n{self._read_log()}"
        )

    def _read_log(self) -> str:
        if self._log_path is None:
            return ""
        try:
            return self._log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


class _PortTaken(Exception):
    pass


def _child_env() -> dict[str, str]:
    # A predictable environment: no PG* variables leaking in from the caller,
    # and a locale that exists everywhere.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env.pop("LANG", None)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.postgres",
        description="Start a throwaway PostgreSQL with the project schema; Ctrl-C stops it.",
    )
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--database", default="archive", help="database to create")
    args = parser.parse_args(argv)

    with PostgresCluster(port=args.port) as cluster:
        dsn = cluster.create_database(args.database)
        apply_schema(dsn)
        print(f"DATABASE_URL={dsn}", flush=True)
        print("PostgreSQL is running; press Ctrl-C to stop (the data is deleted).", flush=True)
        exit_cleanly_on_signals()
        with contextlib.suppress(KeyboardInterrupt):
            while cluster.running:
                time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
