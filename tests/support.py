"""Helpers shared by the tests: `from tests.support import seed_record, ...`.

Timestamps passed to `seed_record` are either datetimes or a number of seconds
*before the database's now()* (so `locked_at=700` is "locked 700 s ago", and
`next_run_at=-30` is "due in 30 s"). Using the database clock keeps seeded
rows consistent with the SQL the handlers run (`now() - interval ...`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from devkit.context import LambdaContext
from devkit.sqs import DEFAULT_ACCOUNT, DEFAULT_REGION, lambda_event

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from lib.transfer.download import DownloadedImage, Downloader

__all__ = [
    "ARCHIVE_INDEXES",
    "DEFAULT_QUEUE_ARN",
    "HANG_SECONDS",
    "LSKY_FILE_FIELDS",
    "FakeLambdaContext",
    "QueueCounts",
    "assert_nothing_sent_to_lsky",
    "db_now",
    "fetch_image",
    "fetch_record",
    "lock_expired",
    "lsky_file",
    "make_due",
    "queue_attrs",
    "run_python",
    "seconds_ago",
    "seed_record",
    "seed_running",
    "sqs_event",
    "wait_until",
]

ROOT = Path(__file__).resolve().parents[1]

# How long a test waits for an event before calling it a hang. Never a measure of speed: a
# test waits for what it needs (a row, a log line, a request), however slow the machine.
HANG_SECONDS = 60.0

DEFAULT_QUEUE_ARN = f"arn:aws:sqs:{DEFAULT_REGION}:{DEFAULT_ACCOUNT}:archive-queue"

Timestamp = datetime | int | float | None

# The archive's indexes on image_generation_records, in the order the migration builds them.
ARCHIVE_INDEXES = (
    "image_generation_records_archive_pending_idx",
    "image_generation_records_archive_running_idx",
    "image_generation_records_archive_parked_idx",
    "image_generation_records_archive_backfilled_idx",
    "image_generation_records_archive_failed_idx",
    "image_generation_records_archive_failed_at_idx",
    "image_generation_records_archive_backfill_idx",
    "image_generation_records_archive_altered_idx",
    "image_generation_records_archive_staged_idx",
)

# An image URL for records whose image is never fetched (a name that cannot resolve).
UNREACHABLE_IMAGE_URL = "https://upstream.invalid/gen.png"

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")


def _timestamp_sql(column: str, value: Timestamp, params: dict[str, Any]) -> str:
    if value is None:
        return "NULL"
    params[column] = value
    if isinstance(value, datetime):
        return f"CAST(:{column} AS timestamptz)"
    return f"now() - CAST(:{column} AS double precision) * interval '1 second'"


def seed_record(
    conn: Any,
    record_id: int,
    *,
    user_id: int = 1,
    username: str = "alice",
    image_url: str,
    status: str = "SUCCEEDED",
    archive_status: str | None = "PENDING",
    attempts: int = 0,
    locked_by: str | None = None,
    locked_at: Timestamp = None,
    next_run_at: Timestamp = None,
    started_at: Timestamp = None,
    enqueued_at: Timestamp = None,
    **columns: Any,
) -> None:
    """Insert a generation record (and its user if missing).

    Extra keyword arguments set any other column, e.g. `archive_error="..."`.
    started_at=None keeps the table default (now()).
    """
    conn.run(
        "INSERT INTO users (id, username) VALUES (:id, :name) ON CONFLICT (id) DO NOTHING",
        id=user_id,
        name=username,
    )
    params: dict[str, Any] = {
        "id": record_id,
        "user_id": user_id,
        "status": status,
        "image_url": image_url,
        "archive_status": archive_status,
        "archive_attempts": attempts,
        "archive_locked_by": locked_by,
    }
    values = {name: f":{name}" for name in params}
    stamps = {
        "archive_locked_at": locked_at,
        "archive_next_run_at": next_run_at,
        "archive_enqueued_at": enqueued_at,
    }
    if started_at is not None:
        stamps["started_at"] = started_at
    for column, stamp in stamps.items():
        values[column] = _timestamp_sql(column, stamp, params)
    for column, value in columns.items():
        if not _IDENTIFIER.match(column):
            raise ValueError(f"not a column name: {column!r}")
        params[column] = value
        values[column] = f":{column}"
    conn.run(
        f"INSERT INTO image_generation_records ({', '.join(values)}) "
        f"VALUES ({', '.join(values.values())})",
        **params,
    )


def seed_running(
    conn: Any,
    record_id: int,
    *,
    image_url: str = UNREACHABLE_IMAGE_URL,
    attempts: int = 1,
    locked_by: str | None = "crashed-invocation",
    locked_at: Timestamp = 3600,
    **columns: Any,
) -> None:
    """A record under way: RUNNING on attempt `attempts`, its lock taken `locked_at` seconds
    ago by `locked_by` (by default a worker that died an hour ago: the lock has expired).
    Other columns as for `seed_record`."""
    seed_record(
        conn,
        record_id,
        image_url=image_url,
        archive_status="RUNNING",
        attempts=attempts,
        locked_by=locked_by,
        locked_at=locked_at,
        **columns,
    )


def fetch_image(downloader: Downloader, url: str, *, deadline: float) -> DownloadedImage:
    """The whole image in hand, as the worker gets it: open (guard, redirects, sniff), then
    hold (lib.transfer.held)."""
    from lib.transfer.held import hold

    with downloader.open(url, deadline=deadline) as stream:
        return hold(stream, stream.image_type)


def fetch_record(conn: Any, record_id: int) -> dict[str, Any]:
    """The row as {column: value}; LookupError if it does not exist."""
    rows = conn.run("SELECT * FROM image_generation_records WHERE id = :id", id=record_id)
    if not rows:
        raise LookupError(f"no image_generation_records row with id {record_id}")
    names = [column["name"] for column in conn.columns]
    return dict(zip(names, rows[0], strict=True))


# The one context object of devkit; the tests' historical name.
FakeLambdaContext = LambdaContext


def sqs_event(
    bodies: Iterable[str | Mapping[str, Any]],
    queue_arn: str = DEFAULT_QUEUE_ARN,
    *,
    receive_count: int = 1,
) -> dict[str, Any]:
    """A Lambda SQS event without a queue (receipt handles are fake).

    Mappings are JSON-encoded; strings are used verbatim (for malformed bodies).
    """
    return lambda_event(bodies, queue_arn, receive_count=receive_count)


class QueueCounts(NamedTuple):
    visible: int
    not_visible: int
    delayed: int


def queue_attrs(sqs: SQSClient, url: str) -> QueueCounts:
    """ApproximateNumberOfMessages{,NotVisible,Delayed} (exact on moto)."""
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return QueueCounts(
        visible=int(attributes["ApproximateNumberOfMessages"]),
        not_visible=int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        delayed=int(attributes["ApproximateNumberOfMessagesDelayed"]),
    )


def assert_nothing_sent_to_lsky(lsky: Any) -> None:
    """A download that broke off: no upload reached Lsky's app and nothing was stored. A
    relayed upload (lib.transfer.relay) may have begun; it was cut before its last byte,
    and a request whose body is cut never reaches the app (the stand-in counts it only)."""
    assert lsky.upload_count == 0
    assert lsky.uploads == []
    assert lsky.image_records() == []


def emf_metrics(capsys: Any) -> dict[str, float]:
    """Totals of the EMF metrics printed so far (read and consumed from capsys)."""
    totals: dict[str, float] = {}
    for line in capsys.readouterr().out.splitlines():
        if '"_aws"' not in line:
            continue
        doc = json.loads(line)
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                value = doc[metric["Name"]]
                values = value if isinstance(value, list) else [value]
                totals[metric["Name"]] = totals.get(metric["Name"], 0.0) + sum(values)
    return totals


def reset_lane(conn: Any) -> None:
    """Open the shared upload lane and empty its ledger (tests start from a quiet host)."""
    conn.run(
        "UPDATE image_archive_lane SET paused_until = NULL, pause_reason = NULL,"
        " pause_window = NULL, pause_detail = NULL, paused_since = NULL, version = 0"
    )
    conn.run("DELETE FROM image_archive_uploads")
    conn.run("DELETE FROM image_archive_upload_hours")


def reset_queue_mark(conn: Any) -> None:
    """Forget how far the worker has read the queue (each test has a queue of its own)."""
    conn.run("UPDATE image_archive_queue SET received_through = NULL")


def reset_audit_walk(conn: Any) -> None:
    conn.run(
        "UPDATE image_archive_audit_walk SET after_id = NULL, started_at = NULL, finished_at = NULL"
    )


def queue_mark(conn: Any) -> datetime | None:
    """The queue's receive mark as the claims left it (image_archive_queue)."""
    [[mark]] = conn.run("SELECT received_through FROM image_archive_queue WHERE queue = 'archive'")
    return mark if isinstance(mark, datetime) else None


def lane_row(conn: Any) -> dict[str, Any]:
    """The lane's pause, and what its ledger holds (uploads done or under way, bookings)."""
    [row] = conn.run(
        "SELECT paused_until, pause_reason, pause_window, pause_detail,"
        " (SELECT count(*) FROM image_archive_uploads WHERE state <> 'booked'),"
        " (SELECT count(*) FROM image_archive_uploads WHERE state = 'booked')"
        " FROM image_archive_lane WHERE lane = 'lsky'"
    )
    names = ("paused_until", "reason", "window", "detail", "uploads", "booked")
    return dict(zip(names, row, strict=True))


def set_uploads(conn: Any, count: int, *, within_seconds: float = 800, ago: float = 0) -> None:
    """The lane's ledger: `count` uploads spread over `within_seconds`, ending `ago`
    seconds ago (other uploads are cleared)."""
    conn.run("DELETE FROM image_archive_uploads")
    conn.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " SELECT 'lsky', now() - make_interval(secs => CAST(:ago AS double precision)"
        "   + CAST(:span AS double precision) * s / CAST(:n AS int)), 'done'"
        " FROM generate_series(1, CAST(:n AS int)) AS s",
        n=count,
        span=within_seconds,
        ago=ago,
    )


class Spool:
    """A Readable over bytes (lib.platform.s3_body: what HeldImage and Relay are to an
    original's body); `short_by` bytes fewer than its size, as a source that failed."""

    def __init__(self, data: bytes, *, short_by: int = 0) -> None:
        self.data = data
        self.size = len(data) + short_by
        self.reads = 0

    def read_at(self, offset: int, size: int) -> bytes:
        self.reads += 1
        return self.data[offset : offset + size]


def wait_until(
    condition: Callable[[], object],
    what: str = "the condition",
    *,
    timeout: float = HANG_SECONDS,
    interval: float = 0.02,
) -> None:
    """Poll `condition` until it is true; fail after `timeout` (a hang, not slowness)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened in {timeout:.0f} s: {what}"
        time.sleep(interval)


def db_now(conn: Any) -> datetime:
    """The database's clock (the one the handlers' SQL stamps rows with)."""
    [[now]] = conn.run("SELECT clock_timestamp()")
    return now


def make_due(conn: Any, record_id: int) -> None:
    """The row's backoff is over: due now (the clock moved on, without waiting for it)."""
    conn.run(
        "UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = :id",
        id=record_id,
    )


def lock_expired(conn: Any, record_id: int, *, ttl: float) -> bool:
    """Whether the row's lock is older than `ttl` seconds (by the database's clock)."""
    [[expired]] = conn.run(
        "SELECT archive_locked_at < now() - make_interval(secs => CAST(:ttl AS double precision))"
        " FROM image_generation_records WHERE id = :id",
        id=record_id,
        ttl=ttl,
    )
    return bool(expired)


def seconds_ago(conn: Any, stamp: datetime) -> float:
    """How long before the database's now() `stamp` is."""
    [[seconds]] = conn.run("SELECT EXTRACT(EPOCH FROM now() - CAST(:t AS timestamptz))", t=stamp)
    return float(seconds)


def run_python(
    *args: str, env: Mapping[str, str], timeout: float = HANG_SECONDS
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` (this interpreter) in the repository's root with exactly `env`, its
    output captured as text; a non-zero exit is the caller's to judge."""
    where = {"cwd": ROOT, "env": dict(env), "timeout": timeout}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, **where
    )


# The fields Lsky Pro's API gives of any stored file, in its order: the upload answer has
# them between key, name, pathname and its links; the image list between key, name and
# width, height, dates, pathname, links.
LSKY_FILE_FIELDS = ("origin_name", "size", "mimetype", "extension", "md5", "sha1")


def lsky_file(name: str, *, key: str, **fields: Any) -> dict[str, Any]:
    """A stored file as Lsky's API describes it (an upload answer's `data`, an item of the
    image list): `name` stored on 2026-12-02; `fields` add to it or replace its values."""
    pathname = f"2026/12/02/{name}"
    described = {
        "key": key,
        "name": name,
        "pathname": pathname,
        "origin_name": "alice_1_20261202T000000Z.png",
        "size": 1.2,
        "mimetype": "image/png",
        "extension": "png",
        "md5": "m",
        "sha1": "s",
        "links": {"url": f"https://img.example.com/i/{pathname}"},
    }
    return {**described, **fields}


# `make test-deep` (HYPOTHESIS_PROFILE=deep) runs each model-based test's examples 20 times.
MODEL_EXAMPLES_SCALE = {"ci": 1, "deep": 20}


def model_examples(n: int) -> int:
    """A model-based test's max_examples: `n` under `make test`, 20 n under `make test-deep`."""
    return n * MODEL_EXAMPLES_SCALE.get(os.environ.get("HYPOTHESIS_PROFILE", "ci"), 1)


def certificate(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (a CA too, so it can be its own bundle) and
    its key, as PEM files in `tmp`."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextlib.contextmanager
def https_server(cert: Path, key: Path, body: bytes, sni_seen: list[str | None]) -> Iterator[int]:
    """An HTTPS image server on 127.0.0.1 (HTTP/1.1: it keeps connections open) that
    answers every GET with `body` as image/png, noting each handshake's SNI name in
    `sni_seen`; yields its port."""
    import ssl
    import threading
    from http.server import ThreadingHTTPServer

    from devkit._http import QuietHandler

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: sni_seen.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
