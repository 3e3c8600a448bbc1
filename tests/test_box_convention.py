"""Boxes in another convention (normalized, [x, y, w, h], [y_min, x_min, ...]) are caught.

For the dataset: the kernels (`box_convention.count`, `verdict`) on boxes
made up here, then real builds on the DirectRunner of small manifests whose
boxes are known exactly and then written in each convention. For one
object: a box that does not enclose its instance mask (`TargetCodec.load`).
"""

from __future__ import annotations

import json
import logging
import os

import cv2
import numpy as np
import pytest

from kiln.pipeline import BuildError, build
from kiln.pipeline.box_convention import MIN_EVIDENCE, BoxEvidence, count, count_listed, verdict
from kiln.pipeline.target_rows import AS_WRITTEN, convention_boxes
from kiln.pipeline.targets import BadAnnotation, TargetCodec
from kiln.schemas import TargetsConfig

HEIGHT, WIDTH = 48, 96  # not square: [y_min, x_min, ...] boxes spill out of the height


def true_boxes(images: int, per_image: int, seed: int = 0) -> list[list[list[int]]]:
    """Boxes ``[x_min, y_min, x_max, y_max]`` in pixels of a ``HEIGHT x WIDTH``
    image, anywhere in it, 8 to 20 pixels a side."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(images):
        boxes = []
        for _ in range(per_image):
            w, h = int(rng.integers(8, 21)), int(rng.integers(8, 21))
            x, y = int(rng.integers(0, WIDTH - w + 1)), int(rng.integers(0, HEIGHT - h + 1))
            boxes.append([x, y, x + w, y + h])
        out.append(boxes)
    return out


def written(box: list[int], convention: str) -> list[float]:
    x0, y0, x1, y1 = box
    return {
        "xyxy": [x0, y0, x1, y1],
        "normalized": [x0 / WIDTH, y0 / HEIGHT, x1 / WIDTH, y1 / HEIGHT],
        "xywh": [x0, y0, x1 - x0, y1 - y0],
        "yxyx": [y0, x0, y1, x1],
    }[convention]


def evidence_of(convention: str, images: int = 20, per_image: int = 2) -> BoxEvidence:
    total = BoxEvidence()
    for boxes in true_boxes(images, per_image):
        total = total.merged(count([written(b, convention) for b in boxes], HEIGHT, WIDTH))
    return total


def test_boxes_in_kiln_convention_look_like_nothing_else():
    assert verdict(evidence_of("xyxy")) is None
    # Square images: no box spills out when read transposed, no evidence either way.
    square = count([[10, 20, 30, 90], [60, 5, 99, 40]], 100, 100)
    assert square.transposed == square.not_transposed == 0


@pytest.mark.parametrize("convention", ["normalized", "xywh", "yxyx"])
def test_each_other_convention_is_recognised_with_enough_boxes(convention):
    finding = verdict(evidence_of(convention))
    assert finding is not None and finding.certain
    assert finding.convention == convention


def test_a_few_boxes_are_a_warning_and_a_correct_handful_nothing():
    few = evidence_of("normalized", images=5, per_image=1)
    assert few.normalized == 5 < MIN_EVIDENCE
    finding = verdict(few)
    assert finding is not None and not finding.certain
    assert verdict(evidence_of("xyxy", images=5, per_image=1)) is None


def test_the_odd_bad_box_is_not_evidence():
    # 40 good boxes, two reversed and one in the top-left pixel.
    evidence = evidence_of("xyxy").merged(
        count([[30, 10, 20, 20], [40, 30, 10, 20], [0.1, 0.1, 0.9, 0.9]], HEIGHT, WIDTH)
    )
    assert evidence.xywh == 2 and evidence.normalized == 1
    assert verdict(evidence) is None


def test_boxes_in_the_top_left_pixel_of_tiny_images_are_not_normalized_evidence():
    assert count([[0.1, 0.1, 0.9, 0.9]], 8, 8).normalized == 0


# --- builds ---------------------------------------------------------------------------


def write_dataset(folder, convention: str, images: int = 20, per_image: int = 2) -> str:
    """Plain images and a JSONL manifest of their boxes written in `convention`."""
    (folder / "images").mkdir(parents=True)
    lines = []
    for index, boxes in enumerate(true_boxes(images, per_image)):
        path = f"images/{index:03d}.png"
        assert cv2.imwrite(str(folder / path), np.full((HEIGHT, WIDTH, 3), 90, np.uint8))
        objects = [{"bbox": written(box, convention), "class": "part"} for box in boxes]
        lines.append(json.dumps({"path": path, "objects": objects}))
    (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder / "manifest.jsonl")


def config(folder, manifest: str, **overrides) -> dict:
    return {
        "name": "parts",
        "source": {"type": "manifest", "path": manifest},
        "output": str(folder / "out"),
        "encoding": {"format": "png"},
        "targets": {"boxes": {}},
        "errors": {"max_fraction": 1.0},
        **overrides,
    }


@pytest.mark.parametrize(
    ("convention", "named", "listed"),
    [
        ("normalized", "the boxes look normalized to [0, 1]: 40 of 40 boxes", True),
        ("xywh", "the boxes look like [x, y, width, height] (COCO's order)", True),
        ("yxyx", "the boxes look like [y_min, x_min, y_max, x_max] (TensorFlow's order)", False),
    ],
)
def test_a_build_of_boxes_in_another_convention_fails_and_publishes_nothing(
    tmp_path, convention, named, listed
):
    manifest = write_dataset(tmp_path, convention)
    with pytest.raises(BuildError) as raised:
        build(config(tmp_path, manifest))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(named), message
    assert "nothing was published (errors.check_box_convention: false" in message
    assert not os.path.exists(tmp_path / "out" / "parts" / "LATEST")
    assert raised.value.exit_code == 1
    # Normalized and [x, y, w, h] boxes show in the listing, before the job
    # reads an image (no staging folder then); [y_min, x_min, ...] needs the
    # images' sizes, so the job finds it, and keeps its dropped files.
    assert ("; found listing the source, before any image was read; " in message) == listed
    kept = list((tmp_path / "out" / "parts").glob(".staging-*/errors.jsonl"))
    assert bool(kept) != listed, kept


@pytest.mark.parametrize("convention", ["normalized", "xywh"])
def test_the_listed_boxes_alone_show_normalized_and_xywh_boxes(convention):
    listed = BoxEvidence()
    for boxes in true_boxes(20, 2):
        listed = listed.merged(count_listed([written(b, convention) for b in boxes]))
    finding = verdict(listed, listed=True)
    assert finding is not None and finding.certain and finding.convention == convention
    assert "in the listed rows" in finding.message or "a positive third" in finding.message
    correct = BoxEvidence()
    for boxes in true_boxes(20, 2):
        correct = correct.merged(count_listed(boxes))
    assert correct == BoxEvidence(boxes=40) and verdict(correct, listed=True) is None


def test_a_coco_box_of_negative_width_is_not_evidence_of_another_convention():
    # The COCO source has made it corners already; it is a bad box, not an [x, y, w, h] box.
    row = {
        "objects": [
            {"bbox": [71.0, 9.0, 35.0, 42.0], "class": "a", AS_WRITTEN: {"bbox": [71, 9, -36, 33]}},
            {"bbox": [1.0, 2.0, 3.0, 4.0], "class": "a"},
        ]
    }
    assert list(convention_boxes(row)) == [[1.0, 2.0, 3.0, 4.0]]


def test_the_check_turned_off_builds_with_a_warning(tmp_path, caplog):
    manifest = write_dataset(tmp_path, "normalized")
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.launcher"):
        result = build(config(tmp_path, manifest, errors={"check_box_convention": False}))
    assert result.info.splits["train"].num_examples == 20
    assert "the boxes look normalized to [0, 1]" in caplog.text
    assert "errors.check_box_convention is off: built anyway" in caplog.text
    assert result.info.config["errors"]["check_box_convention"] is False


def test_a_handful_of_normalized_boxes_builds_with_a_warning(tmp_path, caplog):
    manifest = write_dataset(tmp_path, "normalized", images=5, per_image=1)
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.launcher"):
        result = build(config(tmp_path, manifest))
    assert result.info.splits["train"].num_examples == 5
    assert "5 of 5 boxes lie within [0, 1] x [0, 1]" in caplog.text
    assert "too few boxes to be sure" in caplog.text


def test_a_correct_handful_of_boxes_builds_without_a_word(tmp_path, caplog):
    manifest = write_dataset(tmp_path, "xyxy", images=5, per_image=1)
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.launcher"):
        result = build(config(tmp_path, manifest))
    assert result.info.splits["train"].num_examples == 5
    assert "boxes look" not in caplog.text
    # The knob at its default stays out of the resolved config (and the fingerprint).
    assert "check_box_convention" not in result.info.config["errors"]


# --- a box and its instance mask -------------------------------------------------------


def load_object(box, segmentation, height=40, width=60):
    """One object's box and polygon through the job's target codec."""
    codec = TargetCodec(
        TargetsConfig.model_validate({"boxes": {}, "instance_masks": {}}),
        ["part"],
        max_pixels=10**6,
    )
    row = {"objects": [{"bbox": box, "class": "part", "fields": {}, "segmentation": segmentation}]}
    return codec.load(codec.read(json.dumps(row)), height, width)


def rectangle(x0, y0, x1, y1):
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]


def test_a_box_around_its_mask_is_good_down_to_a_pixel_or_two():
    assert load_object([10, 5, 30, 25], rectangle(10, 5, 30, 25)).geometry.num_objects == 1
    # A box drawn a little loose around a tiny object; a sub-pixel object's
    # box and mask, which cover no pixel centre.
    assert load_object([10, 5, 13.5, 8], rectangle(11, 6, 12, 7)).geometry.num_objects == 1
    assert (
        load_object([20, 9, 20.4, 9.4], rectangle(20.1, 9.1, 20.2, 9.2)).geometry.num_objects == 1
    )
    # A box of 2x2 pixels drawn loose around a speck whose mask is empty: the
    # slack a tiny object's box has, as for a mask with pixels.
    assert load_object([20, 9, 22, 11], rectangle(20.1, 9.1, 20.2, 9.2)).geometry.num_objects == 1


def test_an_empty_mask_under_a_box_that_covers_pixels_is_a_bad_annotation():
    # A mask of no pixel at all (a polygon of a tenth of a pixel) under a box
    # of 20x20 pixels: not a tiny object, a box and a mask that disagree.
    with pytest.raises(BadAnnotation) as raised:
        load_object([10, 5, 30, 25], rectangle(20.1, 9.1, 20.2, 9.2))
    assert raised.value.reason == "box_mask_mismatch"
    assert "its instance mask is empty but its box [10, 5, 30, 25] covers pixel centres" in str(
        raised.value
    )


@pytest.mark.parametrize(
    "box",
    [
        [40, 5, 58, 25],  # another object's box
        [5, 10, 25, 30],  # [y_min, x_min, y_max, x_max] of the mask's box
        [10, 5, 20, 20],  # [x, y, width, height] of the mask's box
    ],
)
def test_a_box_that_does_not_enclose_its_mask_is_a_bad_annotation(box):
    with pytest.raises(BadAnnotation) as raised:
        load_object(box, rectangle(10, 5, 30, 25))
    assert raised.value.reason == "box_mask_mismatch"
    assert str(raised.value).startswith(
        f"objects[0]: its box [{', '.join(map(str, box))}] and the box of its instance mask's "
        "pixels [10, 5, 30, 25] overlap by an IoU of "
    )
