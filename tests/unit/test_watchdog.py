"""The watchdogs' keeper (lib.platform.watchdog): one thread shuts each watched socket at
its deadline; a cancelled or moved deadline never fires early. Real sockets, real time
(short deadlines), no timed assertions: the test waits for what must happen."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from lib.platform import watchdog as watchdog_module
from lib.platform.watchdog import Watchdog
from tests.support import HANG_SECONDS


class Conn:
    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def _wait_fired(dog: Watchdog) -> bool:
    waited_until = time.monotonic() + HANG_SECONDS
    while not dog.fired and time.monotonic() < waited_until:
        time.sleep(0.005)
    return dog.fired


def test_a_passed_deadline_shuts_the_socket(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    dog = Watchdog(Conn(ours), time.monotonic() - 1)
    assert _wait_fired(dog)
    assert theirs.recv(10) == b""  # shut down: the blocked reader on our side wakes too


def test_a_cancelled_watchdog_never_fires(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    cancelled = Watchdog(Conn(ours), time.monotonic() + 0.05)
    cancelled.cancel()
    later = Watchdog(None, time.monotonic() + 0.1)  # due after the cancelled one
    assert _wait_fired(later)
    assert not cancelled.fired
    ours.sendall(b"ok")
    assert theirs.recv(10) == b"ok"


def test_a_moved_deadline_fires_when_moved_to() -> None:
    moved_later = Watchdog(None, time.monotonic() + 0.05)
    moved_later.rearm(time.monotonic() + 3600)
    moved_sooner = Watchdog(None, time.monotonic() + 3600)
    moved_sooner.rearm(time.monotonic() + 0.1)  # sooner than what the keeper waits for
    assert _wait_fired(moved_sooner)
    assert not moved_later.fired
    moved_later.cancel()


def test_cancelled_entries_do_not_pile_up() -> None:
    keeper = watchdog_module._KEEPER
    for _ in range(1000):
        Watchdog(None, time.monotonic() + 3600).cancel()
    assert len(keeper._due) <= 2 * len(keeper._armed) + 65


def test_a_forked_child_keeps_its_deadlines() -> None:
    Watchdog(None, time.monotonic() + 3600).cancel()  # the keeper's thread is running
    child = os.fork()
    if child == 0:  # the keeper's thread did not come along: arming starts a new one
        os._exit(0 if _wait_fired(Watchdog(None, time.monotonic() - 1)) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_never_fires_its_parent_s_deadlines() -> None:
    # A deadline armed in the parent before the fork: the child's keeper must leave it (its
    # socket, shared by both processes, is the parent's to shut), and the parent's fires.
    parents = Watchdog(None, time.monotonic() + 0.3)
    child = os.fork()
    if child == 0:
        _wait_fired(Watchdog(None, time.monotonic() - 1))  # the child's keeper runs
        time.sleep(0.6)
        os._exit(1 if parents.fired else 0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _wait_fired(parents)
