"""The code passes the type checker and the linter, and is formatted, as configured in
pyproject.toml.

Both run from this interpreter (setup.py's dev extra installs them and the stub
packages): mypy on what ``[tool.mypy]`` names, the kiln package; ruff on the
source, the tests and the benchmarks. ``make lint`` runs the same checks directly.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900
    )


def test_mypy_finds_no_type_errors():
    completed = run("mypy")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_ruff_finds_nothing_to_fix():
    completed = run(
        "ruff", "check", "--no-cache", "--output-format", "concise", "src", "tests", "benchmarks"
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_code_is_formatted_by_ruff():
    completed = run("ruff", "format", "--check", "--no-cache", "src", "tests", "benchmarks")
    assert completed.returncode == 0, (
        completed.stdout + completed.stderr + "\nrun `ruff format src tests benchmarks`"
    )
