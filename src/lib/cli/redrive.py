"""`archive-ctl redrive-dlq`: chooses between a move task, waiting for one, a dry run and
the manual move (which can leave or delete the malformed messages), and prints progress;
the SQS calls themselves are in lib.cli.dlq."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from lib.archive.message import MalformedMessage, parse_record_id
from lib.archive.sweep_rules import named_ids
from lib.cli import dlq
from lib.cli.context import EXIT_OK, EXIT_PARTIAL, PROG, CommandError, Context
from lib.cli.words import plural
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
    args = ctx.args
    decide = dlq.move_all
    if args.leave_malformed:
        decide = dlq.leave_malformed
    elif args.delete_malformed:
        decide = dlq.delete_malformed
    # Deleting only the malformed ones sends nothing: no queue needed.
    queue_url = "" if args.delete_malformed else ctx.required_queue_url()
    requeued: dict[int, str] = {}

    def progress(move: dlq.ManualMove) -> None:
        done = f"deleted {move.deleted}" if args.delete_malformed else f"moved {move.moved}"
        ctx.progress(f"  {done} so far")

    def mark(messages: Sequence[MessageTypeDef]) -> None:
        # Row first: a FAILED record's message would be acknowledged as a duplicate.
        named = _records_of(messages)
        if named:
            requeued.update(ctx.records().mark_redriven(named))

    result = dlq.move_manually(
        ctx.sqs,
        dlq_url=dlq_url,
        queue_url=queue_url,
        max_messages=args.max_messages,
        decide=decide,
        on_batch=progress,
        before_send=mark,
    )
    failed = sorted(record for record, was in requeued.items() if was == ArchiveStatus.FAILED)
    ctx.answer(
        {
            "dlq_url": dlq_url,
            "queue_url": queue_url or None,
            **asdict(result),
            "requeued_failed": failed,
        }
    )
    if args.delete_malformed:
        ctx.say(
            f"deleted {plural(result.deleted, 'malformed message')} from the DLQ "
            f"({result.stopped}); left {plural(result.left, 'other')} in it, "
            f"{plural(result.delete_failed, 'delete')} failed"
        )
    else:
        malformed = (
            f", {result.moved_malformed} of them malformed (they come back to the DLQ: fix "
            "the producer)"
            if result.moved_malformed
            else ""
        )
        ctx.say(
            f"moved {plural(result.moved, 'message')} to {queue_url} ({result.stopped})"
            f"{malformed}; "
            f"{result.send_failed} not sent, {result.not_deleted} sent but left in the DLQ"
        )
    if failed:
        ctx.say(f"FAILED records given new attempts for their messages: {named_ids(failed)}")
    if args.leave_malformed:
        ctx.say(
            f"left {plural(result.left_malformed, 'malformed message')} in the DLQ: "
            f"`{PROG} redrive-dlq --dry-run` shows them, "
            f"`{PROG} redrive-dlq --delete-malformed` deletes only them"
        )
    return EXIT_OK if result.complete else EXIT_PARTIAL


def _wait_for_task(ctx: Context, dlq_arn: str, handle: str) -> int:
    while True:
        task = dlq.move_task(ctx.sqs, dlq_arn, handle)
        if task is None:
            raise CommandError(f"move task {handle} is not listed any more")
        state = task.get("Status", "?")
        moved = task.get("ApproximateNumberOfMessagesMoved", 0)
        total = task.get("ApproximateNumberOfMessagesToMove", "?")
        ctx.progress(f"  {state}: {moved} of {total} moved")
        if state in dlq.TASK_DONE_STATES:
            ctx.answer(
                {"task": handle, "state": state, "waited": True, "moved": moved, "to_move": total}
            )
            if state != "COMPLETED":
                raise CommandError(f"move task {state}: {task.get('FailureReason', 'no reason')}")
            return EXIT_OK
        time.sleep(ctx.args.poll_seconds)


def _dry_run(ctx: Context, dlq_url: str) -> int:
    args = ctx.args
    letters = dlq.peek(ctx.sqs, dlq_url, min(args.max_messages, args.show))
    malformed = sum(letter.malformed for letter in letters)
    ctx.answer(
        {
            "dlq_url": dlq_url,
            "looked_at": len(letters),
            "malformed": malformed,
            "messages": [asdict(letter) for letter in letters],
        }
    )
    looked = plural(len(letters), "message")
    ctx.say(f"{looked} looked at in {dlq_url} (none moved), {malformed} malformed:")
    for letter in letters:
        sent = letter.sent_at.isoformat(timespec="seconds") if letter.sent_at else "-"
        reason = f"  [{letter.reason}]" if letter.reason else ""
        kind = "  MALFORMED" if letter.malformed else ""
        ctx.say(
            f"  {letter.message_id}  sent {sent}  received {letter.receive_count}x{kind}{reason}"
        )
        ctx.say(f"      {letter.body_preview}")
    return EXIT_OK


def run(ctx: Context) -> int:
    args = ctx.args
    dlq_url = ctx.dlq_url()
    if args.wait_for:
        return _wait_for_task(ctx, dlq.queue_arn(ctx.sqs, dlq_url), args.wait_for)
    if args.dry_run:
        return _dry_run(ctx, dlq_url)
    if args.manual or args.leave_malformed or args.delete_malformed:
        # A move task moves every message: leaving some behind takes the manual move.
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
        ctx.progress(
            "StartMessageMoveTask is not available at this endpoint; moving the messages here"
        )
        return _manual_redrive(ctx, dlq_url)
    ctx.progress(
        f"started move task {handle}: {dlq_arn} -> {destination or 'the original source queue'}"
    )
    ctx.progress(
        "SQS moves the messages itself, unseen here: records that became FAILED meanwhile "
        "stay FAILED and their messages are acknowledged as duplicates (--manual requeues "
        "them as it moves; `archive-ctl show ID` tells)"
    )
    if not args.wait:
        ctx.answer({"task": handle, "state": None, "waited": False})
        ctx.say(f"follow it with: {PROG} redrive-dlq --wait-for {handle}")
        return EXIT_OK
    return _wait_for_task(ctx, dlq_arn, handle)
