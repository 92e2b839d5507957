"""Text that is safe to print: what a gateway's callers chose (session ids, record names) shown, not obeyed.

Kept apart from the templates so that the command line can escape what it prints without loading jinja2.
"""

from __future__ import annotations

import re

#: C0 controls but tab, DEL, C1 controls, the Unicode line and paragraph separators, and the bidi
#: embeddings, overrides, isolates and marks (they reorder what a reader sees)
_UNSAFE_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r"}


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    r"""``text`` with every control, line-breaking and bidi character shown as a visible escape; tab stays.

    What a hostile id can carry (ANSI sequences, a newline that forges a line, a right-to-left override)
    comes out as plain characters, on one line:

    >>> terminal_safe("x\x1b[2J\nALL CLEAR\u202e")
    'x\\x1b[2J\\nALL CLEAR\\u202e'
    >>> terminal_safe("task:0\tok")
    'task:0\tok'
    """
    return _UNSAFE_CHARS.sub(_escape_char, text)
