"""Incremental builds of datasets with targets (real pipelines on the DirectRunner).

A record is reused only when its image bytes, its annotations as listed,
the bytes of every mask file they name and the class ids they use are all
unchanged; the result (shards, index, kiln.json with its per-class object
statistics) is byte-identical to a from-scratch build of the same inputs.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import cv2
import numpy as np
import pytest

import targets_data as data
from kiln.pipeline import build, record_index
from kiln.pipeline.command import summary
from kiln.pipeline.statistics import ObjectSums
from kiln.schemas import INDEX_FILENAME, version_diff
from test_targets_build import config, digests

COUNT = 12


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The corpus, written once: each test works on its own copy."""
    folder = tmp_path_factory.mktemp("targets-incremental")
    data.corpus(folder, COUNT)
    return folder


@pytest.fixture
def corpus(pristine, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(pristine, folder)
    return folder


def read_rows(folder: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


def write_rows(folder: pathlib.Path, rows: list[dict]) -> str:
    return data.write_manifest(folder, rows)


def png(pixels: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".png", pixels)
    assert ok
    return encoded.tobytes()


def index_rows(result) -> list[record_index.IndexRow]:
    with open(os.path.join(result.dataset_dir, INDEX_FILENAME)) as f:
        return [record_index.parse_line(line) for line in f]


def assert_same_dataset(incremental, full):
    assert incremental.version == full.version
    assert digests(incremental) == digests(full)  # shards, index, kiln.json, reports
    assert incremental.info == full.info


def test_changes_to_images_boxes_masks_additions_and_deletions_give_a_full_builds_bytes(
    corpus, tmp_path
):
    manifest = str(corpus / "manifest.jsonl")
    spec = config(manifest, tmp_path / "out")
    base = build(spec)
    assert base.incremental is not None and not base.incremental.used

    rows = read_rows(corpus)
    # 1: another image under the same name (its annotations unchanged).
    pixels = cv2.imread(str(corpus / rows[1]["path"]))
    pixels[0, 0] = (7, 7, 7)
    (corpus / rows[1]["path"]).write_bytes(png(pixels))
    # 2: only an annotation: a box moved one pixel to the right.
    box = rows[2]["objects"][1]["bbox"]
    rows[2]["objects"][1]["bbox"] = [box[0] + 1, box[1], box[2] + 1, box[3]]
    # 3: only a mask file, edited in place (same path, same size).
    mask_path = corpus / rows[3]["mask"]
    mask = cv2.imread(str(mask_path), cv2.IMREAD_UNCHANGED)
    mask[0, :] = 1
    mask_path.write_bytes(png(mask))
    # 5: deleted (it has objects, so the object statistics change).
    deleted = rows.pop(5)
    os.remove(corpus / deleted["path"])
    # 12: added.
    rows.append(data.manifest_row(COUNT, corpus))
    write_rows(corpus, rows)

    incremental = build(spec)

    report = incremental.incremental
    assert report.used and report.base == base.version and report.reason == ""
    assert (report.added, report.changed, report.deleted) == (1, 3, 1)
    assert report.reused == COUNT - 4  # all but the three changed and the deleted
    assert report.processed == 4
    assert incremental.counters["images_decoded"] == 4
    assert f"reused {COUNT - 4}, processed 4 (1 new, 3 changed, 0 dropped), 1 gone" in (
        summary(incremental)
    )
    full = build(dict(spec, output=str(tmp_path / "full")))
    assert_same_dataset(incremental, full)
    # The merged object statistics moved with the changes (not the base's).
    assert incremental.info.objects != base.info.objects
    assert incremental.info.objects == full.info.objects


def test_two_worker_processes_give_the_same_bytes(corpus, tmp_path):
    manifest = str(corpus / "manifest.jsonl")
    spec = config(manifest, tmp_path / "out")
    build(spec)
    rows = read_rows(corpus)
    box = rows[6]["objects"][0]["bbox"]
    rows[6]["objects"][0]["bbox"] = [box[0], box[1] + 1, box[2], box[3] + 1]
    write_rows(corpus, rows)

    incremental = build(spec, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])

    assert incremental.incremental.reused == COUNT - 1
    assert incremental.incremental.changed == 1
    assert_same_dataset(incremental, build(dict(spec, output=str(tmp_path / "full"))))


def test_the_index_holds_what_the_object_statistics_are_merged_from(corpus, tmp_path):
    result = build(config(str(corpus / "manifest.jsonl"), tmp_path / "out"))
    rows = index_rows(result)
    assert len(rows) == COUNT
    sums: dict[str, ObjectSums] = {}
    counts: dict[str, dict[int, int]] = {}
    for row in rows:
        assert row.targets is not None and row.targets.has_objects
        sums.setdefault(row.split, ObjectSums()).add(row.targets.objects, row.targets.dropped)
        for class_id in row.targets.image_classes:
            split_counts = counts.setdefault(row.split, {})
            split_counts[class_id] = split_counts.get(class_id, 0) + 1
    for split, found in sums.items():
        statistics = found.statistics()
        named = result.info.objects[split]
        for class_id, name in enumerate(result.info.class_names):
            entry = statistics.classes.get(str(class_id))
            if entry is not None:
                assert named.classes[name] == entry
        assert named.images_without_objects == statistics.images_without_objects
        class_counts = result.info.splits[split].class_counts
        assert {result.info.class_names[c]: n for c, n in counts[split].items()} == {
            name: n for name, n in class_counts.items() if n
        }


def test_a_changed_targets_config_reuses_nothing(corpus, tmp_path):
    manifest = str(corpus / "manifest.jsonl")
    base = build(config(manifest, tmp_path / "out"))
    targets = {**data.TARGETS, "boxes": {**data.TARGETS["boxes"], "min_visibility": 0.5}}

    result = build(config(manifest, tmp_path / "out", targets=targets))

    assert not result.incremental.used and result.incremental.base == base.version
    assert "processing differs" in result.incremental.reason
    assert result.counters.get("records_reused", 0) == 0
    assert result.counters["images_decoded"] == COUNT


@pytest.mark.parametrize("label", [False, True], ids=["objects-and-labels", "with-image-label"])
def test_a_new_class_that_shifts_the_class_ids_relabels_the_records_it_shifts(
    corpus, tmp_path, label
):
    manifest = str(corpus / "manifest.jsonl")
    # Without the mask, whose records a longer class list reprocesses (its
    # pixel values are class ids: see
    # test_a_shorter_class_list_reprocesses_the_masks_it_leaves_values_outside).
    dropped = ("mask",) if label else ("label", "mask")
    targets = {kind: value for kind, value in data.TARGETS.items() if kind not in dropped}
    spec = config(manifest, tmp_path / "out", targets=targets)
    build(spec)
    rows = read_rows(corpus)
    # "amber" sorts first: every class id of the corpus moves up by one.
    data.write_png(corpus / "images" / "amber.png", np.full((48, 64, 3), 90, np.uint8))
    data.write_png(corpus / "masks" / "amber.png", np.full((48, 64), data.IGNORE, np.uint8))
    rows.append(
        {
            "path": "images/amber.png",
            "label": "amber",
            "labels": ["amber"],
            "objects": [],
            "mask": "masks/amber.png",
            "weather": "fog",
            "altitude": 1.0,
            "year": 1999,
        }
    )
    write_rows(corpus, rows)

    incremental = build(spec)

    assert incremental.info.class_names[0] == "amber"
    report = incremental.incremental
    # Without an image label, the images that name no class (0, 4 and 8)
    # keep their records as they are; every other record's class ids moved
    # up by one: rewritten from the base's, not decoded. Only amber is.
    kept = 0 if label else 3
    assert report.used and (report.reused, report.relabelled) == (kept, COUNT - kept)
    assert (report.processed, report.added, report.changed) == (1, 1, 0)
    assert incremental.counters["images_decoded"] == 1
    assert f"reused {kept}, relabelled {COUNT - kept}, processed 1 (1 new" in summary(incremental)
    full = build(dict(spec, output=str(tmp_path / "full")))
    assert full.counters["images_decoded"] == COUNT + 1
    assert_same_dataset(incremental, full)  # per-class object counts and sizes included


def test_moving_the_data_reuses_every_record_and_keeps_the_version(corpus, tmp_path):
    base = build(config(str(corpus / "manifest.jsonl"), tmp_path / "out"))
    moved = tmp_path / "elsewhere" / "data"
    shutil.copytree(corpus, moved)  # new paths, new modification times
    shutil.rmtree(corpus)

    result = build(config(str(moved / "manifest.jsonl"), tmp_path / "out"))

    # Masks are named by content in the reuse key and the version, not by path.
    assert not result.up_to_date
    assert result.incremental.reused == COUNT
    assert result.counters.get("images_decoded", 0) == 0
    assert result.version == base.version


def test_kiln_diff_counts_an_annotation_only_edit_as_changed(corpus, tmp_path):
    manifest = str(corpus / "manifest.jsonl")
    spec = config(manifest, tmp_path / "out")
    base = build(spec)
    rows = read_rows(corpus)
    box = rows[2]["objects"][1]["bbox"]  # the image's bytes stay the same
    rows[2]["objects"][1]["bbox"] = [box[0] + 1, box[1], box[2] + 1, box[3]]
    write_rows(corpus, rows)
    new = build(spec)

    diff = version_diff.compare(
        version_diff.open_version(base.dataset_dir), version_diff.open_version(new.dataset_dir)
    )
    assert diff.records_from == "index"
    totals = diff.totals()
    assert (totals.changed, totals.added, totals.removed) == (1, 0, 0)


def assert_cells_add_up(diff: version_diff.VersionDiff) -> None:
    """Every row's counts are records: none negative, old and new as kiln.json says."""
    for name, change in [*diff.splits.items(), *diff.cells.items()]:
        assert change.unchanged >= 0, (name, change)
        assert change.old == change.unchanged + change.changed + change.removed + (
            change.moved_out
        ), (name, change)
    for version, field in ((diff.old, "old"), (diff.new, "new")):
        for split in version.info.splits.values():
            assert getattr(diff.splits[split.name], field) == split.num_examples
            for label, count in split.class_counts.items():
                assert getattr(diff.cells[(split.name, label)], field) == count


def test_kiln_diff_of_records_without_an_image_label_counts_the_classes_they_show(corpus, tmp_path):
    targets = {name: value for name, value in data.TARGETS.items() if name != "label"}
    rows = read_rows(corpus)
    for row in rows:
        row.pop("label", None)
    write_rows(corpus, rows[:-1])
    spec = config(str(corpus / "manifest.jsonl"), tmp_path / "out", targets=targets)
    base = build(spec)
    write_rows(corpus, rows)  # one image more
    new = build(spec)

    diff = version_diff.compare(
        version_diff.open_version(base.dataset_dir), version_diff.open_version(new.dataset_dir)
    )
    totals = diff.totals()
    assert (totals.added, totals.old, totals.new) == (1, COUNT - 1, COUNT)
    # The added record has label id -1: it counts in the rows of the classes
    # its image shows (its labels, objects and mask), as kiln.json counts it.
    (added,) = [row for row in index_rows(new) if row.key == rows[-1]["path"]]
    shown = {new.info.class_names[c] for c in added.targets.image_classes}
    assert len(shown) > 1
    for (split, name), change in diff.cells.items():
        expected = 1 if (split, name) in {(added.split, c) for c in shown} else 0
        assert change.added == expected, (split, name)
    assert_cells_add_up(diff)


def test_kiln_diff_counts_records_not_class_incidences(corpus, tmp_path, capsys):
    """An image shows several classes: an edit of one image is one record of
    the dataset's changed, and --max-changed-percent gates on records."""
    from kiln import cli

    spec = config(str(corpus / "manifest.jsonl"), tmp_path / "out")
    base = build(spec)
    rows = read_rows(corpus)
    box = rows[2]["objects"][1]["bbox"]
    rows[2]["objects"][1]["bbox"] = [box[0] + 1, box[1], box[2] + 1, box[3]]
    write_rows(corpus, rows)
    new = build(spec)
    class_incidences = sum(sum(split.class_counts.values()) for split in base.info.splits.values())
    assert class_incidences > COUNT  # the fixture's images show several classes

    diff = version_diff.compare(
        version_diff.open_version(base.dataset_dir), version_diff.open_version(new.dataset_dir)
    )
    totals = diff.totals()
    assert (totals.old, totals.new, totals.changed, totals.unchanged) == (
        COUNT,
        COUNT,
        1,
        COUNT - 1,
    )
    assert diff.changed_percent() == pytest.approx(100.0 / COUNT)
    assert_cells_add_up(diff)
    # Shares are of the examples (they add up to more than 100% here).
    shares = diff.class_shares()
    for name in new.info.class_names:
        count = sum(split.class_counts.get(name, 0) for split in new.info.splits.values())
        assert shares[name]["new_share"] == pytest.approx(100.0 * count / COUNT, abs=1e-4)
    assert sum(share["new_share"] for share in shares.values()) > 100.0

    threshold = 100.0 / COUNT - 1  # one record in COUNT crosses it
    code = cli.main(
        ["diff", base.dataset_dir, new.dataset_dir, "--max-changed-percent", f"{threshold:g}"]
    )
    assert code == 1
    assert f"{100.0 / COUNT:.2f}% of the records changed" in capsys.readouterr().err


def test_reused_records_keep_naming_the_objects_they_dropped(corpus, tmp_path, capsys):
    from kiln import cli

    rows = read_rows(corpus)
    rows[3]["objects"][1]["bbox"] = [30, 10, 20, 20]  # x_max < x_min
    write_rows(corpus, rows)
    spec = config(
        str(corpus / "manifest.jsonl"),
        tmp_path / "out",
        targets={**data.TARGETS, "bad_objects": "drop_object"},
        transforms=[{"center_crop": {"size": 24}}],  # cuts off objects: min_visibility
    )
    base = build(spec)
    named = [(row["key"], row["object"], row["reason"]) for row in dropped_objects(base)]
    assert ("images/003.png", 1, "bad_box") in named
    assert {reason for _, _, reason in named} == {"bad_box", "min_visibility"}

    # One more bad object, in the middle column (the crop keeps it otherwise).
    x_min, y_min, x_max, y_max = rows[6]["objects"][1]["bbox"]
    rows[6]["objects"][1]["bbox"] = [x_max, y_min, x_min, y_max]
    write_rows(corpus, rows)
    incremental = build(spec)

    assert incremental.incremental.reused == COUNT - 1
    full = build(dict(spec, output=str(tmp_path / "full")))
    assert_same_dataset(incremental, full)  # dropped_objects.jsonl included
    named = [(row["key"], row["object"], row["reason"]) for row in dropped_objects(incremental)]
    assert ("images/003.png", 1, "bad_box") in named and ("images/006.png", 1, "bad_box") in named

    # kiln build's summary and kiln diff say how many more objects were dropped.
    before = sum(base.info.objects_dropped.values())
    assert sum(incremental.info.objects_dropped.values()) == before + 1
    assert f"objects dropped {before} -> {before + 1}" in summary(incremental)
    assert cli.main(["diff", base.dataset_dir, incremental.dataset_dir]) == 0
    bad_boxes = base.info.objects_dropped["bad_box"]
    assert (
        f"objects dropped from stored images: {before} -> {before + 1} "
        f"(bad_box: {bad_boxes} -> {bad_boxes + 1}, min_visibility: "
    ) in capsys.readouterr().out


def test_a_reused_line_of_an_earlier_kiln_gives_unnamed_rows_for_its_counts():
    line = json.dumps(
        {
            "split": "train",
            "shard": "s",
            "position": 0,
            "key": "images/003.png",
            "sha256": "0" * 64,
            "inputs": "0" * 32,
            "label": 0,
            "height": 1,
            "width": 1,
            "pixels": 1,
            "sums": [0],
            "squares": [0],
            "targets": {"classes": [0], "objects": [], "dropped": {"bad_box": 2}},
        }
    )
    rows = record_index.dropped_object_rows(record_index.parse_line(line))
    assert [(row["key"], row["object"], row["reason"]) for row in rows] == [
        ("images/003.png", None, "bad_box")
    ] * 2


def dropped_objects(result) -> list[dict]:
    with open(os.path.join(result.dataset_dir, "dropped_objects.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_kiln_diff_compares_object_counts_and_gates_on_their_change(corpus, tmp_path, capsys):
    """An annotation export that lost boxes: the images and their classes may
    stay, their objects do not."""
    from kiln import cli

    spec = config(str(corpus / "manifest.jsonl"), tmp_path / "out")
    base = build(spec)
    rows = read_rows(corpus)
    lost = 0
    for row in rows:  # every image keeps its first object only
        lost += len([o for o in row["objects"][1:] if o["class"] == "green"])
        row["objects"] = row["objects"][:1]
    assert lost
    write_rows(corpus, rows)
    new = build(spec)

    diff = version_diff.compare(
        version_diff.open_version(base.dataset_dir), version_diff.open_version(new.dataset_dir)
    )
    counts = diff.object_counts()
    for name in data.CLASSES:
        old = sum(split.classes[name].count for split in base.info.objects.values())
        assert counts[name]["old"] == old
        assert counts[name]["new"] == sum(
            split.classes[name].count for split in new.info.objects.values()
        )
    green = counts["green"]
    assert green["change"] == -lost
    assert green["change_percent"] == pytest.approx(-100.0 * lost / green["old"], abs=1e-4)

    limit = abs(green["change_percent"]) - 1
    code = cli.main(["diff", base.dataset_dir, new.dataset_dir, "--max-object-change", f"{limit}"])
    out, err = capsys.readouterr()
    assert code == 1
    row = f"  green  {green['old']:>7} -> {green['new']:<7}  {green['change_percent']:+7.2f}%"
    assert row in out.splitlines()
    assert f"class 'green' has {green['new']} objects, {green['old']} before" in err
    assert cli.main(["diff", base.dataset_dir, new.dataset_dir, "--max-object-change", "100"]) == 0


def test_a_shorter_class_list_reprocesses_the_masks_it_leaves_values_outside(corpus, tmp_path):
    """A semantic mask's pixel values are class ids whatever names the row
    gives: a record whose mask shows red (id 2) was reused from a base built
    with three classes into a build with two, stored with a value no class
    has, where a full build drops its image (unknown_class)."""
    manifest = str(corpus / "manifest.jsonl")

    def spec(classes, output):
        source = {"type": "manifest", "path": manifest, "classes": classes}
        return config(
            manifest,
            output,
            source=source,
            targets={"mask": {"ignore_value": data.IGNORE}},
            errors={"max_fraction": 0.9},
        )

    build(spec(data.CLASSES, tmp_path / "out"))
    incremental = build(spec(["blue", "green"], tmp_path / "out"))

    full = build(spec(["blue", "green"], tmp_path / "full"))
    assert full.info.dropped == {"unknown_class": 6}  # the images showing red
    assert incremental.incremental.used
    assert_same_dataset(incremental, full)


def test_objects_of_a_class_the_base_did_not_know_are_processed_not_relabelled(corpus, tmp_path):
    """The base's class list leaves red out: its red objects were dropped.
    Declaring red (and amber, which shifts every id) keeps them now: those
    images are processed again; the others are relabelled."""
    manifest = str(corpus / "manifest.jsonl")
    targets = {
        **{
            kind: value
            for kind, value in data.TARGETS.items()
            if kind not in ("label", "labels", "mask")
        },
        "bad_objects": "drop_object",
    }
    source = {"type": "manifest", "path": manifest}
    base = build(
        config(
            manifest,
            tmp_path / "out",
            targets=targets,
            source={**source, "classes": ["blue", "green"]},
        )
    )
    assert "red" not in base.info.class_names
    with_red = {
        row["path"]
        for row in read_rows(corpus)
        if any(o["class"] == "red" for o in row.get("objects", ()))
    }
    assert with_red
    spec = config(
        manifest,
        tmp_path / "out",
        targets=targets,
        source={**source, "classes": ["amber", "blue", "green", "red"]},
    )

    incremental = build(spec)

    report = incremental.incremental
    assert report.used and report.changed == len(with_red)
    assert report.relabelled > 0 and report.reused + report.relabelled + len(with_red) == COUNT
    assert_same_dataset(incremental, build(dict(spec, output=str(tmp_path / "full"))))


def test_a_base_built_before_boxes_followed_instance_masks_is_not_reused(
    corpus, tmp_path, monkeypatch
):
    """Its cut boxes were not tightened: processed again, and the reason
    names kiln's change rather than the user's config."""
    from kiln.pipeline import incremental

    assert "instance_masks" in data.TARGETS
    manifest = str(corpus / "manifest.jsonl")
    with monkeypatch.context() as before:
        before.setattr(incremental, "INSTANCE_BOXES_VERSION", 0)
        base = build(config(manifest, tmp_path / "out"))
    assert base.info.processing["instance_boxes"] == 0

    result = build(config(manifest, tmp_path / "out"))

    assert not result.incremental.used and result.incremental.base == base.version
    assert result.incremental.reason == (
        "it was built with kiln's instance-mask box handling version 0, this kiln's is 1"
    )
    assert result.info.processing["instance_boxes"] == 1
    assert result.counters["images_decoded"] == COUNT


def test_a_base_built_before_mirrors_swapped_flip_pairs_says_so(corpus, tmp_path, monkeypatch):
    """The reason a base is not reused names kiln's change (its keypoints under
    mirrors, `MIRRORED_KEYPOINTS_VERSION`), not the user's config."""
    from kiln.pipeline import incremental

    assert data.TARGETS["keypoints"]["flip_pairs"]
    manifest = str(corpus / "manifest.jsonl")
    with monkeypatch.context() as before:
        before.setattr(incremental, "MIRRORED_KEYPOINTS_VERSION", 0)
        base = build(config(manifest, tmp_path / "out"))

    result = build(config(manifest, tmp_path / "out"))

    assert not result.incremental.used and result.incremental.base == base.version
    assert result.incremental.reason == (
        "it was built with kiln's mirrored keypoint version 0, this kiln's is 1"
    )
    assert result.info.processing["mirrored_keypoints"] == 1


def test_how_boxes_follow_instance_masks_is_in_the_fingerprint_of_such_datasets(monkeypatch):
    """A base whose cut boxes were not tightened to their instance masks is
    not reused (`INSTANCE_BOXES_VERSION`); datasets without instance masks
    keep their fingerprint (and version names)."""
    from kiln.pipeline import incremental

    with_masks = {"targets": {"boxes": {}, "instance_masks": {}}}
    boxes_only = {"targets": {"boxes": {}}}
    before = {
        name: incremental.processing_fingerprint(config)
        for name, config in (("with_masks", with_masks), ("boxes_only", boxes_only))
    }
    monkeypatch.setattr(incremental, "INSTANCE_BOXES_VERSION", 0)
    assert incremental.processing_fingerprint(with_masks) != before["with_masks"]
    assert incremental.processing_fingerprint(boxes_only) == before["boxes_only"]


def test_how_coco_keypoints_are_read_is_in_the_fingerprint_of_such_datasets(monkeypatch):
    """A base built when COCO keypoints were read as continuous coordinates
    (not moved to their pixel's centre) is not reused, nor is an unchanged
    source taken as up to date (`COCO_KEYPOINTS_VERSION`); datasets with
    another source or without keypoints keep their fingerprint."""
    from kiln.pipeline import incremental

    keypoints = {"boxes": {}, "keypoints": {"names": ["tip"]}}
    configs = {
        "coco_keypoints": {"source": {"type": "coco"}, "targets": keypoints},
        "manifest_keypoints": {"source": {"type": "manifest"}, "targets": keypoints},
        "coco_boxes": {"source": {"type": "coco"}, "targets": {"boxes": {}}},
    }
    before = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert incremental.processing(configs["coco_keypoints"])["coco_keypoints"] == 1
    assert "coco_keypoints" not in incremental.processing(configs["manifest_keypoints"])
    monkeypatch.setattr(incremental, "COCO_KEYPOINTS_VERSION", 0)
    after = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert after["coco_keypoints"] != before["coco_keypoints"]
    assert after["manifest_keypoints"] == before["manifest_keypoints"]
    assert after["coco_boxes"] == before["coco_boxes"]


def test_how_reduced_decodes_move_masks_is_in_the_fingerprint_of_such_datasets(monkeypatch):
    """A base whose masks of mirrored JPEGs decoded reduced broke ties
    otherwise than the full decode is not reused, nor is an unchanged source
    taken as up to date (`REDUCED_MASKS_VERSION`); datasets without
    ``image.jpeg_scaled_decode`` or without masks keep their fingerprint."""
    from kiln.pipeline import incremental

    scaled = {"jpeg_scaled_decode": True}
    configs = {
        "scaled_mask": {"image": scaled, "targets": {"mask": {}}},
        "scaled_instances": {"image": scaled, "targets": {"boxes": {}, "instance_masks": {}}},
        "scaled_boxes": {"image": scaled, "targets": {"boxes": {}}},
        "full_mask": {"image": {}, "targets": {"mask": {}}},
    }
    before = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert incremental.processing(configs["scaled_mask"])["reduced_masks"] == 1
    assert "reduced_masks" not in incremental.processing(configs["full_mask"])
    assert "reduced_masks" not in incremental.processing(configs["scaled_boxes"])
    monkeypatch.setattr(incremental, "REDUCED_MASKS_VERSION", 0)
    after = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert after["scaled_mask"] != before["scaled_mask"]
    assert after["scaled_instances"] != before["scaled_instances"]
    assert after["scaled_boxes"] == before["scaled_boxes"]
    assert after["full_mask"] == before["full_mask"]


def test_how_nearest_resizes_pick_pixels_is_in_the_fingerprint_of_such_datasets(monkeypatch):
    """A base whose nearest-neighbour resizes were OpenCV's (a neighbour of
    the masks' pixel at some rows and columns) is not reused
    (`NEAREST_RESIZE_VERSION`); other interpolations keep their fingerprint."""
    from kiln.pipeline import incremental

    def transforms(interpolation):
        return [{"letterbox": {"size": 64, "value": 0, "interpolation": interpolation}}]

    configs = {
        "nearest": {"transforms": transforms("nearest")},
        "resize_nearest": {"transforms": [{"resize": {"size": 8, "interpolation": "nearest"}}]},
        "area": {"transforms": transforms("area")},
        "none": {"transforms": []},
    }
    before = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert incremental.processing(configs["nearest"])["nearest_resize"] == 1
    assert "nearest_resize" not in incremental.processing(configs["area"])
    monkeypatch.setattr(incremental, "NEAREST_RESIZE_VERSION", 0)
    after = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert after["nearest"] != before["nearest"]
    assert after["resize_nearest"] != before["resize_nearest"]
    assert after["area"] == before["area"]
    assert after["none"] == before["none"]


def test_how_user_geometry_moves_targets_is_in_the_fingerprint_of_such_datasets(monkeypatch):
    """A base whose plugin transforms moved targets through the half-pixel shift
    `CoordinateMap.from_pixel_index_matrix` had backwards is not reused, nor is
    an unchanged source up to date (`USER_GEOMETRY_VERSION`): the plugin's own
    file did not change, kiln's code did. Datasets without plugins, or whose
    targets no transform moves, keep their fingerprint."""
    from kiln.pipeline import incremental

    configs = {
        "plugin_boxes": {"plugins": ["os"], "targets": {"boxes": {}}},
        "plugin_mask": {"plugins": ["os"], "targets": {"mask": {}}},
        "plugin_labels": {"plugins": ["os"], "targets": {"labels": {}}},
        "boxes": {"targets": {"boxes": {}}},
    }
    before = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert incremental.processing(configs["plugin_boxes"])["user_geometry"] == 1
    assert "user_geometry" not in incremental.processing(configs["plugin_labels"])
    assert "user_geometry" not in incremental.processing(configs["boxes"])
    monkeypatch.setattr(incremental, "USER_GEOMETRY_VERSION", 0)
    after = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert after["plugin_boxes"] != before["plugin_boxes"]
    assert after["plugin_mask"] != before["plugin_mask"]
    assert after["plugin_labels"] == before["plugin_labels"]
    assert after["boxes"] == before["boxes"]


def test_how_mirrors_move_keypoints_is_in_the_fingerprint_of_such_datasets(monkeypatch):
    """A base built before mirrors swapped flip pairs (an EXIF-mirrored photo's
    keypoints kept their names) is not reused (`MIRRORED_KEYPOINTS_VERSION`);
    keypoints without flip pairs keep their fingerprint."""
    from kiln.pipeline import incremental

    def keypoints(pairs):
        return {"boxes": {}, "keypoints": {"names": ["l", "r"], "flip_pairs": pairs}}

    configs = {"pairs": {"targets": keypoints([["l", "r"]])}, "none": {"targets": keypoints([])}}
    before = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert incremental.processing(configs["pairs"])["mirrored_keypoints"] == 1
    assert "mirrored_keypoints" not in incremental.processing(configs["none"])
    monkeypatch.setattr(incremental, "MIRRORED_KEYPOINTS_VERSION", 0)
    after = {name: incremental.processing_fingerprint(c) for name, c in configs.items()}
    assert after["pairs"] != before["pairs"]
    assert after["none"] == before["none"]
