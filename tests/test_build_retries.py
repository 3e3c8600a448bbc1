"""Retried bundles leave no trace in the dataset.

Beam's local engine (the FnApiRunner) and the portable job service never
retry a failed bundle; the BundleBasedDirectRunner retries each failed
bundle up to 4 times, as Dataflow retries work items. A test-only plugin
transform fails the image step's bundle the first time it sees some images
(a marker file per image tells a retry from a first attempt), after earlier
records of the bundle have gone into sorted runs: every record spills its
own run here. The retried build must be byte-identical to a build without
failures, count every image once in kiln.json, and leave no run or temp
file behind.

A plugin's own exceptions normally drop the image (errors.jsonl,
``transform_failed``): bad input is data. To fail the bundle instead, the
plugin's exception cannot even be described (its ``str`` raises), which is
the one way a plugin failure escapes `images.ImageProcessor`.

A worker process killed mid-bundle (SIGKILL) is not retried by any runner
that runs here: the local engine in ``multi_processing`` mode and the
portable job service with an external worker pool both fail the job
("Channel closed prematurely"), and the BundleBasedDirectRunner runs every
bundle in the launcher's own process. What kiln owes then is that the
killed build leaves nothing behind and the next build is the same as one
that was never interrupted (`test_a_killed_worker_fails_the_build_without_a_trace`).
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import kiln
from conftest import make_config
from kiln.pipeline import build
from kiln.pipeline.launcher import BuildError

pytestmark = pytest.mark.slow

PLUGIN_MODULE = "kiln_test_flaky_plugin"
PLUGIN_SOURCE = """
    import hashlib
    import os

    import numpy as np
    from kiln.transforms import register


    class Indescribable(Exception):
        def __str__(self):
            raise RuntimeError("injected failure: this bundle attempt fails")


    @register()
    def flaky_identity(image: np.ndarray) -> np.ndarray:
        folder = os.environ.get("KILN_TEST_FLAKY_DIR")
        if folder:
            digest = hashlib.sha256(image.tobytes()).hexdigest()
            if int(digest[:2], 16) < 12:  # about one image in twenty
                marker = os.path.join(folder, digest)
                if not os.path.exists(marker):
                    # The run files spilled so far (this attempt's included).
                    runs = [
                        name
                        for _, _, names in os.walk(os.environ["KILN_TEST_FLAKY_OUTPUT"])
                        for name in names
                        if name.startswith("run-")
                    ]
                    with open(marker, "w") as f:
                        f.write(str(len(runs)))
                    raise Indescribable()
        return image
"""

KILLER_MODULE = "kiln_test_killer_plugin"
KILLER_SOURCE = """
    import hashlib
    import os
    import signal

    import numpy as np
    from kiln.transforms import register


    @register()
    def killer_identity(image: np.ndarray) -> np.ndarray:
        folder = os.environ.get("KILN_TEST_KILL_DIR")
        if folder:
            digest = hashlib.sha256(image.tobytes()).hexdigest()
            if int(digest[:2], 16) < 12:  # about one image in twenty
                marker = os.path.join(folder, digest)
                if not os.path.exists(marker):
                    with open(marker, "w") as f:
                        f.write(str(os.getpid()))
                    os.kill(os.getpid(), signal.SIGKILL)  # this worker, mid-bundle
        return image
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flaky-plugin")
    (folder / f"{PLUGIN_MODULE}.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    (folder / f"{KILLER_MODULE}.py").write_text(textwrap.dedent(KILLER_SOURCE))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_retried_bundles_give_the_same_dataset(
    plugin_dir, build_dataset, demo_corpus, tmp_path, monkeypatch
):
    overrides = {
        "transforms": [
            {"resize": {"shorter_side": 40}},
            {"center_crop": {"size": 32}},
            "flaky_identity",
        ],
        "plugins": [PLUGIN_MODULE],
        # Runs of one record: a failed attempt has spilled runs already.
        "sharding": {
            "num_shards": {"train": 3, "validation": 1, "test": 1},
            "target_shard_mb": 1e-6,
        },
    }
    clean = build_dataset(**overrides)  # the local engine, no failures

    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("KILN_TEST_FLAKY_DIR", str(markers))
    output = tmp_path / "out"
    monkeypatch.setenv("KILN_TEST_FLAKY_OUTPUT", str(output))
    retried = build(
        make_config(demo_corpus.out_dir, output=str(output), **overrides),
        ["--runner=BundleBasedDirectRunner"],
    )
    failures = sorted(os.listdir(markers))
    assert len(failures) >= 2  # bundles did fail, and were retried
    # ... after spilling runs that the retry replaced.
    assert sum(int((markers / name).read_text()) for name in failures) > 0

    assert retried.info.version == clean.info.version
    assert retried.info.to_json() == clean.info.to_json()  # counts, statistics, shards
    assert _files(Path(retried.dataset_dir)) == _files(Path(clean.dataset_dir))
    # Nothing of a failed attempt anywhere under the output: no run files,
    # no temp shards, no work folder.
    leftovers = [
        name
        for name in _files(output)
        if "run-" in name or ".tmp-" in name or ".work" in name or ".staging" in name
    ]
    assert leftovers == []


def test_a_killed_worker_fails_the_build_without_a_trace(
    plugin_dir, build_dataset, demo_corpus, tmp_path, monkeypatch
):
    overrides = {
        "transforms": [
            {"resize": {"shorter_side": 40}},
            {"center_crop": {"size": 32}},
            "killer_identity",
        ],
        "plugins": [KILLER_MODULE],
    }
    clean = build_dataset(**overrides)  # the local engine in this process, no kills

    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("KILN_TEST_KILL_DIR", str(markers))  # the workers inherit it
    # The workers are fresh interpreters: they import this kiln and the plugin.
    kiln_root = str(Path(kiln.__file__).resolve().parent.parent)
    inherited = [p for p in [os.environ.get("PYTHONPATH")] if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([kiln_root, str(plugin_dir), *inherited]))
    output = tmp_path / "out"
    config = make_config(demo_corpus.out_dir, output=str(output), **overrides)
    workers = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    with pytest.raises(BuildError, match=r"the Beam job failed.*nothing was published"):
        build(config, workers)
    killed = {int((markers / name).read_text()) for name in os.listdir(markers)}
    assert killed and os.getpid() not in killed  # worker processes died, not this one
    # Nothing published, no staging or work folder, no run or temp file.
    assert sorted(_files(output)) == ["shapes/.lock"]

    # The next build (no more kills: every marker exists) is the clean one.
    again = build(config, workers)
    assert again.info.to_json() == clean.info.to_json()
    assert _files(Path(again.dataset_dir)) == _files(Path(clean.dataset_dir))
    leftovers = [
        name
        for name in _files(output)
        if "run-" in name or ".tmp-" in name or ".work" in name or ".staging" in name
    ]
    assert leftovers == []
