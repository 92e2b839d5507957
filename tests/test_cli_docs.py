"""Every command is documented: docs/cli.md has a section for it, every flag appears in the documentation,
and its --help describes it (a test fails when one is not)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gatewayscope.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI_DOCS = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
#: everything a user reads: the README and every page under docs/
ALL_DOCS = "\n".join([README, *(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))])


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action is not None else {}


def commands() -> list[str]:
    return sorted(subcommands(build_parser()))


def every_parser() -> list[tuple[str, argparse.ArgumentParser]]:
    """("gatewayscope scan", its parser), ... for every command and every subcommand of a command."""
    out = []
    for name, parser in sorted(subcommands(build_parser()).items()):
        out.append((f"gatewayscope {name}", parser))
        out += [(f"gatewayscope {name} {sub}", subparser) for sub, subparser in sorted(subcommands(parser).items())]
    return out


def test_there_are_commands() -> None:
    assert {"scan", "plan", "show", "apply", "export", "gateway", "guard", "emulate", "demo"} <= set(commands())


@pytest.mark.parametrize("command", commands())
def test_every_command_is_documented_and_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"gatewayscope {command}" in README + CLI_DOCS, f"neither README.md nor docs/cli.md mentions " \
                                                             f"'gatewayscope {command}'"
    assert f"\n## `gatewayscope {command}`\n" in CLI_DOCS, f"docs/cli.md has no section '## `gatewayscope {command}`'"
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gatewayscope " + command)
    assert len(out.splitlines()) > 3


@pytest.mark.parametrize("name,parser", every_parser(), ids=[name for name, _ in every_parser()])
def test_every_flag_is_documented(name: str, parser: argparse.ArgumentParser) -> None:
    flags = sorted({option for action in parser._actions for option in action.option_strings
                    if option.startswith("--") and option != "--help"})
    missing = [flag for flag in flags if f"`{flag}" not in ALL_DOCS and f" {flag}" not in ALL_DOCS]
    assert not missing, f"{name}: {', '.join(missing)} not in README.md or docs/*.md (document it in docs/cli.md)"


def test_every_guard_action_is_in_the_cli_reference() -> None:
    guard = subcommands(build_parser())["guard"]
    missing = [action for action in subcommands(guard) if f"gatewayscope guard {action}" not in CLI_DOCS]
    assert not missing, f"docs/cli.md does not show: {', '.join(missing)}"


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "scan" in capsys.readouterr().out
