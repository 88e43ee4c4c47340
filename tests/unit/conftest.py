from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.logcapture import capture_logs, parse


@pytest.fixture
def logs() -> Iterator[Callable[[], list[dict[str, object]]]]:
    """Call it to get the service's log lines so far, parsed."""
    with capture_logs() as raw:
        yield lambda: parse(raw)
