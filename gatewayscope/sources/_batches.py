"""Cutting a list of ids into the batches one request or one statement carries."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def batches(items: Sequence[T], size: int) -> Iterator[list[T]]:
    """``items`` in order, ``size`` at a time (the last batch may be shorter; none when ``items`` is empty).

    >>> list(batches(["a", "b", "c", "d", "e"], 2))
    [['a', 'b'], ['c', 'd'], ['e']]
    """
    for start in range(0, len(items), size):
        yield list(items[start:start + size])
