"""archive-ctl: parses the command line (lib.cli.parser), hands it to the command's module
and maps what fails to an exit code and one line on stderr. Installed as the `archive-ctl`
console script (`run`); from a checkout, scripts/archive-ctl or `python -m lib.cli` with
src/ on the path.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import NoReturn

import pg8000.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from lib.cli import verbose
from lib.cli.context import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    PROG,
    CommandError,
    Context,
    UsageError,
    describe_error,
)
from lib.cli.parser import build_parser
from lib.platform import config
from lib.platform.errors import ConfigError, DatabaseUnavailable
from lib.platform.observability import logger

__all__ = ["build_parser", "main", "run"]


@contextmanager
def _terminal_logging(verbose: bool) -> Iterator[None]:
    """The service's Powertools logger writes JSON to stdout for CloudWatch; on a
    terminal stdout is the report, so its lines (warnings only, unless -v) go to stderr.
    Restored afterwards, so that `main` can be called from other code and tests."""
    handler = logger.registered_handler
    stream = getattr(handler, "stream", None)
    level = logger.log_level
    if isinstance(handler, logging.StreamHandler):
        handler.setStream(sys.stderr)
    logger.setLevel("DEBUG" if verbose else "WARNING")
    try:
        yield
    finally:
        if isinstance(handler, logging.StreamHandler) and stream is not None:
            handler.setStream(stream)
        logger.setLevel(level)


def error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def main(
    argv: Sequence[str] | None = None,
    *,
    make_context: Callable[[argparse.Namespace], Context] = Context,
) -> int:
    """Run one command; returns its exit code (argparse exits 2 itself on a bad command
    line, as UsageError does through the command's parser)."""
    try:
        return _run_command(argv, make_context)
    except BrokenPipeError:
        # `archive-ctl list | head -1`: the reader has what it wanted. Stop as a tool killed
        # by SIGPIPE would, without a traceback (Python ignores the signal and raises).
        _discard_output()
        return EXIT_BROKEN_PIPE


def _run_command(
    argv: Sequence[str] | None, make_context: Callable[[argparse.Namespace], Context]
) -> int:
    args = build_parser().parse_args(argv)
    config.use_aws_region()
    ctx = make_context(args)
    handler: Callable[[Context], int] = args.handler
    with (
        _terminal_logging(args.verbose),
        verbose.aws_calls_logged() if args.verbose else nullcontext(),
    ):
        try:
            return handler(ctx)
        except UsageError as usage:
            command_parser: argparse.ArgumentParser = args.command_parser
            command_parser.error(str(usage))  # exits EXIT_USAGE
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except (
            CommandError,
            ConfigError,
            DatabaseUnavailable,
            pg8000.exceptions.Error,
            BotoCoreError,
            ClientError,
        ) as failure:
            return error(describe_error(failure, database=ctx.connected))
        finally:
            ctx.close()


def _discard_output() -> None:
    """Point stdout and stderr at /dev/null, so that the interpreter's last flush at exit
    does not fail on the closed pipe again (and print that it did)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush
            continue
    os.close(devnull)


def run() -> NoReturn:
    """The `archive-ctl` console script (pyproject.toml [project.scripts])."""
    sys.exit(main())
