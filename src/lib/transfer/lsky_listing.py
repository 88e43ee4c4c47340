"""Lsky Pro's image list (GET /api/v1/images), read as data (pure, table-tested).

The list is how an attempt finds the image an earlier one may have stored; what its
keyword and album filters really match is in docs/transfer.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lib.transfer.failures import Kind, Stage, fail, retry_after_seconds

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# Relative to when it was listed ("3分钟前"): meaningless once stored.
_VOLATILE_KEYS = frozenset({"human_date"})


@dataclass(frozen=True)
class ListingPage:
    images: tuple[dict[str, Any], ...]  # the items, each with a str origin_name
    last_page: int


def _short(value: Any, limit: int = 160) -> str:
    # As lib.transfer.lsky.short_message (which imports this module).
    text = _CONTROL.sub(" ", str(value)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_listing(
    status: int, raw: bytes, *, location: str | None = None, retry_after: str | None = None
) -> ListingPage:
    """One page of the list, or an ArchiveFailure (stage lookup) raised."""
    if status in (301, 302, 303, 307, 308):
        if location and "/login" in location:
            raise fail(
                Stage.LOOKUP,
                Kind.HTTP_STATUS,
                "Lsky redirected to /login: token refused",
                status=401,
            )
        raise fail(
            Stage.LOOKUP, Kind.HTTP_STATUS, f"Lsky redirected (HTTP {status})", status=status
        )
    try:
        payload: Any = json.loads(raw)
    except ValueError:
        payload = None
    message = _short(payload.get("message", "")) if isinstance(payload, dict) else ""
    if status != 200:
        detail = f": {message}" if message else ""
        raise fail(
            Stage.LOOKUP,
            Kind.HTTP_STATUS,
            f"Lsky's image list answered HTTP {status}{detail}",
            status=status,
            retry_after=retry_after_seconds(retry_after),
        )
    if not isinstance(payload, dict):
        raise fail(Stage.LOOKUP, Kind.BAD_RESPONSE, "Lsky's image list is not JSON", status=200)
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


def hosted_url(item: dict[str, Any]) -> str | None:
    """An item's `links.url`, if it is an http(s) URL."""
    links = item.get("links")
    url = links.get("url") if isinstance(links, dict) else None
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None
