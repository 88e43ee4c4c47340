"""StreamedMultipartBody: framing of a chunk iterator of known length, and the abort
(no closing boundary, never a byte too many) when the chunks do not add up."""

from __future__ import annotations

import email.parser
import email.policy
import io
from collections.abc import Iterator

import pytest

from lib.transfer.multipart import BodyLengthError, MultipartBody, StreamedMultipartBody

DATA = bytes(range(256)) * 1500  # 384000 bytes, a few chunks' worth


def chunks(data: bytes, size: int = 100_000) -> Iterator[bytes]:
    for offset in range(0, len(data), size):
        yield data[offset : offset + size]


def streamed(source: Iterator[bytes], length: int, **fields: str) -> StreamedMultipartBody:
    return StreamedMultipartBody(
        fields=fields,
        file_field="file",
        filename="a\r\nb.png",
        file_content_type="image/png",
        chunks=source,
        file_size=length,
    )


def parse(body_type: str, raw: bytes) -> dict[str, email.message.EmailMessage]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {body_type}\r\n\r\n".encode() + raw
    )
    return {
        part.get_param("name", header="content-disposition"): part
        for part in message.iter_parts()  # type: ignore[attr-defined]
    }


def test_well_formed_and_its_length_exact() -> None:
    body = streamed(chunks(DATA), len(DATA), strategy_id="3", album_id="9")
    raw = b"".join(body)
    assert len(raw) == body.content_length
    parts = parse(body.content_type, raw)
    assert parts["strategy_id"].get_content() == "3"
    assert parts["album_id"].get_content() == "9"
    assert parts["file"].get_content() == DATA
    assert parts["file"].get_content_type() == "image/png"
    assert parts["file"].get_filename() == "a%0D%0Ab.png"


def test_same_bytes_as_the_file_based_body_apart_from_the_boundary() -> None:
    from_file = MultipartBody(
        fields={"strategy_id": "3"},
        file_field="file",
        filename="a.png",
        file_content_type="image/png",
        file=io.BytesIO(DATA),
        file_size=len(DATA),
    )
    from_stream = StreamedMultipartBody(
        fields={"strategy_id": "3"},
        file_field="file",
        filename="a.png",
        file_content_type="image/png",
        chunks=chunks(DATA),
        file_size=len(DATA),
    )
    assert from_file.content_length == from_stream.content_length
    a = b"".join(from_file).replace(from_file.boundary.encode(), b"B")
    b = b"".join(from_stream).replace(from_stream.boundary.encode(), b"B")
    assert a == b


def test_content_length_is_known_before_any_chunk_is_read() -> None:
    pulled: list[int] = []

    def source() -> Iterator[bytes]:
        for piece in chunks(DATA):
            pulled.append(len(piece))
            yield piece

    body = streamed(source(), len(DATA))
    assert body.content_length > len(DATA)
    assert pulled == []
    iterator = iter(body)
    next(iterator)  # the head goes out before the first chunk is pulled
    assert pulled == []
    next(iterator)
    assert pulled == [100_000]


def test_chunks_pass_through_without_being_gathered() -> None:
    body = streamed(chunks(DATA), len(DATA))
    sizes = [len(piece) for piece in body]
    assert max(sizes[1:-1]) == 100_000  # head, the chunks as they came, tail


def test_a_short_source_aborts_instead_of_closing_the_body() -> None:
    body = streamed(chunks(DATA[:-1]), len(DATA))
    sent: list[bytes] = []
    with pytest.raises(BodyLengthError, match=f"ended after {len(DATA) - 1} of the announced"):
        sent.extend(body)  # keeps what was sent before the error
    raw = b"".join(sent)
    assert body.boundary.encode() + b"--" not in raw  # no closing boundary went out
    assert len(raw) < body.content_length


def test_a_long_source_aborts_before_the_extra_bytes() -> None:
    body = streamed(chunks(DATA + b"x"), len(DATA))
    sent: list[bytes] = []
    with pytest.raises(BodyLengthError, match="longer than the announced"):
        sent.extend(body)
    raw = b"".join(sent)
    # The chunk that overshoots is held back: head plus the first three chunks went out.
    tail = f"\r\n--{body.boundary}--\r\n".encode()
    assert len(raw) == body.content_length - len(tail) - (len(DATA) - 300_000)
    assert raw.endswith(DATA[200_000:300_000])


def test_an_error_from_the_source_propagates_unchanged() -> None:
    class Broken(Exception):
        pass

    def source() -> Iterator[bytes]:
        yield DATA[:10]
        raise Broken("upstream dropped")

    with pytest.raises(Broken):
        b"".join(streamed(source(), len(DATA)))


def test_empty_chunks_are_skipped_and_an_empty_file_is_allowed() -> None:
    body = streamed(iter([b"", DATA[:5], b"", DATA[5:9]]), 9)
    pieces = list(body)
    assert b"" not in pieces
    assert parse(body.content_type, b"".join(pieces))["file"].get_content() == DATA[:9]
    empty = streamed(iter([]), 0)
    assert len(b"".join(empty)) == empty.content_length


def test_one_pass_only() -> None:
    body = streamed(chunks(DATA), len(DATA))
    b"".join(body)
    with pytest.raises(RuntimeError, match="once"):
        iter(body)
