"""The Lsky stand-in's model of Lsky Pro 2.x beyond the upload answer: the upload
window limiter, the images listing and delete, default album, re-encoding, account
states and exactly-once faults. Everything goes over real HTTP on loopback."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import datetime
from http.client import HTTPConnection
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import urllib3

from devkit import images, lsky_model
from devkit.images import PNG_SIGNATURE
from devkit.lsky import AccountState, Behaviour, LskyStandIn
from tests.support import HANG_SECONDS, LSKY_FILE_FIELDS


@pytest.fixture(scope="module")
def http() -> Iterator[urllib3.PoolManager]:
    with urllib3.PoolManager(retries=False, timeout=10) as pool:
        yield pool


def _auth(lsky: LskyStandIn, *, accept_json: bool = True) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {lsky.token}"}
    if accept_json:
        headers["Accept"] = "application/json"
    return headers


def upload(
    http: Any,
    lsky: LskyStandIn,
    data: bytes | None = None,
    *,
    filename: str = "1.png",
    seed: int | None = None,
    accept_json: bool = True,
) -> Any:
    """POST one file; `seed` makes a distinct PNG."""
    if data is None:
        data = images.png(size=200, seed=seed) if seed is not None else images.png()
    return http.request(
        "POST",
        lsky.api_url + "/upload",
        fields={"file": (filename, data, "application/octet-stream")},
        headers=_auth(lsky, accept_json=accept_json),
        redirect=False,
    )


def body(response: Any) -> Any:
    return json.loads(response.data)


def listing(http: Any, lsky: LskyStandIn, **query: str) -> Any:
    response = http.request(
        "GET", lsky.api_url + "/images", fields=query, headers=_auth(lsky), redirect=False
    )
    assert response.status == 200, response.data
    payload = body(response)
    assert (payload["status"], payload["message"]) == (True, "success")
    return payload["data"]


def keys(page: Any) -> list[str]:
    return [item["key"] for item in page["data"]]


# -- the upload window limiter (ImageService::rateLimiter) -------------------------------------


def refused(response: Any) -> str:
    assert response.status == 200
    payload = body(response)
    assert payload["status"] is False
    assert payload["data"] == {}
    return str(payload["message"])


def test_minute_window_refuses_with_lsky_message_then_slides(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.rate_limits = {"minute": 3}  # a real minute: the refusal is no race
    for seed in range(3):
        assert body(upload(http, lsky, seed=seed))["status"] is True
    assert refused(upload(http, lsky, seed=9)) == "每分钟内你最多可以上传 3 张图片"
    assert lsky.rate_limited_count == 1
    assert lsky.uploads[-1].outcome == "rate_limited"
    assert lsky.uploads[-1].pathname is None
    assert len(lsky.image_records()) == 3  # a refused upload makes no row
    # The window slides: a one-second minute. Lsky dates rows in whole seconds and counts
    # both ends of a window, so an upload leaves it at the start of its second plus two.
    lsky.config.window_scale = {"minute": 1.0}
    time.sleep(2.05)
    assert body(upload(http, lsky, seed=9))["status"] is True
    assert lsky.rate_limited_count == 1


@pytest.mark.parametrize(
    ("window", "word"),
    [("minute", "分钟"), ("hour", "小时"), ("day", "天"), ("week", "周"), ("month", "月")],
)
def test_each_window_names_itself(http: Any, lsky: LskyStandIn, window: str, word: str) -> None:
    lsky.config.rate_limits = {window: 2}
    upload(http, lsky, seed=1)
    upload(http, lsky, seed=2)
    assert refused(upload(http, lsky, seed=3)) == f"每{word}内你最多可以上传 2 张图片"


def test_windows_are_checked_in_order(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.rate_limits = {"minute": 5, "hour": 2, "day": 2}
    upload(http, lsky, seed=1)
    upload(http, lsky, seed=2)
    # Minute still has room: the hour is the first exhausted window.
    assert refused(upload(http, lsky, seed=3)) == "每小时内你最多可以上传 2 张图片"
    lsky.config.rate_limits = {"minute": 2, "hours": 2}  # Lsky's own key names work too
    assert refused(upload(http, lsky, seed=3)) == "每分钟内你最多可以上传 2 张图片"


def test_other_clients_of_the_account_use_up_the_window(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.rate_limits = {"minute": 3}
    lsky.config.window_scale = {"minute": 2.0}
    lsky.add_foreign_uploads(5, age=3.0)  # outside the window: not counted
    lsky.add_foreign_uploads(2)
    lsky.add_image(owner="someone-else")  # another user's image never counts
    assert body(upload(http, lsky, seed=1))["status"] is True
    assert refused(upload(http, lsky, seed=2)) == "每分钟内你最多可以上传 3 张图片"
    assert len(lsky.stored_timestamps()) == 8
    assert len(lsky.stored_timestamps(include_planted=False)) == 1


def test_deleting_an_image_frees_its_place_in_the_window(http: Any, lsky: LskyStandIn) -> None:
    # The limiter counts rows of the images table, so a deleted image stops counting.
    lsky.config.rate_limits = {"minute": 1}
    key = body(upload(http, lsky, seed=1))["data"]["key"]
    assert refused(upload(http, lsky, seed=2)).startswith("每分钟")
    http.request("DELETE", f"{lsky.api_url}/images/{key}", headers=_auth(lsky))
    assert body(upload(http, lsky, seed=2))["status"] is True
    # stored_timestamps keeps every row ever created.
    assert len(lsky.stored_timestamps()) == 2


def test_max_in_window_never_exceeds_the_limit(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.rate_limits = {"minute": 2, "hour": 3}
    lsky.config.window_scale = {"minute": 0.5, "hour": 1.5}
    # Uploads until both refusals and successes are many (not for a fixed time: a slow
    # machine sends fewer a second), with a bound on the count against a hang.
    for seed in range(400):
        if lsky.rate_limited_count >= 5 and lsky.successful_uploads >= 6:
            break
        upload(http, lsky, seed=seed)
        time.sleep(0.05)
    assert lsky.rate_limited_count >= 5
    assert lsky.successful_uploads >= 6  # the windows slid more than once
    assert 0 < lsky.max_in_window(0.5) <= 2
    assert 0 < lsky.max_in_window(1.5) <= 3
    assert lsky.successful_uploads == len(lsky.stored_timestamps())


@pytest.mark.parametrize(
    ("now", "start"),
    [
        ((2026, 3, 31, 12), (2026, 3, 3, 12)),  # February 31 is March 3: 28 days
        ((2028, 3, 31, 12), (2028, 3, 2, 12)),  # a leap year: 29 days
        ((2026, 3, 1, 0), (2026, 2, 1, 0)),
        ((2026, 4, 15, 9), (2026, 3, 15, 9)),  # 31 days
        ((2026, 5, 31, 23), (2026, 5, 1, 23)),  # April 31 is May 1: 30 days
        ((2026, 1, 31, 8), (2025, 12, 31, 8)),
    ],
)
def test_lsky_s_month_is_carbon_s_minus_one_month(
    now: tuple[int, ...], start: tuple[int, ...]
) -> None:
    zone = lsky_model.PRC
    assert lsky_model.carbon_ago("month", datetime(*now, tzinfo=zone)) == datetime(
        *start, tzinfo=zone
    )


@pytest.mark.parametrize("unit", ["minute", "hour"])
def test_lsky_s_minute_and_hour_are_elapsed_time_where_the_clock_is_set_back(unit: str) -> None:
    # Berlin, 2026-10-25: at 02:30 winter time (the hour's second pass) an hour back is
    # 02:30 summer time, one hour earlier, not 01:30 summer time.
    berlin = ZoneInfo("Europe/Berlin")
    now = datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=berlin)
    back = lsky_model.carbon_ago(unit, now)
    assert now.timestamp() - back.timestamp() == (60 if unit == "minute" else 3_600)


def test_a_window_compares_wall_clock_texts_where_the_clock_is_set_back() -> None:
    # Berlin, 2026-10-25, 03:00 summer time is 02:00 again. created_at and both ends are
    # 'Y-m-d H:i:s' text in the app's zone: an upload at 02:30:00 summer time counts in
    # the minute's window again an hour later, at 02:30:30 winter time; and at 03:10 winter
    # time the hour's window (from 02:10:00 text) still holds one of 02:20 summer time,
    # 1 h 50 min old.
    berlin = ZoneInfo("Europe/Berlin")

    def at(hour: int, minute: int, second: int = 0, fold: int = 0) -> float:
        return datetime(2026, 10, 25, hour, minute, second, fold=fold, tzinfo=berlin).timestamp()

    count = lsky_model.window_count
    first = at(2, 30)
    assert count([first], now=at(2, 30, 30, fold=1), seconds=60, unit="minute", zone=berlin) == 1
    assert count([first], now=at(2, 40, fold=0), seconds=60, unit="minute", zone=berlin) == 0
    old = at(2, 20)
    assert count([old], now=at(3, 10), seconds=3_600, unit="hour", zone=berlin) == 1
    assert at(3, 10) - old == 110 * 60
    assert lsky_model.sql_text(at(2, 30, fold=1), berlin) == "2026-10-25 02:30:00"


def test_a_window_counts_whole_seconds_and_both_ends() -> None:
    # created_at and both ends of whereBetween are 'Y-m-d H:i:s': an upload at 100.9 is
    # dated 100, and a minute's window counts it until second 161 begins.
    count = lsky_model.window_count
    assert count([100.9], now=160.99, seconds=60, unit=None) == 1
    assert count([100.9], now=161.0, seconds=60, unit=None) == 0
    assert count([100.0], now=160.999, seconds=60, unit="minute") == 1


def test_rate_limit_settings_are_validated(lsky: LskyStandIn) -> None:
    with pytest.raises(ValueError, match="unknown rate-limit window"):
        lsky.config.rate_limits = {"fortnight": 1}
    with pytest.raises(ValueError, match="count"):
        lsky.config.rate_limits = {"minute": -1}
    with pytest.raises(ValueError, match="unknown window"):
        lsky.config.window_scale = {"year": 1.0}
    lsky.config.window_scale = 0.001  # a factor on every real duration
    assert lsky.config.windows["minute"] == pytest.approx(0.06)
    lsky.reset()
    assert dict(lsky.config.rate_limits) == {}
    assert lsky.config.windows["hour"] == 3600


# -- GET /api/v1/images ---------------------------------------------------------------------


PAGE_KEYS = [
    "current_page",
    "data",
    "first_page_url",
    "from",
    "last_page",
    "last_page_url",
    "links",
    "next_page_url",
    "path",
    "per_page",
    "prev_page_url",
    "to",
    "total",
]
ITEM_KEYS = [
    "key",
    "name",
    *LSKY_FILE_FIELDS,
    "width",
    "height",
    "human_date",
    "date",
    "pathname",
    "links",
]


def test_listing_items_match_the_upload_answer(http: Any, lsky: LskyStandIn) -> None:
    data = images.png(7, 5)
    uploaded = body(upload(http, lsky, data, filename="cat.png"))["data"]
    page = listing(http, lsky)
    assert list(page) == PAGE_KEYS
    [item] = page["data"]
    assert list(item) == ITEM_KEYS
    for name in ("key", "name", "pathname", "origin_name", "mimetype", "extension", "md5", "sha1"):
        assert item[name] == uploaded[name]
    assert item["links"] == uploaded["links"]
    # The column is DECIMAL(8,2): the listing rounds what the upload answered.
    assert uploaded["size"] == len(data) / 1024
    assert item["size"] == round(len(data) / 1024, 2)
    assert (item["width"], item["height"]) == (7, 5)
    assert item["human_date"].endswith("秒前")
    assert len(item["date"]) == len("2024-01-01 00:00:00")
    assert (page["total"], page["from"], page["to"], page["per_page"]) == (1, 1, 1, 40)
    assert page["path"] == lsky.api_url + "/images"
    assert page["first_page_url"] == lsky.api_url + "/images?page=1"
    assert page["next_page_url"] is None
    assert page["prev_page_url"] is None
    assert [link["label"] for link in page["links"]] == ["&laquo; 上一页", "1", "下一页 &raquo;"]


def test_listing_pages_by_40_and_keeps_the_query(http: Any, lsky: LskyStandIn) -> None:
    for n in range(45):
        lsky.add_image(origin_name=f"img-{n:02}.png")
    first = listing(http, lsky, order="earliest")
    assert [item["origin_name"] for item in first["data"]] == [f"img-{n:02}.png" for n in range(40)]
    second = listing(http, lsky, order="earliest", page="2")
    assert [item["origin_name"] for item in second["data"]] == [
        f"img-{n:02}.png" for n in range(40, 45)
    ]
    assert (second["current_page"], second["from"], second["to"], second["last_page"]) == (
        2,
        41,
        45,
        2,
    )
    base = lsky.api_url + "/images?order=earliest&page="
    assert second["prev_page_url"] == base + "1"
    assert second["last_page_url"] == base + "2"
    assert [(link["label"], link["active"]) for link in second["links"][1:-1]] == [
        ("1", False),
        ("2", True),
    ]
    beyond = listing(http, lsky, page="9")
    assert (beyond["data"], beyond["from"], beyond["to"]) == ([], None, None)
    assert listing(http, lsky, page="abc")["current_page"] == 1


def test_listing_orders(http: Any, lsky: LskyStandIn) -> None:
    small = lsky.add_image(images.png(size=300, seed=1), age=3)
    big = lsky.add_image(images.png(size=5000, seed=2), age=2)
    middle = lsky.add_image(images.png(size=2000, seed=3), age=1)
    assert keys(listing(http, lsky)) == [middle.key, big.key, small.key]  # newest
    assert keys(listing(http, lsky, order="earliest")) == [small.key, big.key, middle.key]
    assert keys(listing(http, lsky, order="utmost")) == [big.key, middle.key, small.key]
    assert keys(listing(http, lsky, order="least")) == [small.key, middle.key, big.key]
    assert keys(listing(http, lsky, order="bogus")) == [middle.key, big.key, small.key]


def test_listing_filters_permission_and_album(http: Any, lsky: LskyStandIn) -> None:
    album = lsky.add_album("trip")
    public = lsky.add_image(permission=1)
    private = lsky.add_image(permission=0)
    in_album = lsky.add_image(album_id=album)
    lsky.add_image(owner="other")
    assert set(keys(listing(http, lsky))) == {public.key, private.key}  # no album only
    assert keys(listing(http, lsky, permission="public")) == [public.key]
    assert keys(listing(http, lsky, permission="private")) == [private.key]
    assert keys(listing(http, lsky, album_id=str(album))) == [in_album.key]
    assert keys(listing(http, lsky, album_id="junk")) == keys(listing(http, lsky))


def test_listing_keyword_keeps_scopefilters_ungrouped_or(http: Any, lsky: LskyStandIn) -> None:
    """scopeFilter adds `origin_name LIKE ? OR alias_name LIKE ?` with no group of its
    own. Eloquent wraps the scope's wheres in one group (they contain an OR), so the
    user filter holds, but inside the group the OR splits the filters:
        user_id = ? AND (permission = ? AND origin_name LIKE ?
                         OR alias_name LIKE ? AND album_id IS NULL)"""
    album = lsky.add_album("trip")
    by_origin_in_album = lsky.add_image(origin_name="Cat-in-album.png", album_id=album)
    by_alias_private = lsky.add_image(origin_name="x.png", alias_name="my cat", permission=0)
    by_alias_in_album = lsky.add_image(origin_name="y.png", alias_name="cat", album_id=album)
    lsky.add_image(owner="other", origin_name="cat.png", alias_name="cat")
    dog = lsky.add_image(origin_name="dog.png")

    # The origin_name branch escapes the album filter, the alias branch does not.
    found = set(keys(listing(http, lsky, keyword="cat")))
    assert found == {by_origin_in_album.key, by_alias_private.key}
    # The alias branch escapes the permission filter.
    found = set(keys(listing(http, lsky, keyword="cat", permission="public")))
    assert found == {by_alias_private.key}
    # With album_id, both the album's alias match and the origin match are listed.
    found = set(keys(listing(http, lsky, keyword="cat", album_id=str(album))))
    assert found == {by_origin_in_album.key, by_alias_in_album.key}
    # LIKE: case-insensitive, % and _ are wildcards; "0" and "" are no keyword (PHP).
    assert keys(listing(http, lsky, keyword="C_T-IN")) == [by_origin_in_album.key]
    plain = set(keys(listing(http, lsky)))
    assert plain == {by_alias_private.key, dog.key}
    assert set(keys(listing(http, lsky, keyword="0"))) == plain
    assert set(keys(listing(http, lsky, keyword="  "))) == plain


def test_listing_needs_the_token_and_the_api(http: Any, lsky: LskyStandIn) -> None:
    url = lsky.api_url + "/images"
    bad = http.request("GET", url, headers={"Authorization": "Bearer 1|no", "Accept": "*/json"})
    assert (bad.status, body(bad)["message"]) == (401, "Unauthenticated.")
    assert http.request("GET", url, redirect=False).status == 302
    lsky.account_state = AccountState.API_DISABLED
    disabled = http.request("GET", url, headers=_auth(lsky))
    assert disabled.status == 403
    assert body(disabled) == {"status": False, "message": "管理员未启用 API", "data": {}}
    # auth:sanctum runs before CheckIsEnableApi: a bad token is still a 401.
    bad = http.request("GET", url, headers={"Authorization": "Bearer 1|no", "Accept": "*/json"})
    assert bad.status == 401


def test_every_listing_request_is_recorded_with_its_query(http: Any, lsky: LskyStandIn) -> None:
    assert lsky.listings == []
    listing(http, lsky, keyword=" alice_1_ ", page="2")
    http.request("GET", lsky.api_url + "/images?keyword=x", headers={"Accept": "*/json"})

    # As the app sees them (TrimStrings), refused ones included.
    assert lsky.listings == [{"keyword": "alice_1_", "page": "2"}, {"keyword": "x"}]
    lsky.reset()
    assert lsky.listings == []


def test_delete_image(http: Any, lsky: LskyStandIn) -> None:
    first = body(upload(http, lsky, seed=1))["data"]
    twin = body(upload(http, lsky, seed=1))["data"]  # same bytes: same file, new row
    alone = body(upload(http, lsky, seed=2))["data"]
    others = lsky.add_image(owner="other")
    assert twin["pathname"] == first["pathname"]
    assert twin["key"] != first["key"]
    assert len(keys(listing(http, lsky))) == 3

    def delete(key: str) -> Any:
        response = http.request("DELETE", f"{lsky.api_url}/images/{key}", headers=_auth(lsky))
        assert response.status == 200
        return body(response)

    assert delete(first["key"]) == {"status": True, "message": "删除成功", "data": {}}
    assert lsky.stored_path(first["pathname"]).exists()  # the twin still uses it
    delete(twin["key"])
    assert not lsky.stored_path(first["pathname"]).exists()
    delete(alone["key"])
    assert keys(listing(http, lsky)) == []
    # Unknown keys and other users' images: still 删除成功, nothing happens.
    assert delete("nope")["status"] is True
    assert delete(others.key)["status"] is True
    assert lsky.find_image(others.key) is not None
    wrong = http.request("GET", f"{lsky.api_url}/images/{others.key}", headers=_auth(lsky))
    assert wrong.status == 405
    assert body(wrong)["message"].endswith("Supported methods: DELETE.")


# -- the user's default album --------------------------------------------------------------


def test_default_album_hides_uploads_from_the_plain_listing(http: Any, lsky: LskyStandIn) -> None:
    album = lsky.add_album("inbox")
    lsky.config.default_album_id = album
    key = body(upload(http, lsky, seed=1))["data"]["key"]
    record = lsky.find_image(key)
    assert record is not None
    assert record.album_id == album
    assert keys(listing(http, lsky)) == []
    assert keys(listing(http, lsky, album_id=str(album))) == [key]
    # A default album the user does not own (or that is gone) is ignored.
    lsky.config.default_album_id = lsky.add_album("theirs", owner="other")
    key = body(upload(http, lsky, seed=2))["data"]["key"]
    assert keys(listing(http, lsky)) == [key]


# -- re-encoding and watermark ---------------------------------------------------------------


def png_chunks(data: bytes) -> list[bytes]:
    """Chunk types of a PNG, checking every CRC."""
    assert data.startswith(PNG_SIGNATURE)
    offset, kinds = len(PNG_SIGNATURE), []
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        payload = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + payload) == crc
        kinds.append(kind)
        offset += 12 + length
    return kinds


def fetch_stored(http: Any, info: Any) -> bytes:
    served = http.request("GET", info["links"]["url"])
    assert served.status == 200
    return bytes(served.data)


@pytest.mark.parametrize(
    ("quality", "watermark"), [(75, False), (100, True), (90, True)], ids=["q75", "wm", "both"]
)
def test_processing_changes_the_stored_file(
    http: Any, lsky: LskyStandIn, quality: int, watermark: bool
) -> None:
    lsky.config.image_quality = quality
    lsky.config.watermark = watermark
    data = images.png(5, 3)
    info = body(upload(http, lsky, data))["data"]
    stored = fetch_stored(http, info)
    assert stored != data
    assert info["md5"] == hashlib.md5(stored).hexdigest()  # noqa: S324
    assert info["sha1"] == hashlib.sha1(stored).hexdigest()  # noqa: S324
    assert info["size"] == len(stored) / 1024
    assert info["md5"] != hashlib.md5(data).hexdigest()  # noqa: S324
    assert info["mimetype"] == "image/png"
    kinds = png_chunks(stored)
    assert kinds[0] == b"IHDR"
    assert kinds[-1] == b"IEND"
    [item] = listing(http, lsky)["data"]
    assert (item["md5"], item["width"], item["height"]) == (info["md5"], 5, 3)
    assert lsky.uploads[0].sha256 == hashlib.sha256(data).hexdigest()  # what was sent


def test_processing_keeps_a_jpeg_a_jpeg(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.image_quality = 75
    data = images.jpeg()
    info = body(upload(http, lsky, data, filename="a.jpg"))["data"]
    stored = fetch_stored(http, info)
    assert stored != data
    assert stored.startswith(b"\xff\xd8\xff")
    assert stored.endswith(b"\xff\xd9")
    assert info["md5"] == hashlib.md5(stored).hexdigest()  # noqa: S324
    [item] = listing(http, lsky)["data"]
    assert (item["width"], item["height"]) == (1, 1)


def test_gif_is_not_processed(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.image_quality = 75
    lsky.config.watermark = True
    data = images.gif()
    info = body(upload(http, lsky, data, filename="a.gif"))["data"]
    assert fetch_stored(http, info) == data
    assert info["md5"] == hashlib.md5(data).hexdigest()  # noqa: S324


def test_processed_duplicates_share_the_file_but_not_the_key(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.image_quality = 75
    first = body(upload(http, lsky))["data"]
    second = body(upload(http, lsky))["data"]
    assert (second["pathname"], second["md5"]) == (first["pathname"], first["md5"])
    assert second["key"] != first["key"]
    assert set(keys(listing(http, lsky))) == {first["key"], second["key"]}


def test_processing_an_unreadable_file_is_the_catch_all(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.image_quality = 75
    assert refused(upload(http, lsky, b"not an image at all")) == "服务异常，请稍后再试"
    lsky.config.image_quality = 100  # nothing to decode: stored as is, 400x400
    info = body(upload(http, lsky, b"not an image at all"))["data"]
    assert info["mimetype"] == "application/octet-stream"
    [item] = listing(http, lsky)["data"]
    assert (item["width"], item["height"]) == (400, 400)


# -- exactly-once faults ---------------------------------------------------------------------


def multipart_request(lsky: LskyStandIn, data: bytes) -> bytes:
    body_bytes, content_type = urllib3.encode_multipart_formdata(
        {"file": ("once.png", data, "image/png")}
    )
    head = (
        f"POST /api/v1/upload HTTP/1.1\r\nHost: {lsky.host}:{lsky.port}\r\n"
        f"Authorization: Bearer {lsky.token}\r\nAccept: application/json\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body_bytes)}\r\n\r\n"
    )
    return head.encode() + body_bytes


def test_drop_before_answering_stores_exactly_one_image(http: Any, lsky: LskyStandIn) -> None:
    lsky.script(Behaviour.drop(partial=False))
    connection = HTTPConnection(lsky.host, lsky.port, timeout=5)
    raw, content_type = urllib3.encode_multipart_formdata({"file": ("a.png", images.png())})
    connection.request(
        "POST",
        "/api/v1/upload",
        body=raw,
        headers={**_auth(lsky), "Content-Type": content_type},
    )
    with pytest.raises(ConnectionError):  # http.client.RemoteDisconnected
        connection.getresponse()
    connection.close()
    [attempt] = lsky.uploads
    assert (attempt.outcome, attempt.status) == ("drop", 0)
    assert attempt.key is not None
    assert keys(listing(http, lsky)) == [attempt.key]


@pytest.mark.parametrize("kept", [0.5, -1], ids=["mid-file", "all-but-the-last-byte"])
def test_a_body_cut_before_its_content_length_never_reaches_the_app(
    http: Any, lsky: LskyStandIn, kept: float
) -> None:
    # As behind nginx and PHP: a request whose body ends early is not a request at all.
    lsky.script(Behaviour.status_false(store=True))  # would store whatever it got
    raw = multipart_request(lsky, images.png(size=100_000, seed=6))
    cut = int(len(raw) * kept) if kept > 0 else len(raw) - 1
    with socket.create_connection((lsky.host, lsky.port), timeout=5) as client:
        client.sendall(raw[:cut])
    assert lsky.wait_for_cut_bodies(1, timeout=HANG_SECONDS)
    assert lsky.uploads == []
    assert lsky.image_records() == []
    assert lsky.pending_script == 1  # the app never ran
    assert lsky.body_arriving.is_set()  # it had begun

    assert upload(http, lsky, seed=7).json()["status"] is False  # the script, unused
    assert lsky.image_records() != []  # ...stored anyway, as scripted
    assert lsky.cut_bodies == 1


def test_a_proxy_refusal_as_the_body_starts_stores_nothing(lsky: LskyStandIn) -> None:
    lsky.script(Behaviour.before_body(Behaviour.server_error()))
    raw = multipart_request(lsky, images.png(size=300_000, seed=8))
    with socket.create_connection((lsky.host, lsky.port), timeout=5) as client:
        client.sendall(raw[: len(raw) // 3])  # the client is still sending
        answer = client.recv(4096)
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)
    [attempt] = lsky.uploads
    assert (attempt.outcome, attempt.status, attempt.size) == ("http_500", 500, 0)
    assert attempt.before_body
    assert attempt.body_started_at is not None
    assert lsky.upload_answered.is_set()
    assert lsky.image_records() == []
    assert lsky.pending_script == 0


def test_a_proxy_answers_only_with_a_refusal() -> None:
    with pytest.raises(ValueError, match="refusal"):
        Behaviour.before_body(Behaviour.success())


def test_an_upload_records_when_its_body_began(http: Any, lsky: LskyStandIn) -> None:
    assert not lsky.body_arriving.is_set()
    before = time.monotonic()
    assert upload(http, lsky, seed=9).json()["status"] is True
    [attempt] = lsky.uploads
    assert attempt.body_started_at is not None
    assert before <= attempt.body_started_at <= time.monotonic()
    assert lsky.body_arriving.is_set()
    lsky.reset()
    assert not lsky.body_arriving.is_set()
    assert not lsky.upload_answered.is_set()


def test_slow_stores_after_the_wait_although_the_client_left(lsky: LskyStandIn) -> None:
    lsky.script(Behaviour.slow(0.5))
    data = images.png(size=100_000, seed=4)
    sent_at = time.monotonic()  # before the body: the wait starts after it was read
    with socket.create_connection((lsky.host, lsky.port), timeout=5) as client:
        client.sendall(multipart_request(lsky, data))
        assert lsky.wait_for_bodies(1, timeout=HANG_SECONDS)
        # The whole body is in; the client is killed before any answer.
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)
    [attempt] = lsky.uploads
    assert attempt.outcome == "success"
    [record] = lsky.image_records()
    assert record.key == attempt.key
    assert record.created >= sent_at + 0.5  # stored after the whole wait
    assert lsky.stored_path(record.pathname).read_bytes() == data


def test_held_stores_once_the_gate_opens_although_the_client_left(lsky: LskyStandIn) -> None:
    gate = threading.Event()
    lsky.script(Behaviour.held(gate))
    data = images.png(size=100_000, seed=5)
    try:
        with socket.create_connection((lsky.host, lsky.port), timeout=5) as client:
            client.sendall(multipart_request(lsky, data))
            assert lsky.wait_for_bodies(1, timeout=HANG_SECONDS)
            # The whole body is in; the client is killed before any answer.
        assert not lsky.wait_for_uploads(1, timeout=0.2)  # held: nothing answered...
        assert lsky.image_records() == []  # ...nor stored
    finally:
        gate.set()
    assert lsky.wait_for_uploads(1, timeout=HANG_SECONDS)
    [attempt] = lsky.uploads
    assert attempt.outcome == "success"
    [record] = lsky.image_records()
    assert record.key == attempt.key
    assert lsky.stored_path(record.pathname).read_bytes() == data


# -- account states --------------------------------------------------------------------------


def profile(http: Any, lsky: LskyStandIn, **headers: str) -> Any:
    return http.request(
        "GET", lsky.api_url + "/profile", headers=headers or _auth(lsky), redirect=False
    )


def test_profile_reflects_the_account_state(http: Any, lsky: LskyStandIn) -> None:
    healthy = profile(http, lsky)
    assert healthy.status == 200
    assert body(healthy)["data"]["used_capacity"] == 0

    lsky.account_state = AccountState.TOKEN_REFUSED
    refused_token = profile(http, lsky)
    assert (refused_token.status, body(refused_token)["message"]) == (401, "Unauthenticated.")
    upload_refused = upload(http, lsky)
    assert (upload_refused.status, body(upload_refused)["message"]) == (
        401,
        "Authentication failed.",
    )

    lsky.account_state = AccountState.API_DISABLED
    for response in (profile(http, lsky), upload(http, lsky)):
        assert response.status == 403
        assert body(response) == {"status": False, "message": "管理员未启用 API", "data": {}}
    assert upload(http, lsky, accept_json=False).status == 404  # abort(404) for browsers
    assert [u.outcome for u in lsky.uploads] == ["unauthenticated", "api_disabled", "api_disabled"]

    lsky.account_state = AccountState.HEALTHY
    assert profile(http, lsky).status == 200


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (AccountState.UNVERIFIED, "账户未验证"),
        (AccountState.FROZEN, "账号状态异常"),
        (AccountState.QUOTA_FULL, "储存空间不足"),
    ],
)
def test_account_problems_refuse_uploads_but_not_the_profile(
    http: Any, lsky: LskyStandIn, state: AccountState, message: str
) -> None:
    lsky.add_image()
    lsky.account_state = state
    assert refused(upload(http, lsky)) == message
    assert lsky.uploads[-1].outcome == "rejected"
    # The type check comes first in ImageService::store.
    assert refused(upload(http, lsky, images.avif(), filename="a.avif")) == "不支持的文件类型"
    info = profile(http, lsky)
    assert info.status == 200
    data = body(info)["data"]
    assert data["image_num"] == 1
    if state is AccountState.QUOTA_FULL:
        assert data["capacity"] == data["used_capacity"] > 0


def test_capacity_is_checked_against_the_rows(http: Any, lsky: LskyStandIn) -> None:
    lsky.config.capacity_kb = 3.0
    assert body(upload(http, lsky, images.png(size=2048, seed=1)))["status"] is True
    assert refused(upload(http, lsky, images.png(size=1100, seed=2))) == "储存空间不足"
    assert body(upload(http, lsky, images.png(size=900, seed=3)))["status"] is True
    data = body(profile(http, lsky))["data"]
    assert (data["capacity"], data["image_num"]) == (3.0, 2)
    assert data["used_capacity"] == pytest.approx(2.0 + 0.88, abs=0.01)


# -- Laravel's throttle (HTTP 429) -------------------------------------------------------------


def test_429_with_and_without_throttle_headers(http: Any, lsky: LskyStandIn) -> None:
    lsky.script(Behaviour.rate_limited(retry_after=7), Behaviour.rate_limited(headers=False))
    with_headers = upload(http, lsky)
    assert with_headers.status == 429
    assert body(with_headers) == {"status": False, "message": "Too Many Attempts.", "data": {}}
    assert with_headers.headers["Retry-After"] == "7"
    assert with_headers.headers["X-RateLimit-Limit"] == "60"
    assert with_headers.headers["X-RateLimit-Remaining"] == "0"
    assert int(with_headers.headers["X-RateLimit-Reset"]) >= int(time.time())
    # What Lsky 2.x really sends: its exception handler drops the throttle headers.
    bare = upload(http, lsky)
    assert bare.status == 429
    assert body(bare)["message"] == "Too Many Attempts."
    assert "Retry-After" not in bare.headers
    assert not any(name.lower().startswith("x-ratelimit") for name in bare.headers)


@pytest.mark.parametrize("from_body", [False, True])
def test_a_trickled_route_sends_its_answer_a_byte_at_a_time(
    lsky: LskyStandIn, from_body: bool
) -> None:
    lsky.trickle("/api/v1/profile", interval=0.001, from_body=from_body)
    with socket.create_connection((lsky.host, lsky.port), timeout=10) as conn:
        conn.sendall(
            b"GET /api/v1/profile HTTP/1.1\r\nHost: lsky\r\nAccept: application/json\r\n"
            + f"Authorization: Bearer {lsky.token}\r\n\r\n".encode()
        )
        pieces: list[bytes] = []
        while piece := conn.recv(65536):
            pieces.append(piece)
    answer = b"".join(pieces)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(payload)["status"] is True
    # A byte at a time: far more pieces than one answer normally takes (a trickle from
    # the body on sends its head at once, so at least the body's bytes come apart).
    assert len(pieces) > len(payload) // 4
    if not from_body:
        assert len(pieces[0]) < len(head)
    lsky.reset()
    assert lsky.config.trickles == {}
