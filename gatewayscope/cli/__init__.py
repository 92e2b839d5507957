"""The ``gatewayscope`` command: a thin shell over the library.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module
adds its parser and sets ``func`` to a callable ``(args) -> int`` (the exit code).
Exit codes: 0 success, 1 a target or action did not succeed (output still printed),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from gatewayscope import __version__
from gatewayscope._text import terminal_safe
from gatewayscope.cli.common import setup_logging
from gatewayscope.errors import ConfigError, GatewayscopeError

#: subcommand modules, in the order ``--help`` lists them
COMMAND_MODULES = [
    "gatewayscope.cli.scan",
    "gatewayscope.cli.export",
    "gatewayscope.cli.demo",
    "gatewayscope.cli.remediate",
    "gatewayscope.cli.heal",
    "gatewayscope.cli.gateway",
    "gatewayscope.cli.guard",
    "gatewayscope.cli.emulate",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors say what to do and exit 2 like every other usage error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"gatewayscope: error: {message}\nRun '{self.prog} --help' for the options.\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gatewayscope",
        description=(
            "Observe and repair LLM gateways: orphan sessions in the rLLM trace store, "
            "parked worker pools and posture drift in Bifrost."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gatewayscope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except ConfigError as err:
        for problem in err.problems:
            sys.stderr.write(f"gatewayscope: {terminal_safe(problem)}\n")
        return EXIT_USAGE
    except GatewayscopeError as err:
        sys.stderr.write(f"gatewayscope: {terminal_safe(str(err))}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("gatewayscope: interrupted\n")
        return 130
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: not an error worth a traceback
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return EXIT_OK


def run() -> None:
    """Console-script entry point."""
    raise SystemExit(main())
