"""`archive-ctl show --logs`: the CloudWatch Logs Insights query that finds one record's log
lines in both functions' log groups, and running it when AWS credentials are present."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from lib.platform.aws import error_code
from lib.platform.redact import outside_text

# template.yaml names the functions' log groups after the stack (ArchiveLogGroup,
# SweeperLogGroup: /aws/lambda/${AWS::StackName}-archive and -sweeper).
LOG_GROUPS = (
    "/aws/lambda/{stack}-archive",
    "/aws/lambda/{stack}-sweeper",
    "/aws/lambda/{stack}-auditor",
)
DEFAULT_STACK = "image-archive"  # samconfig.toml's stack_name
RESULT_LIMIT = 200
# How long a query may run before `show` stops waiting for it (Insights runs up to 60 min).
QUERY_WAIT_SECONDS = 60.0
POLL_SECONDS = 1.0
# The query starts this long before the record's first known time.
MARGIN = timedelta(minutes=5)
_DONE = frozenset({"Complete", "Failed", "Cancelled", "Timeout", "Unknown"})


def log_groups(stack: str) -> list[str]:
    return [pattern.format(stack=stack) for pattern in LOG_GROUPS]


def query_for(record_id: int) -> str:
    """Every line about the record: the archive function's carry `record_id` (a string),
    the sweeper's name it in `record_ids` (a list of strings, bounded)."""
    return (
        "fields @timestamp, @log, level, message, outcome, attempt, step, error, @message\n"
        f'| filter record_id = "{record_id}"'
        f' or @message like /"record_ids":\\s*\\[[^\\]]*"{record_id}"/\n'
        "| sort @timestamp asc\n"
        f"| limit {RESULT_LIMIT}"
    )


@dataclass
class LogsReport:
    query: str
    log_groups: list[str]
    start: datetime
    end: datetime
    ran: bool = False
    why_not: str | None = None  # why the query was not run (or did not finish)
    results: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "log_groups": self.log_groups,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "ran": self.ran,
            "why_not": self.why_not,
            "results": self.results,
        }


def credentials_missing() -> str | None:
    """Why no AWS call can be made (no credentials found), or None when one can."""
    import boto3  # noqa: PLC0415 - only `show --logs` needs it

    if boto3.Session().get_credentials() is None:
        return (
            "no AWS credentials (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY), so the query was not run; paste it into CloudWatch "
            "Logs Insights"
        )
    return None


def run_query(
    report: LogsReport,
    client: Any,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run the report's query over its log groups; the rows (field -> value) go into the
    report, or why they could not be had."""
    try:
        query_id = client.start_query(
            logGroupNames=report.log_groups,
            startTime=int(report.start.timestamp()),
            endTime=int(report.end.timestamp()) + 1,
            queryString=report.query,
            limit=RESULT_LIMIT,
        )["queryId"]
    except Exception as error:  # noqa: BLE001 - said in the report, `show` goes on
        code = error_code(error)
        if code == "ResourceNotFoundException":
            report.why_not = "a log group is not there: is --stack the stack's name?"
        else:
            report.why_not = f"the query could not start: {code or type(error).__name__}"
        return
    report.ran = True
    deadline = clock() + QUERY_WAIT_SECONDS
    while True:
        answer = client.get_query_results(queryId=query_id)
        status = str(answer.get("status", "Unknown"))
        if status in _DONE:
            break
        if clock() >= deadline:
            report.why_not = f"the query had not finished after {QUERY_WAIT_SECONDS:.0f} s"
            return
        sleep(POLL_SECONDS)
    if status != "Complete":
        report.why_not = f"the query ended {status}"
    report.results = [
        {str(cell["field"]): str(cell.get("value", "")) for cell in row}
        for row in answer.get("results", [])
    ]


def result_line(row: dict[str, str]) -> str:
    """One result as a line: when, which function, and the message with its outcome."""
    group = row.get("@log", "")
    function = group.rsplit("-", 1)[-1] if group else "-"
    if "message" in row:
        words = [row.get("level", ""), row["message"]]
        words += [f"{k}={row[k]}" for k in ("outcome", "attempt", "step", "error") if row.get(k)]
        text = " ".join(word for word in words if word)
    else:
        text = row.get("@message", "")
    return f"  {row.get('@timestamp', '-')}  {function:<8} {outside_text(text, 300)}"
