"""The audit of hosted images, against the real services: records archived by the real
archive handler, then what a host does to stored files (the Lsky stand-in loses, replaces
and shares them, or its file route fails), then the audit function called as the
EventBridge schedule does, and the archive handler again for what it repairs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from devkit import images
from tests.integration.world import World
from tests.support import FakeLambdaContext, fetch_record


@dataclass
class Audit:
    world: World

    def run(self, **env: str | None) -> dict[str, Any]:
        """The audit function, invoked as the schedule does (with these settings)."""
        from handlers.auditor import lambda_handler

        if env:
            self.world.settings(**env)
        context = FakeLambdaContext(function_name="AuditFunction", timeout_seconds=300)
        result: dict[str, Any] = lambda_handler({}, context)
        return result

    def archived(self, *record_ids: int, body: bytes | None = None) -> None:
        """Each record archived by the archive handler from the provider: an image of its
        own unless `body` is given (Lsky stores identical bytes once, for every record)."""
        for record_id in record_ids:
            self.world.record(record_id, body or images.png(8 + record_id, 8))
            self.world.deliver(record_id)
            assert self.world.state(record_id) == ("SUCCEEDED", 1)

    def key(self, record_id: int) -> str:
        return str(fetch_record(self.world.db, record_id)["hosted_response"]["key"])

    def audit_row(self, record_id: int) -> dict[str, Any]:
        db = self.world.db
        rows = db.run("SELECT * FROM image_archive_audits WHERE record_id = :id", id=record_id)
        names = [column["name"] for column in db.columns]
        return dict(zip(names, rows[0], strict=True))

    def events(self, record_id: int, kind: str) -> list[dict[str, Any]]:
        rows = self.world.db.run(
            "SELECT detail FROM image_archive_events WHERE record_id = :id AND kind = :kind"
            " ORDER BY at, seq",
            id=record_id,
            kind=kind,
        )
        return [row[0] if isinstance(row[0], dict) else json.loads(row[0]) for row in rows]

    def make_due(self, *record_ids: int) -> None:
        self.world.db.run(
            "UPDATE image_archive_audits SET due_at = now() WHERE record_id = ANY(:ids)",
            ids=list(record_ids),
        )


pytestmark = pytest.mark.usefixtures("clean_metrics")


@pytest.fixture
def audit(world: World) -> Audit:
    return Audit(world)


def test_a_fresh_archive_is_checked_once_and_an_intact_copy_writes_nothing(
    audit: Audit, world: World
) -> None:
    audit.archived(1, 2)
    before = fetch_record(world.db, 1)

    summary = audit.run()

    assert summary["checked"] == 2
    assert summary["intact"] == 2
    assert not summary["host_down"]
    assert world.lsky.file_gets == 2
    # The producer's table is not churned, nor the story told of what was as expected.
    assert fetch_record(world.db, 1) == before
    assert audit.events(1, "audited") == []
    row = audit.audit_row(1)
    assert row["verdict"] == "intact"
    # Due again a period later: a second run checks nothing.
    assert audit.run()["checked"] == 0
    assert world.lsky.file_gets == 2


@pytest.mark.parametrize(
    ("damage", "verdict"),
    [
        ("lose", "missing"),
        ("replace", "altered"),
        ("share", "altered"),
    ],
)
def test_a_damaged_copy_without_an_original_or_a_source_is_lost_on_the_host(
    audit: Audit, world: World, damage: str, verdict: str
) -> None:
    audit.archived(1, 2)
    key = audit.key(1)
    if damage == "lose":
        world.lsky.lose_file(key)
    elif damage == "replace":
        world.lsky.replace_file(key, images.png(30, 30))
    else:
        world.lsky.share_file(key, like=audit.key(2))
    world.upstream.reset()  # the provider's URL is gone (404) by now
    before = fetch_record(world.db, 1)

    summary = audit.run()

    assert summary[verdict] == 1
    assert summary["intact"] == 1
    assert summary["lost"] == 1
    assert summary["restores"] == 0
    assert [found["record_id"] for found in summary["found"]] == [1]
    row = audit.audit_row(1)
    assert (row["verdict"], row["lost"]) == (verdict, True)
    [audited] = audit.events(1, "audited")
    assert audited["verdict"] == verdict
    assert audited["hosted_key"] == key  # named for an operator to delete
    assert len(audit.events(1, "lost_on_host")) == 1
    # Nothing is deleted on Lsky, the generation's row keeps what it had.
    assert world.lsky.find_image(key) is not None
    assert fetch_record(world.db, 1) == before


def test_a_copy_the_host_lost_whole_is_archived_again_from_the_source_that_still_answers(
    audit: Audit, world: World
) -> None:
    # The host's own data loss (a restore from an older backup): its row and file are gone.
    audit.archived(1)
    old = fetch_record(world.db, 1)
    world.lsky.lose_file(audit.key(1))
    world.lsky.drop_record(audit.key(1))

    summary = audit.run()

    assert (summary["missing"], summary["restores"], summary["lost"]) == (1, 1, 0)
    row = fetch_record(world.db, 1)
    # PENDING again, a fresh attempt budget, the old URL kept until a new one is stored.
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["hosted_image_url"] == old["hosted_image_url"]

    world.archive.settle(event := world.archive.receive(), world.archive.invoke(event))

    row = fetch_record(world.db, 1)
    assert row["archive_status"] == "SUCCEEDED"
    assert row["hosted_image_url"] != old["hosted_image_url"]
    [restored] = audit.events(1, "restored")
    assert restored["old_url"] == old["hosted_image_url"]
    assert restored["new_url"] == row["hosted_image_url"]
    assert restored["old_key"] == old["hosted_response"]["key"]
    # The new copy is checked soon, and found intact: the verdict changes back.
    summary = audit.run()
    assert (summary["checked"], summary["intact"]) == (1, 1)
    assert audit.audit_row(1)["verdict"] == "intact"
    assert audit.events(1, "audited")[-1]["verdict"] == "intact"
    assert audit.events(1, "audited")[-1]["was"] == "missing"


def test_a_restore_lsky_would_dedupe_onto_the_damaged_file_fails_with_what_to_do(
    audit: Audit, world: World
) -> None:
    # A disk lost behind Lsky: the row is still listed, so Lsky would point a new upload
    # of the same bytes at the same (missing) file. The restore says so and stores nothing.
    audit.archived(1)
    key = audit.key(1)
    world.lsky.lose_file(key)
    uploads = world.lsky.upload_count
    audit.run()

    world.archive.settle(event := world.archive.receive(), world.archive.invoke(event))

    row = fetch_record(world.db, 1)
    assert row["archive_status"] == "FAILED"
    assert row["archive_error"].startswith(f"restore failed: Lsky still lists image {key}")
    assert "archive-ctl restore --id 1" in row["archive_error"]
    assert world.lsky.upload_count == uploads  # nothing uploaded
    # The old URL stays: the generation's row never points at nothing.
    assert row["hosted_image_url"] is not None


def test_a_host_down_judges_nothing_and_says_so_once(audit: Audit, world: World) -> None:
    audit.archived(1, 2, 3)
    world.lsky.file_fault = 503

    summary = audit.run()

    assert summary["host_down"]
    assert summary["checked"] == 0
    assert summary["unreachable"] == 3
    for record_id in (1, 2, 3):
        row = audit.audit_row(record_id)
        assert row["verdict"] is None
        assert row["checked_at"] is None
    assert world.archive.log_for("hosted images unreachable: the host seems down; nothing judged")
    # Back up: the next run judges them all.
    world.lsky.file_fault = None
    assert audit.run()["intact"] == 3


def test_a_dry_run_writes_nothing(audit: Audit, world: World) -> None:
    from lib.audit import runtime

    audit.archived(1)
    world.lsky.lose_file(audit.key(1))
    due_before = audit.audit_row(1)["due_at"]

    summary = runtime.auditor().run(lambda: 300_000, dry_run=True)

    assert (summary.missing, summary.restores, summary.dry_run) == (1, 1, True)
    assert audit.audit_row(1)["due_at"] == due_before
    assert audit.audit_row(1)["verdict"] is None
    assert fetch_record(world.db, 1)["archive_status"] == "SUCCEEDED"
    assert audit.events(1, "audited") == []


def test_the_walk_enrols_records_archived_before_the_audit(audit: Audit, world: World) -> None:
    # Archived by an older release: no audit row. The walk enrols them, the run checks them.
    audit.archived(1)
    world.db.run("DELETE FROM image_archive_audits")
    world.db.run("INSERT INTO users (id, username) VALUES (2, 'bob') ON CONFLICT DO NOTHING")
    world.db.run(
        "INSERT INTO image_generation_records (id, user_id, status, image_url, archive_status)"
        " VALUES (7, 2, 'SUCCEEDED', 'http://x.invalid/7.png', NULL)"
    )

    summary = audit.run()

    assert summary["enrolled"] == 1
    assert summary["intact"] == 1
    assert world.db.run("SELECT record_id FROM image_archive_audits") == [[1]]
    # The pass is finished: the next run walks nothing until a period has passed.
    assert audit.run()["enrolled"] == 0


# -- the operator's commands ---------------------------------------------------------------


@pytest.fixture
def ctl(archive_ctl: Any, world: World) -> Any:
    archive_ctl.env["ARCHIVE_ALLOW_PRIVATE_NETWORKS"] = "127.0.0.0/8"
    return archive_ctl


def test_archive_ctl_audit_checks_the_chosen_records_now_and_says_what_it_found(
    audit: Audit, world: World, ctl: Any
) -> None:
    audit.archived(1, 2, 3)
    audit.run()  # all checked: none due now
    world.lsky.lose_file(audit.key(2))
    world.lsky.drop_record(audit.key(2))
    world.upstream.reset()  # and the provider's URL is gone: lost

    dry = ctl("audit", "--id", "2", "3", "--dry-run")
    assert dry.returncode == 3, dry.stderr
    assert "audit (dry run: nothing written): 2 copies checked: 1 intact, 1 missing" in dry.stdout
    assert audit.audit_row(2)["verdict"] == "intact"  # nothing written

    answer = ctl.json("audit", "--id", "2", "3", code=3)

    assert (answer["checked"], answer["missing"], answer["lost"]) == (2, 1, 1)
    [found] = answer["found"]
    assert (found["record_id"], found["verdict"], found["repair"]) == (2, "missing", "lost")
    assert audit.audit_row(2)["lost"] is True
    # Nothing else was due: the rotation checks nothing.
    assert ctl.json("audit")["checked"] == 0


def test_archive_ctl_restore_names_what_it_cannot_restore(
    audit: Audit, world: World, ctl: Any
) -> None:
    audit.archived(1)
    result = ctl("restore", "--id", "1", "9")
    assert result.returncode == 3, result.stderr
    assert "#1: left alone: no original kept: nothing to restore it from" in result.stdout
    assert "#9: no such record" in result.stdout
    assert fetch_record(world.db, 1)["archive_status"] == "SUCCEEDED"
    usage = ctl("restore")
    assert usage.returncode == 2
    assert "say which: --id ID..., --missing or --altered" in usage.stderr


def test_archive_ctl_list_finds_what_the_audit_found_with_the_key_to_delete(
    audit: Audit, world: World, ctl: Any
) -> None:
    audit.archived(1, 2, 3)
    for record_id in (1, 2):
        world.lsky.replace_file(audit.key(record_id), images.png(40 + record_id, 40))
    world.upstream.reset()
    audit.make_due(1, 2, 3)
    audit.run()

    altered = ctl.json("list", "--audit", "altered")
    assert [r["id"] for r in altered["records"]] == [2, 1]
    assert {r["audit"] for r in altered["records"]} == {"altered (lost)"}
    assert [r["hosted_key"] for r in altered["records"]] == [audit.key(2), audit.key(1)]
    assert [r["id"] for r in ctl.json("list", "--audit", "lost")["records"]] == [2, 1]
    assert ctl.json("list", "--audit", "missing")["records"] == []
    text = ctl("list", "--audit", "lost").stdout
    assert f"audit: altered (lost), key {audit.key(1)}" in text


def test_status_and_show_tell_the_audit_s_coverage_and_a_record_s_last_check(
    audit: Audit, world: World, ctl: Any
) -> None:
    audit.archived(1, 2)
    world.lsky.lose_file(audit.key(2))
    world.upstream.reset()
    audit.run()

    status = ctl.json("status")["audit"]
    assert (status["archived"], status["intact"], status["missing"], status["lost"]) == (2, 1, 1, 1)
    assert (status["with_original"], status["without_original"]) == (0, 2)
    assert status["never_checked"] == 0
    shown = ctl("show", "2").stdout
    assert "  audit        missing since" in shown
    assert ", lost on the host; last checked" in shown
    assert "lost_on_host" in shown
    assert ctl.json("show", "2")["kept"]["verdict"] == "missing"


# -- where a restore meets the rest --------------------------------------------------------


def _lost_whole(audit: Audit, world: World, record_id: int) -> dict[str, Any]:
    """The host lost the record's copy, row and file (a restore from an older backup), and
    the audit asked for its restore (from the provider's URL, which still answers)."""
    old = fetch_record(world.db, record_id)
    world.lsky.lose_file(audit.key(record_id))
    world.lsky.drop_record(audit.key(record_id))
    assert audit.run()["restores"] == 1
    return old


def test_a_restore_whose_answer_is_lost_adopts_what_lsky_stored_instead_of_uploading_twice(
    audit: Audit, world: World
) -> None:
    from devkit.lsky import Behaviour

    audit.archived(1)
    old = _lost_whole(audit, world, 1)
    world.lsky.script(Behaviour.drop())  # stored, answer lost
    event = world.archive.receive()
    world.archive.settle(event, world.archive.invoke(event))
    assert fetch_record(world.db, 1)["archive_status"] == "PENDING"
    uploads = world.lsky.upload_count
    world.db.run("UPDATE image_generation_records SET archive_next_run_at = now() WHERE id = 1")
    world.archive.fast_forward(event)

    world.archive.settle(event := world.archive.receive(), world.archive.invoke(event))

    row = fetch_record(world.db, 1)
    assert row["archive_status"] == "SUCCEEDED"
    assert world.lsky.upload_count == uploads  # adopted, not uploaded again
    assert row["hosted_image_url"] != old["hosted_image_url"]
    assert row["hosted_response"]["_archive"] == {"adopted": True}
    assert audit.events(1, "restored")[0]["new_url"] == row["hosted_image_url"]


def test_a_restore_waits_for_a_paused_lane_as_any_archive(audit: Audit, world: World) -> None:
    audit.archived(1)
    _lost_whole(audit, world, 1)
    world.db.run(
        "UPDATE image_archive_lane SET paused_until = now() + interval '1 hour',"
        " pause_reason = 'rate_limit', paused_since = now() WHERE lane = 'lsky'"
    )
    uploads = world.lsky.upload_count

    world.archive.invoke(world.archive.receive())

    # Held or parked for the lane, as any archive: no attempt spent, nothing uploaded.
    row = fetch_record(world.db, 1)
    assert (row["archive_status"], row["archive_attempts"]) == ("PENDING", 0)
    assert row["archive_wait_reason"] == "paused"
    assert world.lsky.upload_count == uploads


def test_the_sweeper_sends_no_second_message_for_a_restore_the_audit_sent(
    audit: Audit, world: World
) -> None:
    from handlers.sweeper import lambda_handler

    audit.archived(1)
    _lost_whole(audit, world, 1)
    world.db.run(
        "UPDATE image_generation_records SET archive_next_run_at = now() - interval '1 hour'"
        " WHERE id = 1"
    )

    summary = lambda_handler({}, FakeLambdaContext(function_name="SweeperFunction"))

    assert summary["requeued"] == 0
    assert len(world.archive.receive_all(1)) == 1


def test_an_audit_does_not_restore_a_record_changed_since_it_was_judged(
    audit: Audit, world: World, ctl: Any
) -> None:
    # The operator restored it (PENDING) while the audit's verdict was on its way: the
    # audit's own request takes only an archived row with the URL it judged.
    import os

    from lib.platform.config import DatabaseConfig
    from lib.platform.db import Database
    from lib.state.audits import AuditRecords
    from lib.state.events import Actor

    audit.archived(1)
    old = fetch_record(world.db, 1)
    world.db.run("UPDATE image_generation_records SET archive_status = 'PENDING' WHERE id = 1")
    records = AuditRecords(Database(DatabaseConfig(url=os.environ["DATABASE_URL"])))
    taken = records.request_restores(
        [(1, old["hosted_image_url"])], reason="missing", by=Actor.AUDITOR, need_original=False
    )
    assert taken == []
    world.db.run(
        "UPDATE image_generation_records SET archive_status = 'SUCCEEDED',"
        " hosted_image_url = 'https://img.example.com/other.png' WHERE id = 1"
    )
    assert (
        records.request_restores(
            [(1, old["hosted_image_url"])], reason="missing", by=Actor.AUDITOR, need_original=False
        )
        == []
    )
    assert world.db.run("SELECT count(*) FROM image_archive_restores") == [[0]]


def test_the_audit_removes_its_own_events_after_the_retention(audit: Audit, world: World) -> None:
    # They come after the record's conclusion: the story's retention does not take them.
    audit.archived(1)
    world.lsky.lose_file(audit.key(1))
    world.upstream.reset()
    audit.run()
    assert len(audit.events(1, "audited")) == 1
    world.db.run(
        "UPDATE image_archive_events SET at = at - interval '31 days'"
        " WHERE kind IN ('audited', 'lost_on_host')"
    )

    summary = audit.run()

    assert summary["events_removed"] == 2
    assert audit.events(1, "audited") == []
    assert audit.events(1, "lost_on_host") == []
    assert len(audit.events(1, "archived")) == 1  # the story's own retention decides
