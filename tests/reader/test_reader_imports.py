"""`import kiln.reader` pulls in TensorFlow, NumPy, pydantic and the standard library only."""

from __future__ import annotations

import json
import os

from reader.fresh_process import PIPELINE_ONLY, reader_only_install, run_python

# Uses the reader for real with the pipeline extra's packages unimportable.
READER_ONLY_INSTALL = reader_only_install("""
import json
import kiln.reader
batch = next(iter(kiln.reader.load(sys.argv[1], batch_size=4, seed=0)))
print(json.dumps({
    "loaded": sorted(m for m in FORBIDDEN if m in sys.modules),
    "batch_shape": list(batch[0].shape),
    "layer": kiln.reader.AugmentationLayer(["random_flip_left_right"]).name != "",
}))
""")

# In the full environment: records which code imports each forbidden package.
WHO_IMPORTS = """
import importlib.abc, json, sys, traceback
FORBIDDEN = {forbidden!r}
importers = {{}}

class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in FORBIDDEN and top not in importers:
            # The innermost frame outside importlib and this finder ran the import.
            frames = [f.filename for f in traceback.extract_stack()[:-1]
                      if not f.filename.startswith("<frozen")]
            importers[top] = frames[-1]
        return None

sys.meta_path.insert(0, Recorder())
import kiln.reader
import kiln.reader.layer
print(json.dumps({{"loaded": sorted(m for m in FORBIDDEN if m in sys.modules),
                  "importers": importers, "kiln": kiln.__file__}}))
"""


def test_reader_works_without_beam_opencv_yaml(png_dataset):
    out = json.loads(
        run_python(READER_ONLY_INSTALL, png_dataset.dataset_dir).strip().splitlines()[-1]
    )
    assert out["loaded"] == []
    assert out["batch_shape"] == [4, 24, 24, 3]
    assert out["layer"]


def test_reader_code_imports_none_of_them():
    printed = run_python(WHO_IMPORTS.format(forbidden=PIPELINE_ONLY))
    out = json.loads(printed.strip().splitlines()[-1])
    # TensorFlow never imports these two.
    assert not {"apache_beam", "yaml"} & set(out["loaded"]), out["importers"]
    # TF 2.21 imports Keras eagerly, and Keras' visualization module imports
    # cv2 when it is installed (as in this dev environment, not in a
    # reader-only install). Whatever imported a forbidden package must not
    # be kiln's own code.
    kiln_dir = os.path.dirname(out["kiln"])
    for module, importer in out["importers"].items():
        assert not importer.startswith(kiln_dir), f"{importer} imports {module}"
