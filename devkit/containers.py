"""Lambda execution environments for local runs: one spawned process per container.

A container imports its handler once (Lambda's init phase) and then runs one
invocation at a time, like the real thing. That matters: the archive handler keeps
per-container state (Powertools' BatchProcessor, the cached worker and its database
connection) that is not thread-safe, so two concurrent slots must be two processes,
never two threads. "spawn" gives each one a fresh interpreter, as a cold start does.

Everything the handler prints (Powertools JSON logs, EMF metrics) goes to the
container's log file; the lines printed during an invocation also come back with its
result, so the caller can show what happened without parsing files.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TextIO

from devkit.context import LambdaContext
from devkit.sqs import DEFAULT_REGION

__all__ = ["Container", "ContainerDied", "Invocation"]

_READY_TIMEOUT = 60.0
_POLL = 0.05


@dataclass(frozen=True)
class Invocation:
    """One invocation's outcome. `error` is set for a function error (the handler raised)."""

    response: Any
    error: str | None
    logs: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: float = 0.0


class ContainerDied(RuntimeError):
    """The container process exited or stopped answering."""


class _Capture(io.TextIOBase):
    """stdout of a container: everything to the log file, and the complete lines
    written during an invocation kept for its result."""

    def __init__(self, sink: TextIO) -> None:
        self._sink = sink
        self._lines: list[str] | None = None
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._sink.write(text)
        if self._lines is not None:
            *complete, self._partial = (self._partial + text).split("\n")
            self._lines += complete
        return len(text)

    def flush(self) -> None:
        self._sink.flush()

    def begin(self) -> None:
        self._lines, self._partial = [], ""

    def end(self) -> list[dict[str, Any]]:
        lines, self._lines = self._lines or [], None
        parsed = []
        for line in [*lines, self._partial]:
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    parsed.append(value)
        self.flush()
        return parsed


@dataclass(frozen=True)
class _Spec:
    """What a container process needs; pickled across the spawn."""

    handler: str
    env: dict[str, str]
    log_path: str
    function_name: str
    timeout_seconds: float


def _serve(conn: Connection, spec: _Spec) -> None:
    """The container process: init once, then invoke until told to stop (None)."""
    # The parent shuts containers down in order; a terminal's Ctrl-C (sent to the
    # whole process group) must not kill one mid-invocation.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(spec.env)
    with Path(spec.log_path).open("a", encoding="utf-8", buffering=1) as log:
        capture = _Capture(log)
        # Before the handler's import: Powertools binds its log stream to sys.stdout then.
        sys.stdout = capture
        sys.stderr = log
        try:
            module_name, _, attribute = spec.handler.partition(":")
            handler = getattr(importlib.import_module(module_name), attribute)
        except Exception:
            conn.send(("init-error", traceback.format_exc()))
            return
        conn.send(("ready", os.getpid()))
        while True:
            try:
                event = conn.recv()
            except EOFError:
                return  # the parent went away
            if event is None:
                return
            context = LambdaContext(
                function_name=spec.function_name,
                timeout_seconds=spec.timeout_seconds,
                region=os.environ.get("AWS_REGION", DEFAULT_REGION),
            )
            started = time.monotonic()
            capture.begin()
            try:
                response, error = handler(event, context), None
            except Exception as exc:
                traceback.print_exc(file=log)
                response, error = None, f"{type(exc).__name__}: {str(exc)[:300]}"
            logs = capture.end()
            elapsed = round((time.monotonic() - started) * 1000, 1)
            conn.send(Invocation(response, error, logs, elapsed))


class Container:
    """A handler in its own process; `invoke` blocks until the invocation ends."""

    def __init__(
        self,
        name: str,
        handler: str,
        *,
        env: dict[str, str],
        log_path: Path,
        function_name: str,
        timeout_seconds: float,
    ) -> None:
        """handler: "module:function", e.g. "handlers.archive:lambda_handler"."""
        self.name = name
        self.handler = handler
        self.env = dict(env)
        self.log_path = log_path
        self.function_name = function_name
        self.timeout_seconds = timeout_seconds
        self.invocations = 0
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # one invocation at a time, whoever calls

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def launch(self) -> None:
        """Start the process (init runs in the background; `wait_ready` waits for it)."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=_serve,
            args=(
                child,
                _Spec(
                    self.handler,
                    self.env,
                    str(self.log_path),
                    self.function_name,
                    self.timeout_seconds,
                ),
            ),
            name=self.name,
            daemon=True,
        )
        # Ignored signals survive exec: the new interpreter starts with SIGINT ignored,
        # so Ctrl-C during its imports cannot kill it before _serve takes over.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        child.close()
        self._process, self._conn = process, parent

    def wait_ready(self, timeout: float = _READY_TIMEOUT) -> None:
        conn = self._require_conn()
        if not conn.poll(timeout):
            self.stop()
            raise ContainerDied(f"{self.name}: no answer from the container within {timeout:.0f}s")
        try:
            kind, detail = conn.recv()
        except EOFError:
            self.stop()
            raise ContainerDied(f"{self.name}: exited during init (see {self.log_path})") from None
        if kind != "ready":
            self.stop()
            raise ContainerDied(f"{self.name}: init failed:\n{detail}")

    def start(self) -> Container:
        self.launch()
        self.wait_ready()
        return self

    def invoke(self, event: Any, *, stop: threading.Event | None = None) -> Invocation | None:
        """Run one invocation. None when `stop` was set before it ended (abandoned).
        A container that dies or runs past its timeout is replaced, as Lambda resets
        the environment, and the invocation counts as a function error."""
        with self._lock:
            conn = self._require_conn()
            self.invocations += 1
            started = time.monotonic()
            try:
                conn.send(event)
                return self._await(conn, started + self.timeout_seconds + 5, stop)
            except (ContainerDied, EOFError, OSError) as error:
                if stop is not None and stop.is_set():
                    return None  # shutting down: no replacement container
                self._restart()
                elapsed = round((time.monotonic() - started) * 1000, 1)
                return Invocation(None, f"container failure: {error}", [], elapsed)

    def _await(
        self, conn: Connection, deadline: float, stop: threading.Event | None
    ) -> Invocation | None:
        while not conn.poll(_POLL):
            if stop is not None and stop.is_set():
                return None
            if not self.alive or time.monotonic() > deadline:
                raise ContainerDied(f"{self.name}: died or timed out")
        result: Invocation = conn.recv()
        return result

    def _restart(self) -> None:
        self.stop()
        self.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the process to exit, then terminate, then kill: nothing is left running."""
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        if process is None:
            return
        if conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        process.join(timeout)
        if process.is_alive():
            process.terminate()
            process.join(2)
        if process.is_alive():
            process.kill()
            process.join(2)
        if conn is not None:
            conn.close()

    def _require_conn(self) -> Connection:
        if self._conn is None:
            raise ContainerDied(f"{self.name}: not started")
        return self._conn
