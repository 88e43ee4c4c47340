"""The story's pure parts: what an event's detail may keep (redacted, bounded), and the
attempt's in-memory log with the database's clock."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.state.events import (
    DETAIL_LIMIT,
    FIELD_LIMIT,
    Actor,
    EventKind,
    EventLog,
    bounded_detail,
    detail_param,
    events_param,
)
from tests.support import model_examples

SIGNATURE = "sig-5ecret-Yw7Rt2Np"
TOKEN = "42|tok-5ecret-Zq8Hx1Lm"
SIGNED = f"https://cdn.example.com/a.png?X-Amz-Credential=AKIA0&X-Amz-Signature={SIGNATURE}"


def test_a_signed_url_and_a_token_in_an_error_never_reach_a_detail() -> None:
    detail = bounded_detail(
        {
            "error": f"upstream answered HTTP 403 for {SIGNED}",
            "refused": [f"Bearer {TOKEN} was refused", {"url": SIGNED}],
            "nested": {"echo": f"token={TOKEN}"},
        }
    )

    text = json.dumps(detail)
    assert SIGNATURE not in text
    assert "tok-5ecret" not in text
    assert (
        detail["error"] == "upstream answered HTTP 403 for https://cdn.example.com/a.png?[redacted]"
    )
    assert detail["refused"][0] == "Bearer [redacted] was refused"


def test_a_detail_is_bounded_field_by_field_then_as_a_whole() -> None:
    long = "x" * 5_000
    kept = bounded_detail({"error": long, "items": list(range(50)), "n": float("inf")})
    assert len(kept["error"]) == FIELD_LIMIT
    assert kept["items"] == [0, 1, 2, 3, 4]
    assert kept["n"] is None  # not a JSON number

    many = bounded_detail({f"field{i}": "y" * 200 for i in range(20)})
    assert len(json.dumps(many)) <= DETAIL_LIMIT
    assert many["truncated"] is True


@pytest.mark.model
@settings(max_examples=model_examples(60))
@given(
    st.dictionaries(
        st.text(max_size=50),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=400),
            lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(), inner),
            max_leaves=12,
        ),
        max_size=25,
    )
)
def test_any_detail_fits_its_bound_and_is_json(detail: dict[str, object]) -> None:
    kept = bounded_detail(detail)
    assert len(json.dumps(kept, ensure_ascii=False)) <= DETAIL_LIMIT
    json.loads(json.dumps(kept))


def test_the_log_dates_its_events_by_the_database_s_clock() -> None:
    log = EventLog()
    log.note(EventKind.FETCHED, bytes=1)  # before the claim: the statement's own time
    db_now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    log.start(db_now)
    time.sleep(0.01)
    log.note(EventKind.UPLOAD_ANSWERED, status=200, key=None)

    first, second = log.pending()
    assert first.at is None
    assert second.at is not None
    assert db_now + timedelta(seconds=0.01) <= second.at < db_now + timedelta(seconds=5)
    assert "key" not in second.detail  # a field given as None is left out
    [as_param] = json.loads(events_param(log.pending()[1:]))
    assert as_param == {
        "kind": "upload_answered",
        "at": second.at.isoformat(),
        "detail": {"status": 200},
    }
    log.written()
    assert log.pending() == ()


def test_a_statement_s_detail_is_bounded_too() -> None:
    assert json.loads(detail_param(by=Actor.SWEEPER, error=f"see {SIGNED}")) == {
        "by": "sweeper",
        "error": "see https://cdn.example.com/a.png?[redacted]",
    }
