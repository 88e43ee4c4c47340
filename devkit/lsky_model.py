"""The server side of the Lsky stand-in (`devkit.lsky`): its images table and
what Lsky Pro 2.x computes from it, read from lsky-org/lsky-pro and Laravel 9.

- `Gallery`: image rows and albums. Rows are what `ImageService::store` saves;
  deleting one removes the file only when no other row of the same strategy
  shares its md5 + sha1 (`Image::booted`, deleting).
- `rate_limit_message`: `ImageService::rateLimiter`, sliding windows counted
  from the rows in whole seconds, as wall-clock text in the app's zone (the SQL's
  comparison), the month as Carbon's "-1 month" (`window_count`,
  `carbon_ago`: the reference the ledger's tests check pacing against).
- `list_images`: `GET /api/v1/images`, i.e. `scopeFilter` on `$user->images()`
  and `paginate(40)->withQueryString()`, with Laravel's paginator JSON.
- `process_file` / `dimensions`: the re-encode + watermark step (a deterministic
  stand-in alteration, no image library) and `getimagesize`.

Not thread-safe: `LskyStandIn` calls all of this under its lock.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import secrets
import string
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO
from urllib.parse import quote

from devkit.images import PNG_SIGNATURE, sniff

__all__ = [
    "PER_PAGE",
    "PRIVATE",
    "PUBLIC",
    "WINDOWS",
    "Album",
    "Digest",
    "Gallery",
    "ImageRecord",
    "carbon_ago",
    "dimensions",
    "file_digest",
    "insertion",
    "list_images",
    "normalise_limits",
    "normalise_windows",
    "process_file",
    "rate_limit_message",
    "scope_filter",
    "sql_text",
    "trimmed_query",
    "window_count",
]

PER_PAGE = 40  # ImageController::images: paginate(40)
PUBLIC, PRIVATE = 1, 0  # App\Enums\ImagePermission
PRC = timezone(timedelta(hours=8), "PRC")  # config/app.php 'timezone' => 'PRC'

# ImageService::rateLimiter, in its order: (name, the message's word, real seconds).
# At its real length a window is Carbon's own (`carbon_ago`: the month a calendar month);
# scaled (`window_scale`), it is that many seconds, and a 30-day month is what is scaled.
WINDOWS: tuple[tuple[str, str, float], ...] = (
    ("minute", "分钟", 60.0),
    ("hour", "小时", 3600.0),
    ("day", "天", 86400.0),
    ("week", "周", 7 * 86400.0),
    ("month", "月", 30 * 86400.0),
)
_WINDOW_NAMES = {name: name for name, _, _ in WINDOWS} | {
    "minutes": "minute",  # Lsky's own keys are minute, hours, days, weeks, months
    "hours": "hour",
    "days": "day",
    "weeks": "week",
    "months": "month",
}


def normalise_limits(limits: Mapping[str, int] | None) -> Mapping[str, int]:
    """{"minute": 3, "hours": 10} -> read-only {"minute": 3, "hour": 10}; 0 = no limit."""
    result: dict[str, int] = {}
    for key, value in (limits or {}).items():
        name = _WINDOW_NAMES.get(key)
        if name is None:
            raise ValueError(f"unknown rate-limit window {key!r}; use {sorted(_WINDOW_NAMES)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"rate limit {key}={value!r}: a count >= 0 (0 = no limit)")
        result[name] = value
    return MappingProxyType(result)


def normalise_windows(scale: float | Mapping[str, float] | None) -> Mapping[str, float]:
    """Seconds per window. None: real durations; a number: every real duration times
    it; a mapping: seconds for the windows it names (e.g. {"minute": 2, "hour": 6}),
    real durations for the rest."""
    if scale is None or isinstance(scale, int | float):
        factor = 1.0 if scale is None else float(scale)
        if factor <= 0:
            raise ValueError("window_scale must be > 0")
        return MappingProxyType({name: real * factor for name, _, real in WINDOWS})
    result = {name: real for name, _, real in WINDOWS}
    for key, seconds in scale.items():
        name = _WINDOW_NAMES.get(key)
        if name is None:
            raise ValueError(f"unknown window {key!r}; use {sorted(_WINDOW_NAMES)}")
        if not seconds > 0:
            raise ValueError(f"window {key}: seconds must be > 0")
        result[name] = float(seconds)
    return MappingProxyType(result)


def carbon_ago(unit: str, now: datetime) -> datetime:
    """`Carbon::now()->parse("-1 {unit}")` at `now` (aware, in the app's zone): PHP's
    relative time. A minute and an hour are elapsed time; a day, a week and a month move
    the wall clock, and a month keeps the day of the month, running on into the next
    month when the month before is shorter ("-1 month" on March 31 is February 31, which
    PHP reads as March 3, or March 2 in a leap year)."""
    if unit in ("minute", "hour"):
        # Elapsed: through UTC, since Python's arithmetic on an aware datetime moves its
        # wall clock (an hour back from 02:30 in the hour the clock repeats would be 01:30
        # summer time, two hours earlier).
        elapsed = timedelta(minutes=1) if unit == "minute" else timedelta(hours=1)
        return (now.astimezone(UTC) - elapsed).astimezone(now.tzinfo)
    wall = now.replace(tzinfo=None)
    if unit in ("day", "week"):
        wall -= timedelta(days=1 if unit == "day" else 7)
    else:
        year, month = (wall.year, wall.month - 1) if wall.month > 1 else (wall.year - 1, 12)
        days = (datetime(year + month // 12, month % 12 + 1, 1) - datetime(year, month, 1)).days
        overflow = max(wall.day - days, 0)
        wall = wall.replace(year=year, month=month, day=wall.day - overflow)
        wall += timedelta(days=overflow)
    return wall.replace(tzinfo=now.tzinfo)


def window_count(
    created: Iterable[float], *, now: float, seconds: float, unit: str | None, zone: Any = PRC
) -> int:
    """Rows a window counts at `now` (epoch seconds), as the SQL runs: `whereBetween(
    'created_at', [start, now])`, where Laravel wrote each created_at and binds both ends
    as wall-clock text in the app's zone (`Y-m-d H:i:s`), so MySQL compares texts: whole
    seconds, both ends included, and where the clock is set back an hour's texts come
    twice. `unit` (minute ... month): the start is Carbon's `carbon_ago` in `zone`; None:
    `seconds` before now (a scaled window)."""
    if unit is None:
        start = now - seconds
    else:
        start = carbon_ago(unit, datetime.fromtimestamp(now, zone)).timestamp()
    low, high = sql_text(start, zone), sql_text(now, zone)
    return sum(1 for t in created if low <= sql_text(t, zone) <= high)


def sql_text(at: float, zone: Any = PRC) -> str:
    """The instant `at` (epoch seconds) as Laravel writes and binds it: Carbon's
    'Y-m-d H:i:s' on the wall clock of the app's zone (the fraction dropped)."""
    return _wall_text(math.floor(at), zone)


@functools.lru_cache(maxsize=65_536)
def _wall_text(second: int, zone: Any) -> str:
    return datetime.fromtimestamp(second, zone).strftime("%Y-%m-%d %H:%M:%S")


def rate_limit_message(
    limits: Mapping[str, int],
    windows: Mapping[str, float],
    created: Iterable[float],
    now: float,
    *,
    zone: Any = PRC,
    month_limit: str = "month",
) -> str | None:
    """ImageService::rateLimiter: the first window (minute, hour, day, week, month)
    whose limit N > 0 already holds >= N rows (`window_count` in the app's `zone`;
    `created` and `now` in epoch seconds, Lsky's clock). `month_limit`: the setting the
    month is held to (Lsky 2.0 to 2.0.4: the week's), the N its message names."""
    times = list(created)
    for name, word, real in WINDOWS:
        limit = limits.get(month_limit if name == "month" else name, 0)
        seconds = windows[name]
        unit = name if seconds == real else None
        if limit and window_count(times, now=now, seconds=seconds, unit=unit, zone=zone) >= limit:
            return f"每{word}内你最多可以上传 {limit} 张图片"
    return None


@dataclass(frozen=True)
class ImageRecord:
    """One row of Lsky's images table, as the stand-in keeps it."""

    id: int
    key: str
    owner: str | None  # the user's name; None = a guest upload
    album_id: int | None
    strategy_id: int | None
    path: str
    name: str
    origin_name: str
    alias_name: str
    size_kb: float  # as computed at upload time (the upload answer's `size`)
    mimetype: str
    extension: str
    md5: str
    sha1: str
    width: int
    height: int
    permission: int
    uploaded_ip: str
    created: float  # time.monotonic() at insert (rate windows, stored_timestamps)
    created_at: datetime  # wall clock (ordering, `date`, `human_date`)
    source: str = "upload"  # "upload" (POST /api/v1/upload) or "planted" (add_image)

    @property
    def pathname(self) -> str:
        return f"{self.path}/{self.name}" if self.path else self.name

    @property
    def size(self) -> float:
        """The column is DECIMAL(8,2): what the listing and the sums see."""
        return float(Decimal(repr(self.size_kb)).quantize(Decimal("0.01"), ROUND_HALF_UP))


@dataclass(frozen=True)
class Album:
    id: int
    owner: str
    name: str


@dataclass
class Gallery:
    """The images and albums tables, plus an append-only log of row creations."""

    rows: list[ImageRecord] = field(default_factory=list)
    albums: dict[int, Album] = field(default_factory=dict)
    # (owner, monotonic time, source) of every row ever inserted, deleted or not.
    created_log: list[tuple[str | None, float, str]] = field(default_factory=list)
    _next_id: int = 1
    _next_album: int = 1

    def clear(self) -> None:
        self.rows.clear()
        self.albums.clear()
        self.created_log.clear()
        self._next_id = self._next_album = 1

    def add_album(self, owner: str, name: str) -> Album:
        album = Album(self._next_album, owner, name)
        self.albums[album.id] = album
        self._next_album += 1
        return album

    def new_key(self) -> str:
        # Image::generateKey: Str::random(6), one character longer on a clash.
        alphabet = string.ascii_letters + string.digits
        taken = {row.key for row in self.rows}
        length = 6
        while True:
            key = "".join(secrets.choice(alphabet) for _ in range(length))
            if key not in taken:
                return key
            length += 1

    def insert(self, **values: Any) -> ImageRecord:
        row = ImageRecord(id=self._next_id, key=self.new_key(), **values)
        self._next_id += 1
        self.rows.append(row)
        self.created_log.append((row.owner, row.created, row.source))
        return row

    def find_file(self, strategy_id: int | None, md5: str, sha1: str) -> ImageRecord | None:
        """ImageService::store's "same file in this strategy" lookup (first row)."""
        return next(
            (
                r
                for r in self.rows
                if (strategy_id is None or r.strategy_id == strategy_id)
                and (r.md5, r.sha1) == (md5, sha1)
            ),
            None,
        )

    def by_md5(self, md5: str) -> ImageRecord | None:
        return next((r for r in self.rows if r.md5 == md5), None)

    def owned(self, owner: str | None) -> list[ImageRecord]:
        return [r for r in self.rows if r.owner == owner]

    def used_kb(self, owner: str) -> float:
        """`$user->images()->sum('size')` over the DECIMAL(8,2) column."""
        return sum(r.size for r in self.owned(owner))

    def created_times(self, owner: str | None, ip: str) -> list[float]:
        """Creation times (created_at, epoch seconds) of the rows that exist now, as the
        rate limiter counts them: the user's rows, or for a guest the guest rows from the
        same IP."""
        return [
            r.created_at.timestamp()
            for r in self.rows
            if r.owner == owner and (owner is not None or r.uploaded_ip == ip)
        ]

    def delete(self, owner: str, key: str) -> tuple[ImageRecord | None, bool]:
        """UserService::deleteImages for one key of `owner`: (the row or None,
        whether its file is no longer used by any row and should go)."""
        row = next((r for r in self.rows if r.key == key and r.owner == owner), None)
        if row is None:
            return None, False
        self.rows.remove(row)
        shared = any(
            r.strategy_id == row.strategy_id and (r.md5, r.sha1) == (row.md5, row.sha1)
            for r in self.rows
        )
        return row, not shared


# -- GET /api/v1/images ----------------------------------------------------------------


def php_truthy(value: str | None) -> bool:
    return value not in (None, "", "0")


_PHP_NUMBER = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)")


def php_int(value: str | None) -> int:
    """PHP 8's (int) "12abc" == 12, (int) "abc" == 0, (int) "1e3" == 1000."""
    match = _PHP_NUMBER.match(value or "")
    if match is None:
        return 0
    number = float(match.group(1))
    return int(number) if math.isfinite(number) else 0


def _like(value: str, keyword: str) -> bool:
    """MySQL `value LIKE '%keyword%'` under utf8mb4_unicode_ci (case-insensitive;
    % and _ in the keyword are wildcards, backslash escapes)."""
    pattern, escaped = [], False
    for char in keyword:
        if escaped:
            pattern.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            pattern.append(".*")
        elif char == "_":
            pattern.append(".")
        else:
            pattern.append(re.escape(char))
    regex = ".*" + "".join(pattern) + ".*"
    return re.fullmatch(regex, value, re.DOTALL | re.IGNORECASE) is not None


def scope_filter(
    rows: Iterable[ImageRecord], owner: str, query: Mapping[str, str | None]
) -> list[ImageRecord]:
    """`$user->images()->filter($request)`: Image::scopeFilter on the relation.

    The relation adds `user_id = ?` first. Eloquent's callScope then wraps the
    scope's own wheres in one group because they contain an OR, so the SQL is
        user_id = ? AND (permission = ? AND origin_name LIKE ?
                         OR alias_name LIKE ? AND album_id <cond>)
    and the ungrouped OR inside the scope means: an origin_name match ignores
    the album filter (an image in an album is listed without `album_id`), an
    alias_name match ignores the permission filter. Other users never leak.
    """
    permission = query.get("permission") or "all"
    keyword = query.get("keyword")
    album_id = php_int(query.get("album_id"))

    def permission_ok(row: ImageRecord) -> bool:
        if permission == "public":
            return row.permission == PUBLIC
        if permission == "private":
            return row.permission == PRIVATE
        return True

    def album_ok(row: ImageRecord) -> bool:
        return row.album_id == album_id if album_id else row.album_id is None

    def matches(row: ImageRecord) -> bool:
        if row.owner != owner:
            return False
        if keyword is not None and php_truthy(keyword):
            return (permission_ok(row) and _like(row.origin_name, keyword)) or (
                _like(row.alias_name, keyword) and album_ok(row)
            )
        return permission_ok(row) and album_ok(row)

    selected = [row for row in rows if matches(row)]
    order = query.get("order") or "newest"
    if order == "earliest":
        selected.sort(key=lambda r: (r.created_at, r.id))
    elif order == "utmost":
        selected.sort(key=lambda r: (-r.size, r.id))
    elif order == "least":
        selected.sort(key=lambda r: (r.size, r.id))
    else:  # newest, and anything unknown: latest()
        selected.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    return selected


def trimmed_query(pairs: Iterable[tuple[str, str]]) -> dict[str, str | None]:
    """Laravel's TrimStrings + ConvertEmptyStringsToNull on the query (last value wins)."""
    return {key: value.strip(" \t\n\r\v\f\ufeff\u200b") or None for key, value in pairs}


_VALID_INT = re.compile(r"[+-]?(0|[1-9]\d*)")


def current_page(value: str | None) -> int:
    # PaginationState: filter_var($page, FILTER_VALIDATE_INT) !== false && >= 1, else 1.
    text = (value or "").strip()
    if _VALID_INT.fullmatch(text) and int(text) >= 1:
        return int(text)
    return 1


def _human_date(created: datetime, now: datetime) -> str:
    """Carbon diffForHumans() in zh_CN ("1秒前", "3分钟前"); months and years approximate."""
    seconds = max(int((now - created).total_seconds()), 0)
    for unit, size in (
        ("年", 365 * 86400),
        ("个月", 30 * 86400),
        ("周", 7 * 86400),
        ("天", 86400),
        ("小时", 3600),
        ("分钟", 60),
    ):
        if seconds >= size:
            return f"{seconds // size}{unit}前"
    return f"{max(seconds, 1)}秒前"  # NO_ZERO_DIFF: never "0秒前"


def list_images(
    rows: Iterable[ImageRecord],
    owner: str,
    query: Mapping[str, str | None],
    *,
    path: str,
    links: Any,
    zone: tzinfo = PRC,
) -> dict[str, Any]:
    """The `data` of GET /api/v1/images: Laravel's LengthAwarePaginator::toArray().

    `query` is the request's query after trimmed_query; `path` is the request URL
    without its query; `links(row)` gives an item's `links`; `zone` is the app's time
    zone, which `date` is written in (a local time: an hour the clocks repeat reads alike).
    """
    selected = scope_filter(rows, owner, query)
    page = current_page(query.get("page"))
    total = len(selected)
    last_page = max(math.ceil(total / PER_PAGE), 1)
    items = selected[(page - 1) * PER_PAGE : page * PER_PAGE]
    now = datetime.now(UTC)
    # withQueryString(): the other query values, `page` last; nulls are dropped.
    kept = {k: v for k, v in query.items() if k != "page" and v is not None}

    def url(number: int) -> str:
        # Arr::query: http_build_query(..., PHP_QUERY_RFC3986), i.e. rawurlencode.
        pairs = [*kept.items(), ("page", str(max(number, 1)))]
        return path + "?" + "&".join(f"{_raw(k)}={_raw(v)}" for k, v in pairs)

    first = (page - 1) * PER_PAGE + 1 if items else None
    return {
        "current_page": page,
        "data": [
            {
                "key": row.key,
                "name": row.name,
                "origin_name": row.origin_name,
                "size": row.size,
                "mimetype": row.mimetype,
                "extension": row.extension,
                "md5": row.md5,
                "sha1": row.sha1,
                "width": row.width,
                "height": row.height,
                "human_date": _human_date(row.created_at, now),
                "date": row.created_at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S"),
                "pathname": row.pathname,
                "links": links(row),
            }
            for row in items
        ],
        "first_page_url": url(1),
        "from": first,
        "last_page": last_page,
        "last_page_url": url(last_page),
        "links": _link_collection(page, last_page, url),
        "next_page_url": url(page + 1) if page < last_page else None,
        "path": path,
        "per_page": PER_PAGE,
        "prev_page_url": url(page - 1) if page > 1 else None,
        "to": first + len(items) - 1 if first is not None else None,
        "total": total,
    }


def _raw(text: str) -> str:
    return quote(text, safe="-_.~")


def _link_collection(page: int, last: int, url: Any) -> list[dict[str, Any]]:
    """LengthAwarePaginator::linkCollection() with UrlWindow (onEachSide 3) and
    Lsky's zh_CN pagination labels."""
    on_each_side = 3
    window = on_each_side + 4

    def pages(start: int, end: int) -> list[int]:
        return list(range(start, end + 1))

    blocks: list[list[int] | None]
    if last < on_each_side * 2 + 8:
        blocks = [pages(1, last)]
    elif page <= window:
        blocks = [pages(1, window + on_each_side), None, pages(last - 1, last)]
    elif page > last - window:
        blocks = [pages(1, 2), None, pages(last - (window + (on_each_side - 1)), last)]
    else:
        blocks = [
            pages(1, 2),
            None,
            pages(page - on_each_side, page + on_each_side),
            None,
            pages(last - 1, last),
        ]
    links: list[dict[str, Any]] = [
        {"url": url(page - 1) if page > 1 else None, "label": "&laquo; 上一页", "active": False}
    ]
    for block in blocks:
        if block is None:
            links.append({"url": None, "label": "...", "active": False})
        else:
            links.extend({"url": url(n), "label": str(n), "active": n == page} for n in block)
    links.append(
        {"url": url(page + 1) if page < last else None, "label": "下一页 &raquo;", "active": False}
    )
    return links


# -- the store pipeline's file steps -----------------------------------------------------


@dataclass(frozen=True)
class Digest:
    md5: str
    sha1: str
    size: int


_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_COPY = 1 << 20


def _png_text(text: str) -> bytes:
    data = b"Comment\x00" + text.encode()
    body = b"tEXt" + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def insertion(head: bytes, tail: bytes, size: int, text: str) -> tuple[int, bytes]:
    """Where and what to insert so the file stays a valid file of its type:
    a PNG tEXt chunk before IEND, a JPEG COM segment after SOI, else trailing
    bytes (which GIF, WebP, BMP, TIFF... decoders ignore)."""
    if head.startswith(PNG_SIGNATURE) and tail == _PNG_IEND:
        return size - len(_PNG_IEND), _png_text(text)
    if head.startswith(b"\xff\xd8\xff"):
        payload = text.encode()
        return 2, b"\xff\xfe" + struct.pack(">H", len(payload) + 2) + payload
    return size, b"\x00lsky-standin:" + text.encode()


def process_file(source: Path, target: Path, *, quality: int, watermark: bool) -> Digest:
    """The re-encode (quality < 100) and overlay watermark steps, as a deterministic
    alteration: the same input and settings give the same bytes, which differ from
    the upload and still sniff as the same type. Returns the stored file's digest."""
    steps = ([f"re-encoded quality={quality}"] if quality < 100 else []) + (
        ["watermark"] if watermark else []
    )
    size = source.stat().st_size
    with source.open("rb") as handle:
        head = handle.read(16)
        handle.seek(max(size - len(_PNG_IEND), 0))
        tail = handle.read()
    inserts = []
    for step in steps:
        position, data = insertion(head, tail, size, step)
        inserts.append((position, data))
    md5, sha1 = hashlib.md5(usedforsecurity=False), hashlib.sha1(usedforsecurity=False)
    written = 0

    def emit(out: BinaryIO, data: bytes) -> None:
        nonlocal written
        out.write(data)
        md5.update(data)
        sha1.update(data)
        written += len(data)

    with source.open("rb") as src, target.open("wb") as out:
        offset = 0
        for position, data in sorted(inserts, key=lambda item: item[0]):
            while offset < position:
                piece = src.read(min(_COPY, position - offset))
                if not piece:
                    break
                emit(out, piece)
                offset += len(piece)
            emit(out, data)
        while piece := src.read(_COPY):
            emit(out, piece)
    return Digest(md5.hexdigest(), sha1.hexdigest(), written)


def file_digest(path: Path) -> Digest:
    md5, sha1 = hashlib.md5(usedforsecurity=False), hashlib.sha1(usedforsecurity=False)
    size = 0
    with path.open("rb") as handle:
        while piece := handle.read(_COPY):
            md5.update(piece)
            sha1.update(piece)
            size += len(piece)
    return Digest(md5.hexdigest(), sha1.hexdigest(), size)


FALLBACK_SIZE = (400, 400)  # `@getimagesize(...) ?: [400, 400]`


def dimensions(path: Path) -> tuple[int, int]:
    """PHP getimagesize()'s width and height for the common types, else [400, 400]."""
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
            size = _dimensions(head, handle)
    except (OSError, struct.error, ValueError, IndexError):
        return FALLBACK_SIZE
    return size or FALLBACK_SIZE


def _dimensions(head: bytes, handle: BinaryIO) -> tuple[int, int] | None:
    kind = sniff(head)
    if kind == "image/png" and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
        return width, height
    if kind == "image/gif":
        width, height = struct.unpack("<HH", head[6:10])
        return width, height
    if kind == "image/jpeg":
        return _jpeg_size(handle)
    if kind == "image/webp":
        return _webp_size(head)
    if kind == "image/bmp":
        width, height = struct.unpack("<ii", head[18:26])
        return abs(width), abs(height)
    if kind == "image/vnd.adobe.photoshop":
        height, width = struct.unpack(">II", head[14:22])
        return width, height
    if kind == "image/x-icon":
        return head[6] or 256, head[7] or 256
    if kind == "image/tiff":
        return _tiff_size(handle)
    return None


# Start-of-frame markers (not DHT C4, JPG C8, DAC CC).
_SOF_MARKERS = frozenset(set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC})


def _jpeg_size(handle: BinaryIO) -> tuple[int, int] | None:
    handle.seek(2)
    while True:
        marker = handle.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            return None
        if marker[1] in (0xD8, 0x01) or 0xD0 <= marker[1] <= 0xD7:
            continue
        (length,) = struct.unpack(">H", handle.read(2))
        if marker[1] in _SOF_MARKERS:
            height, width = struct.unpack(">xHH", handle.read(5))
            return width, height
        handle.seek(length - 2, 1)


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def _tiff_size(handle: BinaryIO) -> tuple[int, int] | None:
    handle.seek(0)
    order = "<" if handle.read(2) == b"II" else ">"
    handle.seek(4)
    (offset,) = struct.unpack(order + "I", handle.read(4))
    handle.seek(offset)
    (count,) = struct.unpack(order + "H", handle.read(2))
    found: dict[int, int] = {}
    for _ in range(count):
        tag, kind, _count, value = struct.unpack(order + "HHI4s", handle.read(12))
        if tag in (256, 257):
            fmt = "H" if kind == 3 else "I"
            found[tag] = struct.unpack(order + fmt, value[: struct.calcsize(fmt)])[0]
    if 256 in found and 257 in found:
        return found[256], found[257]
    return None
