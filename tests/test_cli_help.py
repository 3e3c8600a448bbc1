"""Every `kiln` command has --help with examples and exit codes, and a section in docs/cli.md."""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_python_dash_m_kiln_is_the_kiln_command(tmp_path):
    # `python -m kiln` for a checkout or an environment without the entry
    # point on PATH; a config error answers as `kiln build` does.
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    environment = {**os.environ, "PYTHONPATH": source_root}
    run = [sys.executable, "-m", "kiln"]
    completed = subprocess.run(
        [*run, "--help"], capture_output=True, text=True, env=environment, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: kiln "), completed.stdout
    missing = tmp_path / "missing.yaml"
    completed = subprocess.run(
        [*run, "build", "--config", str(missing)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.startswith("kiln build: error: "), completed.stderr
