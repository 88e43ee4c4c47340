"""What the docs say of `make local` is what it does: each sample names the run it shows,
the records they point at are the ones the scenario gives those ids, the exit codes are
the demo's, and the handlers are as small as the code map says."""

from __future__ import annotations

import re

from devkit.demo import run, scenario
from tests.docs.markdown import CODE_MAP, LOCAL_RUN, ROOT, read, samples
from tests.docs.samples import commands


def test_every_make_local_sample_names_the_run_it_shows() -> None:
    """The README's summary was the short run's under a bare `make local` (24 records)."""
    found = [s for s in samples() if s.name.startswith("make-local")]
    assert len(found) >= 2, found
    for sample in found:
        runs = [command for command, _ in commands(sample.body)]
        assert runs, f"{sample.doc}: sample {sample.name} does not say which run it shows"
        assert all(command.startswith("make local") for command in runs), runs
        if "--short" in runs[0]:
            records = re.search(r"^\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s", sample.body, re.M)
            assert records is None or int(records.group(1)) == scenario.SHORT.records


def test_the_records_the_docs_point_at_are_the_scenario_s() -> None:
    """`archive-ctl show 7`, the stale one: the docs once sent readers to record 5 (the
    broken one) for the sweeper's takeover."""
    text = " ".join(read(LOCAL_RUN).split())
    pointed = re.findall(r"`archive-ctl show (\d+)`, the ([\w-]+) one", text)
    assert len(pointed) >= 3, pointed
    for profile in (scenario.SHORT, scenario.NORMAL):
        kinds = {sample.record_id: str(sample.kind) for sample in scenario.plan(profile.records)}
        for record_id, kind in pointed:
            assert kinds[int(record_id)] == kind, (record_id, kind, kinds[int(record_id)])


def test_the_demo_s_exit_codes_are_the_ones_the_docs_give() -> None:
    text = " ".join(read(LOCAL_RUN).split())
    said = re.search(
        r"Exit codes: (\d+) when every record concluded, (\d+) on timeout or a failure to "
        r"start, (\d+) after Ctrl-C \(or SIGTERM\) during the run",
        text,
    )
    assert said, f"{LOCAL_RUN}'s exit codes of make local"
    assert tuple(map(int, said.groups())) == (run.EXIT_OK, run.EXIT_FAILED, run.EXIT_INTERRUPTED)
    # --keep's Ctrl-C ends a finished run: tests/test_local_demo.py sees it exit 0.
    assert "With `--keep`, the Ctrl-C that stops the kept services" in text


def test_the_handlers_are_as_small_as_the_code_map_says() -> None:
    text = " ".join(read(CODE_MAP).split())
    said = re.search(r"the three Lambda entries, under (\d+) lines each", text)
    assert said, "the code map's handlers row"
    for handler in ("archive.py", "sweeper.py", "auditor.py"):
        lines = len((ROOT / "src" / "handlers" / handler).read_text().splitlines())
        assert lines < int(said.group(1)), (handler, lines)
