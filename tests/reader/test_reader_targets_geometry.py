"""Targets follow the pixels on wide images, resampled as users resample them.

test_reader_targets.py checks square scenes, resampled nearest-neighbour,
with two keypoint markers the check does not tell apart. These scenes are
48x80 (a height read as a width, or a box's x and y swapped, lands
elsewhere), the ops keep their default bilinear resampling (the image
blends while masks stay nearest-neighbour: they must still line up), and
each keypoint has a marker of its own colour: "left" white, "right"
yellow (a `flip_pairs` pair) and "top" cyan (in no pair). So a flip that
forgets to swap the pair, or swaps it twice, or swaps "top", shows. The
same checks run on the inference form (other splits), on uint8 and
channels-first output, all from one real `kiln build`.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from reader import scene_records

pytestmark = pytest.mark.usefixtures("no_global_seed")

HEIGHT, WIDTH = 48, 80
CLASSES = ("background", "blue", "green", "red")
OBJECT_COLOURS = {1: (40, 80, 250), 2: (40, 220, 60), 3: (230, 40, 40)}
KEYPOINT_NAMES = ("left", "right", "top")
MARKER_COLOURS = ((255, 255, 255), (255, 255, 0), (0, 255, 255))
# Pixel rectangles [top, left, bottom, right) and their class: nothing mirrors onto itself.
RECTANGLES = (((4, 6, 24, 40), 1), ((26, 44, 46, 76), 2), ((6, 50, 20, 70), 3))
IGNORE = 255
NUM_SCENES = 6
# A resampled straight edge is within half a pixel of the exact one, a
# rotated corner's tip within about one and a half; bilinear blending
# leaves up to one more pixel a colour no palette entry is near.
EDGE_PX = 1.5
BLEND_PX = 1.0
# Lists that resample three times (crop, rotation, zoom) can leave a rotated
# corner's tip, a wedge thinner than a pixel, in the nearest-neighbour masks
# (and so in the box) while the bilinear image has blended it away: a box
# edge may then lie this far beyond the object's solid pixels (never the
# other way: the pixels stay inside the box).
WEDGE_PX = 4.0


def scene(variant: int) -> tuple[np.ndarray, np.ndarray, list[dict], list[np.ndarray]]:
    """Image, class mask, manifest objects and instance masks of scene `variant`."""
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    mask = np.zeros((HEIGHT, WIDTH, 1), np.uint8)
    objects, instance_masks = [], []
    shift = variant % 4
    for (top, left, bottom, right), class_id in RECTANGLES:
        top, bottom = top + shift % 2, bottom + shift % 2
        left, right = left + shift, right + shift
        image[top:bottom, left:right] = OBJECT_COLOURS[class_id]
        mask[top:bottom, left:right] = class_id
        instance = np.zeros((HEIGHT, WIDTH, 1), np.uint8)
        instance[top:bottom, left:right] = 1
        instance_masks.append(instance)
        middle = (top + bottom) // 2
        centres = ((left + 3, middle), (right - 4, middle), ((left + right) // 2, top + 2))
        keypoints = []
        for (x, y), colour in zip(centres, MARKER_COLOURS, strict=True):
            image[y - 1 : y + 2, x - 1 : x + 2] = colour
            keypoints += [x + 0.5, y + 0.5, 2]  # the marker's centre pixel
        objects.append(
            {"bbox": [left, top, right, bottom], "class": CLASSES[class_id], "keypoints": keypoints}
        )
    return image, mask, objects, instance_masks


def build_scenes(root: str, count: int, transforms: list, orientations: bool = False):
    """`count` scenes built by `kiln build` from a JSONL manifest (PNG, train only).

    With `orientations`, scene ``i``'s file is tagged with EXIF orientation
    ``i % 8 + 1``: its targets are annotated on the stored pixels, and the
    build turns both upright.
    """
    from PIL import Image

    from kiln.pipeline import build

    source = os.path.join(root, "source")
    os.makedirs(source)

    def png(name, array, orientation=1):
        exif = Image.Exif()
        if orientation != 1:
            exif[0x0112] = orientation
        pixels = array[..., 0] if array.shape[-1] == 1 else array
        Image.fromarray(pixels).save(os.path.join(source, name), "PNG", exif=exif.tobytes())

    lines = []
    for index in range(count):
        image, mask, objects, instance_masks = scene(index)
        png(f"scene_{index}.png", image, index % 8 + 1 if orientations else 1)
        png(f"scene_{index}_mask.png", mask)
        for slot, (obj, instance) in enumerate(zip(objects, instance_masks, strict=True)):
            obj["mask"] = f"scene_{index}_{slot}.png"
            png(obj["mask"], instance)
        row = {"path": f"scene_{index}.png", "objects": objects, "mask": f"scene_{index}_mask.png"}
        lines.append(json.dumps(row) + "\n")
    manifest = os.path.join(source, "manifest.jsonl")
    with open(manifest, "w") as f:
        f.write("".join(lines))
    config = {
        "name": "wide",
        "source": {"type": "manifest", "path": manifest, "classes": list(CLASSES)},
        "output": os.path.join(root, "datasets"),
        "transforms": transforms,
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"num_shards": 1},
        "targets": {
            "boxes": {"min_visibility": 0.25},
            "mask": {"ignore_value": IGNORE},
            "instance_masks": {},
            "keypoints": {"names": list(KEYPOINT_NAMES), "flip_pairs": [["left", "right"]]},
        },
    }
    return build(config, [])


@pytest.fixture(scope="session")
def wide_dataset(tmp_path_factory):
    """The wide scenes built by `kiln build` from a JSONL manifest: PNG, 48x80, train only."""
    return build_scenes(str(tmp_path_factory.mktemp("wide")), NUM_SCENES, [])


_PALETTE = np.array([(0, 0, 0), *OBJECT_COLOURS.values(), *MARKER_COLOURS], np.float64)
_LABELS = np.array([0, *OBJECT_COLOURS, -1, -1, -1])
_BLEND = -9


def classify(image: np.ndarray) -> np.ndarray:
    """Per pixel: 0 background, a class id, -1 a marker, or -9 a blend of colours
    (a pixel farther than 40 levels from every scene colour)."""
    pixels = image.astype(np.float64) * (1.0 if image.dtype == np.uint8 else 255.0)
    distances = np.linalg.norm(pixels[..., None, :] - _PALETTE, axis=-1)
    labels = _LABELS[np.argmin(distances, axis=-1)]
    labels[distances.min(axis=-1) > 40] = _BLEND
    return labels


def pixel_box(flags: np.ndarray) -> np.ndarray | None:
    """``[y_min, x_min, y_max, x_max]`` in pixels of the True pixels, None if none."""
    rows, cols = np.nonzero(flags)
    if rows.size == 0:
        return None
    return np.array([rows.min(), cols.min(), rows.max() + 1, cols.max() + 1], np.float64)


def interior(flags: np.ndarray) -> np.ndarray:
    """The pixels whose 3x3 neighbourhood is all `flags`: away from resampled edges."""
    padded = np.pad(flags, 1)
    out = np.ones_like(flags)
    for dy in range(3):
        for dx in range(3):
            out &= padded[dy : dy + flags.shape[0], dx : dx + flags.shape[1]]
    return out


def check(image: np.ndarray, targets: dict, *, mirrored: bool | None) -> list[str]:
    """Every way the targets disagree with the pixels (empty: they agree).

    `mirrored`: whether the element went through an odd number of flips
    (then "left" lies on the yellow marker and "right" on the white one), or
    None when the list flips at random: then every "left" of the element
    must lie on one colour and every "right" on the other. In both cases
    the three keypoints of an object must turn as they did when stored:
    every mirror swaps the pair.
    """
    problems = []
    height, width = image.shape[:2]
    read = classify(image)
    scale = np.array([height, width, height, width], np.float64)
    for index, (box, class_id) in enumerate(zip(targets["boxes"], targets["classes"], strict=True)):
        box = np.asarray(box, np.float64) * scale
        if not (0 <= box[0] < box[2] <= height and 0 <= box[1] < box[3] <= width):
            problems.append(f"object {index}: box {box.round(2)} is empty or leaves the image")
        instance = np.asarray(targets["instance_masks"][index])[..., 0]
        if not set(np.unique(instance).tolist()) <= {0, 1}:
            problems.append(f"object {index}: instance mask values {np.unique(instance)}")
        from_mask = pixel_box(instance > 0)
        if from_mask is not None and np.abs(from_mask - box).max() > EDGE_PX:
            problems.append(f"object {index}: box {box.round(2)} vs its instance mask {from_mask}")
        if np.prod(box[2:] - box[:2]) < 30:  # a sliver: a few pixels of rounding
            continue
        shown = pixel_box(read == class_id)
        outside = (
            None if shown is None else np.concatenate([box[:2] - shown[:2], shown[2:] - box[2:]])
        )
        if (
            shown is None
            or outside.max() > EDGE_PX + BLEND_PX
            or np.abs(shown - box).max() > WEDGE_PX
        ):
            problems.append(f"object {index} (class {class_id}): box {box.round(2)} vs {shown}")
    mask = np.asarray(targets["mask"])[..., 0]
    if not set(np.unique(mask).tolist()) <= {0, *OBJECT_COLOURS, IGNORE}:
        problems.append(f"class mask values {np.unique(mask)}: blended")
    for class_id in OBJECT_COLOURS:
        body = interior(read == class_id)
        agree = float((mask[body] == class_id).mean()) if body.any() else 1.0
        if body.sum() >= 10 and agree < 0.98:
            problems.append(f"class {class_id}: only {agree:.3f} of its pixels in the mask")
        labelled = interior(mask == class_id)
        other = ~np.isin(read[labelled], (class_id, -1, _BLEND))
        if labelled.sum() >= 10 and other.mean() > 0.02:
            problems.append(f"class {class_id}: {other.mean():.3f} of its mask shows another")
    on_colour: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}
    for index, points in enumerate(np.asarray(targets["keypoints"])):
        for k, (y, x) in enumerate(points):
            if targets["keypoint_visibility"][index, k] == 0:
                if (y, x) != (0.0, 0.0):
                    problems.append(f"keypoint {index}/{k}: visibility 0 at {(y, x)}")
                continue
            if not (0 <= y <= 1 and 0 <= x <= 1):
                problems.append(f"keypoint {index}/{k}: visible at {(y, x)}, outside")
                continue
            row, col = min(int(y * height), height - 1), min(int(x * width), width - 1)
            window = image[max(0, row - 1) : row + 2, max(0, col - 1) : col + 2].reshape(-1, 3)
            window = window.astype(np.float64) * (1.0 if image.dtype == np.uint8 else 255.0)
            nearest = [np.linalg.norm(window - np.array(c), axis=-1).min() for c in MARKER_COLOURS]
            if min(nearest) > 110:  # a 3x3 marker blurred by a resize is still this close
                problems.append(f"keypoint {index}/{k} at pixel {(row, col)} is on no marker")
                continue
            on_colour[k].add(int(np.argmin(nearest)))
    # Turns, scales and mirrors that swap the pair keep the way left -> right
    # -> top turns (counter-clockwise on screen); a mirror that did not swap
    # it would reverse it, whatever the flips drawn.
    visibility = np.asarray(targets["keypoint_visibility"])
    for index, points in enumerate(np.asarray(targets["keypoints"], np.float64)):
        if visibility[index].all():
            (ly, lx), (ry, rx), (ty, tx) = points * [height, width]
            if (rx - lx) * (ty - ly) - (ry - ly) * (tx - lx) >= 0:
                problems.append(f"object {index}: left, right, top turn the other way (mirrored)")
    expected = {0: {0}, 1: {1}, 2: {2}} if not mirrored else {0: {1}, 1: {0}, 2: {2}}
    for k, colours in on_colour.items():
        if mirrored is None and k < 2:
            if len(colours) > 1 or colours & on_colour[1 - k]:
                problems.append(f"keypoint {KEYPOINT_NAMES[k]} on markers {colours}")
        elif colours - expected[k]:
            problems.append(f"keypoint {KEYPOINT_NAMES[k]} on markers {colours}, not {expected[k]}")
    return problems


def elements(dataset) -> list[tuple[np.ndarray, dict]]:
    return [
        (image.numpy(), {name: value.numpy() for name, value in targets.items()})
        for image, targets in dataset
    ]


def test_stored_wide_scenes_are_exact(wide_dataset):
    stored = elements(kiln.reader.load(wide_dataset.dataset_dir, augment=None, shuffle=False))
    assert len(stored) == NUM_SCENES
    for image, targets in stored:
        assert image.shape == (HEIGHT, WIDTH, 3)
        assert not check(image, targets, mirrored=False)


def test_the_check_finds_swapped_axes_an_unswapped_pair_and_a_shifted_mask(wide_dataset):
    """The check fails on targets that are wrong in the ways this file guards against."""
    image, targets = elements(kiln.reader.load(wide_dataset.dataset_dir, augment=None))[0]
    swapped = dict(targets, boxes=targets["boxes"][:, [1, 0, 3, 2]])
    assert any("box" in problem for problem in check(image, swapped, mirrored=False))
    # Mirrored pixels and coordinates, the pair left unswapped.
    points = targets["keypoints"].copy()
    points[..., 1] = 1.0 - points[..., 1]
    unswapped = dict(
        targets,
        boxes=np.stack([b[[0, 3, 2, 1]] * [1, -1, 1, -1] + [0, 1, 0, 1] for b in targets["boxes"]]),
        keypoints=points,
        mask=targets["mask"][:, ::-1],
        instance_masks=targets["instance_masks"][:, :, ::-1],
    )
    assert not check(image[:, ::-1], dict(unswapped, keypoints=points[:, [1, 0, 2]]), mirrored=True)
    assert any("left" in problem for problem in check(image[:, ::-1], unswapped, mirrored=True))
    assert any("mirrored" in p for p in check(image[:, ::-1], unswapped, mirrored=None))
    shifted = dict(targets, mask=np.roll(targets["mask"], 3, axis=1))
    assert any("class" in problem for problem in check(image, shifted, mirrored=False))


FLIP_LR = {"random_flip_left_right": {"probability": 1.0}}
FLIP_UD = {"random_flip_up_down": {"probability": 1.0}}
# name: (list, whether every element is mirrored: None when the flips are random).
LISTS = {
    "resized_crop": ([{"random_resized_crop": {"size": [40, 56], "scale_range": [0.3, 1.0]}}], 0),
    "crop_flip_lr": ([{"random_crop": {"size": [40, 50]}}, FLIP_LR], 1),
    "flip_ud": ([FLIP_UD], 1),
    "both_flips": ([FLIP_LR, FLIP_UD], 0),
    "rotation": ([{"random_rotation": {"angle_range": [-30, 30]}}], 0),
    "quarter_turns": ([{"random_rotation": {"angle_range": [80, 100]}}], 0),
    "zoom": ([{"random_zoom": {"factor_range": [0.6, 1.6]}}], 0),
    "chain": (
        [
            {"random_resized_crop": {"size": [40, 64], "scale_range": [0.4, 1.0]}},
            "random_flip_left_right",
            {"random_rotation": {"angle_range": [-20, 20]}},
            "random_flip_up_down",
            {"random_zoom": {"factor_range": [0.8, 1.25]}},
        ],
        None,
    ),
}


@pytest.mark.parametrize("training", [True, False], ids=["random", "inference"])
@pytest.mark.parametrize("name", sorted(LISTS))
def test_targets_follow_wide_images_for_many_seeds(wide_dataset, name, training):
    augment, mirrored = LISTS[name]
    dataset = kiln.reader.load(
        wide_dataset.dataset_dir, seed=4, repeat=3, augment=augment, training=training
    )
    seen = 0
    for index, (image, targets) in enumerate(elements(dataset)):
        # The inference form flips nothing.
        expected = (None if mirrored is None else bool(mirrored)) if training else False
        problems = check(image, targets, mirrored=expected)
        assert not problems, f"{name}, element {index}: {problems}"
        seen += 1
    assert seen == 3 * NUM_SCENES


def test_uint8_and_channels_first_have_the_float_paths_geometry(wide_dataset):
    """The same seed moves the targets alike whatever the output's dtype and
    layout: the same boxes and keypoints, the masks transposed with the
    channels-first image."""
    augment = LISTS["chain"][0]
    kwargs = {"seed": 6, "repeat": 2, "augment": augment, "batch_size": 4}
    path = wide_dataset.dataset_dir
    floats = list(kiln.reader.load(path, **kwargs))
    uint8 = list(kiln.reader.load(path, dtype="uint8", **kwargs))
    first = list(kiln.reader.load(path, data_format="channels_first", **kwargs))
    assert len(floats) == len(uint8) == len(first) == 3
    compared = 0
    for (image, targets), (image8, targets8), (image_cf, targets_cf) in zip(
        floats, uint8, first, strict=True
    ):
        assert image8.dtype == tf.uint8
        levels = np.round(image.numpy() * 255.0)
        assert np.abs(image8.numpy().astype(np.float64) - levels).max() <= 1.0
        np.testing.assert_allclose(np.transpose(image_cf.numpy(), (0, 2, 3, 1)), image.numpy())
        for name in ("boxes", "classes", "keypoints", "keypoint_visibility"):
            for other in (targets8, targets_cf):
                np.testing.assert_array_equal(
                    other[name].flat_values.numpy(), targets[name].flat_values.numpy(), name
                )
        np.testing.assert_array_equal(targets8["mask"].numpy(), targets["mask"].numpy())
        np.testing.assert_array_equal(
            np.transpose(targets_cf["mask"].numpy(), (0, 2, 3, 1)), targets["mask"].numpy()
        )
        for row in range(int(image8.shape[0])):
            one = {name: np.asarray(value[row]) for name, value in targets8.items()}
            one["instance_masks"] = targets8["instance_masks"][row].numpy()
            assert not check(image8[row].numpy(), one, mirrored=None)
            compared += 1
    assert compared == 2 * NUM_SCENES


@pytest.mark.parametrize(
    "transforms",
    [
        [],
        [{"letterbox": {"size": 61}}],
        [{"resize": {"longer_side": 100}}, {"center_crop": {"size": [41, 59]}}],
        [{"pad": {"to_square": True}}, {"resize": {"size": [50, 70]}}],
    ],
    ids=["orientation", "letterbox", "resize_crop", "pad_resize"],
)
def test_stored_targets_follow_every_exif_orientation_and_the_transforms(tmp_path, transforms):
    """The build turns each file upright and transforms it, and its targets
    with it: in the stored records every box, mask and keypoint lies on its
    pixels. Orientations 2, 4, 5 and 7 mirror the pixels, and a mirror image
    swaps the subject's left and right, as the reader's flips do: the file
    was annotated as stored, a mirror image of the scene viewers see, so
    "left" moves to the other marker (flip_pairs)."""
    result = build_scenes(str(tmp_path), 8, transforms, orientations=True)
    dataset = kiln.reader.load(result.dataset_dir, augment=None, as_supervised=False)
    seen = set()
    for element in dataset:
        element = {name: value.numpy() for name, value in element.items()}
        index = int(element["key"].decode().split("_")[1].split(".")[0])
        orientation = index % 8 + 1
        image = element["image"]
        if not transforms:
            sideways = orientation >= 5
            assert image.shape[:2] == ((WIDTH, HEIGHT) if sideways else (HEIGHT, WIDTH))
        problems = check(image, element, mirrored=orientation in (2, 4, 5, 7))
        assert not problems, f"orientation {orientation}: {problems}"
        seen.add(orientation)
    assert seen == set(range(1, 9))


@pytest.mark.parametrize("max_objects", [None, 4])
def test_model_layer_moves_wide_targets_as_the_data_path(wide_dataset, max_objects):
    """`load_for_model`'s layer, given the same seeds, gives the data path's
    images and targets on wide images too (ragged, or padded as on a TPU)."""
    kwargs = {"batch_size": 3, "seed": 2, "augment": LISTS["chain"][0], "max_objects": max_objects}
    path = wide_dataset.dataset_dir
    data = kiln.reader.load(path, **kwargs)
    model_dataset, layer = kiln.reader.load_for_model(path, **kwargs)
    step = tf.function(lambda inputs, targets: layer(dict(inputs, targets=targets), training=True))
    checked = 0
    for (images, targets), (inputs, raw) in zip(data, model_dataset, strict=True):
        layer_images, layer_targets = step(inputs, raw)
        np.testing.assert_allclose(layer_images.numpy(), images.numpy(), atol=1e-6)
        scene_records.assert_same_targets(targets, layer_targets)
        for row in range(int(layer_images.shape[0])):
            count = None if max_objects is None else int(layer_targets["num_objects"][row])
            one = {}
            for name, value in layer_targets.items():
                one[name] = np.asarray(value[row])
                if count is not None and name in ("boxes", "classes", "keypoints"):
                    one[name] = one[name][:count]
            if count is not None:
                one["keypoint_visibility"] = one["keypoint_visibility"][:count]
                one["instance_masks"] = one["instance_masks"][:count]
            assert not check(layer_images[row].numpy(), one, mirrored=None)
            checked += 1
    assert checked == NUM_SCENES
