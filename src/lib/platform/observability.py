"""One Powertools logger and metrics object shared by every module.

Tracing is opt-in: the X-Ray SDK costs about 0.45 s of cold start (it imports
botocore), so the Tracer is only built when POWERTOOLS_TRACE_DISABLED is false.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any, TypeVar, cast

from aws_lambda_powertools import Logger, Metrics

from lib.platform import config

SERVICE = config.service_name()
NAMESPACE = config.metrics_namespace()

logger = Logger(service=SERVICE)
metrics = Metrics(service=SERVICE, namespace=NAMESPACE)

Handler = TypeVar("Handler", bound=Callable[..., Any])


def debug_enabled() -> bool:
    """Whether debug logs are written (`archive-ctl -v`, POWERTOOLS_LOG_LEVEL=DEBUG): what
    a debug line costs to build is spent only then."""
    return logging.getLogger(logger.name).isEnabledFor(logging.DEBUG)


def log_unexpected(message: str, exception: BaseException, /, **fields: Any) -> None:
    """Log a bug with its stack but without exception messages, which may quote values
    (a header with the token, a parameter); the type and the frames locate it. `fields`
    are descriptions the caller made safe (lib.archive.faults)."""
    logger.error(
        message,
        error_type=type(exception).__name__,
        stack="".join(traceback.format_tb(exception.__traceback__)),
        **fields,
    )


def traced(handler: Handler) -> Handler:
    """Wrap a Lambda handler with the Powertools Tracer when tracing is enabled."""
    if not config.tracing_enabled():
        return handler
    from aws_lambda_powertools import Tracer  # noqa: PLC0415 - deferred, see the docstring

    return cast(Handler, Tracer(service=SERVICE).capture_lambda_handler(handler))
