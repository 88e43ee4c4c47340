"""Redaction before truncation (issue 19): a text from outside is redacted, then cut."""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import quote

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lib.platform.redact import REDACTED, outside_text, redact, token_parts
from lib.transfer.lsky_envelope import MESSAGE_LIMIT, short_message
from tests.support import model_examples

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
        # Keys glued to what is before them, and keys the list had not named.
        ("client_secret=cs-5ecret&x=1", "client_secret=[redacted]&x=1", "cs-5ecret"),
        ("env db_password=pw-5ecret", "env db_password=[redacted]", "pw-5ecret"),
        ("PGPASSWORD=pw-5ecret psql", "PGPASSWORD=[redacted] psql", "pw-5ecret"),
        ("api_key=ak-5ecret", "api_key=[redacted]", "ak-5ecret"),
        ('{"access_token": "at 5ecret"}', '{"access_token": "[redacted]"}', "5ecret"),
        (
            "next=https%3A%2F%2Fs3.example.com%2Fk.png%3FX-Amz-Signature%3Dabc123%26a%3D1",
            "next=https%3A%2F%2Fs3.example.com%2Fk.png%3FX-Amz-Signature%3D[redacted]",
            "abc123",
        ),
        ("X-Api-Key: ak-5ecret", "X-Api-Key: [redacted]", "ak-5ecret"),
        ("'password' => 'pw 5ecret'", "'password' => '[redacted]'", "5ecret"),
        ("token: Bearer abc123", "token: [redacted]", "abc123"),
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
        'FATAL:  password authentication failed for user "archiver"',
        "design=flat, key plFOv8, keeps_staged_copy, passed: 3",
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


# -- the corpus of secret shapes (issue: keys glued to the text before them passed) --------

# Keys that name a secret, as configuration, environments, OAuth, SDKs and signed URLs
# write them. `sig` alone needs something not a letter in front ("design=" is no key).
SECRET_KEYS = (
    "password",
    "db_password",
    "PGPASSWORD",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "client_secret",
    "clientSecret",
    "AWS_SECRET_ACCESS_KEY",
    "token",
    "access_token",
    "accessToken",
    "refresh_token",
    "id_token",
    "X-Amz-Security-Token",
    "XSRF-TOKEN",
    "api_key",
    "apiKey",
    "x-api-key",
    "private_key",
    "X-Amz-Signature",
    "X-Goog-Signature",
    "Signature",
    "X-Amz-Credential",
    "laravel_session",
)
BOUNDED_KEYS = ("sig",)
# What a secret is made of, by how it is written: unquoted it ends at a space, `&`, a
# quote, a comma or a semicolon; quoted, it is anything its quoting can carry.
PLAIN = st.characters(
    min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="&\"',;"
) | st.characters(min_codepoint=0xA1, max_codepoint=0x2FFF, blacklist_categories=("Z", "C"))
ANY = st.characters(blacklist_categories=("Cs",))
QUOTED = st.characters(blacklist_categories=("Cs",), blacklist_characters="\"'\\")
TOKEN_CHARS = st.sampled_from(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/="
)
PIPED = st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="\"'<>,;|")
USERINFO = st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/@\"'<>")


def _json(secret: str) -> str:
    return json.dumps(secret, ensure_ascii=False)[1:-1]


# (shape, what the secret is drawn from, how the shape writes it): `{key}` a key above,
# `{secret}` the secret as written. Each returns the text and the written secret.
SHAPES: tuple[tuple[str, st.SearchStrategy[str], Callable[[str], str]], ...] = (
    ("{key}={secret}", PLAIN, str),  # conninfo, environment, a query
    ("{key}: {secret}", PLAIN, str),  # a header, YAML
    ("{key}:{secret}", PLAIN, str),
    ('"{key}": "{secret}"', ANY, _json),
    ('{{"user": "u", "{key}":"{secret}", "n": 1}}', ANY, _json),
    ("'{key}': '{secret}'", QUOTED, str),  # a Python repr
    ("'{key}' => '{secret}'", QUOTED, str),  # a PHP array in a Laravel error
    ('{{\\"{key}\\":\\"{secret}\\"}}', QUOTED, str),  # JSON inside a JSON string
    ("https://s3.example.com/b/k.png?X-Amz-Date=1&{key}={secret}", PLAIN, str),
    ("https://s3.example.com/b/k.png?{key}={secret}#frag", PLAIN, str),
    ("https%3A%2F%2Fs3.example.com%2Fk.png%3F{key}%3D{secret}%26X-Amz-Date%3D1", PLAIN, quote),
    ("next=%2Fk.png%253F{key}%253D{secret}", PLAIN, lambda s: quote(quote(s, safe=""))),
    ("{key}%3D{secret}", PLAIN, lambda s: quote(s, safe="")),
    ("Authorization: Bearer {secret}", TOKEN_CHARS, str),
    ("Authorization: Basic {secret}", TOKEN_CHARS, str),
    ("Bearer {secret}", TOKEN_CHARS, str),
    ("token 42|{secret}", PIPED, str),
    ("postgresql://archiver:{secret}@db.internal:5432/app", USERINFO, str),
    ("https://{secret}@cdn.example.com/a.png", USERINFO, str),
)
# What a secret may be glued between: anything, and the pieces texts are made of.
SURROUNDING = st.text() | st.sampled_from(
    ["", " ", "\n", "&", "?", ",", "(", '{"a": 1, ', "failed: ", "x", "9", "_", "-", '"', "'"]
)


@pytest.mark.model
@settings(max_examples=model_examples(400))
@given(data=st.data())
def test_a_secret_of_any_known_shape_never_survives_whatever_surrounds_it(
    data: st.DataObject,
) -> None:
    shape, alphabet, written_as = data.draw(st.sampled_from(SHAPES), label="shape")
    secret = data.draw(st.text(alphabet, min_size=8, max_size=40), label="secret")
    written = written_as(secret)
    key = data.draw(st.sampled_from(SECRET_KEYS + BOUNDED_KEYS), label="key")
    before = data.draw(SURROUNDING, label="before")
    after = data.draw(SURROUNDING, label="after")
    if key in BOUNDED_KEYS and shape.startswith("{key}"):
        before += " "
    text = before + shape.format(key=key, secret=written) + after
    # The secret alone is what must go: not a copy of it in the surroundings, not one the
    # redaction mark spells.
    assume(text.count(written) == 1 and written not in REDACTED)
    for kept in (redact(text), outside_text(text, 100_000)):
        assert written not in kept, (text, kept)
