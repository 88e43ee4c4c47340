"""`make local` (python -m devkit.demo) as a user runs it: a subprocess, real services.

The short mode is what CI runs: it must conclude every record (within its own bound, the
short profile's timeout) and print the summary the scenario predicts. Ctrl-C must leave
nothing running. How long a run takes is not asserted: a busy machine only makes it slower.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devkit.demo import report, run, scenario
from tests.docs.markdown import samples
from tests.docs.samples import commands, mismatch, scrub
from tests.support import HANG_SECONDS

REPO_ROOT = Path(__file__).resolve().parent.parent
# A line the demo prints when an invocation concluded a record: "#7    archived ...".
OUTCOME_LINE = re.compile(r"#\d+\s{2,}\S")
pytestmark = pytest.mark.slow


def demo_command(tmp_path: Path, *args: str) -> list[str]:
    command = [sys.executable, "-m", "devkit.demo", "--data-dir", str(tmp_path / "run"), *args]
    if os.environ.get("TEST_DATABASE_URL"):
        command += ["--database-url", os.environ["TEST_DATABASE_URL"]]
    return command


def demo_env() -> dict[str, str]:
    # The demo sets up its own AWS environment; nothing from the test session leaks in.
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ARCHIVE_", "LSKY_"))}


def test_short_mode_archives_everything_and_prints_the_summary(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        demo_command(tmp_path, "--short", "--summary-json", str(summary_path)),
        cwd=REPO_ROOT,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=scenario.SHORT.timeout + HANG_SECONDS,  # the demo gives up by itself first
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    expected = scenario.Expected.of(scenario.plan(scenario.SHORT.records))
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    assert summary["completed"] is True
    assert summary["function_errors"] == 0
    assert summary["records"] == scenario.SHORT.records
    assert (summary["archived"], summary["failed"]) == (expected.archived, expected.failed)
    assert summary["retried"] == expected.retried
    assert summary["dlq"] == expected.dlq
    assert summary["swept"] == expected.swept

    out = result.stdout
    # The table, as printed.
    header = re.search(
        r"^\s+records\s+archived\s+retried\s+failed\s+DLQ\s+re-sent by sweeper\s+time$", out, re.M
    )
    assert header, out
    numbers = out[header.end() :].splitlines()[1].split()
    assert numbers[:6] == [
        str(n)
        for n in (
            scenario.SHORT.records,
            expected.archived,
            expected.retried,
            expected.failed,
            expected.dlq,
            expected.swept,
        )
    ]
    # A line per event: each kind of outcome shows up.
    for text in ("archived     attempt 1/3", "retry in 1 s", "FAILED", "malformed"):
        assert text in out, text
    # The sweeper's lines: one sweep may find both of its rows, or each a sweep of its own.
    resent = [int(n) for n in re.findall(r"re-sent (\d+) ", out)]
    assert sum(resent) == expected.swept > 0, out
    # The archived files exist where the summary says, with the upstream's bytes.
    assert len(summary["files"]) == expected.archived
    for item in summary["files"]:
        path = Path(item["path"])
        assert path.is_file(), path
        assert str(path) in out
        sample = next(
            s for s in scenario.plan(scenario.SHORT.records) if s.record_id == item["record_id"]
        )
        assert path.read_bytes() == sample.body()
    assert {f["record_id"] for f in summary["failures"]} == {
        s.record_id for s in scenario.plan(scenario.SHORT.records) if s.kind in scenario.FAILS
    }
    assert_doc_samples(out, tmp_path / "run")


def assert_doc_samples(out: str, data_dir: Path) -> None:
    """The docs' samples of `make local ARGS=--short` (README's summary, the output in
    docs/getting-started/local-run.md) are lines this run printed. Which container took a
    record and the order of concurrent lines vary, so each line is looked for anywhere."""
    shown = re.sub(r"archive-\d", "archive-N", scrub(out, data_dir=str(data_dir)))
    found = [s for s in samples() if s.name.startswith("make-local")]
    assert len(found) >= 2, found
    for sample in found:
        runs = commands(sample.body)
        assert runs, (sample.doc, sample.name, "names no run")
        for command, printed in runs:
            assert command == "make local ARGS=--short", (sample.name, command)
            lines = re.sub(r"archive-\d", "archive-N", printed)
            assert mismatch(lines, shown, ordered=False) is None, (sample.doc, sample.name)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(f"{cmdline.parent.name}: {args}")
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process check reads /proc")
@pytest.mark.parametrize("target", ["process", "terminal"])
def test_ctrl_c_stops_everything_it_started(tmp_path: Path, target: str) -> None:
    """`terminal`: SIGINT to the whole process group, as a terminal's Ctrl-C does (the
    containers get it too); `process`: to the demo alone, as `kill -INT` does."""
    process = subprocess.Popen(
        demo_command(tmp_path, "--records", "60"),
        cwd=REPO_ROOT,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        seeded = False
        for line in process.stdout:
            lines.append(line)
            seeded = seeded or " seed " in line
            if seeded and OUTCOME_LINE.search(line):
                break  # mid-run: a record concluded, others in flight, the sweeper scheduled
        if target == "terminal":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=HANG_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(lines) + rest
    assert process.returncode == run.EXIT_INTERRUPTED, output
    assert "summary (interrupted)" in output  # stopped by Ctrl-C, not by finishing

    ports = [int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)", output)]
    cluster = re.search(r"127\.0\.0\.1:(\d+) \(throwaway cluster\)", output)
    if cluster:
        ports.append(int(cluster.group(1)))
        assert not _processes_mentioning(f"-p {cluster.group(1)} "), "postgres still running"
    assert len(ports) >= 3, output  # sqs, lsky, upstream (+ postgres)
    assert [p for p in ports if _port_open(p)] == []
    pids = [int(p) for p in re.findall(r"pid (\d+)", output)]
    assert len(pids) == 3, output  # two archive containers and the sweeper's
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []


def test_the_scenario_covers_every_path_in_short_mode() -> None:
    kinds = {s.kind for s in scenario.plan(scenario.SHORT.records)}
    assert {
        scenario.Kind.SLOW,
        scenario.Kind.FLAKY,
        scenario.Kind.GONE,
        scenario.Kind.BROKEN,
    } <= kinds
    assert {scenario.Kind.LOST, scenario.Kind.STALE} <= kinds
    assert scenario.plan(30)[-1].kind is scenario.Kind.OK
    assert [s.record_id for s in scenario.plan(5)] == [1, 2, 3, 4, 5]


def test_progress_lines_for_each_outcome() -> None:
    line = report.describe_log(
        {"outcome": "retry", "record_id": "7", "retry_in_seconds": 2, "error": "boom"}
    )
    assert line == "#7    retry in 2 s  boom"
    assert report.describe_log({"message": "archive started", "level": "INFO"}) is None
    assert report.describe_log({"message": "odd", "level": "WARNING", "record_id": "3"}) == (
        "#3    warning      odd"
    )


# ---------------------------------------------------------------- services kept running


def _held(command: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """Start a command that keeps services running; its output up to where it holds them."""
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if line.startswith("Ctrl-C here"):
            return process, "".join(lines)
    process.wait(timeout=HANG_SECONDS)
    raise AssertionError(
        f"it never held its services (exit {process.returncode}):\n{''.join(lines)}"
    )


def _exports(output: str) -> dict[str, str]:
    return dict(re.findall(r"^  export (\w+)='([^']*)'$", output, re.M))


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=HANG_SECONDS)
    return rest


def _archive_ctl(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lib.cli", *argv],
        cwd=REPO_ROOT,
        env={**demo_env(), **env, "PYTHONPATH": str(REPO_ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )


def test_keep_leaves_the_services_running_for_archive_ctl_until_ctrl_c(tmp_path: Path) -> None:
    process, output = _held(demo_command(tmp_path, "--short", "--keep"), demo_env())
    try:
        assert re.search(r"^\s+records\s+archived", output, re.M), "the summary comes first"
        env = _exports(output)
        assert {
            "DATABASE_URL",
            "ARCHIVE_QUEUE_URL",
            "AWS_ENDPOINT_URL_SQS",
            "LSKY_BASE_URL",
        } <= set(env)
        failed = next(s for s in scenario.plan(scenario.SHORT.records) if s.kind in scenario.FAILS)
        assert f"scripts/archive-ctl show {failed.record_id}" in output

        shown = _archive_ctl(env, "show", str(failed.record_id))
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.startswith(f"record {failed.record_id}: FAILED")
        assert re.search(r"#\d+\s+failed\s+by archive function: ", shown.stdout), shown.stdout
        status = _archive_ctl(env, "status")
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        rest = _stop(process) if process.poll() is None else ""
    assert process.returncode == run.EXIT_OK, output + rest
    ports = [int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)", output)]
    assert ports
    assert [p for p in ports if _port_open(p)] == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _local_env_json(tmp_path: Path) -> Path:
    """env.json with its three ports moved to free ones (the suite shares the machine)."""
    text = (REPO_ROOT / "env.json").read_text()
    for port in ("5432", "5000", "8080"):
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{_free_port()}")
    path = tmp_path / "env.json"
    path.write_text(text)
    return path


def _invoke(env_json: Path, function: str, event: str) -> dict[str, Any]:
    """What `sam local invoke FUNCTION -e EVENT --env-vars ENV_JSON` runs, without its
    container: the handler, with exactly the variables env.json gives the function."""
    module = {"ArchiveFunction": "archive", "SweeperFunction": "sweeper"}[function]
    variables = {k: v for k, v in json.loads(env_json.read_text())[function].items() if v}
    env = {
        **demo_env(),
        **variables,
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_REGION": "us-east-1",  # the Lambda runtime's
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{REPO_ROOT}",
    }
    code = (
        "import json, sys\n"
        f"from handlers.{module} import lambda_handler\n"
        "from devkit.context import LambdaContext\n"
        "event = json.load(open(sys.argv[1]))\n"
        f"context = LambdaContext(function_name={function!r})\n"
        "print('RESPONSE ' + json.dumps(lambda_handler(event, context)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO_ROOT / "events" / event)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESPONSE ")]
    assert lines, done.stdout + done.stderr
    response: dict[str, Any] = json.loads(lines[-1].removeprefix("RESPONSE "))
    return response


def test_make_services_serves_what_env_json_names_so_the_handlers_run_with_it(
    tmp_path: Path,
) -> None:
    env_json = _local_env_json(tmp_path)
    command = [sys.executable, "-m", "devkit.demo.stack", "--env-json", str(env_json)]
    process, output = _held(command, demo_env())
    try:
        assert _invoke(env_json, "ArchiveFunction", "archive_sqs.json") == {"batchItemFailures": []}
        summary = _invoke(env_json, "SweeperFunction", "sweeper_schedule.json")
        assert summary["stop_reason"] == "done"
        shown = _archive_ctl(_exports(output), "show", "123")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.startswith("record 123: SUCCEEDED")
    finally:
        rest = _stop(process) if process.poll() is None else ""
    assert process.returncode == 0, output + rest
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", env_json.read_text())]
    assert [p for p in set(ports) if _port_open(p)] == []


def test_make_services_reads_its_ports_and_names_from_env_json() -> None:
    from devkit.demo.stack import layout_of

    env = json.loads((REPO_ROOT / "env.json").read_text())
    layout = layout_of(env)
    assert (layout.postgres_port, layout.moto_port, layout.lsky_port) == (5432, 5000, 8080)
    assert (layout.database, layout.queue, layout.dlq) == (
        "image_archive",
        "image-archive-queue",
        "image-archive-dlq",
    )
    assert (layout.bucket, layout.lsky_token) == ("image-archive-staging", "1|local-test-token")
    env["ArchiveFunction"]["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:5001"
    with pytest.raises(ValueError, match="one moto server"):
        layout_of(env)
