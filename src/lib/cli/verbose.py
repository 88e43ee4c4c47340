"""`archive-ctl -v`: a debug line for each AWS call the command makes (lib.state.queries
writes one for each statement): the operation, its HTTP status, retries and time, never its
parameters, headers or body (a message, a signature), which botocore's own debug logs
would carry, so those stay off."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lib.platform.observability import logger


@contextmanager
def aws_calls_logged() -> Iterator[None]:
    """Every client made meanwhile (boto3's default session: lib.platform.aws) logs its
    calls; the session is as it was afterwards."""
    import boto3  # noqa: PLC0415 - only with -v: the largest import of the package

    # The session boto3.client makes its clients from, made now if none was yet.
    events = boto3._get_default_session().events
    handlers: dict[str, Callable[..., None]] = {
        "before-call": _started,
        "after-call": _ended,
        "after-call-error": _failed,
    }
    for event, handler in handlers.items():
        events.register(event, handler, unique_id=f"archive-ctl-verbose-{event}")
    try:
        yield
    finally:
        for event, handler in handlers.items():
            events.unregister(event, handler, unique_id=f"archive-ctl-verbose-{event}")


def _started(context: dict[str, Any], **_: Any) -> None:
    context["verbose_started"] = time.perf_counter()


def _ms(context: dict[str, Any]) -> float | None:
    started = context.get("verbose_started")
    return None if started is None else round((time.perf_counter() - started) * 1000, 1)


def _operation(model: Any) -> str:
    return f"{model.service_model.service_name}.{model.name}"


def _ended(model: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    meta = parsed.get("ResponseMetadata", {})
    logger.debug(
        "AWS call",
        operation=_operation(model),
        http_status=meta.get("HTTPStatusCode"),
        retries=meta.get("RetryAttempts"),
        error=parsed.get("Error", {}).get("Code"),
        ms=_ms(context),
    )


def _failed(model: Any, exception: Exception, context: dict[str, Any], **_: Any) -> None:
    logger.debug(
        "AWS call failed",
        operation=_operation(model),
        error=type(exception).__name__,
        ms=_ms(context),
    )
