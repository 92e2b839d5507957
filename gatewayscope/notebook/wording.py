"""The notebook's words for what the core says in the command line's: a flag becomes the widget or parameter.

The core's errors and plan warnings name CLI flags (``pass --config``, ``--include-suspected``), which mean
nothing in a notebook. :func:`notebook_words` rewrites those phrases into the widget (and the papermill
parameter) that does the same; every message a view shows goes through it. Phrases it does not know are
left as they are, so a new core message is never lost, only worded for the command line.

>>> notebook_words("2 left out; --include-suspected plans their deletion.")
"2 left out; the 'include suspected orphans' box (include_suspected) plans their deletion."
"""

from __future__ import annotations

import re

#: (pattern, replacement), applied in order: the longer phrases first, then the bare flags
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    (r"pass --config with the path of your gatewayscope\.toml",
     "put the path of your gatewayscope.toml in the config box (config_path)"),
    (r"pass --config FILE with \[\[targets\]\], or --trace-store URL\|PATH / --bifrost URL",
     "give a config file (the config box, config_path) or addresses (the rLLM and Bifrost boxes)"),
    (r"make one with 'gatewayscope plan --out [^']*'",
     "check plan_path, or build a plan with the Build plan button"),
    (r"apply needs --allow-delete \(or the delete confirmation in the notebook\)",
     "Apply needs the delete confirmation (the deletes box, confirm_deletes)"),
    (r"\(apply --rate sets a fixed pace instead\)", "(ApplyOptions(rate=...) sets a fixed pace instead)"),
    (r"needs --allow-delete", "needs the delete confirmation (the deletes box, confirm_deletes)"),
    (r"with the config it was planned with \(--config\)", "with the config it was planned with (config_path)"),
    (r"--include-suspected", "the 'include suspected orphans' box (include_suspected)"),
    (r"--include-deletes", "the 'include record deletes' box (include_deletes)"),
    (r"--allow-delete", "the delete confirmation (confirm_deletes)"),
    (r"--trace-store", "the rLLM box (trace_stores)"),
    (r"--bifrost\b", "the Bifrost box (bifrost_urls)"),
    (r"--orphan-idle-seconds", "orphan_idle_seconds"),
    (r"--max-errors", "max errors"),
    (r"--concurrency", "ApplyOptions(concurrency)"),
    (r"pass --config", "use the config box (config_path)"),
    (r"\(--config\)", "(config_path)"),
    (r"--config\b", "the config box (config_path)"),
))


def notebook_words(text: str) -> str:
    """``text`` with the CLI flags it names replaced by the notebook's widgets and parameters."""
    for pattern, replacement in _PHRASES:
        text = pattern.sub(replacement, text)
    return text
