"""Text from outside (a host's answer, a driver's error, a message body), made safe to keep.

Secrets are redacted first, then the length is bounded: a cut made first could leave
the start of a token behind, where no pattern and no known secret matches it any more.
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
_PIPE_TOKEN = re.compile(r"[0-9]+\|[^\s\"'<>,;|]{4,}")
# Credentials in a URL: scheme://user:password@host.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]*@")
# A URL's query: presigned URLs carry their signature (a credential) there.
_QUERY = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s?#\"'<>]*)\?[^\s#\"'<>]+")
# key=value pairs that hold a secret (conninfo strings, signatures outside a URL).
_SECRET_FIELD = re.compile(
    r"(?i)\b(password|passwd|pwd|secret|token|access_token|signature|sig"
    r"|x-amz-signature|x-amz-credential|x-amz-security-token)=[^\s&\"',;]+"
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with the given secrets, and anything shaped like a credential, replaced by
    [redacted]. Known secrets go first, longest first, so that a token's secret half
    cannot break up the whole token before it is found."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len)[::-1]:
        text = text.replace(secret, REDACTED)
    text = _AUTH_SCHEME.sub(rf"\1\2{REDACTED}", text)
    text = _PIPE_TOKEN.sub(REDACTED, text)
    text = _USERINFO.sub(rf"\1{REDACTED}@", text)
    text = _QUERY.sub(rf"\1?{REDACTED}", text)
    return _SECRET_FIELD.sub(rf"\1={REDACTED}", text)


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
