"""The transfer's time estimates (lib.archive.budget): a relayed copy is allowed the slower
direction's time plus the other's fixed part, never the sum of both."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lib.archive import budget


@given(size=st.integers(0, 10**10))
def test_a_relayed_copy_needs_the_slower_direction_not_both(size: int) -> None:
    relayed = budget.relayed_needs(size)
    sequential = budget.download_needs(size) + budget.upload_needs(size)
    assert max(budget.download_needs(size), budget.upload_needs(size)) < relayed
    assert relayed < sequential or (size == 0 and relayed == sequential)
    # Each direction's fixed part is paid once beside the other's whole time.
    assert relayed <= max(budget.download_needs(size), budget.upload_needs(size)) + max(
        budget.DOWNLOAD_OVERHEAD_SECONDS, budget.UPLOAD_OVERHEAD_SECONDS
    )


def test_a_ten_megabyte_relayed_copy_fits_where_the_sequential_one_is_tight() -> None:
    ten_mb = 10 * 1024 * 1024
    # At 2 MiB/s: 2 s + 5 s to download, 5 s + 5 s to upload; relayed, the upload's 10 s
    # and the download's fixed 2 s before the first bytes come.
    assert budget.download_needs(ten_mb) == 7.0
    assert budget.upload_needs(ten_mb) == 10.0
    assert budget.relayed_needs(ten_mb) == 12.0
    assert budget.download_needs(ten_mb) + budget.upload_needs(ten_mb) == 17.0
