"""Issue 21 item 6 with real processes: `archive-ctl backfill` (its own process, real clock)
over thousands of never-queued rows, the archive handler uploading to the Lsky stand-in
under pacing (windows scaled to seconds), live records arriving every second. A live
record finds at most a handful of history uploads ahead of it, as without the backfill
(the backfill before this found it 64-96 uploads of history, 28-36 s, behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import pytest

from devkit import images
from lib.archive.message import encode
from lib.cli.context import EXIT_INTERRUPTED
from tests.integration.conftest import ArchiveHarness
from tests.integration.lane_model import bulk_never_queued
from tests.integration.test_cli import REPO_ROOT
from tests.support import FakeLambdaContext, seed_record

PNG = images.png(size=2_000)
LIMITS = "6/2 seconds,30/10 seconds"
HISTORY = 3_000
LIVE_FROM = 1_000_000
# Uploads of history a live record may find ahead of it: what the lane holds at a time
# (the room pacing leaves a backfill in the 2-second window, and one more in flight).
AHEAD = 4
# Runs the command with SIGINT at its default, as a terminal's foreground command has it.
# A shell starts a background job (`make test &` in a script) with SIGINT ignored, an
# ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt:
# the backfill would never see this test's Ctrl-C.
FOREGROUND = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
    " os.execv(sys.argv[1], sys.argv[1:])"
)
# What the backfill prints once it runs: after its first look at the lane, inside the
# command, where a Ctrl-C is handled.
STARTED = "pacing: "


class Lane:
    """The archive function (the real handler, in this process) and the producer."""

    def __init__(self, archive: ArchiveHarness, db: Any, url: str) -> None:
        self.archive = archive
        self.db = db
        self.url = url
        self.live: list[int] = []
        self._next_live = 0.0

    def produce(self) -> None:
        """A generation finished, every second: its row is marked, then its message sent."""
        if time.monotonic() < self._next_live:
            return
        record_id = LIVE_FROM + len(self.live)
        seed_record(self.db, record_id, image_url=self.url, next_run_at=0, enqueued_at=0)
        self.archive.send(encode(record_id))
        self.live.append(record_id)
        self._next_live = time.monotonic() + 1.0

    def run(
        self, seconds: float, *, until: Callable[[], bool] | None = None, produce: bool = True
    ) -> None:
        """Archive what arrives for `seconds` (live records arriving, if `produce`); with
        `until`, stop once it holds, and fail if it never did."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until is not None and until():
                return
            if produce:
                self.produce()
            event = self.archive.receive(wait_seconds=0)
            if not event["Records"]:
                time.sleep(0.02)
                continue
            response = self.archive.invoke(event, FakeLambdaContext(timeout_seconds=60))
            self.archive.settle(event, response)
        assert until is None, f"{until.__qualname__} did not hold within {seconds:g} s"

    def live_done(self) -> bool:
        [[left]] = self.db.run(
            "SELECT count(*) FROM image_generation_records"
            " WHERE id >= :first AND archive_status <> 'SUCCEEDED'",
            first=LIVE_FROM,
        )
        return int(left) == 0


class Output:
    """A child's stdout and stderr, each read by a thread as it is written (the child
    never blocks on a full pipe); `started` is set by the first stderr line holding
    `marker`."""

    def __init__(self, process: subprocess.Popen[str], marker: str) -> None:
        assert process.stdout is not None
        assert process.stderr is not None
        self.marker = marker
        self.started = threading.Event()
        self._out: list[str] = []
        self._err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(stream, lines, watch), daemon=True)
            for stream, lines, watch in (
                (process.stdout, self._out, False),
                (process.stderr, self._err, True),
            )
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, stream: IO[str], lines: list[str], watch: bool) -> None:
        for line in stream:
            lines.append(line)
            if watch and self.marker in line:
                self.started.set()

    def read(self) -> tuple[str, str]:
        """Everything written, once the child has closed its pipes (it has ended)."""
        for thread in self._threads:
            thread.join()
        return "".join(self._out), "".join(self._err)


def ahead_of_live(db: Any, live: list[int]) -> dict[int, tuple[int, int]]:
    """Each live record: (uploads of history, uploads of live records) that Lsky took
    between the record's arrival and its own upload."""
    uploads = db.run(
        "SELECT record_id, at, record_id < :live FROM image_archive_uploads"
        " WHERE state = 'done' AND record_id IS NOT NULL",
        live=LIVE_FROM,
    )
    done = {record_id: at for record_id, at, _ in uploads}
    arrived = dict(
        db.run(
            "SELECT id, archive_enqueued_at FROM image_generation_records WHERE id >= :f",
            f=LIVE_FROM,
        )
    )
    found = {}
    for record_id in live:
        start, end = arrived[record_id], done[record_id]
        between = [history for other, at, history in uploads if start < at < end]
        found[record_id] = (sum(between), len(between) - sum(between))
    return found


@pytest.mark.slow
def test_live_records_never_queue_behind_a_running_backfill(
    archive_env: Callable[..., dict[str, str]],
    archive: ArchiveHarness,
    db: Any,
    upstream: Any,
    queues: Any,
) -> None:
    archive_env(LSKY_RATE_LIMITS=LIMITS)
    url = upstream.add("/history.png", PNG)
    # Live demand before the run: an upload a second for the last 10 s.
    db.run(
        "INSERT INTO image_archive_uploads (lane, at, state)"
        " SELECT 'lsky', now() - g * interval '1 s' + interval '0.5 s', 'done'"
        " FROM generate_series(1, 10) AS g"
    )
    bulk_never_queued(db, 1, HISTORY, url=url)
    lane = Lane(archive, db, url)

    lane.run(5.0)  # live records alone: the baseline
    alone = len(lane.live)
    backfill = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, str(REPO_ROOT / "scripts" / "archive-ctl"), "backfill"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    output = Output(backfill, STARTED)

    def started_or_ended() -> bool:
        return output.started.is_set() or backfill.poll() is not None

    try:
        # Live records go on arriving while the backfill starts (a busy machine may take
        # seconds to start an interpreter), then for a while with the backfill running.
        lane.run(120.0, until=started_or_ended)
        lane.run(14.0)  # live records while the backfill runs
    finally:
        backfill.send_signal(signal.SIGINT)
        try:
            backfill.wait(timeout=30)
        finally:
            if backfill.poll() is None:
                backfill.kill()
            out, err = output.read()
    assert backfill.returncode == EXIT_INTERRUPTED, err
    assert "interrupted: run the same `archive-ctl backfill` again" in out
    lane.run(30.0, until=lane.live_done, produce=False)

    found = ahead_of_live(db, lane.live)
    history_done = db.run(
        "SELECT count(*) FROM image_generation_records"
        " WHERE id < :live AND archive_status = 'SUCCEEDED'",
        live=LIVE_FROM,
    )[0][0]
    waits = dict(
        db.run(
            "SELECT r.id, EXTRACT(EPOCH FROM u.at - r.archive_enqueued_at)"
            " FROM image_generation_records AS r JOIN image_archive_uploads AS u"
            " ON u.record_id = r.id AND u.state = 'done' WHERE r.id >= :f",
            f=LIVE_FROM,
        )
    )
    print(f"history archived {history_done}; each live record: (history, live) uploads ahead")
    print({i - LIVE_FROM: found[i] for i in lane.live})
    print("live waits (s), alone:", [round(float(waits[i]), 2) for i in lane.live[:alone]])
    print("live waits (s), with backfill:", [round(float(waits[i]), 2) for i in lane.live[alone:]])
    without = [found[i] for i in lane.live[:alone]]
    during = [found[i] for i in lane.live[alone:]]
    assert len(during) >= 10
    assert all(history == 0 for history, _ in without)
    # With the backfill, a live record finds at most a few uploads of history ahead of it.
    assert max(history for history, _ in during) <= AHEAD, during
    # And the backfill did get the room live demand leaves it: in the 2-second window
    # (three, with Lsky's whole seconds), live demand (three or four) and its margin (two)
    # leave history one upload at most.
    assert history_done >= 1, err
    assert "pacing: 6/2 s allowed, live uses ~" in err  # the 2-second window binds
