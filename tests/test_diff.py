"""`kiln diff` and the build summary's diff, on real builds.

Every expectation comes from the changes the test makes to the source and
from the records read back from the shards with TensorFlow (`stored`),
independently of `kiln.schemas.version_diff`.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml

from conftest import make_config
from kiln import cli
from kiln.pipeline import build, demo_data
from kiln.schemas import INDEX_FILENAME, RECORD, version_diff
from kiln.schemas.metadata import MetadataError

SPLITS = {"fractions": {"train": 0.6, "validation": 0.2, "test": 0.2}, "split_by": "key"}
SHARDS = {"num_shards": {"train": 2, "validation": 1, "test": 1}}


def stored(result):
    """key -> (split, sha256, class name) of every record, read from the shards."""
    records = {}
    for split in result.info.splits.values():
        for shard in split.shards:
            path = os.path.join(result.dataset_dir, shard.filename)
            for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
                record = RECORD.decode(serialized)
                label = result.info.class_names[record["label"]]
                records[record["key"].decode()] = (split.name, record["sha256"].decode(), label)
    return records


def key_of(folder, stem):
    """The key of the demo image `stem` (``<class>_<index>``: its extension varies)."""
    class_name = stem.split("_")[0]
    (name,) = [n for n in os.listdir(folder / class_name) if n.startswith(stem + ".")]
    return f"{class_name}/{name}"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Three builds of one dataset: the first; then 2 added files, 1 removed
    and 1 rewritten with other bytes under its key; then the `star` class
    removed. Returns (the three builds, what changed, (the second build's
    --report, what it printed))."""
    tmp = tmp_path_factory.mktemp("diff")
    images, more = tmp / "images", tmp / "more"
    demo_data.generate(images, num_images=40, include_broken=False)
    demo_data.generate(more, num_images=44, include_broken=False)  # 40..43 are new
    config = make_config(str(images), output=str(tmp / "datasets"), splits=SPLITS, sharding=SHARDS)
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    first = build(config)

    added = [key_of(more, "circle_0040"), key_of(more, "square_0041")]
    for key in added:
        shutil.copyfile(more / key, images / key)
    removed = key_of(images, "star_0002")
    os.remove(images / removed)
    changed = key_of(images, "triangle_0003")
    shutil.copyfile(more / key_of(more, "triangle_0043"), images / changed)
    report = tmp / "report.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = cli.main(["build", "--config", str(config_path), "--report", str(report)])
    assert code == 0
    second_report = (json.loads(report.read_text()), printed.getvalue())
    second = build(config)  # up to date: the published version's result
    assert second.up_to_date

    shutil.rmtree(images / "star")
    third = build(config)
    changes = {"added": added, "removed": removed, "changed": changed}
    return (first, second, third), changes, second_report


def test_diff_counts_records_per_split_and_class(versions, capsys):
    (first, second, _), changes, _ = versions
    before, after = stored(first), stored(second)
    assert set(after) - set(before) == set(changes["added"])
    assert set(before) - set(after) == {changes["removed"]}
    assert before[changes["changed"]][1] != after[changes["changed"]][1]

    code, out, err = run_cli(capsys, "diff", first.dataset_dir, second.dataset_dir, "--json")
    assert code == 0, err
    diff = json.loads(out)
    assert diff["old"]["version"] == first.version and diff["new"]["version"] == second.version
    # The record index (index.jsonl) when the versions have one, else the shards.
    indexed = all(
        os.path.exists(os.path.join(r.dataset_dir, INDEX_FILENAME)) for r in (first, second)
    )
    assert diff["records_from"] == ("index" if indexed else "shards")
    totals = diff["totals"]
    assert (totals["added"], totals["removed"], totals["changed"], totals["moved_in"]) == (
        2,
        1,
        1,
        0,
    )
    assert totals["old"] == 40 and totals["new"] == 41 and totals["unchanged"] == 41 - 3
    assert diff["changed_percent"] == pytest.approx(100 * 4 / 40)
    for key in changes["added"]:
        split, _, label = after[key]
        assert diff["splits"][split]["classes"][label]["added"] >= 1
    split, _, label = before[changes["removed"]]
    assert diff["splits"][split]["classes"][label]["removed"] == 1
    split, _, label = after[changes["changed"]]
    assert diff["splits"][split]["classes"][label]["changed"] == 1
    for name, change in diff["splits"].items():
        assert change["old"] == sum(1 for s, _, _ in before.values() if s == name)
        assert change["new"] == sum(1 for s, _, _ in after.values() if s == name)
        assert change["added"] == sum(1 for k in changes["added"] if after[k][0] == name)

    # Class shares over the whole dataset, from the two kiln.json files.
    star = diff["classes"]["star"]
    assert (star["old"], star["new"]) == (10, 9)
    assert star["shift_points"] == pytest.approx(100 * 9 / 41 - 100 * 10 / 40, abs=1e-4)
    assert diff["duplicates"] == {"old": 0, "new": 0}
    assert diff["dropped"]["old_total"] == 0 and diff["dropped"]["new_total"] == 0
    assert diff["objects_dropped"] is None is diff["objects"]  # no boxes
    train = diff["statistics"]["train"]
    old_mean = first.info.splits["train"].statistics.mean
    new_mean = second.info.splits["train"].statistics.mean
    assert train["mean_drift"] == pytest.approx(
        [a - b for a, b in zip(new_mean, old_mean, strict=True)], abs=1e-6
    )

    # The text form says the same; a bare version id resolves beside the other path.
    code, out, _ = run_cli(capsys, "diff", first.version, second.dataset_dir)
    assert code == 0
    assert "records: +2 added, -1 removed, 1 changed, 0 moved" in out
    assert f"{first.version} -> shapes {second.version}" in out
    # Two bare ids: nothing to look them up beside, and the message says so.
    code, _, err = run_cli(capsys, "diff", first.version, second.version)
    assert code == 2
    assert err == (
        f"kiln diff: error: {first.version} and {second.version} are both bare version ids: "
        f"give one of them as a folder (the dataset folder <output>/<name>, or a version "
        f"folder), and the other's id is looked up beside it\n"
    )


def test_diff_thresholds_set_the_exit_code(versions, capsys):
    (first, second, third), _, _ = versions
    old, new = first.dataset_dir, second.dataset_dir
    code, _, err = run_cli(capsys, "diff", old, new, "--max-changed-percent", "5")
    assert code == 1
    assert "kiln diff: threshold crossed: 10.00% of the records changed" in err
    assert run_cli(capsys, "diff", old, new, "--max-changed-percent", "10")[0] == 0
    # Just under: as many decimals as it takes not to read "10.00% ..., more than 10.00".
    code, _, err = run_cli(capsys, "diff", old, new, "--max-changed-percent", "9.999")
    assert code == 1
    assert "threshold crossed: 10.000% of the records changed" in err
    assert err.endswith("more than --max-changed-percent 9.999\n")

    code, out, err = run_cli(capsys, "diff", old, new, "--max-share-shift", "1", "--json")
    assert code == 1
    diff = json.loads(out)
    shifted = [n for n, s in diff["classes"].items() if abs(s["shift_points"]) > 1]
    assert shifted and len(diff["violations"]) == len(shifted) == len(err.splitlines())
    assert run_cli(capsys, "diff", old, new, "--max-share-shift", "5")[0] == 0

    # The star class vanished from the third version.
    assert "star" not in third.info.class_names
    # (the dataset folder: LATEST names the third version)
    code, out, err = run_cli(capsys, "diff", new, third.dataset_root, "--fail-on-vanished-class")
    assert code == 1
    assert "threshold crossed: class 'star' vanished" in err
    assert "vanished classes (examples before, none now): star" in out
    assert "classes whose label id changed: triangle" in out
    assert run_cli(capsys, "diff", new, third.dataset_dir)[0] == 0

    same = run_cli(
        capsys, "diff", third.dataset_dir, third.dataset_root, "--fail-on-vanished-class"
    )
    assert same[0] == 0 and "the same version: nothing changed" in same[1]


def test_a_split_that_shrank_crosses_max_split_shrink(versions, capsys):
    """The star class removed: every split lost its star records. The limit
    is a split's loss in percent of its old count, checked against the counts
    `--json` reports."""
    (_, second, third), _, _ = versions
    code, out, _ = run_cli(capsys, "diff", second.dataset_dir, third.dataset_dir, "--json")
    assert code == 0
    splits = json.loads(out)["splits"]
    shrink = {name: 100 * (s["old"] - s["new"]) / s["old"] for name, s in splits.items()}
    worst = max(shrink, key=shrink.get)
    assert 0 < shrink[worst] < 100
    under = f"{shrink[worst] - 0.5:.6f}"
    argv = ["diff", second.dataset_dir, third.dataset_dir, "--max-split-shrink"]
    assert run_cli(capsys, *argv, f"{shrink[worst] + 1e-6:.6f}")[0] == 0  # just above: passes
    code, _, err = run_cli(capsys, *argv, under)
    assert code == 1
    crossed = [name for name, value in shrink.items() if value > float(under)]
    lines = err.splitlines()
    assert len(lines) == len(crossed)
    old, new = splits[worst]["old"], splits[worst]["new"]
    assert (
        f"kiln diff: threshold crossed: split {worst!r} has {new} records, {old} before: "
        f"it shrank by {shrink[worst]:.2f}%, more than --max-split-shrink {float(under):.15g}%"
    ) in lines
    assert run_cli(capsys, *argv, "-1")[0] == 2


def test_diff_notes_two_different_datasets(versions, capsys, tmp_path):
    (first, *_), _, _ = versions
    other = build(
        make_config(
            first.info.provenance["source"]["root"],
            name="other",
            output=str(tmp_path),
            splits=SPLITS,
            sharding=SHARDS,
        )
    )
    assert first.info.name == "shapes" and other.info.name == "other"
    code, _, err = run_cli(capsys, "diff", first.dataset_dir, other.dataset_dir)
    assert code == 0
    assert err == (
        "kiln diff: note: OLD is dataset 'shapes' and NEW is 'other': records match by key "
        "across two datasets\n"
    )
    assert run_cli(capsys, "diff", first.dataset_dir, first.dataset_dir)[2] == ""


def test_diff_refuses_what_is_not_a_dataset(versions, capsys, tmp_path):
    (first, *_), _, _ = versions
    code, _, err = run_cli(capsys, "diff", first.dataset_dir, str(tmp_path))
    assert code == 2
    assert err.startswith("kiln diff: error: ") and str(tmp_path) in err
    code, _, err = run_cli(
        capsys, "diff", first.dataset_dir, first.dataset_dir, "--max-share-shift", "-1"
    )
    assert code == 2 and "--max-share-shift" in err


def test_build_report_carries_the_diff(versions):
    (first, second, _), _, (report, _) = versions
    assert report["previous_version"] == first.version
    changes = report["changes"]
    assert changes["old"]["version"] == first.version
    assert changes["new"]["version"] == second.version
    assert (changes["totals"]["added"], changes["totals"]["removed"]) == (2, 1)
    assert changes["totals"]["changed"] == 1


def test_build_summary_prints_the_diff_in_two_lines(versions):
    (first, _, _), _, (_, printed) = versions
    lines = printed.splitlines()
    changes = [i for i, line in enumerate(lines) if "changes since" in line]
    assert len(changes) == 1
    line = lines[changes[0]]
    assert line.startswith(
        f"  changes since {first.version}: +2 added, -1 removed, 1 changed, 0 moved (10.0% of 40)"
    )
    assert line.endswith("largest class-share shift: star 25.0% -> 22.0% (-3.0 points)")
    assert lines[changes[0] + 1].startswith("  train mean drift ")


def heavy_modules_of_diff(old, new):
    """The heavy modules a `kiln diff OLD NEW` process imported, and its exit code."""
    code = (
        "import sys\n"
        "from kiln import cli\n"
        f"code = cli.main(['diff', {old!r}, {new!r}])\n"
        "heavy = sorted(m for m in ('tensorflow', 'apache_beam', 'cv2') if m in sys.modules)\n"
        "print(code, ','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    exit_code, _, heavy = done.stdout.strip().splitlines()[-1].partition(" ")
    return int(exit_code), heavy


def test_diff_reads_no_shard_without_need(versions):
    """`kiln diff` starts without TensorFlow or Beam: it reads kiln.json, and
    the record index when versions differ; only versions without an index
    make it parse their differing shards with TensorFlow."""
    (first, second, third), _, _ = versions
    assert heavy_modules_of_diff(third.dataset_dir, third.dataset_root) == (0, "")
    indexed = all(
        os.path.exists(os.path.join(r.dataset_dir, INDEX_FILENAME)) for r in (first, second)
    )
    code, heavy = heavy_modules_of_diff(first.dataset_dir, second.dataset_dir)
    assert code == 0 and "apache_beam" not in heavy
    assert ("tensorflow" in heavy) == (not indexed)


def test_a_reader_that_goes_away_changes_neither_the_verdict_nor_the_violations(versions):
    """`kiln diff OLD NEW | head -1`: the closed pipe made every diff exit 1
    and lost the violation lines on stderr."""
    (_, second, third), _, _ = versions

    def diff_into_a_closed_pipe(*flags):
        process = subprocess.Popen(
            [sys.executable, "-m", "kiln.cli", "diff", second.dataset_dir, third.dataset_dir]
            + list(flags),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        process.stdout.close()  # as `head` exits before the first line
        err = process.stderr.read()
        return process.wait(timeout=300), err

    assert diff_into_a_closed_pipe() == (0, "")
    code, err = diff_into_a_closed_pipe("--fail-on-vanished-class", "--json")
    assert code == 1
    assert err == "kiln diff: threshold crossed: class 'star' vanished: it has no example left\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_diff_that_cannot_be_written_is_exit_73_for_json_and_keeps_the_verdict(versions):
    """`kiln diff OLD NEW --json > diff.json` on a full disk: a script must
    not read half a document as the answer (exit 73, one line). A crossed
    threshold stays exit 1 with its line, the lost document logged; the
    text, for a person, is dropped. All were exit 70 (internal error)."""
    (_, second, third), _, _ = versions

    def diff_into_a_full_disk(*flags):
        with open("/dev/full", "w") as full:
            completed = subprocess.run(
                [sys.executable, "-m", "kiln.cli", "diff", second.dataset_dir, third.dataset_dir]
                + list(flags),
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=300,
            )
        return completed.returncode, completed.stderr

    assert diff_into_a_full_disk() == (0, "")
    code, err = diff_into_a_full_disk("--json")
    assert code == 73
    assert err == (
        "kiln diff: output not written: stdout: cannot write the JSON document: No space left "
        "on device; what was written is incomplete\n"
    )
    code, err = diff_into_a_full_disk("--json", "--fail-on-vanished-class")
    assert code == 1
    assert err.splitlines() == [
        "kiln diff: threshold crossed: class 'star' vanished: it has no example left",
        "ERROR kiln.console: stdout: cannot write the JSON document: No space left on device; "
        "what was written is incomplete",
    ]


@pytest.mark.parametrize(
    "damage",
    [
        lambda line: line[: len(line) // 2] + "\n",  # cut short
        lambda line: line.rstrip("\n") + "," + line,  # two values on one line
        lambda line: "\n",  # empty
    ],
    ids=["cut", "two-values", "empty"],
)
def test_a_damaged_record_index_line_is_named(versions, tmp_path, damage):
    """The record index is parsed a block of lines at a time: a damaged
    line still fails the diff with its own line number, not a block's."""
    (first, second, _), _, _ = versions
    copy = tmp_path / "version"
    shutil.copytree(second.dataset_dir, copy)
    index = copy / INDEX_FILENAME
    lines = index.read_text().splitlines(keepends=True)
    assert len(lines) > 7
    lines[6] = damage(lines[6])
    index.write_text("".join(lines))
    old, new = version_diff.open_version(first.dataset_dir), version_diff.open_version(str(copy))
    with pytest.raises(MetadataError, match=rf"{INDEX_FILENAME}:7: not a record index line"):
        version_diff.compare(old, new)
    # Undamaged, the copy compares as the version it was copied from.
    shutil.copyfile(os.path.join(second.dataset_dir, INDEX_FILENAME), index)
    assert version_diff.compare(old, version_diff.open_version(str(copy))).totals().added == 2
