"""Static checks of training code for tf.data / tf.function tracing pitfalls.

`Dataset.map` (and `filter`, `flat_map`, `interleave`) and `tf.function` do not
call a Python function once per element: they *trace* it once into a graph.
Python code in the body therefore runs once, at trace time, and whatever it
computed is frozen into the graph. This package finds the usual ways that goes
wrong, by reading the source with the standard library's `ast` only (no
TensorFlow import, so it is fast and runs anywhere):

=====  =================================================================
K000   the file could not be read or parsed (always reported)
K101   `random.*` / `numpy.random.*` (or a NumPy/Python generator object)
K102   `.numpy()`, or `int()` / `float()` / `bool()` of a tensor
K103   `print(...)`
K104   Python `if` / conditional expression / `and`-`or` / comprehension
       `if` / `match` (a value `case`, a guard) on a tensor value
K105   Python `while` on a tensor value
K106   `assert` on a tensor value
K107   `tf.py_function` / `tf.numpy_function` / `tf.compat.v1.py_func`
K108   a NumPy / OpenCV / SciPy / scikit-image / PIL call on a tensor value,
       or an albumentations / imgaug / torchvision transform called on one
K109   Python state changed: a `global`/`nonlocal` name assigned, or a
       module-level, enclosing or `self.*` object mutated (`append`,
       `update`, `x[k] = v`, `+=`, ...)
K110   `time.time()`, `datetime.now()`, `uuid.uuid4()`, `os.urandom()`,
       `secrets.*`: a clock, unique id or OS entropy
=====  =================================================================

The modules, in the order a file goes through them:

- `files`: which files to check, and reading them;
- `resolution`: imports, scopes and what a name refers to in one module;
- `traced_functions`: which functions TensorFlow traces (`tf.function`, and the
  functions given to a tf.data `Dataset.map` rather than another library's);
- `taint`: which values in traced code are tensors, following same-module calls;
- `project`: following calls of imported functions into the other files of a run;
- `rules`: the codes, and which statement, expression or call is which pitfall;
- `noqa` and `selection`: ``# kiln: noqa`` comments, ``--select`` / ``--ignore``;
- `command` (``kiln lint``) and `flake8_plugin` (the same checks under flake8).

Silence one line with a trailing ``# kiln: noqa`` (every code) or
``# kiln: noqa[K101,K103]`` (those codes).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable

from kiln.tools.lint import project, rules, taint
from kiln.tools.lint.files import SKIPPED_DIRECTORIES, python_files, read_source
from kiln.tools.lint.noqa import NoqaComments
from kiln.tools.lint.rules import RULES, SYNTAX_ERROR_CODE, Finding, Rule
from kiln.tools.lint.selection import CodeFilter
from kiln.tools.lint.taint import MAX_CALL_DEPTH

__all__ = [
    "MAX_CALL_DEPTH",
    "RULES",
    "SKIPPED_DIRECTORIES",
    "SYNTAX_ERROR_CODE",
    "Finding",
    "Rule",
    "lint_file",
    "lint_files",
    "lint_paths",
    "lint_source",
    "lint_tree",
    "python_files",
]


def lint_source(
    source: str,
    filename: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks one module's source text.

    Args:
      source: the Python source.
      filename: used as `Finding.path`.
      select: report only codes starting with one of these (e.g. ``["K10"]``).
      ignore: do not report codes starting with one of these.

    Returns:
      Findings sorted by line and column. A source that does not parse gives a
      single K000 finding at the error, whatever `select`/`ignore` say.

    Raises:
      ValueError: if `select` or `ignore` name a code prefix no rule has.
    """
    code_filter = CodeFilter(select, ignore)
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError, RecursionError) as e:  # ValueError: null bytes
        return [rules.file_not_checked(filename, e)]
    return sorted(f for f in lint_tree(tree, source, filename) if code_filter.wants(f.code))


def lint_tree(tree: ast.Module, source: str, filename: str) -> list[Finding]:
    """Checks a module already parsed from `source` (as flake8 hands it to plugins).

    Returns:
      Every finding not silenced by a ``# kiln: noqa`` comment, in no particular
      order; or one K000 finding for code nested deeper than the checker recurses.
    """
    try:
        findings = taint.check_module(tree, filename)
    except RecursionError:
        # Machine-generated code can nest deeper than the checker recurses.
        return [rules.nested_too_deeply_to_check(filename)]
    noqa = NoqaComments(source, tree)
    return [f for f in findings if not noqa.silences(f)]


def lint_file(
    path: str | os.PathLike,
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks one file; an unreadable or undecodable file gives one K000 finding."""
    name = str(path)
    try:
        source = read_source(path)
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        return [rules.file_not_checked(name, e)]
    return lint_source(source, name, select=select, ignore=ignore)


def lint_files(
    paths: Iterable[str | os.PathLike],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks files together; findings sorted by file and line.

    Unlike `lint_file` on each, a function one of them imports from another
    (``from augment import blur``; ``ds.map(blur)``) is checked as traced code
    in its own file (see `project`). A file that cannot be read, decoded or
    parsed gives one K000 finding; the others are still checked.

    Raises:
      ValueError: if `select` or `ignore` name a code prefix no rule has.
    """
    code_filter = CodeFilter(select, ignore)
    names = list(dict.fromkeys(str(path) for path in paths))
    run = project.Project(names)
    results: dict[str, list[Finding]] = {}
    for name in names:
        try:
            tree, source = _load(name)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError) as e:
            results[name] = [rules.file_not_checked(name, e)]  # ValueError: null bytes
            continue
        results[name] = _kept(name, run.check(name, tree), tree, source, code_filter)
    for name, (found, tree, source) in run.follow(_load).items():
        results[name] = _kept(name, found, tree, source, code_filter)
    return sorted(f for found in results.values() for f in found)


def _load(path: str) -> tuple[ast.Module, str]:
    source = read_source(path)
    return ast.parse(source, filename=path), source


def _kept(
    path: str, found: list[Finding] | None, tree: ast.Module, source: str, code_filter: CodeFilter
) -> list[Finding]:
    """The findings not silenced by a noqa comment and selected; K000 for None."""
    if found is None:
        return [rules.nested_too_deeply_to_check(path)]
    noqa = NoqaComments(source, tree)
    return [f for f in found if not noqa.silences(f) and code_filter.wants(f.code)]


def lint_paths(
    paths: Iterable[str | os.PathLike],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks files and directories (see `python_files`) together, as `lint_files`;
    findings sorted by file and line.

    Raises:
      FileNotFoundError: if a path does not exist (nothing is checked then).
      ValueError: if `select` or `ignore` name a code prefix no rule has.
    """
    CodeFilter(select, ignore)  # validate before doing any work
    return lint_files(python_files(paths), select=select, ignore=ignore)
