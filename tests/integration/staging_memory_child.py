"""Peak RSS growth of one archive that stages a big image, in a process of its own.

    python -m tests.integration.staging_memory_child TINY_ID BIG_ID

The environment is inherited (staging on, the lane paused). The tiny record warms the
container up (database connection, the S3 client, Powertools) as bench.memory does; then
the peak is reset and the big record is captured. Prints RESULT {...} as its last line.
"""

from __future__ import annotations

import gc
import json
import sys

from bench import common
from bench.lambda_call import archive


def main(argv: list[str]) -> int:
    tiny_id, big_id = int(argv[1]), int(argv[2])
    archive(tiny_id)
    gc.collect()
    reset = common.reset_peak_rss()
    baseline = common.rss() if reset else common.peak_rss()
    archive(big_id)
    peak = common.peak_rss()
    result = {"baseline": baseline, "peak": peak, "growth": peak - baseline, "reset": reset}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
