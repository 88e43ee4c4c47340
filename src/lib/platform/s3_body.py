"""A PUT's body read straight from the spool the upload reads (lib.transfer.held, relay):
nothing is copied into a part buffer, its SHA-256 is taken once as the bytes pass, and
another thread can cut the request under way (`Cut`): its socket is shut, nothing retried.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from lib.platform.errors import ServiceError
from lib.platform.watchdog import Watchdog, active

# What one read of the body hands botocore at most (http.client asks for 8-16 KiB).
BODY_READ_BYTES = 256 * 1024


class Readable(Protocol):
    """Bytes at an offset as they become available: a spool, or a download landing in one.
    `read_at` returns b"" only at the end and raises when the source failed."""

    @property
    def size(self) -> int: ...

    def read_at(self, offset: int, size: int) -> bytes: ...


class BodyCut(ServiceError):
    """The body was not sent whole: cut by another thread, or its source failed."""


class Cut:
    """Lets another thread cut a call under way: once cut, the call's watchdog fires (its
    socket is shut, and botocore's retry hook sees it fired) and its body reads no more.
    `sent`: the whole request has gone out (S3 may store it, whatever is cut after), with
    the body's SHA-256 (`sha256`; none for a copy); `moved` is set then (and by whoever
    else waits on it: the write's end)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchdog: Watchdog | None = None
        self.done = False
        self.sealed = False
        self.sent = False
        self.sha256: str | None = None
        self.moved = threading.Event()

    def went_whole(self, sha256: str | None = None) -> None:
        """The request's last byte has gone out (a body's: its SHA-256)."""
        self.sha256 = sha256
        self.sent = True
        self.moved.set()

    def seal(self) -> None:
        """The body reads no more and the request is not sent again, its socket left open
        for S3's answer: its source is about to be released."""
        with self._lock:
            self.sealed = True
            if self._watchdog is not None:
                self._watchdog.no_retry = True

    def watch(self, watchdog: Watchdog) -> None:
        """The call's watchdog (set on the calling thread, inside `watched`)."""
        with self._lock:
            self._watchdog = watchdog
            if self.done:
                watchdog.fire_now()
            watchdog.no_retry = self.sealed

    def __call__(self) -> None:
        with self._lock:
            self.done = True
            if self._watchdog is not None:
                self._watchdog.fire_now()


class StreamedBody:
    """The whole of `source` as a file botocore reads (a known length, seekable to the
    start for a retry). The digest passes each byte once, in order: a retry reads them
    again without hashing them twice. `failure`: why it stopped short, if it did."""

    def __init__(self, source: Readable, digest: Any, cut: Cut) -> None:
        self._source = source
        self._digest = digest
        self._cut = cut
        self._at = 0
        self.hashed = 0  # bytes [0, hashed) have passed the digest
        self.failure: str | None = None

    def __len__(self) -> int:
        return self._source.size

    def read(self, size: int = -1) -> bytes:
        """At most BODY_READ_BYTES (a raw file's read may give fewer than asked)."""
        at, end = self._at, self._source.size
        want = min(end - at, BODY_READ_BYTES if size < 0 else min(size, BODY_READ_BYTES))
        if want <= 0:
            return b""
        try:
            data = self._next(at, want)
        except Exception as error:
            self.failure = str(error) if isinstance(error, ServiceError) else type(error).__name__
            _give_up()
            raise
        if at <= self.hashed < at + len(data):  # bytes past the digest's: theirs
            self._digest.update(memoryview(data)[self.hashed - at :])
            self.hashed = at + len(data)
        self._at = at + len(data)
        if self._at == end and not self._cut.sent:  # every byte has passed the digest
            self._cut.went_whole(self._digest.hexdigest())
        return data

    def _next(self, at: int, want: int) -> bytes:
        if self._cut.done or self._cut.sealed:
            raise BodyCut("cut")
        data = self._source.read_at(at, want)
        if not data:
            raise BodyCut(f"the source ended after {at} of {self._source.size} bytes")
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0 or not 0 <= offset <= self._source.size:
            raise ValueError("the body seeks only to an offset from its start")
        self._at = offset
        return offset

    def tell(self) -> int:
        return self._at


def _give_up() -> None:
    """The request cannot be sent whole: no retry (botocore would send it again)."""
    watchdog = active()
    if watchdog is not None:
        watchdog.fire_now()
