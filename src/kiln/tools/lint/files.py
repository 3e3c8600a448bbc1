"""Which files `kiln lint` checks, and reading their source as the interpreter would."""

from __future__ import annotations

import io
import os
import pathlib
import tokenize
from collections.abc import Iterable, Iterator

SKIPPED_DIRECTORIES = frozenset(
    {
        "__pycache__",
        "node_modules",
        "site-packages",
        "venv",
        "env",
        "build",
        "dist",
    }
)


def python_files(paths: Iterable[str | os.PathLike]) -> list[pathlib.Path]:
    """The files to check: each file given, and every ``*.py`` under each directory.

    Directories are walked in sorted order, skipping hidden directories, virtual
    environments, caches and build outputs (see `SKIPPED_DIRECTORIES`). Files named
    explicitly are checked whatever their extension. Duplicates are dropped.

    Raises:
      FileNotFoundError: naming the first path that does not exist.
    """
    found: list[pathlib.Path] = []
    seen: set[pathlib.Path] = set()
    for raw in paths:
        path = pathlib.Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or directory: {raw}")
        candidates = [path] if path.is_file() else _walk_python_files(path)
        for candidate in candidates:
            key = candidate.resolve()
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    return found


def _walk_python_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(
            d
            for d in subdirectories
            if not d.startswith(".")
            and d not in SKIPPED_DIRECTORIES
            and not d.endswith(".egg-info")
        )
        for name in sorted(files):
            if name.endswith(".py"):
                yield pathlib.Path(directory) / name


def read_source(path: str | os.PathLike) -> str:
    """A file's text, decoded honouring a PEP 263 coding cookie, like the interpreter.

    Raises:
      OSError: if the file cannot be read.
      SyntaxError: for a coding cookie naming an unknown encoding.
      UnicodeDecodeError: if the bytes are not in the file's encoding.
    """
    raw = pathlib.Path(path).read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding)
