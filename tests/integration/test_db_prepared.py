"""Prepared statements on a real server: one per statement per session, and what rows
come back is the same as pg8000's one-off execution."""

from __future__ import annotations

from lib.platform.config import DatabaseConfig
from lib.platform.db import Database


def test_one_server_side_statement_per_sql_text(pg_dsn: str) -> None:
    database = Database(DatabaseConfig(url=pg_dsn), application_name="prepared-test")
    try:
        for value in (1, 2, 3):
            rows = database.run(
                "SELECT CAST(:n AS int) * 2, CAST(:label AS text)", n=value, label=None
            )
            assert rows == [[value * 2, None]]
        # A name used twice is one parameter.
        assert database.run("SELECT CAST(:a AS int) + CAST(:a AS int)", a=20) == [[40]]
        assert database.run("SELECT count(*) FROM pg_prepared_statements") == [[2]]
        assert database.connections_opened == 1
    finally:
        database.close()
