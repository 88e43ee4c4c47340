"""`archive-ctl grants --role`: real roles in a database of their own, checked against what the
release needs; what it prints is what to run, and running it completes the role."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pg8000.exceptions
import pytest

from devkit.postgres import apply_schema, connect
from lib.cli.context import (
    EXIT_ERROR,
    EXIT_MISSING_GRANTS,
    EXIT_NO_ROLE,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
)
from lib.platform import grants
from lib.platform import migration_file as mf
from lib.platform.grants import describe_permission_denied
from lib.platform.schema import split_statements
from tests.integration.test_cli import Ctl

# Every GRANT the release needs, for a role named `grantee` (replaced by the real name).
EVERYTHING = grants.grant_statements("grantee", grants.privileges(mf.load_declaration()))


@pytest.fixture
def ctl(capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


@pytest.fixture
def database(blank_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """The project's schema in a database of its own (roles' privileges stay there), with
    archive-ctl pointed at it as the superuser, and an admin connection."""
    apply_schema(blank_database)
    monkeypatch.setenv("DATABASE_URL", blank_database)
    monkeypatch.delenv("DB_SECRET_ARN", raising=False)
    admin = connect(blank_database)
    yield blank_database, admin
    admin.close()


@pytest.fixture
def make_role(database: tuple[str, Any]) -> Iterator[Callable[..., str]]:
    """`make_role(*grants)`: a login role with exactly those GRANTs (to `grantee`)."""
    _, admin = database
    roles: list[str] = []

    def make(*statements: str) -> str:
        role = f"grants_{uuid.uuid4().hex[:10]}"
        admin.run(f"CREATE ROLE {role} LOGIN")
        roles.append(role)
        for statement in statements:
            admin.run(named(statement, role).rstrip(";"))
        return role

    yield make
    for role in roles:
        admin.run(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r", r=role
        )
        admin.run(f"DROP OWNED BY {role}")
        admin.run(f"DROP ROLE {role}")


def named(statement: str, role: str) -> str:
    return re.sub(r"\bgrantee\b", role, statement)


def as_role(dsn: str, role: str) -> Any:
    parts = urlsplit(dsn)
    return connect(urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}")))


def printed_grants(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("GRANT")]


def test_a_role_with_the_documented_grants_has_everything(ctl: Ctl, make_role: Any) -> None:
    role = make_role(*EVERYTHING)

    assert ctl("grants", "--role", role) == EXIT_OK
    assert (
        f"role {role} has all {len(grants.privileges(mf.load_declaration()))} privileges" in ctl.out
    )
    assert printed_grants(ctl.out) == []


def test_a_role_missing_the_update_of_one_column_gets_that_one_grant(
    ctl: Ctl, make_role: Any, database: tuple[str, Any]
) -> None:
    dsn, _ = database
    role = make_role(
        *EVERYTHING, "REVOKE UPDATE (archive_staged_at) ON image_generation_records FROM grantee"
    )

    assert ctl("grants", "--role", role) == EXIT_MISSING_GRANTS
    assert printed_grants(ctl.out) == [
        f"GRANT UPDATE (archive_staged_at) ON image_generation_records TO {role};"
    ]
    assert f"role {role} lacks 1 of the" in ctl.out

    # What a worker of this release would meet, and the words it gets for it.
    conn = as_role(dsn, role)
    try:
        with pytest.raises(pg8000.exceptions.DatabaseError) as refused:
            conn.run("UPDATE image_generation_records SET archive_staged_at = now() WHERE id = 0")
    finally:
        conn.close()
    assert describe_permission_denied(refused.value) == (
        "42501: permission denied on table image_generation_records;"
        " `archive-ctl grants --role <role>` prints the GRANT statements this release needs"
    )
    # Told the role and what it lacks (lib.state.privileges reads them from the catalog).
    assert describe_permission_denied(
        refused.value,
        role=role,
        missing=[grants.Privilege("image_generation_records", "archive_staged_at", "UPDATE")],
    ) == (
        "42501: permission denied on table image_generation_records;"
        f" role {role} lacks UPDATE (archive_staged_at) on image_generation_records;"
        f" `archive-ctl grants --role {role}` prints the GRANT statements this release needs"
    )


def test_a_role_with_select_only_on_the_lane_table_is_told_to_grant_update(
    ctl: Ctl, make_role: Any
) -> None:
    lane = "GRANT SELECT, UPDATE ON image_archive_lane TO grantee;"
    assert lane in EVERYTHING
    role = make_role(
        *(s for s in EVERYTHING if s != lane), "GRANT SELECT ON image_archive_lane TO grantee"
    )

    assert ctl("grants", "--role", role) == EXIT_MISSING_GRANTS
    assert printed_grants(ctl.out) == [f"GRANT UPDATE ON image_archive_lane TO {role};"]


def test_what_it_prints_for_a_role_without_grants_completes_the_role(
    ctl: Ctl, make_role: Any, database: tuple[str, Any]
) -> None:
    _, admin = database
    admin.run("REVOKE USAGE ON SCHEMA public FROM PUBLIC")
    role = make_role()

    assert ctl("grants", "--role", role) == EXIT_MISSING_GRANTS
    printed = printed_grants(ctl.out)
    assert printed[0] == f"GRANT USAGE ON SCHEMA public TO {role};"
    assert printed[1:] == [named(s, role) for s in EVERYTHING]

    for statement in split_statements("\n".join(printed)):
        admin.run(statement)
    assert ctl("grants", "--role", role) == EXIT_OK


def test_missing_columns_say_to_migrate_first_and_an_unknown_role_is_an_error(
    ctl: Ctl, make_role: Any, database: tuple[str, Any]
) -> None:
    _, admin = database
    role = make_role(*EVERYTHING)
    admin.run("ALTER TABLE image_generation_records DROP COLUMN archive_staged_at CASCADE")

    assert ctl("grants", "--role", role) == EXIT_NOT_MIGRATED
    assert (
        "-- column image_generation_records.archive_staged_at does not exist:"
        " run `archive-ctl migrate` first"
    ) in ctl.out

    assert ctl("grants", "--role", "no_such_role_here") == EXIT_NO_ROLE
    assert "there is no role 'no_such_role_here'" in ctl.err


def test_without_a_role_it_checks_the_one_it_connects_as(
    ctl: Ctl, database: tuple[str, Any]
) -> None:
    assert ctl("grants") == EXIT_OK  # the throwaway cluster's superuser
    assert "is a superuser" in ctl.out


def test_migrate_as_a_role_that_does_not_own_the_table_says_whose_job_it_is(
    ctl: Ctl, make_role: Any, database: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, admin = database
    role = make_role(*EVERYTHING)  # everything the functions need, but not the owner
    admin.run("ALTER TABLE image_generation_records DROP COLUMN archive_staged_at CASCADE")
    parts = urlsplit(dsn)
    monkeypatch.setenv(
        "DATABASE_URL", urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
    )

    assert ctl("migrate") == EXIT_ERROR
    # The first thing it reads that only the owner may is the project's own table of
    # unfinished steps; the first thing it would change, the records' columns.
    assert "42501: image_archive_migration_steps may not be read by this role" in ctl.err
    assert "run `archive-ctl migrate` as the table's owner" in ctl.err
    admin.run(f"GRANT SELECT ON image_archive_migration_steps TO {role}")
    assert ctl("migrate") == EXIT_ERROR
    assert "add columns image_generation_records: archive_staged_at" in ctl.err
    assert "42501: only the owner of image_generation_records may change it" in ctl.err
    assert "run `archive-ctl migrate` as the table's owner" in ctl.err
