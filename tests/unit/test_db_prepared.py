"""Database.run prepares parameterised statements once per connection (fakes for pg8000)."""

from __future__ import annotations

from typing import Any

import pg8000.exceptions
import pytest

from lib.platform import db as dbmod
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database


class FakeStatement:
    def __init__(self, conn: FakeConnection, sql: str) -> None:
        self.conn, self.sql = conn, sql

    def run(self, **params: Any) -> list[list[Any]]:
        self.conn.log.append(("execute", self.sql))
        if self.conn.errors:
            raise self.conn.errors.pop(0)
        return [[params.get("x")]]


class FakeConnection:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.errors: list[Exception] = []
        self.closed = False

    def run(self, sql: str, **params: Any) -> list[list[Any]] | None:
        self.log.append(("run", sql))
        return None

    def prepare(self, sql: str) -> FakeStatement:
        self.log.append(("prepare", sql))
        return FakeStatement(self, sql)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def connections() -> list[FakeConnection]:
    return []


@pytest.fixture
def database(connections: list[FakeConnection]) -> Database:
    def connect(params: Any, **options: Any) -> FakeConnection:
        connections.append(FakeConnection())
        return connections[-1]

    return Database(DatabaseConfig(url="postgresql://u@h/d"), connect=connect)


def test_a_statement_is_prepared_once_and_executed_many_times(
    database: Database, connections: list[FakeConnection]
) -> None:
    assert database.run("SELECT :x", x=1) == [[1]]
    assert database.run("SELECT :x", x=2) == [[2]]
    assert connections[0].log == [
        ("prepare", "SELECT :x"),
        ("execute", "SELECT :x"),
        ("execute", "SELECT :x"),
    ]
    assert database.statements_run == 2


def test_statements_without_parameters_use_the_simple_protocol(
    database: Database, connections: list[FakeConnection]
) -> None:
    assert database.run("SELECT 1") == []
    assert connections[0].log == [("run", "SELECT 1")]


def test_a_new_connection_prepares_again(
    database: Database, connections: list[FakeConnection]
) -> None:
    database.run("SELECT :x", x=1)
    connections[0].errors.append(pg8000.exceptions.InterfaceError("network error"))
    assert database.run("SELECT :x", x=2) == [[2]]  # reconnected and retried
    assert connections[0].closed
    assert connections[1].log == [("prepare", "SELECT :x"), ("execute", "SELECT :x")]
    assert database.connections_opened == 2


@pytest.mark.parametrize("sqlstate", ["26000", "0A000"])
def test_a_statement_the_server_forgot_is_prepared_again(
    database: Database, connections: list[FakeConnection], sqlstate: str
) -> None:
    database.run("SELECT :x", x=1)
    connections[0].errors.append(pg8000.exceptions.DatabaseError({"C": sqlstate, "M": "gone"}))
    assert database.run("SELECT :x", x=3) == [[3]]
    assert connections[0].log[-3:] == [
        ("execute", "SELECT :x"),
        ("prepare", "SELECT :x"),
        ("execute", "SELECT :x"),
    ]
    assert database.connections_opened == 1


def test_other_statement_errors_are_raised(
    database: Database, connections: list[FakeConnection]
) -> None:
    database.run("SELECT :x", x=1)
    connections[0].errors.append(pg8000.exceptions.DatabaseError({"C": "23505", "M": "dup"}))
    with pytest.raises(pg8000.exceptions.DatabaseError):
        database.run("SELECT :x", x=1)


def test_past_the_cap_statements_run_unprepared(
    database: Database, connections: list[FakeConnection], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dbmod, "MAX_PREPARED_STATEMENTS", 1)
    database.run("SELECT :x", x=1)
    database.run("SELECT :x + 1", x=1)
    assert connections[0].log == [
        ("prepare", "SELECT :x"),
        ("execute", "SELECT :x"),
        ("run", "SELECT :x + 1"),
    ]
