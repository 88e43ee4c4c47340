"""A local SQS and S3 (one moto server) and helpers that speak Lambda's SQS event shape.

moto's server keeps its state in process-wide backends, so every queue (and bucket)
made on any `MotoServer` in this process lives in the same store: give them unique
names (tests do) rather than relying on a fresh server being empty.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

__all__ = [
    "MotoServer",
    "QueuePair",
    "create_queue_pair",
    "lambda_event",
    "lambda_record",
    "receive_as_lambda_event",
    "start_moto_server",
    "to_lambda_record",
]

DEFAULT_REGION = "us-east-1"
# The longest an S3 answer is held back (MotoServer.hold_s3): never why a test hangs.
HOLD_SECONDS = 30.0
# moto's default account; ARNs for synthetic events use it so that they look
# like the ones the moto server hands out.
DEFAULT_ACCOUNT = "123456789012"


# The service a SigV4-signed request is for: .../<date>/<region>/<service>/aws4_request.
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/[^/]+/([^/]+)/aws4_request")


class _RequestCounter:
    """WSGI middleware in front of moto: counts the requests it serves per AWS service, and
    keeps each SQS request's action and parameters (SQS speaks JSON: small bodies)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.counts: Counter[str] = Counter()
        self.sqs_calls: list[tuple[str, dict[str, Any]]] = []
        # (method, path), "COPY" for a CopyObject: no bodies are kept.
        self.s3_calls: list[tuple[str, str]] = []
        # (method, path prefix, answered, event): set when such an S3 request has begun
        # (its headers are in, its body may still be arriving), or once it was answered.
        self.s3_watches: list[tuple[str, str, bool, threading.Event]] = []
        self.refusals: dict[str, list[tuple[str, str]]] = {}  # action: (code, message), next first
        # (method, path prefix, release): such an S3 request is handled by moto, and its
        # answer held back until `release` is set (HOLD_SECONDS at most).
        self.s3_holds: list[tuple[str, str, threading.Event]] = []
        # (method, path prefix): such an S3 request's body is read whole, then refused with
        # a 500, never reaching moto (S3 stores nothing).
        self.s3_refusals: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        match = _CREDENTIAL_SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        service = match.group(1) if match else "unsigned"
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        call = None
        if service == "sqs" and target.startswith("AmazonSQS."):
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)  # moto reads it again
            with contextlib.suppress(ValueError):
                call = (target.removeprefix("AmazonSQS."), dict(json.loads(body or b"{}")))
        method = environ.get("REQUEST_METHOD", "")
        if method == "PUT" and "HTTP_X_AMZ_COPY_SOURCE" in environ:
            method = "COPY"  # CopyObject: a PUT naming its source, with no body
        s3 = (method, environ.get("PATH_INFO", ""))
        with self._lock:
            self.counts[service] += 1
            if call is not None:
                self.sqs_calls.append(call)
            if service == "s3":
                self.s3_calls.append(s3)
            pending = self.refusals.get(call[0], []) if call is not None else []
            refusal = pending.pop(0) if pending else None
        if refusal is not None:
            return _refused(start_response, *refusal)
        if service != "s3":
            return self.app(environ, start_response)
        self._fire(s3, answered=False)
        try:
            if self._matches(self.s3_refusals, s3):
                length = int(environ.get("CONTENT_LENGTH") or 0)
                while length > 0 and (chunk := environ["wsgi.input"].read(min(length, 65536))):
                    length -= len(chunk)
                return _s3_refused(start_response)
            answer = list(self.app(environ, start_response))  # moto has handled it
            with self._lock:
                holds = list(self.s3_holds)
            for method, prefix, release in holds:
                if not self._matches([(method, prefix)], s3):
                    continue
                release.wait(HOLD_SECONDS)
            return answer
        finally:
            self._fire(s3, answered=True)

    def _matches(self, rules: list[tuple[str, str]], call: tuple[str, str]) -> bool:
        with self._lock:
            return any(call[0] == m and call[1].startswith(p) for m, p in rules)

    def _fire(self, call: tuple[str, str], *, answered: bool) -> None:
        with self._lock:
            watches = list(self.s3_watches)
        for method, prefix, when_answered, event in watches:
            if when_answered == answered and call[0] == method and call[1].startswith(prefix):
                event.set()


def _s3_refused(start_response: Callable[..., Any]) -> list[bytes]:
    """S3's 500 InternalError, as it answers a request it did not carry out."""
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
        b"<Message>We encountered an internal error. Please try again.</Message></Error>"
    )
    start_response(
        "500 Internal Server Error",
        [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
    )
    return [body]


def _refused(start_response: Callable[..., Any], code: str, message: str) -> list[bytes]:
    """SQS's JSON error answer (the query-compatible header carries the code, as AWS's)."""
    body = json.dumps({"__type": f"com.amazonaws.sqs#{code}", "message": message}).encode()
    start_response(
        "400 Bad Request",
        [
            ("Content-Type", "application/x-amz-json-1.0"),
            ("Content-Length", str(len(body))),
            ("x-amzn-query-error", f"{code};Sender"),
        ],
    )
    return [body]


class MotoServer:
    """A running `ThreadedMotoServer`; `endpoint_url` goes to boto3 (SQS and S3 alike)."""

    def __init__(self, server: Any, host: str, port: int) -> None:
        self._server = server
        self.host = host
        self.port = port
        self.endpoint_url = f"http://{host}:{port}"
        self._stopped = False
        # Werkzeug looks the app up per request, so wrapping it now counts every request.
        self._counter = _RequestCounter(server._server.app)
        server._server.app = self._counter

    def requests(self, service: str) -> int:
        """Requests served so far for `service` ("s3", "sqs"), by their signature."""
        with self._counter._lock:
            return self._counter.counts[service]

    def sqs_calls(self, action: str, **matching: Any) -> list[dict[str, Any]]:
        """The parameters of every SQS `action` request served so far (e.g.
        "ChangeMessageVisibility"), in order; `matching` keeps those whose parameters have
        these values (QueueUrl=...: one test's queue)."""
        with self._counter._lock:
            calls = list(self._counter.sqs_calls)
        return [
            params
            for name, params in calls
            if name == action and all(params.get(k) == v for k, v in matching.items())
        ]

    def s3_calls(self, path_prefix: str = "/") -> list[tuple[str, str]]:
        """(method, path) of every S3 request served so far under `path_prefix` (a
        bucket: "/<bucket>/"), in order."""
        with self._counter._lock:
            calls = list(self._counter.s3_calls)
        return [call for call in calls if call[1].startswith(path_prefix)]

    def watch_s3(self, method: str, path_prefix: str, *, answered: bool = False) -> threading.Event:
        """An event set once an S3 `method` request under `path_prefix` has begun (its
        headers are in; a PUT's body may still be arriving), or, `answered`, once moto
        has handled it."""
        event = threading.Event()
        with self._counter._lock:
            self._counter.s3_watches.append((method, path_prefix, answered, event))
        return event

    def hold_s3(self, method: str, path_prefix: str) -> threading.Event:
        """S3 `method` requests under `path_prefix` are carried out by moto, their answers
        held back until the returned event is set (HOLD_SECONDS at most)."""
        release = threading.Event()
        with self._counter._lock:
            self._counter.s3_holds.append((method, path_prefix, release))
        return release

    def refuse_s3(self, method: str, path_prefix: str) -> Callable[[], None]:
        """S3 `method` requests under `path_prefix` are read whole and refused (500), never
        reaching moto: S3 stores nothing. Until the returned function is called."""
        rule = (method, path_prefix)
        with self._counter._lock:
            self._counter.s3_refusals.append(rule)

        def lift() -> None:
            with self._counter._lock:
                if rule in self._counter.s3_refusals:
                    self._counter.s3_refusals.remove(rule)

        return lift

    def refuse(self, action: str, code: str, message: str) -> None:
        """The next SQS `action` request (e.g. "ChangeMessageVisibility") is refused with
        `code`, as SQS refuses it, and never reaches moto (fault injection)."""
        with self._counter._lock:
            self._counter.refusals.setdefault(action, []).append((code, message))

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._server.stop()

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_moto_server(*, port: int = 0, quiet: bool = True) -> MotoServer:
    """Start moto's threaded server on 127.0.0.1 (port 0 = let the OS pick).

    Binding port 0 inside the server thread avoids the free-port race. Note that
    ThreadedMotoServer.start() would wait forever if the bind failed, so a
    fixed port that is taken is checked up front.
    """
    # Imported here: moto pulls in flask/werkzeug and all of its backends lazily,
    # but even the server module costs ~0.3 s, which pure tests should not pay.
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    if port:
        _check_port_free(port)
    if quiet:
        # werkzeug logs one line per request at INFO; that drowns test output.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=not quiet)
    server.start()
    host, bound_port = server.get_host_and_port()
    return MotoServer(server, host, bound_port)


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise RuntimeError(f"cannot start moto on 127.0.0.1:{port}: {exc}") from exc


@dataclass(frozen=True)
class QueuePair:
    """A source queue and its dead-letter queue."""

    url: str
    arn: str
    dlq_url: str
    dlq_arn: str
    name: str = ""


def create_queue_pair(
    sqs_client: SQSClient,
    name: str,
    *,
    max_receive_count: int = 5,
    visibility_timeout: int = 720,
    dlq_retention_seconds: int = 1209600,
    dlq_name: str | None = None,
) -> QueuePair:
    """Create `<name>-dlq` (or `dlq_name`) and `<name>` with a RedrivePolicy pointing at it.

    The DLQ allows redrive only from this source (like the template does) and
    keeps messages 14 days, longer than the source's default 4.
    """
    dlq_url = sqs_client.create_queue(
        QueueName=dlq_name or f"{name}-dlq",
        Attributes={"MessageRetentionPeriod": str(dlq_retention_seconds)},
    )["QueueUrl"]
    dlq_arn = _queue_arn(sqs_client, dlq_url)
    redrive = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
    url = sqs_client.create_queue(
        QueueName=name,
        Attributes={
            "VisibilityTimeout": str(visibility_timeout),
            "RedrivePolicy": json.dumps(redrive),
        },
    )["QueueUrl"]
    arn = _queue_arn(sqs_client, url)
    sqs_client.set_queue_attributes(
        QueueUrl=dlq_url,
        Attributes={
            "RedriveAllowPolicy": json.dumps(
                {"redrivePermission": "byQueue", "sourceQueueArns": [arn]}
            )
        },
    )
    return QueuePair(url=url, arn=arn, dlq_url=dlq_url, dlq_arn=dlq_arn, name=name)


def _queue_arn(sqs_client: SQSClient, url: str) -> str:
    attrs = sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attrs["Attributes"]["QueueArn"]


def receive_as_lambda_event(
    sqs_client: SQSClient,
    queue: QueuePair,
    max_messages: int = 1,
    wait_seconds: int = 1,
    *,
    visibility_timeout: int | None = None,
) -> dict[str, Any]:
    """ReceiveMessage, then wrap the messages as Lambda's poller would.

    Like the real poller, receiving makes the messages invisible and raises
    their ApproximateReceiveCount; the returned event may have zero Records.
    """
    kwargs: dict[str, Any] = {}
    if visibility_timeout is not None:
        kwargs["VisibilityTimeout"] = visibility_timeout
    response = sqs_client.receive_message(
        QueueUrl=queue.url,
        MaxNumberOfMessages=max_messages,
        WaitTimeSeconds=wait_seconds,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        **kwargs,
    )
    region = sqs_client.meta.region_name or DEFAULT_REGION
    return {
        "Records": [
            to_lambda_record(message, queue.arn, region) for message in response.get("Messages", [])
        ]
    }


def to_lambda_record(message: MessageTypeDef, queue_arn: str, region: str) -> dict[str, Any]:
    """One ReceiveMessage message in the Lambda SQS event record shape."""
    attributes = {str(k): str(v) for k, v in message.get("Attributes", {}).items()}
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": attributes,
        "messageAttributes": {
            name: _lambda_message_attribute(value)
            for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }
    if "MD5OfMessageAttributes" in message:
        # Lambda includes it only when the message has attributes.
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def _lambda_message_attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    # ReceiveMessage uses PascalCase and raw bytes; Lambda events use camelCase
    # and base64 strings, and always carry both list keys.
    out: dict[str, Any] = {
        "stringListValues": list(value.get("StringListValues", [])),
        "binaryListValues": [
            base64.b64encode(v).decode("ascii") for v in value.get("BinaryListValues", [])
        ],
        "dataType": value["DataType"],
    }
    if "StringValue" in value:
        out["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        out["binaryValue"] = base64.b64encode(value["BinaryValue"]).decode("ascii")
    return out


def lambda_record(
    body: str,
    queue_arn: str,
    *,
    receive_count: int = 1,
    message_id: str | None = None,
    sent_timestamp_ms: int | None = None,
    region: str | None = None,
) -> dict[str, Any]:
    """A synthetic Lambda SQS record (no queue involved), for pure tests.

    The receipt handle is not valid for any real queue.
    """
    now_ms = int(time.time() * 1000)
    sent = sent_timestamp_ms if sent_timestamp_ms is not None else now_ms
    if region is None:
        # arn:aws:sqs:<region>:<account>:<name>
        parts = queue_arn.split(":")
        region = parts[3] if len(parts) > 3 and parts[3] else DEFAULT_REGION
    message_id = message_id or str(uuid.uuid4())
    return {
        "messageId": message_id,
        "receiptHandle": base64.b64encode(f"synthetic:{message_id}".encode()).decode(),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": str(sent),
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": str(max(sent, now_ms)),
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode("utf-8")).hexdigest(),  # noqa: S324 (SQS's own checksum)
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }


def lambda_event(
    bodies: Iterable[str | Mapping[str, Any]],
    queue_arn: str = f"arn:aws:sqs:{DEFAULT_REGION}:{DEFAULT_ACCOUNT}:archive-queue",
    *,
    receive_count: int = 1,
) -> dict[str, Any]:
    """A synthetic event; mappings are JSON-encoded, strings are sent as-is."""
    return {
        "Records": [
            lambda_record(
                body if isinstance(body, str) else json.dumps(body),
                queue_arn,
                receive_count=receive_count,
            )
            for body in bodies
        ]
    }
