"""boto3 clients with short, explicit timeouts (boto3 is imported on first use: it is the
largest import of the package, and the happy path of an archive never needs it)."""

from __future__ import annotations

from typing import Any

from lib.platform.watchdog import DeadlinePassed, active, watched_pool


def client(
    service: str, *, connect_timeout: float, read_timeout: float, max_attempts: int, **config: Any
) -> Any:
    """A client whose every call ends within about max_attempts x the timeouts.

    max_attempts counts every call, the first included (botocore's total_max_attempts: its
    own max_attempts counts the retries only, so 1 there would still make two calls)."""
    import boto3  # noqa: PLC0415 - deferred, see the docstring
    from botocore.config import Config  # noqa: PLC0415

    settings = Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        **config,
    )
    # boto3's stubs type each service by its literal name; the callers name theirs.
    return boto3.client(service, config=settings)  # type: ignore[call-overload]


def s3_client(connect_timeout: float, read_timeout: float, max_attempts: int, **config: Any) -> Any:
    """An S3 client (the regional endpoint, or AWS_ENDPOINT_URL_S3, which boto3 reads: a
    local S3) whose calls end by their deadlines (hold_to_deadlines)."""
    s3 = client(
        "s3",
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_attempts=max_attempts,
        # botocore's default checksum reads each part once more into memory; TLS
        # already guards the bytes in transit.
        request_checksum_calculation="when_required",
        **config,
    )
    hold_to_deadlines(s3, "s3")
    return s3


def error_code(error: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (NoSuchKey, ReceiptHandleIsInvalid...),
    None for any other error."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def describe(error: Exception) -> str:
    """The error's type and AWS's code (AccessDenied, SlowDown...): never a message, which
    may quote a signed URL or a header."""
    code = error_code(error)
    return f"{type(error).__name__}: {code}" if code else type(error).__name__


def hold_to_deadlines(client: Any, service: str) -> None:
    """Make the client's connections report to lib.platform.watchdog, and stop botocore's
    retries once a deadline has fired (a retry would wait out its backoff for nothing).

    botocore offers no public way to choose its connection classes: the session's pool
    classes are set where botocore itself sets them (tests/integration/test_deadlines.py
    fails if a botocore upgrade moves them)."""
    from botocore.awsrequest import (  # noqa: PLC0415 - boto3 is loaded on first use
        AWSHTTPConnectionPool,
        AWSHTTPSConnectionPool,
    )

    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    pools = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(pools, dict):
        raise TypeError("botocore's HTTP session has no pool classes to watch")
    # The same dict the session's pool managers were given: updated in place for them.
    pools.update(
        http=watched_pool(AWSHTTPConnectionPool), https=watched_pool(AWSHTTPSConnectionPool)
    )
    client.meta.events.register_first(f"needs-retry.{service}", _no_retry_past_deadline)


def _no_retry_past_deadline(response: Any = None, caught_exception: Any = None, **_: Any) -> None:
    watchdog = active()
    if watchdog is None:
        return
    if watchdog.fired:
        raise DeadlinePassed("an AWS call ran past its deadline (or was given up)")
    if watchdog.no_retry and _retried(response, caught_exception):
        raise DeadlinePassed("an AWS call may not be sent again (its body's source is gone)")


# The 4xx answers botocore's retry handlers send again (all 5xx are).
_RETRIED_4XX = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "SlowDown",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "PriorRequestNotComplete",
    }
)


def _retried(response: Any, caught_exception: Any) -> bool:
    """Whether botocore could send the request again after this answer (or error)."""
    if caught_exception is not None or not isinstance(response, tuple) or len(response) < 2:
        return True
    status = int(getattr(response[0], "status_code", 500))
    if status < 400:
        return False
    parsed = response[1] if isinstance(response[1], dict) else {}
    error = parsed.get("Error")
    code = error.get("Code") if isinstance(error, dict) else None
    return status >= 500 or status == 429 or code in _RETRIED_4XX
