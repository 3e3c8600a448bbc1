"""kiln's layering holds: the contracts in .importlinter are kept, and no import hides from them.

The contracts say what each package may import (the reader never Beam or
OpenCV, the kernels never TensorFlow, kiln.registry neither) and that no
package's modules import each other in a cycle. import-linter reads import
statements; an ``importlib.import_module("kiln....")`` is invisible to it,
which is how lazy imports once closed cycles unseen, so those are refused
here too.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCE = REPO / "src"

# lint-imports' own entry point, run with this interpreter.
LINT_IMPORTS = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def test_import_contracts_are_kept():
    # This checkout's source first: an installed kiln elsewhere must not be the one analysed.
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(SOURCE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
        ),
    )
    completed = subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", ".importlinter"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert " kept, 0 broken." in completed.stdout, completed.stdout


def test_no_kiln_module_is_imported_by_name_at_run_time():
    hidden = []
    for path in sorted((SOURCE / "kiln").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (
                isinstance(node, ast.Call)
                and _called_name(node.func) in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("kiln")
            ):
                hidden.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.args[0].value}")
    assert not hidden, (
        "import these with an import statement (registration happens "
        f"when the package is imported): {hidden}"
    )


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None
