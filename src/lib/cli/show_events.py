"""A record's events in words (`archive-ctl show`): one function a kind, any detail an
older or later release wrote included (a kind it does not know is shown as its fields)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from lib.cli.progress import duration
from lib.cli.show_wait import when
from lib.cli.words import plural
from lib.platform.redact import outside_text
from lib.state.status import ArchiveStatus
from lib.state.stories import StoredEvent

TEXT_LIMIT = 160  # a line's outside text (an error, a host's answer) at most
# Where an original came from (image_archive_originals.source), in words.
ORIGINAL_SOURCES = {
    "archive": "the bytes archived",
    "staged": "its staged copy",
    "hosted": "the hosted copy (what Lsky stored)",
    "provider": "the provider's URL, fetched again",
}


def _text(detail: dict[str, Any], key: str) -> str:
    return outside_text(detail.get(key, ""), TEXT_LIMIT)


def _at(value: Any, now: datetime) -> str:
    if not isinstance(value, str):
        return "-"
    try:
        return when(datetime.fromisoformat(value), now)
    except ValueError:
        return outside_text(value, 40)


def _enqueued(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"by {_text(d, 'by') or '?'}"
    if d.get("inferred"):
        words += " (inferred from the row: the producer writes no event)"
    if d.get("why"):
        words += f": {_text(d, 'why')}"
    if d.get("was"):
        attempts = d.get("attempts")
        count = plural(attempts, "attempt") if isinstance(attempts, int) else "? attempts"
        words += f", was {_text(d, 'was')} after {count}"
    if d.get("message_id"):
        words += f", message {_text(d, 'message_id')}"
    return words


def _received(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"message {_text(d, 'message_id') or '?'}, receive {d.get('receive_count', '?')}"
    if d.get("claimed") is not False:
        return words
    status = d.get("archive_status")
    why = [f"archive {status or 'never queued'}"]
    if status in (ArchiveStatus.SUCCEEDED, ArchiveStatus.FAILED):
        why[0] += ": a duplicate or late message"
    due_in = d.get("due_in_seconds")
    if d.get("lane_paused"):
        why.append("the lane paused")
    elif isinstance(due_in, int | float) and due_in > 0:
        why.append(f"due in {duration(due_in)}")
    return f"{words}; not claimed ({', '.join(why)})"


def _fetched(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if d.get("error"):
        return f"from the {_text(d, 'source')} failed: {_text(d, 'error')}"
    return (
        f"{d.get('bytes', '?')} bytes ({_text(d, 'type')}) from the {_text(d, 'source')} "
        f"in {d.get('seconds', '?')} s"
    )


def _looked_up(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if d.get("error"):
        return f"could not be answered: {_text(d, 'error')}"
    if d.get("adopted"):
        return f"adopted {_text(d, 'adopted')}: {_text(d, 'why')}"
    refused = "; ".join(outside_text(r, 80) for r in d.get("refused") or [])
    return "nothing of ours found" + (f" (not ours: {refused})" if refused else "")


def _upload_answered(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if not d.get("error"):
        return f"HTTP {d.get('status', '?')}, key {_text(d, 'key')}"
    status = f"HTTP {d['status']}: " if d.get("status") else ""
    hosted = ", may be stored" if d.get("may_be_hosted") else ""
    return f"failed: {status}{_text(d, 'error')}{hosted}"


def _waited(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"{_text(d, 'why') or '?'} until {_at(d.get('until') or d.get('next_run_at'), now)}"
    if d.get("given_back"):
        words += ", attempt given back"
    if d.get("error"):
        words += f": {_text(d, 'error')}"
    if d.get("visibility_refused"):
        words += " (SQS refused to hold its message)"
    return words


def _archived(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = _text(d, "url")
    if d.get("adopted"):
        words += ", adopted (an earlier attempt had stored it)"
    if d.get("altered"):
        words += ", stored altered (re-encoded or watermarked)"
    if d.get("recorded") is False:
        words += "; not recorded: the row was already archived"
    if d.get("original"):
        words += f"; original kept: {_text(d, 'original')}"
    elif d.get("original_missing"):
        words += f"; no original kept ({_text(d, 'original_missing')})"
    return words


def _lane_paused(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    window = f", window {_text(d, 'window')}" if d.get("window") else ""
    return f"{_text(d, 'reason')}{window} until {_text(d, 'until')}: {_text(d, 'detail')}"


def _retried(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    cls = f"{_text(d, 'error_class')}: " if d.get("error_class") else ""
    return f"{cls}{_text(d, 'error')}; next run {_at(d.get('next_run_at'), now)}"


def _slot(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    answer = _text(d, "answer")
    return f"{answer} for {_at(d.get('at'), now)}" if d.get("at") else answer


def _event(d: dict[str, Any]) -> str:
    """A completion event: its detail-type and eventId."""
    return f"{_text(d, 'detail_type') or 'event'} {_text(d, 'event_id')}"


def _publication(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    if event.kind == "published":
        return f"{_event(d)} on EventBridge, by the {_text(d, 'published_by') or '?'}"
    if event.kind == "event_dropped":
        return f"{_event(d)} after {d.get('tries', '?')} tries: {_text(d, 'dropped_because')}"
    tries = d.get("tries") or 0
    last = f"; last: {_text(d, 'last_error')}" if d.get("last_error") else ""
    return f"{_event(d)} not published yet ({tries} failed tries{last})"


def _by(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    return f"by {_text(d, 'by') or '?'}" + (f": {_text(d, 'why')}" if d.get("why") else "")


def _audited(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"{_text(d, 'verdict') or '?'}"
    if d.get("was"):
        words += f" (was {_text(d, 'was')})"
    if d.get("why"):
        words += f": {_text(d, 'why')}"
    if d.get("repair"):
        words += f"; {_text(d, 'repair')}"
    if d.get("hosted_key"):
        words += f"; the host's key {_text(d, 'hosted_key')}"
    return words


def _restored(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    old = f"{_text(d, 'old_url')} (key {_text(d, 'old_key') or '?'})"
    new = f"{_text(d, 'new_url')} (key {_text(d, 'new_key') or '?'})"
    return f"{old} replaced by {new}; the old copy stays on the host for an operator to delete"


_WORDS: dict[str, Callable[[dict[str, Any], StoredEvent, datetime], str]] = {
    "enqueued": _enqueued,
    "received": _received,
    "claimed": lambda d, e, now: (
        f"attempt {e.attempt} by {_text(d, 'owner')}"
        + (", from its staged copy" if d.get("staged") else "")
    ),
    "lock_taken_over": lambda d, e, now: (
        f"from {_text(d, 'owner') or '?'} (locked "
        f"{_at(d.get('locked_at'), now)}) by {_text(d, 'by')}"
    ),
    "lock_lost": lambda d, e, now: (
        f"its {_text(d, 'write')} was not recorded: the lock had passed on"
    ),
    "fetched": _fetched,
    "staged": lambda d, e, now: (
        f"{_text(d, 'key')} ({d.get('bytes', '?')} bytes): {_text(d, 'why')}"
    ),
    "slot": _slot,
    "lane_paused": _lane_paused,
    "looked_up": _looked_up,
    "upload_answered": _upload_answered,
    "held": _waited,
    "parked": _waited,
    "unparked": lambda d, e, now: f"by {_text(d, 'by')}, due {_at(d.get('due_at'), now)}",
    "retried": _retried,
    "failed": lambda d, e, now: f"by {_text(d, 'by') or '?'}: {_text(d, 'error')}",
    "archived": _archived,
    "unsent": lambda d, e, now: (
        f"its message did not go out ({_text(d, 'error') or 'refused'}); by {_text(d, 'by')}"
    ),
    "dequeued": _by,
    "dated": _by,
    "audited": _audited,
    "original_kept": lambda d, e, now: (
        f"{_text(d, 'key')} ({d.get('bytes', '?')} bytes) from"
        f" {ORIGINAL_SOURCES.get(str(d.get('source')), _text(d, 'source'))},"
        f" by {_text(d, 'by') or '?'}"
    ),
    "restored": _restored,
    "lost_on_host": lambda d, e, now: (
        f"{_text(d, 'verdict')}, with no original and no source to restore it from"
        + (f" ({_text(d, 'provider')})" if d.get("provider") else "")
    ),
    # A completion event's fate (lib.state.stories): no rows of their own.
    "published": _publication,
    "event_dropped": _publication,
    "publishing": _publication,
}


def describe(event: StoredEvent, now: datetime) -> str:
    """An event's detail in a few words (any detail, an older release's too: a kind this
    release does not know is shown as its fields)."""
    words = _WORDS.get(event.kind)
    if words is None:
        fields = ", ".join(f"{key}={value}" for key, value in event.detail.items())
        return outside_text(fields, TEXT_LIMIT)
    return words(event.detail, event, now)
