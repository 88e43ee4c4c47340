"""The local services of a `make local` run, and the functions' environment for them.

Everything binds to 127.0.0.1 on a free port and is stopped by the caller's ExitStack.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from devkit.demo.scenario import MAX_ATTEMPTS, Profile

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from devkit.lsky import LskyStandIn
    from devkit.postgres import PostgresCluster
    from devkit.sqs import MotoServer, QueuePair
    from devkit.upstream import UpstreamServer


@dataclass(frozen=True)
class Layout:
    """Where the local services listen and what they are called: free ports and the
    demo's names by default; `make services` takes env.json's (devkit.demo.stack)."""

    postgres_port: int = 0
    database: str = "archive"
    moto_port: int = 0
    lsky_port: int = 0
    lsky_token: str | None = None  # None: the stand-in's default token
    queue: str = "local-archive"
    dlq: str = "local-archive-dlq"
    bucket: str = "local-archive-staging"
    originals_bucket: str = "local-archive-originals"


@dataclass
class Services:
    cluster: PostgresCluster | None  # None: a database on an existing server (--database-url)
    dsn: str
    moto: MotoServer
    sqs: SQSClient
    queues: QueuePair
    upstream: UpstreamServer
    lsky: LskyStandIn
    staging_bucket: str  # on the same moto server (S3), as template.yaml's StagingBucket
    originals_bucket: str  # likewise, versioned, as template.yaml's OriginalsBucket


def _local_aws_environment(endpoint_url: str) -> None:
    """Point boto3 (here and in the containers, which inherit it) at moto, and make
    sure no real credentials or profile can be picked up by accident."""
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        os.environ.pop(name, None)
    os.environ.update(
        {
            "AWS_ENDPOINT_URL_SQS": endpoint_url,
            "AWS_ENDPOINT_URL_S3": endpoint_url,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
    )


def _throwaway_database(stack: contextlib.ExitStack, server_url: str) -> str:
    """A fresh database on an existing server, dropped when the run ends."""
    from urllib.parse import urlsplit, urlunsplit  # noqa: PLC0415

    from devkit.postgres import connect  # noqa: PLC0415

    name = f"archive_demo_{os.getpid()}_{int(time.time())}"
    admin = connect(server_url)
    admin.run(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        admin.run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

    stack.callback(drop)
    return urlunsplit(urlsplit(server_url)._replace(path="/" + name))


def start_services(
    stack: contextlib.ExitStack,
    data_dir: Path,
    database_url: str | None = None,
    layout: Layout = Layout(),
) -> Services:
    """Every service bound to 127.0.0.1 (on the layout's ports; 0: a free one) and named
    as the layout says; `stack` stops them in reverse."""
    import boto3  # noqa: PLC0415 - the slow imports wait until they are needed

    from devkit.lsky import LskyStandIn  # noqa: PLC0415
    from devkit.postgres import PostgresCluster, apply_schema  # noqa: PLC0415
    from devkit.s3 import create_bucket  # noqa: PLC0415
    from devkit.sqs import create_queue_pair, start_moto_server  # noqa: PLC0415
    from devkit.upstream import UpstreamServer  # noqa: PLC0415

    cluster: PostgresCluster | None = None
    if database_url:
        dsn = _throwaway_database(stack, database_url)
    else:
        cluster = stack.enter_context(PostgresCluster(port=layout.postgres_port or None))
        dsn = cluster.create_database(layout.database)
    apply_schema(dsn)
    moto = stack.enter_context(start_moto_server(port=layout.moto_port))
    _local_aws_environment(moto.endpoint_url)
    sqs = boto3.client("sqs")
    queues = create_queue_pair(
        sqs, layout.queue, max_receive_count=5, visibility_timeout=720, dlq_name=layout.dlq
    )
    staging_bucket = create_bucket(boto3.client("s3"), layout.bucket)
    originals_bucket = create_bucket(boto3.client("s3"), layout.originals_bucket, versioned=True)
    upstream = stack.enter_context(UpstreamServer())
    token = {"token": layout.lsky_token} if layout.lsky_token else {}
    lsky = stack.enter_context(
        LskyStandIn(storage_dir=data_dir / "lsky", port=layout.lsky_port, **token)
    )
    return Services(
        cluster, dsn, moto, sqs, queues, upstream, lsky, staging_bucket, originals_bucket
    )


def function_environment(services: Services, profile: Profile) -> dict[str, str]:
    """Both functions' environment: what template.yaml sets, pointed at the local services."""
    return {
        "DATABASE_URL": services.dsn,
        "DB_SSLMODE": "disable",
        "LSKY_BASE_URL": services.lsky.base_url,
        "LSKY_TOKEN": services.lsky.token,
        "ARCHIVE_QUEUE_URL": services.queues.url,
        "ARCHIVE_DLQ_URL": services.queues.dlq_url,
        "ARCHIVE_STAGING_BUCKET": services.staging_bucket,
        "ARCHIVE_ORIGINALS_BUCKET": services.originals_bucket,
        "AWS_ENDPOINT_URL_S3": services.moto.endpoint_url,
        "ARCHIVE_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "ARCHIVE_RETRY_DELAYS": ",".join(map(str, profile.retry_delays)),
        "ARCHIVE_LOCK_TTL_SECONDS": "180",
        # The upstream is on loopback, which the SSRF guard refuses by default.
        "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
        "ARCHIVE_SWEEP_GRACE_SECONDS": str(profile.sweep_grace),
        "ARCHIVE_REQUEUE_INTERVAL_SECONDS": str(profile.requeue_interval),
        "ARCHIVE_SWEEP_MAX_ROWS": "5000",
        "POWERTOOLS_SERVICE_NAME": "image-archive",
        "POWERTOOLS_METRICS_NAMESPACE": "ImageArchive",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }
