"""Every command is documented: README names it and its --help describes it (a test fails when one is not)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gatewayscope.cli import build_parser, main

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def commands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices)


def test_there_are_commands() -> None:
    assert {"scan", "plan", "show", "apply", "export", "gateway", "guard", "emulate", "demo"} <= set(commands())


@pytest.mark.parametrize("command", commands())
def test_every_command_is_in_the_readme_and_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"gatewayscope {command}" in README, f"README does not mention 'gatewayscope {command}'"
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gatewayscope " + command)
    assert len(out.splitlines()) > 3


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "scan" in capsys.readouterr().out
