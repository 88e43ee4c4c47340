"""Text from outside (a host's answer, a driver's error, a message body), made safe to keep.

Secrets are redacted first, then the length is bounded: a cut made first could leave
the start of a token behind. Every text an archive keeps passes here, so a pattern runs
only on a text that has what its matches must have (a `|`, `bearer`, a secret word).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"
ELLIPSIS = "..."
# Secrets shorter than this are not searched for: they would redact ordinary words.
MIN_SECRET_LENGTH = 4

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# An Authorization value: "Bearer <token>", "Basic <credentials>". No word boundary in
# front: an echo may be glued to the text before it ("...failedBearer 5|...").
_AUTH_SCHEME = re.compile(r"(?i)(bearer|basic)(\s+)[^\s\"',;]+")
# A Sanctum personal token as Lsky hands it out: "<id>|<secret>".
_PIPE_TOKEN = re.compile(r"(?<![0-9])[0-9]+\|[^\s\"'<>,;|]{4,}")
# Credentials in a URL: scheme://user:password@host. The scheme is taken from the start of
# its run of scheme characters, whatever is glued to it ("dsn_postgresql://",
# "5postgresql://"): once per run, so linear on any text.
_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.-])([a-z0-9+.-]++://)[^/\s@\"'<>]*+@")
# A URL's query: presigned URLs carry their signature (a credential) there.
_QUERY = re.compile(r"(?i)(?<![a-z0-9+.-])([a-z0-9+.-]++://[^\s?#\"'<>]*+)\?[^\s#\"'<>]+")
# A field with a secret, by its key: conninfo and environment (password=,
# PGPASSWORD=, client_secret=), a query (X-Amz-Signature=, sig=, URL-encoded %3D too),
# JSON ("access_token": "...", escaped or not), headers (X-Api-Key: ...), PHP (=>). The
# key may be glued to what is before it (db_password, PGPASSWORD); only `sig` needs a
# boundary ("design" is no key; "%3Fsig" has one). A quoted value goes to its closing
# quote, a scheme's ("Bearer x") to the end of its credential, any other to the next
# space, `&`, quote, comma or semicolon.
_SECRET_FIELD = re.compile(
    r"""(?ix)
    (?P<head>
      (?<![\w.-])                  # from the start of the key, once: linear on any text
      (?> [\w.-]*?
          (?: pass(?:word|wd|phrase) | pwd | secret | token | signature | credential
            | session | api[_-]?key | private[_-]?key | access[_-]?key
            | (?:(?<![a-z])|(?<=%3f)|(?<=%253f)) sig (?![a-z]) ) )
      [\w.-]*+
      (?:\\?["'])?
      \s* (?: => | = | : | %3D | %253D ) \s*
    )
    (?: (?P<dq>") (?:[^"\\]|\\.)* "?
      | (?P<sq>') (?:[^'\\]|\\.)* '?
      | (?P<eq>\\["']) [^"']*? (?:\\["']|["']|$)
      | (?:bearer|basic) \s+ [^\s&"',;]+
      | [^\s&"',;]+ )
    """
)
# What every match of _SECRET_FIELD has, lower-cased.
_FIELD_WORDS = ("pass", "pwd", "secret", "token", "sig", "credential", "session", "key")


def _field(match: re.Match[str]) -> str:
    quote = match["dq"] or match["sq"] or match["eq"] or ""
    return f"{match['head']}{quote}{REDACTED}{quote}"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with the given secrets, and anything shaped like a credential, replaced by
    [redacted]. Known secrets go first, longest first, so that a token's secret half
    cannot break up the whole token before it is found; then fields by their key, so that
    a scheme or a token shape cannot take the key and leave the value."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len)[::-1]:
        text = text.replace(secret, REDACTED)
    # Each pattern runs only when the text has what it needs (the replacements add
    # none of it): most texts are words, types, keys and plain URLs, and skip them all.
    lower = text.lower()
    if any(word in lower for word in _FIELD_WORDS):
        text = _SECRET_FIELD.sub(_field, text)
    if "bearer" in lower or "basic" in lower:
        text = _AUTH_SCHEME.sub(rf"\1\2{REDACTED}", text)
    if "|" in text:
        text = _PIPE_TOKEN.sub(REDACTED, text)
    if "@" in text:
        text = _USERINFO.sub(rf"\1{REDACTED}@", text)
    if "?" in text:
        text = _QUERY.sub(rf"\1?{REDACTED}", text)
    return text


def token_parts(tokens: Iterable[str]) -> list[str]:
    """Each "<id>|<secret>" token and its secret half: an echo may quote either."""
    return [part for token in tokens for part in (token, token.partition("|")[2])]


def outside_text(value: object, limit: int, *, secrets: Iterable[str] = ()) -> str:
    """One line of at most `limit` characters, redacted before it is cut: what a log line,
    archive_error, the lane's pause_detail or `archive-ctl status` may keep of it."""
    text = _CONTROL.sub(" ", str(value)).strip()
    text = redact(text, secrets)
    if len(text) <= limit:
        return text
    return text[: max(limit - len(ELLIPSIS), 0)] + ELLIPSIS
