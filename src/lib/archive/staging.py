"""Capture now, publish later (pure rules): when an image is worth staging in the bucket,
what its staged copy is called, and what a FAILED row does with it.

The S3 side is lib.platform.s3, the copies lib.archive.copier; docs/archive.md (Staging)
has the rationale.
"""

from __future__ import annotations

import uuid

from lib.archive.lane import host_condition
from lib.archive.retry import ErrorClass, classify
from lib.transfer.failures import Failure, Stage
from lib.transfer.imagetype import AVIF, GIF, JPEG, PNG, WEBP, ImageType

# Every staged object lives under this prefix: the archive function's IAM grant and the
# bucket's lifecycle rule name it, so nothing else in the bucket is reachable or expired.
STAGED_PREFIX = "staged/"
_BY_EXTENSION = {image_type.extension: image_type for image_type in (PNG, JPEG, GIF, WEBP, AVIF)}


def staged_key(record_id: int, image_type: ImageType, token: str | None = None) -> str:
    """staged/<record id>/<random>.<ext>: one object per capture, so a late writer of an
    earlier attempt can never overwrite (or delete) the copy the row points at."""
    return f"{STAGED_PREFIX}{record_id}/{token or uuid.uuid4().hex}.{image_type.extension}"


def image_type_of(key: str) -> ImageType | None:
    """The image type a staged key was written with (its extension); None if not ours."""
    if not key.startswith(STAGED_PREFIX):
        return None
    _, dot, extension = key.rpartition(".")
    return _BY_EXTENSION.get(extension) if dot else None


def worth_staging(failure: Failure) -> bool:
    """After the image was downloaded but the host did not take it: capture it when a
    later attempt can succeed (a pause of the whole host, or a transient failure), so
    that attempt does not depend on the provider's URL, which expires."""
    if failure.stage is not Stage.UPLOAD:
        return False  # nothing arrived to capture, or the source itself failed
    if host_condition(failure) is not None:
        return True
    return classify(failure) is ErrorClass.TRANSIENT


def keeps_copy(failure: Failure) -> bool:
    """A row that becomes FAILED keeps its staged copy unless the image itself was
    refused (a permanent error): attempts used up on an outage are replayed with
    `archive-ctl requeue --failed` from the copy, long after the URL expired."""
    return classify(failure) is ErrorClass.TRANSIENT
