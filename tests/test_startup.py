"""The command line starts without loading what only some commands need.

``gatewayscope --help`` (and the parsing every command does first) imports neither polars, jinja2, httpx,
prometheus-client nor the widget stack: each command loads those when it runs. Checked with Python's own
import log (``-X importtime``), in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: every test here starts a process (make e2e runs them)
pytestmark = pytest.mark.e2e

HEAVY = ("polars", "jinja2", "httpx", "prometheus_client", "ipywidgets", "matplotlib")


def imported_modules(code: str) -> set[str]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [["--help"], ["scan", "--help"], ["apply", "--help"], ["guard", "--help"],
                                  ["export", "--help"], ["gateway", "--help"]])
def test_help_loads_none_of_the_heavy_libraries(argv: list[str]) -> None:
    code = ("import sys\nfrom gatewayscope.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n")
    loaded = imported_modules(code)
    assert "gatewayscope.cli" in loaded  # the log is read right
    heavy = sorted(name for name in loaded if name.split(".")[0] in HEAVY)
    assert not heavy, f"'gatewayscope {' '.join(argv)}' loads {', '.join(heavy[:8])}"
