"""The work of an argparse type for a number, for every command line of the package.

Kept apart from the CLI so that the guarded gateway's launcher takes its arguments without importing the CLI
and the configuration.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def checked_number(text: str, convert: Callable[[str], N], ok: Callable[[N], bool], not_a_number: str,
                   out_of_range: str) -> N:
    """What an argparse type for a number does: ``convert(text)``, refused with ``not_a_number`` when it raises
    ValueError and with ``out_of_range`` when ``ok`` says no (``argparse.ArgumentTypeError``; both sentences are
    formatted with ``text`` and ``value``)."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(not_a_number.format(text=text)) from None
    if not ok(value):
        raise argparse.ArgumentTypeError(out_of_range.format(text=text, value=value))
    return value
