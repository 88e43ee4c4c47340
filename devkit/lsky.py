"""A Lsky Pro 2.x v1 API stand-in (see DESIGN.md, "Lsky Pro upload").

Routes:
  POST /api/v1/upload     multipart `file`, optional `strategy_id`, `album_id`
  GET  /api/v1/profile    token check
  GET  /i/<pathname>      the stored file (what `data.links.url` points to)
  GET  /thumbnails/<md5>.png, GET /login

Behaviour follows the open-source server's code paths:
- Auth: a wrong/invalid `Authorization: Bearer` is 401 `Authentication failed.`
  when the client wants JSON (Accept: .../json), else a 302 to /login. With no
  Authorization header the real server does a *guest* upload; `guest_mode`
  chooses between answering like a bad token (default, so a dropped token is
  loud in tests), "管理员关闭了游客上传", or accepting it.
- The extension comes from the client's file name (as Lsky's
  getClientOriginalExtension does) and must be in `accepted_suffixes`; the
  mimetype comes from the content. `strategy_id`, when present at all (even
  empty), must name a known strategy. An identical file (md5 + sha1) in the
  same strategy reuses the stored path, as Lsky does.
- JSON is encoded like PHP's json_encode: non-ASCII as \\uXXXX, "/" as "\\/".

Failures are scripted: `script(Behaviour.rate_limited(), Behaviour.drop())`
queues behaviours that the next authenticated upload requests consume one each;
after that uploads succeed again. Every upload request is recorded in `uploads`.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import secrets
import shutil
import string
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from devkit import multipart
from devkit._cli import exit_cleanly_on_signals
from devkit._http import BackgroundServer, QuietHandler
from devkit.images import sniff

__all__ = [
    "DEFAULT_SUFFIXES",
    "DEFAULT_TOKEN",
    "Behaviour",
    "GuestMode",
    "Kind",
    "LskyStandIn",
    "UploadAttempt",
]

DEFAULT_TOKEN = "1|local-test-token"
# Lsky's default group setting "accepted_file_suffixes" (note: no avif).
DEFAULT_SUFFIXES = frozenset({"jpeg", "jpg", "png", "gif", "tif", "bmp", "ico", "psd", "webp"})
SUCCESS_MESSAGE = "上传成功"
CATCH_ALL_MESSAGE = "服务异常，请稍后再试"  # noqa: RUF001 (Lsky's exact text)

NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    b"<center><h1>413 Request Entity Too Large</h1></center>\r\n"
    b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
HTML_PAGE = (
    b'<!DOCTYPE html>\n<html lang="zh-CN">\n<head><meta charset="utf-8">'
    b'<title>Lsky Pro</title></head>\n<body><div id="app">maintenance</div></body>\n</html>\n'
)


class Kind(enum.Enum):
    SUCCESS = "success"
    STATUS_FALSE = "status_false"
    UNAUTHORIZED = "http_401"
    FORBIDDEN = "http_403"
    TOO_LARGE = "http_413"
    RATE_LIMITED = "http_429"
    SERVER_ERROR = "http_500"
    HTML_200 = "html_200"
    DROP = "drop"


@dataclass(frozen=True)
class Behaviour:
    """How to answer one upload. Build with the class methods."""

    kind: Kind = Kind.SUCCESS
    message: str = ""
    delay: float = 0.0  # seconds to sleep after reading the request
    retry_after: int = 60
    store: bool = False  # keep the file although the answer is a failure
    partial: bool = True  # DROP: half a response first (else none at all)

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
    def rate_limited(cls, retry_after: int = 60) -> Behaviour:
        return cls(Kind.RATE_LIMITED, "Too Many Attempts.", retry_after=retry_after)

    @classmethod
    def server_error(cls) -> Behaviour:
        """Laravel's production 500: {"message": "Server Error"}, no status key."""
        return cls(Kind.SERVER_ERROR, "Server Error")

    @classmethod
    def html_200(cls) -> Behaviour:
        """A 200 with an HTML page (a proxy or maintenance page)."""
        return cls(Kind.HTML_200)

    @classmethod
    def slow(cls, seconds: float, then: Behaviour | None = None) -> Behaviour:
        """Wait `seconds` after reading the request, then answer as `then`."""
        return replace(then or cls.success(), delay=seconds)

    @classmethod
    def drop(cls, *, partial: bool = True, store: bool = True) -> Behaviour:
        """Close the connection mid-response. By default the file was stored
        first, as when a proxy times out while the app finishes its work."""
        return cls(Kind.DROP, store=store, partial=partial)


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
    outcome: str  # a Kind value, or unauthenticated/guest_disabled/rejected/malformed/csrf
    status: int  # HTTP status sent (0: connection closed before a status line)
    message: str | None = None
    pathname: str | None = None  # where it was stored, if it was
    origin: str | None = None
    referer: str | None = None

    @property
    def sent_origin_or_referer(self) -> bool:
        return self.origin is not None or self.referer is not None

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass
class _Stored:
    key: str
    path: str
    name: str
    size_kb: float
    mimetype: str

    @property
    def pathname(self) -> str:
        return f"{self.path}/{self.name}"


@dataclass
class _Config:
    token: str
    guest_mode: GuestMode
    accepted_suffixes: frozenset[str]
    max_file_kb: float | None
    strategy_ids: frozenset[int]
    csrf_check: bool


@dataclass
class _Request:
    headers: dict[str, str]
    form: multipart.Form = field(default_factory=multipart.Form)
    temp: Path | None = None
    error: str | None = None


class LskyStandIn(BackgroundServer):
    """Lsky Pro v1 API stand-in on 127.0.0.1 (context manager)."""

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
    ) -> None:
        """max_file_kb: Lsky's per-group limit (its default is 5120); None = no limit.
        csrf_check: answer 419 when Origin or Referer is sent, as Sanctum does for
        requests that look like they come from a stateful (browser) domain.
        """
        self.handler_class = _Handler
        self._defaults = _Config(
            token=token,
            guest_mode=guest_mode,
            accepted_suffixes=frozenset(s.lower() for s in accepted_suffixes),
            max_file_kb=max_file_kb,
            strategy_ids=frozenset(strategy_ids),
            csrf_check=csrf_check,
        )
        self.config = replace(self._defaults)
        self._owns_storage = storage_dir is None
        self.storage_dir = Path(storage_dir or tempfile.mkdtemp(prefix="devkit-lsky-"))
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self._incoming = self.storage_dir / ".incoming"
        self._incoming.mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._script: deque[Behaviour] = deque()
        self._uploads: list[UploadAttempt] = []
        self._index: dict[tuple[int | None, str, str], _Stored] = {}  # (strategy, md5, sha1)
        self._by_md5: dict[str, _Stored] = {}
        self._last_uniqid = ""
        super().__init__(host, port)
        self.public_url = (public_url or self.base_url).rstrip("/")

    # -- scripting and records --------------------------------------------------

    @property
    def token(self) -> str:
        return self.config.token

    @property
    def api_url(self) -> str:
        return self.base_url + "/api/v1"

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

    def stored_path(self, pathname_or_url: str) -> Path:
        """The file on disk for a `pathname` or a `links.url`."""
        prefix = self.public_url + "/i/"
        pathname = pathname_or_url.removeprefix(prefix)
        path = (self.storage_dir / pathname).resolve()
        if not path.is_relative_to(self.storage_dir.resolve()):
            raise ValueError(f"outside the storage dir: {pathname_or_url}")
        return path

    def reset(self) -> None:
        """Forget the script, the records and the dedup index; restore config.
        Files already stored stay on disk."""
        with self._lock:
            self._script.clear()
            self._uploads.clear()
            self._index.clear()
            self._by_md5.clear()
            self.config = replace(self._defaults)

    def stop(self) -> None:
        super().stop()
        if self._owns_storage:
            shutil.rmtree(self.storage_dir, ignore_errors=True)

    # -- used by the handler ------------------------------------------------------

    def _next_behaviour(self) -> Behaviour:
        with self._lock:
            return self._script.popleft() if self._script else Behaviour.success()

    def _record(self, attempt: UploadAttempt) -> None:
        with self._lock:
            self._uploads.append(attempt)

    def _new_temp(self) -> Path:
        return self._incoming / uuid.uuid4().hex

    def _store(self, temp: Path, part: multipart.FilePart, strategy: int | None) -> _Stored:
        extension = _extension(part.filename)
        with self._lock:
            existing = self._index.get((strategy, part.md5, part.sha1))
            if existing is not None:
                # Lsky only creates a new record pointing at the old file.
                temp.unlink(missing_ok=True)
                stored = replace(existing, key=_random_key(), size_kb=part.size / 1024)
                self._by_md5[part.md5] = stored
                return stored
            path = time.strftime("%Y/%m/%d")
            stored = _Stored(
                key=_random_key(),
                path=path,
                name=f"{self._uniqid()}.{extension}",
                size_kb=part.size / 1024,
                mimetype=sniff(part.head) or "application/octet-stream",
            )
            self._index[(strategy, part.md5, part.sha1)] = stored
            self._by_md5[part.md5] = stored
        target = self.storage_dir / stored.pathname
        target.parent.mkdir(parents=True, exist_ok=True)
        temp.replace(target)
        return stored

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

    def _thumbnail(self, md5: str) -> _Stored | None:
        with self._lock:
            return self._by_md5.get(md5)

    def _profile(self) -> dict[str, Any]:
        with self._lock:
            used = sum(s.size_kb for s in self._by_md5.values())
            count = len(self._by_md5)
        return {
            "name": "local",
            "avatar": f"{self.public_url}/avatar.png",
            "email": "local@example.test",
            "capacity": 1048576.0,
            "used_capacity": used,
            "url": "",
            "image_num": count,
            "album_num": 0,
            "registered_ip": "127.0.0.1",
        }

    def _links(self, stored: _Stored, md5: str, origin_name: str) -> dict[str, str]:
        url = f"{self.public_url}/i/{stored.pathname}"
        return {
            "url": url,
            # Lsky escapes only the angle brackets, and not origin_name.
            "html": f'&lt;img src="{url}" alt="{origin_name}" title="{origin_name}" /&gt;',
            "bbcode": f"[img]{url}[/img]",
            "markdown": f"![{origin_name}]({url})",
            "markdown_with_link": f"[![{origin_name}]({url})]({url})",
            "thumbnail_url": f"{self.public_url}/thumbnails/{md5}.png",
        }


def _random_key() -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(6))  # Str::random(6)


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

    do_DELETE = do_PUT
    do_PATCH = do_PUT

    def _get(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path == "/api/v1/profile":
            self._profile()
        elif path.startswith("/i/"):
            self._serve_file(path.removeprefix("/i/"), head=head)
        elif path.startswith("/thumbnails/"):
            stored = self.owner._thumbnail(path.removeprefix("/thumbnails/").split(".", 1)[0])
            if stored is None:
                self._send(404, b"Not Found", "text/plain")
            else:
                self._serve_file(stored.pathname, head=head)
        elif path == "/login":
            self._send(200, HTML_PAGE, "text/html; charset=UTF-8")
        else:
            self._not_routed(path)

    def _not_routed(self, path: str) -> None:
        if path == "/api/v1/upload" or (path == "/api/v1/profile" and self.command != "GET"):
            allowed = "POST" if path.endswith("upload") else "GET, HEAD"
            message = (
                f"The {self.command} method is not supported for this route. "
                f"Supported methods: {allowed}."
            )
            self._send(405, php_json({"message": message}), "application/json")
        elif path.startswith("/api/"):
            message = f"The route {path.lstrip('/')} could not be found."
            self._send(404, php_json({"message": message}), "application/json")
        else:
            self._send(404, b"<!DOCTYPE html><title>Not Found</title>", "text/html")

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

    def _unauthenticated(self, headers: dict[str, str], message: str) -> int:
        if _wants_json(headers):
            self._send(401, envelope(False, message), "application/json")
            return 401
        location = f"{self.owner.public_url}/login"
        page = f'<!DOCTYPE html><meta http-equiv="refresh" content="0;url={location}">'
        self._send(302, page.encode(), "text/html; charset=UTF-8", {"Location": location})
        return 302

    def _profile(self) -> None:
        headers = self._headers()
        token = _bearer(headers.get("authorization", ""))
        if token != self.owner.token:
            # auth:sanctum middleware: its exception message is "Unauthenticated."
            self._unauthenticated(headers, "Unauthenticated.")
            return
        self._send(200, envelope(True, "success", self.owner._profile()), "application/json")

    def _serve_file(self, pathname: str, *, head: bool) -> None:
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
            body = multipart.read_body(self.rfile, headers)
            request.form = multipart.parse(body, boundary, open_sink)
        except multipart.MultipartError as exc:
            request.error = str(exc)
            self.close_connection = True  # the stream position is unknown now
        finally:
            for sink in sinks:
                sink.close()
        return request

    def _upload(self) -> None:
        headers = self._headers()
        request = self._read_upload(headers)
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
            )
        )
        self.wfile.flush()
        if self._drop_pending:
            self.drop_connection()

    def _answer_upload(self, request: _Request) -> tuple[int, str, str | None, _Stored | None]:
        """Send the answer; returns (HTTP status, outcome, message, stored)."""
        refused = self._gate(request.headers)
        if refused is not None:
            return refused
        behaviour = self.owner._next_behaviour()
        if behaviour.delay:
            time.sleep(behaviour.delay)
        if behaviour.kind is Kind.SUCCESS:
            return self._succeed(request)
        stored = self._store(request) if behaviour.store and request.error is None else None
        status, message = _FAILURES[behaviour.kind](self, request.headers, behaviour)
        return status, behaviour.kind.value, message, stored

    def _gate(self, headers: dict[str, str]) -> tuple[int, str, str | None, None] | None:
        """CSRF and authentication, before the controller runs; None = let it in."""
        config = self.owner.config
        if config.csrf_check and ("origin" in headers or "referer" in headers):
            self._send(419, php_json({"message": "CSRF token mismatch."}), "application/json")
            return 419, "csrf", "CSRF token mismatch.", None
        token_ok = "authorization" in headers and _bearer(headers["authorization"]) == config.token
        guest = "authorization" not in headers
        if token_ok or (guest and config.guest_mode is GuestMode.ALLOW):
            return None
        if guest and config.guest_mode is GuestMode.DISABLED:
            return self._fail("管理员关闭了游客上传", "guest_disabled")
        message = "Authentication failed."
        return self._unauthenticated(headers, message), "unauthenticated", message, None

    def _succeed(self, request: _Request) -> tuple[int, str, str | None, _Stored | None]:
        rejection = self._validate(request)
        if rejection is not None:
            return self._fail(rejection, "rejected")
        stored = self._store(request)
        assert stored is not None
        self._send(200, self._success_body(request, stored), "application/json")
        return 200, Kind.SUCCESS.value, SUCCESS_MESSAGE, stored

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
            "X-RateLimit-Reset": str(int(time.time()) + b.retry_after),
        }
        self._send(429, envelope(False, b.message), "application/json", limits)
        return 429, b.message

    def _server_error(self, headers: dict[str, str], b: Behaviour) -> tuple[int, str | None]:
        self._send(500, php_json({"message": "Server Error"}), "application/json")
        return 500, "Server Error"

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

    def _store(self, request: _Request) -> _Stored | None:
        part = request.form.file("file")
        if part is None or request.temp is None:
            return None
        raw = request.form.fields.get("strategy_id", "").strip()
        # No strategy_id: Lsky uses the group's first strategy.
        strategy = int(raw) if raw.isdigit() else min(self.owner.config.strategy_ids, default=None)
        stored = self.owner._store(request.temp, part, strategy)
        request.temp = None  # moved (or deduplicated away)
        return stored

    def _success_body(self, request: _Request, stored: _Stored) -> bytes:
        part = request.form.file("file")
        assert part is not None
        data = {
            "key": stored.key,
            "name": stored.name,
            "pathname": stored.pathname,
            "origin_name": part.filename,
            "size": stored.size_kb,
            "mimetype": stored.mimetype,
            "extension": _extension(part.filename),
            "md5": part.md5,
            "sha1": part.sha1,
            "links": self.owner._links(stored, part.md5, part.filename),
        }
        return envelope(True, SUCCESS_MESSAGE, data)


_FAILURES: dict[Kind, Callable[[_Handler, dict[str, str], Behaviour], tuple[int, str | None]]] = {
    Kind.STATUS_FALSE: _Handler._status_false,
    Kind.UNAUTHORIZED: _Handler._revoked,
    Kind.FORBIDDEN: _Handler._forbidden,
    Kind.TOO_LARGE: _Handler._too_large,
    Kind.RATE_LIMITED: _Handler._rate_limited,
    Kind.SERVER_ERROR: _Handler._server_error,
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
    args = parser.parse_args(argv)

    server = LskyStandIn(
        token=args.token,
        storage_dir=args.storage,
        host=args.host,
        port=args.port,
        guest_mode=GuestMode(args.guest),
        max_file_kb=args.max_file_kb,
        public_url=args.public_url,
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
