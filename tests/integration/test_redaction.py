"""Redaction before truncation, end to end (issue 19): a Lsky stand-in that echoes the
Authorization header in its error message, padded so that a cut at the message's bound
falls inside the token. Neither the token nor any piece of it may reach the log lines,
the row's archive_error, the lane's pause_detail or `archive-ctl status`."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from devkit import images
from devkit.lsky import Behaviour
from lib.archive.message import encode
from lib.cli.context import EXIT_OK
from lib.platform.redact import REDACTED
from lib.transfer.lsky_envelope import MESSAGE_LIMIT
from tests.integration.conftest import ArchiveHarness
from tests.integration.test_cli import Ctl
from tests.support import fetch_record, lane_row, reset_lane, seed_record, sqs_event

SECRET = "DAdvTokQ9rXs8Lm2PzWq"
TOKEN = f"5|{SECRET}"
HEADER = f"Bearer {TOKEN}"
PNG = images.png(8, 8)


def leaked(text: str) -> list[str]:
    """Every piece (4 characters or more) of the token that `text` still holds."""
    return [TOKEN[i : i + 4] for i in range(len(TOKEN) - 3) if TOKEN[i : i + 4] in text]


# What the stand-in echoes: the whole header, or only the token's secret half (a shape no
# pattern knows: only the token the request used identifies it).
ECHOED = {"header": HEADER, "secret": SECRET}


def padding_for(cut_into_echo: int) -> str:
    """A message prefix that puts the bound's cut `cut_into_echo` characters into the
    echoed text (the cut keeps MESSAGE_LIMIT - 3 characters and adds "...")."""
    return "x" * (MESSAGE_LIMIT - 3 - cut_into_echo)


@pytest.fixture
def ctl(cli_env: None, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


# header: 9 cuts after "Bearer 5|", 13 after "Bearer 5|DAdv", 20 halfway through the
# secret; secret: 4 and 10 characters into it.
@pytest.mark.parametrize(
    ("part", "cut_into_echo"),
    [("header", 9), ("header", 13), ("header", 20), ("secret", 4), ("secret", 10)],
)
def test_an_echoed_token_never_survives_a_cut(
    part: str,
    cut_into_echo: int,
    archive_env: Any,
    archive: ArchiveHarness,
    ctl: Ctl,
    db: Any,
    upstream: Any,
    lsky: Any,
) -> None:
    lsky.config = replace(lsky.config, token=TOKEN)
    archive_env(LSKY_TOKEN=TOKEN)
    reset_lane(db)
    prefix = padding_for(cut_into_echo)
    assert len(prefix) + len(ECHOED[part]) > MESSAGE_LIMIT  # a cut-first bound falls inside
    url = upstream.add("/echo.png", PNG)

    # A refusal Lsky's wording does not explain: the record is retried, its error kept.
    seed_record(db, 1, image_url=url)
    lsky.script(Behaviour.status_false(prefix).echoing_authorization(part))
    archive.invoke(sqs_event([encode(1)], archive.queues.arn))
    [answer] = [u.message for u in lsky.uploads if u.message]
    assert answer == prefix + ECHOED[part]  # the stand-in did echo it
    error = fetch_record(db, 1)["archive_error"]
    assert fetch_record(db, 1)["archive_status"] == "PENDING"
    assert "xxxx[r" in error or "xxxxBearer [r" in error  # the marker, maybe cut itself
    assert leaked(error) == [], error

    # The same echo in a 403 (API switched off): the lane pauses with the answer as detail.
    seed_record(db, 2, image_url=url)
    lsky.script(Behaviour.forbidden(prefix).echoing_authorization(part))
    archive.invoke(sqs_event([encode(2)], archive.queues.arn))
    detail = lane_row(db)["detail"]
    assert lane_row(db)["reason"] == "account"
    assert detail.startswith(f"Lsky answered HTTP 403: {prefix}")
    assert leaked(detail) == [], detail

    # Every log line of both runs.
    logged = "\n".join(archive.raw_logs)
    assert "archive attempt failed, will retry" in logged
    assert "upload lane paused; attempt given back" in logged
    assert leaked(logged) == []

    # What an operator sees.
    assert ctl("status") == EXIT_OK, ctl.err
    assert f"detail: Lsky answered HTTP 403: {prefix}" in ctl.out
    assert leaked(ctl.out + ctl.err) == []
    assert ctl("status", "--json") == EXIT_OK, ctl.err
    assert json.loads(ctl.out)["lane"]["detail"] == detail
    assert leaked(ctl.out + ctl.err) == []
    assert ctl("lane", "clear") == EXIT_OK, ctl.err
    assert f"detail: {detail}" in ctl.out
    assert leaked(ctl.out + ctl.err) == []


def test_a_detail_an_older_version_stored_is_redacted_on_show(ctl: Ctl, db: Any) -> None:
    """Rows written before the fix may hold a cut token: status redacts what it shows."""
    reset_lane(db)
    db.run(
        "UPDATE image_archive_lane SET paused_until = 'infinity', pause_reason = 'account',"
        " paused_since = now(), pause_detail = :detail",
        detail=f"Lsky answered HTTP 403: {HEADER[:16]}...",
    )
    assert ctl("status") == EXIT_OK, ctl.err
    assert f"detail: Lsky answered HTTP 403: Bearer {REDACTED}" in ctl.out
    assert leaked(ctl.out) == []
    reset_lane(db)
