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


def test_the_sums_in_the_prose_and_the_readme_follow_from_the_table() -> None:
    """One costs table (docs/performance.md); the year's sum below it and the README's
    summary row are computed from it, not copied."""
    text = " ".join(read(PERFORMANCE).split())
    assert text.count("| `OriginalsStorageClass` |") == 1, "one costs table"
    priced = rows(PERFORMANCE, "| `OriginalsStorageClass` | storage, per GB-month")
    default_per_gb = dollars(priced["GLACIER_IR"][1])[0]
    standard_kept, standard_written = (
        dollars(priced["STANDARD"][2])[0],
        dollars(priced["STANDARD"][4])[0],
    )
    kept, written = dollars(priced["GLACIER_IR"][2])[0], dollars(priced["GLACIER_IR"][4])[0]
    twelfth = round(default_per_gb * STORED_GB * 12, 2)
    year = re.search(
        r"The default class costs \$([\d.]+) a month to write them, and \$([\d.]+) a month more "
        r"for each million kept: the twelfth month, \$([\d.]+) of storage. `STANDARD` would cost "
        r"\$([\d.]+) and \$([\d.]+)\.",
        text,
    )
    assert year, "the year's example under the costs table"
    assert [float(v) for v in year.groups()] == [
        written,
        kept,
        twelfth,
        standard_written,
        standard_kept,
    ]
    readme = " ".join(read("README.md").split())
    assert f"${kept:.2f} per month kept, ${written:.2f} to write" in readme
