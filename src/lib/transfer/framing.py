"""An upstream answer's framing, checked before its body is read: no encoding that would
have to be inflated, and a Content-Length that is a length (docs/explanation/security.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from lib.platform.redact import outside_text
from lib.transfer.failures import Kind, Stage, fail

# Content-Length as RFC 9110 writes it: digits (at most 19: past 2**63 is no length), or
# a list of one value repeated (urllib3 refuses differing ones), blanks around it allowed.
# Python's int() also reads "+12" and "1_2", and takes "-1" or "0x0c" for no length:
# lengths that another parser reads otherwise, so refused.
CONTENT_LENGTH = re.compile(r"[0-9]{1,19}(?:[ \t]*,[ \t]*[0-9]{1,19})*")


def check_framing(headers: Mapping[str, str], where: str) -> None:
    """Refuse compressed bodies (inflating them would let a small body grow past the cap,
    and we asked for identity: bytes are counted and stored exactly as received), and a
    Content-Length that is not one; ArchiveFailure (not_image) names what came, bounded."""
    encoding = headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise fail(
            Stage.DOWNLOAD,
            Kind.NOT_IMAGE,
            f"upstream sent a {outside_text(encoding, 40)}-encoded body for {where}; "
            "compressed bodies are refused",
        )
    transfer = headers.get("Transfer-Encoding", "").strip().lower()
    if transfer not in ("", "identity", "chunked"):
        raise fail(
            Stage.DOWNLOAD,
            Kind.NOT_IMAGE,
            f"upstream used transfer encoding {outside_text(transfer, 40)!r} for {where}; "
            "only chunked is accepted",
        )
    length = headers.get("Content-Length")
    if (
        transfer != "chunked"
        and length is not None
        and not CONTENT_LENGTH.fullmatch(length.strip())
    ):
        raise fail(
            Stage.DOWNLOAD,
            Kind.NOT_IMAGE,
            f"upstream sent Content-Length {outside_text(length, 40)!r} for {where}: "
            "not a length (digits only)",
        )
