"""A second copy of every original: each archived image's bytes kept in a (moto) S3 bucket,
written beside the Lsky upload from the spool it reads, recorded by the success write;
S3 refusing or slow never fails or delays the record beyond the bound; off, nothing
calls S3 (lib.archive.originals, docs/explanation/staging-and-originals.md)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devkit import images
from devkit._http import BackgroundServer, QuietHandler
from devkit.lsky import Behaviour
from devkit.s3 import object_versions
from lib.archive import runtime
from lib.archive.confirmations import Confirmations
from lib.archive.original_step import NOT_IN_HAND, NOT_WRITTEN
from lib.archive.originals import WAIT_SECONDS
from tests.integration.world import World
from tests.support import HANG_SECONDS, emf_metrics, make_due, reset_lane, seed_record

IMAGE = images.png(16, 16, size=2_000_000, seed=36)  # past the spool's 1 MiB in memory
HALF = len(IMAGE) // 2
SHA256 = hashlib.sha256(IMAGE).hexdigest()
# Larger than what loopback's socket buffers hold: a sender blocks once the reader stops.
BIG = images.png(16, 16, size=24_000_000, seed=37)


def kept(db: Any, record_id: int) -> dict[str, Any] | None:
    """The record's row of image_archive_originals, by column."""
    rows = db.run(
        "SELECT bucket, key, version_id, sha256, bytes, mime_type, source"
        " FROM image_archive_originals WHERE record_id = :id",
        id=record_id,
    )
    if not rows:
        return None
    names = ("bucket", "key", "version_id", "sha256", "bytes", "mime_type", "source")
    return dict(zip(names, rows[0], strict=True))


def confirmed(db: Any, record_id: int) -> bool:
    [[value]] = db.run(
        "SELECT confirmed FROM image_archive_originals WHERE record_id = :id", id=record_id
    )
    return bool(value)


def confirmations() -> Confirmations:
    """The container's S3 answers kept for its next claim."""
    return runtime.archive_worker().transfer.original.originals.confirmations


def archived_detail(db: Any, record_id: int) -> dict[str, Any]:
    [[detail]] = db.run(
        "SELECT detail FROM image_archive_events WHERE record_id = :id AND kind = 'archived'",
        id=record_id,
    )
    value: dict[str, Any] = detail
    return value


def stored(s3: Any, row: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The bytes of the row's object (its version; its key alone while unconfirmed) and
    S3's answer about it."""
    version = {"VersionId": row["version_id"]} if row["version_id"] else {}
    answer = s3.get_object(Bucket=row["bucket"], Key=row["key"], **version)
    return answer["Body"].read(), answer


@pytest.fixture
def keeping(world: World, originals_bucket: str) -> World:
    """The world with originals kept (ARCHIVE_ORIGINALS_BUCKET set)."""
    world.settings(ARCHIVE_ORIGINALS_BUCKET=originals_bucket)
    return world


# -- kept beside the upload ------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True], ids=["relayed", "held whole"])
def test_the_original_is_kept_beside_the_upload_and_recorded_by_the_success_write(
    keeping: World,
    s3: Any,
    moto: Any,
    originals_bucket: str,
    chunked: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    world = keeping
    world.record(1, IMAGE, route={"chunked": chunked})
    world.deliver(1)  # the container's first message: connects, builds the worker
    statements = runtime.archive_worker().records.db.statements_run
    world.record(2, IMAGE, route={"chunked": chunked})
    before = len(moto.s3_calls())

    assert world.deliver(2) == {"batchItemFailures": []}

    calls = moto.s3_calls()[before:]
    assert world.state(2) == ("SUCCEEDED", 1)
    row = kept(world.db, 2)
    assert row is not None
    # The row records the object's key, SHA-256 and length: those of the bytes served.
    assert row["bucket"] == originals_bucket
    assert row["key"].startswith("originals/2/")
    assert row["key"].endswith(".png")
    assert (row["sha256"], row["bytes"], row["mime_type"]) == (SHA256, len(IMAGE), "image/png")
    assert row["source"] == "archive"
    body, answer = stored(s3, row)
    assert hashlib.sha256(body).hexdigest() == SHA256
    assert row["version_id"] in (None, answer["VersionId"])  # None: S3 had not answered
    # The object names its record; it is in the default storage class.
    assert answer["Metadata"] == {"record-id": "2", "source": "archive"}
    assert answer["StorageClass"] == "GLACIER_IR"
    # One PUT, streamed; no second round trip to the database: claim + success write.
    assert calls == [("PUT", f"/{originals_bucket}/{row['key']}")]
    assert runtime.archive_worker().records.db.statements_run - statements == 2
    assert archived_detail(world.db, 2)["original"] == row["key"]
    assert emf_metrics(capsys).get("OriginalsKept") == 2
    assert world.downloads(2) == 1


def test_the_original_is_written_as_the_download_lands(
    keeping: World, s3: Any, moto: Any, originals_bucket: str
) -> None:
    # Half the image, then nothing until S3 has the PUT of the original under way: only a
    # write that reads the download as it lands gets the rest sent.
    begun = moto.watch_s3("PUT", f"/{originals_bucket}/originals/3/")
    keeping.record(3, IMAGE, route={"gate_after": HALF, "gate": begun})

    assert keeping.deliver(3) == {"batchItemFailures": []}

    row = kept(keeping.db, 3)
    assert row is not None
    assert hashlib.sha256(stored(s3, row)[0]).hexdigest() == SHA256
    assert keeping.lsky.uploads[-1].sha256 == SHA256


@pytest.mark.parametrize("storage_class", ["STANDARD", "STANDARD_IA", "INTELLIGENT_TIERING"])
def test_the_storage_class_is_the_setting(
    keeping: World, s3: Any, originals_bucket: str, storage_class: str
) -> None:
    keeping.settings(
        ARCHIVE_ORIGINALS_BUCKET=originals_bucket, ARCHIVE_ORIGINALS_STORAGE_CLASS=storage_class
    )
    keeping.record(4, IMAGE)

    keeping.deliver(4)

    row = kept(keeping.db, 4)
    assert row is not None
    head = s3.head_object(Bucket=row["bucket"], Key=row["key"])
    assert head.get("StorageClass", "STANDARD") == storage_class  # S3 omits STANDARD


# -- off ---------------------------------------------------------------------------------------


def test_off_nothing_calls_s3(world: World, moto: Any) -> None:
    world.record(5, IMAGE)
    world.record(6, IMAGE, route={"chunked": True})
    s3_before = moto.requests("s3")

    world.deliver(5)
    world.deliver(6)

    assert world.state(5) == world.state(6) == ("SUCCEEDED", 1)
    assert moto.requests("s3") == s3_before  # counted at the server
    originals = runtime.archive_worker().transfer.original.originals
    assert originals.bucket is None
    assert kept(world.db, 5) is None
    assert "original" not in archived_detail(world.db, 5)
    assert "original_missing" not in archived_detail(world.db, 5)


# -- S3 refusing, S3 slow ---------------------------------------------------------------------


def test_an_original_s3_refuses_after_its_body_leaves_the_record_archived_and_it_unconfirmed(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.settings(ARCHIVE_ORIGINALS_BUCKET="no-such-originals-bucket")
    world.record(7, IMAGE)

    assert world.deliver(7) == {"batchItemFailures": []}

    assert world.state(7) == ("SUCCEEDED", 1)
    assert world.row(7)["archive_error"] is None
    row = kept(world.db, 7)
    assert row is not None
    assert (row["version_id"], confirmed(world.db, 7)) == (None, False)
    assert archived_detail(world.db, 7)["original"] == row["key"]
    assert len(world.lsky.image_records()) == 1
    # S3's refusal is told by the container's next claim; the original stays unconfirmed
    # (the audit looks: lib.audit.confirm).
    assert confirmations().wait(7, HANG_SECONDS)
    world.record(70, IMAGE)
    world.deliver(70)
    line = world.archive.log_for("no answer for an original recorded unconfirmed")
    assert "NoSuchBucket" in line["error"]
    assert emf_metrics(capsys).get("OriginalsFailed") == 1
    assert confirmed(world.db, 7) is False


class _StallingS3(QuietHandler):
    """An S3 that reads a request's body (or its first `read_first` bytes, and then no more
    until the test lets it: the client blocks sending) and answers nothing until the test
    lets it (then a 500): slower than any bound, and never the reason a test hangs."""

    def _stall(self) -> None:
        owner: StallingS3 = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)  # after a 100 Continue
        got = len(self.rfile.read(min(length, owner.read_first or length)))
        owner.requests += 1
        owner.stalled.set()
        owner.release.wait(HANG_SECONDS)
        self.close_connection = True
        try:
            while got < length and (chunk := self.rfile.read1(min(65536, length - got))):
                got += len(chunk)
            self.wfile.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass
        finally:
            owner.bodies.append((got, length))
            owner.judged.set()

    do_PUT = do_GET = do_POST = _stall


class StallingS3(BackgroundServer):
    handler_class = _StallingS3
    read_first: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.judged = threading.Event()
        self.requests = 0
        self.bodies: list[tuple[int, int]] = []  # (bytes that arrived, Content-Length)


@pytest.fixture
def stalling_s3(monkeypatch: pytest.MonkeyPatch, moto: Any) -> Iterator[StallingS3]:
    with StallingS3() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.base_url)
        try:
            yield server
        finally:
            server.release.set()


def test_s3_s_answer_never_holds_the_record(
    world: World, stalling_s3: StallingS3, capsys: pytest.CaptureFixture[str]
) -> None:
    world.settings(ARCHIVE_ORIGINALS_BUCKET="originals-bucket")
    world.record(8, IMAGE)

    assert world.deliver(8) == {"batchItemFailures": []}  # S3 has not answered yet

    assert stalling_s3.stalled.is_set()
    assert not stalling_s3.release.is_set()
    assert world.state(8) == ("SUCCEEDED", 1)
    row = kept(world.db, 8)
    assert row is not None
    assert (row["sha256"], row["version_id"], confirmed(world.db, 8)) == (SHA256, None, False)
    stalling_s3.release.set()  # then a 500: the retry would read the released spool again
    assert confirmations().wait(8, HANG_SECONDS)
    assert stalling_s3.requests == 1  # sealed, not sent again
    world.record(80, IMAGE)
    world.deliver(80)
    assert (
        "left unconfirmed"
        in world.archive.log_for("no answer for an original recorded unconfirmed")["error"]
    )
    assert emf_metrics(capsys).get("OriginalsFailed") == 1
    assert confirmed(world.db, 8) is False


def test_a_body_still_going_out_after_the_bound_is_cut_and_not_recorded(
    world: World, stalling_s3: StallingS3, capsys: pytest.CaptureFixture[str]
) -> None:
    # S3 takes the first MB and then no more: the body is not whole WAIT_SECONDS after
    # Lsky's answer, so it is cut there and the record is archived without an original.
    world.settings(ARCHIVE_ORIGINALS_BUCKET="originals-bucket")
    stalling_s3.read_first = 1_000_000
    world.record(18, BIG)

    assert world.deliver(18) == {"batchItemFailures": []}

    assert world.state(18) == ("SUCCEEDED", 1)
    assert kept(world.db, 18) is None
    line = world.archive.log_for("could not keep the original")
    assert f"no answer within {WAIT_SECONDS:.1f} s" in line["error"]
    assert "gone out whole" not in line["error"]
    assert emf_metrics(capsys).get("OriginalsFailed") == 1
    assert archived_detail(world.db, 18)["original_missing"] == NOT_WRITTEN
    stalling_s3.release.set()
    assert stalling_s3.judged.wait(HANG_SECONDS)
    [(arrived, length)] = stalling_s3.bodies  # cut short, not sent again
    assert arrived < length


# -- where parts meet -----------------------------------------------------------------------


def test_a_relayed_upload_cut_short_keeps_nothing(
    keeping: World, s3: Any, moto: Any, originals_bucket: str
) -> None:
    # Half the image; once the original's PUT is under way, the provider drops the
    # connection: the upload and the original's write are both cut before their end.
    begun = moto.watch_s3("PUT", f"/{originals_bucket}/")
    keeping.record(9, IMAGE, route={"gate_after": HALF, "drop_after": HALF, "gate": begun})

    assert len(keeping.deliver(9)["batchItemFailures"]) == 1

    assert keeping.state(9) == ("PENDING", 1)
    assert begun.is_set()
    assert object_versions(s3, originals_bucket) == []  # S3 stored nothing of a cut body
    assert kept(keeping.db, 9) is None
    assert keeping.lsky.image_records() == []

    keeping.upstream.add(keeping.path(9), IMAGE)  # the provider answers whole again
    make_due(keeping.db, 9)
    keeping.deliver(9)

    row = kept(keeping.db, 9)
    assert row is not None
    assert row["sha256"] == SHA256
    assert [key for key, _ in object_versions(s3, originals_bucket)] == [row["key"]]


def test_an_upload_lsky_refuses_records_no_original(
    keeping: World, s3: Any, moto: Any, originals_bucket: str
) -> None:
    # Lsky answers only once S3 has stored the original: the refused attempt's object stays
    # (nothing in the bucket is deleted), unrecorded and named in the log.
    written = moto.watch_s3("PUT", f"/{originals_bucket}/", answered=True)
    keeping.record(10, IMAGE)
    keeping.lsky.script(Behaviour.held(written, then=Behaviour.server_error()))

    assert len(keeping.deliver(10)["batchItemFailures"]) == 1

    assert keeping.state(10) == ("PENDING", 1)
    assert kept(keeping.db, 10) is None
    [(orphan, _)] = object_versions(s3, originals_bucket)
    line = keeping.archive.log_for(
        "an original was written for an upload Lsky did not take; not recorded"
    )
    assert line["original_key"] == orphan

    make_due(keeping.db, 10)
    keeping.deliver(10)

    row = kept(keeping.db, 10)
    assert row is not None
    assert row["key"] != orphan
    assert row["sha256"] == SHA256
    assert len(object_versions(s3, originals_bucket)) == 2


def test_an_upload_lsky_refuses_cuts_the_original_still_going_out(
    world: World, stalling_s3: StallingS3
) -> None:
    # S3 takes the first MB and then no more: the original's body is still going out
    # when Lsky refuses the upload. It is cut there: S3 keeps nothing of a body cut short.
    world.settings(ARCHIVE_ORIGINALS_BUCKET="originals-bucket")
    stalling_s3.read_first = 1_000_000
    world.record(11, BIG)
    world.lsky.script(Behaviour.server_error())

    assert len(world.deliver(11)["batchItemFailures"]) == 1

    assert world.state(11) == ("PENDING", 1)
    assert kept(world.db, 11) is None
    stalling_s3.release.set()
    assert stalling_s3.judged.wait(HANG_SECONDS)
    [(arrived, length)] = stalling_s3.bodies  # one request, cut short, not sent again
    assert arrived < length == len(BIG)
    assert "an original was written for an upload Lsky did not take; not recorded" not in [
        line.get("message") for line in world.archive.logs()
    ]


def test_an_adoption_without_the_bytes_in_hand_keeps_no_original(
    keeping: World, moto: Any, originals_bucket: str
) -> None:
    keeping.settings(ARCHIVE_ORIGINALS_BUCKET=originals_bucket, ARCHIVE_RETRY_DELAYS="1")
    keeping.record(12, IMAGE)
    # The answer is lost after Lsky stored it: the row knows what was sent, so the next
    # attempt looks it up before fetching anything and adopts it.
    written = moto.watch_s3("PUT", "/", answered=True)
    keeping.lsky.script(Behaviour.held(written, then=Behaviour.drop(store=True)))
    keeping.deliver(12)
    assert keeping.row(12)["archive_sent"] is not None
    s3_before = moto.requests("s3")

    make_due(keeping.db, 12)
    keeping.deliver(12)

    assert keeping.state(12) == ("SUCCEEDED", 2)
    assert archived_detail(keeping.db, 12)["adopted"] is True
    assert archived_detail(keeping.db, 12)["original_missing"] == NOT_IN_HAND
    assert kept(keeping.db, 12) is None
    assert moto.requests("s3") == s3_before
    assert keeping.downloads(12) == 1  # the provider was not asked again for it


def test_an_adoption_with_the_bytes_in_hand_keeps_them(
    keeping: World, s3: Any, moto: Any, originals_bucket: str
) -> None:
    keeping.record(15, IMAGE)
    keeping.lsky.script(Behaviour.drop(store=True))  # stored, the answer lost
    keeping.deliver(15)
    # What was sent is unknown (a row an older release wrote): the bytes are fetched for
    # the look-up, which adopts the stored image; they are what the original keeps.
    keeping.db.run("UPDATE image_generation_records SET archive_sent = NULL WHERE id = 15")
    make_due(keeping.db, 15)

    keeping.deliver(15)

    assert keeping.state(15) == ("SUCCEEDED", 2)
    assert archived_detail(keeping.db, 15)["adopted"] is True
    row = kept(keeping.db, 15)
    assert row is not None
    assert (row["sha256"], row["source"]) == (SHA256, "archive")
    assert archived_detail(keeping.db, 15)["original"] == row["key"]
    assert keeping.lsky.upload_count == 1  # nothing uploaded twice


def pause_lane(db: Any) -> None:
    db.run(
        "UPDATE image_archive_lane SET paused_until = now() + interval '1 hour',"
        " pause_reason = 'rate_limit', paused_since = now() WHERE lane = 'lsky'"
    )


@pytest.mark.parametrize("older_release", [False, True], ids=["captured", "older release's row"])
def test_a_staged_copy_becomes_the_original_server_side(
    keeping: World,
    s3: Any,
    moto: Any,
    originals_bucket: str,
    staging_bucket: str,
    older_release: bool,
) -> None:
    keeping.settings(
        ARCHIVE_ORIGINALS_BUCKET=originals_bucket, ARCHIVE_STAGING_BUCKET=staging_bucket
    )
    keeping.record(16, IMAGE, route={"fail_after": 1})  # served once, then expired (403)
    pause_lane(keeping.db)
    keeping.deliver(16)  # captured into the staging bucket, parked
    staged_key = keeping.row(16)["archive_staged_key"]
    assert staged_key is not None
    if older_release:  # it recorded neither the SHA-256 nor the length it captured
        keeping.db.run(
            "UPDATE image_generation_records SET archive_staged_sha256 = NULL,"
            " archive_staged_bytes = NULL WHERE id = 16"
        )
    reset_lane(keeping.db)
    make_due(keeping.db, 16)
    before = len(moto.s3_calls(f"/{originals_bucket}/"))

    assert keeping.deliver(16) == {"batchItemFailures": []}

    assert keeping.state(16)[0] == "SUCCEEDED"
    row = kept(keeping.db, 16)
    assert row is not None
    assert (row["sha256"], row["bytes"], row["source"]) == (SHA256, len(IMAGE), "staged")
    # Copied in server-side: no byte of it went through the function again.
    assert moto.s3_calls(f"/{originals_bucket}/")[before:] == [
        ("COPY", f"/{originals_bucket}/{row['key']}")
    ]
    body, answer = stored(s3, row)
    assert hashlib.sha256(body).hexdigest() == SHA256
    assert answer["Metadata"] == {"record-id": "16", "source": "staged"}
    assert answer["StorageClass"] == "GLACIER_IR"
    assert s3.list_objects_v2(Bucket=staging_bucket).get("KeyCount", 0) == 0  # published
    assert keeping.downloads(16) == 1


def test_a_late_writer_s_original_is_not_recorded(
    keeping: World, s3: Any, originals_bucket: str
) -> None:
    keeping.record(17, IMAGE)
    theirs = "originals/17/" + "0" * 32 + ".png"

    def another_attempt_archives_it() -> None:
        keeping.db.run(
            "UPDATE image_generation_records SET archive_status = 'SUCCEEDED',"
            " hosted_image_url = 'https://img.example.com/other.png', archive_locked_by = NULL"
            " WHERE id = 17"
        )
        keeping.db.run(
            "INSERT INTO image_archive_originals"
            " (record_id, bucket, key, sha256, bytes, mime_type, source)"
            " VALUES (17, :bucket, :key, :sha, :size, 'image/png', 'archive')",
            bucket=originals_bucket,
            key=theirs,
            sha=SHA256,
            size=len(IMAGE),
        )

    with keeping.during_the_upload(another_attempt_archives_it):
        keeping.deliver(17)

    row = kept(keeping.db, 17)
    assert row is not None
    assert row["key"] == theirs
    line = keeping.archive.log_for("archived, but another attempt had already archived the record")
    [(ours, _)] = object_versions(s3, originals_bucket)
    assert line["unrecorded_original"] == ours != theirs


def test_an_attempt_whose_lock_passed_on_records_its_original_with_its_image(
    keeping: World,
) -> None:
    keeping.record(18, IMAGE)

    def the_lock_passes_on() -> None:
        keeping.db.run(
            "UPDATE image_generation_records SET archive_locked_by = 'another-invocation'"
            " WHERE id = 18"
        )

    with keeping.during_the_upload(the_lock_passes_on):
        keeping.deliver(18)

    assert keeping.state(18)[0] == "SUCCEEDED"  # success wins: the picture is hosted
    row = kept(keeping.db, 18)
    assert row is not None
    assert row["sha256"] == SHA256
    assert archived_detail(keeping.db, 18)["original"] == row["key"]


def test_a_record_archived_again_replaces_its_original_row(
    keeping: World, s3: Any, originals_bucket: str
) -> None:
    # Its row from an earlier archive (the audit found the image lost, and the provider
    # still served it): the new original replaces the row; the older object stays.
    keeping.db.run(
        "INSERT INTO image_archive_originals (record_id, bucket, key, sha256, bytes,"
        " mime_type, source, kept_at) VALUES (19, 'older-bucket', :key, :sha, 5, 'image/png',"
        " 'hosted', now() - interval '1 year')",
        key="originals/19/" + "1" * 32 + ".png",
        sha="2" * 64,
    )
    keeping.record(19, IMAGE)

    keeping.deliver(19)

    row = kept(keeping.db, 19)
    assert row is not None
    assert (row["bucket"], row["sha256"], row["source"]) == (originals_bucket, SHA256, "archive")
    [[age]] = keeping.db.run(
        "SELECT now() - kept_at < interval '1 hour' FROM image_archive_originals"
        " WHERE record_id = 19"
    )
    assert age is True


# -- memory ----------------------------------------------------------------------------------

LARGE = 50_000_000


@pytest.mark.parametrize("chunked", [False, True], ids=["relayed", "held whole"])
def test_keeping_a_50_mb_original_keeps_memory_bounded(
    keeping: World, s3: Any, chunked: bool
) -> None:
    from devkit.upstream import StreamBody
    from lib.platform.s3 import PART_BYTES
    from tests.integration.test_staging import peak_growth_in_a_child

    body = StreamBody.of(lambda: images.png_stream(size=LARGE, chunk_size=256 * 1024), LARGE)
    keeping.upstream.add("/tiny.png", images.png())
    keeping.upstream.add("/large.png", body, chunked=chunked)
    seed_record(keeping.db, 20, image_url=keeping.upstream.url("/tiny.png"))
    seed_record(keeping.db, 21, image_url=keeping.upstream.url("/large.png"))

    growth = peak_growth_in_a_child(20, 21)  # warmed up (and its S3 client built) by #20

    row = kept(keeping.db, 21)
    assert row is not None
    served = hashlib.sha256()
    for chunk in images.png_stream(size=LARGE, chunk_size=256 * 1024):
        served.update(chunk)
    assert (row["sha256"], row["bytes"]) == (served.hexdigest(), LARGE)
    print(
        f"50 MB kept beside the upload ({'held' if chunked else 'relayed'}): {growth / 1e6:.1f} MB"
    )
    # The bound of the issue: a twentieth of the image, plus one multipart part's buffer
    # (which this PUT, streamed from the spool, does not even hold).
    assert growth <= 0.05 * LARGE + PART_BYTES
