"""`archive-ctl redrive-dlq`: chooses between a move task, waiting for one, a dry run and
the manual move, and prints progress; the SQS calls themselves are in lib.cli.dlq."""

from __future__ import annotations

import time

from botocore.exceptions import ClientError

from lib.cli import dlq
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, PROG, CommandError, Context, out


def _manual_redrive(ctx: Context, dlq_url: str) -> int:
    queue_url = ctx.required_queue_url()

    def progress(move: dlq.ManualMove) -> None:
        out(f"  moved {move.moved} so far")

    result = dlq.move_manually(
        ctx.sqs,
        dlq_url=dlq_url,
        queue_url=queue_url,
        max_messages=ctx.args.max_messages,
        on_batch=progress,
    )
    out(
        f"moved {result.moved} messages to {queue_url} ({result.stopped}); "
        f"{result.send_failed} not sent, {result.not_deleted} sent but left in the DLQ"
    )
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
    if not args.wait:
        out(f"follow it with: {PROG} redrive-dlq --wait-for {handle}")
        return EXIT_OK
    return _wait_for_task(ctx, dlq_arn, handle)
