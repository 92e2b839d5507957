"""Pause Python's cyclic garbage collector while a source turns a large answer into rows.

Parsing a listing of 5,000 Bifrost records or a few thousand rLLM traces allocates hundreds of
thousands of dicts and lists, none of them in a reference cycle. Each allocation burst runs the
collector's younger generations dozens of times, and now and then a full collection that walks every
object of the process (the exporter holds many), finding nothing to free. Reference counting still frees
everything as usual while the collector is paused; the pause ends with the block, whatever happens.

The pause is process-wide (``gc.disable``), so concurrent readers (the exporter reads targets on
several threads) share it: the collector is re-enabled when the last of them leaves, and only if it
was enabled when the first one came in.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (nested and concurrent uses are fine).

    >>> import gc
    >>> with gc_paused():
    ...     with gc_paused():
    ...         inside = gc.isenabled()
    >>> inside, gc.isenabled()
    (False, True)
    """
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
