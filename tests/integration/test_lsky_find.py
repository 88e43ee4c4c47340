"""LskyClient.find against the Lsky stand-in: exact origin_name only, whatever the
listing's keyword and album filters let through (docs/explanation/transfers.md)."""

from __future__ import annotations

import time

import pytest

from devkit.lsky import LskyStandIn
from lib.transfer import lsky as lsky_client
from lib.transfer.failures import ArchiveFailure, Kind, Stage
from lib.transfer.lsky import LskyClient

NAME = "alice_7_20261202T120005Z.png"
KEYWORD = "alice_7_20261202T120005Z."


def client(lsky: LskyStandIn, *, album_id: int | None = None) -> LskyClient:
    return LskyClient(base_url=lsky.base_url, token=lambda force: lsky.token, album_id=album_id)


def find(client: LskyClient, names: set[str] | None = None) -> list[str]:
    found = client.find(names or {NAME}, keyword=KEYWORD, deadline=time.monotonic() + 10)
    return [str(image.data["key"]) for image in found]


def test_only_an_exact_origin_name_matches(lsky: LskyStandIn) -> None:
    lsky.add_image(origin_name="other.png", alias_name=NAME)  # an alias is not the name
    lsky.add_image(origin_name="x" + NAME)  # contains it
    lsky.add_image(origin_name=NAME + ".bak")  # starts with it
    lsky.add_image(origin_name=NAME.upper())  # LIKE is case-insensitive, equality is not
    lsky.add_image(origin_name="alice-7-20261202T120005Z.png")  # `_` is LIKE's any-character
    lsky.add_image(owner="bob", origin_name=NAME)  # another user: never listed
    assert find(client(lsky)) == []
    assert len(lsky.listings) == 1

    hit = lsky.add_image(origin_name=NAME)
    assert find(client(lsky)) == [hit.key]


def test_the_oldest_of_several_matches_comes_first(lsky: LskyStandIn) -> None:
    newer = lsky.add_image(origin_name=NAME, age=10)
    older = lsky.add_image(origin_name=NAME, age=60)
    [image, _] = client(lsky).find({NAME}, keyword=KEYWORD, deadline=time.monotonic() + 10)
    assert image.data["key"] == older.key
    assert image.url == f"{lsky.public_url}/i/{older.pathname}"
    assert image.mime_type == "image/png"
    assert {str(older.key), str(newer.key)} == set(find(client(lsky)))
    assert lsky.listings[0] == {"keyword": KEYWORD, "order": "earliest", "page": "1"}


def test_an_image_in_an_album_is_found_with_or_without_album_id(lsky: LskyStandIn) -> None:
    # A user's default album puts uploads in an album; the origin_name branch of the
    # keyword filter is not restricted by album (Image::scopeFilter's ungrouped OR).
    album = lsky.add_album()
    other = lsky.add_album("other")
    hit = lsky.add_image(origin_name=NAME, album_id=album)
    assert find(client(lsky)) == [hit.key]
    assert find(client(lsky, album_id=other)) == [hit.key]
    assert lsky.listings[-1]["album_id"] == str(other)


def test_any_of_the_names_matches(lsky: LskyStandIn) -> None:
    # A save format set on the group renames the extension in origin_name.
    hit = lsky.add_image(origin_name=NAME.replace(".png", ".webp"))
    assert find(client(lsky), {NAME, NAME.replace(".png", ".webp")}) == [hit.key]


def test_pages_until_a_match_within_the_limit(lsky: LskyStandIn) -> None:
    # Alias names that contain the keyword fill the first page (40 a page, oldest first).
    for n in range(45):
        lsky.add_image(origin_name=f"o{n}.png", alias_name=KEYWORD + str(n), age=1000 - n)
    hit = lsky.add_image(origin_name=NAME)
    assert find(client(lsky)) == [hit.key]
    assert [query["page"] for query in lsky.listings] == ["1", "2"]


def test_too_many_pages_cannot_tell(lsky: LskyStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lsky_client, "MAX_LOOKUP_PAGES", 1)
    for n in range(41):
        lsky.add_image(origin_name=f"o{n}.png", alias_name=KEYWORD + str(n))
    with pytest.raises(ArchiveFailure) as caught:
        find(client(lsky))
    assert (caught.value.failure.stage, caught.value.failure.kind) == (
        Stage.LOOKUP,
        Kind.BAD_RESPONSE,
    )
    assert "cannot tell" in caught.value.failure.message


def test_a_rotated_token_is_fetched_again_once(lsky: LskyStandIn) -> None:
    tokens = {False: "1|stale-token", True: lsky.token}
    rotated = LskyClient(base_url=lsky.base_url, token=lambda force: tokens[force])
    hit = lsky.add_image(origin_name=NAME)
    assert find(rotated) == [hit.key]
    assert len(lsky.listings) == 2


def test_a_refused_list_is_a_lookup_failure_without_the_token(lsky: LskyStandIn) -> None:
    refused = LskyClient(base_url=lsky.base_url, token=lambda force: "1|wrong-secret")
    with pytest.raises(ArchiveFailure) as caught:
        find(refused)
    failure = caught.value.failure
    assert (failure.stage, failure.status) == (Stage.LOOKUP, 401)
    assert "wrong-secret" not in failure.message


def test_an_unreachable_host_is_a_lookup_failure() -> None:
    gone = LskyClient(base_url="http://127.0.0.1:9", token=lambda force: "1|t")
    with pytest.raises(ArchiveFailure) as caught:
        find(gone)
    assert (caught.value.failure.stage, caught.value.failure.kind) == (
        Stage.LOOKUP,
        Kind.CONNECTION,
    )
