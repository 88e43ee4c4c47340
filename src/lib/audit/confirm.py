"""The audit's look at the originals no container confirmed: a HEAD each, within the run's
time. There with the recorded length, naming its record: confirmed with its version.
Absent (or another object): the row goes and the record is due now, so the audit's GET
keeps a new original. S3 not answering: left for the next run. Nothing in the bucket is
deleted (docs/explanation/staging-and-originals.md)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.originals import Originals, OriginalsError
from lib.platform.observability import logger, metrics
from lib.platform.s3_originals import Found
from lib.state.claim import Confirmed, is_version
from lib.state.originals import OriginalStore, Unconfirmed

# An original recorded unconfirmed is looked at only this long after: its container's next
# claim usually confirms it first, and S3 has long stored (or refused) a body it received
# whole by then (an attempt's PUT cannot outlive its invocation: 900 s at most on Lambda).
CONFIRM_AFTER_SECONDS = 900
# The originals a run looks at, at most (one HEAD each).
CONFIRM_BATCH = 50


class Look(enum.StrEnum):
    CONFIRMED = "confirmed"
    ABSENT = "absent"  # nothing under its key
    OTHER = "other"  # something else under its key: another length, or another record's


def judge(original: Unconfirmed, found: Found | None) -> Look:
    """What a HEAD says of an unconfirmed original: only the length recorded, metadata
    naming this record and a readable version confirm it."""
    if found is None:
        return Look.ABSENT
    if (
        found.size != original.bytes
        or found.metadata.get("record-id") != str(original.record_id)
        or not is_version(found.version_id)
    ):
        return Look.OTHER
    return Look.CONFIRMED


@dataclass
class Looked:
    confirmed: int = 0
    absent: int = 0  # absent or another object: the row went, a new original is due


def look_at_unconfirmed(
    store: OriginalStore,
    originals: Originals,
    time_left: Callable[[], bool],
    deadline: Callable[[], float],
) -> Looked:
    """One run's look (CONFIRM_BATCH at most, while `time_left`); never raises for S3."""
    looked = Looked()
    bucket = originals.bucket
    if bucket is None:
        return looked
    for original in store.unconfirmed(grace_seconds=CONFIRM_AFTER_SECONDS, limit=CONFIRM_BATCH):
        if not time_left():
            break
        try:
            found = bucket.head(original.key, deadline=deadline(), bucket=original.bucket)
        except OriginalsError as error:
            logger.warning("could not look at an unconfirmed original", error=str(error))
            continue
        look = judge(original, found)
        if look is Look.CONFIRMED and found is not None:
            confirmed = Confirmed(original.record_id, original.key, found.version_id)
            looked.confirmed += store.confirm([confirmed])
            continue
        if store.absent(original.record_id, original.key):
            looked.absent += 1
            logger.error(
                "an original recorded unconfirmed is not in the bucket; a new one is kept",
                record_id=str(original.record_id),
                original_key=original.key,
                found=str(look),
            )
    _count("OriginalsConfirmedByAudit", looked.confirmed)
    _count("OriginalsFoundAbsent", looked.absent)
    return looked


def _count(name: str, value: int) -> None:
    if value:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
