"""TensorFlow's native start-up lines, kept out of a command's output.

Loading TensorFlow's shared libraries writes to the process's stderr before
Python logging, or TensorFlow's own log settings, exist: absl's ``WARNING:
All log messages before absl::InitializeLog() is called are written to
STDERR``, then INFO lines (``oneDNN custom operations are on``, ``Could not
find cuda drivers``), once per library, whatever ``TF_CPP_MIN_LOG_LEVEL``
says. A cron job mails them; `kiln build --quiet` must print nothing.

`install` adds an import hook that loads TensorFlow with file descriptor 2
pointed at a temporary file, then writes back every line except absl's
INFO and WARNING ones (errors, and anything else, still show). The kiln
command line turns it on (not with ``--verbose``) through the environment
variable `ENV`, which Beam's worker processes inherit: importing `kiln`
installs the hook in any process where it is set. Library users get
TensorFlow's usual output.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

ENV = "KILN_QUIET_NATIVE_LOGS"

# absl's pre-initialization notice, and its INFO/WARNING lines:
# ``I0000 00:00:1796101836.284725    1159 cudart_stub.cc:31] Could not find...``
_NOISE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] )"
)
_QUIET_MODULES = ("tensorflow",)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Runs the block with fd 2 captured, then writes back all but absl's INFO/WARNING lines."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [
                line for line in captured.read().splitlines(keepends=True) if not _NOISE.match(line)
            ]
            if kept:
                os.write(2, b"".join(kept))


class _FilteredLoader(importlib.abc.Loader):
    """Runs another loader's `exec_module` inside `filtered_stderr`."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with filtered_stderr():
            self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # is_package, get_resource_reader...
        return getattr(self._loader, name)


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds `_QUIET_MODULES` as the other finders do, with `_FilteredLoader` as their loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _QUIET_MODULES:
            return None
        # Imported once per process: step aside, and let the others find it.
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteredLoader(spec.loader)
        return spec


def install() -> None:
    """Quiets TensorFlow's import in this process (if it is not imported yet)."""
    if any(name in sys.modules for name in _QUIET_MODULES):
        return
    if not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())
