"""Security basics: the linter's rules catch the unsafe calls, and modules are imported by a
computed name only where the user names them.

Nothing read from disk is unpickled or evaluated, and YAML is read only with
the safe loader: ruff checks that (the S rules and the banned calls of
pyproject.toml, run by tests/test_code_quality.py). The first test shows that
the project's ruff configuration reports each of those calls in kiln's
source. (Beam pickles kiln's DoFns to ship them to its workers: that is
Beam's own transport of code kiln constructed, not data read from a file.)

No linter knows kiln's rule for imports by a computed name: only a config's
``plugins:``, ``kiln preview --plugin`` and kiln's own command table.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCE = REPO / "src" / "kiln"

# Each call kiln's policy forbids, and the rule that reports it.
FORBIDDEN = {
    "pickle.load(f)": "S301",
    "pickle.loads(data)": "S301",
    "pickle.Unpickler(f)": "S301",
    "dill.loads(data)": "S301",
    "shelve.open(path)": "S301",
    "marshal.loads(data)": "S302",
    "cloudpickle.loads(data)": "TID251",
    "yaml.load(text)": "S506",
    "yaml.load(text, Loader=yaml.Loader)": "S506",
    "yaml.unsafe_load(text)": "TID251",
    "yaml.full_load(text)": "TID251",
    "yaml.load_all(text)": "TID251",
    "yaml.unsafe_load_all(text)": "TID251",
    "yaml.full_load_all(text)": "TID251",
    "numpy.load(path, allow_pickle=True)": "TID251",
    "eval(text)": "S307",
    "exec(text)": "S102",
}
ALLOWED = ["yaml.safe_load(text)", "yaml.load(text, Loader=yaml.SafeLoader)", "json.loads(text)"]

# Where a module name that is not a literal may be imported, and why.
DYNAMIC_IMPORTS = {
    ("registry.py", "import_plugin"),  # a config's plugins, kiln preview --plugin MODULE
    ("cli.py", "main"),  # cli.COMMANDS, kiln's own modules
    ("pipeline/pipeline_flags.py", "runner_class"),  # --runner: Beam's runners or a dotted path
    ("lazy_import.py", "_resolve"),  # LazyModule("tensorflow"): names written in kiln's code
}


def ruff_findings(source: str, as_path: str) -> list[tuple[int, str]]:
    """(line, code) of what the project's ruff configuration reports in `source`,
    checked as if it were the file `as_path` of this repository."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "json",
            "--stdin-filename",
            as_path,
            "-",
        ],
        cwd=REPO,
        input=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode in (0, 1), completed.stderr
    return sorted((f["location"]["row"], f["code"]) for f in json.loads(completed.stdout))


def test_the_linter_reports_every_unsafe_call_in_kiln_source():
    calls = list(FORBIDDEN) + ALLOWED
    source = textwrap.dedent("""\
        import json
        import marshal
        import pickle
        import shelve

        import cloudpickle
        import dill
        import numpy
        import yaml


        def read(f, data, text, path):
        """) + "".join(f"    {call}\n" for call in calls)
    first = source.count("\n") - len(calls) + 1
    expected = [(first + i, FORBIDDEN[call]) for i, call in enumerate(FORBIDDEN)]
    assert ruff_findings(source, "src/kiln/pipeline/example.py") == expected


def python_files():
    for path in sorted(SOURCE.rglob("*.py")):
        yield path.relative_to(SOURCE).as_posix(), path


def calls(tree):
    """(enclosing function name, call node) for every call in a module."""

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                else function
            )
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, inner)

    yield from visit(tree, "<module>")


def dotted(node):
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Name):
        return node.id
    return None


def test_modules_are_imported_by_computed_name_only_where_the_user_names_them():
    dynamic = set()
    for relative, path in python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for function, call in calls(tree):
            if dotted(call.func) in (
                "importlib.import_module",
                "import_module",
                "__import__",
            ) and not (call.args and isinstance(call.args[0], ast.Constant)):
                dynamic.add((relative, function))
    assert dynamic == DYNAMIC_IMPORTS
