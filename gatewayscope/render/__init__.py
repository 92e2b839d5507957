"""Reports through jinja2 templates: the CLI, ``show`` and the notebooks render the same ones.

Session ids, record names and gateway errors are chosen by whoever calls a gateway, so every value a
template prints is treated as hostile:

* every value goes through :func:`terminal_safe` (no control, line-breaking or bidi character reaches a
  terminal, a log or a page: each shows as a visible escape such as ``\\x1b``);
* ``*.html.j2`` templates are autoescaped;
* ``*.md.j2`` templates escape Markdown syntax in every value (:func:`markdown_safe`); an id shown as code
  goes through the ``code`` filter (:func:`markdown_code`), which makes a code span it cannot leave.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, Undefined, pass_context, select_autoescape
from jinja2.runtime import Context
from markupsafe import Markup

from gatewayscope._text import terminal_safe

# Markdown: anywhere in a line, these open a link or an image, inline HTML, an entity, code, emphasis,
# strikethrough or a table cell; a backslash before each makes it literal
_MARKDOWN_INLINE = re.compile(r"[\\`*\[\]<|~&]")
# a run of underscores emphasises unless it sits inside a word (``tombstone_backfill`` stays as it is)
_MARKDOWN_UNDERSCORES = re.compile(r"_+")
# at the start of a value (a list item's text) these open a heading, a quote or a nested list
_MARKDOWN_LINE_START = re.compile(r"^(\s*)(#{1,6}(?=\s|$)|>|[-+](?=\s|$)|\d{1,9}[.)](?=\s|$))")


def _escape_underscores(match: re.Match[str]) -> str:
    text, start, end = match.string, match.start(), match.end()
    if start > 0 and end < len(text) and text[start - 1].isalnum() and text[end].isalnum():
        return match.group()
    return "\\_" * len(match.group())


def _escape_line_start(match: re.Match[str]) -> str:
    indent, marker = match.group(1), match.group(2)
    if marker[0].isdigit():  # "1." or "1)": the punctuation makes the list
        return indent + marker[:-1] + "\\" + marker[-1]
    return indent + "\\" + marker


def markdown_safe(text: str) -> str:
    r"""``text`` as Markdown that renders as exactly this text: no link, image, HTML, code or emphasis.

    >>> markdown_safe("[click](http://x) ![i](y) <b>*hi*</b> a|b tombstone_backfill")
    '\\[click\\](http://x) !\\[i\\](y) \\<b>\\*hi\\*\\</b> a\\|b tombstone_backfill'
    >>> markdown_safe("# not a heading"), markdown_safe("2. not a list")
    ('\\# not a heading', '2\\. not a list')
    """
    escaped = _MARKDOWN_UNDERSCORES.sub(_escape_underscores, _MARKDOWN_INLINE.sub(r"\\\g<0>", text))
    return _MARKDOWN_LINE_START.sub(_escape_line_start, escaped, count=1)


class MarkdownCode(str):
    """A Markdown code span made by :func:`markdown_code`: printed as it is, not escaped again."""


def markdown_code(text: Any) -> MarkdownCode:
    r"""``text`` as a Markdown code span, safe in a table cell: its content is shown literally.

    The fence is one backtick longer than the longest run of backticks inside, padded with a space when the
    content starts or ends with a backtick or a space; a ``|`` is escaped for the table (GFM unescapes it).

    >>> print(markdown_code("s:0"), markdown_code("a`b"), markdown_code("`x|y"))
    `s:0` ``a`b`` `` `x\|y ``
    """
    content = str(text).replace("|", "\\|")
    if not content:
        return MarkdownCode("")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", content)), default=0) + 1)
    pad = " " if content[0] in "` " or content[-1] in "` " else ""
    return MarkdownCode(f"{fence}{pad}{content}{pad}{fence}")


@pass_context
def _finalize(context: Context, value: Any) -> Any:
    """What every ``{{ ... }}`` of every template prints (HTML autoescaping comes after this)."""
    if isinstance(value, (Undefined, Markup)):  # nothing to print; or HTML made safe on purpose
        return value
    text = terminal_safe(value if isinstance(value, str) else str(value))
    if (context.name or "").endswith(".md.j2") and not isinstance(value, MarkdownCode):
        return markdown_safe(text)
    return text


def human_bytes(value: float | int | None) -> str:
    """1536 -> '1.5 KiB'.

    >>> human_bytes(3 * 1024 * 1024)
    '3.0 MiB'
    """
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def human_seconds(value: float | int | None) -> str:
    """7260 -> '2h 1m'.

    >>> human_seconds(7260)
    '2h 1m'
    >>> human_seconds(42.4)
    '42s'
    """
    if value is None:
        return "-"
    seconds = round(float(value))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gatewayscope", "render/templates"),
        autoescape=select_autoescape(enabled_extensions=("html.j2", "html"), default_for_string=True),
        undefined=StrictUndefined,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["bytes"] = human_bytes
    env.filters["duration"] = human_seconds
    env.filters["code"] = markdown_code
    return env


_ENV: Environment | None = None


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context``."""
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    return _ENV.get_template(template).render(**context)
