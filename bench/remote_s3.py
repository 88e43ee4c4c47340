"""S3 as a remote peer costs the function's machine, for the benches: `python -m bench.remote_s3`.

On Lambda, S3 stores an original on AWS's machines: its MD5, its disk and its bookkeeping
use none of the function's CPU. moto's S3 on loopback does all of that in Python on the
bench's 2 CPUs (about 55 ms for a 10 MB PUT), beside the provider, Lsky and the function,
so a ratio against it prices moto as much as the archive. This server does what a remote
S3 leaves to the function's machine: the body is received (the kernel's and one read's
work), then answered as S3 answers a PutObject to a versioned bucket.

PutObject only, with a Content-Length and an unsigned or signed single-chunk payload
(what lib.platform.s3_originals sends); anything else is answered 501 NotImplemented, so
a change in what the function sends shows as a failed bench, not a wrong figure. A body
short of its Content-Length is answered 400 IncompleteBody, as S3 does, and stores
nothing. The ETag is not the body's MD5 (that is S3's CPU, not the function's): the
function does not read it. `GET /__counts` answers the PUTs stored and their bytes.

prints `REMOTE_S3_URL=http://127.0.0.1:PORT` once listening, then serves until stdin
closes (so it never outlives the bench that started it).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# One read of the body at most: the socket's buffer, not a copy of the image.
READ_BYTES = 1024 * 1024
# A PUT larger than this is refused (EntityTooLarge, as S3's single-PUT limit is 5 GiB).
MAX_BODY_BYTES = 5 * 1024**3
_STREAMING = "STREAMING-"  # aws-chunked payloads: not what the function sends


class RemoteS3Server(ThreadingHTTPServer):
    """The server: what it has stored, counted (nothing else is kept)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, RemoteS3Handler)
        self.lock = threading.Lock()
        self.puts = 0
        self.bytes = 0
        self.versions = itertools.count(1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RemoteS3Handler(BaseHTTPRequestHandler):
    """PutObject received and answered; nothing kept but the counts."""

    protocol_version = "HTTP/1.1"  # keep-alive, and `Expect: 100-continue` answered
    disable_nagle_algorithm = True  # the answer is one small write after the body
    server: RemoteS3Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: one line a request would cost CPU the function's machine does not pay."""

    def do_PUT(self) -> None:
        bucket, _, key = self.path.lstrip("/").partition("/")
        length = self.headers.get("Content-Length", "")
        payload = self.headers.get("x-amz-content-sha256", "")
        if not bucket or not key or "?" in self.path or payload.startswith(_STREAMING):
            self._error(501, "NotImplemented", "only a plain PutObject")
            return
        if "Transfer-Encoding" in self.headers or not length.isdigit():
            self._error(411, "MissingContentLength", "a Content-Length is required")
            return
        size = int(length)
        if size > MAX_BODY_BYTES:
            self._error(400, "EntityTooLarge", "larger than a single PUT may be")
            return
        if self._receive(size) < size:
            self._error(400, "IncompleteBody", "fewer bytes than the Content-Length")
            return
        with self.server.lock:
            self.server.puts += 1
            self.server.bytes += size
            version = f"{next(self.server.versions):032x}"
        self.send_response(200)
        self.send_header("ETag", f'"{version}"')
        self.send_header("x-amz-version-id", version)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path != "/__counts":
            self._error(501, "NotImplemented", "only a plain PutObject")
            return
        with self.server.lock:
            body = json.dumps({"puts": self.server.puts, "bytes": self.server.bytes}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._error(501, "NotImplemented", "only a plain PutObject")

    do_POST = do_DELETE = do_HEAD

    def _receive(self, size: int) -> int:
        """Read `size` bytes into one reused buffer; how many came before the peer stopped."""
        buffer = memoryview(bytearray(min(READ_BYTES, max(size, 1))))
        got = 0
        while got < size:
            n = self.rfile.readinto(buffer[: min(len(buffer), size - got)])
            if not n:
                self.close_connection = True
                break
            got += n
        return got

    def _error(self, status: int, code: str, message: str) -> None:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # an answer to a HEAD has no body
            self.wfile.write(body)
        self.close_connection = True


def main() -> int:
    server = RemoteS3Server(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"REMOTE_S3_URL={server.url}", flush=True)
    sys.stdin.read()  # EOF when the parent exits or closes the pipe
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
