"""Lsky Pro's upload answer, read as data (pure, table-tested): the hosted image, or the
ArchiveFailure that says why not (its message redacted before it is bounded)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lib.transfer.failures import Kind, Stage, fail
from lib.transfer.lsky_envelope import read_envelope


@dataclass(frozen=True)
class HostedImage:
    url: str
    mime_type: str
    data: dict[str, Any]


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
    if not isinstance(data, dict):
        data = {}
    links = data.get("links")
    url = links.get("url") if isinstance(links, dict) else None
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise fail(
            Stage.UPLOAD,
            Kind.BAD_RESPONSE,
            "Lsky's success answer has no data.links.url",
            status=200,
        )
    mime_type = data.get("mimetype")
    return HostedImage(url=url, mime_type=str(mime_type) if mime_type else "", data=data)
