"""`archive-ctl redrive-dlq` and the malformed messages: redriven they only come back, so it
can leave them behind (and says how many) or delete only them; the runbook's way of
emptying the DLQ needs no purge. The real command against moto's SQS."""

from __future__ import annotations

from typing import Any

from devkit.sqs import QueuePair
from lib.archive.message import encode
from lib.cli.context import EXIT_OK
from tests.integration.conftest import ArchiveCtl
from tests.integration.test_cli import drain, record_ids
from tests.support import queue_attrs

MALFORMED = ("not json", '{"recordId": "-4"}')


def fill(sqs: Any, queues: QueuePair, valid: list[int]) -> None:
    """Valid bodies for `valid`, and the malformed ones, one with the archive function's
    `archive-error` attribute (as it parks them) and one without (redriven by SQS)."""
    for record_id in valid:
        sqs.send_message(QueueUrl=queues.dlq_url, MessageBody=encode(record_id))
    sqs.send_message(
        QueueUrl=queues.dlq_url,
        MessageBody=MALFORMED[0],
        MessageAttributes={"archive-error": {"DataType": "String", "StringValue": "not JSON"}},
    )
    sqs.send_message(QueueUrl=queues.dlq_url, MessageBody=MALFORMED[1])


def dlq_bodies(sqs: Any, queues: QueuePair) -> list[str]:
    return sorted(m["Body"] for m in drain(sqs, queues.dlq_url))


def test_leave_malformed_moves_the_rest_and_says_how_many_it_left(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    fill(sqs, queues, [1, 2, 3])

    result = archive_ctl("redrive-dlq", "--leave-malformed")

    assert result.returncode == EXIT_OK, result.stderr
    assert "moved 3 messages" in result.stdout
    assert "left 2 malformed messages in the DLQ" in result.stdout
    assert record_ids(drain(sqs, queues.url)) == [1, 2, 3]
    # Left visible again at once, not hidden for the run's visibility timeout.
    assert queue_attrs(sqs, queues.dlq_url).visible == 2
    assert dlq_bodies(sqs, queues) == sorted(MALFORMED)


def test_delete_malformed_deletes_only_them(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    fill(sqs, queues, [4, 5])

    answer = archive_ctl.json("redrive-dlq", "--delete-malformed")

    assert (answer["deleted"], answer["left"], answer["moved"]) == (2, 2, 0)
    assert drain(sqs, queues.url) == []  # nothing moved
    assert queue_attrs(sqs, queues.dlq_url).visible == 2
    assert dlq_bodies(sqs, queues) == sorted([encode(4), encode(5)])


def test_the_runbooks_way_empties_the_dlq_without_a_purge(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    """docs/how-to/runbook.md: look, move back what can be archived, then delete only what
    never can; a message that arrives meanwhile is never lost to a purge."""
    fill(sqs, queues, [6, 7])
    looked = archive_ctl("redrive-dlq", "--dry-run")
    assert "4 messages looked at" in looked.stdout
    assert ", 2 malformed:" in looked.stdout
    assert looked.stdout.count("MALFORMED") == 2

    assert archive_ctl("redrive-dlq", "--leave-malformed").returncode == EXIT_OK
    sqs.send_message(QueueUrl=queues.dlq_url, MessageBody=encode(8))  # arrives meanwhile
    assert archive_ctl("redrive-dlq", "--delete-malformed").returncode == EXIT_OK

    assert record_ids(drain(sqs, queues.url)) == [6, 7]
    assert dlq_bodies(sqs, queues) == [encode(8)]  # kept: the next redrive moves it


def test_a_plain_redrive_says_how_many_malformed_it_moved(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    fill(sqs, queues, [9])

    result = archive_ctl("redrive-dlq", "--manual")

    assert result.returncode == EXIT_OK, result.stderr
    assert "moved 3 messages" in result.stdout
    assert "2 of them malformed (they come back to the DLQ: fix the producer)" in result.stdout


def test_a_dead_letter_s_reason_is_shown_on_one_bounded_redacted_line(
    archive_ctl: ArchiveCtl, sqs: Any, queues: QueuePair
) -> None:
    """Whoever may send to the DLQ sets the `archive-error` attribute too: a terminal escape,
    a newline, a token or 200 KB of it reach neither the operator's screen nor the JSON."""
    hostile = "\x1b[2J\x1b]0;owned\x07line one\nline two token=SECRETVALUE " + "x" * 200_000
    sqs.send_message(
        QueueUrl=queues.dlq_url,
        MessageBody="not json",
        MessageAttributes={"archive-error": {"DataType": "String", "StringValue": hostile}},
    )

    looked = archive_ctl("redrive-dlq", "--dry-run")
    answer = archive_ctl.json("redrive-dlq", "--dry-run")

    assert looked.returncode == EXIT_OK, looked.stderr
    [line] = [line for line in looked.stdout.splitlines() if "MALFORMED" in line]
    assert "line one line two" in line
    assert "\x1b" not in looked.stdout
    assert "\x07" not in looked.stdout
    assert "SECRETVALUE" not in looked.stdout
    assert len(line) < 400
    [message] = answer["messages"]
    assert len(message["reason"]) <= 200
    assert "SECRETVALUE" not in message["reason"]
