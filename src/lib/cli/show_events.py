"""A record's events in words (`archive-ctl show`): one function a kind, any detail an
older or later release wrote included (a kind it does not know is shown as its fields)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from lib.cli.progress import duration
from lib.cli.show_wait import when
from lib.platform.redact import outside_text
from lib.state.stories import StoredEvent

TEXT_LIMIT = 160  # a line's outside text (an error, a host's answer) at most


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
        words += f", was {_text(d, 'was')} after {d.get('attempts', '?')} attempts"
    if d.get("message_id"):
        words += f", message {_text(d, 'message_id')}"
    return words


def _received(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    words = f"message {_text(d, 'message_id') or '?'}, receive {d.get('receive_count', '?')}"
    if d.get("claimed") is not False:
        return words
    why = [f"archive {d.get('archive_status') or 'never queued'}"]
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


def _by(d: dict[str, Any], event: StoredEvent, now: datetime) -> str:
    return f"by {_text(d, 'by') or '?'}" + (f": {_text(d, 'why')}" if d.get("why") else "")


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
}


def describe(event: StoredEvent, now: datetime) -> str:
    """An event's detail in a few words (any detail, an older release's too: a kind this
    release does not know is shown as its fields)."""
    words = _WORDS.get(event.kind)
    if words is None:
        fields = ", ".join(f"{key}={value}" for key, value in event.detail.items())
        return outside_text(fields, TEXT_LIMIT)
    return words(event.detail, event, now)
