"""`python -m lib.cli`: archive-ctl (scripts/archive-ctl runs this)."""

import sys

from lib.cli.main import main

sys.exit(main())
