"""The audit's verdicts against what the host really holds (a reference read from the Lsky
stand-in's own files, as its file route serves them): records are archived, the host loses
files, rewrites them, gets them back from a backup, goes down and comes back, and the audit
runs. After every run with the host up, each record's verdict is what its hosted file is
(intact: the bytes Lsky reported storing; missing: no file; altered: other bytes), and a
damaged one with nothing to restore it from is lost; with the host down, nothing changes."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from devkit import images
from tests.integration.test_audit import Audit
from tests.integration.world import World
from tests.support import fetch_record, model_examples, reset_audit_walk, reset_lane


class HostMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.world, self.audit = world, Audit(world)
        world.db.run(
            "TRUNCATE users, image_generation_records, image_archive_events,"
            " image_archive_audits, image_archive_originals, image_archive_restores"
            " RESTART IDENTITY CASCADE"
        )
        reset_lane(world.db)
        reset_audit_walk(world.db)
        world.lsky.reset()
        world.upstream.reset()
        self.keys: dict[int, str] = {}
        self.uploaded: dict[int, bytes] = {}  # what Lsky stored for each record
        self.down = False
        self.runs = 0

    # -- what happens ------------------------------------------------------------------

    @precondition(lambda self: len(self.keys) < 5)
    @rule()
    def archive(self) -> None:
        record_id = len(self.keys) + 1
        body = images.png(8 + record_id, 8)  # each its own bytes: no dedupe between them
        self.world.record(record_id, body)
        self.world.deliver(record_id)
        self.world.upstream.reset()  # the provider's URL is gone after that
        row = fetch_record(self.world.db, record_id)
        assert row["archive_status"] == "SUCCEEDED"
        self.keys[record_id] = str(row["hosted_response"]["key"])
        self.uploaded[record_id] = body

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        record_id = data.draw(st.sampled_from(sorted(self.keys)))
        path = self._path(record_id)
        if path.exists():
            path.unlink()

    @precondition(lambda self: self.keys)
    @rule(data=st.data(), size=st.integers(20, 40))
    def rewrite(self, data: st.DataObject, size: int) -> None:
        record_id = data.draw(st.sampled_from(sorted(self.keys)))
        self._path(record_id).write_bytes(images.png(size, size))

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def back_from_a_backup(self, data: st.DataObject) -> None:
        record_id = data.draw(st.sampled_from(sorted(self.keys)))
        self._path(record_id).write_bytes(self.uploaded[record_id])

    @rule(down=st.booleans())
    def host(self, down: bool) -> None:
        self.down = down
        self.world.lsky.file_fault = 503 if down else None

    @precondition(lambda self: self.keys)
    @rule()
    def audit_runs(self) -> None:
        db = self.world.db
        before = self._verdicts()
        db.run("UPDATE image_archive_audits SET due_at = now()")
        summary = self.audit.run()
        self.runs += 1
        after = self._verdicts()
        if self.down:
            assert summary["host_down"]
            assert after == before  # nothing judged
            return
        assert not summary["host_down"]
        for record_id in self.keys:
            truth = self._truth(record_id)
            verdict, lost = after[record_id]
            assert verdict == truth, (record_id, verdict, truth)
            assert lost == (truth != "intact"), (record_id, lost)

    # -- the reference: what the host's file route serves ------------------------------

    def _path(self, record_id: int) -> Any:
        row = fetch_record(self.world.db, record_id)
        return self.world.lsky.stored_path(row["hosted_image_url"])

    def _truth(self, record_id: int) -> str:
        path = self._path(record_id)
        if not path.is_file():
            return "missing"
        reported = fetch_record(self.world.db, record_id)["hosted_response"]["sha1"]
        sha1 = hashlib.sha1(path.read_bytes(), usedforsecurity=False).hexdigest()
        return "intact" if sha1 == reported else "altered"

    def _verdicts(self) -> dict[int, tuple[str | None, bool]]:
        rows = self.world.db.run("SELECT record_id, verdict, lost FROM image_archive_audits")
        return {int(r): (v, bool(lost)) for r, v, lost in rows}

    @invariant()
    def every_archived_record_is_in_the_rotation(self) -> None:
        assert set(self._verdicts()) == set(self.keys)

    def teardown(self) -> None:
        self.world.lsky.file_fault = None


@pytest.mark.model
def test_the_audit_s_verdicts_are_what_the_host_holds(world: World) -> None:
    run_state_machine_as_test(
        lambda: HostMachine(world),
        settings=settings(max_examples=model_examples(14), stateful_step_count=14),
    )
