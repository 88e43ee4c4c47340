"""Streaming an upstream image straight into the Lsky upload (issue 7, point 1).

Library level: LskyClient.upload_stream against the Lsky stand-in (framing, abort on a
body that does not add up, the token-rotation resend). Handler level: with a
Content-Length nothing is spooled and the upload is under way before the download has
ended; without one the image is spooled as before.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour
from devkit.upstream import StreamBody
from lib.archive import copier
from lib.archive.message import encode
from lib.transfer import download
from lib.transfer.failures import ArchiveFailure, Kind, Stage, fail
from lib.transfer.lsky import LskyClient
from tests.integration.conftest import ArchiveHarness
from tests.support import assert_aborted_upload_stored_nothing, fetch_record, seed_record

IMAGE = images.png(size=600_000)
TOKEN = "1|local-test-token"


def pieces(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for offset in range(0, len(data), size):
        yield data[offset : offset + size]


def client(lsky: Any, token: Any = None) -> LskyClient:
    return LskyClient(base_url=lsky.base_url, token=token or (lambda force: lsky.token))


def stored_bytes(lsky: Any, url: str) -> bytes:
    return Path(lsky.stored_path(url)).read_bytes()


def deadline(seconds: float = 10) -> float:
    return time.monotonic() + seconds


# -- LskyClient.upload_stream ----------------------------------------------------------


def test_upload_stream_stores_exactly_the_chunks(lsky: Any) -> None:
    hosted = client(lsky).upload_stream(
        pieces(IMAGE), size=len(IMAGE), mime_type="image/png", filename="s.png", deadline=deadline()
    )
    assert stored_bytes(lsky, hosted.url) == IMAGE
    [upload] = lsky.uploads
    assert upload.size == len(IMAGE)
    assert upload.sha256 == hashlib.sha256(IMAGE).hexdigest()
    assert upload.filename == "s.png"
    assert upload.content_type == "image/png"


@pytest.mark.parametrize(("label", "data"), [("short", IMAGE[:-1]), ("long", IMAGE + b"\0")])
def test_a_body_that_does_not_add_up_aborts_and_stores_nothing(
    lsky: Any, label: str, data: bytes
) -> None:
    with pytest.raises(ArchiveFailure) as excinfo:
        client(lsky).upload_stream(
            pieces(data),
            size=len(IMAGE),
            mime_type="image/png",
            filename="x.png",
            deadline=deadline(),
        )
    failure = excinfo.value.failure
    assert (failure.stage, failure.kind) == (Stage.DOWNLOAD, Kind.CONNECTION)
    assert "did not match its length" in failure.message
    assert_aborted_upload_stored_nothing(lsky)


def test_an_error_from_the_source_aborts_and_passes_through(lsky: Any) -> None:
    def source() -> Iterator[bytes]:
        yield IMAGE[:200_000]
        raise fail(Stage.DOWNLOAD, Kind.TIMEOUT, "upstream too slow")

    with pytest.raises(ArchiveFailure, match="upstream too slow") as excinfo:
        client(lsky).upload_stream(
            source(),
            size=len(IMAGE),
            mime_type="image/png",
            filename="x.png",
            deadline=deadline(),
        )
    assert excinfo.value.failure.kind is Kind.TIMEOUT
    assert_aborted_upload_stored_nothing(lsky)


def test_a_rotated_token_resends_from_a_reopened_source(lsky: Any) -> None:
    lsky.config = replace(lsky.config, token="1|rotated")
    asked: list[bool] = []

    def token(force: bool) -> str:
        asked.append(force)
        return "1|rotated" if force else TOKEN

    reopened: list[int] = []

    def reopen() -> Iterator[bytes]:
        reopened.append(1)
        return pieces(IMAGE)

    hosted = client(lsky, token).upload_stream(
        pieces(IMAGE),
        size=len(IMAGE),
        mime_type="image/png",
        filename="r.png",
        deadline=deadline(),
        reopen=reopen,
    )
    assert asked == [False, True]
    assert reopened == [1]
    assert stored_bytes(lsky, hosted.url) == IMAGE
    assert [u.outcome for u in lsky.uploads] == ["unauthenticated", "success"]


def test_without_reopen_a_401_is_final_but_the_token_is_refreshed(lsky: Any) -> None:
    lsky.script(Behaviour.unauthorized())
    asked: list[bool] = []

    def token(force: bool) -> str:
        asked.append(force)
        return "1|other" if force else TOKEN

    with pytest.raises(ArchiveFailure) as excinfo:
        client(lsky, token).upload_stream(
            pieces(IMAGE),
            size=len(IMAGE),
            mime_type="image/png",
            filename="r.png",
            deadline=deadline(),
        )
    assert excinfo.value.failure.status == 401
    assert asked == [False, True]  # the next attempt starts with the fresh token
    assert lsky.upload_count == 1


# -- through the handler -----------------------------------------------------------------


def test_with_a_content_length_nothing_is_spooled_and_the_upload_overlaps(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spool(stream: Any) -> Any:
        raise AssertionError("spooled although the upstream sent a Content-Length")

    monkeypatch.setattr(copier, "spool", no_spool)
    half = len(IMAGE) // 2
    overlapped = threading.Event()
    incoming = Path(lsky.storage_dir) / ".incoming"

    def body() -> Iterator[bytes]:
        # Hold the second half back until Lsky has started receiving the file: that
        # only happens if the upload began before the download finished. (Give up
        # after a while so a sequential implementation fails instead of hanging.)
        yield IMAGE[:half]
        give_up = time.monotonic() + 5
        while time.monotonic() < give_up:
            if any(incoming.iterdir()):
                overlapped.set()
                break
            time.sleep(0.005)
        yield IMAGE[half:]

    upstream.add("/o.png", StreamBody.of(body, len(IMAGE)))
    seed_record(db, 70, image_url=upstream.url("/o.png"))

    assert archive.deliver(encode(70)) == {"batchItemFailures": []}
    assert overlapped.is_set(), "the upload did not start before the download ended"
    row = fetch_record(db, 70)
    assert row["archive_status"] == "SUCCEEDED"
    assert stored_bytes(lsky, row["hosted_image_url"]) == IMAGE


def test_without_a_content_length_the_image_is_spooled(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spooled: list[int] = []

    def counting_spool(stream: Any, **options: Any) -> Any:
        image = download.spool(stream, **options)
        spooled.append(image.size)
        return image

    monkeypatch.setattr(copier, "spool", counting_spool)
    upstream.add("/c.png", StreamBody.of(lambda: pieces(IMAGE)), chunked=True)
    seed_record(db, 71, image_url=upstream.url("/c.png"))

    assert archive.deliver(encode(71)) == {"batchItemFailures": []}
    assert spooled == [len(IMAGE)]
    row = fetch_record(db, 71)
    assert stored_bytes(lsky, row["hosted_image_url"]) == IMAGE


def test_a_rotated_token_mid_attempt_downloads_the_image_again(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lib.archive import runtime

    # The container cached the old token; Lsky has the rotated one.
    monkeypatch.setattr(
        runtime, "lsky_token", lambda token, arn, *, force=False: "1|rotated" if force else TOKEN
    )
    runtime.reset()
    lsky.config = replace(lsky.config, token="1|rotated")
    upstream.add("/t.png", StreamBody.of(lambda: pieces(IMAGE), len(IMAGE)))
    seed_record(db, 72, image_url=upstream.url("/t.png"))

    assert archive.deliver(encode(72)) == {"batchItemFailures": []}
    assert upstream.hits("/t.png") == 2  # the first body went to the refused request
    assert [u.outcome for u in lsky.uploads] == ["unauthenticated", "success"]
    row = fetch_record(db, 72)
    assert row["archive_attempts"] == 1
    assert stored_bytes(lsky, row["hosted_image_url"]) == IMAGE
