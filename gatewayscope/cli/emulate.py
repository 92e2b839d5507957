"""``gatewayscope emulate bifrost``: run the Bifrost management-API emulator on loopback.

A thin shell over :mod:`gatewayscope.sandbox.bifrost_emulator` (the same runner as
``python -m gatewayscope.sandbox.bifrost_emulator``).
"""

from __future__ import annotations

import argparse
from typing import Any

from gatewayscope.sandbox.bifrost_emulator.cli import add_arguments, run

GATEWAYS = ("bifrost",)


def register(subparsers: Any) -> None:
    """Add ``emulate`` to the ``gatewayscope`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "emulate",
        help="run an emulator of a gateway's management API (tests, demos)",
        description=(
            "Run an emulator of a gateway's management API on loopback, seeded with a store. "
            "'bifrost' reproduces the Bifrost management API from gatewayscope's contract "
            "(it is an emulator, not the real gateway). Ctrl-C stops it."
        ),
    )
    parser.add_argument("gateway", choices=GATEWAYS, help="which gateway to emulate")
    add_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run(args)
