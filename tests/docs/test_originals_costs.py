"""What keeping the originals costs, as docs/performance.md prices it and repeats it: each
month's and each write's figure follows from the list prices in the same
row, every storage class the template allows has a row, and the two documents agree."""

from __future__ import annotations

import re

from lib.platform.env_values import ORIGINALS_STORAGE_CLASSES
from tests.docs.markdown import PERFORMANCE, read

IMAGES = 1_000_000
IMAGE_BYTES = 2_000_000
GB = 2**30  # S3 bills a GB of 2^30 bytes
STORED_GB = IMAGES * IMAGE_BYTES / GB


def rows(doc: str, header_start: str) -> dict[str, list[str]]:
    """storage class -> the cells of its row, in the table whose header starts so."""
    text = read(doc)
    table = text.split("\n" + header_start, 1)[1].split("\n\n", 1)[0]
    found = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        found[re.findall(r"`(\w+)`", cells[0])[0]] = cells
    return found


def dollars(cell: str) -> list[float]:
    return [float(amount.replace(",", "")) for amount in re.findall(r"\$([\d,.]+\d)", cell)]


def test_every_storage_class_is_priced_from_its_own_list_prices() -> None:
    priced = rows(PERFORMANCE, "| `OriginalsStorageClass` | storage, per GB-month")
    assert set(priced) == set(ORIGINALS_STORAGE_CLASSES)
    assert "1,862.6 GB" in read(PERFORMANCE)
    assert round(STORED_GB, 1) == 1862.6
    for name, cells in priced.items():
        per_gb, kept, per_thousand, written = (dollars(cells[i]) for i in (1, 2, 3, 4))
        # A month of a million kept: each tier's price by the stored GB.
        assert [round(price * STORED_GB, 2) for price in per_gb] == kept[: len(per_gb)], name
        # A million written, once: the price of 1,000 writes, a thousand times.
        assert written == [round(per_thousand[0] * IMAGES / 1000, 2)], name
    # Intelligent-Tiering's monitoring, a month: its price per 1,000 objects, by a million.
    *_, monitoring, per_thousand_objects = dollars(priced["INTELLIGENT_TIERING"][2])
    assert monitoring == round(per_thousand_objects * IMAGES / 1000, 2)


def test_performance_md_gives_the_same_costs() -> None:
    priced = rows(PERFORMANCE, "| `OriginalsStorageClass` | storage, per GB-month")
    repeated = rows(PERFORMANCE, "| `OriginalsStorageClass` | a million kept")
    assert set(repeated) == set(priced)
    for name, cells in repeated.items():
        kept = dollars(cells[1])
        assert kept == dollars(priced[name][2])[: len(kept)], name
        assert dollars(cells[2]) == dollars(priced[name][4]), name
