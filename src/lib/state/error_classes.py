"""What failed, read from the start of archive_error (each writer starts its text its own
way): `archive-ctl list --error-class` selects rows by these LIKE prefixes and names a
listed row's class. Pure; a unit test checks every writer's text against it."""

from __future__ import annotations

from lib.transfer.failures import Stage

# Class -> LIKE patterns of archive_error, in the order a text is tried.
ERROR_CLASSES: dict[str, tuple[str, ...]] = {
    # lib.archive.retry.error_summary: "<stage> failed (HTTP 503): ... [attempt 2/3]"
    **{str(stage): (f"{stage} failed%",) for stage in Stage},
    # The claim's `exhausted` and the sweeper's expired-lock step (queries.sql).
    "lock-expired": ("lock expired%",),
    # The sweeper's take_picked: a PENDING row whose generation is not SUCCEEDED.
    "generation": ("generation status is %",),
    # lib.archive.faults: our own fault, the attempt given back (PENDING rows).
    "permission": ("42501%",),
    "configuration": ("configuration error%",),
    "staging": ("staging error%",),
    "internal": ("internal error%",),
}


def error_class(error: str | None) -> str | None:
    """The class of an archive_error text; None when none of the patterns fits."""
    if error is None:
        return None
    for name, patterns in ERROR_CLASSES.items():
        if any(_like(error, pattern) for pattern in patterns):
            return name
    return None


def _like(text: str, pattern: str) -> bool:
    """LIKE for the patterns above: literal text, then one trailing `%`."""
    return text.startswith(pattern.removesuffix("%"))
