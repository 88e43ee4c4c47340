"""The local services every bench runs against, started once per `bench.run`.

PostgreSQL (devkit's throwaway cluster), the image provider and the Lsky stand-in,
each of the two HTTP servers in a process of its own: the process being measured
holds only the archive function, as on Lambda where the provider and Lsky are remote
machines. moto (SQS, and S3 for the staging and originals buckets) is started with the first
child's environment: every archive bench runs with staging on, as a deployed stack does;
those that say so keep originals too (ORIGINALS_ENV).
`limited()` starts a second provider and Lsky, each behind a link of LINK_BYTES_PER_SEC
(the transfer bench's limited pairs), `apart()` a provider that writes each answer's
header and body apart with Nagle on (the overhead bench's second case), and `remote_s3()`
an S3 that costs this machine what a remote one would (bench.remote_s3: the transfer
bench's originals), the first time each is asked for.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from bench.common import ROOT, SRC
from devkit.lsky import DEFAULT_TOKEN
from devkit.postgres import PostgresCluster, apply_schema, connect

REGION = "us-east-1"
STAGING_BUCKET = "bench-staging"
ORIGINALS_BUCKET = "bench-originals"
# What a bench adds to handler_env() to keep every archive's original, as KeepOriginals does.
ORIGINALS_ENV = {"ARCHIVE_ORIGINALS_BUCKET": ORIGINALS_BUCKET}
TINY = "/tiny.png"
TINY_BYTES = 200
# A tiny image from a slow provider: each download takes this long (the lane bench).
SLOW = "/slow.png"
SLOW_SECONDS = 5.0
# A provider's URL that expired: every download answers 403 (the lane bench).
GONE = "/gone.png"
# The limited pairs' links: both directions the same rate, as two remote hosts would be.
LINK_BYTES_PER_SEC = 40_000_000
# Upstream routes: path -> (size, chunked). The sizes are the issue's: 10 MB and 50 MB.
ROUTES: dict[str, tuple[int, bool]] = {
    TINY: (TINY_BYTES, False),
    SLOW: (TINY_BYTES, False),
    "/img-10mb.png": (10_000_000, False),
    "/img-50mb.png": (50_000_000, False),
    # No Content-Length (chunked): the archive cannot stream into a sized upload.
    "/img-50mb-chunked.png": (50_000_000, True),
}


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a bench child: src/ and the repo on the path, no AWS leaks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PG"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT)])
    env.update(extra or {})
    return env


def _read_announcement(process: subprocess.Popen[str], prefix: str) -> str:
    """The value of the `PREFIX=value` line a server prints once it is listening."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip().split("=", 1)[1]
    raise RuntimeError(f"{process.args!r} exited before announcing {prefix}")


@dataclass(frozen=True)
class Limited:
    """A provider and a Lsky stand-in behind links of LINK_BYTES_PER_SEC."""

    upstream_url: str
    lsky_url: str


class Services:
    """`with Services() as s:` PostgreSQL + provider + Lsky; `s.handler_env()` for children."""

    def __init__(self) -> None:
        self.cluster = PostgresCluster()
        self.dsn = ""
        self.db: Any = None
        self.upstream_url = ""
        self.lsky_url = ""
        self.moto_endpoint: str | None = None
        self._moto: Any = None
        self._processes: list[subprocess.Popen[str]] = []
        self.lsky_storage = Path(tempfile.mkdtemp(prefix="bench-lsky-"))
        self._limited: Limited | None = None
        self._apart = ""
        self._remote_s3 = ""
        self._ids = itertools.count(1)

    def start(self) -> Self:
        self.cluster.start()
        self.dsn = self.cluster.create_database("bench")
        apply_schema(self.dsn)
        self.db = connect(self.dsn)
        self.db.run("INSERT INTO users (id, username) VALUES (1, 'bench') ON CONFLICT DO NOTHING")
        self.upstream_url, self.lsky_url = self._start_pair()
        return self

    def _start_pair(self, link_rate: int | None = None) -> tuple[str, str]:
        """A provider and a Lsky stand-in, behind links of `link_rate` bytes a second."""
        routes = [f"{path}={size}{':chunked' * chunk}" for path, (size, chunk) in ROUTES.items()]
        routes = [r + f":delay={SLOW_SECONDS}" if r.startswith(SLOW) else r for r in routes]
        routes.append(f"{GONE}=0:status=403")
        link = [] if link_rate is None else [f"--link-rate={link_rate}"]
        upstream = self._spawn([sys.executable, "-m", "bench.upstream", *routes, *link])
        storage = self.lsky_storage / ("plain" if link_rate is None else "limited")
        lsky = self._spawn([sys.executable, "-m", "devkit.lsky", "--storage", str(storage), *link])
        return (
            _read_announcement(upstream, "UPSTREAM_URL="),
            _read_announcement(lsky, "LSKY_BASE_URL="),
        )

    def limited(self) -> Limited:
        """The provider and Lsky behind limited links, started once."""
        if self._limited is None:
            self._limited = Limited(*self._start_pair(LINK_BYTES_PER_SEC))
        return self._limited

    def apart(self) -> str:
        """The URL of a provider of TINY that leaves Nagle's algorithm on (`bench.upstream
        --nagle`, as Python's http.server): each answer's header and body in two writes,
        the body sent once the client has acknowledged the header. Started once."""
        if not self._apart:
            process = self._spawn(
                [sys.executable, "-m", "bench.upstream", f"{TINY}={TINY_BYTES}", "--nagle"]
            )
            self._apart = _read_announcement(process, "UPSTREAM_URL=")
        return self._apart

    def remote_s3(self) -> str:
        """The URL of an S3 that costs this machine what a remote one would (bench.remote_s3:
        PutObject received and answered, nothing stored). Started once."""
        if not self._remote_s3:
            process = self._spawn([sys.executable, "-m", "bench.remote_s3"])
            self._remote_s3 = _read_announcement(process, "REMOTE_S3_URL=")
        return self._remote_s3

    def remote_s3_puts(self) -> int:
        """How many PUTs bench.remote_s3 has answered (0 before it started)."""
        if not self._remote_s3:
            return 0
        import urllib3  # noqa: PLC0415

        answer = urllib3.request("GET", f"{self._remote_s3}/__counts", timeout=10)
        return int(json.loads(answer.data)["puts"])

    def _spawn(self, args: list[str]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=python_env(),
            cwd=ROOT,
        )
        self._processes.append(process)
        return process

    def start_moto(self) -> str:
        if self.moto_endpoint is None:
            import boto3  # noqa: PLC0415

            from devkit.s3 import create_bucket  # noqa: PLC0415
            from devkit.sqs import start_moto_server  # noqa: PLC0415 - moto is slow to import

            self._moto = start_moto_server()
            self.moto_endpoint = self._moto.endpoint_url
            s3 = boto3.client(
                "s3",
                endpoint_url=self.moto_endpoint,
                region_name=REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",  # noqa: S106 - moto accepts any
            )
            create_bucket(s3, STAGING_BUCKET)
            create_bucket(s3, ORIGINALS_BUCKET, versioned=True)
        return self.moto_endpoint

    def originals_requests(self) -> list[tuple[str, str]]:
        """(method, path) of every S3 request moto served for the originals bucket."""
        if self._moto is None:
            return []
        calls: list[tuple[str, str]] = self._moto.s3_calls(f"/{ORIGINALS_BUCKET}/")
        return calls

    def pause_lane(self) -> None:
        """Close the upload lane for an hour: archives capture (stage) instead of upload."""
        self.db.run(
            "UPDATE image_archive_lane SET paused_until = now() + interval '1 hour',"
            " pause_reason = 'rate_limit', paused_since = now() WHERE lane = 'lsky'"
        )

    def open_lane(self) -> None:
        self.db.run(
            "UPDATE image_archive_lane SET paused_until = NULL, pause_reason = NULL,"
            " paused_since = NULL WHERE lane = 'lsky'"
        )

    def staged(self, ids: list[int]) -> int:
        """How many of `ids` hold a staged copy."""
        [[count]] = self.db.run(
            "SELECT count(*) FROM image_generation_records "
            "WHERE id = ANY(CAST(:ids AS bigint[])) AND archive_staged_key IS NOT NULL",
            ids=ids,
        )
        return int(count)

    def originals_kept(self, ids: list[int]) -> int:
        """How many of `ids` have a kept original recorded."""
        [[count]] = self.db.run(
            "SELECT count(*) FROM image_archive_originals"
            " WHERE record_id = ANY(CAST(:ids AS bigint[]))",
            ids=ids,
        )
        return int(count)

    def stop(self) -> None:
        for process in self._processes:
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()  # bench.upstream exits on EOF
            process.terminate()  # devkit.lsky serves until a signal
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self._processes.clear()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.db.close()
            self.db = None
        self.cluster.stop()
        shutil.rmtree(self.lsky_storage, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- for the benches ------------------------------------------------------------

    def image_url(self, path: str) -> str:
        return self.upstream_url + path

    def seed(self, path: str, count: int = 1, *, upstream: str | None = None) -> list[int]:
        """`count` PENDING records of a SUCCEEDED generation whose image is at `path` (on
        `upstream`, by default the unlimited provider)."""
        ids = [next(self._ids) for _ in range(count)]
        self.db.run(
            "INSERT INTO image_generation_records "
            "(id, user_id, status, image_url, archive_status, archive_next_run_at) "
            "SELECT id, 1, 'SUCCEEDED', :url, 'PENDING', now() "
            "FROM unnest(CAST(:ids AS bigint[])) AS id",
            url=(upstream or self.upstream_url) + path,
            ids=ids,
        )
        return ids

    def statuses(self, ids: list[int]) -> dict[str, int]:
        rows = self.db.run(
            "SELECT archive_status, count(*) FROM image_generation_records "
            "WHERE id = ANY(CAST(:ids AS bigint[])) GROUP BY 1",
            ids=ids,
        )
        return {str(status): int(n) for status, n in rows}

    def handler_env(self, **extra: str) -> dict[str, str]:
        """The archive function's environment (the DESIGN.md contract) for a child process,
        staging on (a bucket on the local moto server)."""
        endpoint = self.start_moto()
        env = {
            "DATABASE_URL": self.dsn,
            "LSKY_BASE_URL": self.lsky_url,
            "LSKY_TOKEN": DEFAULT_TOKEN,
            "ARCHIVE_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_SERVICE_NAME": "image-archive",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }
        env["AWS_ENDPOINT_URL_SQS"] = env["AWS_ENDPOINT_URL_S3"] = endpoint
        env["AWS_ENDPOINT_URL_EVENTBRIDGE"] = endpoint
        env["ARCHIVE_STAGING_BUCKET"] = STAGING_BUCKET
        env.update(extra)
        return python_env(env)
