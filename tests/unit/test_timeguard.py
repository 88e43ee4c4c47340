"""The transfer time estimates behind the time guard."""

from __future__ import annotations

from lib.archive import budget as timeguard

MIB = 1024 * 1024


def test_estimates_grow_with_size_from_a_fixed_overhead() -> None:
    assert timeguard.download_needs(0) == timeguard.DOWNLOAD_OVERHEAD_SECONDS
    assert timeguard.upload_needs(0) == timeguard.UPLOAD_OVERHEAD_SECONDS
    assert timeguard.upload_needs(10 * MIB) == timeguard.UPLOAD_OVERHEAD_SECONDS + 5.0
    assert timeguard.download_needs(10 * MIB) < timeguard.download_needs(20 * MIB)


def test_the_largest_image_always_fits_a_fresh_invocation() -> None:
    # 120 s function timeout, 5 s kept to record the outcome: if the estimate for the
    # largest image did not fit, such a row would be given back forever.
    huge = 10**12
    assert timeguard.download_needs(huge) + timeguard.upload_needs(huge) <= 115
    default_max = 50 * MIB
    assert timeguard.download_needs(default_max) + timeguard.upload_needs(default_max) < 60


def test_time_left() -> None:
    assert timeguard.time_left(10.0, now=4.0) == 6.0
