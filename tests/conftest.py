"""Fixtures backed by real local services (devkit); nothing here is mocked.

Session-scoped servers are started on first use and reset per test by the
function-scoped fixture of the public name (`upstream`, `lsky`). A service that
cannot start FAILS the test with the reason: a skipped integration test is a
test that silently stopped guarding anything.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import HealthCheck, settings

from devkit.lsky import LskyStandIn
from devkit.postgres import PostgresCluster, apply_schema, connect
from devkit.s3 import create_bucket, remove_bucket
from devkit.sqs import DEFAULT_REGION, MotoServer, QueuePair, create_queue_pair, start_moto_server
from devkit.upstream import UpstreamServer
from tests.support import reset_audit_walk, reset_lane, reset_queue_mark

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

TEST_DATABASE = "archive_test"

# Model-based tests (marked `model`): `make test` runs the "ci" profile, the same examples
# every run so a red CI is reproducible; `make test-deep` runs 20 times as many, new ones
# each time. Each test sets its own max_examples through tests.support.model_examples.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- PostgreSQL ---------------------------------------------------------------------


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def _recreate_database(server_dsn: str, database: str) -> str:
    """DROP + CREATE `database` on the server of TEST_DATABASE_URL: a clean slate."""
    admin_dsn = server_dsn
    if urlsplit(server_dsn).path.lstrip("/") == database:
        admin_dsn = _with_database(server_dsn, "postgres")  # cannot drop the db we are in
    conn = connect(admin_dsn)
    try:
        conn.run(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.run(f'CREATE DATABASE "{database}"')
    finally:
        conn.close()
    return _with_database(server_dsn, database)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster | None]:
    """The throwaway cluster, or None when TEST_DATABASE_URL points elsewhere."""
    if os.environ.get("TEST_DATABASE_URL"):
        yield None
        return
    cluster = PostgresCluster()
    try:
        cluster.start()
    except Exception as exc:
        pytest.fail(f"cannot start a throwaway PostgreSQL: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_dsn(pg_cluster: PostgresCluster | None) -> str:
    """DSN of a fresh `archive_test` database with the project schema."""
    try:
        if pg_cluster is None:
            dsn = _recreate_database(os.environ["TEST_DATABASE_URL"], TEST_DATABASE)
        else:
            dsn = pg_cluster.create_database(TEST_DATABASE)
        apply_schema(dsn)
    except Exception as exc:
        where = "TEST_DATABASE_URL" if pg_cluster is None else "the throwaway cluster"
        pytest.fail(f"cannot prepare {TEST_DATABASE} on {where}: {exc}", pytrace=False)
    return dsn


@pytest.fixture
def db(pg_dsn: str) -> Iterator[Any]:
    """A pg8000.native.Connection on empty tables (TRUNCATE before each test)."""
    conn = connect(pg_dsn)
    # A connection left idle in a transaction by an earlier test would make
    # TRUNCATE wait forever; fail loudly instead.
    conn.run("SET lock_timeout = '5s'")
    try:
        conn.run(
            "TRUNCATE users, image_generation_records, image_archive_events,"
            " image_archive_audits, image_archive_originals, image_archive_restores,"
            " image_archive_outbox"
            " RESTART IDENTITY CASCADE"
        )
        reset_audit_walk(conn)  # the walk starts from the first record
        reset_lane(conn)  # shared state: every test starts with the lane open
        reset_queue_mark(conn)  # and with nothing read from its own queue yet
    except Exception as exc:
        conn.close()
        pytest.fail(f"cannot truncate the test tables (a leaked open transaction?): {exc}")
    conn.run("RESET lock_timeout")
    try:
        yield conn
    finally:
        conn.close()


# -- SQS and S3 (one moto server) -------------------------------------------------------


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """moto's SQS, S3 and EventBridge on 127.0.0.1, with the AWS_* environment pointing at it."""
    try:
        server = start_moto_server()
    except Exception as exc:
        pytest.fail(f"cannot start the moto server: {exc}", pytrace=False)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL_SQS", server.endpoint_url)
        env.setenv("AWS_ENDPOINT_URL_S3", server.endpoint_url)
        env.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", server.endpoint_url)
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", DEFAULT_REGION)
        env.setenv("AWS_REGION", DEFAULT_REGION)  # what the Lambda runtime sets
        # Real credentials or profiles must never leak into a test run.
        for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        yield server
    server.stop()


@pytest.fixture
def sqs(moto: MotoServer) -> SQSClient:
    import boto3  # 0.5 s to import: only tests that use SQS pay for it

    client: SQSClient = boto3.client(
        "sqs",
        endpoint_url=moto.endpoint_url,
        region_name=DEFAULT_REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return client


@pytest.fixture
def queues(sqs: SQSClient) -> Iterator[QueuePair]:
    """A fresh source queue + DLQ per test (moto's state is process-wide)."""
    pair = create_queue_pair(sqs, f"archive-{uuid.uuid4().hex[:12]}")
    yield pair
    for url in (pair.url, pair.dlq_url):
        with contextlib.suppress(Exception):
            sqs.delete_queue(QueueUrl=url)


@pytest.fixture
def s3(moto: MotoServer) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto.endpoint_url,
        region_name=DEFAULT_REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def staging_bucket(s3: Any) -> Iterator[str]:
    """A fresh, empty staging bucket per test (what template.yaml's StagingBucket is)."""
    name = create_bucket(s3, f"staging-{uuid.uuid4().hex[:12]}")
    yield name
    remove_bucket(s3, name)


@pytest.fixture
def originals_bucket(s3: Any) -> Iterator[str]:
    """A fresh, empty, versioned originals bucket per test (template.yaml's OriginalsBucket)."""
    name = create_bucket(s3, f"originals-{uuid.uuid4().hex[:12]}", versioned=True)
    yield name
    remove_bucket(s3, name)


# -- HTTP servers ----------------------------------------------------------------------


def _serving(make: Callable[[], Any], what: str) -> Iterator[Any]:
    """A session's stand-in, started (or the tests failed with why) and stopped at the end."""
    try:
        server = make().start()
    except Exception as exc:
        pytest.fail(f"cannot start {what}: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _upstream_server() -> Iterator[UpstreamServer]:
    yield from _serving(UpstreamServer, "the upstream image server")


@pytest.fixture(scope="session")
def _lsky_server() -> Iterator[LskyStandIn]:
    yield from _serving(LskyStandIn, "the Lsky stand-in")


@pytest.fixture
def upstream(_upstream_server: UpstreamServer) -> UpstreamServer:
    """The upstream image server with no routes and zero hits."""
    _upstream_server.reset()
    return _upstream_server


@pytest.fixture
def lsky(_lsky_server: LskyStandIn) -> LskyStandIn:
    """The Lsky stand-in with an empty script, no records, default config."""
    _lsky_server.reset()
    return _lsky_server


@pytest.fixture
def clean_metrics() -> Iterator[None]:
    """Outside a handler nothing flushes Powertools' metrics: a test that runs the code
    directly leaves none for the next test's."""
    from lib.platform.observability import metrics

    metrics.clear_metrics()
    yield
    metrics.clear_metrics()
