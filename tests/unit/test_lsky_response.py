"""Lsky's answers (DESIGN.md's v1 contract) -> HostedImage or a classified failure."""

from __future__ import annotations

import json

import pytest

from lib.archive import retry as policy
from lib.transfer.failures import ArchiveFailure, Kind
from lib.transfer.lsky_upload import parse_upload_response
from tests.support import lsky_file

SUCCESS = {
    "status": True,
    "message": "上传成功",
    "data": lsky_file(
        "x.png",
        key="abc",
        links={"url": "https://img.example.com/i/2026/12/02/x.png", "html": "&lt;img&gt;"},
    ),
}


def envelope(message: str) -> bytes:
    return json.dumps({"status": False, "message": message, "data": {}}).encode()


def test_success() -> None:
    hosted = parse_upload_response(200, json.dumps(SUCCESS).encode())
    assert hosted.url == "https://img.example.com/i/2026/12/02/x.png"
    assert hosted.mime_type == "image/png"
    assert hosted.data["pathname"] == "2026/12/02/x.png"


@pytest.mark.parametrize(
    ("status", "body", "headers", "kind", "error_class", "text"),
    [
        (200, envelope("不支持的文件类型"), {}, Kind.REJECTED, "permanent", "不支持的文件类型"),
        (200, envelope("图片上传失败"), {}, Kind.REJECTED, "transient", "图片上传失败"),
        (401, envelope("Authentication failed."), {}, Kind.HTTP_STATUS, "permanent", "HTTP 401"),
        (403, envelope("API disabled"), {}, Kind.HTTP_STATUS, "permanent", "HTTP 403"),
        (
            413,
            b"<html><center><h1>413 Request Entity Too Large</h1>",
            {},
            Kind.HTTP_STATUS,
            "permanent",
            "HTTP 413",
        ),
        (422, envelope("The file field is required."), {}, Kind.HTTP_STATUS, "permanent", "422"),
        (
            429,
            envelope("Too Many Attempts."),
            {"retry_after": "120"},
            Kind.HTTP_STATUS,
            "transient",
            "Too Many Attempts.",
        ),
        (500, b'{"message": "Server Error"}', {}, Kind.HTTP_STATUS, "transient", "Server Error"),
        (
            200,
            b"<!doctype html><title>Lsky</title>",
            {},
            Kind.BAD_RESPONSE,
            "transient",
            "non-JSON",
        ),
        (
            200,
            b'{"status": true, "data": {}}',
            {},
            Kind.BAD_RESPONSE,
            "transient",
            "data.links.url",
        ),
        (
            200,
            b'{"status": true, "data": {"links": {"url": "javascript:alert(1)"}}}',
            {},
            Kind.BAD_RESPONSE,
            "transient",
            "data.links.url",
        ),
        (
            302,
            b"",
            {"location": "https://img.example.com/login"},
            Kind.HTTP_STATUS,
            "permanent",
            "/login",
        ),
    ],
)
def test_failures(
    status: int, body: bytes, headers: dict[str, str], kind: Kind, error_class: str, text: str
) -> None:
    with pytest.raises(ArchiveFailure) as caught:
        parse_upload_response(status, body, **headers)
    failure = caught.value.failure
    assert failure.kind is kind
    assert policy.classify(failure) == error_class
    assert text in failure.message


def test_429_carries_retry_after() -> None:
    with pytest.raises(ArchiveFailure) as caught:
        parse_upload_response(429, envelope("Too Many Attempts."), retry_after="120")
    assert caught.value.failure.retry_after == 120.0


def test_long_or_hostile_messages_are_trimmed() -> None:
    with pytest.raises(ArchiveFailure) as caught:
        parse_upload_response(200, envelope("x" * 5000 + "\n\x1b[31m"))
    assert len(caught.value.failure.message) < 250
    assert "\n" not in caught.value.failure.message


LONG_PATH = "/i/" + "a" * 2100 + ".png"


@pytest.mark.parametrize(
    "url",
    [
        "https://img.example.com" + LONG_PATH,  # past what a browser takes
        "https://img.example.com/i/x.png\r\nSet-Cookie: a=b",
        "https://img.example.com/i/x y.png",
        "https://img.example.com/i/x\u200b.png",  # invisible
        "https://img.example.com/i/x\u3000.png",  # ideographic space
        "https://user:secret@img.example.com/i/x.png",
        "https:///i/x.png",
        "https://img.example.com:99999/i/x.png",
        "https://[::1/i/x.png",
        "ftp://img.example.com/i/x.png",
        "//img.example.com/i/x.png",
        "",
    ],
)
def test_a_hosted_url_unfit_to_store_is_a_bad_response(url: str) -> None:
    body = {**SUCCESS, "data": {**SUCCESS["data"], "links": {"url": url}}}  # type: ignore[dict-item]
    with pytest.raises(ArchiveFailure) as caught:
        parse_upload_response(200, json.dumps(body).encode())
    assert caught.value.failure.kind is Kind.BAD_RESPONSE
    assert "fit to store" in caught.value.failure.message
    assert "secret" not in caught.value.failure.message


@pytest.mark.parametrize(
    "url",
    [
        "https://img.example.com/i/2026/12/02/x.png",
        "http://10.0.0.5:8080/i/x.png?v=1#top",
        "https://图床.example.com/i/图片.png",
        "https://img.example.com" + LONG_PATH[:2000],
    ],
)
def test_a_hosted_url_fit_to_store_is_kept_as_it_is(url: str) -> None:
    body = {**SUCCESS, "data": {**SUCCESS["data"], "links": {"url": url}}}  # type: ignore[dict-item]
    assert parse_upload_response(200, json.dumps(body).encode()).url == url


@pytest.mark.parametrize(
    ("mimetype", "kept"),
    [
        ("image/png", "image/png"),
        ("image/svg+xml", "image/svg+xml"),
        (None, ""),
        (5, ""),
        ({"type": "image/png"}, ""),
        ("png", ""),
        ("image/png; charset=x", ""),
        ("image/p图", ""),  # \w is ASCII here
        ("image/png\r\nX: 1", ""),
        ("image/" + "p" * 300, ""),
    ],
)
def test_a_mimetype_that_is_not_a_media_type_is_left_out(mimetype: object, kept: str) -> None:
    body = {**SUCCESS, "data": {**SUCCESS["data"], "mimetype": mimetype}}  # type: ignore[dict-item]
    assert parse_upload_response(200, json.dumps(body).encode()).mime_type == kept


@pytest.mark.parametrize("status", [200, 500])
def test_an_answer_nested_past_the_parser_s_depth_is_not_json(status: int) -> None:
    """Brackets by the hundred thousand raise RecursionError in json.loads, not ValueError."""
    with pytest.raises(ArchiveFailure) as caught:
        parse_upload_response(status, b"[" * 200_000)
    failure = caught.value.failure
    assert failure.kind is (Kind.BAD_RESPONSE if status == 200 else Kind.HTTP_STATUS)
    assert policy.classify(failure) == "transient"
