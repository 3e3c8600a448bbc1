"""The code passes the type checker, as configured in pyproject.toml.

mypy runs from this interpreter (setup.py's dev extra installs it and the stub
packages), on what ``[tool.mypy]`` names: the kiln package. ``make lint`` runs
the same checks directly.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900)


def test_mypy_finds_no_type_errors():
    completed = run("mypy")
    assert completed.returncode == 0, completed.stdout + completed.stderr
