"""The yardsticks: a plain urllib3 download and a plain upload, nothing else.

`download` reads the whole body into bytes and `upload` POSTs a multipart body held
in memory, as a straightforward port of the seed worker would (fetch, then FormData).
Point 1 uses them together as the naive whole-image archive; point 2 times them as
the floor the handler's transfer is compared against.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3

from devkit.lsky import DEFAULT_TOKEN


class PlainClient:
    def __init__(self, lsky_base_url: str, token: str = DEFAULT_TOKEN) -> None:
        self.upload_url = lsky_base_url.rstrip("/") + "/api/v1/upload"
        self.token = token
        self.pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=60))

    def download(self, url: str) -> bytes:
        response = self.pool.request("GET", url, headers={"Accept-Encoding": "identity"})
        if response.status != 200:
            raise RuntimeError(f"GET {url}: HTTP {response.status}")
        return response.data

    @staticmethod
    def body(data: bytes, filename: str = "plain.png") -> tuple[bytes, str]:
        return urllib3.encode_multipart_formdata({"file": (filename, data, "image/png")})

    def upload(self, body: bytes, content_type: str) -> dict[str, Any]:
        response = self.pool.request(
            "POST",
            self.upload_url,
            body=body,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/json",
                "Content-Type": content_type,
            },
        )
        answer: dict[str, Any] = json.loads(response.data)
        if response.status != 200 or answer.get("status") is not True:
            raise RuntimeError(f"upload: HTTP {response.status} {answer.get('message')!r}")
        return answer

    def archive(self, url: str) -> dict[str, Any]:
        """The naive whole-image archive: the image and its multipart body both in memory."""
        data = self.download(url)
        body, content_type = self.body(data)
        return self.upload(body, content_type)
