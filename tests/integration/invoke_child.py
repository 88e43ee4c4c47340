"""Run the archive handler once in a process of its own, as one Lambda container would.

    python -m tests.integration.invoke_child EVENT_JSON_FILE [READY_FILE GO_FILE]

The environment is inherited. With READY_FILE and GO_FILE, the child creates READY_FILE
once its imports are done and waits for GO_FILE, so several children can start their
invocation at the same moment. The response is printed as the last line: RESPONSE {...}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from handlers.archive import lambda_handler
from tests.support import FakeLambdaContext


def main(argv: list[str]) -> int:
    event = json.loads(Path(argv[1]).read_text())
    if len(argv) > 3:
        Path(argv[2]).touch()
        go = Path(argv[3])
        for _ in range(600):  # at most 30 s
            if go.exists():
                break
            time.sleep(0.05)
    response = lambda_handler(event, FakeLambdaContext())
    print("RESPONSE " + json.dumps(response), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
