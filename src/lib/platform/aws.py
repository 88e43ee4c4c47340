"""boto3 clients with short, explicit timeouts (boto3 is imported on first use: it is the
largest import of the package, and the happy path of an archive never needs it)."""

from __future__ import annotations

from typing import Any


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


def error_code(error: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (NoSuchKey, ReceiptHandleIsInvalid...),
    None for any other error."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None
