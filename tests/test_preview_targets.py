"""`kiln preview` on a dataset with targets: boxes, masks and keypoints drawn on every cell."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from kiln import cli
from kiln.tools import contact_sheet
from reader import scene_records, scenes

TARGETS = {
    "boxes": {"min_visibility": 0.25},
    "mask": {"ignore_value": 255},
    "keypoints": {"names": list(scenes.KEYPOINT_NAMES), "flip_pairs": [["left", "right"]]},
}
FLIP = [{"random_flip_left_right": {"probability": 1.0}}]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    """Four scenes built by `kiln build` with boxes, a class mask and keypoints."""
    root = str(tmp_path_factory.mktemp("preview-scenes"))
    return scene_records.build_scenes(root, TARGETS, FLIP, count=4).dataset_dir


@pytest.fixture(scope="module")
def preview(dataset_dir):
    return contact_sheet.gather(dataset_dir, "train", n=3, epochs=2, seed=0)


def test_gather_reads_the_targets_of_every_cell(preview):
    assert preview.stored_targets is not None and preview.epoch_targets is not None
    assert len(preview.stored_targets) == 3 and len(preview.epoch_targets) == 2
    for stored, flipped in zip(preview.stored_targets, preview.epoch_targets[0], strict=True):
        np.testing.assert_allclose(flipped["boxes"][:, 1], 1.0 - stored["boxes"][:, 3], atol=1e-6)
        np.testing.assert_array_equal(flipped["mask"], stored["mask"][:, ::-1])


def test_cells_show_boxes_masks_and_keypoints_where_the_objects_are(preview):
    sheet, layout = contact_sheet.compose(preview, zoom=2, text=False)
    rows = [preview.stored_targets, *preview.epoch_targets]
    images = [preview.stored, *preview.epochs]
    for row_index, (row, row_images) in enumerate(zip(rows, images, strict=True)):
        for column, (targets, image) in enumerate(zip(row, row_images, strict=True)):
            cell = sheet[layout.image_box(row_index, column, *image.shape[:2])]
            height, width = cell.shape[:2]
            for box, class_id in zip(targets["boxes"], targets["classes"], strict=True):
                colour = contact_sheet._PALETTE[class_id % len(contact_sheet._PALETTE)]
                top, left = int(box[0] * height), int(box[1] * width)
                bottom = int(np.ceil(box[2] * height)) - 1
                np.testing.assert_array_equal(cell[top, left], colour)  # the frame
                np.testing.assert_array_equal(cell[bottom, left], colour)
                # Inside: the object's colour blended with its class colour (the mask).
                middle = cell[(top + bottom) // 2 + 4, left + 3]
                plain = image[((top + bottom) // 2 + 4) // 2, (left + 3) // 2]
                assert not np.array_equal(middle, plain)
            # Each visible keypoint is a dot on its marker.
            for points, visible in zip(
                targets["keypoints"], targets["keypoint_visibility"], strict=True
            ):
                for (y, x), v in zip(points, visible, strict=True):
                    if v > 0:
                        dot = cell[int(y * height), int(x * width)]
                        assert any(np.array_equal(dot, c) for c in contact_sheet._PALETTE), dot
    background = sheet[layout.image_box(0, 0, *preview.stored[0].shape[:2])][0, 0]
    np.testing.assert_array_equal(background, [0, 0, 0])  # no overlay where there is no class


def test_cli_draws_targets_and_lists_objects(dataset_dir, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    rotation = [{"random_rotation": {"angle_range": [-20, 20]}}]
    arguments = ["--n", "3", "--epochs", "2", "--augment", json.dumps(rotation), "-o", out]
    assert cli.main(["preview", dataset_dir, *arguments]) == 0
    with open(out, "rb") as f:
        written = tf.io.decode_png(f.read()).numpy()
    preview = contact_sheet.gather(dataset_dir, "train", n=3, epochs=2, seed=0, augment=rotation)
    expected, _ = contact_sheet.compose(preview)
    np.testing.assert_array_equal(written, expected)
    stdout = capsys.readouterr().out
    assert "column 1: (3 object(s), mask)" in stdout


def test_multi_label_columns_are_captioned_with_their_labels(tmp_path, capsys):
    """A multi-label dataset's stored row shows each image's labels (it had no caption)."""
    from kiln.pipeline import build

    rows = {"a.png": "cat|dog", "b.png": "", "c.png": "dog"}
    for index, name in enumerate(rows):
        pixels = np.full((8, 8, 3), 40 * index, np.uint8)
        (tmp_path / name).write_bytes(tf.io.encode_png(pixels).numpy())
    lines = ["path,labels", *(f"{name},{labels}" for name, labels in rows.items())]
    (tmp_path / "tags.csv").write_text("\n".join(lines) + "\n")
    result = build(
        {
            "name": "tags",
            "source": {"type": "manifest", "path": str(tmp_path / "tags.csv")},
            "output": str(tmp_path / "out"),
            "encoding": {"format": "png"},
            "splits": {"fractions": {"train": 1.0}},
            "targets": {"labels": {}},
        },
        [],
    )
    preview = contact_sheet.gather(result.dataset_dir, "train", n=3, epochs=1, seed=0)
    expected = {"a.png": "cat+dog", "b.png": "", "c.png": "dog"}
    assert dict(zip(preview.keys, preview.label_names, strict=True)) == expected
    out = str(tmp_path / "sheet.png")
    assert cli.main(["preview", result.dataset_dir, "--n", "3", "--epochs", "1", "-o", out]) == 0
    stdout = capsys.readouterr().out
    for column, key in enumerate(preview.keys):
        assert f"column {column + 1}: {expected[key]}" in stdout


@pytest.fixture(scope="module")
def instance_dataset_dir(tmp_path_factory):
    """Four scenes with boxes and an instance mask per object (no class mask), flipped."""
    root = str(tmp_path_factory.mktemp("preview-instances"))
    targets = {"boxes": {"min_visibility": 0.25}, "instance_masks": {}}
    return scene_records.build_scenes(root, targets, FLIP, count=4).dataset_dir


def test_instance_masks_are_drawn_where_the_objects_are(instance_dataset_dir, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    # One epoch: the stored flip (probability 1) is the same in every epoch.
    arguments = ["--n", "3", "--epochs", "1", "-o", out]
    assert cli.main(["preview", instance_dataset_dir, *arguments]) == 0
    stdout = capsys.readouterr().out
    with open(out, "rb") as f:
        sheet = tf.io.decode_png(f.read()).numpy()
    preview = contact_sheet.gather(instance_dataset_dir, "train", n=3, epochs=1, seed=0)
    _, layout = contact_sheet.compose(preview)
    renderer = contact_sheet._text_renderer()
    assert renderer is not None  # OpenCV is installed here: the sheet has class names
    zoom = int(layout.zoom)
    rows = [preview.stored_targets, *preview.epoch_targets]
    images = [preview.stored, *preview.epochs]
    alpha = contact_sheet._MASK_ALPHA
    for row_index, (row, row_images) in enumerate(zip(rows, images, strict=True)):
        for column, (targets, image) in enumerate(zip(row, row_images, strict=True)):
            cell = sheet[layout.image_box(row_index, column, *image.shape[:2])].astype(float)
            plain = np.repeat(np.repeat(image, zoom, 0), zoom, 1).astype(float)
            height, width = cell.shape[:2]
            expected = plain.copy()
            covered = np.zeros((height, width), bool)
            checked = np.ones((height, width), bool)  # off frames and class names
            for instance, box, class_id in zip(
                targets["instance_masks"], targets["boxes"], targets["classes"], strict=True
            ):
                assert instance.sum() > 0
                inside = np.repeat(np.repeat(instance[..., 0] > 0, zoom, 0), zoom, 1)
                colour = contact_sheet._PALETTE[class_id % len(contact_sheet._PALETTE)]
                expected[inside] = np.round((1 - alpha) * plain[inside] + alpha * colour)
                covered |= inside
                top, left = int(box[0] * height), int(box[1] * width)
                bottom = int(np.ceil(box[2] * height)) - 1
                right = int(np.ceil(box[3] * width)) - 1
                # The class name, on its backing (`label_origin` is tested below).
                size = renderer.size(preview.class_names[class_id])
                x, y = contact_sheet.label_origin(size, top, left, height, width)
                pad = contact_sheet._LABEL_PAD
                checked[
                    max(y - size[1] - pad, 0) : y + size[2] + pad, x - pad : x + size[0] + pad
                ] = False
                checked[[top, bottom], left : right + 1] = False
                checked[top : bottom + 1, [left, right]] = False
            assert (covered & checked).sum() > 0.8 * covered.sum()
            # The overlay in the class colour where an object's mask is, nowhere else.
            np.testing.assert_array_equal(cell[covered & checked], expected[covered & checked])
            np.testing.assert_array_equal(cell[~covered & checked], plain[~covered & checked])
    # The flip moved the masks with the objects: epoch cells differ from the stored ones.
    stored, flipped = preview.stored_targets[0], preview.epoch_targets[0][0]
    np.testing.assert_array_equal(flipped["instance_masks"], stored["instance_masks"][:, :, ::-1])
    assert "column 1: (3 object(s), instance masks)" in stdout


def test_box_labels_are_whole_inside_the_cell_and_readable_on_light_images():
    renderer = contact_sheet._text_renderer()
    assert renderer is not None  # OpenCV is installed here
    image = np.full((96, 96, 3), 250, np.uint8)  # light: white text alone vanishes on it
    name = "pedestrian"
    top = int(0.4 * 96)
    targets = {"boxes": np.array([[0.4, 0.85, 0.8, 1.0]], np.float32), "classes": np.array([0])}
    out = contact_sheet.draw_targets(image, targets, [name], renderer)
    import cv2

    font, scale = cv2.FONT_HERSHEY_SIMPLEX, contact_sheet._FONT_SCALE
    (text_width, text_height), _ = cv2.getTextSize(name, font, scale, 1)
    assert text_width > 0.15 * 96  # wider than the room right of the box's left edge
    # The label is what changed above the box (its frame starts on its top row).
    changed = (out[:top] != image[:top]).any(axis=-1)
    rows, columns = np.flatnonzero(changed.any(axis=1)), np.flatnonzero(changed.any(axis=0))
    assert columns[-1] - columns[0] + 1 >= text_width  # the whole name, not cut at the edge
    assert rows.size >= text_height
    label = out[rows[0] : rows[-1] + 1, columns[0] : columns[-1] + 1].max(axis=-1)
    # Readable: light letters on a dark backing, the letters across the whole name.
    assert (label < 100).mean() > 0.3
    letters = np.flatnonzero((label > 150).any(axis=0))
    assert letters[-1] - letters[0] + 1 >= 0.9 * text_width

    # Where each name goes: in the cell, moved left at the right edge, inside
    # the box under its top edge when there is no room above it.
    size = renderer.size(name)
    x, y = contact_sheet.label_origin(size, top, 90, 96, 96)
    assert x + text_width < 96 and y < top
    x, y = contact_sheet.label_origin(size, 0, 10, 96, 96)
    assert x == 11 and y - text_height > 0
    x, _ = contact_sheet.label_origin(size, 50, 30, 96, 40)  # wider than the cell
    assert x >= 0


def test_keypoints_stand_out_on_a_box_and_mask_of_their_own_colour():
    """Keypoint k's dot has the colour of a class (class k + 3): on that class's
    frame or mask it must still be seen."""
    palette = contact_sheet._PALETTE
    class_id = 3  # the colour keypoint 0's dot is drawn in
    np.testing.assert_array_equal(palette[class_id], palette[(0 + 3) % len(palette)])
    image = np.full((64, 64, 3), 128, np.uint8)
    mask = np.zeros((64, 64, 1), np.uint8)
    mask[16:48, 16:48] = class_id
    # Keypoint 0 on the box's left edge (the frame) and at the middle of the mask.
    points = np.array([[[32.5 / 64, 16.5 / 64], [32.5 / 64, 32.5 / 64]]], np.float32)
    targets = {
        "boxes": np.array([[0.25, 0.25, 0.75, 0.75]], np.float32),
        "classes": np.array([class_id]),
        "mask": mask,
        "keypoints": points[:, :1],
        "keypoint_visibility": np.array([[2]]),
    }
    names = ["background", "a", "b", "c"]
    on_frame = contact_sheet.draw_targets(image, targets, names)
    on_mask = contact_sheet.draw_targets(image, {**targets, "keypoints": points[:, 1:]}, names)
    without = contact_sheet.draw_targets(
        image, {**targets, "keypoint_visibility": np.array([[0]])}, names
    )
    for out, (row, col) in [(on_frame, (32, 16)), (on_mask, (32, 32))]:
        window = out[row - 2 : row + 3, col - 2 : col + 3].reshape(-1, 3).astype(int)
        around = without[row - 2 : row + 3, col - 2 : col + 3].reshape(-1, 3).astype(int)
        # Some pixels of the marker differ strongly from everything that was there.
        distance = np.abs(window[:, None] - around[None]).sum(axis=-1).min(axis=1)
        assert distance.max() > 150, (row, col)
        np.testing.assert_array_equal(out[row, col], palette[3])  # the dot keeps its colour
