"""Following traced code into the other modules of one `kiln lint` run.

A training script often maps a function from a helper module of its own
(``from augment import blur``; ``ds.map(blur)``, or ``helpers.to_label(label)``
called from the mapped function). Checked alone, neither file shows the
pitfall: the script does not have the helper's source, and in the helper
module nothing says `blur` is traced. When both files are checked in the same
run, the imported name is looked up among them by its module name (the file's
path below its outermost package, or the file's own name for a script next to
the importing one) and the function is checked there, as traced, with the
arguments the caller passes. Its findings are reported in its own file.

Only module-level functions (and the names they are assigned to) are
followed; a module name two checked files share is followed only to the one
next to the importing file.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable, Iterable, Sequence

from kiln.tools.lint.rules import Finding
from kiln.tools.lint.taint import ExternalCall, ModuleChecker


def module_name(path: str) -> tuple[str, pathlib.Path]:
    """A file's dotted module name and the directory its outermost package is in.

    ``src/pkg/sub/mod.py`` with ``pkg/__init__.py`` and ``sub/__init__.py`` is
    ``pkg.sub.mod`` in ``src``; a package's ``__init__.py`` is the package.
    """
    file = pathlib.Path(path).absolute()
    parts = [] if file.stem == "__init__" else [file.stem]
    directory = file.parent
    while (directory / "__init__.py").is_file() and directory.parent != directory:
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts), directory


Loader = Callable[[str], tuple[ast.Module, str]]
"""Reads and parses a file: (tree, source); raises as `read_source` and `ast.parse` do."""


class Project:
    """The files of one run, checked one at a time, then the imported functions followed.

    `check` checks a file alone and notes the functions it imports from the
    other files; `follow` then checks those files again (only those: holding
    every file's tree at once would cost memory and garbage-collector time on
    a large tree) with the imported functions traced as their callers call them.
    """

    def __init__(self, paths: Sequence[str]):
        self._located = {path: module_name(path) for path in paths}
        self._names: dict[str, list[tuple[str, pathlib.Path]]] = {}
        for path, (name, root) in self._located.items():
            if name:
                self._names.setdefault(name, []).append((path, root))
        self._packages = {name.split(".")[0] for name in self._names}
        self._pending: list[tuple[str, ExternalCall]] = []

    def check(self, path: str, tree: ast.Module) -> list[Finding] | None:
        """A file's findings before noqa and selection; None if nested too deeply to check."""
        checker = self._checked(path, tree)
        return None if checker is None else checker.findings()

    def follow(self, load: Loader) -> dict[str, tuple[list[Finding] | None, ast.Module, str]]:
        """The files that define imported traced functions, checked again with them:
        path -> (findings as `check` gives them, tree, source), replacing `check`'s."""
        checkers: dict[str, tuple[ModuleChecker | None, ast.Module, str]] = {}
        followed: set[tuple[str, str, ExternalCall]] = set()
        while self._pending:
            caller, call = self._pending.pop()
            target = _resolve(self._located[caller], caller, call.qualified, self._names)
            if target is None or (target[0], target[1], call) in followed:
                continue
            path, function = target
            followed.add((path, function, call))
            if path not in checkers:
                try:
                    tree, source = load(path)
                except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
                    continue  # reported by the run's own reading of it
                checkers[path] = (self._checked(path, tree), tree, source)
            checker = checkers[path][0]
            if checker is None:
                continue  # nested too deeply to check
            known = len(checker.external_calls)
            try:
                checker.analyse_external(function, call)
            except RecursionError:
                checkers[path] = (None, *checkers[path][1:])
                continue
            self._note(path, checker.external_calls[known:])
        return {
            path: (None if checker is None else checker.findings(), tree, source)
            for path, (checker, tree, source) in checkers.items()
        }

    def _checked(self, path: str, tree: ast.Module) -> ModuleChecker | None:
        """`path` checked, its calls of other files' functions noted; None if nested too deeply."""
        checker = ModuleChecker(tree, path)
        try:
            checker.run()
        except RecursionError:
            return None
        self._note(path, checker.external_calls)
        return checker

    def _note(self, path: str, calls: Iterable[ExternalCall]) -> None:
        # Most calls are of tensorflow, numpy...: no file of the run, not looked up.
        self._pending.extend(
            (path, call)
            for call in calls
            if call.qualified.startswith(".") or call.qualified.split(".")[0] in self._packages
        )


def _resolve(
    located: tuple[str, pathlib.Path],
    caller: str,
    qualified: str,
    names: dict[str, list[tuple[str, pathlib.Path]]],
) -> tuple[str, str] | None:
    """(path of the checked module, function name in it) an import path in `caller`
    (whose `module_name` is `located`) refers to, if any."""
    caller_name, caller_root = located
    if qualified.startswith("."):
        level = len(qualified) - len(qualified.lstrip("."))
        package = caller_name.split(".")
        if pathlib.Path(caller).name != "__init__.py":
            package = package[:-1]
        if level - 1 > len(package):
            return None
        base = package[: len(package) - (level - 1)]
        qualified = ".".join([*base, qualified[level:]]).strip(".")
    module, _, function = qualified.rpartition(".")
    candidates = names.get(module, [])
    if len(candidates) > 1:
        candidates = [(path, root) for path, root in candidates if root == caller_root]
    if len(candidates) != 1 or not function.isidentifier():
        return None
    return candidates[0][0], function
