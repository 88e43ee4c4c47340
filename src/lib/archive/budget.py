"""How long a transfer may take, so an attempt never starts what it cannot finish (pure).

Pessimistic on purpose and capped so a fresh invocation always has room for the largest
image; docs/explanation/attempt.md says why.
"""

from __future__ import annotations

import time

# Slow enough for a small self-hosted Lsky behind a home uplink (16 Mbit/s).
CONSERVATIVE_BYTES_PER_SECOND = 2 * 1024 * 1024
DOWNLOAD_OVERHEAD_SECONDS = 2.0  # connect, TLS, time to first byte
UPLOAD_OVERHEAD_SECONDS = 5.0  # connect, then Lsky re-encodes, hashes and stores the file
MAX_ESTIMATE_SECONDS = 45.0  # per direction: 2 x 45 s fits in a fresh invocation


def _estimate(size: int, overhead: float) -> float:
    return min(overhead + size / CONSERVATIVE_BYTES_PER_SECOND, MAX_ESTIMATE_SECONDS)


def download_needs(size: int) -> float:
    """Seconds to allow for downloading `size` bytes (0 when the size is unknown yet)."""
    return _estimate(size, DOWNLOAD_OVERHEAD_SECONDS)


def upload_needs(size: int) -> float:
    """Seconds to allow for uploading `size` bytes to Lsky and reading its answer."""
    return _estimate(size, UPLOAD_OVERHEAD_SECONDS)


def relayed_needs(size: int) -> float:
    """Seconds to allow for a relayed copy of `size` bytes (lib.transfer.relay: the upload
    reads the download as it lands): both links carry the bytes at once, so the slower
    direction's time, plus the other direction's fixed part (the upload cannot start before
    the first bytes; Lsky's work starts after the last)."""
    return max(
        download_needs(size) + UPLOAD_OVERHEAD_SECONDS,
        upload_needs(size) + DOWNLOAD_OVERHEAD_SECONDS,
    )


def time_left(deadline: float, now: float | None = None) -> float:
    return deadline - (time.monotonic() if now is None else now)


# Staging (lib.archive.staging) talks to S3 in the function's own region: far faster than
# a self-hosted Lsky, still assumed slow (a busy network, S3 retrying a part).
STAGE_BYTES_PER_SECOND = 8 * 1024 * 1024
STAGE_OVERHEAD_SECONDS = 2.0


def stage_needs(size: int) -> float:
    """Seconds to allow for writing (or reading back) `size` bytes to the staging bucket."""
    return min(STAGE_OVERHEAD_SECONDS + size / STAGE_BYTES_PER_SECOND, MAX_ESTIMATE_SECONDS)
