"""AuditFunction: on the EventBridge schedule, check archived images' hosted copies in
rotation and repair what is missing or altered (docs/explanation/audit-and-repair.md).

The event's content is not used. Returns the run's summary (also logged, and emitted
as metrics).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from lib.audit.runtime import auditor
from lib.platform.observability import logger, metrics, traced


@traced
@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    summary = auditor().run(context.get_remaining_time_in_millis)
    return summary.as_dict()
