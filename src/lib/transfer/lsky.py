"""Lsky Pro v1 client (upload, image list, profile; read from lsky-org/lsky-pro 2.x).

`upload` sends an image's bytes (in hand, or landing in the spool: lib.transfer.relay).
Every exchange ends by its deadline (the download's watchdog binds a trickling answer
too); nothing of a response is kept beyond Lsky's short, redacted `message`."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlencode

import urllib3
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, NewConnectionError, TimeoutError

from lib.platform.redact import outside_text, token_parts
from lib.platform.watchdog import watched, watched_pool
from lib.transfer.failures import ArchiveFailure, Failure, Kind, Stage, fail
from lib.transfer.imagetype import ImageType
from lib.transfer.lsky_envelope import parsed
from lib.transfer.lsky_listing import ListingPage, listed_image, parse_listing
from lib.transfer.lsky_upload import HostedImage, parse_upload_response
from lib.transfer.multipart import BodyLengthError, MultipartBody
from lib.transfer.quickack import PromptAckConnection, PromptAckHTTPSConnection

CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 60.0  # Lsky may re-encode or write to remote storage before answering
MAX_RESPONSE_BYTES = 256 * 1024
LOOKUP_READ_TIMEOUT_SECONDS = 15.0  # a list of 40 rows: no file work on Lsky's side
PROFILE_READ_TIMEOUT_SECONDS = 10.0
# The keyword names one record, so its images fit on the first page; more pages than
# this means the list cannot say whether the image is there (docs/explanation/transfers.md).
MAX_LOOKUP_PAGES = 3
# A failure's whole message as kept (Lsky's own part is already shorter: MESSAGE_LIMIT).
FAILURE_MESSAGE_LIMIT = 300

TokenProvider = Callable[[bool], str]  # force_refresh -> "<id>|<token>"
Body = MultipartBody


class Sendable(Protocol):
    """An image as the upload reads it: its type, its length (announced up front), and its
    bytes from the start (each call anew, for a resend)."""

    @property
    def image_type(self) -> ImageType: ...

    @property
    def size(self) -> int: ...

    def chunks(self) -> Iterator[bytes]: ...


class _Pool(HTTPConnectionPool):
    ConnectionCls = PromptAckConnection  # kept: no delayed-ACK wait on the next answer


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = PromptAckHTTPSConnection


# Pools whose connections tell the exchange's watchdog which socket to shut.
_POOLS = {"http": watched_pool(_Pool), "https": watched_pool(_TLSPool)}


@dataclass(frozen=True)
class _Answer:
    status: int
    raw: bytes  # empty when the body was over MAX_RESPONSE_BYTES
    location: str | None
    retry_after: str | None


@dataclass(frozen=True)
class _Wording:
    """How an exchange's failures read ("timed out waiting for Lsky's image list")."""

    stage: Stage
    what: str  # "Lsky", "Lsky's image list"
    no_time: str
    dropped: str
    read_timeout: float


class LskyClient:
    def __init__(
        self,
        *,
        base_url: str,
        token: TokenProvider,
        strategy_id: int | None = None,
        album_id: int | None = None,
    ) -> None:
        self.upload_url = f"{base_url.rstrip('/')}/api/v1/upload"
        self.profile_url = f"{base_url.rstrip('/')}/api/v1/profile"
        self.images_url = f"{base_url.rstrip('/')}/api/v1/images"
        self._token = token
        self.strategy_id = strategy_id
        self.album_id = album_id
        self.pool = urllib3.PoolManager(
            num_pools=2,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS),
            retries=False,
        )
        self.pool.pool_classes_by_scheme = dict(_POOLS)

    def account_healthy(self, deadline: float) -> bool:
        """Whether the token's account can upload again (GET /api/v1/profile answers 200
        with status true), known by `deadline`; raises ArchiveFailure when Lsky cannot be
        reached or does not answer in time."""
        answer = self._exchange(
            "GET",
            self.profile_url,
            headers={"Authorization": f"Bearer {self._token(True)}", "Accept": "application/json"},
            deadline=deadline,
            wording=_PROFILE,
        )
        payload = parsed(answer.raw)
        if answer.status != 200 or not isinstance(payload, dict):
            return False
        data = payload.get("data")
        if payload.get("status") is not True or not isinstance(data, dict):
            return False
        capacity, used = data.get("capacity"), data.get("used_capacity")
        # A full quota answers 200 too: the profile's numbers tell.
        if isinstance(capacity, int | float) and isinstance(used, int | float):
            return used < capacity
        return True

    def _fields(self) -> dict[str, str]:
        # Never send an empty strategy_id (Lsky rejects it); album_id only when configured.
        fields: dict[str, str] = {}
        if self.strategy_id is not None:
            fields["strategy_id"] = str(self.strategy_id)
        if self.album_id is not None:
            fields["album_id"] = str(self.album_id)
        return fields

    def upload(self, image: Sendable, *, filename: str, deadline: float) -> HostedImage:
        """Upload an image, finishing by `deadline` (time.monotonic()); raises
        ArchiveFailure (stage upload) for every failure."""

        def body() -> Body:
            return MultipartBody(
                fields=self._fields(),
                file_field="file",
                filename=filename,
                file_content_type=image.image_type.mime_type,
                content=image.chunks,
                file_size=image.size,
            )

        return self._send(body, deadline, resend=True)

    def find(
        self, origin_names: Collection[str], *, keyword: str, deadline: float
    ) -> list[HostedImage]:
        """The token user's images whose origin_name is exactly one of `origin_names`, oldest
        first: GET /api/v1/images?keyword=...&order=earliest, paged until a page has a
        match (at most MAX_LOOKUP_PAGES). Raises ArchiveFailure (stage lookup)."""
        token = self._token(False)
        used = [token]
        page = 1
        while True:
            listed = self._list(keyword, page, token, deadline)
            if isinstance(listed, ArchiveFailure) and listed.failure.status == 401:
                # As for uploads: the token may have been rotated since we cached it.
                fresh = self._token(True)
                if fresh not in used:
                    used.append(fresh)
                    token = fresh
                    listed = self._list(keyword, page, token, deadline)
            if isinstance(listed, ArchiveFailure):
                raise _redacted(listed, used)
            matches = [item for item in listed.images if item["origin_name"] in origin_names]
            if matches or page >= listed.last_page:
                return [listed_image(item) for item in matches]
            if page >= MAX_LOOKUP_PAGES:
                raise fail(
                    Stage.LOOKUP,
                    Kind.BAD_RESPONSE,
                    f"Lsky lists more than {MAX_LOOKUP_PAGES} pages for {keyword!r}; "
                    "cannot tell whether the image is there",
                )
            page += 1

    def _list(
        self, keyword: str, page: int, token: str, deadline: float
    ) -> ListingPage | ArchiveFailure:
        query = {"keyword": keyword, "order": "earliest", "page": str(page)}
        if self.album_id is not None:
            query["album_id"] = str(self.album_id)
        try:
            answer = self._exchange(
                "GET",
                f"{self.images_url}?{urlencode(query)}",
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                deadline=deadline,
                wording=_LISTING,
            )
            return parse_listing(
                answer.status,
                answer.raw,
                location=answer.location,
                retry_after=answer.retry_after,
                secrets=token_parts([token]),
            )
        except ArchiveFailure as error:
            return error

    def _send(self, body: Callable[[], Body], deadline: float, *, resend: bool) -> HostedImage:
        token = self._token(False)
        outcome = self._attempt(body, token, deadline)
        used = [token]
        if isinstance(outcome, ArchiveFailure) and outcome.failure.status == 401:
            # A 401 may mean the token was rotated since we cached it: refetch once, and
            # send again when the body can be produced again.
            fresh = self._token(True)
            if fresh != token and resend:
                used.append(fresh)
                outcome = self._attempt(body, fresh, deadline)
        if isinstance(outcome, ArchiveFailure):
            # Raised here, outside any except block, so no exception carrying the
            # unredacted text is chained to it.
            raise _redacted(outcome, used)
        return outcome

    def _attempt(
        self, body: Callable[[], Body], token: str, deadline: float
    ) -> HostedImage | ArchiveFailure:
        try:
            return self._upload(body(), token, deadline)
        except ArchiveFailure as error:
            return error

    def _upload(self, body: Body, token: str, deadline: float) -> HostedImage:
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "Content-Type": body.content_type,
            "Content-Length": str(body.content_length),
        }
        answer = self._exchange(
            "POST",
            self.upload_url,
            headers=headers,
            deadline=deadline,
            wording=_UPLOAD,
            body=_until(deadline, body),
        )
        return parse_upload_response(
            answer.status,
            answer.raw,
            location=answer.location,
            retry_after=answer.retry_after,
            secrets=token_parts([token]),
        )

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str],
        deadline: float,
        wording: _Wording,
        body: Iterable[bytes] | None = None,
    ) -> _Answer:
        """One request and its whole answer (at most MAX_RESPONSE_BYTES), by `deadline`
        whatever the server does; raises ArchiveFailure (at wording.stage)."""
        stage = wording.stage
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise fail(stage, Kind.TIMEOUT, wording.no_time)
        with watched(deadline) as watchdog:
            try:
                response = self.pool.urlopen(
                    method,
                    url,
                    body=body,
                    headers=headers,
                    redirect=False,
                    preload_content=False,
                    chunked=False,
                    # Each read waits at most this long, never past the deadline; the
                    # watchdog bounds their sum (an answer trickling in a byte at a time).
                    timeout=urllib3.Timeout(
                        connect=min(CONNECT_TIMEOUT_SECONDS, remaining),
                        read=min(wording.read_timeout, remaining),
                    ),
                )
            except BodyLengthError as error:
                # The request was abandoned before its last byte (urllib3 closed the
                # connection): the image's bytes did not match the length announced (the
                # spool, or a download broken off under a relayed upload). Nothing of a
                # request cut off mid-body is stored.
                raise fail(
                    Stage.UPLOAD,
                    Kind.CONNECTION,
                    f"the image's bytes did not match their length: {error}",
                ) from None
            except NewConnectionError:  # a ConnectTimeoutError subclass, so caught first
                raise fail(stage, Kind.CONNECTION, "could not connect to Lsky") from None
            except (TimeoutError, HTTPError) as error:
                if watchdog.fired or isinstance(error, TimeoutError):
                    raise fail(
                        stage, Kind.TIMEOUT, f"timed out waiting for {wording.what}"
                    ) from None
                raise fail(
                    stage, Kind.CONNECTION, f"could not reach Lsky ({type(error).__name__})"
                ) from None
            try:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
            except (TimeoutError, HTTPError) as error:
                if watchdog.fired or isinstance(error, TimeoutError):
                    raise fail(
                        stage, Kind.TIMEOUT, f"timed out reading {wording.what}'s answer"
                    ) from None
                raise fail(stage, Kind.CONNECTION, wording.dropped) from None
            finally:
                if watchdog.fired:
                    response.close()  # its socket is shut: not for the pool to reuse
                response.release_conn()
            if watchdog.fired:
                # The shutdown can also look like the end of a body without a length.
                raise fail(stage, Kind.TIMEOUT, f"timed out reading {wording.what}'s answer")
        return _Answer(
            status=response.status,
            raw=raw if len(raw) <= MAX_RESPONSE_BYTES else b"",
            location=response.headers.get("Location"),
            retry_after=response.headers.get("Retry-After"),
        )


_UPLOAD = _Wording(
    Stage.UPLOAD,
    "Lsky",
    "no time left to upload",
    "Lsky dropped the response",
    READ_TIMEOUT_SECONDS,
)
_LISTING = _Wording(
    Stage.LOOKUP,
    "Lsky's image list",
    "no time left to look the image up",
    "Lsky dropped the image list",
    LOOKUP_READ_TIMEOUT_SECONDS,
)
_PROFILE = _Wording(
    Stage.LOOKUP,
    "Lsky's profile",
    "no time left to ask for the profile",
    "Lsky dropped the profile",
    PROFILE_READ_TIMEOUT_SECONDS,
)


def _until(deadline: float, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The request body, abandoned (the request aborted) once the deadline has passed."""
    for chunk in chunks:
        if time.monotonic() > deadline:
            raise fail(
                Stage.UPLOAD, Kind.TIMEOUT, "sending the image to Lsky ran past the deadline"
            )
        yield chunk


def _redacted(error: ArchiveFailure, tokens: Iterable[str]) -> ArchiveFailure:
    """The failure as it may leave the client: every token this call used (a refreshed one
    too) redacted from its message, which is stored and logged. Each answer's own token
    was already redacted when it was read, before Lsky's message was shortened."""
    failure = error.failure
    return ArchiveFailure(
        Failure(
            failure.stage,
            failure.kind,
            outside_text(failure.message, FAILURE_MESSAGE_LIMIT, secrets=token_parts(tokens)),
            status=failure.status,
            retry_after=failure.retry_after,
        )
    )
