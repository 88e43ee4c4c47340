"""Lsky Pro's image list (GET /api/v1/images), read as data (pure, table-tested).

The list is how an attempt finds the image an earlier one may have stored; what its
keyword and album filters really match is in docs/explanation/transfers.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lib.transfer.failures import Kind, Stage, fail
from lib.transfer.lsky_envelope import read_envelope
from lib.transfer.lsky_upload import HostedImage, hosted_image

# Relative to when it was listed ("3分钟前"): meaningless once stored.
_VOLATILE_KEYS = frozenset({"human_date"})


@dataclass(frozen=True)
class ListingPage:
    images: tuple[dict[str, Any], ...]  # the items, each with a str origin_name
    last_page: int


def parse_listing(
    status: int,
    raw: bytes,
    *,
    location: str | None = None,
    retry_after: str | None = None,
    secrets: Iterable[str] = (),
) -> ListingPage:
    """One page of the list, or an ArchiveFailure (stage lookup) raised; `secrets` are
    redacted from Lsky's message."""
    envelope = read_envelope(
        Stage.LOOKUP,
        "Lsky's image list",
        status,
        raw,
        location=location,
        retry_after=retry_after,
        secrets=secrets,
    )
    payload, message = envelope.payload, envelope.message
    if payload.get("status") is not True:
        raise fail(
            Stage.LOOKUP,
            Kind.REJECTED,
            f"Lsky refused the image list: {message or 'no message'}",
            status=200,
        )
    page = payload.get("data")
    items = page.get("data") if isinstance(page, dict) else None
    if not isinstance(page, dict) or not isinstance(items, list):
        raise fail(
            Stage.LOOKUP, Kind.BAD_RESPONSE, "Lsky's image list has no data.data array", status=200
        )
    last_page = page.get("last_page")
    images = tuple(
        {key: value for key, value in item.items() if key not in _VOLATILE_KEYS}
        for item in items
        if isinstance(item, dict) and isinstance(item.get("origin_name"), str)
    )
    return ListingPage(
        images=images,
        last_page=last_page if isinstance(last_page, int) and last_page >= 1 else 1,
    )


def listed_image(item: dict[str, Any]) -> HostedImage:
    hosted = hosted_image(item)
    if hosted is None:
        raise fail(
            Stage.LOOKUP, Kind.BAD_RESPONSE, "Lsky lists the image without a links.url fit to store"
        )
    return hosted
