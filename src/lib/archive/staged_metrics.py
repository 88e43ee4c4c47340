"""The staged copies as metrics: one indexed statement, for a periodic caller (the sweeper).

StagedOldestAgeSeconds feeds the StagedCopiesAgeAlarm of template.yaml; StagedWaiting and
StagedFailedKeepingCopy show the rest of `archive-ctl status`'s staged line.
"""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit

from lib.platform.observability import metrics
from lib.state.records import ArchiveRecords, StagedSummary


def report_staged(records: ArchiveRecords) -> StagedSummary:
    """Read the staged copies and add their metrics (0 when staging is off)."""
    summary = records.staged_summary()
    metrics.add_metric(
        name="StagedOldestAgeSeconds", unit=MetricUnit.Seconds, value=summary.oldest_age_seconds
    )
    metrics.add_metric(name="StagedWaiting", unit=MetricUnit.Count, value=summary.waiting)
    metrics.add_metric(
        name="StagedFailedKeepingCopy",
        unit=MetricUnit.Count,
        value=summary.failed_keeping_copy,
    )
    return summary
