"""The world an archive scenario starts from, and the builders that set it up (issue 20).

`world` (tests/integration/conftest.py) bundles the handler's harness, the database, the
provider (the upstream stand-in) and Lsky, so that a scenario reads as a few lines of
arrange (a record, a crashed attempt, an answer Lsky holds), act (`deliver`) and assert
(`row`, the stand-ins' records). Nothing here is a fake: every builder goes through the
real services, as the pieces it bundles do.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from devkit import images
from devkit.lsky import Behaviour, LskyStandIn
from devkit.upstream import Body, UpstreamServer
from lib.archive.message import encode
from tests.integration.conftest import ArchiveHarness
from tests.support import (
    HANG_SECONDS,
    FakeLambdaContext,
    fetch_record,
    seed_record,
    seed_running,
    wait_until,
)

PNG = images.png(8, 8)


@dataclass
class World:
    archive: ArchiveHarness
    db: Any
    upstream: UpstreamServer
    lsky: LskyStandIn
    settings: Callable[..., dict[str, str]]  # archive_env: the function's environment

    # -- arrange ---------------------------------------------------------------------------

    def image(self, record_id: int, body: Body = PNG, **route: Any) -> str:
        """The provider serves record `record_id`'s image at /gen/<id>.png (`route`: the
        options of UpstreamServer.add); returns its URL."""
        return self.upstream.add(self.path(record_id), body, **route)

    def record(self, record_id: int, body: Body = PNG, *, route: Any = None, **columns: Any) -> str:
        """A generation record whose image the provider serves (see `image`); `columns` as
        for tests.support.seed_record (status, attempts, locked_at, next_run_at, ...)."""
        url = self.image(record_id, body, **(route or {}))
        seed_record(self.db, record_id, image_url=url, **columns)
        return url

    def crashed(self, record_id: int, *, attempts: int = 1, locked_at: int = 3600) -> str:
        """A record whose attempt `attempts` died with its worker `locked_at` seconds ago:
        RUNNING under a lock long expired (tests.support.seed_running)."""
        url = self.image(record_id)
        seed_running(self.db, record_id, image_url=url, attempts=attempts, locked_at=locked_at)
        return url

    @contextlib.contextmanager
    def meanwhile(
        self, ready: Callable[[], object], act: Callable[[], object], gate: threading.Event
    ) -> Iterator[None]:
        """While the block runs: once `ready()` holds, `act` runs, then `gate` (what holds
        the handler: Behaviour.held, an upstream route's gate) opens. However slow the
        machine, `act` happens in that moment; its failure is raised after the block."""
        failed: list[BaseException] = []

        def run() -> None:
            try:
                wait_until(ready, "the moment to act")
                act()
            except BaseException as error:  # raised again in the test's thread
                failed.append(error)
            finally:
                gate.set()

        thread = threading.Thread(target=run)
        thread.start()
        try:
            yield
        finally:
            gate.set()
            thread.join(HANG_SECONDS)
        if failed:
            raise failed[0]

    def during_the_upload(self, act: Callable[[], object]) -> AbstractContextManager[None]:
        """Lsky holds the next upload's answer until `act` has run, once the whole request
        body is in: the claim is done, the image sent, the outcome not yet written."""
        gate = threading.Event()
        bodies = self.lsky.bodies_received
        self.lsky.script(Behaviour.held(gate))
        return self.meanwhile(lambda: self.lsky.bodies_received > bodies, act, gate)

    @contextlib.contextmanager
    def records_table_gone_during_the_upload(self) -> Iterator[None]:
        """The records table is renamed away while Lsky holds the upload (the success write
        fails, as in an outage after the upload), and put back after the block."""
        away = "ALTER TABLE image_generation_records RENAME TO image_generation_records_away"
        try:
            with self.during_the_upload(lambda: self.db.run(away)):
                yield
        finally:
            self.db.run(
                "ALTER TABLE image_generation_records_away RENAME TO image_generation_records"
            )

    # -- act -------------------------------------------------------------------------------

    def deliver(self, record_id: int, context: FakeLambdaContext | None = None) -> Any:
        """Record `record_id`'s message sent, received and handled as Lambda would."""
        return self.archive.deliver(encode(record_id), context)

    # -- assert ----------------------------------------------------------------------------

    def row(self, record_id: int) -> dict[str, Any]:
        return fetch_record(self.db, record_id)

    def state(self, record_id: int) -> tuple[str, int]:
        """(archive_status, archive_attempts) of the row."""
        row = self.row(record_id)
        return row["archive_status"], row["archive_attempts"]

    def downloads(self, record_id: int) -> int:
        """Requests the provider saw for the record's image."""
        return self.upstream.hits(self.path(record_id))

    @staticmethod
    def path(record_id: int) -> str:
        return f"/gen/{record_id}.png"
