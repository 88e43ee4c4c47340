"""Redaction before truncation (issue 19): a text from outside is redacted, then cut."""

from __future__ import annotations

import pytest

from lib.platform.redact import REDACTED, outside_text, redact, token_parts
from lib.transfer.lsky_envelope import MESSAGE_LIMIT, short_message

SECRET = "DAdvTokQ9rXs8Lm2PzWq"
TOKEN = f"5|{SECRET}"


def leaked(text: str, secret: str = TOKEN) -> list[str]:
    """Every piece of `secret` (4 characters or more) that `text` still holds."""
    return [secret[i : i + 4] for i in range(len(secret) - 3) if secret[i : i + 4] in text]


@pytest.mark.parametrize("glue", [" Authorization: ", ""])
@pytest.mark.parametrize("padding", range(MESSAGE_LIMIT - 45, MESSAGE_LIMIT + 5))
def test_an_echoed_header_is_redacted_wherever_the_cut_would_fall(padding: int, glue: str) -> None:
    # Issue 19: cut at 160 first, "Bearer 5|DAdvTokQ9r..." kept the id and half the secret.
    echoed = "x" * padding + f"{glue}Bearer {TOKEN}"
    for secrets in ((), token_parts([TOKEN])):  # by its shape, and as a known secret
        kept = short_message(echoed, secrets=secrets)
        assert len(kept) <= MESSAGE_LIMIT
        assert leaked(kept) == [], kept


@pytest.mark.parametrize("padding", range(0, 60))
def test_a_known_secret_without_a_recognisable_shape_is_redacted_before_the_cut(
    padding: int,
) -> None:
    echoed = "y" * padding + f"secret was {SECRET} and more text after it"
    kept = outside_text(echoed, 40, secrets=token_parts([TOKEN]))
    assert len(kept) <= 40
    assert leaked(kept, SECRET) == [], kept


@pytest.mark.parametrize(
    ("text", "kept", "gone"),
    [
        ("Authorization: Bearer 5|abcdEFGH1234", "Authorization: Bearer [redacted]", "abcd"),
        ('{"authorization":"Bearer abc.def.ghi"}', '{"authorization":"Bearer [redacted]"}', "def"),
        ("token 42|tok-5ecret-Zq8Hx1Lm refused", "token [redacted] refused", "5ecret"),
        ("Basic dXNlcjpwYXNz", "Basic [redacted]", "dXNl"),
        ("refusedBearer 7|glued-to-the-text", "refusedBearer [redacted]", "glued"),
        ("no-space7|glued-to-the-text", "no-space[redacted]", "glued"),
        (
            "GET https://s3.example.com/b/k.png?X-Amz-Signature=abc123&X-Amz-Credential=AKIA",
            "GET https://s3.example.com/b/k.png?[redacted]",
            "abc123",
        ),
        (
            "connect postgresql://archiver:pw-5ecret@db.internal:5432/app failed",
            "connect postgresql://[redacted]@db.internal:5432/app failed",
            "pw-5ecret",
        ),
        ("host=db password=pw-5ecret user=x", "host=db password=[redacted] user=x", "pw-5ecret"),
        ("signature=abc123 in a header", "signature=[redacted] in a header", "abc123"),
    ],
)
def test_credentials_are_recognised_by_their_shape(text: str, kept: str, gone: str) -> None:
    assert redact(text) == kept
    assert gone not in redact(text)


@pytest.mark.parametrize(
    "text",
    [
        "每分钟内你最多可以上传 20 张图片",
        "CSRF token mismatch.",
        "Authentication failed.",
        "upload failed (HTTP 500): Lsky answered HTTP 500: Server Error [attempt 1/3]",
        "download failed (HTTP 404): upstream answered HTTP 404 for https://cdn.example.com/a.png",
    ],
)
def test_ordinary_messages_are_kept_as_they_are(text: str) -> None:
    assert outside_text(text, 500) == text


def test_one_bounded_line() -> None:
    kept = outside_text("a\nb\r\x1b[31m" + "z" * 500, 50)
    assert "\n" not in kept
    assert "\x1b" not in kept
    assert len(kept) == 50
    assert kept.endswith("...")
    assert outside_text(REDACTED, 5) == "[r..."  # a cut marker is harmless
