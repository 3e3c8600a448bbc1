"""`kiln build`'s publish gate, and the diff thresholds it shares with `kiln diff`, on real builds.

The gate compares the new version with the one LATEST names before LATEST may
name it: a nightly rebuild whose source lost a class must leave readers of
LATEST on the last good version.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from conftest import make_config
from kiln import cli
from kiln.pipeline import demo_data
from kiln.schemas import LATEST_FILENAME
from kiln.schemas.location import is_version_name


@pytest.fixture
def nightly(tmp_path):
    """A demo source, its config file, and the first build's version."""
    images = tmp_path / "images"
    demo_data.generate(images, num_images=40, include_broken=False)
    config = make_config(str(images), output=str(tmp_path / "datasets"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset = tmp_path / "datasets" / "shapes"
    return images, path, dataset


def latest(dataset) -> str:
    return (dataset / LATEST_FILENAME).read_text().strip()


def test_a_version_that_crosses_the_gate_is_kept_but_not_published(nightly, capsys):
    images, config, dataset = nightly
    first = latest(dataset)
    shutil.rmtree(images / "star")  # an export that lost a class
    gated = ["build", "--config", str(config), "--quiet", "--fail-on-vanished-class"]

    assert cli.main(gated) == 1
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("kiln build: ")
    assert f"crossed the publish gate against LATEST ({first})" in line
    assert "class 'star' vanished" in line
    assert latest(dataset) == first  # readers of LATEST still get the good version
    versions = {p for p in os.listdir(dataset) if is_version_name(p) and p != first}
    (kept,) = versions
    assert (dataset / kept / "kiln.json").exists() and f"kiln diff {first} " in line

    # The next night: the same verdict, from the version already built (no job).
    report = config.parent / "report.json"
    assert cli.main([*gated, "--report", str(report)]) == 1
    assert "crossed the publish gate" in capsys.readouterr().err
    assert latest(dataset) == first
    failed = json.loads(report.read_text())
    assert failed["status"] == "failed"
    # What a scheduler needs without parsing the line: the version kept, why, against what.
    gate = failed["gate"]
    assert gate["version"] == kept and gate["previous_version"] == first
    assert gate["violations"] == ["class 'star' vanished: it has no example left"]
    assert gate["changes"]["vanished_classes"] == ["star"]
    assert gate["changes"]["old"]["version"] == first and gate["changes"]["new"]["version"] == kept

    # Without the flag the operator publishes it: the same version, found
    # by its stamp, without reading an image again.
    ungated = ["build", "--config", str(config), "--quiet", "--report", str(report)]
    assert cli.main(ungated) == 0
    assert latest(dataset) == kept
    published = json.loads(report.read_text())
    assert published["status"] == "up_to_date" and published["version"] == kept


def test_a_version_within_the_gate_is_published(nightly, capsys):
    images, config, dataset = nightly
    first = latest(dataset)
    (one,) = sorted(os.listdir(images / "circle"))[:1]
    os.remove(images / "circle" / one)
    argv = ["build", "--config", str(config), "--quiet", "--max-changed-percent", "10"]
    assert cli.main([*argv, "--fail-on-vanished-class", "--fail-on-label-change"]) == 0
    assert capsys.readouterr() == ("", "")
    assert latest(dataset) != first


def test_the_gate_sees_label_ids_and_config_changes(nightly, capsys, tmp_path):
    images, config, dataset = nightly
    first = latest(dataset)
    # A class sorted before the others: every label id moves by one.
    shutil.copytree(images / "circle", images / "arc")
    argv = ["build", "--config", str(config), "--quiet", "--fail-on-label-change"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "class 'circle' changed label id, 0 -> 1" in err
    assert latest(dataset) == first
    shutil.rmtree(images / "arc")

    # Another crop: no source file changed, every stored image did.
    changed = yaml.safe_load(config.read_text())
    changed["transforms"][1] = {"center_crop": {"size": 24}}
    config.write_text(yaml.safe_dump(changed))
    argv = ["build", "--config", str(config), "--quiet", "--max-changed-percent", "0"]
    assert cli.main(argv) == 0  # no record changed: the size change passes this one
    second = latest(dataset)
    assert second != first
    code = cli.main(["diff", first, str(dataset), "--fail-on-config-change"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "build config changed: transforms, image_size" in out
    assert "stored image size: 32x32 -> 24x24" in out
    assert (
        "threshold crossed: the build config changed: transforms, image_size "
        "(stored size 32x32 -> 24x24)"
    ) in err
    # Moving the source is not a config change.
    moved = tmp_path / "moved"
    shutil.copytree(images, moved)
    changed["source"]["root"] = str(moved)
    config.write_text(yaml.safe_dump(changed))
    assert cli.main([*argv[:4], "--fail-on-config-change"]) == 0
    assert capsys.readouterr() == ("", "")


def test_gate_flags_are_checked_before_any_work(nightly, capsys):
    _, config, _ = nightly
    assert cli.main(["build", "--config", str(config), "--max-share-shift", "-1"]) == 2
    assert "--max-share-shift must be 0 or more, got -1.0" in capsys.readouterr().err


def write_latest(dataset, text: str | None) -> None:
    """LATEST with `text`, or no LATEST (None)."""
    if text is None:
        os.remove(dataset / LATEST_FILENAME)
    else:
        (dataset / LATEST_FILENAME).write_text(text)


@pytest.mark.parametrize("text", ["", "\n", None], ids=["empty", "blank-line", "missing"])
def test_the_gate_fails_closed_when_latest_names_no_version(nightly, capsys, text):
    """LATEST empty or missing while published versions are there: the gate
    has nothing to compare with, so it publishes nothing (as for a LATEST
    naming a version that is not there); without gate flags, a warning."""
    images, config, dataset = nightly
    first = latest(dataset)
    write_latest(dataset, text)
    shutil.rmtree(images / "star")  # an export that lost a class
    gated = ["build", "--config", str(config), "--quiet", "--fail-on-vanished-class"]

    for _ in range(2):  # the job's build, then the version found by its stamp
        assert cli.main(gated) == 1
        out, err = capsys.readouterr()
        (line,) = err.strip().splitlines()
        assert out == "" and line.startswith("kiln build: ")
        assert "the publish gate cannot compare with LATEST's version" in line
        assert str(dataset / LATEST_FILENAME) in line and first in line
        assert "repair LATEST" in line
        assert not (dataset / LATEST_FILENAME).exists() if text is None else latest(dataset) == ""

    report = config.parent / "report.json"
    assert cli.main(["build", "--config", str(config), "--quiet", "--report", str(report)]) == 0
    published = json.loads(report.read_text())
    assert latest(dataset) == published["version"] != first
    (warning,) = [w for w in published["warnings"] if str(dataset / LATEST_FILENAME) in w]
    assert first in warning and "nothing to reuse records from or compare with" in warning


def test_a_missing_latest_with_only_the_same_version_passes_the_gate(nightly, capsys):
    """LATEST gone, the inputs unchanged: the build finds the one published
    version, which is all there is to compare with, and names it again."""
    _, config, dataset = nightly
    first = latest(dataset)
    write_latest(dataset, None)
    gated = ["build", "--config", str(config), "--quiet", "--fail-on-vanished-class"]
    assert cli.main(gated) == 0
    assert latest(dataset) == first


def test_a_vanished_split_crosses_the_gate_and_kiln_diff(tmp_path, capsys):
    """``splits.from_source`` with train/ and test/ folders; test/ removed:
    --fail-on-vanished-split stops the build and `kiln diff`, and without it
    the build warns."""
    demo = tmp_path / "demo"
    demo_data.generate(demo, num_images=40, include_broken=False)
    images = tmp_path / "images"
    held_out = 0
    for folder in sorted(demo.iterdir()):
        if not folder.is_dir():
            continue
        for i, image in enumerate(sorted(folder.iterdir())):
            split = "test" if i % 4 == 0 else "train"
            held_out += split == "test"
            (images / split / folder.name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image, images / split / folder.name / image.name)
    config = make_config(
        str(images), output=str(tmp_path / "datasets"), splits={"from_source": True}
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset = tmp_path / "datasets" / "shapes"
    first = latest(dataset)
    shutil.rmtree(images / "test")
    everything = ["--fail-on-vanished-class", "--fail-on-label-change", "--max-share-shift", "5"]
    capsys.readouterr()

    # Every class keeps its share: only the split limit sees it.
    gated = ["build", "--config", str(path), "--quiet", *everything]
    assert cli.main([*gated, "--fail-on-vanished-split"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"split 'test' vanished: it has no example left ({held_out} before)" in line
    assert latest(dataset) == first
    (kept,) = {p for p in os.listdir(dataset) if is_version_name(p) and p != first}

    diff = ["diff", str(dataset / first), str(dataset / kept), "--json", *everything]
    assert cli.main(diff) == 0
    assert json.loads(capsys.readouterr().out)["vanished_splits"] == ["test"]
    assert cli.main([*diff, "--fail-on-vanished-split"]) == 1
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["thresholds"]["fail_on_vanished_split"] is True
    assert data["violations"] == [
        f"split 'test' vanished: it has no example left ({held_out} before)"
    ]
    assert "threshold crossed: split 'test' vanished" in err
    # A vanished split lost all of its records: any --max-split-shrink under 100 stops it.
    assert cli.main([*gated, "--max-split-shrink", "99.5"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        f"split 'test' has 0 records, {held_out} before: it shrank by 100.00%, more than "
        f"--max-split-shrink 99.5%"
    ) in line
    assert latest(dataset) == first

    report = tmp_path / "report.json"
    assert cli.main([*gated, "--report", str(report)]) == 0  # published, with a warning
    published = json.loads(report.read_text())
    assert latest(dataset) == kept == published["version"]
    (warning,) = [w for w in published["warnings"] if "split(s) with no example left" in w]
    assert f"version {first} had: test ({held_out} before)" in warning


def test_a_rollback_while_the_job_runs_is_what_the_gate_compares_with(nightly, capsys, monkeypatch):
    """LATEST rolled back by hand while a build's job runs: the new version
    is compared with the version rolled back to, which readers are on, not
    with the one LATEST named when the build began. It was compared with
    that one: a version that crossed the gate against the rollback's was
    published over it."""
    images, config, dataset = nightly
    good = latest(dataset)
    shutil.rmtree(images / "star")  # a bad export, published by an ungated build
    assert cli.main(["build", "--config", str(config), "--quiet"]) == 0
    bad = latest(dataset)
    assert bad != good

    from kiln.pipeline import publish

    enter = publish.PublishTransaction.__enter__

    def rolled_back_as_the_job_starts(transaction):
        entered = enter(transaction)
        # README's rollback, while the build runs (it read LATEST already).
        (dataset / ".LATEST.new").write_text(good + "\n")
        os.replace(dataset / ".LATEST.new", dataset / LATEST_FILENAME)
        return entered

    monkeypatch.setattr(publish.PublishTransaction, "__enter__", rolled_back_as_the_job_starts)
    os.remove(images / "circle" / sorted(os.listdir(images / "circle"))[0])  # a new version
    report = config.parent / "report.json"
    gated = ["build", "--config", str(config), "--quiet", "--report", str(report)]
    assert cli.main([*gated, "--fail-on-vanished-class"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"crossed the publish gate against LATEST ({good})" in line, line
    assert "class 'star' vanished" in line
    assert latest(dataset) == good  # the rollback stands
    failed = json.loads(report.read_text())
    assert failed["gate"]["previous_version"] == good
    assert any(f"it named {bad}, now {good}" in w for w in failed["warnings"]), failed["warnings"]

    # Without gate flags the new inputs are published, as after any rollback;
    # what changed is told against the version readers were on.
    assert cli.main(gated) == 0
    built = json.loads(report.read_text())
    assert latest(dataset) == built["version"] not in (good, bad)
    assert built["previous_version"] == good
    assert built["changes"]["vanished_classes"] == ["star"]


def test_a_held_back_version_damaged_since_is_repaired_before_latest_names_it(nightly, capsys):
    """The version the gate held back waits in its folder; the next build of
    the same inputs without the gate publishes it as up to date, without a
    job. A shard of it deleted meanwhile was published so: LATEST named a
    version missing a shard. Now that build checks the version's files
    first, builds it again and repairs it."""
    from kiln.tools import verify

    images, config, dataset = nightly
    shutil.rmtree(images / "star")
    assert cli.main(["build", "--config", str(config), "--quiet", "--fail-on-vanished-class"]) == 1
    capsys.readouterr()
    (held,) = {p for p in os.listdir(dataset) if is_version_name(p) and p != latest(dataset)}
    shard = sorted(n for n in os.listdir(dataset / held) if ".tfrecord-" in n)[0]
    os.remove(dataset / held / shard)

    report = config.parent / "report.json"
    assert cli.main(["build", "--config", str(config), "--quiet", "--report", str(report)]) == 0
    assert capsys.readouterr() == ("", "")
    assert latest(dataset) == held
    checked = verify.verify(str(dataset))
    assert checked.ok, checked.problems
    built = json.loads(report.read_text())
    assert built["version"] == held and built["status"] == "built"
    assert any(
        f"version {held}, which these inputs were built into, is damaged" in w and shard in w
        for w in built["warnings"]
    ), built["warnings"]
