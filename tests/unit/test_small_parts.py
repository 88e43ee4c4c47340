"""Naming, multipart framing, image sniffing, queue URLs, URL redaction, credentials."""

from __future__ import annotations

import email.parser
import email.policy
from datetime import UTC, datetime, timedelta, timezone

import pytest

from lib.archive.naming import hosted_file_name
from lib.cli.words import plural, verb
from lib.platform.config import DatabaseConfig
from lib.platform.errors import ConfigError
from lib.platform.secrets import database_params, parse_database_secret, parse_database_url
from lib.platform.sqs import queue_url_from_arn
from lib.transfer.download import safe_url
from lib.transfer.failures import retry_after_seconds
from lib.transfer.imagetype import AVIF, GIF, JPEG, PNG, WEBP, sniff
from lib.transfer.multipart import BodyLengthError, MultipartBody

STARTED = datetime(2026, 12, 2, 20, 47, 35, tzinfo=timezone(timedelta(hours=8)))


@pytest.mark.parametrize(
    ("username", "expected"),
    [
        ("alice", "alice_42_20261202T124735Z.png"),
        ("张三", "张三_42_20261202T124735Z.png"),
        ("../../etc/passwd", "etc-passwd_42_20261202T124735Z.png"),
        ('a"b\r\nc d', "a-b-c-d_42_20261202T124735Z.png"),
        ("", "user7_42_20261202T124735Z.png"),
        (None, "user7_42_20261202T124735Z.png"),
        ("...", "user7_42_20261202T124735Z.png"),
    ],
)
def test_hosted_file_name(username: str | None, expected: str) -> None:
    name = hosted_file_name(
        username=username, user_id=7, record_id=42, started_at=STARTED, extension="png"
    )
    assert name == expected


def test_multipart_body_is_well_formed_and_its_length_exact() -> None:
    data = bytes(range(256)) * 4000
    body = MultipartBody(
        fields={"strategy_id": "3"},
        file_field="file",
        filename='we"ird.png',
        file_content_type="image/png",
        content=lambda: [data[:1000], data[1000:]],
        file_size=len(data),
    )
    raw = b"".join(body)
    assert len(raw) == body.content_length
    assert b"".join(body) == raw  # restartable for a resend
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {body.content_type}\r\n\r\n".encode() + raw
    )
    parts = {
        part.get_param("name", header="content-disposition"): part for part in message.iter_parts()
    }
    assert parts["strategy_id"].get_content() == "3"
    assert parts["file"].get_content() == data
    assert parts["file"].get_content_type() == "image/png"


def _body_of(content: list[bytes], size: int) -> MultipartBody:
    return MultipartBody(
        fields={},
        file_field="file",
        filename="a.png",
        file_content_type="image/png",
        content=lambda: content,
        file_size=size,
    )


def test_multipart_refuses_a_short_file_before_its_closing_boundary() -> None:
    body = _body_of([b"abc"], 10)
    sent: list[bytes] = []
    with pytest.raises(BodyLengthError, match="ended after 3 of the announced 10 bytes"):
        sent.extend(body)
    assert sent[-1] == b"abc"  # the closing boundary never went out


def test_multipart_refuses_a_long_file_before_its_extra_byte() -> None:
    body = _body_of([b"abcd", b"efgh"], 6)
    sent: list[bytes] = []
    with pytest.raises(BodyLengthError, match="longer than the announced 6 bytes"):
        sent.extend(body)
    assert sent[1:] == [b"abcd"]  # the chunk that went past the length was not sent


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", PNG),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", JPEG),
        (b"GIF89a\x01\x00", GIF),
        (b"GIF87a\x01\x00", GIF),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", WEBP),
        (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00", AVIF),
        (b"<!doctype html><html>", None),
        (b"\x00\x00\x00\x18ftypmp42", None),
        (b"", None),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", None),
    ],
)
def test_sniff(head: bytes, expected: object) -> None:
    assert sniff(head) == expected


def test_queue_url_from_arn() -> None:
    arn = "arn:aws:sqs:eu-west-1:123456789012:image-archive"
    assert (
        queue_url_from_arn(arn) == "https://sqs.eu-west-1.amazonaws.com/123456789012/image-archive"
    )
    assert queue_url_from_arn(arn, "http://127.0.0.1:5000/") == (
        "http://127.0.0.1:5000/123456789012/image-archive"
    )
    with pytest.raises(ValueError, match="not an SQS queue ARN"):
        queue_url_from_arn("arn:aws:sns:eu-west-1:1:topic")


def test_safe_url_drops_query_and_userinfo() -> None:
    url = "https://user:hunter2@cdn.example.com:8443/img/a.png?X-Amz-Signature=deadbeef#frag"
    assert safe_url(url) == "https://cdn.example.com:8443/img/a.png"


def test_retry_after() -> None:
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    later = datetime.now(UTC) + timedelta(seconds=300)
    parsed = retry_after_seconds(later.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    assert parsed is not None
    assert 290 <= parsed <= 301


def test_database_url_and_secret() -> None:
    params = parse_database_url(
        "postgresql://arch%40ive:p%2Fss@db.internal:6432/app?sslmode=require"
    )
    assert (params.user, params.password, params.host, params.port, params.database) == (
        "arch@ive",
        "p/ss",
        "db.internal",
        6432,
        "app",
    )
    assert params.sslmode == "require"
    assert "p/ss" not in repr(params)
    secret = parse_database_secret(
        {"username": "u", "password": "pw", "host": "h", "port": 5433, "dbname": "d"}
    )
    assert (secret.user, secret.host, secret.port, secret.database) == ("u", "h", 5433, "d")
    with pytest.raises(ConfigError, match="JSON"):
        parse_database_secret("not json")
    with pytest.raises(ConfigError, match="postgresql://"):
        parse_database_url("mysql://x@y/z")
    override = database_params(DatabaseConfig(url="postgresql://u@h/d", sslmode="verify-full"))
    assert override.sslmode == "verify-full"


def test_sslmode_maps_to_pg8000s_ssl_context() -> None:
    import ssl

    from lib.platform.db import ssl_option

    assert ssl_option("disable") is False  # pg8000: no TLS at all
    assert ssl_option("prefer") is None  # pg8000: try TLS, stay plain if refused
    require = ssl_option("require")
    assert isinstance(require, ssl.SSLContext)
    assert require.verify_mode is ssl.CERT_NONE
    verify = ssl_option("verify-full")
    assert isinstance(verify, ssl.SSLContext)
    assert verify.verify_mode is ssl.CERT_REQUIRED
    assert verify.check_hostname
    # With a bundle (RDS's global-bundle.pem), that file is what is loaded.
    with pytest.raises(FileNotFoundError):
        ssl_option("verify-full", "/nonexistent/global-bundle.pem")


@pytest.mark.parametrize("token", ["1|abc def", "1|abc\ndef", "1|abc\tdef", "1|ключ"])
def test_tokens_that_cannot_be_a_header_are_refused_without_quoting_them(token: str) -> None:
    from lib.platform.secrets import lsky_token

    with pytest.raises(ConfigError, match="LSKY_TOKEN holds characters") as caught:
        lsky_token(token, None)
    assert token not in str(caught.value)
    assert lsky_token(" 1|abc-DEF_123 ", None) == "1|abc-DEF_123"


@pytest.mark.parametrize(
    ("stored", "error"),
    [
        ('{"token": "1|abc-DEF_123"}', None),
        ('{"token": ' + "[" * 100_000, "JSON without a token key"),  # past the parser's depth
        ('{"tok": "1|abc"}', "JSON without a token key"),
        ("{not json", "JSON without a token key"),
    ],
)
def test_a_token_secret_is_read_plain_or_as_json_and_a_broken_one_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, stored: str, error: str | None
) -> None:
    from lib.platform import secrets

    monkeypatch.setattr(secrets, "_secret", lambda arn, *, force: stored)  # Secrets Manager
    if error is None:
        assert secrets.lsky_token(None, "arn:aws:secretsmanager:x") == "1|abc-DEF_123"
        return
    with pytest.raises(ConfigError, match=error):
        secrets.lsky_token(None, "arn:aws:secretsmanager:x")


@pytest.mark.parametrize(
    ("count", "one", "many", "said"),
    [
        (1, "FAILED record", None, "1 FAILED record"),
        (0, "FAILED record", None, "0 FAILED records"),
        (2, "message", None, "2 messages"),
        (1, "try", "tries", "1 try"),
        (3, "try", "tries", "3 tries"),
    ],
)
def test_a_count_in_words_agrees_with_its_noun(
    count: int, one: str, many: str | None, said: str
) -> None:
    assert plural(count, one, many) == said
    assert verb(count, "is", "are") == ("is" if count == 1 else "are")
