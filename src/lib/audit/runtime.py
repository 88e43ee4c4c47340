"""The audit function's long-lived parts, built once per Lambda container and reused
warm (as lib.archive.runtime builds the archive's and the sweeper's)."""

from __future__ import annotations

from functools import cache

from lib.archive import runtime
from lib.audit.auditor import Auditor
from lib.audit.repair import Restorer
from lib.platform.config import AuditSettings, load_audit_settings
from lib.platform.db import Database
from lib.platform.sqs import Queue
from lib.state.audits import AuditRecords
from lib.state.operations import OperatorRecords
from lib.transfer.download import Downloader


def build_auditor(settings: AuditSettings, *, db: Database | None = None) -> Auditor:
    """The auditor; `db`: a connection of the caller's (archive-ctl's), else its own."""
    db = db or Database(settings.database, application_name="image-archive-auditor")
    audits = AuditRecords(db)
    return Auditor(
        audits=audits,
        downloader=Downloader(
            max_bytes=settings.max_image_bytes,
            allow_private_networks=settings.allow_private_networks,
        ),
        originals=runtime.originals_in(settings.originals_bucket, settings.originals_storage_class),
        restorer=Restorer(
            audits=audits,
            operator=OperatorRecords(db),
            sender=Queue(),
            queue_url=settings.queue_url,
        ),
        period_seconds=settings.period_seconds,
        rate=settings.audit_rate,
        retention_seconds=settings.event_retention_days * 86_400,
    )


@cache
def auditor() -> Auditor:
    """The container's auditor; raises ConfigError (naming the setting) when misconfigured."""
    return build_auditor(load_audit_settings())


def _forget() -> None:
    if auditor.cache_info().currsize:
        auditor().audits.db.close()
    auditor.cache_clear()


runtime.on_reset(_forget)
