"""An image with a semantic mask counts in ``class_counts`` for the classes its mask shows.

Real builds on the DirectRunner of `kiln demo-data --targets` scenes, with
configs/demo-detection.yaml: their masks show the background (class 0) around
the shapes, and no object or label is ever of class background. Before, the
background counted no example, so every build of every segmentation dataset
logged "class(es) with no example (every file dropped): background" (to cron,
under --quiet too), `kiln inspect` showed 0 for it, and class weights left it
out. `kiln verify` recounts the same classes from the records.
"""

from __future__ import annotations

import logging
import pathlib

import cv2
import numpy as np
import pytest
import yaml

from kiln.pipeline import build, demo_targets, incremental
from kiln.schemas.targets import MaskTarget
from kiln.tools.verify import verify

TOP = pathlib.Path(__file__).resolve().parents[1]
EMPTY_WARNING = "class(es) with no example"


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scenes")
    demo_targets.generate(folder, num_images=16, seed=5)
    return folder


def config(scenes: pathlib.Path, output: pathlib.Path, classes=None) -> dict:
    out = yaml.safe_load((TOP / "configs" / "demo-detection.yaml").read_text())
    out["source"]["path"] = str(scenes / demo_targets.MANIFEST)
    out["output"] = str(output)
    out["errors"] = {"max_fraction": 0.5}  # 5 broken scenes of 21
    if classes is not None:
        out["source"]["classes"] = classes
    return out


def shown_by_stored_masks(dataset_dir: str, info) -> dict[str, int]:
    """Images per class whose stored mask shows it, read back with TensorFlow."""
    import tensorflow as tf

    from kiln.schemas import Schema, decode_mask

    schema = Schema.from_json(info.schema)
    counts: dict[str, int] = {}
    for split in info.splits.values():
        for shard in split.shards:
            for serialized in tf.data.TFRecordDataset(f"{dataset_dir}/{shard.filename}"):
                mask = decode_mask(schema.parse(serialized)["mask"]).numpy()
                for value in np.unique(mask):
                    if value < len(info.class_names):
                        name = info.class_names[value]
                        counts[name] = counts.get(name, 0) + 1
    return counts


def test_the_background_a_mask_shows_is_counted_and_not_reported_empty(scenes, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        result = build(config(scenes, tmp_path / "out"))
    info = result.info
    assert info.class_names[0] == "background"
    total = {
        name: sum(s.class_counts.get(name, 0) for s in info.splits.values())
        for name in info.class_names
    }
    examples = sum(s.num_examples for s in info.splits.values())
    # Every stored scene shows background around its shapes.
    assert total["background"] == examples > 0
    # Each class counts the images whose mask shows it (objects' classes too).
    assert {n: c for n, c in total.items() if c} == shown_by_stored_masks(result.dataset_dir, info)
    assert EMPTY_WARNING not in caplog.text
    assert verify(result.dataset_dir).ok


def test_a_class_nothing_shows_is_still_reported(scenes, tmp_path, caplog):
    classes = [*demo_targets.CLASSES, "zigzag"]
    with caplog.at_level(logging.WARNING):
        info = build(config(scenes, tmp_path / "out", classes=classes)).info
    assert not any(s.class_counts.get("zigzag") for s in info.splits.values())
    lines = [r.getMessage() for r in caplog.records if EMPTY_WARNING in r.getMessage()]
    assert len(lines) == 1 and lines[0].split(":")[1].split(";")[0].strip() == "zigzag"


def test_the_ignore_value_and_values_past_the_classes_are_not_classes():
    mask = np.array([[0, 3, 255], [7, 3, 255]], np.uint8)
    histogram = np.bincount(mask.ravel(), minlength=256)
    assert MaskTarget(ignore_value=255).classes_shown(histogram, 5) == [0, 3]
    assert MaskTarget(ignore_value=3).classes_shown(histogram, 5) == [0]
    assert MaskTarget(ignore_value=None).classes_shown(histogram, 256) == [0, 3, 7, 255]


def test_a_base_counted_before_mask_classes_is_not_reused(scenes, tmp_path, monkeypatch):
    """The record index keeps each record's counted classes: a base whose
    counts left the mask out must not lend them to the next build."""
    out = tmp_path / "out"
    with monkeypatch.context() as before:
        before.setattr(MaskTarget, "classes_shown", lambda self, histogram, n: [])
        before.setattr(incremental, "MASK_COUNTS_VERSION", 0)
        old = build(config(scenes, out))
    assert not any(s.class_counts.get("background") for s in old.info.splits.values())
    # kiln verify counts a version as it was counted: no mask classes here.
    assert old.info.processing["mask_counts"] == 0
    assert verify(old.dataset_dir).ok
    # A new scene, so that the build has work and could reuse the rest.
    extra = scenes / "images" / "extra.png"
    cv2.imwrite(str(extra), np.full((64, 80, 3), 200, np.uint8))
    cv2.imwrite(str(scenes / "masks" / "extra.png"), np.zeros((64, 80), np.uint8))
    manifest = scenes / demo_targets.MANIFEST
    original = manifest.read_text()
    try:
        manifest.write_text(
            original + '{"path": "images/extra.png", "objects": [], "mask": "masks/extra.png"}\n'
        )
        new = build(config(scenes, out))
    finally:
        manifest.write_text(original)
        extra.unlink()
        (scenes / "masks" / "extra.png").unlink()
    assert new.version != old.version
    assert new.incremental.reason == (
        "it was built with kiln's mask class counting version 0, this kiln's is 1"
    )
    background = sum(s.class_counts.get("background", 0) for s in new.info.splits.values())
    assert background == sum(s.num_examples for s in new.info.splits.values())
    assert verify(new.dataset_dir).ok


def labelled_manifest(scenes: pathlib.Path) -> str:
    """The scenes' manifest with an image ``label`` (its first object's class,
    else background) and ``labels`` (its objects' classes) on every line."""
    import json

    lines = []
    for line in (scenes / demo_targets.MANIFEST).read_text().splitlines():
        row = json.loads(line)
        names = sorted({obj["class"] for obj in row.get("objects", [])})
        row["label"] = row["objects"][0]["class"] if row.get("objects") else "background"
        row["labels"] = names
        lines.append(json.dumps(row))
    path = scenes / "labelled.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_weights_from_counts_refuse_counts_a_mask_added_to(scenes, tmp_path):
    """class_counts with a mask count the classes it shows: they are no longer
    a label's (or labels') counts, so balanced weights from them would be
    wrong; a dataset counted before mask classes still gets its weights."""
    import dataclasses

    import kiln.reader
    from kiln.reader.targets import TargetError

    spec = config(scenes, tmp_path / "out")
    spec["source"]["path"] = labelled_manifest(scenes)
    spec["targets"] = {"label": {}, "mask": {"ignore_value": 255}}
    info = build(spec).info
    assert info.class_count_kinds == ("label", "mask")
    with pytest.raises(TargetError, match=r"over label and \['mask'\]"):
        kiln.reader.class_weights(info)
    # Counted as before mask classes (no mask_counts): the counts are the label's.
    before = dataclasses.replace(info, processing={**info.processing, "mask_counts": 0})
    assert before.class_count_kinds == ("label",)
    assert kiln.reader.class_weights(before)

    spec["name"] = "tags"
    spec["targets"] = {"labels": {}, "mask": {"ignore_value": 255}}
    info = build(spec).info
    with pytest.raises(TargetError, match=r"over labels and \['mask'\]"):
        kiln.reader.positive_weights(info)
    assert kiln.reader.positive_weights(
        dataclasses.replace(info, processing={**info.processing, "mask_counts": 0})
    )
