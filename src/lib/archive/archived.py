"""What an archived copy leaves behind besides the success write: the response the row
stores (Lsky's `data` and our note), and the warnings and counts it deserves."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.fidelity import note
from lib.archive.outcome import Copied
from lib.archive.reconcile import RESPONSE_KEY
from lib.platform.observability import logger, metrics
from lib.state.claim import Restoring
from lib.state.records import Recorded

# Keys of further images with a record's name named in one warning (all of them: Lsky lists
# 40 a page), each cut to this length (a key is 6 characters on Lsky; the host's text).
LOGGED_KEYS = 100
KEY_LIMIT = 64
# Lsky's size column is DECIMAL(8,2) KB: a larger one is not its.
MAX_KILOBYTES = 999_999.99


def stored_response(copied: Copied) -> dict[str, Any]:
    """Lsky's `data`, with our note on how the row got it under a key of ours."""
    fidelity = copied.fidelity
    if copied.sent is None or fidelity is None:  # adopted: nothing was sent to compare
        return {**copied.hosted.data, RESPONSE_KEY: {"adopted": True}}
    ours = note(copied.sent, fidelity)
    if copied.duplicate_possible:
        # The look-up for an earlier attempt's upload could not be answered.
        ours["duplicate_possible"] = True
    return {**copied.hosted.data, RESPONSE_KEY: ours}


def image_bytes(copied: Copied) -> int | None:
    """The image's size for its completion event: the bytes uploaded, or, for an image an
    earlier attempt had stored, Lsky's stored size (KB, a float) in bytes; None when
    neither is known."""
    if not copied.adopted:
        return copied.size
    kilobytes = copied.hosted.data.get("size")
    if isinstance(kilobytes, bool) or not isinstance(kilobytes, int | float):
        return None
    if not math.isfinite(kilobytes) or not 0 <= kilobytes <= MAX_KILOBYTES:
        return None
    return round(kilobytes * 1024)


def report_copy(copied: Copied) -> None:
    """The warnings and counts a successful copy may deserve besides ARCHIVED's own."""
    fidelity, sent, data = copied.fidelity, copied.sent, copied.hosted.data
    if fidelity is not None and sent is not None and fidelity.altered:
        # Re-encoded (group image quality below 100, a save format) or watermarked.
        logger.warning(
            "archived, but Lsky stored other bytes than the generated image",
            differs=list(fidelity.differs),
            sent_bytes=sent.size,
            sent_sha1=sent.sha1,
            hosted_sha1=str(data.get("sha1", "")),
            hosted_size_kb=data.get("size"),
        )
        metrics.add_metric(name="ArchivedAltered", unit=MetricUnit.Count, value=1)
    elif fidelity is not None and fidelity.altered is None:
        logger.warning("Lsky's answer has no sha1 or size: the bytes were not compared")
    if copied.adopted:
        logger.info(
            "an earlier attempt had stored the image; adopted it instead of uploading",
            hosted_key=str(data.get("key", "")),
        )
        metrics.add_metric(name="Reconciled", unit=MetricUnit.Count, value=1)
    if copied.duplicate_possible:
        metrics.add_metric(name="DuplicatePossible", unit=MetricUnit.Count, value=1)
    if copied.duplicates:
        # Earlier attempts whose answers were lost (or uploads by hand): one is adopted, the
        # others are orphans on the host. Each is named for an operator to delete (Lsky
        # lists 40 a page; the host's text is bounded all the same) and counted.
        logger.warning(
            "the host holds more than one image for this record",
            hosted_key=str(data.get("key", ""))[:KEY_LIMIT],
            duplicate_keys=[key[:KEY_LIMIT] for key in copied.duplicates[:LOGGED_KEYS]],
            duplicates=len(copied.duplicates),
        )
        metrics.add_metric(
            name="DuplicateImages", unit=MetricUnit.Count, value=len(copied.duplicates)
        )


def report_recorded(copied: Copied, recorded: Recorded, restore: Restoring | None) -> None:
    """What the success write found, when it is not the usual; and a restore's copy
    recorded (the old copy stays on the host, its key named for an operator to delete)."""
    if recorded is not Recorded.UNDER_LOCK:
        RECORDED_WARNINGS[recorded](copied)
    if restore is not None and recorded in (Recorded.UNDER_LOCK, Recorded.AFTER_LOCK_PASSED):
        logger.info("hosted image restored", replaced_key=restore.old_key)
        metrics.add_metric(name="Restored", unit=MetricUnit.Count, value=1)


def _unrecorded(copied: Copied) -> dict[str, Any]:
    """The original this attempt kept, when its success write recorded nothing: the
    object stays in the bucket (nothing there is deleted), named for an operator."""
    return {} if copied.original is None else {"unrecorded_original": copied.original.key}


RECORDED_WARNINGS: Mapping[Recorded, Callable[[Copied], None]] = {
    Recorded.ALREADY_OTHER: lambda copied: logger.warning(
        "archived, but another attempt had already archived the record", **_unrecorded(copied)
    ),
    Recorded.AFTER_LOCK_PASSED: lambda _: logger.warning(
        "archived after the lock had passed on; recorded anyway"
    ),
    Recorded.ROW_GONE: lambda copied: logger.warning(
        "archived, but the record no longer exists",
        hosted_url=copied.hosted.url,
        **_unrecorded(copied),
    ),
    Recorded.ALREADY_THIS: lambda _: None,
}
