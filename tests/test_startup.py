"""Start-up: which heavy libraries each command path imports (never how long it takes).

`--help` of every command, a config error (a missing file, a typo, an
unknown augmentation op) and `kiln inspect` must answer without importing
TensorFlow or Beam: those imports take seconds, the answers should not
(`make bench` measures the seconds: benchmarks/startup_bench.py). Each case
runs `kiln.cli.main` in a fresh interpreter and reports the exit code and
which of the heavy modules ended up in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

import kiln
from conftest import make_config
from kiln import cli, native_logs

HEAVY = ("tensorflow", "apache_beam", "keras")
QUIETING_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "GRPC_VERBOSITY", native_logs.ENV)
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))

# Runs the command, then writes what it imported to the file named by argv[1].
PROBE = f"""
import json, sys
from kiln import cli
try:
    code = cli.main(sys.argv[2:])
except SystemExit as e:
    code = e.code
heavy = sorted(name for name in {HEAVY!r} if name in sys.modules)
with open(sys.argv[1], "w") as f:
    json.dump({{"code": code, "heavy": heavy}}, f)
"""


def probe(tmp_path, *args: str) -> dict:
    out = tmp_path / "probe.json"
    # The command sets these itself (an in-process `kiln` run of another test
    # may have left them in this process's environment).
    environment = {
        name: value for name, value in os.environ.items() if name not in QUIETING_VARIABLES
    }
    environment["PYTHONPATH"] = SOURCE_ROOT
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert completed.returncode == 0 and out.exists(), completed.stderr[-3000:]
    return json.loads(out.read_text()) | {"stdout": completed.stdout, "stderr": completed.stderr}


def write_config(tmp_path, name: str, config: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"]] + [[name, "--help"] for name in sorted(cli.COMMANDS)]
)
def test_help_imports_neither_tensorflow_nor_beam(tmp_path, args):
    result = probe(tmp_path, *args)
    assert result["code"] == 0, result["stderr"]
    assert result["heavy"] == [], args


def test_config_errors_are_found_before_beam_and_tensorflow(tmp_path, demo_corpus):
    good = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    cases = {
        "missing file": str(tmp_path / "nope.yaml"),
        "typo": write_config(tmp_path, "typo.yaml", dict(good, trasforms=good["transforms"])),
        # The augment list is checked last, against the reader's op declarations.
        "unknown op": write_config(
            tmp_path, "op.yaml", dict(good, augment=["random_flip_left_right", "random_flipp"])
        ),
        "bad op parameter": write_config(
            tmp_path, "param.yaml", dict(good, augment=[{"mixup": {"alpha": "lots"}}])
        ),
        # The reader's checks of the list against the dataset (no data needed).
        "rgb op on grey images": write_config(
            tmp_path, "grey.yaml", dict(good, image={"channels": 1}, augment=["random_hue"])
        ),
        "crop larger than the stored images": write_config(
            tmp_path, "crop.yaml", dict(good, augment=[{"random_crop": {"size": 400}}])
        ),
        # What the config alone says of the shard counts and the images' sizes.
        "count for a misspelt split": write_config(
            tmp_path, "shards.yaml", dict(good, sharding={"num_shards": {"tran": 2}})
        ),
        "pad beyond max_pixels": write_config(
            tmp_path,
            "pad.yaml",
            dict(good, image={"max_pixels": 40000}, transforms=[{"pad": {"size": 250}}]),
        ),
        "no source": write_config(
            tmp_path,
            "source.yaml",
            dict(good, source={"type": "image_folder", "root": str(tmp_path / "none")}),
        ),
        "output is a file": write_config(
            tmp_path, "output.yaml", dict(good, output=str(tmp_path / "output.yaml"))
        ),
        "empty file": str(tmp_path / "empty.yaml"),
    }
    (tmp_path / "empty.yaml").write_text("")
    for case, path in cases.items():
        result = probe(tmp_path, "build", "--config", path)
        assert result["code"] == 2, (case, result["stderr"])
        assert result["stderr"].count("\n") == 1, (case, result["stderr"])
        assert result["heavy"] == [], case
    assert not (tmp_path / "out").exists()


def test_inspect_reads_metadata_without_tensorflow(tmp_path, build_dataset):
    result = build_dataset()
    for args in (
        [result.dataset_root],
        [result.dataset_dir, "--json"],
        ["-v", result.dataset_root],
    ):
        probed = probe(tmp_path, "inspect", *args)
        assert probed["code"] == 0, (args, probed["stderr"])
        assert probed["heavy"] == [], args
        assert result.version in probed["stdout"]


def test_reading_commands_refuse_a_path_without_a_dataset_before_tensorflow(tmp_path):
    # A mistyped path in a cron line: one usage line at once, not after
    # TensorFlow's seconds of import (verify, preview and diff run TF ops on
    # a dataset; inspect never needs it).
    missing = str(tmp_path / "nonexistent")
    empty = tmp_path / "empty"
    empty.mkdir()
    sheet = str(tmp_path / "sheet.png")
    for args in (
        ["verify", missing],
        ["verify", "--quiet", str(empty)],
        ["inspect", missing],
        ["diff", missing, str(empty)],
        ["preview", missing, "-o", sheet],
    ):
        result = probe(tmp_path, *args)
        assert result["code"] == 2, (args, result["stderr"])
        assert result["stderr"].startswith(f"kiln {args[0]}: error: "), result["stderr"]
        assert result["stderr"].count("\n") == 1, (args, result["stderr"])
        assert result["stdout"] == "", args
        assert "tensorflow" not in result["heavy"], args


def test_validating_an_augment_list_needs_no_tensorflow(tmp_path):
    # The declarations are importable alone; the op bodies import TF when they run.
    out = tmp_path / "validated.json"
    code = (
        "import json, sys\n"
        "import kiln.reader\n"
        "ops = kiln.reader.validate(['random_flip_left_right', {'random_resized_crop': "
        "{'size': 56}}, {'mixup': {'alpha': 0.2}}])\n"
        "info = kiln.reader.names()\n"
        f"json.dump([[op.to_json() for op in ops], 'tensorflow' in sys.modules], "
        f"open({str(out)!r}, 'w'))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=SOURCE_ROOT)
    )
    ops, imported = json.loads(out.read_text())
    assert ops[1] == {
        "random_resized_crop": {
            "antialias": False,
            "method": "bilinear",
            "ratio_range": [0.75, 4 / 3],
            "scale_range": [0.08, 1.0],
            "size": [56, 56],
        }
    }
    assert imported is False


def test_quiet_build_prints_nothing_and_imports_them_after_validating(tmp_path, demo_corpus):
    # `kiln build --quiet` for cron: a successful build prints nothing at all,
    # not even TensorFlow's C++ start-up lines (absl, CUDA, oneDNN) on stderr.
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    path = write_config(tmp_path, "good.yaml", config)
    result = probe(tmp_path, "build", "--config", path, "--quiet")
    assert result["code"] == 0, result["stderr"]
    assert result["stdout"] == "" and result["stderr"] == ""
    # The probe does see the heavy imports: a real build needs both.
    assert {"apache_beam", "tensorflow"} <= set(result["heavy"])
    # Found up to date, the build lists the source (Beam) and runs no job:
    # TensorFlow's ~2 s of imports are not paid every night nothing changed.
    unchanged = probe(tmp_path, "build", "--config", path, "--quiet")
    assert unchanged["code"] == 0 and unchanged["stdout"] == unchanged["stderr"] == ""
    assert "tensorflow" not in unchanged["heavy"]

    # Without --quiet: kiln's own lines only (the summary on stdout; on stderr
    # at most progress lines, printed every 30 s off a terminal).
    again = probe(tmp_path, "build", "--config", path, "--output", str(tmp_path / "loud"))
    assert again["code"] == 0, again["stderr"]
    assert all(line.startswith("kiln build: ") for line in again["stderr"].splitlines())
    assert again["stdout"].startswith("kiln build: built shapes version ")


MULTI_PROCESSING = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")


def test_multi_processing_build_prints_only_kilns_lines(tmp_path, demo_corpus):
    # Beam's workers are other interpreters: their stderr is the command's,
    # and their log records come back through the job service's logger as
    # protobuf text ("Worker: severity: WARN timestamp { ... }").
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    path = write_config(tmp_path, "good.yaml", config)
    quiet = probe(tmp_path, "build", "--config", path, "--quiet", *MULTI_PROCESSING)
    assert quiet["code"] == 0, quiet["stderr"]
    assert quiet["stdout"] == "" and quiet["stderr"] == ""

    loud_output = str(tmp_path / "loud")
    loud = probe(tmp_path, "build", "--config", path, "--output", loud_output, *MULTI_PROCESSING)
    assert loud["code"] == 0, loud["stderr"]
    assert all(line.startswith("kiln build: ") for line in loud["stderr"].splitlines())
    lines = loud["stdout"].splitlines()
    assert lines[0].startswith("kiln build: built shapes version ")
    assert all(line.startswith("  ") for line in lines[1:]), lines  # the summary's body

    # What the two runs kept out: with --verbose the workers' warnings show.
    verbose_output = str(tmp_path / "verbose")
    verbose = probe(
        tmp_path, "-v", "build", "--config", path, "--output", verbose_output, *MULTI_PROCESSING
    )
    assert verbose["code"] == 0, verbose["stderr"]
    assert "Worker: severity: WARN" in verbose["stderr"]


def test_reading_commands_print_only_their_own_lines(tmp_path, build_dataset):
    # verify and preview run TensorFlow ops: no absl, oneDNN, CUDA or
    # TFRecordDataset lines from it on stderr, only the command's output.
    result = build_dataset()
    verified = probe(tmp_path, "verify", result.dataset_root)
    assert verified["code"] == 0 and verified["stderr"] == "", verified["stderr"]
    assert verified["stdout"].startswith("kiln verify: OK: ")
    sheet = str(tmp_path / "sheet.png")
    previewed = probe(tmp_path, "preview", result.dataset_root, "--n", "2", "-o", sheet)
    assert previewed["code"] == 0 and previewed["stderr"] == "", previewed["stderr"]


def test_python_dash_m_kiln_is_the_kiln_command(tmp_path):
    """``python -m kiln`` (no scripts folder on PATH) runs the same command
    line: its --help answers without the heavy libraries, and a bad config
    exits 2 with kiln's one line."""
    env = dict(os.environ, PYTHONPATH=SOURCE_ROOT)
    probe = "import runpy, sys\nsys.argv[0] = 'kiln'\n"
    probe += "try:\n    runpy.run_module('kiln', run_name='__main__')\nexcept SystemExit as e:\n"
    probe += f"    print(sorted(n for n in {HEAVY!r} if n in sys.modules), e.code)\n"
    helped = subprocess.run(
        [sys.executable, "-c", probe, "--help"], capture_output=True, text=True, env=env
    )
    assert helped.stdout.startswith("usage: kiln ") and helped.stdout.endswith("\n[] 0\n")
    missing = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "--config", str(tmp_path / "nowhere.yaml")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith("kiln build: error: ") and missing.stderr.count("\n") == 1


def test_inspect_names_staging_folders_without_tensorflow(tmp_path, build_dataset):
    # The staging folders' sizes and times, and the lock's state, are plain
    # Python on a local disk too.
    result = build_dataset()
    root = tmp_path / "shapes"
    shutil.copytree(result.dataset_root, root)
    (root / ".staging-0123456789ab-dead").mkdir()
    (root / ".staging-0123456789ab-dead" / "shard").write_bytes(b"x")
    probed = probe(tmp_path, "inspect", str(root))
    assert probed["code"] == 0, probed["stderr"]
    assert probed["heavy"] == []
    assert "staging folder(s) of builds that did not finish" in probed["stdout"]
