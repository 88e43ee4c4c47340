"""The bench plumbing that is not timing: process memory readers and the table."""

from __future__ import annotations

from typing import Any

import pytest
from bench.common import Row, peak_rss, reset_peak_rss, rss
from bench.lane import greedy_schedule
from bench.migrate import window
from bench.run import render


def test_memory_readers_see_an_allocation() -> None:
    reset_peak_rss()
    before = rss()
    block = b"\x01" * (32 * 1024 * 1024)  # written, so resident
    assert peak_rss() >= before + 30 * 1024 * 1024
    del block
    if reset_peak_rss():
        assert peak_rss() < before + 30 * 1024 * 1024


def test_render_has_one_row_per_result_and_each_command_once() -> None:
    rows = [
        Row("1", "a", "1 MB", "<= 2 MB", True, "cmd one"),
        Row("1", "b", "3 MB", "<= 2 MB", False, "cmd one"),
        Row("3", "c", "5 ms", "reported", None, "cmd two"),
    ]
    table = render(rows, "header")
    assert "| 1 | a | 1 MB | <= 2 MB | PASS |" in table
    assert "| 1 | b | 3 MB | <= 2 MB | FAIL |" in table
    assert "| 3 | c | 5 ms | reported | info |" in table
    assert table.count("`cmd one`") == 1
    assert table.count("`cmd two`") == 1


def test_the_migrate_bench_counts_every_statement_that_overlapped_the_run() -> None:
    samples = [(0.0, 1.0), (4.0, 0.5), (9.0, 2.0), (10.5, 0.1), (12.0, 0.1)]
    # Started before and still waiting; inside; started inside and ending after.
    assert window(samples, start=0.5, end=10.0) == [1.0, 0.5, 2.0]


def test_the_lane_s_minimum_counts_lsky_s_whole_seconds() -> None:
    # Two per 10 s from 0.9 s past a second: the first pair leaves the window when second
    # 0 + 10 + 1 begins (10.1 s later), not 10 s after it went.
    assert greedy_schedule(4, [(10.0, 2)], start=1000.9) == pytest.approx([0, 0, 10.1, 10.1])
    assert greedy_schedule(3, [(10.0, 1)], concurrency=1, transfer=0.5, start=1000.0) == [
        0.0,
        11.0,
        22.0,
    ]


def test_the_history_bench_s_plans_run_the_statements_as_they_are_now(db: Any, pg_dsn: str) -> None:
    # The bench EXPLAINs the archive path's statements with parameters of its own: a
    # statement that gains one must not break `make bench` at its last bench.
    from bench.history import archive_path_plans

    db.run("INSERT INTO users (id, username) VALUES (1, 'bench')")
    plans = archive_path_plans(pg_dsn)
    # Each statement ran (an empty table may well be read whole: the bench asks with
    # 10,000,000 events, where the plan matters).
    assert set(plans) == {"claim", "take_lost", "date_undated"}
