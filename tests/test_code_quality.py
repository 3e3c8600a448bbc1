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


def test_mypy_checks_a_training_script_calls_to_the_reader(tmp_path):
    """README: the package is typed, so mypy checks a user's calls to
    `kiln.reader`. The names `kiln.reader` imports when first asked for
    (`load`, `load_for_model`, the layer, ...) were Any to mypy: a misspelt
    keyword passed unnoticed."""
    script = tmp_path / "train.py"
    script.write_text(
        "import kiln.reader\n"
        "from kiln.reader import load_for_model\n"
        "\n"
        'kiln.reader.load("gs://b/shapes", batch_size=64, seed=1, shufle=True)\n'
        'load_for_model("gs://b/shapes", batch_size="64")\n'
        "layer: kiln.reader.AugmentationLayer\n"
        "error: kiln.reader.AugmentOpError\n"
        "replicas: kiln.reader.ReplicaIterator\n"
        "buffer: str = kiln.reader.DEFAULT_SHUFFLE_BUFFER\n"
    )
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    errors = [line for line in completed.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["4", "5", "9"], completed.stdout
    assert 'Unexpected keyword argument "shufle" for "load"' in errors[0]
    assert 'Argument "batch_size" to "load_for_model"' in errors[1]
    assert 'Incompatible types in assignment (expression has type "int"' in errors[2]
