"""The archive says when Lsky altered the image: sha1 and size of the bytes in hand,
compared with Lsky's answer about the file it stored (issue 13)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour, LskyStandIn
from devkit.upstream import StreamBody
from lib.archive.message import encode
from tests.integration.conftest import ArchiveHarness
from tests.support import emf_metrics, fetch_record, seed_record


def sha1(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


PNG = images.png(8, 8)
ALTERED_LOG = "archived, but Lsky stored other bytes than the generated image"


def archived(archive: ArchiveHarness, db: Any, record_id: int) -> dict[str, Any]:
    assert archive.deliver(encode(record_id)) == {"batchItemFailures": []}
    row = fetch_record(db, record_id)
    assert row["archive_status"] == "SUCCEEDED"
    return row


@pytest.mark.parametrize("chunked", [False, True], ids=["streamed", "spooled"])
def test_identical_bytes_are_not_flagged(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    capsys: pytest.CaptureFixture[str],
    chunked: bool,
) -> None:
    # Big enough to cross many chunks on both paths (and the spool's 1 MiB in memory).
    data = images.png(size=3 * 1024 * 1024 + 17, seed=3)
    if chunked:
        upstream.add("/big.png", data, chunked=True)
    else:
        upstream.add("/big.png", StreamBody.of(lambda: iter([data]), len(data)))
    seed_record(db, 1, image_url=upstream.url("/big.png"))

    row = archived(archive, db, 1)

    assert row["archive_altered"] is False
    [image] = lsky.image_records()
    assert row["hosted_response"]["_archive"] == {
        "sent": {"sha1": sha1(data), "bytes": len(data)},
        "altered": False,
        "differs": [],
    }
    assert image.sha1 == sha1(data)
    assert "ArchivedAltered" not in emf_metrics(capsys)
    assert ALTERED_LOG not in [line.get("message") for line in archive.logs()]


@pytest.mark.parametrize(
    ("quality", "watermark"),
    [(75, False), (100, True), (75, True)],
    ids=["q75", "watermark", "both"],
)
@pytest.mark.parametrize("chunked", [False, True], ids=["streamed", "spooled"])
def test_a_re_encoding_or_watermarking_host_is_flagged(
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    lsky: LskyStandIn,
    capsys: pytest.CaptureFixture[str],
    quality: int,
    watermark: bool,
    chunked: bool,
) -> None:
    lsky.config.image_quality = quality
    lsky.config.watermark = watermark
    seed_record(db, 2, image_url=upstream.add("/a.png", PNG, chunked=chunked))

    row = archived(archive, db, 2)

    assert row["archive_altered"] is True
    note = row["hosted_response"]["_archive"]
    assert note["altered"] is True
    assert note["differs"] == ["sha1", "size"]
    assert note["sent"]["sha1"] == sha1(PNG)
    [image] = lsky.image_records()
    assert row["hosted_response"]["sha1"] == image.sha1 != note["sent"]["sha1"]
    warning = archive.log_for(ALTERED_LOG)
    assert warning["differs"] == ["sha1", "size"]
    assert warning["sent_sha1"] == sha1(PNG)
    assert warning["hosted_sha1"] == image.sha1
    assert warning["sent_bytes"] == len(PNG)
    assert emf_metrics(capsys)["ArchivedAltered"] == 1


def test_a_gif_is_not_re_encoded_and_not_flagged(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn
) -> None:
    lsky.config.image_quality = 75  # Lsky leaves ico and gif alone
    seed_record(db, 3, image_url=upstream.add("/a.gif", images.gif(), content_type="image/gif"))

    assert archived(archive, db, 3)["archive_altered"] is False


def test_an_adopted_image_is_not_compared(
    archive: ArchiveHarness, db: Any, upstream: Any, lsky: LskyStandIn, archive_env: Any
) -> None:
    archive_env(ARCHIVE_RETRY_DELAYS="1")
    lsky.config.image_quality = 75
    seed_record(db, 4, image_url=upstream.add("/a.png", PNG))
    lsky.script(Behaviour.drop(store=True))
    archive.deliver(encode(4))

    row = archived(archive, db, 4)

    # Nothing was sent by the attempt that adopted it: no verdict (NULL), said so.
    assert row["archive_altered"] is None
    assert row["hosted_response"]["_archive"] == {"adopted": True}
    assert lsky.upload_count == 1
