"""Runs Python snippets in a fresh interpreter: for what one process cannot show.

Import side effects, a second process reproducing a seeded stream, and
logical devices (which must be configured before TensorFlow initializes).
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(script: str, *args: str, env: dict | None = None, timeout: int = 300) -> str:
    """Runs `script` in a fresh interpreter (kiln importable); returns stdout, fails on error."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(REPO, "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    full_env.update(env or {})
    completed = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                               text=True, env=full_env, timeout=timeout)
    assert completed.returncode == 0, (
        f"subprocess failed ({completed.returncode}):\n{completed.stdout}\n"
        f"{completed.stderr[-4000:]}"
    )
    return completed.stdout
