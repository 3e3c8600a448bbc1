"""`kiln build`'s checks of what a new user gets wrong: a ``--base`` that names
no version (also when the dataset is up to date), splits left without an
example, and split names from the source that look misspelt. Real builds
on the DirectRunner, through the command line where its output matters.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

import kiln.reader
from conftest import backdated, make_config, run_kiln
from kiln import cli
from kiln.pipeline import build
from kiln.schemas import MetadataError
from test_build_publishing import small_corpus

WARNING = "WARNING kiln.pipeline.launcher: "
EMPTY_SPLITS = "split(s) with no example: "


def write_config(path, config) -> str:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def good_keys(corpus) -> list[str]:
    keys = []
    for class_name in sorted(os.listdir(corpus.out_dir)):
        for name in sorted(os.listdir(os.path.join(corpus.out_dir, class_name))):
            key = f"{class_name}/{name}"
            if key not in corpus.broken:
                keys.append(key)
    return keys


def warnings_of(stderr: str) -> list[str]:
    return [line[len(WARNING) :] for line in stderr.splitlines() if line.startswith(WARNING)]


# --- --base VERSION -----------------------------------------------------------------------


def test_a_base_that_names_no_version_fails_also_when_the_dataset_is_up_to_date(
    demo_corpus, tmp_path, capsys, monkeypatch
):
    """A cron line with a bad ``--base`` fails the first night, not the first
    night the inputs change."""
    root = tmp_path / "images"
    small_corpus(demo_corpus, root)
    backdated(root)
    output = tmp_path / "out"
    config = write_config(tmp_path / "config.yaml", make_config(root, output=str(output)))
    assert cli.main(["build", "--config", config, "--quiet"]) == 0
    version = (output / "shapes" / "LATEST").read_text().strip()
    capsys.readouterr()

    report = tmp_path / "report.json"
    argv = ["build", "--config", config, "--quiet", "--base", "nothex", "--report", str(report)]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"kiln build: error: --base nothex: no complete version nothex in {output / 'shapes'}\n"
    )
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("usage_error", 2)
    assert (output / "shapes" / "LATEST").read_text().strip() == version
    # A version folder outside the dataset's folder: the message says what --base takes.
    elsewhere = str(tmp_path / "copy" / version)
    assert cli.main(["build", "--config", config, "--quiet", "--base", elsewhere]) == 2
    assert capsys.readouterr().err == (
        f"kiln build: error: --base {elsewhere}: not a version folder of {output / 'shapes'}: "
        f"--base takes the id of one of its versions (the name of its folder, e.g. "
        f"--base {version})\n"
    )

    # A base that is a complete version: the up-to-date dataset stays so.
    assert cli.main(["build", "--config", config, "--quiet", "--base", version]) == 0
    assert capsys.readouterr().err == ""
    assert (output / "shapes" / "LATEST").read_text().strip() == version
    # Its folder, relative to the current folder, is the same base.
    monkeypatch.chdir(tmp_path)
    argv = ["build", "--config", config, "--quiet", "--report", str(report)]
    assert cli.main([*argv, "--base", f"out/shapes/{version}/"]) == 0
    assert capsys.readouterr().err == ""
    assert json.loads(report.read_text())["version"] == version


# --- splits without an example ------------------------------------------------------------


@pytest.fixture(scope="module")
def two_images(demo_corpus, tmp_path_factory):
    """Two images split 80/10/10: at least one split gets none."""
    root = tmp_path_factory.mktemp("two-images") / "images"
    for key in good_keys(demo_corpus)[:2]:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(demo_corpus.out_dir, key), root / key)
    return backdated(root)


FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}


def test_a_split_left_without_an_example_is_a_warning(two_images, tmp_path, capsys):
    config = make_config(
        two_images, output=str(tmp_path / "out"), splits={"fractions": FRACTIONS}, sharding={}
    )
    path = write_config(tmp_path / "config.yaml", config)
    report = tmp_path / "report.json"
    loud = run_kiln("build", "--config", path, "--report", str(report))
    assert loud.returncode == 0, loud.stderr
    dataset = str(tmp_path / "out" / "shapes")
    info = kiln.reader.info(dataset)
    empty = [name for name in FRACTIONS if info.splits[name].num_examples == 0]
    filled = [name for name in FRACTIONS if info.splits[name].num_examples > 0]
    assert empty and filled  # two images, three splits

    (warning,) = [w for w in warnings_of(loud.stderr) if w.startswith(EMPTY_SPLITS)]
    named = ", ".join(f"{name} ({FRACTIONS[name]:.0%})" for name in empty)
    shares = "its share" if len(empty) == 1 else "their shares"
    assert warning == (
        f"{EMPTY_SPLITS}{named}: 2 examples are too few for {shares} of splits.fractions; "
        f"kiln.reader.load cannot read an empty split: add images, or raise its fraction"
    )
    assert "Traceback" not in loud.stderr
    assert json.loads(report.read_text())["warnings"] == [warning]

    # --quiet prints nothing; the report has the warning.
    quiet_report = tmp_path / "quiet.json"
    argv = ["build", "--config", path, "--output", str(tmp_path / "quiet"), "--quiet"]
    assert cli.main([*argv, "--report", str(quiet_report)]) == 0
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")
    assert json.loads(quiet_report.read_text())["warnings"] == [warning]


def test_reading_a_split_without_an_example_says_so(two_images, tmp_path, capsys):
    """`load` and `kiln preview` on the empty split: it has 0 examples in
    this version, and these splits have some (not "has no shards")."""
    config = make_config(
        two_images, output=str(tmp_path / "out"), splits={"fractions": FRACTIONS}, sharding={}
    )
    result = build(config)
    info = result.info
    empty = [name for name in FRACTIONS if info.splits[name].num_examples == 0]
    filled = [name for name in FRACTIONS if info.splits[name].num_examples > 0]
    assert empty and filled
    readable = ", ".join(f"{name!r} ({info.splits[name].num_examples})" for name in filled)
    for name in empty:
        with pytest.raises(MetadataError) as raised:
            kiln.reader.load(result.dataset_root, name, batch_size=2)
        message = str(raised.value)
        assert message == (
            f"{result.dataset_dir}: split {name!r} has 0 examples in this version "
            f"({result.version}): the build stored none in it, so there is nothing to read; "
            f"the splits with examples: {readable}"
        )
        sheet = str(tmp_path / "sheet.png")
        assert cli.main(["preview", result.dataset_root, "--split", name, "-o", sheet]) == 2
        assert capsys.readouterr().err == f"kiln preview: error: {message}\n"
        assert not os.path.exists(sheet)
    for name in filled:  # the others read as ever
        elements = list(kiln.reader.load(result.dataset_root, name).as_numpy_iterator())
        assert len(elements) == info.splits[name].num_examples


def test_a_dataset_whose_every_split_has_examples_gets_no_split_warning(
    demo_corpus, tmp_path, caplog
):
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    with caplog.at_level("WARNING", logger="kiln.pipeline.launcher"):
        result = build(config)
    assert all(split.num_examples for split in result.info.splits.values())
    assert EMPTY_SPLITS not in caplog.text and "misspelling" not in caplog.text, caplog.text


# --- split names from the source ----------------------------------------------------------


def manifest_corpus(corpus, folder, splits: dict[str, int]) -> str:
    """A CSV manifest (path, label, split) of demo images, `splits[name]` rows per split."""
    keys = iter(good_keys(corpus))
    rows = ["path,label,split"]
    for split, count in splits.items():
        for _ in range(count):
            key = next(keys)
            (folder / key).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(os.path.join(corpus.out_dir, key), folder / key)
            rows.append(f"{key},{key.split('/')[0]},{split}")
    manifest = folder / "labels.csv"
    manifest.write_text("\n".join(rows) + "\n")
    backdated(folder)
    return str(manifest)


def test_a_misspelt_split_from_the_source_is_a_warning(demo_corpus, tmp_path):
    # The CSV's split column: `tarin` once beside `train`; `tset` once where
    # the dataset has no `test`; `val` is a name of its own.
    splits = {"train": 12, "tarin": 1, "val": 2, "tset": 1}
    manifest = manifest_corpus(demo_corpus, tmp_path / "images", splits)
    config = {
        "name": "shapes",
        "source": {"type": "manifest", "path": manifest},
        "output": str(tmp_path / "out"),
        "encoding": {"format": "png"},
        "splits": {"from_source": True},
    }
    path = write_config(tmp_path / "config.yaml", config)
    report = tmp_path / "report.json"
    loud = run_kiln("build", "--config", path, "--report", str(report))
    assert loud.returncode == 0, loud.stderr  # a warning, not a refusal
    info = kiln.reader.info(str(tmp_path / "out" / "shapes"))
    assert {name: split.num_examples for name, split in info.splits.items()} == splits
    warnings = warnings_of(loud.stderr)
    assert warnings == [
        f"split 'tarin' (1 example) looks like a misspelling of 'train' (split 'train' has "
        f"12): source.path: {manifest} names it; if it is a typo, correct it there",
        f"split 'tset' (1 example) looks like a misspelling of 'test' (this dataset has no "
        f"split 'test'): source.path: {manifest} names it; if it is a typo, correct it there",
    ], loud.stderr
    assert json.loads(report.read_text())["warnings"] == warnings


def test_a_source_split_whose_every_file_was_dropped_is_a_warning(demo_corpus, tmp_path, caplog):
    root = tmp_path / "images"
    for key in good_keys(demo_corpus)[::6]:
        (root / "train" / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(demo_corpus.out_dir, key), root / "train" / key)
    (root / "test" / "circle").mkdir(parents=True)
    (root / "test" / "circle" / "only.png").write_bytes(b"not an image")
    config = make_config(
        root,
        output=str(tmp_path / "out"),
        splits={"from_source": True},
        sharding={},
        errors={"max_fraction": 0.5},
    )
    with caplog.at_level("WARNING", logger="kiln.pipeline.launcher"):
        result = build(config)
    assert result.info.splits["test"].num_examples == 0
    assert result.info.splits["train"].num_examples > 0
    assert (
        "split(s) with no example: test: every file the source lists in it was dropped "
        "(errors.jsonl names them); kiln.reader.load cannot read an empty split: fix or add "
        "its files"
    ) in caplog.text
    assert "misspelling" not in caplog.text
