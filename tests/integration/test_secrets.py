"""No secret is ever written: not the Lsky token, not the database password, not a signed
URL's signature. Every log line, stdout/stderr, every column of every row and every
exception (with its chain) is searched, through success and failure paths."""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from devkit import images
from devkit.lsky import Behaviour
from lib.archive.message import encode
from lib.platform.config import DatabaseConfig
from lib.platform.db import Database
from lib.platform.errors import DatabaseUnavailable
from lib.transfer.download import Downloader
from lib.transfer.failures import ArchiveFailure
from lib.transfer.imagetype import PNG as PNG_TYPE
from lib.transfer.imagetype import DownloadedImage
from lib.transfer.lsky import LskyClient
from tests.integration.conftest import ArchiveHarness
from tests.support import HANG_SECONDS, fetch_image, fetch_record, reset_lane, seed_record

TOKEN_SECRET = "tok-5ecret-Zq8Hx1Lm"
TOKEN = f"42|{TOKEN_SECRET}"
PASSWORD = "pw-5ecret-Kd3Vb9Qe"
SIGNATURE = "sig-5ecret-Yw7Rt2Np"
SECRETS = (TOKEN_SECRET, PASSWORD, SIGNATURE)
ROLE = "archiver"
PNG = images.png(8, 8)


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def exception_text(error: BaseException) -> str:
    """Everything an exception could show: message, repr, and its whole chain."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current), *map(repr, current.args)]
        parts += traceback.format_exception(current)
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


@pytest.fixture
def role_dsn(pg_dsn: str, db: Any) -> Iterator[str]:
    """A login role with a password, and a DSN that carries it."""
    db.run(f"DROP ROLE IF EXISTS {ROLE}")
    db.run(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
    db.run(f"GRANT SELECT, UPDATE ON image_generation_records TO {ROLE}")
    db.run(f"GRANT SELECT ON users TO {ROLE}")
    db.run(f"GRANT SELECT, UPDATE ON image_archive_lane TO {ROLE}")
    db.run(f"GRANT SELECT, INSERT, UPDATE, DELETE ON image_archive_uploads TO {ROLE}")
    db.run(f"GRANT SELECT, INSERT, UPDATE, DELETE ON image_archive_upload_hours TO {ROLE}")
    db.run(f"GRANT SELECT, INSERT, DELETE ON image_archive_events TO {ROLE}")
    db.run(f"GRANT SELECT, INSERT, UPDATE ON image_archive_originals TO {ROLE}")
    db.run(f"GRANT SELECT, UPDATE ON image_archive_queue TO {ROLE}")
    parts = urlsplit(pg_dsn)
    netloc = f"{ROLE}:{PASSWORD}@{parts.hostname}:{parts.port}"
    yield urlunsplit(parts._replace(netloc=netloc))
    db.run(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :role", role=ROLE
    )
    db.run(
        "REVOKE ALL ON image_generation_records, users, image_archive_lane,"
        f" image_archive_uploads, image_archive_upload_hours, image_archive_events,"
        f" image_archive_originals, image_archive_queue FROM {ROLE}"
    )
    db.run(f"DROP ROLE IF EXISTS {ROLE}")


def signed(url: str) -> str:
    return f"{url}?X-Amz-Credential=AKIA0&X-Amz-Signature={SIGNATURE}"


def test_no_secret_in_logs_output_or_rows(
    archive_env: Any,
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    role_dsn: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    lsky.config = replace(lsky.config, token=TOKEN)
    archive_env(DATABASE_URL=role_dsn, LSKY_TOKEN=TOKEN)
    port = upstream.port
    cases: list[tuple[int, str, Behaviour | None]] = [
        (1, signed(upstream.add("/ok.png", PNG)), None),  # success
        (2, signed(upstream.add("/a.png", PNG)), Behaviour.unauthorized()),
        (3, signed(upstream.add("/b.png", PNG)), Behaviour.server_error()),
        # A misconfigured server echoing the token back in its message:
        (4, signed(upstream.add("/c.png", PNG)), Behaviour.status_false(f"bad {TOKEN}")),
        (5, signed(upstream.add("/gone.png", PNG, status=404)), None),
        (6, signed(f"http://user:{PASSWORD}@127.0.0.1:{port}/u.png"), None),
        (7, signed("http://127.0.0.1:9/closed.png"), None),  # connection refused
        (8, signed(upstream.add("/d.png", images.png(size=200_000), drop_after=1000)), None),
        (9, signed(upstream.add("/h.png", b"<html>" + SIGNATURE.encode())), None),
    ]
    for record_id, url, behaviour in cases:
        seed_record(db, record_id, image_url=url)
        if behaviour is not None:
            lsky.script(behaviour)
        response = archive.invoke(synthetic(archive, record_id))
        assert not leaks(json.dumps(response))
        reset_lane(db)  # the 401 pauses the lane; each case meets an open one

    assert fetch_record(db, 1)["archive_status"] == "SUCCEEDED"
    assert "[redacted]" in fetch_record(db, 4)["archive_error"]
    assert [fetch_record(db, n)["archive_error"] is not None for n in range(2, 10)] == [True] * 8

    # Lsky unreachable (urllib3's connection errors) and the database down, with the
    # password in the URL (pg8000's connection errors).
    seed_record(db, 10, image_url=signed(upstream.url("/ok.png")))
    archive_env(DATABASE_URL=role_dsn, LSKY_TOKEN=TOKEN, LSKY_BASE_URL="http://127.0.0.1:9")
    archive.invoke(synthetic(archive, 10))
    assert "could not connect to Lsky" in fetch_record(db, 10)["archive_error"]
    archive_env(DATABASE_URL=f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:9/none", LSKY_TOKEN=TOKEN)
    seed_record(db, 11, image_url=signed(upstream.url("/ok.png")))
    assert len(archive.invoke(synthetic(archive, 11))["batchItemFailures"]) == 1
    assert archive.log_for("database unavailable; message will be redelivered")

    # Every log line, everything printed, every column of every row.
    assert not leaks("\n".join(archive.raw_logs))
    captured = capfd.readouterr()
    assert not leaks(captured.out + captured.err)
    rows = db.run("SELECT * FROM image_generation_records")
    names = [column["name"] for column in db.columns]
    assert len(rows) == 11
    urls = {record_id: url for record_id, url, _ in cases}
    for values in rows:
        row = dict(zip(names, values, strict=True))
        # image_url is the generation service's input (signed, as it wrote it): read, never
        # written by the archive. Every other column is checked.
        if row["id"] in urls:
            assert row.pop("image_url") == urls[row["id"]]
        else:
            row.pop("image_url")
        assert not leaks(json.dumps(row, default=str)), row
    assert archive.raw_logs  # the paths above did log
    # Every record's story, as stored and as `archive-ctl show` prints it (text and JSON).
    events = db.run("SELECT record_id, kind, detail FROM image_archive_events")
    assert {kind for _, kind, _ in events} >= {"fetched", "upload_answered", "retried", "failed"}
    assert "[redacted]" in json.dumps([detail for _, _, detail in events], ensure_ascii=False)
    assert not leaks(json.dumps(events, default=str, ensure_ascii=False))
    from lib.cli import main as cli

    archive_env(DATABASE_URL=role_dsn, LSKY_TOKEN=TOKEN)  # archive-ctl reads as the role
    for record_id in range(1, 12):
        for extra in ([], ["--json"]):
            capfd.readouterr()
            cli.main(["show", str(record_id), *extra])
            shown = capfd.readouterr()
            assert f"{record_id}" in shown.out
            assert not leaks(shown.out + shown.err)


def synthetic(archive: ArchiveHarness, record_id: int) -> dict[str, Any]:
    from tests.support import sqs_event

    return sqs_event([encode(record_id)], archive.queues.arn)


@pytest.mark.parametrize(
    "path",
    ["closed", "refused-userinfo", "drop", "status-404", "not-image", "slow"],
)
def test_download_exceptions_carry_no_secret(
    upstream: Any, gate: threading.Event, path: str
) -> None:
    import ipaddress

    allowed = (ipaddress.ip_network("127.0.0.0/8"),)
    upstream.add("/drop.png", images.png(size=200_000), drop_after=1000)
    upstream.add("/status-404.png", PNG, status=404)
    upstream.add("/not-image.png", b"<html>" + SIGNATURE.encode())
    upstream.add("/slow.png", PNG, gate=gate)  # no answer before the deadline
    url = {
        "closed": "http://127.0.0.1:9/x.png",
        "refused-userinfo": f"http://u:{PASSWORD}@127.0.0.1:{upstream.port}/x.png",
    }.get(path, upstream.url(f"/{path}.png"))
    downloader = Downloader(max_bytes=10**6, allow_private_networks=allowed)
    # Only the slow one waits for its deadline; the others fail on their own.
    deadline = time.monotonic() + (0.5 if path == "slow" else HANG_SECONDS)
    with pytest.raises(ArchiveFailure) as excinfo:
        fetch_image(downloader, signed(url), deadline=deadline)
    assert not leaks(exception_text(excinfo.value))


@pytest.mark.parametrize("behaviour", ["unauthorized", "echo", "unreachable"])
def test_upload_exceptions_carry_no_secret(lsky: Any, behaviour: str) -> None:
    import io

    lsky.config = replace(lsky.config, token=TOKEN)
    base = "http://127.0.0.1:9" if behaviour == "unreachable" else lsky.base_url
    if behaviour == "unauthorized":
        lsky.script(Behaviour.unauthorized())
    elif behaviour == "echo":
        lsky.script(Behaviour.status_false(f"token {TOKEN} refused; secret {TOKEN_SECRET}"))
    client = LskyClient(base_url=base, token=lambda force: TOKEN)
    image = DownloadedImage(file=io.BytesIO(PNG), size=len(PNG), image_type=PNG_TYPE)
    with pytest.raises(ArchiveFailure) as excinfo:
        client.upload(image, filename="a.png", deadline=time.monotonic() + HANG_SECONDS)
    assert not leaks(exception_text(excinfo.value))


def test_database_exceptions_carry_no_secret() -> None:
    database = Database(DatabaseConfig(url=f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:9/none"))
    with pytest.raises(DatabaseUnavailable) as excinfo:
        database.run("SELECT 1")
    assert not leaks(exception_text(excinfo.value))
    assert PASSWORD not in repr(database._config)
