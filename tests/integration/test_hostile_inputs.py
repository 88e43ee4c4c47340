"""Bad-input corpus: hostile URLs and malformed upstream bodies, through the whole handler.

Each case names the row's expected end state. "FAILED" is a permanent failure on the
first attempt; "PENDING" is a transient one, scheduled for retry; "SUCCEEDED" is
archived. Refused URLs must be refused before any connection: the upstream stand-in
(on 127.0.0.1) must see no request for them.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from devkit import images
from devkit.upstream import StreamBody, UpstreamServer
from lib.transfer.download import READ_TIMEOUT_SECONDS
from tests.integration.conftest import quick_invoke
from tests.support import assert_nothing_sent_to_lsky, fetch_record, seed_record

PNG = images.png(8, 8)
MAX_BYTES = 1_000_000
NOTHING = ""  # no private network allowed: 127.0.0.1 is refused like any loopback address
STAND_IN = "127.0.0.1/32"  # the upstream stand-in reachable, the rest of 127/8 refused

Setup = Callable[[UpstreamServer], str]  # registers routes, returns the record's URL


@dataclass(frozen=True)
class Case:
    setup: Setup
    outcome: str  # SUCCEEDED, FAILED or PENDING
    fragment: str  # in archive_error (or, for SUCCEEDED, in image_mime_type)
    allow: str = STAND_IN
    reaches_upstream: bool = True
    # The body broke off after a good start with a Content-Length: the upload streaming
    # from it had begun, and must have been aborted without Lsky storing anything.
    aborts_upload: bool = False


def url(template: str) -> Setup:
    """A fixed URL; {port} is the stand-in's port (so a refusal is visibly pre-connect)."""
    return lambda up: template.format(port=up.port)


def route(path: str, body: Any = PNG, **options: Any) -> Setup:
    def setup(up: UpstreamServer) -> str:
        return up.add(path, body, **options)

    return setup


def redirects(target: str, hops: int = 1) -> Setup:
    def setup(up: UpstreamServer) -> str:
        location = target.format(port=up.port, base=up.base_url)
        for hop in range(hops, 0, -1):
            up.add(f"/hop{hop}", redirect_to=location)
            location = f"/hop{hop}"
        return up.url("/hop1")

    return setup


def refused(template: str, fragment: str, allow: str = NOTHING) -> Case:
    return Case(url(template), "FAILED", fragment, allow=allow, reaches_upstream=False)


def huge_stream() -> StreamBody:
    return StreamBody.of(lambda: images.png_stream(size=3 * MAX_BYTES))


CORPUS: dict[str, Case] = {
    # -- schemes -------------------------------------------------------------------------
    "file": refused("file:///etc/passwd", "scheme 'file' refused"),
    "gopher": refused("gopher://127.0.0.1:{port}/_GET%20/", "scheme 'gopher' refused"),
    "ftp": refused("ftp://127.0.0.1:{port}/a.png", "scheme 'ftp' refused"),
    "dict": refused("dict://127.0.0.1:11211/stat", "scheme 'dict' refused"),
    "data": refused("data:image/png;base64,iVBORw0KGgo=", "scheme 'data' refused"),
    "javascript": refused("javascript:alert(1)", "scheme 'javascript' refused"),
    "empty": refused("", "scheme 'none' refused"),
    "scheme-relative": refused("//127.0.0.1:{port}/a.png", "scheme 'none' refused"),
    # -- userinfo and parser tricks ------------------------------------------------------
    "userinfo": refused("http://user:pass@127.0.0.1:{port}/a.png", "userinfo", STAND_IN),
    "userinfo-host-trick": refused(
        "http://images.example.com@127.0.0.1:{port}/a.png", "userinfo", STAND_IN
    ),
    "backslash-trick": refused("http://127.0.0.1:{port}\\@images.example.com/", "backslash"),
    "fragment-trick": refused("http://127.0.0.2:{port}#@images.example.com/", "loopback"),
    "crlf-injection": refused(
        "http://127.0.0.1:{port}/a.png\r\nX-Injected: 1", "control character", STAND_IN
    ),
    "space": refused("http://127.0.0.1:{port}/a b.png", "whitespace", STAND_IN),
    "fullwidth-localhost": refused("http://ｌｏｃａｌｈｏｓｔ:{port}/", "cannot be parsed"),
    "bad-port": refused("http://127.0.0.1:99999/", "cannot be parsed"),
    "no-host": refused("http:///a.png", "no host"),
    # -- loopback, private, link-local in every spelling ---------------------------------
    "loopback": refused("http://127.0.0.1:{port}/a.png", "address 127.0.0.1 refused: loopback"),
    "loopback-outside-allowlist": refused(
        "http://127.0.0.1:{port}/a.png", "loopback", allow="127.0.0.2/32"
    ),
    "localhost": refused("http://localhost:{port}/a.png", "(127.0.0.1) refused: loopback"),
    "decimal": refused("http://2130706433:{port}/a.png", "(127.0.0.1) refused: loopback"),
    "octal": refused("http://0177.0.0.1:{port}/a.png", "(127.0.0.1) refused: loopback"),
    "hex": refused("http://0x7f.0.0.1:{port}/a.png", "(127.0.0.1) refused: loopback"),
    "short-form": refused("http://127.1:{port}/a.png", "(127.0.0.1) refused: loopback"),
    "zero": refused("http://0:{port}/a.png", "this network"),
    "unspecified": refused("http://0.0.0.0:{port}/a.png", "this network"),
    "ipv6-loopback": refused("http://[::1]:{port}/a.png", "loopback"),
    "ipv6-mapped": refused("http://[::ffff:127.0.0.1]:{port}/a.png", "IPv4-mapped 127.0.0.1"),
    "ipv6-mapped-hex": refused("http://[::ffff:7f00:1]:{port}/a.png", "IPv4-mapped 127.0.0.1"),
    "nat64-metadata": refused("http://[64:ff9b::a9fe:a9fe]/", "NAT64 169.254.169.254"),
    "6to4-private": refused("http://[2002:c0a8:101::1]/", "6to4 192.168.1.1"),
    "metadata": refused("http://169.254.169.254/latest/meta-data/iam/", "link-local"),
    "metadata-ipv6": refused("http://[fd00:ec2::254]/latest/meta-data/", "unique local"),
    "alibaba-metadata": refused("http://100.100.100.200/latest/", "shared address space"),
    "private-10": refused("http://10.0.0.1/a.png", "private"),
    "private-192": refused("http://192.168.0.1/a.png", "private"),
    "multicast": refused("http://224.0.0.1/a.png", "multicast"),
    "broadcast": refused("http://255.255.255.255/a.png", "reserved"),
    # -- host names that can never resolve: failed at once, not retried (the real resolver)
    "nxdomain": refused("http://nonexistent.invalid/a.png", "nonexistent.invalid does not exist"),
    "label-over-63": refused("http://" + "a" * 64 + ".example.com/a.png", "longer than 63"),
    "name-over-253": refused("http://" + "abcdefghi." * 26 + "com/", "longer than 253"),
    "empty-label": refused("http://cdn..example.com/a.png", "empty label"),
    # -- redirects: every hop is checked again -------------------------------------------
    "redirect-to-metadata": Case(redirects("http://169.254.169.254/latest/"), "FAILED", "link"),
    "redirect-to-other-loopback": Case(
        redirects("http://127.0.0.2:{port}/a.png"), "FAILED", "127.0.0.2 refused: loopback"
    ),
    "redirect-to-ipv6-loopback": Case(redirects("http://[::1]:{port}/"), "FAILED", "loopback"),
    "redirect-to-file": Case(redirects("file:///etc/passwd"), "FAILED", "scheme 'file'"),
    "redirect-to-userinfo": Case(
        redirects("http://u:p@127.0.0.1:{port}/a.png"), "FAILED", "userinfo"
    ),
    "four-redirects": Case(
        redirects("{base}/final.png", hops=4), "FAILED", "more than 3 redirects"
    ),
    "redirect-without-location": Case(route("/nowhere", redirect_to=""), "PENDING", "Location"),
    # -- bodies that are not what they claim ---------------------------------------------
    "html-as-png": Case(
        route("/h.png", b"<!doctype html><title>Expired</title>"), "FAILED", "not a PNG"
    ),
    "empty-body": Case(route("/e.png", b""), "FAILED", "not a PNG"),
    "json-body": Case(
        route("/j.png", b'{"error": "expired"}', content_type="application/json"),
        "FAILED",
        "not a PNG",
    ),
    "svg": Case(
        route("/s.svg", b'<svg xmlns="http://www.w3.org/2000/svg"><script>1</script></svg>'),
        "FAILED",
        "not a PNG",
    ),
    "truncated-signature": Case(route("/t.png", b"\x89PN"), "FAILED", "not a PNG"),
    "gzip-encoded": Case(
        route("/g.png", gzip.compress(PNG), headers={"Content-Encoding": "gzip"}),
        "FAILED",
        "gzip-encoded body",
    ),
    "declared-too-large": Case(
        route("/big.png", StreamBody.of(lambda: images.png_stream(size=5_000_000), 5_000_000)),
        "FAILED",
        "5000000 bytes, over the 1000000-byte limit",
    ),
    "chunked-too-large": Case(
        route("/endless.png", huge_stream(), chunked=True), "FAILED", "over the 1000000-byte"
    ),
    "png-labelled-html": Case(route("/p", PNG, content_type="text/html"), "SUCCEEDED", "png"),
    "jpeg-labelled-png": Case(route("/q.png", images.jpeg()), "SUCCEEDED", "jpeg"),
    "gif": Case(route("/g.gif", images.gif(), content_type="image/gif"), "SUCCEEDED", "gif"),
    "webp": Case(route("/w.webp", images.webp(), content_type=None), "SUCCEEDED", "webp"),
    # Lsky's default groups do not accept .avif: a permanent answer from Lsky, not from us.
    "avif": Case(route("/a.avif", images.avif()), "FAILED", "不支持的文件类型"),
    "three-redirects": Case(redirects("{base}/final.png", hops=3), "SUCCEEDED", "png"),
    # -- Content-Length in every spelling: digits, or one value repeated ----------------
    "length-repeated": Case(
        route("/l1.png", PNG, headers={"Content-Length": str(len(PNG))}), "SUCCEEDED", "png"
    ),
    "length-spaced": Case(
        route("/l2.png", PNG, content_length=f"  {len(PNG)} "), "SUCCEEDED", "png"
    ),
    "length-conflicting": Case(
        route("/l3.png", PNG, headers={"Content-Length": str(len(PNG) + 7)}),
        "FAILED",
        "Content-Length contained multiple unmatching values",
    ),
    "length-plus-sign": Case(
        route("/l4.png", PNG, content_length=f"+{len(PNG)}"), "FAILED", "not a length"
    ),
    "length-underscore": Case(
        route("/l5.png", PNG, content_length=f"{len(PNG) // 10}_{len(PNG) % 10}"),
        "FAILED",
        "not a length",
    ),
    "length-negative": Case(route("/l6.png", PNG, content_length="-1"), "FAILED", "'-1'"),
    "length-hex": Case(
        route("/l7.png", PNG, content_length=hex(len(PNG))), "FAILED", "not a length"
    ),
    "length-empty": Case(route("/l8.png", PNG, content_length=""), "FAILED", "not a length"),
    "length-past-2-63": Case(
        route("/l9.png", PNG, content_length="9" * 20), "FAILED", "not a length"
    ),
    "length-huge": Case(
        route("/l10.png", PNG, content_length="9" * 19), "FAILED", "over the 1000000-byte limit"
    ),
    # -- upstream statuses and broken transfers ------------------------------------------
    "gone-404": Case(route("/x404", status=404), "FAILED", "HTTP 404"),
    "gone-410": Case(route("/x410", status=410), "FAILED", "HTTP 410"),
    "server-error": Case(route("/x500", status=500), "PENDING", "HTTP 500"),
    "content-length-lie": Case(
        route("/lie.png", PNG, content_length=len(PNG) + 500),
        "PENDING",
        "dropped",
        aborts_upload=True,
    ),
    "drop-mid-body": Case(
        route("/drop.png", images.png(size=300_000), drop_after=50_000),
        "PENDING",
        "dropped",
        aborts_upload=True,
    ),
}


@pytest.fixture
def db(quick_conn: Any) -> Any:
    # Cheaper than the TRUNCATE of the shared `db` fixture; this module uses one row.
    quick_conn.run("DELETE FROM image_generation_records WHERE id = 900")
    return quick_conn


# Grouped by allowlist, so the function's state is rebuilt only when it changes.
ORDERED = sorted(CORPUS.items(), key=lambda item: item[1].allow)


@pytest.mark.parametrize("case", [case for _, case in ORDERED], ids=[name for name, _ in ORDERED])
def test_bad_input(
    quick_env: Callable[..., None],
    db: Any,
    upstream: UpstreamServer,
    lsky: Any,
    case: Case,
) -> None:
    quick_env(ARCHIVE_ALLOW_PRIVATE_NETWORKS=case.allow, ARCHIVE_MAX_IMAGE_BYTES=str(MAX_BYTES))
    upstream.add("/final.png", PNG)
    image_url = case.setup(upstream)
    seed_record(db, 900, image_url=image_url)

    started = time.monotonic()
    response = quick_invoke(900)
    # No case waits out a read timeout (30 s) or the invocation: a bound that tells a hang
    # from a busy machine, not a speed test.
    assert time.monotonic() - started < READ_TIMEOUT_SECONDS / 3

    row = fetch_record(db, 900)
    assert row["archive_status"] == case.outcome, row["archive_error"]
    assert row["archive_attempts"] == 1
    assert row["status"] == "SUCCEEDED"
    if case.outcome == "SUCCEEDED":
        assert case.fragment in row["image_mime_type"]
        assert response == {"batchItemFailures": []}
        return
    assert case.fragment in row["archive_error"]
    redelivered = len(response["batchItemFailures"]) == 1
    assert redelivered is (case.outcome == "PENDING")
    if not case.reaches_upstream:
        assert upstream.requests == []
    if case.aborts_upload:
        assert_nothing_sent_to_lsky(lsky)
    elif "不支持" not in case.fragment:
        assert lsky.upload_count == 0


def test_the_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 30
    assert sum(case.outcome == "FAILED" for case in CORPUS.values()) >= 30


def test_upstream_retry_after_longer_than_the_schedule_is_honoured(
    quick_env: Callable[..., None], db: Any, upstream: UpstreamServer
) -> None:
    quick_env(ARCHIVE_ALLOW_PRIVATE_NETWORKS=STAND_IN, ARCHIVE_MAX_IMAGE_BYTES=str(MAX_BYTES))
    headers = {"Retry-After": "300"}
    seed_record(db, 900, image_url=upstream.add("/busy.png", status=429, headers=headers))
    before = time.time()
    assert len(quick_invoke(900)["batchItemFailures"]) == 1
    row = fetch_record(db, 900)
    assert row["archive_status"] == "PENDING"
    assert "HTTP 429" in row["archive_error"]
    assert row["archive_next_run_at"].timestamp() - before >= 299  # not the scheduled 30 s
