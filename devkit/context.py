"""A Lambda context object for calling handlers directly (tests, benches, `make local`)."""

from __future__ import annotations

import time
import uuid

from devkit.sqs import DEFAULT_ACCOUNT, DEFAULT_REGION


class LambdaContext:
    """The parts of Lambda's context object that handlers and Powertools read.

    `get_remaining_time_in_millis` counts down from `timeout_seconds`, as the function's
    timeout does, so time guards behave as they would deployed.

    With `from_first_look=True` the countdown starts when the handler first asks for the
    time left (the worker does before its claim), as if the invocation began right then:
    a short budget is then the handler's alone, never eaten by the test's own setup or a
    slow moment before the handler looked (tests of time running out stay exact on a
    busy machine).
    """

    def __init__(
        self,
        *,
        timeout_seconds: float = 120.0,
        function_name: str = "ArchiveFunction",
        memory_limit_in_mb: int = 512,
        region: str = DEFAULT_REGION,
        account: str = DEFAULT_ACCOUNT,
        from_first_look: bool = False,
    ) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account}:function:{function_name}"
        self.memory_limit_in_mb = memory_limit_in_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"local/[$LATEST]{uuid.uuid4().hex}"
        self.identity = None
        self.client_context = None
        self._timeout_seconds = timeout_seconds
        self._deadline: float | None = None
        if not from_first_look:
            self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        if self._deadline is None:  # from_first_look: this is the first look
            self._deadline = time.monotonic() + self._timeout_seconds
        return max(0, int((self._deadline - time.monotonic()) * 1000))
