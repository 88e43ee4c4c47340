"""Every Lsky answer of DESIGN.md's v1 contract, through the handler: the row's end state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from devkit import images
from devkit._http import BackgroundServer, QuietHandler
from devkit.lsky import Behaviour
from lib.transfer.lsky import LskyClient
from tests.integration.conftest import quick_invoke
from tests.support import HANG_SECONDS, fetch_record, lane_row, reset_lane, seed_record

PNG = images.png(8, 8)
RECORD = 950

P = "FAILED"  # permanent: failed on the first attempt
T = "PENDING"  # transient: scheduled for a retry
H = "HOST"  # the host account's condition: the lane pauses, the record pays nothing

STATUS_FALSE = {
    "不支持的文件类型": P,  # type
    "图片大小超出限制": P,  # size
    "选定的策略不存在": P,  # strategy
    "储存空间不足": H,  # quota
    "管理员关闭了游客上传": H,  # guest uploads off: the token was not applied
    "账户未验证": H,  # account not verified
    "账号状态异常": H,  # account suspended
    "图片涉嫌违规": P,  # moderation
    "每分钟内你最多可以上传 20 张图片": H,  # upload-count window
    "图片上传失败": T,  # storage write failed
    "图片记录保存失败": T,  # database write failed
    "服务异常，请稍后再试": T,  # the catch-all, Lsky's exact text
    "一个新的错误": T,  # unknown text: bounded retries, never an irreversible guess
}

SCRIPTED: dict[str, tuple[Behaviour, str, str]] = {
    "http-401": (Behaviour.unauthorized(), H, "HTTP 401: Authentication failed."),
    "http-403": (Behaviour.forbidden(), H, "HTTP 403: 管理员未启用 API"),
    "http-413-nginx-html": (Behaviour.too_large(), P, "HTTP 413"),
    "http-429": (Behaviour.rate_limited(retry_after=90), H, "HTTP 429: Too Many Attempts."),
    "http-500": (Behaviour.server_error(), T, "HTTP 500: Server Error"),
    "html-200": (Behaviour.html_200(), T, "non-JSON"),
    "drop-half-answer": (Behaviour.drop(), T, "dropped the response"),
    "drop-no-answer": (Behaviour.drop(partial=False), T, "upload failed"),
    **{
        f"status-false-{message}": (Behaviour.status_false(message), outcome, message)
        for message, outcome in STATUS_FALSE.items()
    },
}


@pytest.fixture
def db(quick_conn: Any) -> Any:
    quick_conn.run("DELETE FROM image_generation_records WHERE id = :id", id=RECORD)
    reset_lane(quick_conn)
    return quick_conn


@pytest.mark.parametrize(("behaviour", "outcome", "fragment"), SCRIPTED.values(), ids=SCRIPTED)
def test_scripted_lsky_answer(
    quick_env: Callable[..., None],
    db: Any,
    upstream: Any,
    lsky: Any,
    behaviour: Behaviour,
    outcome: str,
    fragment: str,
) -> None:
    quick_env()
    seed_record(db, RECORD, image_url=upstream.add("/c.png", PNG))
    lsky.script(behaviour)

    before = time.time()
    response = quick_invoke(RECORD)

    row = fetch_record(db, RECORD)
    assert fragment in row["archive_error"]
    if outcome == H:
        # No attempt spent, the record not failed; the whole lane waits instead.
        assert row["archive_status"] == "PENDING", row["archive_error"]
        assert row["archive_attempts"] == 0
        assert row["archive_error"].startswith("lane paused")
        lane = lane_row(db)
        assert lane["paused_until"] is not None
        assert lane["reason"] in ("rate_limit", "account")
        if behaviour.retry_after != 60:  # the 429 case: Retry-After sets the pause
            assert row["archive_next_run_at"].timestamp() - before >= 89
        return
    assert row["archive_status"] == outcome, row["archive_error"]
    assert row["archive_attempts"] == 1
    assert row["archive_error"].startswith("upload failed")
    assert len(response["batchItemFailures"]) == (1 if outcome == T else 0)
    if outcome == T:
        assert row["archive_next_run_at"].timestamp() - before == pytest.approx(30, abs=3)


@pytest.mark.parametrize(
    ("config", "env", "fragment"),
    [
        ({"max_file_kb": 0.1}, {}, "图片大小超出限制"),
        ({"accepted_suffixes": frozenset({"jpg"})}, {}, "不支持的文件类型"),
        ({}, {"LSKY_STRATEGY_ID": "99"}, "选定的策略不存在"),
    ],
    ids=["group-size-limit", "suffix-not-accepted", "unknown-strategy"],
)
def test_lsky_validation_failures_are_permanent(
    quick_env: Callable[..., None],
    db: Any,
    upstream: Any,
    lsky: Any,
    config: dict[str, Any],
    env: dict[str, str],
    fragment: str,
) -> None:
    quick_env(**env)
    lsky.config = replace(lsky.config, **config)
    seed_record(db, RECORD, image_url=upstream.add("/v.png", PNG))

    assert quick_invoke(RECORD) == {"batchItemFailures": []}
    row = fetch_record(db, RECORD)
    assert row["archive_status"] == "FAILED"
    assert fragment in row["archive_error"]


def test_a_revoked_token_is_refetched_once_then_pauses_the_lane(
    quick_env: Callable[..., None], db: Any, upstream: Any, lsky: Any
) -> None:
    quick_env()
    seed_record(db, RECORD, image_url=upstream.add("/t.png", PNG))
    lsky.script(Behaviour.unauthorized())
    quick_invoke(RECORD)
    # A plain LSKY_TOKEN cannot be refetched: one request, no silent guest upload.
    assert [u.authorization for u in lsky.uploads] == [f"Bearer {lsky.token}"]
    row = fetch_record(db, RECORD)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert lane_row(db)["reason"] == "account"


class _NestedAnswers(QuietHandler):
    """Every GET answered 200 with a JSON array nested 200,000 deep (200 KB, within the
    answer's bound): json.loads raises RecursionError for it, not ValueError."""

    def do_GET(self) -> None:
        body = b"[" * 200_000
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class NestedAnswers(BackgroundServer):
    handler_class = _NestedAnswers


def test_a_profile_nested_past_the_parser_s_depth_is_an_unhealthy_account() -> None:
    """The sweeper's probe of a paused lane: such an answer keeps the pause, it does not
    end the sweep with an error no rule expects."""
    with NestedAnswers() as lsky:
        client = LskyClient(base_url=lsky.base_url, token=lambda force: "1|abcdef")
        assert client.account_healthy(time.monotonic() + HANG_SECONDS) is False
