"""`kiln inspect`, `preview` and `verify` work in a reader-only install (no Beam, no OpenCV)."""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from kiln.tools import contact_sheet
from reader.fresh_process import reader_only_install, run_python

# Runs the three commands through the real entry point with the pipeline
# extra's packages unimportable, as after `pip install kiln`.
SCRIPT = reader_only_install("""
import contextlib, io, json
from kiln import cli
dataset, sheet = sys.argv[1], sys.argv[2]
inspect_out = io.StringIO()
with contextlib.redirect_stdout(inspect_out):
    inspect_code = cli.main(["inspect", dataset, "--json"])
with contextlib.redirect_stdout(io.StringIO()):
    preview_code = cli.main(["preview", dataset, "--n", "3", "--epochs", "2", "-o", sheet])
with contextlib.redirect_stdout(io.StringIO()):
    verify_code = cli.main(["verify", dataset])
print(json.dumps({
    "inspect": inspect_code,
    "preview": preview_code,
    "verify": verify_code,
    "summary": json.loads(inspect_out.getvalue()),
    "loaded": sorted(m for m in FORBIDDEN if m in sys.modules),
}))
""")


def test_inspect_and_preview_without_the_pipeline_extra(build_dataset, tmp_path):
    result = build_dataset()
    sheet_path = str(tmp_path / "sheet.png")
    output = run_python(SCRIPT, result.dataset_root, sheet_path)
    report = json.loads(output.strip().splitlines()[-1])

    assert report["loaded"] == []
    assert report["inspect"] == 0 and report["preview"] == 0 and report["verify"] == 0
    assert report["summary"]["version"] == result.version
    # Without OpenCV the sheet has no text margins; the images are all there.
    with open(sheet_path, "rb") as f:
        written = tf.io.decode_png(f.read()).numpy()
    expected, _ = contact_sheet.compose(
        contact_sheet.gather(result.dataset_root, n=3, epochs=2), text=False
    )
    np.testing.assert_array_equal(written, expected)
