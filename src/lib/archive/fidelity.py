"""Did Lsky keep the bytes we sent? sha1 and size of the bytes in hand (lib.transfer.held),
compared with what Lsky reports of the file it stored (it may re-encode or watermark it).

The comparison is pure; docs/explanation/one-stored-copy.md has the reasoning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Lsky reports size in KB (bytes / 1024, a float); read back from its DECIMAL(8,2)
# column it is rounded to 0.01 KB. Either way a same-sized file is within half of that.
SIZE_TOLERANCE_KB = 0.005


@dataclass(frozen=True)
class Digest:
    sha1: str
    size: int  # bytes


@dataclass(frozen=True)
class Fidelity:
    compared: tuple[str, ...]  # which of sha1, size Lsky reported
    differs: tuple[str, ...]  # which of those differ from what we sent

    @property
    def altered(self) -> bool | None:
        """True: Lsky stored other bytes; False: the same; None: nothing to compare."""
        return bool(self.differs) if self.compared else None


def _size_kb(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def compare(sent: Digest, hosted: Mapping[str, Any]) -> Fidelity:
    """`sent` against the sha1 and size (KB) in Lsky's answer about the stored file (its
    md5 would say what its sha1 says, and is not taken on our side)."""
    compared: list[str] = []
    differs: list[str] = []
    theirs = hosted.get("sha1")
    if isinstance(theirs, str) and theirs:
        compared.append("sha1")
        if theirs.strip().lower() != sent.sha1:
            differs.append("sha1")
    size_kb = _size_kb(hosted.get("size"))
    if size_kb is not None:
        compared.append("size")
        if abs(size_kb - sent.size / 1024) > SIZE_TOLERANCE_KB + 1e-9:
            differs.append("size")
    return Fidelity(tuple(compared), tuple(differs))


def note(sent: Digest, fidelity: Fidelity) -> dict[str, Any]:
    """What the row keeps about it (hosted_response._archive): our side, and the verdict."""
    return {
        "sent": {"sha1": sent.sha1, "bytes": sent.size},
        "altered": fidelity.altered,
        "differs": list(fidelity.differs),
    }
