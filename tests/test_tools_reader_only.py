"""`kiln inspect`, `preview` and `verify` work in a reader-only install (no Beam, no OpenCV)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from kiln.tools import contact_sheet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORBIDDEN = ("apache_beam", "cv2", "pydantic", "yaml")

# Makes the pipeline extra's packages unimportable, as after `pip install kiln`,
# then runs both commands through the real entry point.
SCRIPT = """
import contextlib, importlib.abc, io, json, sys
FORBIDDEN = {forbidden!r}

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from kiln import cli
dataset, sheet = sys.argv[1], sys.argv[2]
inspect_out = io.StringIO()
with contextlib.redirect_stdout(inspect_out):
    inspect_code = cli.main(["inspect", dataset, "--json"])
with contextlib.redirect_stdout(io.StringIO()):
    preview_code = cli.main(["preview", dataset, "--n", "3", "--epochs", "2", "-o", sheet])
with contextlib.redirect_stdout(io.StringIO()):
    verify_code = cli.main(["verify", dataset])
print(json.dumps({{
    "inspect": inspect_code,
    "preview": preview_code,
    "verify": verify_code,
    "summary": json.loads(inspect_out.getvalue()),
    "loaded": sorted(m for m in FORBIDDEN if m in sys.modules),
}}))
"""


def test_inspect_and_preview_without_the_pipeline_extra(build_dataset, tmp_path):
    result = build_dataset()
    sheet_path = str(tmp_path / "sheet.png")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(REPO, "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(forbidden=FORBIDDEN), result.dataset_root,
         sheet_path], capture_output=True, text=True, env=env, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])

    assert report["loaded"] == []
    assert report["inspect"] == 0 and report["preview"] == 0 and report["verify"] == 0
    assert report["summary"]["version"] == result.version
    # Without OpenCV the sheet has no text margins; the images are all there.
    with open(sheet_path, "rb") as f:
        written = tf.io.decode_png(f.read()).numpy()
    expected, _ = contact_sheet.compose(
        contact_sheet.gather(result.dataset_root, n=3, epochs=2), text=False)
    np.testing.assert_array_equal(written, expected)
