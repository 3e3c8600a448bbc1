"""`kiln lint` as a flake8 plugin: setup.py's entry point, and real flake8 running it on the
corpus."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from flake8.defaults import VALID_CODE_PREFIX

import kiln
from kiln.tools import lint
from kiln.tools.lint.flake8_plugin import Flake8Plugin
from test_lint import CORPUS, CORPUS_FILES, expected_findings

SETUP = pathlib.Path(__file__).parent.parent / "setup.py"
# The directory kiln is imported from here, so flake8's subprocess checks the same code.
KILN_SOURCE = pathlib.Path(kiln.__file__).parent.parent
_FLAKE8_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>[A-Z]+\d+) ")

# flake8 reports a file that does not parse itself (E999) and runs no plugin on it.
PARSED_CORPUS_FILES = [path for path in CORPUS_FILES if path.name != "syntax_error.py"]


def setup_flake8_entry_point() -> importlib.metadata.EntryPoint:
    """The one ``flake8.extension`` entry point setup.py declares, read without running setup.py."""
    for node in ast.walk(ast.parse(SETUP.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            [declaration] = ast.literal_eval(node.value)["flake8.extension"]
            name, value = (part.strip() for part in declaration.split("=", 1))
            return importlib.metadata.EntryPoint(name, value, "flake8.extension")
    raise AssertionError("setup.py declares no entry_points")


def test_setup_py_entry_point_is_the_plugin_under_the_prefix_of_every_code():
    entry_point = setup_flake8_entry_point()
    assert VALID_CODE_PREFIX.match(entry_point.name), entry_point.name
    assert all(code.startswith(entry_point.name) for code in lint.RULES)
    assert entry_point.load() is Flake8Plugin


@pytest.fixture(scope="module")
def flake8_run(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """Runs real flake8 once on the corpus and a file silenced flake8's way: (that file, stdout).

    Uses the installed entry point when kiln was installed from this setup.py
    (`make venv`); otherwise declares setup.py's entry point to flake8 as a
    local plugin, since the environment's kiln may be installed from another
    checkout. Either way flake8 finds, loads and runs the plugin itself.
    """
    directory = tmp_path_factory.mktemp("flake8")
    silenced = directory / "flake8_noqa.py"
    silenced.write_text(
        textwrap.dedent("""\
        import tensorflow as tf


        def augment(image):
            print(image)  # noqa: K103
            label = image.numpy()
            return image, label


        ds = tf.data.Dataset.range(3).map(augment)
        """)
    )
    entry_point = setup_flake8_entry_point()
    command = [
        sys.executable,
        "-m",
        "flake8",
        "--select",
        f"{entry_point.name},E999",
        "--jobs",
        "1",
    ]
    installed = [
        ep
        for ep in importlib.metadata.entry_points(group="flake8.extension")
        if ep.name == entry_point.name
    ]
    if installed:
        assert [ep.value for ep in installed] == [entry_point.value]
        command.append("--isolated")  # no configuration file of this machine
    else:
        config = directory / "flake8.cfg"
        config.write_text(
            f"[flake8:local-plugins]\nextension =\n    {entry_point.name} = {entry_point.value}\n"
        )
        command += ["--config", str(config)]
    python_path = os.pathsep.join(filter(None, [str(KILN_SOURCE), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [*command, *map(str, CORPUS_FILES), str(silenced)],
        capture_output=True,
        text=True,
        cwd=directory,
        env={**os.environ, "PYTHONPATH": python_path},
        timeout=300,
    )
    assert result.returncode == 1, result.stderr  # 1: flake8 reported something
    assert result.stderr == ""
    return silenced, result.stdout


def reported(stdout: str, path: pathlib.Path) -> list[str]:
    """flake8's lines about one file."""
    lines = stdout.splitlines()
    assert all(_FLAKE8_LINE.match(line) for line in lines), stdout
    return [line for line in lines if _FLAKE8_LINE.match(line).group("path") == str(path)]


def line_and_code(line: str) -> tuple[int, str]:
    match = _FLAKE8_LINE.match(line)
    return int(match.group("line")), match.group("code")


@pytest.mark.parametrize("path", PARSED_CORPUS_FILES, ids=lambda p: p.name)
def test_flake8_reports_the_marked_codes_at_their_lines(flake8_run, path):
    _, stdout = flake8_run
    lines = reported(stdout, path)
    assert {line_and_code(line) for line in lines} == expected_findings(path)
    # The same lines kiln lint prints: place, code, message and fix.
    assert sorted(lines) == sorted(f.format() for f in lint.lint_file(path))


def test_flake8_reports_a_syntax_error_itself(flake8_run):
    _, stdout = flake8_run
    assert [line_and_code(line) for line in reported(stdout, CORPUS / "syntax_error.py")] == [
        (6, "E999")
    ]


def test_flake8_noqa_comment_silences_a_kiln_code(flake8_run):
    silenced, stdout = flake8_run
    assert [line_and_code(line) for line in reported(stdout, silenced)] == [(6, "K102")]


def test_plugin_import_loads_neither_flake8_nor_tensorflow():
    # flake8 imports every installed plugin on every run; kiln lint must start fast.
    script = (
        "import sys\nimport kiln.tools.lint.flake8_plugin, kiln.tools.lint.command\n"
        "heavy = {'flake8', 'tensorflow', 'apache_beam', 'numpy', 'cv2'} & set(sys.modules)\n"
        "assert not heavy, sorted(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(KILN_SOURCE)},
    )
    assert result.returncode == 0, result.stderr
