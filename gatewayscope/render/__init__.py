"""Reports through jinja2 templates: the CLI, ``show`` and the notebooks render the same ones."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape


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
        autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["bytes"] = human_bytes
    env.filters["duration"] = human_seconds
    return env


_ENV: Environment | None = None


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with ``context``."""
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    return _ENV.get_template(template).render(**context)
