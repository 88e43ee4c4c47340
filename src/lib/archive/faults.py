"""What an exception that escaped an attempt's steps means for the record (pure): the
database's absence, our own misconfiguration or bug, never the record's fault."""

from __future__ import annotations

import pg8000.exceptions

from lib.archive.outcome import Outcome, Verdict
from lib.archive.retry import redelivery_delay
from lib.archive.schedule import OWN_FAULT_RETRY_SECONDS
from lib.platform.db import describe
from lib.platform.errors import ConfigError, DatabaseUnavailable
from lib.platform.grants import describe_permission_denied, is_permission_denied
from lib.platform.s3 import StagingError
from lib.state.lane_store import LaneContention


def fault_verdict(
    error: Exception, *, claimed: bool, lock_ttl_seconds: int, denial: str | None = None
) -> Verdict:
    """The verdict for `error`. With the row claimed, anything but a lost database gives
    the attempt back (OWN_FAULT); unclaimed or unwritable, the message is redelivered
    after the lock could have expired (UNCONCLUDED). denial: a 42501 in words that name
    what the role lacks (lib.state.privileges.explain_denial), when the caller read it."""
    if isinstance(error, DatabaseUnavailable):
        return _unconcluded("database unavailable", str(error), lock_ttl_seconds)
    if is_permission_denied(error):
        # A grant the release needs is missing: our configuration, never the record's.
        what, metric = "permission denied", "PermissionDenied"
        detail = denial or describe_permission_denied(error)
    elif isinstance(error, pg8000.exceptions.DatabaseError):
        # The server refused a statement (e.g. the migration was not applied): nothing
        # was concluded, and the SQLSTATE says why without quoting parameters.
        return _unconcluded("database error", describe(error), lock_ttl_seconds)
    elif isinstance(error, ConfigError):
        # E.g. an unusable secret: the message names the setting, not the value.
        what, metric = "configuration error", "ConfigError"
        detail = f"{what}: {error}"
    elif isinstance(error, LaneContention):
        what, metric = "lane contention", "LaneContention"
        detail = str(error)
    elif isinstance(error, StagingError):
        # The staged copy (the only one once the URL expired) could not be read: S3's
        # fault or ours, never the record's.
        what, metric = "staging error", "StagingError"
        detail = f"{what}: {error}"
    else:
        what, metric = "internal error", "InternalError"
        detail = f"{what} ({type(error).__name__})"
    if not claimed:
        return _unconcluded(what, detail, lock_ttl_seconds, metric)
    # The fault may have struck mid-upload: the next attempt looks the image up first, and
    # a pacing slot the attempt took stays in the ledger as an upload Lsky may have counted.
    return Verdict(
        Outcome.OWN_FAULT,
        detail,
        OWN_FAULT_RETRY_SECONDS,
        may_be_hosted=True,
        counted=True,
        metrics=(metric,),
        fields={"error": detail},
    )


def _unconcluded(
    what: str, error: str, lock_ttl_seconds: int, metric: str | None = None
) -> Verdict:
    # Whether or not the claim went through, the row is safe: PENDING rows and expired
    # locks are taken over on redelivery (or by the sweeper).
    return Verdict(
        Outcome.UNCONCLUDED,
        error,
        redelivery_delay(lock_ttl_seconds),
        metrics=(metric,) if metric else (),
        fields={"error": error},
        log=f"{what}; message will be redelivered",
    )
