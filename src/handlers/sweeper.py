"""SweeperFunction: on the EventBridge schedule, re-send what was lost and fail what is spent.

The event's content is not used: every run looks at the database afresh. Returns
the run's summary (also logged, and emitted as metrics).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from lib.archive.runtime import sweeper
from lib.platform.observability import logger, metrics, traced


@traced
@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    summary = sweeper().run(remaining_ms=context.get_remaining_time_in_millis)
    return summary.as_dict()
