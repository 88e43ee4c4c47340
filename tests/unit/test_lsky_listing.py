"""Lsky's image list (GET /api/v1/images) -> a page of items or a lookup failure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lib.archive import retry as policy
from lib.transfer.failures import ArchiveFailure, Kind, Stage
from lib.transfer.lsky_listing import listed_image, parse_listing
from tests.support import lsky_file

ITEM = lsky_file(
    "6743a1b2c3d4e.png",
    key="AbCdEf",
    width=8,
    height=8,
    human_date="3分钟前",
    date="2026-12-02 08:00:00",
)


def page(*items: Any, last_page: Any = 1) -> bytes:
    data = {"current_page": 1, "data": list(items), "last_page": last_page, "per_page": 40}
    return json.dumps({"status": True, "message": "success", "data": data}).encode()


def failure(status: int, raw: bytes, **kwargs: Any) -> ArchiveFailure:
    with pytest.raises(ArchiveFailure) as caught:
        parse_listing(status, raw, **kwargs)
    assert caught.value.failure.stage is Stage.LOOKUP
    # Whatever went wrong, a look-up never fails the record.
    assert policy.classify(caught.value.failure) is policy.ErrorClass.TRANSIENT
    return caught.value


def test_a_page_keeps_each_item_but_its_relative_date() -> None:
    listed = parse_listing(200, page(ITEM, last_page=2))
    assert listed.last_page == 2
    [item] = listed.images
    assert "human_date" not in item
    assert item == {k: v for k, v in ITEM.items() if k != "human_date"}
    assert listed_image(item).url == ITEM["links"]["url"]  # type: ignore[index]


def test_items_without_a_name_are_skipped_and_a_bad_last_page_is_one() -> None:
    listed = parse_listing(200, page({"key": "x"}, "junk", {**ITEM, "origin_name": 5}, last_page=0))
    assert listed.images == ()
    assert listed.last_page == 1


@pytest.mark.parametrize("links", [None, {}, {"url": "javascript:x"}, {"url": 5}])
def test_an_item_without_an_http_url_is_a_lookup_failure(links: Any) -> None:
    with pytest.raises(ArchiveFailure) as caught:
        listed_image({**ITEM, "links": links})
    assert caught.value.failure.stage is Stage.LOOKUP
    assert "links.url fit to store" in caught.value.failure.message


@pytest.mark.parametrize(
    ("status", "raw", "kind", "text"),
    [
        (401, b'{"status":false,"message":"Unauthenticated.","data":{}}', Kind.HTTP_STATUS,
         "HTTP 401: Unauthenticated."),
        (403, "管理员未启用 API".join(['{"status":false,"message":"', '"}']).encode(),
         Kind.HTTP_STATUS, "HTTP 403: 管理员未启用 API"),
        (500, b'{"message":"Server Error"}', Kind.HTTP_STATUS, "HTTP 500: Server Error"),
        (502, b"<html>bad gateway</html>", Kind.HTTP_STATUS, "HTTP 502"),
        (200, b"<html>maintenance</html>", Kind.BAD_RESPONSE, "non-JSON body"),
        (200, b'{"status":false,"message":"x","data":{}}', Kind.REJECTED, "refused"),
        (200, b'{"status":true,"data":{}}', Kind.BAD_RESPONSE, "no data.data"),
        (200, b'{"status":true,"data":[]}', Kind.BAD_RESPONSE, "no data.data"),
    ],
)  # fmt: skip
def test_failures(status: int, raw: bytes, kind: Kind, text: str) -> None:
    error = failure(status, raw)
    assert error.failure.kind is kind
    assert text in error.failure.message


def test_429_keeps_its_retry_after() -> None:
    error = failure(429, b'{"status":false,"message":"Too Many Attempts.","data":{}}',
                    retry_after="42")  # fmt: skip
    assert (error.failure.status, error.failure.retry_after) == (429, 42.0)


def test_a_redirect_to_login_is_a_refused_token() -> None:
    error = failure(302, b"", location="https://img.example.com/login")
    assert error.failure.status == 401


def test_a_list_nested_past_the_parser_s_depth_is_a_lookup_failure() -> None:
    assert "non-JSON body" in failure(200, b"[" * 200_000).failure.message
