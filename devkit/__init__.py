"""Real local services for tests and the `make local` demo.

Every service here is a real server bound to 127.0.0.1 on an ephemeral port:
a throwaway PostgreSQL cluster (`devkit.postgres`), a moto SQS server
(`devkit.sqs`), an upstream image server (`devkit.upstream`) and a Lsky Pro v1
API stand-in (`devkit.lsky`). `devkit.images` makes small valid image bytes.

Submodules are not imported here so that `import devkit` stays cheap and a test
that needs only one service does not pay for the others (moto and boto3 are
slow to import).
"""

import sys
from pathlib import Path

# devkit drives the service's own code (src/lib, src/handlers); put src/ on the path
# so `python -m devkit.demo` works from a checkout without PYTHONPATH.
_SRC = str(Path(__file__).resolve().parent.parent / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
