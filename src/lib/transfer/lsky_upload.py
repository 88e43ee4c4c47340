"""Lsky Pro's upload answer, read as data (pure, table-tested): the hosted image, or the
ArchiveFailure that says why not (its message redacted before it is bounded)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lib.transfer.failures import Kind, Stage, fail
from lib.transfer.lsky_envelope import read_envelope

# The hosted URL goes into the generation's row, where the site shows it: an http(s) URL
# with a host and no credentials, no whitespace or control character, of a length every
# browser takes. Lsky's own are its domain and a dated path, well under it.
MAX_HOSTED_URL = 2048
# A media type as RFC 6838 names one (`type/subtype`, restricted names), else none.
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][\w!#$&^.+-]{0,126}/[A-Za-z0-9][\w!#$&^.+-]{0,126}", re.ASCII)


@dataclass(frozen=True)
class HostedImage:
    url: str
    mime_type: str
    data: dict[str, Any]


def hosted_url(value: object) -> str | None:
    """`value` if it is a URL fit to store as the hosted image's (see MAX_HOSTED_URL)."""
    if not isinstance(value, str) or len(value) > MAX_HOSTED_URL:
        return None
    if any(char.isspace() or not char.isprintable() for char in value):
        return None
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host or "@" in parts.netloc:
        return None
    return value


def hosted_image(data: dict[str, Any]) -> HostedImage | None:
    """The image Lsky describes in `data` (an upload's answer, a listed item): None when
    its `links.url` is not fit to store; a `mimetype` that is not a media type is left out."""
    links = data.get("links")
    url = hosted_url(links.get("url") if isinstance(links, dict) else None)
    if url is None:
        return None
    mime_type = data.get("mimetype")
    fit = isinstance(mime_type, str) and _MEDIA_TYPE.fullmatch(mime_type) is not None
    return HostedImage(url=url, mime_type=str(mime_type) if fit else "", data=data)


def parse_upload_response(
    status: int,
    raw: bytes,
    *,
    location: str | None = None,
    retry_after: str | None = None,
    secrets: Iterable[str] = (),
) -> HostedImage:
    """Turn Lsky's answer into a HostedImage or an ArchiveFailure (pure, table-tested);
    `secrets` (the request's token) are redacted from Lsky's message."""
    envelope = read_envelope(
        Stage.UPLOAD,
        "Lsky",
        status,
        raw,
        location=location,
        retry_after=retry_after,
        secrets=secrets,
    )
    payload, message = envelope.payload, envelope.message
    if payload.get("status") is not True:
        raise fail(
            Stage.UPLOAD, Kind.REJECTED, f"Lsky refused the upload: {message or 'no message'}"
        )
    data = payload.get("data")
    hosted = hosted_image(data) if isinstance(data, dict) else None
    if hosted is None:
        raise fail(
            Stage.UPLOAD,
            Kind.BAD_RESPONSE,
            "Lsky's success answer has no data.links.url fit to store (an http(s) URL with "
            f"a host, no credentials or spaces, at most {MAX_HOSTED_URL} characters)",
            status=200,
        )
    return hosted
