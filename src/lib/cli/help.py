"""archive-ctl's help text: the exit codes (each command lists only those it can return),
the examples, and a formatter that keeps indented blocks as written."""

from __future__ import annotations

import argparse

from lib.cli.context import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NO_ROLE,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    PROG,
)

# Every command can end in these; each adds the codes only it returns (`codes=`).
COMMON_CODES = (
    (EXIT_OK, "done"),
    (EXIT_ERROR, "failed: configuration, database or SQS; the message says which"),
    (EXIT_USAGE, "bad command line"),
)
INTERRUPTED = (EXIT_INTERRUPTED, "interrupted (Ctrl-C)")
PARTIAL_RECORDS = (EXIT_PARTIAL, "partly done: some records were not found or not sent")


def exit_codes(*extra: tuple[int, str]) -> str:
    """The `exit codes:` block of a command's help: only the codes it can return (a
    command's own words for a common code replace the common ones)."""
    codes = dict([*COMMON_CODES, INTERRUPTED, *extra])
    lines = [f"  {code:<4} {codes[code]}" for code in sorted(codes)]
    return "exit codes:\n" + "\n".join(lines) + "\n"


EXIT_CODES = f"""exit codes:
  {EXIT_OK:<4} done
  {EXIT_ERROR:<4} failed: configuration, database or SQS; the message says which
  {EXIT_USAGE:<4} bad command line
  {EXIT_PARTIAL:<4} partly done (enqueue, requeue, backfill, redrive-dlq), a partial answer
       (status), privileges missing (grants)
  {EXIT_NO_ROLE:<4} grants: no such role; show: no such record
  {EXIT_NOT_MIGRATED:<4} grants: tables or columns are missing (run migrate first)
  {EXIT_INTERRUPTED:<4} interrupted (Ctrl-C); what was done is consistent, run it again to go on
  {EXIT_BROKEN_PIPE:<4} the reader of the output went away (`| head`): stopped quietly
  (each command's --help lists the codes it can return)
"""

EXAMPLES = f"""examples:
  {PROG} status                                   how things stand
  {PROG} show 123                                 why is record 123 not archived (yet)?
  {PROG} list --failed-since 2h                   what failed in the last two hours, and why
  {PROG} list --state PENDING --waiting paused    what waits for the upload lane
  {PROG} enqueue 123 124                          queue records (row first, then message)
  {PROG} requeue --failed-since 2h --dry-run      what a requeue of those would take
  {PROG} requeue --id 123 124                     new attempts for these FAILED records
  {PROG} backfill --since 30d --dry-run           never-queued generations of the last 30 days
  {PROG} backfill --since 30d                     queue them, live records first
  {PROG} lane clear --reason account              reopen the lane after fixing the token
  {PROG} redrive-dlq --dry-run                    look into the DLQ before moving it
  {PROG} redrive-dlq --leave-malformed            move it back, but the malformed bodies
  {PROG} migrate --dry-run                        what migrate would change, and legacy values
  {PROG} migrate                                  add what is missing of the schema, live-safely
  {PROG} grants --role image_archive              the GRANTs a role lacks for this release
"""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's wrapping for prose, but indented blocks (the exit codes) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.split("\n\n"):
            lines = block.strip("\n").splitlines()
            if any(line.startswith("  ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks)
