"""`kiln lint` as a flake8 plugin: the same checks and codes, reported by flake8.

setup.py registers `Flake8Plugin` as the ``flake8.extension`` entry point ``K``,
the prefix of every kiln lint code (K000, K101-K110), so after installing kiln::

    flake8 --select K train.py src/

flake8 picks the files, parses them and applies its own ``--select`` /
``--ignore`` and ``# noqa: K101`` comments; ``# kiln: noqa`` comments keep
working too. A file that does not parse is flake8's own E999 (flake8 runs no
plugin on it), so K000 appears only for code nested too deeply to check.
Importing this module imports neither flake8 nor TensorFlow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kiln import __version__
from kiln.tools.lint import lint_tree


class Flake8Plugin:
    """A flake8 tree checker running kiln lint's checks on one file.

    flake8 passes the arguments by their names: the parsed module, the file's
    name and its lines (the source, for ``# kiln: noqa`` comments).
    """

    name = "kiln-lint"
    version = __version__

    def __init__(self, tree: ast.Module, filename: str, lines: list[str]):
        self._tree = tree
        self._filename = filename
        self._source = "".join(lines)

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        """(line, 0-based column, ``"CODE message (fix: ...)"``, plugin class) per finding."""
        for finding in sorted(lint_tree(self._tree, self._source, self._filename)):
            yield finding.line, finding.col - 1, finding.describe(), type(self)
