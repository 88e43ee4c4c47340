"""`python -m devkit.demo`: see devkit/demo/__init__.py."""

import sys

from devkit.demo.run import main

# The guard matters: spawned containers import this module as __mp_main__.
if __name__ == "__main__":
    sys.exit(main())
