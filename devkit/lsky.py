"""A Lsky Pro 2.x v1 API stand-in (see DESIGN.md, "Lsky Pro upload").

Routes:
  POST   /api/v1/upload         multipart `file`, optional `strategy_id`, `album_id`
  GET    /api/v1/profile        token check and account numbers
  GET    /api/v1/images         the token user's images (40 a page, scopeFilter)
  DELETE /api/v1/images/<key>   delete one of them
  GET    /i/<pathname>          the stored file (what `data.links.url` points to)
  GET    /thumbnails/<md5>.png, GET /login

Behaviour follows the open-source server's code paths:
- Auth: a wrong/invalid `Authorization: Bearer` is 401 `Authentication failed.`
  when the client wants JSON (Accept: .../json), else a 302 to /login. With no
  Authorization header the real server does a *guest* upload; `guest_mode`
  chooses between answering like a bad token (default, so a dropped token is
  loud in tests), "管理员关闭了游客上传", or accepting it. `account_state`
  scripts the account: token refused, API disabled (403), unverified, frozen,
  quota full (the last three: HTTP 200 status false on upload).
- Upload pipeline in ImageService::store's order: extension (from the client's
  file name) in `accepted_suffixes`, size, `strategy_id` (when present at all),
  account checks, the user's default album, the sliding-window `rate_limits`
  (每分钟内你最多可以上传 N 张图片; `window_scale` shrinks the windows), then for
  all but ico/gif/svg the re-encode (`image_quality` < 100) and `watermark` steps,
  which change the stored bytes (md5/sha1/size describe the stored file). An
  identical stored file in the same strategy is reused, but every upload is a
  new image row with its own key.
- Images are rows (`image_records()`); `add_image`/`add_foreign_uploads` plant
  rows for this user or others. The listing keeps scopeFilter's ungrouped OR;
  every GET /api/v1/images is recorded in `listings` (its query).
- JSON is encoded like PHP's json_encode: non-ASCII as \\uXXXX, "/" as "\\/".

Failures are scripted: `script(Behaviour.rate_limited(), Behaviour.drop())`
queues behaviours that the next authenticated upload requests consume one each;
after that uploads succeed again. Every upload request is recorded in `uploads`, with
when its body began to arrive, except one whose body ends before its Content-Length: as
behind nginx and PHP, such a request never reaches the app (nothing is stored, nothing
scripted is used); it is only counted (`cut_bodies`). `trickle(path)` sends every answer
of a route a byte at a time (a stalled proxy); `link_bytes_per_sec` reads every upload
body at that rate (a host behind a limited link: a bench's limited pair).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import enum
import itertools
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

from devkit import images, multipart
from devkit._cli import exit_cleanly_on_signals
from devkit._http import BackgroundServer, Link, QuietHandler
from devkit.images import sniff
from devkit.lsky_model import (
    PRC,
    PRIVATE,
    Digest,
    Gallery,
    ImageRecord,
    dimensions,
    file_digest,
    insertion,
    list_images,
    normalise_limits,
    normalise_windows,
    process_file,
    rate_limit_message,
    trimmed_query,
)

__all__ = [
    "DEFAULT_SUFFIXES",
    "DEFAULT_TOKEN",
    "TOKEN_USER",
    "AccountState",
    "Behaviour",
    "GuestMode",
    "ImageRecord",
    "Kind",
    "LskyStandIn",
    "UploadAttempt",
]

DEFAULT_TOKEN = "1|local-test-token"
TOKEN_USER = "local"  # the name of the user the token belongs to
# Lsky's default group setting "accepted_file_suffixes" (note: no avif).
DEFAULT_SUFFIXES = frozenset({"jpeg", "jpg", "png", "gif", "tif", "bmp", "ico", "psd", "webp"})
SUCCESS_MESSAGE = "上传成功"
CATCH_ALL_MESSAGE = "服务异常，请稍后再试"  # noqa: RUF001 (Lsky's exact text)
API_DISABLED_MESSAGE = "管理员未启用 API"
DEFAULT_CAPACITY_KB = 1048576.0  # what the profile reports when capacity_kb is None
NOT_PROCESSED = frozenset({"ico", "gif", "svg"})  # store() skips re-encode and watermark
RATE_LIMITED = "rate_limited"  # UploadAttempt.outcome of a window-limiter refusal
HELD_AT_MOST_SECONDS = 120.0  # Behaviour.held: a gate nobody sets cannot hang a test run

NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    b"<center><h1>413 Request Entity Too Large</h1></center>\r\n"
    b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
HTML_PAGE = (
    b'<!DOCTYPE html>\n<html lang="zh-CN">\n<head><meta charset="utf-8">'
    b'<title>Lsky Pro</title></head>\n<body><div id="app">maintenance</div></body>\n</html>\n'
)
NOT_FOUND_PAGE = b"<!DOCTYPE html><title>Not Found</title>"


class Kind(enum.Enum):
    SUCCESS = "success"
    STATUS_FALSE = "status_false"
    UNAUTHORIZED = "http_401"
    FORBIDDEN = "http_403"
    TOO_LARGE = "http_413"
    RATE_LIMITED = "http_429"
    SERVER_ERROR = "http_500"
    UNAVAILABLE = "http_503"
    HTML_200 = "html_200"
    DROP = "drop"


@dataclass(frozen=True)
class Behaviour:
    """How to answer one upload. Build with the class methods."""

    kind: Kind = Kind.SUCCESS
    message: str = ""
    delay: float = 0.0  # seconds to sleep after reading the request
    # Held after reading the request until this event is set (at most HELD_AT_MOST_SECONDS).
    gate: threading.Event | None = field(default=None, compare=False)
    retry_after: int | str = 60  # seconds, or any text a proxy may send (an HTTP date)
    store: bool = False  # keep the file although the answer is a failure
    by_proxy: bool = False  # answered by the proxy as the body starts (see before_body)
    partial: bool = True  # DROP: half a response first (else none at all)
    throttle_headers: bool = True  # RATE_LIMITED: send Retry-After and X-RateLimit-*
    # Append the request's Authorization header ("header") or its token's secret half
    # ("secret") to `message`, as a misconfigured server or a debug error page may (a
    # client must redact it before keeping the message). Empty: no echo.
    echo_authorization: str = ""

    @classmethod
    def success(cls) -> Behaviour:
        return cls(Kind.SUCCESS, store=True)

    @classmethod
    def status_false(cls, message: str = "图片上传失败", *, store: bool = False) -> Behaviour:
        """HTTP 200 {"status": false}. store=True models "error, but it was saved"."""
        return cls(Kind.STATUS_FALSE, message, store=store)

    @classmethod
    def unauthorized(cls) -> Behaviour:
        """As if the token had been revoked (401, or 302 without Accept JSON)."""
        return cls(Kind.UNAUTHORIZED, "Authentication failed.")

    @classmethod
    def forbidden(cls, message: str = "管理员未启用 API") -> Behaviour:
        return cls(Kind.FORBIDDEN, message)

    @classmethod
    def too_large(cls) -> Behaviour:
        """nginx's client_max_body_size page (HTML, not JSON)."""
        return cls(Kind.TOO_LARGE)

    @classmethod
    def rate_limited(cls, retry_after: int = 60, *, headers: bool = True) -> Behaviour:
        """HTTP 429 from Laravel's `throttle:api` (60 a minute), body in Lsky's envelope
        {"status": false, "message": "Too Many Attempts.", "data": {}}.

        headers=True adds Laravel's Retry-After and X-RateLimit-* headers. The real
        Lsky 2.x renders the ThrottleRequestsException through its own Result trait
        (app/Exceptions/Handler.php), which drops them: headers=False is exactly that.
        """
        return cls(
            Kind.RATE_LIMITED,
            "Too Many Attempts.",
            retry_after=retry_after,
            throttle_headers=headers,
        )

    @classmethod
    def server_error(cls) -> Behaviour:
        """Laravel's production 500: {"message": "Server Error"}, no status key."""
        return cls(Kind.SERVER_ERROR, "Server Error")

    @classmethod
    def unavailable(cls, retry_after: int | str) -> Behaviour:
        """A reverse proxy (nginx) in front of Lsky answering 503 with Retry-After: whatever
        it says, huge, negative or a date, reaches the client as written."""
        return cls(Kind.UNAVAILABLE, "Service Unavailable", retry_after=retry_after)

    @classmethod
    def html_200(cls) -> Behaviour:
        """A 200 with an HTML page (a proxy or maintenance page)."""
        return cls(Kind.HTML_200)

    @classmethod
    def slow(cls, seconds: float, then: Behaviour | None = None) -> Behaviour:
        """Wait `seconds` after the whole request body was read, then handle the
        upload as `then` (default: success). The wait and the store happen whether
        or not the client is still connected: a client killed during the wait
        still leaves a stored image (see `wait_for_bodies`, `wait_for_uploads`)."""
        return replace(then or cls.success(), delay=seconds)

    @classmethod
    def held(cls, gate: threading.Event, then: Behaviour | None = None) -> Behaviour:
        """Hold the answer after the whole request body was read until `gate` is set,
        then handle the upload as `then` (default: success). What `slow` does, with the
        test deciding when instead of a number of seconds: the client can run out of time
        while it waits, or the test can act "during the upload", however slow the
        machine. Like `slow`, the store happens whether or not the client is still
        connected. A gate never set lets go after HELD_AT_MOST_SECONDS (a hang bound)."""
        return replace(then or cls.success(), gate=gate)

    def echoing_authorization(self, part: str = "header") -> Behaviour:
        """This behaviour with the request's Authorization header (part="header") or the
        secret half of its token (part="secret") appended to its message (for
        status_false, unauthorized, forbidden, rate_limited)."""
        if part not in ("header", "secret"):
            raise ValueError(f"part must be 'header' or 'secret', not {part!r}")
        return replace(self, echo_authorization=part)

    @classmethod
    def before_body(cls, then: Behaviour) -> Behaviour:
        """The proxy in front of Lsky (nginx's limit_req or client_max_body_size, a
        gateway giving up) answers `then` as soon as the request body starts to arrive,
        without reading the rest, and closes the connection: the app never sees the
        request, so nothing is stored whatever `then` says. It is consumed before the
        token is looked at (the proxy does not know it). For a client this is an upload
        refused part-way: its answer, or a reset, reaches it while it is still sending."""
        if then.kind in (Kind.SUCCESS, Kind.DROP):
            raise ValueError("a proxy answers before the body with a refusal, not with Lsky's")
        return replace(then, by_proxy=True, store=False)

    @classmethod
    def drop(cls, *, partial: bool = True, store: bool = True) -> Behaviour:
        """Store the file (store=True, default; the upload checks are skipped as if
        they passed), then close the connection instead of answering: with
        partial=True after half a response, with partial=False before any byte of
        it. Models a proxy timing out while the app finishes its work."""
        return cls(Kind.DROP, store=store, partial=partial)


class AccountState(enum.Enum):
    """The token user's account, as the routes see it.

    TOKEN_REFUSED: every token is refused (401 Authentication failed. on upload,
    Unauthenticated. on the auth:sanctum routes). API_DISABLED: CheckIsEnableApi
    answers 403 管理员未启用 API (a 404 page when the client does not want JSON).
    UNVERIFIED, FROZEN, QUOTA_FULL: the profile still answers 200 (Sanctum does not
    look at them); uploads answer HTTP 200 status false 账户未验证 / 账号状态异常 /
    储存空间不足, after the type, size and strategy checks, as ImageService::store.
    """

    HEALTHY = "healthy"
    TOKEN_REFUSED = "token_refused"
    API_DISABLED = "api_disabled"
    UNVERIFIED = "unverified"
    FROZEN = "frozen"
    QUOTA_FULL = "quota_full"


_ACCOUNT_REFUSALS = {
    AccountState.UNVERIFIED: "账户未验证",
    AccountState.FROZEN: "账号状态异常",
    AccountState.QUOTA_FULL: "储存空间不足",
}


class GuestMode(enum.Enum):
    REJECT = "reject"  # answer like a bad token (401 / 302)
    DISABLED = "disabled"  # HTTP 200 status false: 管理员关闭了游客上传
    ALLOW = "allow"  # store it as a guest upload


@dataclass(frozen=True)
class UploadAttempt:
    """One POST /api/v1/upload as the stand-in saw and answered it."""

    filename: str | None
    content_type: str | None  # of the file part
    size: int
    sha256: str | None
    fields: dict[str, str]
    headers: dict[str, str]  # lower-case names, as received
    # A Kind value, or unauthenticated/api_disabled/guest_disabled/rejected/rate_limited/csrf.
    outcome: str
    status: int  # HTTP status sent (0: connection closed before a status line)
    message: str | None = None
    pathname: str | None = None  # where it was stored, if it was
    origin: str | None = None
    referer: str | None = None
    key: str | None = None  # the image row created, if one was
    # time.monotonic() when its body began to arrive (at the latest: when it was read).
    body_started_at: float | None = None
    before_body: bool = False  # answered by the proxy as the body started (not read)

    @property
    def sent_origin_or_referer(self) -> bool:
        return self.origin is not None or self.referer is not None

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass
class _Config:
    """Settings a test may change between requests (`lsky.config.x = ...`);
    `reset()` restores the constructor's values."""

    token: str
    guest_mode: GuestMode
    accepted_suffixes: frozenset[str]
    max_file_kb: float | None
    strategy_ids: frozenset[int]
    csrf_check: bool
    # Group settings. Real defaults: 20/100/300/600/999, quality 75; here off/100.
    rate_limits: Mapping[str, int] = field(default_factory=dict)
    window_scale: float | Mapping[str, float] | None = None  # see normalise_windows
    image_quality: int = 100
    watermark: bool = False
    # The token user's account and settings.
    account_state: AccountState = AccountState.HEALTHY
    capacity_kb: float | None = None  # None: no quota check
    default_album_id: int | None = None  # applied only if the user owns that album
    default_permission: int = PRIVATE
    # Routes (paths) whose answers trickle in; see LskyStandIn.trickle.
    trickles: Mapping[str, Trickle] = field(default_factory=dict)
    # config/app.php 'timezone': the zone the image list writes `date` in.
    app_timezone: tzinfo = PRC
    link_bytes_per_sec: float | None = None  # every upload body is read at this rate
    # The limit the month's window is held to: Lsky 2.0 to 2.0.4 read the week's
    # ('months' => GroupConfigKey::LimitPerWeek in rateLimiter; 2.1 reads the month's).
    month_limit: str = "month"

    def __setattr__(self, name: str, value: Any) -> None:
        # Validate (and freeze) the window settings when they are set, so a typo
        # fails in the test, not in a handler thread.
        if name == "month_limit" and value not in ("month", "week"):
            raise ValueError(
                f"month_limit is 'month' (Lsky 2.1) or 'week' (2.0 to 2.0.4), not {value!r}"
            )
        if name == "rate_limits":
            value = normalise_limits(value)
        elif name == "window_scale":
            normalise_windows(value)
            if isinstance(value, Mapping):
                value = MappingProxyType(dict(value))
        super().__setattr__(name, value)

    @property
    def windows(self) -> Mapping[str, float]:
        """Seconds per window after `window_scale`."""
        return normalise_windows(self.window_scale)


@dataclass(frozen=True)
class Trickle:
    """How a route's answers are sent: one byte every `interval` seconds, from the status
    line on, or (from_body=True) after the status line and headers went out at once."""

    interval: float = 1.0
    from_body: bool = False


class _Refusal(NamedTuple):
    message: str
    outcome: str


@dataclass
class _Request:
    headers: dict[str, str]
    form: multipart.Form = field(default_factory=multipart.Form)
    temp: Path | None = None
    error: str | None = None
    cut: bool = False  # the body ended before its Content-Length: never the app's
    started_at: float | None = None  # when its first body bytes were read


class LskyStandIn(BackgroundServer):
    """Lsky Pro v1 API stand-in on 127.0.0.1 (context manager)."""

    user = TOKEN_USER  # the name of the token's user (owner of its images)

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        storage_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        guest_mode: GuestMode = GuestMode.REJECT,
        accepted_suffixes: Iterable[str] = DEFAULT_SUFFIXES,
        max_file_kb: float | None = None,
        strategy_ids: Iterable[int] = (1,),
        csrf_check: bool = False,
        public_url: str | None = None,
        rate_limits: Mapping[str, int] | None = None,
        window_scale: float | Mapping[str, float] | None = None,
        image_quality: int = 100,
        watermark: bool = False,
        account_state: AccountState = AccountState.HEALTHY,
        capacity_kb: float | None = None,
        link_bytes_per_sec: float | None = None,
    ) -> None:
        """max_file_kb: Lsky's per-group limit (its default is 5120); None = no limit.
        csrf_check: answer 419 when Origin or Referer is sent, as Sanctum does for
        requests that look like they come from a stateful (browser) domain.
        rate_limits: uploads allowed per window, e.g. {"minute": 3, "hour": 10}
        (windows minute, hour, day, week, month; Lsky's default group has 20, 100,
        300, 600, 999); None = no limit. window_scale: seconds per window, e.g.
        {"minute": 2, "hour": 6}, or one factor for all real durations.
        image_quality < 100 or watermark=True: stored files differ from uploads
        (Lsky's default quality is 75). capacity_kb: the user's quota; None = none.
        link_bytes_per_sec: read every upload body at this rate (None: as fast as it comes).
        """
        self.handler_class = _Handler
        self._defaults = _Config(
            token=token,
            guest_mode=guest_mode,
            accepted_suffixes=frozenset(s.lower() for s in accepted_suffixes),
            max_file_kb=max_file_kb,
            strategy_ids=frozenset(strategy_ids),
            csrf_check=csrf_check,
            rate_limits=rate_limits or {},
            window_scale=window_scale,
            image_quality=image_quality,
            watermark=watermark,
            account_state=account_state,
            capacity_kb=capacity_kb,
            link_bytes_per_sec=link_bytes_per_sec,
        )
        if link_bytes_per_sec is not None:
            Link(link_bytes_per_sec)  # refuses a rate that is not positive, here
        self.config = replace(self._defaults)
        self._owns_storage = storage_dir is None
        self.storage_dir = Path(storage_dir or tempfile.mkdtemp(prefix="devkit-lsky-"))
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self._incoming = self.storage_dir / ".incoming"
        self._incoming.mkdir(exist_ok=True)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._script: deque[Behaviour] = deque()
        self._uploads: list[UploadAttempt] = []
        self._listings: list[dict[str, str | None]] = []
        # A fault for GET /api/v1/images: answer this status instead (500: Laravel's
        # production error; 429: its throttle, with Retry-After), None: list normally.
        self.listing_fault: int | None = None
        # What a real host does to stored files after the upload (lose_file, drop_record,
        # replace_file, share_file) and a fault of its file route: GET /i/... answers this
        # status (503: a host down for a while) while set. Every file GET is counted.
        self.file_fault: int | None = None
        self._file_gets = 0
        self._bodies = 0
        self._cut_bodies = 0
        # Set when an upload's body begins to arrive, and when an upload is answered (and
        # recorded): gates for a test's other servers (an upstream route held until then).
        self.body_arriving = threading.Event()
        self.upload_answered = threading.Event()
        self._gallery = Gallery()
        self._last_uniqid = ""
        self._planted = itertools.count(1)
        super().__init__(host, port)
        self.public_url = (public_url or self.base_url).rstrip("/")

    # -- scripting and records --------------------------------------------------

    @property
    def token(self) -> str:
        return self.config.token

    @property
    def api_url(self) -> str:
        return self.base_url + "/api/v1"

    @property
    def account_state(self) -> AccountState:
        return self.config.account_state

    @account_state.setter
    def account_state(self, state: AccountState) -> None:
        self.config.account_state = state

    def trickle(self, path: str, *, interval: float = 1.0, from_body: bool = False) -> None:
        """Send every answer of `path` (e.g. /api/v1/upload, /api/v1/images,
        /api/v1/profile) one byte every `interval` seconds until `reset()`. The request
        is handled as usual (an upload is stored); only the answer is slow. The trickle
        stops when the client goes away."""
        with self._lock:
            self.config.trickles = {
                **self.config.trickles,
                path: Trickle(interval=interval, from_body=from_body),
            }

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next authenticated upload requests."""
        with self._lock:
            self._script.extend(behaviours)

    @property
    def pending_script(self) -> int:
        with self._lock:
            return len(self._script)

    @property
    def uploads(self) -> list[UploadAttempt]:
        with self._lock:
            return list(self._uploads)

    @property
    def upload_count(self) -> int:
        with self._lock:
            return len(self._uploads)

    @property
    def successful_uploads(self) -> int:
        with self._lock:
            return sum(1 for u in self._uploads if u.outcome == Kind.SUCCESS.value)

    @property
    def rate_limited_count(self) -> int:
        """Uploads refused by the window limiter (每...内你最多可以上传 N 张图片)."""
        with self._lock:
            return sum(1 for u in self._uploads if u.outcome == RATE_LIMITED)

    @property
    def listings(self) -> list[dict[str, str | None]]:
        """The query of every GET /api/v1/images, authorised or not, in order."""
        with self._lock:
            return [dict(query) for query in self._listings]

    @property
    def bodies_received(self) -> int:
        """Upload requests whose whole body the server has read (recorded or not yet)."""
        with self._lock:
            return self._bodies

    @property
    def cut_bodies(self) -> int:
        """Upload requests whose body ended before its Content-Length (never the app's)."""
        with self._lock:
            return self._cut_bodies

    def wait_for_bodies(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until `count` upload bodies have been read in full; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._bodies >= count, timeout)

    def wait_for_cut_bodies(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until `count` upload bodies were cut short (see `cut_bodies`)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._cut_bodies >= count, timeout)

    def wait_for_uploads(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until `count` upload attempts are recorded; False on timeout. An
        attempt is recorded when its answer is buffered, just before it is flushed
        (so also when the client has already gone)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._uploads) >= count, timeout)

    def stored_path(self, pathname_or_url: str) -> Path:
        """The file on disk for a `pathname` or a `links.url`."""
        prefix = self.public_url + "/i/"
        pathname = pathname_or_url.removeprefix(prefix)
        path = (self.storage_dir / pathname).resolve()
        if not path.is_relative_to(self.storage_dir.resolve()):
            raise ValueError(f"outside the storage dir: {pathname_or_url}")
        return path

    # -- what a host does to stored files -------------------------------------------

    def lose_file(self, key: str) -> None:
        """The file is gone (a disk, strategy or bucket lost, a restore from an older
        backup) while the images table still lists it: its URL answers 404."""
        self._stored_file(key).unlink()

    def drop_record(self, key: str) -> None:
        """The reverse: the row is deleted (by hand, in the database) and the file kept:
        the API no longer lists it, its URL still serves it."""
        with self._lock:
            row = self._row(key)
            self._gallery.rows.remove(row)

    def replace_file(self, key: str, data: bytes) -> None:
        """Other bytes at the image's path (re-encoding or watermark settings applied
        later, a file rewritten by hand); the row keeps the sha1 and size of the upload."""
        self._stored_file(key).write_bytes(data)

    def share_file(self, key: str, *, like: str) -> None:
        """Two uploads end up as the same picture: `key`'s file holds `like`'s bytes. In
        Lsky's last tagged release a format conversion (or quality below 100) writes a
        temporary file named after the format, so two uploads at once can swap it; each
        row keeps the digest of its own upload."""
        self._stored_file(key).write_bytes(self._stored_file(like).read_bytes())

    @property
    def file_gets(self) -> int:
        """GET (or HEAD) requests of the file route (/i/...) since the last reset."""
        with self._lock:
            return self._file_gets

    def _row(self, key: str) -> ImageRecord:
        row = next((r for r in self._gallery.rows if r.key == key), None)
        if row is None:
            raise KeyError(f"no image {key!r}")
        return row

    def _stored_file(self, key: str) -> Path:
        with self._lock:
            pathname = self._row(key).pathname
        return self.stored_path(pathname)

    # -- the images table -----------------------------------------------------------

    def image_records(self, owner: str | None = TOKEN_USER) -> list[ImageRecord]:
        """The image rows of `owner` (None: guest rows), oldest first."""
        with self._lock:
            return self._gallery.owned(owner)

    def find_image(self, key: str) -> ImageRecord | None:
        with self._lock:
            return next((r for r in self._gallery.rows if r.key == key), None)

    def add_album(self, name: str = "album", *, owner: str = TOKEN_USER) -> int:
        """Create an album for `owner`; returns its id (for album_id, default_album_id)."""
        with self._lock:
            return self._gallery.add_album(owner, name).id

    def add_image(
        self,
        data: bytes | None = None,
        *,
        owner: str | None = TOKEN_USER,
        origin_name: str = "planted.png",
        alias_name: str = "",
        album_id: int | None = None,
        permission: int = PRIVATE,
        strategy_id: int | None = 1,
        age: float = 0.0,
        created_at: datetime | None = None,
    ) -> ImageRecord:
        """Plant an image row (and its file) as if uploaded `age` seconds ago by
        another client: for `owner`, another user's name, or None (a guest). Without
        `data`, a small PNG unique to this row. Counts for rate limits and quotas.
        `created_at` dates the row's `created_at` (its listed `date`) instead of now - age."""
        if data is None:
            png = images.png()
            serial = next(self._planted)
            position, chunk = insertion(png[:16], png[-12:], len(png), f"planted {serial}")
            data = png[:position] + chunk + png[position:]
        temp = self._new_temp()
        temp.write_bytes(data)
        digest = file_digest(temp)
        now = time.monotonic()
        return self._place(
            temp,
            digest,
            strategy=strategy_id,
            extension=_extension(origin_name),
            owner=owner,
            album_id=album_id,
            origin_name=origin_name,
            alias_name=alias_name,
            permission=permission,
            uploaded_ip="127.0.0.1",
            created=now - age,
            created_at=created_at or datetime.now(UTC) - timedelta(seconds=age),
            source="planted",
        )

    def add_foreign_uploads(self, count: int = 1, *, age: float = 0.0) -> list[ImageRecord]:
        """`count` images of the token user uploaded `age` seconds ago by another
        client of the same account (they count against the rate limits)."""
        return [self.add_image(origin_name=f"foreign-{i}.png", age=age) for i in range(count)]

    def stored_timestamps(self, *, include_planted: bool = True) -> list[float]:
        """time.monotonic() of every image row created for the token user, in
        order, including rows deleted since; planted rows only if asked."""
        with self._lock:
            return sorted(
                created
                for owner, created, source in self._gallery.created_log
                if owner == self.user and (include_planted or source != "planted")
            )

    def max_in_window(self, seconds: float, *, include_planted: bool = True) -> int:
        """The most `stored_timestamps` in any closed window [t, t + seconds]."""
        times = self.stored_timestamps(include_planted=include_planted)
        return max(
            (bisect.bisect_right(times, t + seconds) - i for i, t in enumerate(times)),
            default=0,
        )

    def reset(self) -> None:
        """Forget the script, the records, the image rows and albums; restore
        config. Files already stored stay on disk."""
        with self._lock:
            self._script.clear()
            self._uploads.clear()
            self._listings.clear()
            self._bodies = 0
            self._cut_bodies = 0
            self.body_arriving.clear()
            self.upload_answered.clear()
            self.listing_fault = None
            self.file_fault = None
            self._file_gets = 0
            self._gallery.clear()
            self.config = replace(self._defaults)

    def stop(self) -> None:
        super().stop()
        if self._owns_storage:
            shutil.rmtree(self.storage_dir, ignore_errors=True)

    # -- used by the handler ------------------------------------------------------

    def _next_behaviour(self) -> Behaviour:
        with self._lock:
            return self._script.popleft() if self._script else Behaviour.success()

    def _proxy_behaviour(self) -> Behaviour | None:
        """The next scripted behaviour if the proxy plays it (before the body), consumed."""
        with self._lock:
            if self._script and self._script[0].by_proxy:
                return self._script.popleft()
            return None

    def _record_listing(self, query: Mapping[str, str | None]) -> None:
        with self._lock:
            self._listings.append(dict(query))

    def _record(self, attempt: UploadAttempt) -> None:
        with self._changed:
            self._uploads.append(attempt)
            self._changed.notify_all()
        self.upload_answered.set()

    def _body_cut(self) -> None:
        with self._changed:
            self._cut_bodies += 1
            self._changed.notify_all()

    def _body_read(self) -> None:
        with self._changed:
            self._bodies += 1
            self._changed.notify_all()

    def _new_temp(self) -> Path:
        return self._incoming / uuid.uuid4().hex

    def _ingest(
        self,
        temp: Path,
        part: multipart.FilePart,
        *,
        strategy: int | None,
        owner: str | None,
        ip: str,
        checked: bool,
    ) -> ImageRecord | _Refusal:
        """ImageService::store from the account checks on; consumes `temp`.
        checked=False (a scripted "stored anyway") skips the refusals."""
        config = self.config
        extension = _extension(part.filename)
        digest = Digest(part.md5, part.sha1, part.size)
        unreadable = False
        if extension not in NOT_PROCESSED and (config.image_quality < 100 or config.watermark):
            if sniff(part.head) is None:
                # Intervention cannot read it: the controller's catch-all answer.
                unreadable = True
            else:
                processed = temp.with_name(temp.name + ".processed")
                digest = process_file(
                    temp, processed, quality=config.image_quality, watermark=config.watermark
                )
                processed.replace(temp)
        with self._lock:
            now = time.monotonic()
            if checked:
                refusal = self._refusal(owner, ip, part.size, now)
                if refusal is None and unreadable:
                    refusal = _Refusal(CATCH_ALL_MESSAGE, "rejected")
                if refusal is not None:
                    temp.unlink(missing_ok=True)
                    return refusal
            return self._place(
                temp,
                digest,
                strategy=strategy,
                extension=extension,
                owner=owner,
                album_id=self._default_album(owner),
                origin_name=_client_name(part.filename),
                alias_name="",
                permission=config.default_permission if owner is not None else PRIVATE,
                uploaded_ip=ip,
                created=now,
                created_at=datetime.now(UTC),
                source="upload",
            )

    def _refusal(self, owner: str | None, ip: str, size: int, now: float) -> _Refusal | None:
        """The account checks, then the rate limiter (called under the lock)."""
        config = self.config
        if owner is not None:
            message = _ACCOUNT_REFUSALS.get(config.account_state)
            capacity = config.capacity_kb
            # Quota: the uploaded (not yet re-encoded) size plus the rows' sizes.
            if (
                message is None
                and capacity is not None
                and size / 1024 + self._gallery.used_kb(owner) > capacity
            ):
                message = _ACCOUNT_REFUSALS[AccountState.QUOTA_FULL]
            if message is not None:
                return _Refusal(message, "rejected")
        message = rate_limit_message(
            config.rate_limits,
            config.windows,
            self._gallery.created_times(owner, ip),
            time.time(),  # Lsky's clock: created_at is wall time
            zone=config.app_timezone,
            month_limit=config.month_limit,
        )
        return None if message is None else _Refusal(message, RATE_LIMITED)

    def _default_album(self, owner: str | None) -> int | None:
        album_id = self.config.default_album_id
        album = self._gallery.albums.get(album_id) if album_id else None
        return album_id if album is not None and owner == self.user == album.owner else None

    def _place(
        self,
        temp: Path,
        digest: Digest,
        *,
        strategy: int | None,
        extension: str,
        **row: Any,
    ) -> ImageRecord:
        """Insert the row; keep `temp` as a new file, or drop it for a stored twin."""
        width, height = dimensions(temp)
        mimetype = _mimetype(temp)
        with self._lock:
            existing = self._gallery.find_file(strategy, digest.md5, digest.sha1)
            if existing is not None:
                path, name = existing.path, existing.name
            else:
                path, name = time.strftime("%Y/%m/%d"), f"{self._uniqid()}.{extension}"
            record = self._gallery.insert(
                strategy_id=strategy,
                path=path,
                name=name,
                size_kb=digest.size / 1024,
                mimetype=mimetype,
                extension=extension,
                md5=digest.md5,
                sha1=digest.sha1,
                width=width,
                height=height,
                **row,
            )
        if existing is not None:
            # Lsky only creates a new record pointing at the old file.
            temp.unlink(missing_ok=True)
        else:
            target = self.storage_dir / record.pathname
            target.parent.mkdir(parents=True, exist_ok=True)
            temp.replace(target)
        return record

    def _delete(self, key: str) -> None:
        with self._lock:
            row, orphaned = self._gallery.delete(self.user, key)
        if row is not None and orphaned:
            with contextlib.suppress(OSError, ValueError):
                self.stored_path(row.pathname).unlink(missing_ok=True)

    def _uniqid(self) -> str:
        # PHP uniqid(): 8 hex digits of seconds + 5 of microseconds. Called
        # under the lock, and bumped so two uploads in one microsecond differ.
        now = time.time_ns() // 1000
        while True:
            value = f"{now // 1_000_000:08x}{now % 1_000_000:05x}"
            if value > self._last_uniqid:
                self._last_uniqid = value
                return value
            now += 1

    def _thumbnail(self, md5: str) -> ImageRecord | None:
        with self._lock:
            return self._gallery.by_md5(md5)

    def _profile(self) -> dict[str, Any]:
        with self._lock:
            rows = self._gallery.owned(self.user)
            # `$user->images()->sum('size') + 0`: 0 (an int) when there are none.
            used: float = round(sum(r.size for r in rows), 2) if rows else 0
            albums = sum(1 for a in self._gallery.albums.values() if a.owner == self.user)
        config = self.config
        if config.account_state is AccountState.QUOTA_FULL:
            capacity = float(used)
        else:
            capacity = DEFAULT_CAPACITY_KB if config.capacity_kb is None else config.capacity_kb
        return {
            "name": self.user,
            "avatar": f"{self.public_url}/avatar.png",
            "email": f"{self.user}@example.test",
            "capacity": float(capacity),
            "used_capacity": used,
            "url": "",
            "image_num": len(rows),
            "album_num": albums,
            "registered_ip": "127.0.0.1",
        }

    def _list(self, query: Mapping[str, str | None], path: str) -> dict[str, Any]:
        with self._lock:
            rows = list(self._gallery.rows)
        return list_images(
            rows,
            self.user,
            query,
            path=path,
            links=lambda r: self._links(r, r.origin_name),
            zone=self.config.app_timezone,
        )

    def _links(self, stored: ImageRecord, origin_name: str) -> dict[str, str]:
        url = f"{self.public_url}/i/{stored.pathname}"
        return {
            "url": url,
            # Lsky escapes only the angle brackets, and not origin_name.
            "html": f'&lt;img src="{url}" alt="{origin_name}" title="{origin_name}" /&gt;',
            "bbcode": f"[img]{url}[/img]",
            "markdown": f"![{origin_name}]({url})",
            "markdown_with_link": f"[![{origin_name}]({url})]({url})",
            "thumbnail_url": f"{self.public_url}/thumbnails/{stored.md5}.png",
        }


def _mimetype(path: Path) -> str:
    # Symfony's File::getMimeType(): from the content.
    with path.open("rb") as handle:
        return sniff(handle.read(64)) or "application/octet-stream"


def _client_name(filename: str) -> str:
    # Symfony's UploadedFile::getClientOriginalName(): the part after the last / or \.
    return filename.replace("\\", "/").rsplit("/", 1)[-1]


def _extension(filename: str) -> str:
    name = filename.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[1].lower() if "." in name else ""


def php_json(value: Any) -> bytes:
    """json_encode() defaults: ASCII only, slashes escaped."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).replace("/", "\\/").encode()


def envelope(status: bool, message: str, data: Any = None) -> bytes:
    # Lsky's Result trait: empty data becomes {} (new \stdClass), never [].
    return php_json({"status": status, "message": message, "data": data or {}})


def _bearer(header: str) -> str:
    # Laravel's Request::bearerToken(): text after the last "Bearer ", up to a comma.
    position = header.rfind("Bearer ")
    if position < 0:
        return ""
    return header[position + 7 :].split(",", 1)[0]


def _wants_json(headers: dict[str, str]) -> bool:
    # Laravel's expectsJson(): an XHR that accepts anything, or wantsJson()
    # (the first Accept type contains /json or +json).
    accept = headers.get("accept", "")
    first = accept.split(",", 1)[0].split(";", 1)[0].strip().lower()
    xhr = headers.get("x-requested-with", "") == "XMLHttpRequest"
    accepts_any = first in ("", "*/*", "*")
    return "/json" in first or "+json" in first or (xhr and accepts_any)


_IMAGE_KEY = re.compile(r"/api/v1/images/([^/]+)")
# Laravel's routes/api.php (v1), for the 405 answer's "Supported methods".
_API_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/api/v1/upload"), "POST"),
    (re.compile(r"/api/v1/profile"), "GET, HEAD"),
    (re.compile(r"/api/v1/images"), "GET, HEAD"),
    (_IMAGE_KEY, "DELETE"),
)


class _Handler(QuietHandler):
    # Buffer responses so that an upload is recorded *before* the client can
    # read the answer: a test that asserts on `uploads` right after its request
    # returns must never race the handler thread. (handle_one_request flushes
    # after do_POST; large file downloads bypass the buffer.)
    wbufsize = 1 << 16
    _drop_pending = False
    # Lsky is normally behind nginx; do not advertise Python's BaseHTTP.
    server_version = "nginx"
    sys_version = ""

    @property
    def owner(self) -> LskyStandIn:
        owner: LskyStandIn = self.server.owner
        return owner

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    # -- routing --------------------------------------------------------------------

    def do_GET(self) -> None:
        self._get(head=False)

    def do_HEAD(self) -> None:
        self._get(head=True)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path == "/api/v1/upload":
            self._upload()
            return
        self._discard_body()
        self._not_routed(path)

    def do_PUT(self) -> None:
        self._discard_body()
        self._not_routed(urlsplit(self.path).path)

    def do_DELETE(self) -> None:
        self._discard_body()
        path = unquote(urlsplit(self.path).path)
        match = _IMAGE_KEY.fullmatch(path)
        if match is None:
            self._not_routed(path)
        elif self._api_gate(self._headers(), csrf=True):
            # UserService::deleteImages filters by the user and says 删除成功 even
            # when nothing matched (an unknown key, another user's image).
            self.owner._delete(match.group(1))
            self._send(200, envelope(True, "删除成功"), "application/json")

    do_PATCH = do_PUT

    def _get(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path == "/api/v1/profile":
            self._profile(head=head)
        elif path == "/api/v1/images":
            self._list_images(head=head)
        elif path.startswith("/i/"):
            self._serve_file(path.removeprefix("/i/"), head=head)
        elif path.startswith("/thumbnails/"):
            stored = self.owner._thumbnail(path.removeprefix("/thumbnails/").split(".", 1)[0])
            if stored is None:
                self._send(404, b"Not Found", "text/plain", head=head)
            else:
                self._serve_file(stored.pathname, head=head)
        elif path == "/login":
            self._send(200, HTML_PAGE, "text/html; charset=UTF-8", head=head)
        else:
            self._not_routed(path, head=head)

    def _not_routed(self, path: str, *, head: bool = False) -> None:
        allowed = next((methods for route, methods in _API_ROUTES if route.fullmatch(path)), None)
        if allowed is not None:
            # Only reached for a method the route does not have.
            message = (
                f"The {self.command} method is not supported for this route. "
                f"Supported methods: {allowed}."
            )
            self._send(405, php_json({"message": message}), "application/json", head=head)
        elif path.startswith("/api/"):
            message = f"The route {path.lstrip('/')} could not be found."
            self._send(404, php_json({"message": message}), "application/json", head=head)
        else:
            self._send(404, NOT_FOUND_PAGE, "text/html", head=head)

    # -- responses ------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        *,
        close: bool = False,
        head: bool = False,
    ) -> None:
        trickle = self.owner.config.trickles.get(urlsplit(self.path).path)
        if trickle is not None:
            self._send_trickled(trickle, status, body, content_type, headers or {})
            return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_trickled(
        self,
        trickle: Trickle,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str],
    ) -> None:
        """The whole answer, a byte at a time, straight to the socket (no buffer)."""
        self.close_connection = True
        lines = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
        lines += [f"Server: {self.server_version}", f"Content-Type: {content_type}"]
        lines += [f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.flush()
        try:
            if trickle.from_body:
                self.connection.sendall(head)
                slow = body
            else:
                slow = head + body
            for index in range(len(slow)):
                self.connection.sendall(slow[index : index + 1])
                time.sleep(trickle.interval)
        except OSError:
            return  # the client gave up: what a trickle is for

    def _unauthenticated(self, headers: dict[str, str], message: str, *, head: bool = False) -> int:
        if _wants_json(headers):
            self._send(401, envelope(False, message), "application/json", head=head)
            return 401
        location = f"{self.owner.public_url}/login"
        page = f'<!DOCTYPE html><meta http-equiv="refresh" content="0;url={location}">'
        self._send(
            302, page.encode(), "text/html; charset=UTF-8", {"Location": location}, head=head
        )
        return 302

    def _api_disabled(self, headers: dict[str, str], *, head: bool = False) -> int:
        # CheckIsEnableApi: 403 in the envelope for JSON clients, else abort(404).
        if _wants_json(headers):
            self._send(403, envelope(False, API_DISABLED_MESSAGE), "application/json", head=head)
            return 403
        self._send(404, NOT_FOUND_PAGE, "text/html", head=head)
        return 404

    def _csrf_refused(self, headers: dict[str, str]) -> bool:
        if self.owner.config.csrf_check and ("origin" in headers or "referer" in headers):
            self._send(419, php_json({"message": "CSRF token mismatch."}), "application/json")
            return True
        return False

    def _token_ok(self, headers: dict[str, str]) -> bool:
        config = self.owner.config
        return (
            "authorization" in headers
            and _bearer(headers["authorization"]) == config.token
            and config.account_state is not AccountState.TOKEN_REFUSED
        )

    def _api_gate(self, headers: dict[str, str], *, csrf: bool = False, head: bool = False) -> bool:
        """The auth:sanctum routes' middleware, in Laravel's sorted order: CSRF
        (not for GET), auth, then CheckIsEnableApi. True = let the request in."""
        if csrf and self._csrf_refused(headers):
            return False
        if not self._token_ok(headers):
            # auth:sanctum middleware: its exception message is "Unauthenticated."
            self._unauthenticated(headers, "Unauthenticated.", head=head)
            return False
        if self.owner.config.account_state is AccountState.API_DISABLED:
            self._api_disabled(headers, head=head)
            return False
        return True

    def _profile(self, *, head: bool = False) -> None:
        if self._api_gate(self._headers(), head=head):
            body = envelope(True, "success", self.owner._profile())
            self._send(200, body, "application/json", head=head)

    def _list_images(self, *, head: bool = False) -> None:
        headers = self._headers()
        query = trimmed_query(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        self.owner._record_listing(query)
        if not self._api_gate(headers, head=head):
            return
        fault = self.owner.listing_fault
        if fault == 429:
            body = envelope(False, "Too Many Attempts.")
            self._send(429, body, "application/json", {"Retry-After": "30"}, head=head)
            return
        if fault is not None:
            self._send(fault, php_json({"message": "Server Error"}), "application/json", head=head)
            return
        # The paginator's path is Request::url(): this request's host, no query.
        host = headers.get("host") or f"{self.owner.host}:{self.owner.port}"
        data = self.owner._list(query, f"http://{host}/api/v1/images")
        self._send(200, envelope(True, "success", data), "application/json", head=head)

    def _serve_file(self, pathname: str, *, head: bool) -> None:
        with self.owner._lock:
            self.owner._file_gets += 1
            fault = self.owner.file_fault
        if fault is not None:
            self._send(fault, HTML_PAGE, "text/html; charset=UTF-8", head=head)
            return
        try:
            path = self.owner.stored_path(pathname)
        except ValueError:
            path = None
        if path is None or not path.is_file() or pathname.startswith("."):
            self._send(404, b"Not Found", "text/plain", head=head)
            return
        with path.open("rb") as handle:
            first = handle.read(64)
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", sniff(first) or "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if head:
                return
            self.wfile.write(first)
            shutil.copyfileobj(handle, self.wfile, 1 << 20)

    # -- upload ---------------------------------------------------------------------

    def _discard_body(self) -> None:
        with contextlib.suppress(multipart.MultipartError):
            for _ in multipart.read_body(self.rfile, self._headers()):
                pass

    def _arriving(self, request: _Request, pieces: Iterable[bytes]) -> Iterator[bytes]:
        """An upload's body as it arrives: when it began noted (and told), and every piece
        across the configured link."""
        rate = self.owner.config.link_bytes_per_sec
        link = None if rate is None else Link(rate)
        for piece in pieces:
            if request.started_at is None:
                request.started_at = time.monotonic()
                self.owner.body_arriving.set()
            if link is not None:
                link.cross(len(piece))
            yield piece

    def _read_upload(self, headers: dict[str, str]) -> _Request:
        request = _Request(headers=headers)
        try:
            boundary = multipart.boundary_from(headers.get("content-type"))
        except multipart.MultipartError as exc:
            request.error = str(exc)
            self._discard_body()
            return request

        sinks: list[BinaryIO] = []

        def open_sink(part: multipart.FilePart) -> BinaryIO | None:
            if part.name != "file" or request.temp is not None:
                return None  # Laravel's $request->file('file') is the first one
            request.temp = self.owner._new_temp()
            sink = request.temp.open("wb")
            sinks.append(sink)
            return sink

        try:
            body = self._arriving(request, multipart.read_body(self.rfile, headers))
            request.form = multipart.parse(body, boundary, open_sink)
        except multipart.BodyCut:
            request.cut = True
            self.close_connection = True  # the client is gone mid-request
        except multipart.MultipartError as exc:
            request.error = str(exc)
            self.close_connection = True  # the stream position is unknown now
        finally:
            for sink in sinks:
                sink.close()
        return request

    def _upload(self) -> None:
        headers = self._headers()
        early = self.owner._proxy_behaviour()
        if early is not None:
            self._answer_before_body(headers, early)
            return
        request = self._read_upload(headers)
        if request.cut:
            # nginx and PHP hand the app only a whole request: nothing runs, nothing scripted
            # is used, nothing is stored.
            if request.temp is not None:
                request.temp.unlink(missing_ok=True)
            self.owner._body_cut()
            return
        if request.error is None:
            self.owner._body_read()
        try:
            status, outcome, message, stored = self._answer_upload(request)
        finally:
            if request.temp is not None:
                request.temp.unlink(missing_ok=True)
        part = request.form.file("file")
        self.owner._record(
            UploadAttempt(
                filename=part.filename if part else None,
                content_type=part.content_type if part else None,
                size=part.size if part else 0,
                sha256=part.sha256 if part else None,
                fields=dict(request.form.fields),
                headers=headers,
                outcome=outcome,
                status=status,
                message=message,
                pathname=stored.pathname if stored else None,
                origin=headers.get("origin"),
                referer=headers.get("referer"),
                key=stored.key if stored else None,
                body_started_at=request.started_at,
            )
        )
        self.wfile.flush()
        if self._drop_pending:
            self.drop_connection()

    def _answer_before_body(self, headers: dict[str, str], behaviour: Behaviour) -> None:
        """The proxy's answer as the body starts (Behaviour.before_body), then the close."""
        request = _Request(headers=headers)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > 0:
            for _ in self._arriving(request, [self.rfile.read1(multipart.READ_SIZE)]):
                pass  # the first piece there is; the rest is never read
        status, message = _FAILURES[behaviour.kind](self, headers, behaviour)
        self.owner._record(
            UploadAttempt(
                filename=None,
                content_type=None,
                size=0,
                sha256=None,
                fields={},
                headers=headers,
                outcome=behaviour.kind.value,
                status=status,
                message=message,
                origin=headers.get("origin"),
                referer=headers.get("referer"),
                body_started_at=request.started_at,
                before_body=True,
            )
        )
        self.wfile.flush()
        self.drop_connection()

    def _answer_upload(self, request: _Request) -> tuple[int, str, str | None, ImageRecord | None]:
        """Send the answer; returns (HTTP status, outcome, message, stored)."""
        refused = self._gate(request.headers)
        if refused is not None:
            return refused
        behaviour = self.owner._next_behaviour()
        if behaviour.delay:
            time.sleep(behaviour.delay)  # the client may be gone by now: carry on
        if behaviour.gate is not None:
            behaviour.gate.wait(HELD_AT_MOST_SECONDS)  # likewise
        if behaviour.kind is Kind.SUCCESS:
            return self._succeed(request)
        stored = None
        if behaviour.store and request.error is None:
            result = self._store(request, checked=False)
            stored = result if isinstance(result, ImageRecord) else None
        if behaviour.echo_authorization:
            echoed = request.headers.get("authorization", "")
            if behaviour.echo_authorization == "secret":
                echoed = _bearer(echoed).partition("|")[2]
            behaviour = replace(behaviour, message=behaviour.message + echoed)
        status, message = _FAILURES[behaviour.kind](self, request.headers, behaviour)
        return status, behaviour.kind.value, message, stored

    def _gate(self, headers: dict[str, str]) -> tuple[int, str, str | None, None] | None:
        """The upload route's middleware (CSRF, CheckIsEnableApi) and the
        controller's authentication, before the service runs; None = let it in."""
        config = self.owner.config
        if self._csrf_refused(headers):
            return 419, "csrf", "CSRF token mismatch.", None
        if config.account_state is AccountState.API_DISABLED:
            return self._api_disabled(headers), "api_disabled", API_DISABLED_MESSAGE, None
        guest = "authorization" not in headers
        if self._token_ok(headers) or (guest and config.guest_mode is GuestMode.ALLOW):
            return None
        if guest and config.guest_mode is GuestMode.DISABLED:
            return self._fail("管理员关闭了游客上传", "guest_disabled")
        message = "Authentication failed."
        return self._unauthenticated(headers, message), "unauthenticated", message, None

    def _succeed(self, request: _Request) -> tuple[int, str, str | None, ImageRecord | None]:
        rejection = self._validate(request)
        if rejection is not None:
            return self._fail(rejection, "rejected")
        result = self._store(request, checked=True)
        if result is None:
            return self._fail(CATCH_ALL_MESSAGE, "rejected")
        if isinstance(result, _Refusal):
            return self._fail(result.message, result.outcome)
        self._send(200, self._success_body(request, result), "application/json")
        return 200, Kind.SUCCESS.value, SUCCESS_MESSAGE, result

    # Scripted failures: each sends its answer and returns (status, message).

    def _status_false(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        self._send(200, envelope(False, b.message), "application/json")
        return 200, b.message

    def _revoked(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        return self._unauthenticated(headers, b.message), b.message

    def _forbidden(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        self._send(403, envelope(False, b.message), "application/json")
        return 403, b.message

    def _too_large(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        self._send(413, NGINX_413, "text/html", close=True)
        return 413, None

    def _rate_limited(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        limits = {
            "Retry-After": str(b.retry_after),
            "X-RateLimit-Limit": "60",
            "X-RateLimit-Remaining": "0",
        }
        if isinstance(b.retry_after, int):
            limits["X-RateLimit-Reset"] = str(int(time.time()) + b.retry_after)
        self._send(
            429,
            envelope(False, b.message),
            "application/json",
            limits if b.throttle_headers else None,
        )
        return 429, b.message

    def _server_error(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        self._send(500, php_json({"message": "Server Error"}), "application/json")
        return 500, "Server Error"

    def _unavailable(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        page = b"<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>"
        self._send(503, page, "text/html", {"Retry-After": str(b.retry_after)})
        return 503, None

    def _html_200(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        self._send(200, HTML_PAGE, "text/html; charset=UTF-8")
        return 200, None

    def _drop(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        # The connection is closed by _upload, after the attempt is recorded.
        self._drop_pending = True
        if not b.partial:
            return 0, None
        body = envelope(True, SUCCESS_MESSAGE, {"key": "partial"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        return 200, None

    def _fail(self, message: str, outcome: str) -> tuple[int, str, str, None]:
        self._send(200, envelope(False, message), "application/json")
        return 200, outcome, message, None

    def _validate(self, request: _Request) -> str | None:
        """Lsky's ImageService::store checks, in its order; None if all pass."""
        part = request.form.file("file")
        if request.error is not None or part is None:
            # $request->file('file') is null and the service trips over it.
            return CATCH_ALL_MESSAGE
        config = self.owner.config
        if _extension(part.filename) not in config.accepted_suffixes:
            return "不支持的文件类型"
        if config.max_file_kb is not None and part.size / 1024 > config.max_file_kb:
            return "图片大小超出限制"
        if "strategy_id" in request.form.fields:
            raw = request.form.fields["strategy_id"].strip()
            if not raw.isdigit() or int(raw) not in config.strategy_ids:
                return "选定的策略不存在"
        return None

    def _store(self, request: _Request, *, checked: bool) -> ImageRecord | _Refusal | None:
        part = request.form.file("file")
        if part is None or request.temp is None:
            return None
        raw = request.form.fields.get("strategy_id", "").strip()
        # No strategy_id: Lsky uses the group's first strategy.
        strategy = int(raw) if raw.isdigit() else min(self.owner.config.strategy_ids, default=None)
        guest = "authorization" not in request.headers
        temp, request.temp = request.temp, None  # _ingest moves or deletes it
        return self.owner._ingest(
            temp,
            part,
            strategy=strategy,
            owner=None if guest else self.owner.user,
            ip=self.client_address[0],
            checked=checked,
        )

    def _success_body(self, request: _Request, stored: ImageRecord) -> bytes:
        data = {
            "key": stored.key,
            "name": stored.name,
            "pathname": stored.pathname,
            "origin_name": stored.origin_name,
            "size": stored.size_kb,
            "mimetype": stored.mimetype,
            "extension": stored.extension,
            "md5": stored.md5,
            "sha1": stored.sha1,
            "links": self.owner._links(stored, stored.origin_name),
        }
        return envelope(True, SUCCESS_MESSAGE, data)


_FAILURES: dict[Kind, Callable[[_Handler, dict[str, str], Behaviour], tuple[int, str | None]]] = {
    Kind.STATUS_FALSE: _Handler._status_false,
    Kind.UNAUTHORIZED: _Handler._revoked,
    Kind.FORBIDDEN: _Handler._forbidden,
    Kind.TOO_LARGE: _Handler._too_large,
    Kind.RATE_LIMITED: _Handler._rate_limited,
    Kind.SERVER_ERROR: _Handler._server_error,
    Kind.UNAVAILABLE: _Handler._unavailable,
    Kind.HTML_200: _Handler._html_200,
    Kind.DROP: _Handler._drop,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.lsky", description="Run the Lsky Pro v1 API stand-in."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--storage", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--token", default=DEFAULT_TOKEN)
    parser.add_argument(
        "--guest", choices=[m.value for m in GuestMode], default=GuestMode.REJECT.value
    )
    parser.add_argument("--max-file-kb", type=float, default=None)
    parser.add_argument("--public-url", default=None, help="base of links.url")
    parser.add_argument(
        "--link-rate",
        type=float,
        default=None,
        help="read every upload body at this many bytes a second (default: as it comes)",
    )
    args = parser.parse_args(argv)

    server = LskyStandIn(
        token=args.token,
        storage_dir=args.storage,
        host=args.host,
        port=args.port,
        guest_mode=GuestMode(args.guest),
        max_file_kb=args.max_file_kb,
        public_url=args.public_url,
        link_bytes_per_sec=args.link_rate,
    )
    print(f"LSKY_BASE_URL={server.base_url}", flush=True)
    print(f"LSKY_TOKEN={server.token}", flush=True)
    print(f"storage: {server.storage_dir}  (Ctrl-C to stop)", flush=True)
    exit_cleanly_on_signals()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
