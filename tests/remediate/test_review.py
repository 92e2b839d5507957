"""The plan review's templates cover exactly the formats the CLI offers."""

from __future__ import annotations

from pathlib import Path

import gatewayscope.render
from gatewayscope.remediate.kinds import PLAN_FORMATS
from gatewayscope.remediate.review import FORMATS


def test_every_cli_format_has_exactly_one_template_file() -> None:
    assert tuple(FORMATS) == PLAN_FORMATS
    templates = Path(gatewayscope.render.__file__).parent / "templates"
    for name in FORMATS.values():
        assert (templates / name).is_file(), name
