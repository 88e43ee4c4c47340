"""The pure decisions: error class, retry delay, next state."""

from __future__ import annotations

import pytest

from lib.archive import retry as policy
from lib.archive.retry import Action, ErrorClass
from lib.platform.sqs import MAX_VISIBILITY_SECONDS
from lib.transfer.failures import Failure, Kind, Stage

D, U = Stage.DOWNLOAD, Stage.UPLOAD
P, T = ErrorClass.PERMANENT, ErrorClass.TRANSIENT


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (Failure(D, Kind.REFUSED_URL, "scheme 'file' refused"), P),
        (Failure(D, Kind.NOT_IMAGE, "html"), P),
        (Failure(D, Kind.TOO_LARGE, "too big"), P),
        (Failure(D, Kind.HTTP_STATUS, "gone", status=404), P),
        (Failure(D, Kind.HTTP_STATUS, "gone", status=410), P),
        (Failure(D, Kind.HTTP_STATUS, "expired signature", status=403), P),
        (Failure(D, Kind.HTTP_STATUS, "busy", status=429), T),
        (Failure(D, Kind.HTTP_STATUS, "timeout", status=408), T),
        (Failure(D, Kind.HTTP_STATUS, "oops", status=500), T),
        (Failure(D, Kind.HTTP_STATUS, "bad gateway", status=502), T),
        (Failure(D, Kind.TIMEOUT, "slow"), T),
        (Failure(D, Kind.CONNECTION, "reset"), T),
        (Failure(D, Kind.NO_SUCH_HOST, "host nonexistent.invalid does not exist (DNS)"), P),
        (Failure(D, Kind.REFUSED_URL, "address 169.254.169.254 refused: link-local"), P),
        (Failure(D, Kind.REFUSED_URL, "URL carries userinfo (credentials) before the host"), P),
        (Failure(D, Kind.REFUSED_URL, "more than 3 redirects"), P),
        (Failure(D, Kind.NOT_IMAGE, "upstream sent a gzip-encoded body"), P),
        (Failure(D, Kind.TOO_LARGE, "image is 60000000 bytes, over the limit"), P),
        (Failure(D, Kind.HTTP_STATUS, "bad request", status=400), P),
        (Failure(D, Kind.HTTP_STATUS, "unauthorized", status=401), P),
        (Failure(D, Kind.HTTP_STATUS, "legal", status=451), P),
        (Failure(D, Kind.HTTP_STATUS, "redirect without Location", status=302), T),
        (Failure(D, Kind.HTTP_STATUS, "unavailable", status=503), T),
        (Failure(D, Kind.HTTP_STATUS, "gateway timeout", status=504), T),
        (Failure(D, Kind.TIMEOUT, "ran past the attempt's deadline"), T),
        (Failure(D, Kind.CONNECTION, "body was 10 bytes, Content-Length said 20"), T),
        (Failure(D, Kind.CONNECTION, "could not resolve cdn.example.com"), T),
        (Failure(D, Kind.CONNECTION, "could not fetch (SSLError)"), T),
        (Failure(U, Kind.HTTP_STATUS, "Authentication failed.", status=401), P),
        (Failure(U, Kind.HTTP_STATUS, "API disabled", status=403), P),
        (Failure(U, Kind.HTTP_STATUS, "nginx 413", status=413), P),
        (Failure(U, Kind.HTTP_STATUS, "unprocessable", status=422), P),
        (Failure(U, Kind.HTTP_STATUS, "CSRF token mismatch.", status=419), P),
        (Failure(U, Kind.HTTP_STATUS, "route not found (wrong LSKY_BASE_URL)", status=404), P),
        (Failure(U, Kind.HTTP_STATUS, "method not allowed", status=405), P),
        (Failure(U, Kind.HTTP_STATUS, "Lsky redirected to /login", status=401), P),
        (Failure(U, Kind.HTTP_STATUS, "bad gateway", status=502), T),
        (Failure(U, Kind.HTTP_STATUS, "gateway timeout", status=504), T),
        (Failure(U, Kind.HTTP_STATUS, "Lsky redirected (HTTP 307)", status=307), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: Too Many Attempts."), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: no message"), T),
        (Failure(U, Kind.HTTP_STATUS, "Too Many Attempts.", status=429), T),
        (Failure(U, Kind.HTTP_STATUS, "Server Error", status=500), T),
        (Failure(U, Kind.HTTP_STATUS, "unavailable", status=503), T),
        (Failure(U, Kind.BAD_RESPONSE, "non-JSON", status=200), T),
        (Failure(U, Kind.TIMEOUT, "slow"), T),
        (Failure(U, Kind.CONNECTION, "refused"), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 不支持的文件类型"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片大小超出限制"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 选定的策略不存在"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 储存空间不足"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 管理员关闭了游客上传"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 账户未验证"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 账号状态异常"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片涉嫌违规"), P),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 每分钟内你最多可以上传 20 张图片"), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片上传失败"), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 图片记录保存失败"), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: 服务异常，请稍后再试"), T),
        (Failure(U, Kind.REJECTED, "Lsky refused the upload: something new"), T),
    ],
)
def test_classify(failure: Failure, expected: ErrorClass) -> None:
    assert policy.classify(failure) is expected


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_has_a_class(stage: Stage, kind: Kind) -> None:
    # classify is the one place: no kind may fall through it, at either stage.
    assert policy.classify(Failure(stage, kind, "x", status=500)) in ErrorClass


@pytest.mark.parametrize(
    ("attempt", "delays", "expected"),
    [
        (1, (30, 120, 600), 30),
        (2, (30, 120, 600), 120),
        (3, (30, 120, 600), 600),
        (7, (30, 120, 600), 600),  # the last delay repeats
        (1, (5,), 5),
        (0, (30, 120), 30),  # defensive: never index before the table
    ],
)
def test_retry_delay(attempt: int, delays: tuple[int, ...], expected: int) -> None:
    assert policy.retry_delay(attempt, delays) == expected


TRANSIENT = Failure(U, Kind.HTTP_STATUS, "Server Error", status=500)
PERMANENT = Failure(U, Kind.HTTP_STATUS, "Authentication failed.", status=401)


def test_transient_with_attempts_left_retries_after_that_attempts_delay() -> None:
    decision = policy.decide(TRANSIENT, attempt=2, max_attempts=3, delays=(30, 120, 600))
    assert decision.action is Action.RETRY
    assert decision.delay_seconds == 120


def test_last_attempt_fails_even_when_transient() -> None:
    decision = policy.decide(TRANSIENT, attempt=3, max_attempts=3, delays=(30, 120, 600))
    assert decision.action is Action.FAIL
    assert decision.error_class is ErrorClass.TRANSIENT


def test_permanent_fails_on_the_first_attempt() -> None:
    decision = policy.decide(PERMANENT, attempt=1, max_attempts=3, delays=(30, 120, 600))
    assert decision.action is Action.FAIL


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [
        (None, 30),
        (10.0, 30),  # shorter than the schedule: the schedule wins
        (90.0, 90),
        (90.2, 91),  # rounded up, never early
        (100_000.0, 43_200),  # capped at SQS's 12 hours
    ],
)
def test_retry_after_longer_than_the_schedule_is_honoured(
    retry_after: float | None, expected: int
) -> None:
    failure = Failure(
        U, Kind.HTTP_STATUS, "Too Many Attempts.", status=429, retry_after=retry_after
    )
    decision = policy.decide(failure, attempt=1, max_attempts=3, delays=(30, 120, 600))
    assert decision.delay_seconds == expected


def test_error_summary_is_readable() -> None:
    text = policy.error_summary(TRANSIENT, attempt=2, max_attempts=3)
    assert text == "upload failed (HTTP 500): Server Error [attempt 2/3]"


def test_redelivery_waits_for_the_lock_to_expire() -> None:
    assert policy.redelivery_delay(180) > 180
    assert policy.redelivery_delay(10**6) == MAX_VISIBILITY_SECONDS
