"""Every archived image's original, kept in the originals bucket (ARCHIVE_ORIGINALS_BUCKET):
written beside the Lsky upload from the spool it reads, a staged copy copied in
server-side; `keep` and `read_back` for the audit. S3's failures never become the
record's: logged, counted (OriginalsFailed), the audit fills the gap.
docs/explanation/staging-and-originals.md."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as Late

from aws_lambda_powertools.metrics import MetricUnit

from lib.archive.budget import stage_needs, time_left
from lib.archive.confirmations import Confirmations
from lib.platform.kept_threads import KeptThreads
from lib.platform.observability import log_unexpected, logger, metrics
from lib.platform.s3 import OriginalMissing, OriginalsError
from lib.platform.s3_body import Cut, Readable
from lib.platform.s3_originals import OriginalsBucket
from lib.state.claim import ORIGINALS_PREFIX, Confirmed, KeptOriginal, OriginalSource
from lib.transfer.held import HeldImage, hold
from lib.transfer.imagetype import ImageType, by_extension

__all__ = ["OriginalMismatch", "OriginalMissing", "Originals", "OriginalsError"]

# Once Lsky has taken the image, the record waits at most this long for its original's
# body to go out whole (S3's answer is not waited for: confirmed later); S3 slower than
# that is cut. docs/explanation/staging-and-originals.md says why this bound.
WAIT_SECONDS = 2.0
# One archive at a time per container, beside an audit's keeps.
_WRITERS = KeptThreads(2, "original")


def original_key(record_id: int, image_type: ImageType) -> str:
    """originals/<record id>/<random>.<ext>: a key per write, so no writer (a late one, the
    audit's) ever replaces an object another row points at."""
    return f"{ORIGINALS_PREFIX}{record_id}/{uuid.uuid4().hex}.{image_type.extension}"


def object_metadata(record_id: int, source: OriginalSource) -> dict[str, str]:
    """What the object says of itself (x-amz-meta-*): whose original it is, and whence."""
    return {"record-id": str(record_id), "source": str(source)}


class OriginalMismatch(OriginalsError):
    """The original read back is not the bytes recorded (replaced, truncated): never used."""


class Keeping:
    """An original being written on a kept thread while the upload goes on: `kept` once
    Lsky took the image, `drop` when it did not; `stop` before the spool is released.
    `unconfirmed`: the original as recorded before S3's answer (its body sent whole)."""

    def __init__(
        self,
        record_id: int,
        key: str,
        write: Callable[[Cut], KeptOriginal],
        unconfirmed: Callable[[Cut], KeptOriginal | None],
    ) -> None:
        self.record_id = record_id
        self.key = key
        self._cut = Cut()
        self._unconfirmed = unconfirmed
        self._dropping = threading.Lock()  # a second drop waits for the first one's end
        self._dropped = False
        self._writing = _WRITERS.submit(write, self._cut)
        self._writing.add_done_callback(lambda _: self._cut.moved.set())

    def kept(self, wait: float, later: Confirmations | None = None) -> KeptOriginal | None:
        """The original once written, waiting at most `wait` seconds; None (logged,
        counted) when S3 refused it, or was slower than that: the write is cut then.
        `later` (the archive's): once its body has gone out whole, S3's answer is not
        waited for: the original comes unconfirmed, and the answer goes to `later`."""
        waited = wait
        if later is not None:
            self._cut.moved.wait(max(0.0, wait))  # the body sent whole, or the write ended
            early = None if self._writing.done() else self._unconfirmed(self._cut)
            if early is not None:
                record_id = self.record_id
                self._writing.add_done_callback(lambda done: _answer(later, record_id, early, done))
                logger.info("original sent, S3's answer confirms it later", original_key=self.key)
                metrics.add_metric(name="OriginalsKept", unit=MetricUnit.Count, value=1)
                return early
            wait = 0.0
        try:
            original = self._writing.result(timeout=max(0.0, wait))
        except Late:
            self._cut()
            # A body sent whole may still be stored: then it stays, unrecorded, named here.
            sent = "; its body had gone out whole: S3 may hold it" if self._cut.sent else ""
            _not_kept(f"keeping original {self.key}: no answer within {waited:.1f} s{sent}")
            return None
        except Exception as error:  # noqa: BLE001 - S3's failures are never the record's
            _failed(error)
            return None
        logger.info("original kept", original_key=original.key, bytes=original.bytes)
        metrics.add_metric(name="OriginalsKept", unit=MetricUnit.Count, value=1)
        return original

    def drop(self) -> None:
        """Lsky did not take the image: the write is cut if its body is still going out
        (S3 stores nothing of a body cut short). One sent whole is let finish (WAIT_SECONDS
        at most): written, it stays unrecorded (nothing in the bucket is deleted), named."""
        with self._dropping:
            if self._dropped:
                return
            self._dropped = True
            if not self._cut.sent:
                self._cut()
                if not self._cut.sent:
                    return  # cut short of its last byte: nothing to wait for
            try:
                self._writing.result(timeout=WAIT_SECONDS)
            except Exception:  # noqa: BLE001 - cut, refused or late: nothing to name for sure
                self._cut()
                return
            logger.warning(
                "an original was written for an upload Lsky did not take; not recorded",
                original_key=self.key,
            )

    def stop(self) -> None:
        """The writer reads the spool no more (cut if it still does): before its release.
        A body sent whole is sealed instead (a retry would read it again), and S3's
        answer is left to come on the kept thread."""
        if self._writing.done():
            return
        if self._cut.sent:
            self._cut.seal()
            return
        self._cut()
        self._writing.exception()  # the cut, or the attempt's deadline, ends it


class Originals:
    """The originals bucket as the archive and the audit use it. With no bucket
    (ARCHIVE_ORIGINALS_BUCKET empty) nothing is written and nothing calls S3."""

    def __init__(self, bucket: OriginalsBucket | None) -> None:
        self.bucket = bucket
        # S3's answers to originals recorded before them, for the next claim to record.
        self.confirmations = Confirmations()

    @property
    def enabled(self) -> bool:
        return self.bucket is not None

    def beside(
        self,
        record_id: int,
        source: Readable,
        image_type: ImageType,
        deadline: float,
        origin: OriginalSource = OriginalSource.ARCHIVE,
    ) -> Keeping | None:
        """Start writing `source` (a spool, or a download landing in one) as the original;
        None when off. The writer's stop must run before the spool is released."""
        bucket = self.bucket
        if bucket is None:
            return None
        key, mime_type = original_key(record_id, image_type), image_type.mime_type

        def write(cut: Cut) -> KeptOriginal:
            written = bucket.put(
                key,
                source,
                content_type=mime_type,
                metadata=object_metadata(record_id, origin),
                deadline=deadline,
                cut=cut,
            )
            version, sha256, size = written.version_id, written.sha256, written.size
            return KeptOriginal(bucket.name, key, version, sha256, size, mime_type, origin)

        def unconfirmed(cut: Cut) -> KeptOriginal | None:
            if not cut.sent or cut.sha256 is None:
                return None
            return KeptOriginal(
                bucket.name, key, None, cut.sha256, source.size, mime_type, origin, False
            )

        return Keeping(record_id, key, write, unconfirmed)

    def copied_in(
        self, record_id: int, staged_bucket: str, staged_key: str, held: HeldImage, deadline: float
    ) -> Keeping | None:
        """Copy the staged copy `held` was read from in, server-side (no byte through the
        function), only while it is still that object (its ETag); None when off."""
        bucket = self.bucket
        if bucket is None or not held.etag or not held.sha256:
            return None
        key, mime_type = original_key(record_id, held.image_type), held.image_type.mime_type

        def write(cut: Cut) -> KeptOriginal:
            version = bucket.copy(
                key,
                source_bucket=staged_bucket,
                source_key=staged_key,
                etag=held.etag,
                content_type=mime_type,
                metadata=object_metadata(record_id, OriginalSource.STAGED),
                deadline=deadline,
                cut=cut,
            )
            return KeptOriginal(
                bucket.name, key, version, held.sha256, held.size, mime_type, OriginalSource.STAGED
            )

        def unconfirmed(cut: Cut) -> KeptOriginal | None:
            staged = OriginalSource.STAGED
            return KeptOriginal(
                bucket.name, key, None, held.sha256, held.size, mime_type, staged, False
            )

        return Keeping(record_id, key, write, unconfirmed)

    def keep(
        self, record_id: int, held: HeldImage, source: OriginalSource, deadline: float
    ) -> KeptOriginal | None:
        """The bytes in hand written now (the audit's); their SHA-256 taken on the way.
        None when off or S3 refused (logged, OriginalsFailed); never raises for S3."""
        keeping = self.beside(record_id, held, held.image_type, deadline, source)
        if keeping is None:
            return None
        try:
            return keeping.kept(time_left(deadline))
        finally:
            keeping.stop()

    def read_back(self, original: KeptOriginal, deadline: float) -> HeldImage:
        """That version of the original, into a spool, checked against the recorded length
        and SHA-256. Raises OriginalMissing, OriginalMismatch, OriginalsError."""
        if self.bucket is None:
            raise OriginalsError("originals are off (ARCHIVE_ORIGINALS_BUCKET is empty)")
        image_type = by_extension(original.key)
        if image_type is None or not original.key.startswith(ORIGINALS_PREFIX):
            raise OriginalMissing(f"{original.key!r} is not an original")
        stored = self.bucket.open(
            original.key, version_id=original.version_id, deadline=deadline, bucket=original.bucket
        )
        try:
            if stored.size != original.bytes:  # replaced or truncated: not read at all
                raise OriginalMismatch(
                    f"original {original.key} holds {stored.size} bytes, {original.bytes} were kept"
                )
            if time_left(deadline) < stage_needs(stored.size):
                raise OriginalsError("not enough time left to read the original back")
            held = hold(stored.chunks(), image_type, sha256=True)
        finally:
            stored.close()
        if held.size != original.bytes or held.sha256 != original.sha256:
            held.close()
            raise OriginalMismatch(f"original {original.key} does not hold the bytes kept")
        return held


def _answer(
    later: Confirmations, record_id: int, original: KeptOriginal, done: Future[KeptOriginal]
) -> None:
    """S3's answer to an original recorded unconfirmed, kept for the next claim (on the
    kept thread: nothing logged here; the claim's statement and its thread tell it)."""
    error = done.exception()
    if error is None:
        later.answered(Confirmed(record_id, original.key, done.result().version_id))
        return
    what = str(error) if isinstance(error, OriginalsError) else type(error).__name__
    later.failed(record_id, f"original {original.key}: {what}; left unconfirmed (S3 may hold it)")


def _failed(error: Exception) -> None:
    if isinstance(error, OriginalsError):
        _not_kept(str(error))
        return
    log_unexpected("keeping the original failed unexpectedly", error)  # a bug of ours
    metrics.add_metric(name="OriginalsFailed", unit=MetricUnit.Count, value=1)


def _not_kept(error: str) -> None:
    # Never the record's failure: it is archived all the same, and the audit keeps its
    # original later (OriginalsFailed is alarmed).
    logger.error("could not keep the original", error=error)
    metrics.add_metric(name="OriginalsFailed", unit=MetricUnit.Count, value=1)
