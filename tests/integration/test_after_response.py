"""Completion events published after the response, before the freeze: the archive handler
run by AWS's own runtime interface client (awslambdaric, in a process of its own: one
container) against devkit's Runtime and Extensions API, PutEvents through devkit's
EventBridge gate to moto, whose rule delivers to an SQS queue (the consumer)."""

# The fixtures of test_completion_events (bus, gate, events_on) are imported, then named.
# ruff: noqa: F811

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.eventbridge import Behaviour, EventBridgeGate
from devkit.lambda_runtime import Invocation, LambdaRuntimeStandIn
from lib.archive.message import encode
from lib.platform.after_response import NAME
from tests.integration.test_completion_events import (  # noqa: F401 - its fixtures too
    Bus,
    _gate_server,
    bus,
    events_on,
    gate,
    outbox,
)
from tests.integration.world import World
from tests.support import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[2]


class Container:
    """One awslambdaric process serving the stand-in's invocations."""

    def __init__(self, api: LambdaRuntimeStandIn, world: World, log: Path) -> None:
        self.api = api
        self.world = world
        self.log = log

    def invoke(self, record_id: int, *, timeout_seconds: float = 30.0) -> Invocation:
        """Record `record_id`'s message sent, received and invoked; returns at once."""
        harness = self.world.archive
        harness.send(encode(record_id))
        event = harness.receive()
        assert len(event["Records"]) == 1, "the message did not arrive"
        return self.api.invoke(event, timeout_seconds=timeout_seconds)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def container(world: World, tmp_path: Path) -> Iterator[Callable[..., Container]]:
    started: list[tuple[subprocess.Popen[bytes], LambdaRuntimeStandIn, Any]] = []

    def start(*, refuse_registration: bool = False) -> Container:
        api = LambdaRuntimeStandIn(refuse_registration=refuse_registration).start()
        env = {
            **os.environ,
            "AWS_LAMBDA_RUNTIME_API": api.address,
            "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        }
        log = tmp_path / f"container-{len(started)}.log"
        out = log.open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "awslambdaric", "handlers.archive.lambda_handler"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        started.append((process, api, out))
        return Container(api, world, log)

    yield start
    for process, api, out in started:
        process.kill()
        process.wait(timeout=HANG_SECONDS)
        out.close()
        api.stop()


def answered(invocation: Invocation, container: Container) -> None:
    assert invocation.answered.wait(HANG_SECONDS), container.output()[-3000:]


def released(invocation: Invocation, container: Container) -> None:
    assert invocation.done.wait(HANG_SECONDS), container.output()[-3000:]


def when_answered(invocation: Invocation) -> threading.Event:
    """Set once the runtime posted the invocation's response."""
    opened = threading.Event()

    def wait() -> None:
        invocation.answered.wait(HANG_SECONDS)
        opened.set()

    threading.Thread(target=wait, daemon=True).start()
    return opened


@pytest.fixture
def on(events_on: World, gate: EventBridgeGate) -> World:
    return events_on


def test_the_response_goes_out_before_putevents_answers_and_the_freeze_after_it(
    on: World, bus: Bus, gate: EventBridgeGate, container: Callable[..., Container]
) -> None:
    """A quiet lane's only message: its event is published in its own invocation, after
    the response (which PutEvents, held until then, cannot delay) and before the
    extension lets Lambda freeze the container; the next claim notes the publication."""
    world = on
    box = container()
    world.record(1)
    opened = threading.Event()
    gate.script(Behaviour.held(opened))
    first = box.invoke(1)
    opened_by = when_answered(first)
    threading.Thread(target=lambda: opened.set() if opened_by.wait(HANG_SECONDS) else None).start()
    answered(first, box)
    assert first.response == {"batchItemFailures": []}
    released(first, box)
    assert "not published" not in box.output()
    [answer] = gate.answered
    assert first.responded is not None
    assert first.released is not None
    assert first.responded < answer < first.released
    [event] = bus.received(1)
    assert event["detail"]["recordId"] == "1"
    assert list(box.api.extensions.values()) == [NAME]
    # Published for good: the container's next claim deletes it from the outbox.
    world.record(2)
    second = box.invoke(2)
    released(second, box)
    assert [r["record_id"] for r in outbox(world.db)] == [2]
    bus.received(1)


@pytest.mark.parametrize("behaviour", ["failing", "hanging"])
def test_putevents_failing_or_hanging_delays_neither_the_response_nor_the_release(
    on: World,
    bus: Bus,
    gate: EventBridgeGate,
    container: Callable[..., Container],
    behaviour: str,
) -> None:
    world = on
    box = container()
    world.record(3)
    never = threading.Event()
    gate.script(
        Behaviour.failed() if behaviour == "failing" else Behaviour.held(never, deliver=False)
    )
    invocation = box.invoke(3)
    answered(invocation, box)
    assert invocation.response == {"batchItemFailures": []}
    released(invocation, box)
    assert invocation.released_ms is not None
    assert invocation.released_ms < invocation.deadline_ms
    assert len(gate.calls) == 1
    assert gate.answered == ([] if behaviour == "hanging" else gate.answered[:1])
    never.set()
    # Not published: the outbox keeps it for the sweeper.
    assert [r["record_id"] for r in outbox(world.db)] == [3]
    bus.received(0)


def test_a_handler_that_raised_still_releases_the_extension(
    on: World, gate: EventBridgeGate, container: Callable[..., Container]
) -> None:
    """An event the batch processor cannot read raises out of the handler: the runtime
    posts the error, and the extension is back in its next long before the deadline."""
    box = container()
    invocation = box.api.invoke({"Records": "not a list"}, timeout_seconds=4 * HANG_SECONDS)
    answered(invocation, box)
    assert invocation.error is not None
    assert invocation.response is None
    released(invocation, box)
    assert gate.calls == []


def test_a_refused_registration_publishes_before_the_response(
    on: World, bus: Bus, gate: EventBridgeGate, container: Callable[..., Container]
) -> None:
    world = on
    box = container(refuse_registration=True)
    world.record(4)
    invocation = box.invoke(4)
    released(invocation, box)
    assert invocation.response == {"batchItemFailures": []}
    assert box.api.extensions == {}
    assert [s for s, _ in box.api.registrations] == [500]
    [answer] = gate.answered
    assert invocation.responded is not None
    assert answer < invocation.responded
    bus.received(1)
    assert "could not register the after-response extension" in box.output()


def test_events_off_registers_nothing(world: World, container: Callable[..., Container]) -> None:
    box = container()
    world.record(5)
    invocation = box.invoke(5)
    released(invocation, box)
    assert invocation.response == {"batchItemFailures": []}
    assert box.api.registrations == []
    assert world.state(5) == ("SUCCEEDED", 1)


def test_a_setting_read_at_init_is_warned_about_once_a_container(
    on: World, bus: Bus, container: Callable[..., Container], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registration (at init) and the first invocation's worker read the settings
    once between them: an invalid one falls back to its default with one warning."""
    monkeypatch.setenv("ARCHIVE_MAX_IMAGE_BYTES", "lots")
    box = container()
    on.record(6)
    invocation = box.invoke(6)
    released(invocation, box)
    assert on.state(6) == ("SUCCEEDED", 1)
    assert [status for status, _ in box.api.registrations] == [200]
    assert box.output().count("invalid ARCHIVE_MAX_IMAGE_BYTES='lots'") == 1, box.output()


def test_an_extension_registers_only_during_init_and_for_invoke_only() -> None:
    """The stand-in keeps the Extensions API's rules the extension relies on, and a
    registration refused after init leaves the handler publishing before it returns."""
    from lib.platform.after_response import AfterResponse

    with LambdaRuntimeStandIn() as api:
        assert api._register("x", {"events": ["INVOKE", "SHUTDOWN"]})[0] == 400
        assert api._register("x", {"events": []})[0] == 400
        api._init_over = True
        assert AfterResponse.register(api.address) is None
        assert [status for status, _ in api.registrations] == [403]
        assert api.extensions == {}
