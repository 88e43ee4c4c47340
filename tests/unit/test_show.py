"""`archive-ctl show`'s pure parts: what a record waits for, an event in words, and the
Logs Insights query and its rows."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lib.cli import logs_insights
from lib.cli.show import Timing, describe, story_note, waiting_for
from lib.state.events import EventKind
from lib.state.lane import LaneState
from lib.state.stories import RecordRow, StoredEvent, Story

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TIMING = Timing(max_attempts=3, lock_ttl_seconds=180, grace_seconds=300, interval_seconds=900)
OPEN = LaneState(now=NOW)


def row(**changes: Any) -> RecordRow:
    base = RecordRow(
        record_id=7,
        status="SUCCEEDED",
        archive_status="PENDING",
        attempts=1,
        next_run_at=NOW,
        wait_reason=None,
        enqueued_at=NOW - timedelta(seconds=10),
        locked_by=None,
        locked_at=None,
        lock_expired=False,
        error=None,
        archived_at=None,
        hosted_url=None,
        staged_key=None,
        staged_at=None,
        staged_bytes=None,
        altered=None,
        may_be_hosted=False,
        backfilled=False,
        started_at=None,
        now=NOW,
        booked_at=None,
        events=0,
        failed_at=None,
        failed_at_estimated=False,
    )
    return replace(base, **changes)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("changes", "lane", "what", "until", "words"),
    [
        ({"archive_status": None}, OPEN, "never_queued", None, "never queued"),
        ({"archive_status": "SUCCEEDED", "archived_at": ago(60)}, OPEN, "nothing", None,
         "nothing: archived 11:59:00 (60 s ago)"),
        ({"archive_status": "FAILED", "staged_key": "staged/7/a.png", "failed_at": ago(120)},
         OPEN, "nothing", None, "nothing: FAILED 11:58:00 (2 min ago); `archive-ctl requeue "
         "--id 7` gives it new attempts from its staged copy"),
        ({"archive_status": "FAILED", "failed_class": "permanent",
          "error": "download failed (HTTP 404): upstream answered HTTP 404 [attempt 1/3]"},
         OPEN, "nothing", None, "it failed for good: the provider's answer will not change (its "
         "URL gone or refused, or not an image), so `archive-ctl requeue --id 7` would fail the "
         "same way unless the source has changed"),
        # No `failed` event (expired): failed before its last attempt, only a permanent one does.
        ({"archive_status": "FAILED", "error": "download failed: not an image [attempt 1/3]"},
         OPEN, "nothing", None, "it failed for good: the provider's answer will not change"),
        ({"archive_status": "FAILED", "failed_class": "permanent", "staged_key": "s/7.png",
          "error": "upload failed (HTTP 413): Lsky answered HTTP 413 [attempt 1/3]"},
         OPEN, "nothing", None, "fix that on the Lsky side (the group's size limit or file "
         "types, the storage strategy, the quota, the token), then `archive-ctl requeue --id 7` "
         "from its staged copy"),
        ({"archive_status": "FAILED", "failed_class": "transient",
          "error": "download failed (HTTP 503): upstream answered HTTP 503 [attempt 3/3]"},
         OPEN, "nothing", None, "`archive-ctl requeue --id 7` gives it new attempts"),
        ({"archive_status": "FAILED", "error": "lock expired after the last attempt"},
         OPEN, "nothing", None, "`archive-ctl requeue --id 7` gives it new attempts"),
        ({"archive_status": "FAILED", "failed_at": ago(60), "failed_at_estimated": True}, OPEN,
         "nothing", None, "FAILED 11:59:00 (60 s ago) (estimated: an older release did not "),
        ({"archive_status": "RUNNING", "locked_by": "inv", "locked_at": ago(30)}, OPEN, "lock",
         ago(30 - 180), "attempt 1 under way (inv), its lock held until 12:02:30 (in 2 min)"),
        ({"archive_status": "RUNNING", "locked_at": ago(600), "lock_expired": True, "attempts": 3},
         OPEN, "takeover", None, "takes it over (FAILED (its last attempt))"),
        ({"next_run_at": ago(-30), "wait_reason": "backoff"}, OPEN, "backoff", ago(-30),
         "its backoff until 12:00:30 (in 30 s), then attempt 2 of 3; its message held"),
        ({"next_run_at": ago(-30), "wait_reason": "paced", "booked_at": ago(-29)}, OPEN, "slot",
         ago(-29), "its booked upload slot at 12:00:29 (in 29 s)"),
        ({"next_run_at": ago(-30), "wait_reason": "own_fault"}, OPEN, "retry", ago(-30),
         "a retry after our own fault"),
        ({"next_run_at": ago(-90), "wait_reason": "paused", "enqueued_at": None,
          "staged_key": "staged/7/a.png"},
         replace(OPEN, paused_for_seconds=90.0, reason="rate_limit", window="hour"), "lane",
         ago(-90), "the lane's pause (rate_limit, window hour) until 12:01:30 (in 2 min); no "
         "message out: the sweeper sends one once it is due; published from its staged copy"),
        ({"next_run_at": ago(0), "enqueued_at": None, "wait_reason": "paused"},
         replace(OPEN, paused_for_seconds=float("inf"), reason="account"), "lane", None,
         "the lane's pause (account) until cleared"),
        ({"enqueued_at": None, "next_run_at": ago(10)}, OPEN, "sweeper", ago(10 - 300),
         "the sweeper: no message is out for it; it sends one by 12:04:50 (in 5 min)"),
        ({"enqueued_at": None, "next_run_at": ago(301)}, OPEN, "lost", None,
         "nothing: no message is out for it"),
        ({"enqueued_at": ago(901), "next_run_at": ago(901)}, OPEN, "lost", None,
         "looks lost; the sweeper sends it again on its next run"),
        ({"enqueued_at": ago(899), "next_run_at": ago(899)}, OPEN, "message", None,
         "its message (sent 11:45:01 (15 min ago)) to reach the archive function"),
    ],
)  # fmt: skip
def test_what_a_record_waits_for(
    changes: dict[str, Any], lane: LaneState, what: str, until: datetime | None, words: str
) -> None:
    wait = waiting_for(row(**changes), lane, TIMING)
    assert (wait.what, wait.until) == (what, until)
    assert words in wait.words


def event(kind: str, attempt: int = 1, **detail: Any) -> StoredEvent:
    return StoredEvent(NOW, attempt, kind, detail)


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        (event("enqueued", 0, by="producer", inferred=True),
         "by producer (inferred from the row: the producer writes no event)"),
        (event("enqueued", 0, by="archive-ctl redrive-dlq", was="FAILED", attempts=3,
               message_id="m-1"),
         "by archive-ctl redrive-dlq, was FAILED after 3 attempts, message m-1"),
        (event("received", 0, message_id="m", receive_count=2, claimed=False,
               archive_status="PENDING", due_in_seconds=40),
         "message m, receive 2; not claimed (archive PENDING, due in 40 s)"),
        (event("claimed", 2, owner="inv", staged=True), "attempt 2 by inv, from its staged copy"),
        (event("lock_taken_over", owner="old", by="sweeper", locked_at=ago(600).isoformat()),
         "from old (locked 11:50:00 (10 min ago)) by sweeper"),
        (event("lock_lost", write="retry"), "its retry was not recorded: the lock had passed on"),
        (event("fetched", bytes=10, type="image/png", source="provider", seconds=0.5),
         "10 bytes (image/png) from the provider in 0.5 s"),
        (event("fetched", source="provider", error="HTTP 403"),
         "from the provider failed: HTTP 403"),
        (event("staged", key="staged/7/a.png", bytes=3, why="lane paused"),
         "staged/7/a.png (3 bytes): lane paused"),
        (event("slot", answer="booked", at=ago(-61).isoformat()), "booked for 12:01:01 (in 61 s)"),
        (event("lane_paused", reason="rate_limit", window="minute", until="u", detail="每分钟"),
         "rate_limit, window minute until u: 每分钟"),
        (event("looked_up", adopted="K", why="the sha1"), "adopted K: the sha1"),
        (event("looked_up", refused=["K: older"]), "nothing of ours found (not ours: K: older)"),
        (event("looked_up", error="HTTP 500"), "could not be answered: HTTP 500"),
        (event("upload_answered", status=200, key="K"), "HTTP 200, key K"),
        (event("upload_answered", status=500, error="Server Error", may_be_hosted=True),
         "failed: HTTP 500: Server Error, may be stored"),
        (event("held", why="paced", until=ago(-5).isoformat(), given_back=True),
         "paced until 12:00:05 (in 5 s), attempt given back"),
        (event("parked", why="paused", until=ago(-5).isoformat(), visibility_refused=True),
         "paused until 12:00:05 (in 5 s) (SQS refused to hold its message)"),
        (event("unparked", 0, by="sweeper", due_at=ago(-20).isoformat()),
         "by sweeper, due 12:00:20 (in 20 s)"),
        (event("retried", error_class="transient", error="HTTP 500",
               next_run_at=ago(-30).isoformat()),
         "transient: HTTP 500; next run 12:00:30 (in 30 s)"),
        (event("failed", by="archive function", error="too big"), "by archive function: too big"),
        (event("archived", url="https://img/a.png", adopted=True, altered=True, recorded=False),
         "https://img/a.png, adopted (an earlier attempt had stored it), stored altered "
         "(re-encoded or watermarked); not recorded: the row was already archived"),
        (event("unsent", 0, by="sweeper"), "its message did not go out (refused); by sweeper"),
        (event("dated", 0, by="sweeper"), "by sweeper"),
        (event("audited", 0, verdict="missing", was="intact", why="HTTP 404", repair="restore",
               hosted_key="Ab12"),
         "missing (was intact): HTTP 404; restore; the host's key Ab12"),
        (event("restored", 0, old_url="https://img/a.png", old_key="Ab12",
               new_url="https://img/b.png", new_key="Cd34"),
         "https://img/a.png (key Ab12) replaced by https://img/b.png (key Cd34); the old copy"
         " stays on the host for an operator to delete"),
        (event("original_kept", 0, key="originals/1/x.png", bytes=3, source="hosted",
               by="auditor"),
         "originals/1/x.png (3 bytes) from the hosted copy (what Lsky stored), by auditor"),
        (event("a_later_kind", x=1), "x=1"),  # a kind a later release wrote
        (event("claimed", 1, owner="inv", extra=f"{'z' * 500}"), "attempt 1 by inv"),
    ],
)  # fmt: skip
def test_an_event_in_words(stored: StoredEvent, words: str) -> None:
    assert describe(stored, NOW) == words


def test_every_kind_has_its_words() -> None:
    for kind in EventKind:
        assert not describe(event(str(kind), flag=1), NOW).startswith("flag="), kind


def test_the_logs_query_finds_the_record_in_both_functions_lines() -> None:
    assert logs_insights.log_groups("prod") == [
        "/aws/lambda/prod-archive",
        "/aws/lambda/prod-sweeper",
        "/aws/lambda/prod-auditor",
    ]
    query = logs_insights.query_for(123)
    assert 'filter record_id = "123"' in query
    assert '@message like /"record_ids":\\s*\\[[^\\]]*"123"/' in query
    assert query.endswith(f"| limit {logs_insights.RESULT_LIMIT}")


def test_a_result_row_in_a_line() -> None:
    line = logs_insights.result_line(
        {
            "@timestamp": "2026-12-02 12:00:00.000",
            "@log": "123456789012:/aws/lambda/prod-archive",
            "level": "INFO",
            "message": "archive succeeded",
            "outcome": "archived",
            "attempt": "1",
        }
    )
    assert (
        line
        == "  2026-12-02 12:00:00.000  archive  INFO archive succeeded outcome=archived attempt=1"
    )
    bare = logs_insights.result_line({"@message": "Bearer 1|secretsecret"})
    assert bare == "  -  -        Bearer [redacted]"


def story_of(record: RecordRow | None, *stored: StoredEvent, total: int | None = None) -> Story:
    return Story(7, record, list(stored), len(stored) if total is None else total)


@pytest.mark.parametrize(
    ("record", "stored", "total", "note"),
    [
        (row(), (), None, "none yet: queued 11:59:50 (10 s ago) by the producer"),
        (row(archive_status="SUCCEEDED"), (), None, "none: removed by the retention"),
        (row(archive_status="FAILED"), (), None, "none: removed by the retention"),
        # An older release's stray message after the retention: its inferred enqueue and
        # the message, with no conclusion before them.
        (row(archive_status="SUCCEEDED"),
         (event("enqueued", 0, by="producer", inferred=True),
          event("received", 1, claimed=False, archive_status="SUCCEEDED")),
         None, "its story up to its conclusion (SUCCEEDED) is gone"),
        (row(archive_status="SUCCEEDED"), (event("archived"), event("received")), None, None),
        (row(archive_status="SUCCEEDED"), (event("received"),), 40, None),  # older ones unshown
        (row(archive_status="PENDING"), (event("received"),), None, None),
        (row(archive_status=None), (), None, None),
        (None, (), None, None),
    ],
)  # fmt: skip
def test_what_the_events_alone_would_tell_wrongly_is_said(
    record: RecordRow | None, stored: tuple[StoredEvent, ...], total: int | None, note: str | None
) -> None:
    said = story_note(story_of(record, *stored, total=total))
    assert (said is None) == (note is None), said
    assert note is None or note in str(said)


def test_a_message_for_a_concluded_record_is_said_to_be_a_duplicate_or_late() -> None:
    late = event("received", 1, message_id="m", receive_count=1, claimed=False,
                 archive_status="SUCCEEDED")  # fmt: skip
    assert describe(late, NOW) == (
        "message m, receive 1; not claimed (archive SUCCEEDED: a duplicate or late message)"
    )
