"""The image provider for the benches, in its own process: `python -m bench.upstream`.

A separate process so the server's threads do not share a GIL (or an RSS figure)
with the process being measured; on Lambda the provider is on another machine.

    python -m bench.upstream /tiny.png=200 /big.png=50000000 /nolen.png=50000000:chunked \
        /slow.png=200:delay=1.5 /gone.png=0:status=403 [--link-rate=40000000] [--nagle]

prints `UPSTREAM_URL=http://127.0.0.1:PORT` once listening, then serves until stdin
closes (so it never outlives the bench that started it). Bodies are valid PNGs of
exactly the given size (devkit.images.png_stream), generated as they are sent.
`--link-rate` sends every body at that many bytes a second (a provider behind a
limited link). `--nagle` leaves Nagle's algorithm on: each answer's header and body go
out in two writes, the body only once the client has acknowledged the header.
"""

from __future__ import annotations

import sys

from devkit import images
from devkit.upstream import StreamBody, UpstreamServer


def _body(size: int) -> StreamBody:
    return StreamBody.of(lambda: images.png_stream(size=size, chunk_size=256 * 1024), size)


def main(argv: list[str]) -> int:
    rates = [float(a.removeprefix("--link-rate=")) for a in argv if a.startswith("--link-rate=")]
    server = UpstreamServer(
        link_bytes_per_sec=rates[-1] if rates else None, nagle="--nagle" in argv
    )
    for spec in (a for a in argv if not a.startswith("--")):
        path, _, rest = spec.partition("=")
        size_text, _, mode = rest.partition(":")
        size = int(size_text)
        delay = float(mode.removeprefix("delay=")) if mode.startswith("delay=") else 0.0
        if mode.startswith("status="):  # a source that is gone: e.g. 403, an expired URL
            server.add(path, b"gone", status=int(mode.removeprefix("status=")))
        elif size < 1024:
            small = images.png(size=size) if size > 100 else images.png()
            server.add(path, small, delay=delay)  # delay: a slow provider, before the body
        else:
            server.add(path, _body(size), chunked=mode == "chunked")
    server.start()
    print(f"UPSTREAM_URL={server.base_url}", flush=True)
    try:
        sys.stdin.read()  # EOF when the parent exits or closes the pipe
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
