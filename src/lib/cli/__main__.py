"""`python -m lib.cli`: archive-ctl (scripts/archive-ctl runs this)."""

from lib.cli.main import run

run()
