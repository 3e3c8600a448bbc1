"""Every `kiln` command has --help with examples and exit codes, and a section in docs/cli.md."""

from __future__ import annotations

import os

import pytest

from kiln import cli

CLI_DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "cli.md"
)


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_help_has_examples_and_exit_codes(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "exit codes:" in text, command
    assert f"kiln {command} " in text.split("examples:", 1)[1], "an example runs the command"


def test_every_command_is_documented():
    with open(CLI_DOC, encoding="utf-8") as f:
        text = f.read()
    for command in cli.COMMANDS:
        assert f"\n## `kiln {command}`\n" in text, command
        assert f"[`kiln {command}`](#kiln-{command})" in text, command
