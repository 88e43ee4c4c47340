"""Threads kept for the container's next task (a relayed upload, an original's write):
starting a thread waits for a CPU to run it on, and the CPUs are busy with the transfer.
A forked child starts its own (its parent's threads are not in it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class KeptThreads:
    """At most `workers` tasks at a time, each on a kept thread named `name`-N."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        self._executor = self._new()
        os.register_at_fork(after_in_child=self._reset)

    def submit(self, task: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self._executor.submit(task, *args, **kwargs)

    def _reset(self) -> None:
        self._executor = self._new()

    def _new(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name)
