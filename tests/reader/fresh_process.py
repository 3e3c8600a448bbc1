"""Runs Python snippets in a fresh interpreter: for what one process cannot show.

Import side effects, a second process reproducing a seeded stream, and
logical devices (which must be configured before TensorFlow initializes).
"""

from __future__ import annotations

import os
import subprocess
import sys

import kiln

# The sources of the kiln this process imported (this checkout's src, or
# another tree's put first on PYTHONPATH): fresh interpreters import the same.
KILN_SRC = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))

# The pipeline extra's packages: absent from a reader-only install (`pip install kiln`).
# (pydantic is a base dependency: augmentation parameters are validated with it.)
PIPELINE_ONLY = ("apache_beam", "cv2", "yaml")

_READER_ONLY_PRELUDE = f"""
import importlib.abc, sys
FORBIDDEN = {PIPELINE_ONLY!r}

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""


def reader_only_install(script: str) -> str:
    """`script` behind a finder that makes `PIPELINE_ONLY` unimportable, as in a
    reader-only install; the script sees them as the tuple ``FORBIDDEN``."""
    return _READER_ONLY_PRELUDE + script


def fresh_environment(env: dict | None = None) -> dict:
    """The environment of a fresh interpreter: the kiln this process imported
    first (`KILN_SRC`), TF's C++ logs off."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [KILN_SRC] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    full_env.update(env or {})
    return full_env


def run_python(script: str, *args: str, env: dict | None = None, timeout: int = 300) -> str:
    """Runs `script` in a fresh interpreter (kiln importable); returns stdout, fails on error."""
    full_env = fresh_environment(env)
    completed = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    assert completed.returncode == 0, (
        f"subprocess failed ({completed.returncode}):\n{completed.stdout}\n"
        f"{completed.stderr[-4000:]}"
    )
    return completed.stdout
