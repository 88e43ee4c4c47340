"""`archive-ctl redrive-dlq`: chooses between a move task, waiting for one, a dry run and
the manual move, and prints progress; the SQS calls themselves are in lib.cli.dlq."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from lib.archive.message import MalformedMessage, parse_record_id
from lib.archive.sweep_rules import named_ids
from lib.cli import dlq
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, PROG, CommandError, Context, out
from lib.state.status import ArchiveStatus

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageTypeDef


def _records_of(messages: Sequence[MessageTypeDef]) -> list[tuple[int, str]]:
    """(record id, message id) of the messages whose body names a record (a malformed one
    goes back as it came, and the archive function sends it to the DLQ again)."""
    named = []
    for message in messages:
        try:
            named.append((parse_record_id(message["Body"]), message["MessageId"]))
        except MalformedMessage:
            continue
    return named


def _manual_redrive(ctx: Context, dlq_url: str) -> int:
    queue_url = ctx.required_queue_url()
    requeued: dict[int, str] = {}

    def progress(move: dlq.ManualMove) -> None:
        out(f"  moved {move.moved} so far")

    def mark(messages: Sequence[MessageTypeDef]) -> None:
        # Row first: a FAILED record's message would be acknowledged as a duplicate.
        named = _records_of(messages)
        if named:
            requeued.update(ctx.records().mark_redriven(named))

    result = dlq.move_manually(
        ctx.sqs,
        dlq_url=dlq_url,
        queue_url=queue_url,
        max_messages=ctx.args.max_messages,
        on_batch=progress,
        before_send=mark,
    )
    out(
        f"moved {result.moved} messages to {queue_url} ({result.stopped}); "
        f"{result.send_failed} not sent, {result.not_deleted} sent but left in the DLQ"
    )
    failed = [record_id for record_id, was in requeued.items() if was == ArchiveStatus.FAILED]
    if failed:
        out(f"FAILED records given new attempts for their messages: {named_ids(failed)}")
    return EXIT_OK if not result.send_failed and not result.not_deleted else EXIT_PARTIAL


def _wait_for_task(ctx: Context, dlq_arn: str, handle: str) -> int:
    while True:
        task = dlq.move_task(ctx.sqs, dlq_arn, handle)
        if task is None:
            raise CommandError(f"move task {handle} is not listed any more")
        state = task.get("Status", "?")
        moved = task.get("ApproximateNumberOfMessagesMoved", 0)
        total = task.get("ApproximateNumberOfMessagesToMove", "?")
        out(f"  {state}: {moved} of {total} moved")
        if state in dlq.TASK_DONE_STATES:
            if state != "COMPLETED":
                raise CommandError(f"move task {state}: {task.get('FailureReason', 'no reason')}")
            return EXIT_OK
        time.sleep(ctx.args.poll_seconds)


def run(ctx: Context) -> int:
    args = ctx.args
    dlq_url = ctx.dlq_url()
    if args.wait_for:
        return _wait_for_task(ctx, dlq.queue_arn(ctx.sqs, dlq_url), args.wait_for)
    if args.dry_run:
        letters = dlq.peek(ctx.sqs, dlq_url, min(args.max_messages, args.show))
        out(f"{len(letters)} messages looked at in {dlq_url} (none moved):")
        for letter in letters:
            sent = letter.sent_at.isoformat(timespec="seconds") if letter.sent_at else "-"
            reason = f"  [{letter.reason}]" if letter.reason else ""
            out(f"  {letter.message_id}  sent {sent}  received {letter.receive_count}x{reason}")
            out(f"      {letter.body_preview}")
        return EXIT_OK
    if args.manual:
        return _manual_redrive(ctx, dlq_url)

    dlq_arn = dlq.queue_arn(ctx.sqs, dlq_url)
    queue_url = ctx.queue_url()
    destination = dlq.queue_arn(ctx.sqs, queue_url) if queue_url else None
    try:
        # No retries for this call: an endpoint without the API answers 500, which
        # botocore would otherwise retry for seconds before the fallback.
        handle = dlq.start_move_task(
            ctx.sqs_no_retry(),
            dlq_arn=dlq_arn,
            destination_arn=destination,
            max_per_second=args.rate,
        )
    except ClientError as error:
        if not dlq.not_implemented(error):
            raise
        out("StartMessageMoveTask is not available at this endpoint; moving the messages here")
        return _manual_redrive(ctx, dlq_url)
    out(f"started move task {handle}: {dlq_arn} -> {destination or 'the original source queue'}")
    out(
        "SQS moves the messages itself, unseen here: records that became FAILED meanwhile "
        "stay FAILED and their messages are acknowledged as duplicates (--manual requeues "
        "them as it moves; `archive-ctl show ID` tells)"
    )
    if not args.wait:
        out(f"follow it with: {PROG} redrive-dlq --wait-for {handle}")
        return EXIT_OK
    return _wait_for_task(ctx, dlq_arn, handle)
