"""Fetch the upstream image into a spooled temporary file, capped and verified.

One module owns everything about reading a URL we did not choose, so the guard
around it (address checks, redirects, deadlines) can harden here without the
handler changing. Small images stay in memory; larger ones spill to /tmp, so
memory use does not grow with the image.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import IO
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.exceptions import HTTPError, ProtocolError, TimeoutError

from lib.failures import Kind, Stage, fail
from lib.imagetype import SNIFF_BYTES, ImageType, sniff

CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
MAX_REDIRECTS = 3
SPOOL_IN_MEMORY_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 256 * 1024
USER_AGENT = "image-archive/1.0 (+https://github.com/lsky-org/lsky-pro uploader)"


@dataclass
class DownloadedImage:
    file: IO[bytes]
    size: int
    image_type: ImageType

    def close(self) -> None:
        self.file.close()


def safe_url(url: str) -> str:
    """A URL as it may appear in logs and errors: scheme, host and path, no query or userinfo
    (provider URLs are signed; the signature is a credential)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    path = parts.path if len(parts.path) <= 80 else parts.path[:77] + "..."
    return f"{parts.scheme}://{host}{port}{path}"


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise fail(Stage.DOWNLOAD, Kind.REFUSED_URL, f"scheme {parts.scheme or 'none'!r} refused")
    if not parts.hostname:
        raise fail(Stage.DOWNLOAD, Kind.REFUSED_URL, "URL has no host")


class Downloader:
    def __init__(self, *, max_bytes: int, pool: urllib3.PoolManager | None = None) -> None:
        self.max_bytes = max_bytes
        self.pool = pool or urllib3.PoolManager(
            num_pools=8,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS),
            retries=False,
            headers={"User-Agent": USER_AGENT},
        )

    def fetch(self, url: str, *, deadline: float) -> DownloadedImage:
        """Download `url`; raises ArchiveFailure (stage download) on every failure."""
        for _ in range(MAX_REDIRECTS + 1):
            _check_url(url)
            response = self._open(url, deadline)
            try:
                if response.status in (301, 302, 303, 307, 308):
                    location = response.headers.get("Location")
                    if not location:
                        raise fail(
                            Stage.DOWNLOAD,
                            Kind.HTTP_STATUS,
                            "redirect without Location",
                            status=response.status,
                        )
                    url = urljoin(url, location)
                    continue
                if response.status != 200:
                    raise fail(
                        Stage.DOWNLOAD,
                        Kind.HTTP_STATUS,
                        f"upstream answered HTTP {response.status} for {safe_url(url)}",
                        status=response.status,
                        retry_after=retry_after_seconds(response.headers.get("Retry-After")),
                    )
                return self._read_body(response, url, deadline)
            finally:
                response.drain_conn()
                response.release_conn()
        raise fail(Stage.DOWNLOAD, Kind.REFUSED_URL, f"more than {MAX_REDIRECTS} redirects")

    def _open(self, url: str, deadline: float) -> urllib3.BaseHTTPResponse:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise fail(Stage.DOWNLOAD, Kind.NO_TIME, "no time left to download")
        timeout = urllib3.Timeout(
            connect=min(CONNECT_TIMEOUT_SECONDS, remaining),
            read=min(READ_TIMEOUT_SECONDS, remaining),
        )
        try:
            return self.pool.request(
                "GET",
                url,
                preload_content=False,
                redirect=False,
                timeout=timeout,
                # Compressed transfer would let a small body inflate past the cap.
                headers={"Accept-Encoding": "identity", "Accept": "image/*"},
                decode_content=False,
            )
        except TimeoutError:
            raise fail(
                Stage.DOWNLOAD, Kind.TIMEOUT, f"timed out connecting to {safe_url(url)}"
            ) from None
        except HTTPError as error:
            raise fail(
                Stage.DOWNLOAD,
                Kind.CONNECTION,
                f"could not connect to {safe_url(url)} ({type(error).__name__})",
            ) from None

    def _read_body(
        self, response: urllib3.BaseHTTPResponse, url: str, deadline: float
    ) -> DownloadedImage:
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise fail(
                Stage.DOWNLOAD,
                Kind.TOO_LARGE,
                f"image is {int(declared)} bytes, over the {self.max_bytes}-byte limit",
            )
        spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115
        try:
            size, head = self._copy(response, spool, url, deadline)
            image_type = _verify(head, size, declared)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return DownloadedImage(file=spool, size=size, image_type=image_type)

    def _copy(
        self, response: urllib3.BaseHTTPResponse, spool: IO[bytes], url: str, deadline: float
    ) -> tuple[int, bytes]:
        """Copy the body into `spool`, enforcing the size cap and the deadline as it streams."""
        size, head = 0, b""
        while chunk := _read_chunk(response, url):
            size += len(chunk)
            if size > self.max_bytes:
                raise fail(
                    Stage.DOWNLOAD, Kind.TOO_LARGE, f"image is over the {self.max_bytes}-byte limit"
                )
            if time.monotonic() > deadline:
                raise fail(Stage.DOWNLOAD, Kind.TIMEOUT, "download ran past the attempt's deadline")
            if len(head) < SNIFF_BYTES:
                head += chunk[: SNIFF_BYTES - len(head)]
            spool.write(chunk)
        return size, head


def _verify(head: bytes, size: int, declared: str | None) -> ImageType:
    """The image type of a complete body, or the reason it cannot be archived."""
    image_type = sniff(head)
    if image_type is None:
        raise fail(
            Stage.DOWNLOAD,
            Kind.NOT_IMAGE,
            "upstream body is not a PNG, JPEG, GIF, WebP or AVIF image",
        )
    if declared and declared.isdigit() and int(declared) != size:
        raise fail(
            Stage.DOWNLOAD,
            Kind.CONNECTION,
            f"body was {size} bytes, Content-Length said {declared}",
        )
    return image_type


def _read_chunk(response: urllib3.BaseHTTPResponse, url: str) -> bytes:
    try:
        return response.read(READ_CHUNK_BYTES, decode_content=False)
    except TimeoutError:
        raise fail(Stage.DOWNLOAD, Kind.TIMEOUT, f"timed out reading {safe_url(url)}") from None
    except (ProtocolError, HTTPError, OSError):
        raise fail(
            Stage.DOWNLOAD, Kind.CONNECTION, f"connection dropped while reading {safe_url(url)}"
        ) from None


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
