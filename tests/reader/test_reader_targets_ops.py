"""Targets follow every augmentation: the kernels and the ops on exactly known scenes.

Kernel tier: tensors made here (`scenes`), not read from a build; the same
checks run on a real `kiln build` in test_reader_targets.py.

The geometric ops resample with nearest-neighbour here: every output pixel
is then one input pixel, so the shapes read back from the pixels are exact
(bilinear blends edge pixels, which would make the "truth" itself uncertain
by a pixel). The target geometry does not depend on the interpolation: the
ops move targets with the same transform whichever they use.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import runpy

import numpy as np
import pytest
import tensorflow as tf

from kiln.reader import register_augmentation
from kiln.reader.augmenter import Augmenter, AugmentOpError
from kiln.reader.ops import AUGMENTATIONS, validate
from kiln.reader.targets import (
    BatchTargets,
    ElementTargets,
    TargetError,
    TargetSpec,
    move_batch_objects,
    pad_objects,
)
from reader import scenes

SPEC = TargetSpec(
    kinds=("boxes", "mask", "instance_masks", "keypoints"),
    keypoint_names=scenes.KEYPOINT_NAMES,
    flip_pairs=((0, 1),),
    min_visibility=0.25,
    ignore_value=255,
)
BOXES_ONLY = TargetSpec(
    kinds=("boxes", "keypoints"),
    keypoint_names=scenes.KEYPOINT_NAMES,
    flip_pairs=((0, 1),),
    min_visibility=0.25,
)
NAMES = ("boxes", "classes", "keypoints", "keypoint_visibility", "mask", "instance_masks")

GEOMETRIC_LISTS = {
    "resized_crop": [
        {"random_resized_crop": {"size": 48, "scale_range": [0.3, 1.0], "method": "nearest"}}
    ],
    "crop": [{"random_crop": {"size": 40}}],
    "flip_lr": [{"random_flip_left_right": {"probability": 1.0}}],
    "flip_ud": [{"random_flip_up_down": {"probability": 1.0}}],
    "rotation": [{"random_rotation": {"angle_range": [-30, 30], "interpolation": "nearest"}}],
    "zoom": [{"random_zoom": {"factor_range": [0.7, 1.4], "interpolation": "nearest"}}],
    "erasing": [{"random_erasing": {"probability": 1.0, "erase_targets": True}}],
    "chain": [
        {"random_resized_crop": {"size": 56, "scale_range": [0.5, 1.0], "method": "nearest"}},
        "random_flip_left_right",
        {"random_rotation": {"angle_range": [-20, 20], "interpolation": "nearest"}},
        "random_flip_up_down",
    ],
}
SEEDS = 24


def element(spec: TargetSpec = SPEC, variant: int = 0) -> tuple[tf.Tensor, ElementTargets]:
    data = scenes.scene(variant)
    names = [n for n in NAMES if n in spec.names or n in spec.object_columns]
    return tf.constant(data["image"]), ElementTargets(
        {name: tf.constant(data[name]) for name in names}, spec
    )


def numpy_targets(targets: ElementTargets) -> dict:
    return {name: value.numpy() for name, value in targets.tensors.items()}


def run(ops, seed, spec=SPEC, variant=0):
    augmenter = Augmenter(tuple(validate(ops)), training=True)
    image, targets = element(spec, variant)

    @tf.function
    def apply(image, seed):
        out, moved = augmenter.apply_with_targets(image, targets, seed)
        return out, dict(moved.tensors)

    out, moved = apply(image, tf.constant(seed, tf.int32))
    return out.numpy(), {name: value.numpy() for name, value in moved.items()}


@pytest.mark.parametrize("name", sorted(GEOMETRIC_LISTS))
@pytest.mark.parametrize("spec", [SPEC, BOXES_ONLY], ids=["masks", "boxes"])
def test_targets_follow_the_pixels(name, spec):
    ops = GEOMETRIC_LISTS[name]
    augmenter = Augmenter(tuple(validate(ops)), training=True)
    image, targets = element(spec)
    apply = tf.function(
        lambda image, seed: (lambda out: (out[0], dict(out[1].tensors)))(
            augmenter.apply_with_targets(image, targets, seed)
        )
    )
    plain = tf.function(augmenter.apply)
    for index in range(SEEDS):
        seed = tf.constant([7, index], tf.int32)
        out, moved = apply(image, seed)
        checked = {k: v.numpy() for k, v in moved.items()}
        if name == "erasing":  # boxes keep the object's extent by design: check the rest
            checked.update(boxes=np.zeros((0, 4)), classes=np.zeros((0,), np.int64))
        # "chain" resamples twice (crop, then rotation): see check_element.
        problems = scenes.check_element(out.numpy(), checked, iou_side=40 if name == "chain" else 0)
        assert not problems, f"{name}, seed {index}: {problems}"
        # The image is the one the op makes without targets.
        np.testing.assert_array_equal(out.numpy(), plain(image, seed).numpy())


def test_colour_ops_leave_targets_alone():
    ops = ["color_jitter", "random_grayscale", {"random_brightness": {"max_delta": 0.3}}]
    _, moved = run(ops, [1, 1])
    data = scenes.scene()
    for name in NAMES:
        np.testing.assert_array_equal(moved[name], data[name])


def test_same_seed_same_targets_and_seeds_differ():
    ops = GEOMETRIC_LISTS["chain"]
    first = run(ops, [3, 4])
    again = run(ops, [3, 4])
    other = run(ops, [3, 5])
    for name in first[1]:
        np.testing.assert_array_equal(first[1][name], again[1][name])
    assert not np.array_equal(first[1]["boxes"], other[1]["boxes"])


def test_crop_moves_clips_and_drops_by_min_visibility():
    spec = TargetSpec(
        kinds=("boxes", "keypoints"),
        fields=("iscrowd",),
        keypoint_names=("a",),
        min_visibility=0.25,
    )
    targets = ElementTargets(
        {
            # pixels of a 100x100 image: [10, 50) x [10, 50), and one mostly left of the window
            "boxes": tf.constant([[0.1, 0.1, 0.5, 0.5], [0.6, 0.0, 0.7, 0.35]], tf.float32),
            "classes": tf.constant([1, 2], tf.int64),
            "iscrowd": tf.constant([0, 1], tf.int64),
            "keypoints": tf.constant([[[0.3, 0.4]], [[0.65, 0.1]]], tf.float32),
            "keypoint_visibility": tf.constant([[2], [2]], tf.int64),
        },
        spec,
    )
    cropped = numpy_targets(
        targets.crop(tf.constant([20, 30]), tf.constant([50, 50]), tf.constant([100, 100]))
    )
    # Box 0 keeps 30x20 of 40x40 pixels (0.375): kept, clipped. Box 1 keeps
    # 10x5 of 10x35 (0.14): dropped with its class, field and keypoints.
    np.testing.assert_allclose(cropped["boxes"], [[0.0, 0.0, 0.6, 0.4]], atol=1e-6)
    np.testing.assert_array_equal(cropped["classes"], [1])
    np.testing.assert_array_equal(cropped["iscrowd"], [0])
    np.testing.assert_allclose(cropped["keypoints"], [[[0.2, 0.2]]], atol=1e-6)
    # A keypoint left outside the window: visibility 0, no position (0, 0), as offline.
    keep_all = ElementTargets(targets.tensors, dataclasses.replace(spec, min_visibility=0.0))
    outside = numpy_targets(
        keep_all.crop(tf.constant([0, 45]), tf.constant([100, 55]), tf.constant([100, 100]))
    )
    np.testing.assert_array_equal(outside["classes"], [1])  # box 1 has nothing left
    assert outside["keypoint_visibility"][0, 0] == 0
    np.testing.assert_array_equal(outside["keypoints"][0, 0], [0.0, 0.0])


def test_flip_swaps_keypoint_pairs_onto_the_mirrored_markers():
    image, moved = run([{"random_flip_left_right": {"probability": 1.0}}], [1, 2])
    data = scenes.scene()
    # Index 0 ("left") now sits where the right marker's mirror is: yellow.
    for index in range(len(data["boxes"])):
        y, x = moved["keypoints"][index, 0]
        pixel = image[int(y * scenes.SIZE), int(x * scenes.SIZE)]
        np.testing.assert_allclose(pixel * 255, scenes.MARKER_COLOURS[1], atol=1)
    np.testing.assert_allclose(moved["boxes"][:, [1, 3]], 1.0 - data["boxes"][:, [3, 1]], atol=1e-6)


def test_rotation_boxes_enclose_rotated_corners_without_masks():
    # A 45 degree turn: without instance masks the box is the rotated
    # corners' box; for a rectangle that is the rotated shape's tight box.
    ops = [{"random_rotation": {"angle_range": [45, 45], "interpolation": "nearest"}}]
    image, moved = run(ops, [0, 0], spec=BOXES_ONLY)
    assert not scenes.check_element(image, moved)


def test_erasing_leaves_targets_alone_unless_asked():
    ops = [{"random_erasing": {"probability": 1.0, "scale_range": [0.3, 0.3]}}]
    _, kept = run(ops, [5, 5])
    data = scenes.scene()
    np.testing.assert_array_equal(kept["boxes"], data["boxes"])
    np.testing.assert_array_equal(kept["mask"], data["mask"])
    asked = [
        {"random_erasing": {"probability": 1.0, "scale_range": [0.3, 0.3], "erase_targets": True}}
    ]
    image, erased = run(asked, [5, 5])
    black = np.all(image == 0.0, axis=-1) & (data["mask"][..., 0] > 0)
    assert black.any()
    assert np.all(erased["mask"][..., 0][black] == 255)


def test_mask_is_never_blended():
    image, moved = run(GEOMETRIC_LISTS["chain"], [9, 9])
    assert set(np.unique(moved["mask"])) <= {0, 1, 2, 3, 255}
    assert set(np.unique(moved["instance_masks"])) <= {0, 1}


@pytest.fixture
def user_ops():
    """Registers test ops; removes them afterwards so tests stay independent."""
    before = set(AUGMENTATIONS.names())
    yield
    for name in set(AUGMENTATIONS.names()) - before:
        AUGMENTATIONS.remove(name)


def _register(name, **declaration):
    def shift(image, seed, *, pixels: int = 3):
        draw = tf.random.stateless_uniform([], seed, 0, 2, tf.int32)
        return tf.roll(image, shift=pixels + draw, axis=1)

    register_augmentation(name, **declaration)(shift)


@pytest.mark.usefixtures("user_ops")
def test_user_op_without_target_handling_is_refused_for_geometric_targets():
    _register("test_shift_refused")
    augmenter = Augmenter(tuple(validate(["test_shift_refused"])))
    with pytest.raises(TargetError, match=r"test_shift_refused.*may move pixels.*no longer match"):
        augmenter.check_targets(SPEC)
    # Datasets without geometric targets take it.
    augmenter.check_targets(TargetSpec(kinds=("labels",)))


@pytest.mark.usefixtures("user_ops")
def test_user_op_declaring_no_geometry_or_its_targets_is_accepted():
    _register("test_shift_colour", geometric=False)
    Augmenter(tuple(validate(["test_shift_colour"]))).check_targets(SPEC)
    _register(
        "test_shift_boxes",
        with_targets=lambda image, targets, seed, *, pixels: (image, targets),
        supports=["boxes"],
    )
    with pytest.raises(TargetError, match=r"handles targets \['boxes'\] only.*'mask'"):
        Augmenter(tuple(validate(["test_shift_boxes"]))).check_targets(SPEC)
    with pytest.raises(ValueError, match="with_targets needs supports"):
        register_augmentation("test_no_supports", with_targets=lambda *a, **k: a)


def _flip_op(name, targets_form):
    """A user op whose image form draws from its seed and whose with_targets
    form is `targets_form(image, targets, seed) -> (image, targets)`."""

    def flip(image, seed):
        return tf.where(tf.random.stateless_uniform([], seed) < 0.5, image[:, ::-1], image)

    register_augmentation(
        name, with_targets=targets_form, supports=["boxes", "mask", "instance_masks", "keypoints"]
    )(flip)


def _mirrored(image, targets, flip):
    return tf.where(flip, image[:, ::-1], image), targets.flip_left_right(flip)


def traced(ops, seed):
    """`run` traced as tf.data traces a map (no autograph, whose StagingError
    would wrap what the ops raise)."""
    augmenter = Augmenter(tuple(validate(ops)), training=True)
    image, targets = element()
    apply = tf.function(
        lambda image, seed: (lambda out: (out[0], dict(out[1].tensors)))(
            augmenter.apply_with_targets(image, targets, seed)
        ),
        autograph=False,
    )
    out, moved = apply(image, tf.constant(seed, tf.int32))
    return out.numpy(), {name: value.numpy() for name, value in moved.items()}


@pytest.mark.usefixtures("user_ops")
def test_the_with_targets_form_is_checked_for_its_randomness_on_first_use():
    """On a dataset with targets the with_targets form is what runs: its
    randomness must be its seed's, as the image form's is (checked on test
    targets of the dataset's kinds). Both forms here draw their coin; only
    the with_targets form does it wrongly."""
    import random

    _flip_op(
        "test_stateful_targets",
        lambda image, targets, seed: _mirrored(image, targets, tf.random.uniform([]) < 0.5),
    )
    _flip_op(
        "test_python_targets",
        lambda image, targets, seed: _mirrored(image, targets, tf.constant(random.random() < 0.5)),
    )
    _flip_op(
        "test_seeded_targets",
        lambda image, targets, seed: _mirrored(
            image, targets, tf.random.stateless_uniform([], seed) < 0.5
        ),
    )

    with pytest.raises(AugmentOpError, match="'test_stateful_targets' gave different outputs"):
        traced(["test_stateful_targets"], [1, 2])
    with pytest.raises(AugmentOpError, match="'test_python_targets' ignores its seed"):
        traced(["test_python_targets"], [1, 2])
    flips = {traced(["test_seeded_targets"], [1, seed])[1]["boxes"][0, 1] for seed in range(8)}
    assert len(flips) == 2  # mirrored for some seeds, not for others


@pytest.mark.usefixtures("user_ops")
def test_a_with_targets_form_that_returns_something_else_is_refused_naming_the_op():
    _flip_op("test_image_only", lambda image, targets, seed: image)
    _flip_op("test_dict", lambda image, targets, seed: (image, dict(targets.tensors)))

    with pytest.raises(
        AugmentOpError,
        match=r"the with_targets form of augmentation op 'test_image_only' returned a tensor; "
        r"it returns \(image, targets\)",
    ):
        traced(["test_image_only"], [1, 2])
    with pytest.raises(
        AugmentOpError,
        match=r"'test_dict' returned a tuple of tensor, dict; it returns \(image, targets\)",
    ):
        traced(["test_dict"], [1, 2])


@pytest.mark.parametrize("axis", [1, 0])
def test_a_mirror_through_warp_swaps_flip_pairs_as_the_flips_do(axis):
    """`ElementTargets.warp` is how a user op moves targets by any affine map;
    one that mirrors swaps the subject's left and right as kiln's flips do."""
    image, targets = element()
    height, width = image.shape[:2]
    # Each output pixel's source, in TF's convention: x -> W - 1 - x (or y).
    mirror = (
        [-1.0, 0.0, width - 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
        if axis == 1
        else [1.0, 0.0, 0.0, 0.0, -1.0, height - 1.0, 0.0, 0.0]
    )
    warped = targets.warp(tf.constant(mirror), tf.shape(image)[:2], fill_mode="constant")
    flipped = targets.flip_left_right() if axis == 1 else targets.flip_up_down()
    flipped = flipped.materialized()
    for name in ("keypoints", "keypoint_visibility", "boxes", "mask"):
        np.testing.assert_allclose(
            warped.tensors[name].numpy(), flipped.tensors[name].numpy(), atol=1e-5, err_msg=name
        )
    # A turn is no mirror: the pairs keep their names.
    turned = targets.warp(
        tf.constant([1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0]),  # a shift by 2 columns
        tf.shape(image)[:2],
        fill_mode="constant",
    )
    kept = turned.tensors["keypoint_visibility"].numpy() > 0
    shifted = targets.tensors["keypoints"].numpy() - [0.0, 2.0 / width]
    np.testing.assert_allclose(turned.tensors["keypoints"].numpy()[kept], shifted[kept], atol=1e-5)


def _crop_op(name, **declaration):
    """A user crop: a random window in training, the centre one otherwise."""

    def offset(shape, seed, size):
        top = tf.random.stateless_uniform([], seed, 0, shape[0] - size + 1, tf.int32)
        left = tf.random.stateless_uniform([], seed[::-1], 0, shape[1] - size + 1, tf.int32)
        return tf.stack([top, left])

    def window(image, corner, size):
        return tf.slice(image, tf.concat([corner, [0]], 0), [size, size, -1])

    def crop(image, seed, *, size: int = 40):
        return window(image, offset(tf.shape(image)[:2], seed, size), size)

    def crop_targets(image, targets, seed, *, size: int = 40):
        shape = tf.shape(image)[:2]
        corner = offset(shape, seed, size)
        return window(image, corner, size), targets.crop(corner, tf.constant([size, size]), shape)

    def centre(image, *, size: int = 40):
        return window(image, (tf.shape(image)[:2] - size) // 2, size)

    def centre_targets(image, targets, *, size: int = 40):
        shape = tf.shape(image)[:2]
        corner = (shape - size) // 2
        return window(image, corner, size), targets.crop(corner, tf.constant([size, size]), shape)

    kinds = ["boxes", "mask", "instance_masks", "keypoints"]
    forms = {"with_targets": crop_targets, "supports": kinds, "inference": centre}
    if declaration.pop("centre_targets", True):
        forms["inference_with_targets"] = centre_targets
    register_augmentation(name, **forms, **declaration)(crop)


@pytest.mark.usefixtures("user_ops")
def test_a_user_crop_moves_targets_in_its_inference_form_too():
    """A user op that changes the size needs an inference form (other splits get
    that size too); on a dataset with targets that form moves pixels, so it
    needs a targets form as well: `inference_with_targets`."""
    _crop_op("test_crop_no_targets", centre_targets=False)
    with pytest.raises(
        TargetError, match=r"augment\[0\]\.test_crop_no_targets: .*inference_with_targets=fn"
    ):
        Augmenter(tuple(validate(["test_crop_no_targets"])), training=False).check_targets(SPEC)

    _crop_op("test_crop")
    evaluation = Augmenter(tuple(validate(["test_crop"])), training=False)
    evaluation.check_targets(SPEC)
    image, targets = element()
    out, moved = evaluation.apply_with_targets(image, targets, None)
    assert out.shape[:2] == (40, 40)
    problems = scenes.check_element(out.numpy(), numpy_targets(moved))
    assert not problems, problems
    # Training crops at random, the targets alike.
    for seed in range(4):
        out, moved = traced(["test_crop"], [3, seed])
        assert not scenes.check_element(out, moved)
    with pytest.raises(ValueError, match="inference_with_targets is the targets' form"):
        register_augmentation("test_half", inference_with_targets=lambda *a, **k: a)


def test_mixup_is_refused_naming_the_target_and_cutmix_is_not():
    with pytest.raises(TargetError, match=r"mixup.*'boxes'"):
        Augmenter(tuple(validate(["mixup"]))).check_targets(BOXES_ONLY)
    Augmenter(tuple(validate(["cutmix"]))).check_targets(SPEC)


def test_cutmix_pastes_masks_boxes_and_keypoints_with_the_pixels():
    batch = [scenes.scene(v) for v in range(4)]
    images = tf.constant(np.stack([b["image"] for b in batch]).astype(np.float32) / 255.0)

    def ragged(name, dtype):
        return tf.RaggedTensor.from_tensor(tf.constant(np.stack([b[name] for b in batch]), dtype))

    tensors = {
        "boxes": ragged("boxes", tf.float32),
        "classes": ragged("classes", tf.int64),
        "keypoints": ragged("keypoints", tf.float32),
        "keypoint_visibility": ragged("keypoint_visibility", tf.int64),
        "instance_masks": ragged("instance_masks", tf.uint8),
        "mask": tf.constant(np.stack([b["mask"] for b in batch])),
    }
    augmenter = Augmenter(tuple(validate([{"cutmix": {"alpha": 1.0}}])))
    pasted_somewhere = False
    for index in range(6):
        seeds = tf.constant([[1, index]] * 4, tf.int32)
        mixed_images, mixed = augmenter.apply_batch_with_targets(
            images, BatchTargets(tensors, SPEC), seeds
        )
        plain, _ = augmenter.apply_batch(images, tf.zeros([4, 4]), seeds)
        np.testing.assert_array_equal(mixed_images.numpy(), plain.numpy())
        for element in range(4):
            one = {name: value[element].numpy() for name, value in mixed.tensors.items()}
            pasted_somewhere |= len(one["boxes"]) != 3
            # Own boxes keep their extent while the paste hides part of the
            # object: the boxes are checked against the instance masks only.
            for box, instance in zip(one["boxes"], one["instance_masks"], strict=True):
                from_mask = scenes.pixel_box(instance[..., 0] > 0)
                assert from_mask is not None
                assert np.all(from_mask[:2] >= box[:2] - 1e-6)
                assert np.all(from_mask[2:] <= box[2:] + 1e-6)
            checked = dict(one, boxes=np.zeros((0, 4)), classes=np.zeros((0,), np.int64))
            del checked["instance_masks"]
            problems = scenes.check_element(mixed_images[element].numpy(), checked)
            assert not problems, (index, element, problems)
    assert pasted_somewhere


def test_pad_objects_to_static_shapes():
    spec = TargetSpec(kinds=("boxes",))
    boxes = tf.ragged.constant([[[0.1, 0.1, 0.2, 0.2]], []], ragged_rank=1, dtype=tf.float32)
    classes = tf.ragged.constant([[3], []], dtype=tf.int64)
    padded = pad_objects({"boxes": boxes, "classes": classes}, spec, 3, batched=True)
    assert padded["boxes"].shape.as_list() == [2, 3, 4]
    np.testing.assert_array_equal(padded["classes"].numpy(), [[3, -1, -1], [-1, -1, -1]])
    np.testing.assert_array_equal(padded["num_objects"].numpy(), [1, 0])
    one = pad_objects(
        {"boxes": tf.zeros([5, 4]), "classes": tf.range(5, dtype=tf.int64)}, spec, 3, batched=False
    )
    np.testing.assert_array_equal(one["classes"].numpy(), [0, 1, 2])
    assert int(one["num_objects"]) == 3


def test_deferred_mask_moves_equal_moving_the_masks_one_by_one():
    # Crops, flips and nearest-neighbour resizes composed on a `MaskGrid`
    # must give the bytes of slicing, reversing and tf.image.resize.
    rng = np.random.default_rng(3)
    spec = TargetSpec(kinds=("boxes", "mask", "instance_masks"))
    for case in range(12):
        height, width = (int(v) for v in rng.integers(5, 60, 2))
        tensors = {
            "boxes": tf.zeros([2, 4]),
            "classes": tf.zeros([2], tf.int64),
            "mask": tf.constant(rng.integers(0, 256, (height, width, 1)), tf.uint8),
            "instance_masks": tf.constant(rng.integers(0, 2, (2, height, width, 1)), tf.uint8),
        }
        eager = ElementTargets(tensors, spec)
        deferred = eager.deferring_moves()
        size = tf.constant([int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))])
        offset = tf.constant(
            [int(rng.integers(0, height - size[0] + 1)), int(rng.integers(0, width - size[1] + 1))]
        )
        shape = tf.constant([height, width])
        output = [int(v) for v in rng.integers(1, 90, 2)]
        flips = tf.constant(bool(case % 2))
        moved = []
        for targets in (eager, deferred):
            targets = targets.crop(offset, size, shape).flip_left_right(when=flips)
            targets = targets.flip_up_down().resize_masks(output)
            moved.append(targets.materialized())
        assert moved[1].grid is None
        for name in ("mask", "instance_masks"):
            np.testing.assert_array_equal(
                moved[1].tensors[name].numpy(), moved[0].tensors[name].numpy(), err_msg=name
            )


def _traced_crop_flip_resize(mask_shape, output):
    """The ops of a leading crop, a random horizontal flip and a resize of a
    class mask of static `mask_shape`, deferred, and the function itself."""
    spec = TargetSpec(kinds=("mask",))

    @tf.function(
        input_signature=[
            tf.TensorSpec([*mask_shape, 1], tf.uint8),
            tf.TensorSpec([2], tf.int32),
            tf.TensorSpec([2], tf.int32),
            tf.TensorSpec([], tf.bool),
        ]
    )
    def moved(mask, offset, size, when):
        targets = ElementTargets({"mask": mask}, spec).deferring_moves()
        targets = targets.crop(offset, size, tf.shape(mask)[:2]).flip_left_right(when=when)
        return targets.resize_masks(output).materialized().tensors["mask"]

    graph = moved.get_concrete_function().graph
    return graph.get_operations(), moved


@pytest.mark.parametrize(("mask_shape", "output"), [((24, 30), [24, 24]), ((24, 30), [32, 40])])
def test_a_leading_crop_enlarged_moves_the_windows_columns_first(mask_shape, output):
    # The augmenter's crop, flip and resize of a mask no taller than the
    # output: the window is cut out and its columns gathered first (the
    # transposes then move the window's bytes, not output rows x mask
    # width), and the indices need no gathers of their own (two in all: the
    # sample's).
    ops, moved = _traced_crop_flip_resize(mask_shape, output)
    types = [op.type for op in ops]
    assert types.count("GatherV2") == 2
    window = next(op for op in ops if op.type == "Slice" and op.inputs[0].dtype == tf.uint8)
    first_transpose = next(op for op in ops if op.type == "Transpose")
    assert first_transpose.inputs[0].op is window
    rng = np.random.default_rng(4)
    mask = tf.constant(rng.integers(0, 256, (*mask_shape, 1)), tf.uint8)
    spec = TargetSpec(kinds=("mask",))
    for case in range(8):
        size = [int(rng.integers(1, mask_shape[0] + 1)), int(rng.integers(1, mask_shape[1] + 1))]
        offset = [int(rng.integers(0, mask_shape[i] - size[i] + 1)) for i in (0, 1)]
        when = tf.constant(bool(case % 2))
        eager = ElementTargets({"mask": mask}, spec).crop(
            tf.constant(offset), tf.constant(size), tf.constant(list(mask_shape))
        )
        expected = eager.flip_left_right(when=when).resize_masks(output).tensors["mask"]
        got = moved(mask, tf.constant(offset), tf.constant(size), when)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_a_leading_crop_made_smaller_moves_the_rows_first():
    # An output shorter than the mask: rows first, as before (the window's
    # columns first would transpose more bytes).
    ops, _ = _traced_crop_flip_resize((40, 30), [24, 24])
    gather = next(op for op in ops if op.type == "GatherV2")
    assert gather.inputs[0].op.type != "Transpose"
    assert [op.type for op in ops].count("Transpose") == 2


def test_deferred_object_moves_equal_moving_each_element_and_each_batch():
    # The leading crop's and its flips' moves of boxes and keypoints, applied
    # at once (no deferral), deferred per element, and deferred to a batch
    # (`move_batch_objects`, as the reader does) give the same objects and values.
    rng = np.random.default_rng(5)
    spec = dataclasses.replace(BOXES_ONLY, fields=("iscrowd",))
    shape = tf.constant([60, 80])
    at_once, per_element, deferred = [], [], []
    for case in range(6):
        count = int(rng.integers(0, 5))
        low = rng.uniform(0.0, 0.8, (count, 2))
        boxes = np.concatenate([low, low + rng.uniform(0.01, 0.5, (count, 2))], 1)
        stored = ElementTargets(
            {
                "boxes": tf.constant(boxes, tf.float32),
                "classes": tf.constant(rng.integers(0, 9, count), tf.int64),
                "iscrowd": tf.constant(rng.integers(0, 2, count), tf.int64),
                "keypoints": tf.constant(rng.uniform(0, 1, (count, 2, 2)), tf.float32),
                "keypoint_visibility": tf.constant(rng.integers(0, 3, (count, 2)), tf.int64),
            },
            spec,
        )
        size = tf.constant([int(rng.integers(10, 61)), int(rng.integers(10, 81))])
        offset = tf.constant(
            [int(rng.integers(0, 61 - int(size[0]))), int(rng.integers(0, 81 - int(size[1])))]
        )
        flips = tf.constant(bool(case % 2))
        moved = []
        for targets in (stored, stored.deferring_moves()):
            targets = targets.crop(offset, size, shape).flip_left_right(when=flips)
            moved.append(targets.flip_up_down())
        at_once.append(moved[0].tensors)
        per_element.append(moved[1].materialized().tensors)
        deferred.append(moved[1])
    window = tf.stack([t.moves.as_tensors()[0] for t in deferred])
    whens = tf.stack([t.moves.as_tensors()[1] for t in deferred])
    columns = {  # as ragged_batch makes them: [B, (N), ...], ragged in N only
        name: tf.RaggedTensor.from_row_lengths(
            tf.concat([t.tensors[name] for t in deferred], 0),
            [len(t.tensors[name]) for t in deferred],
        )
        for name in spec.object_columns
    }
    batch = move_batch_objects(columns, spec, window, whens, deferred[0].moves.flip_axes)
    for name in spec.object_columns:
        for index, expected in enumerate(at_once):
            np.testing.assert_array_equal(
                per_element[index][name].numpy(), expected[name].numpy(), err_msg=name
            )
            np.testing.assert_array_equal(
                batch[name][index].numpy(), expected[name].numpy(), err_msg=name
            )
    assert sum(len(t["boxes"]) for t in at_once) < sum(len(t.tensors["boxes"]) for t in deferred)


def _documented_user_ops() -> str:
    """docs/augmentations.md's example of user ops moving targets (the `random_shift` block)."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "augmentations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    [block] = [b for b in blocks if '"random_shift"' in b]
    return block


@pytest.mark.usefixtures("user_ops")
def test_documented_random_shift_moves_targets_with_the_pixels(tmp_path):
    # A real file, as a plugin module is: AutoGraph reads the functions' source.
    module = tmp_path / "documented_ops.py"
    module.write_text(_documented_user_ops())
    runpy.run_path(str(module))
    ops = [{"random_shift": {"max_pixels": 12}}]
    augmenter = Augmenter(tuple(validate(ops)), training=True)
    image, targets = element()
    apply = tf.function(
        lambda image, seed: (lambda out: (out[0], dict(out[1].tensors)))(
            augmenter.apply_with_targets(image, targets, seed)
        )
    )
    plain = tf.function(augmenter.apply)
    boxes = []
    for index in range(SEEDS):
        seed = tf.constant([5, index], tf.int32)
        out, moved = apply(image, seed)
        checked = {name: value.numpy() for name, value in moved.items()}
        problems = scenes.check_element(out.numpy(), checked)
        assert not problems, f"seed {index}: {problems}"
        np.testing.assert_array_equal(out.numpy(), plain(image, seed).numpy())
        again_image, again = apply(image, seed)
        np.testing.assert_array_equal(again_image.numpy(), out.numpy())
        for name, value in again.items():
            np.testing.assert_array_equal(value.numpy(), checked[name])
        boxes.append(checked["boxes"])
    # The shift is drawn per seed: the boxes do move.
    assert len({box.round(4).tobytes() for box in boxes}) > SEEDS // 2


def _triangle_batch(size: int = 32):
    """Four images of objects whose instance masks fill only part of their
    boxes (triangles), one filled box, and one with an empty stored mask;
    each object of its own class id, to follow it through the paste."""
    rows, cols = np.mgrid[0:size, 0:size]

    def box_mask(top, left, bottom, right, shape):
        inside = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
        r, c = (rows - top) / (bottom - top), (cols - left) / (right - left)
        part = {"upper_left": r + c < 1.0, "lower_right": r + c >= 1.0, "full": r >= 0.0}
        return inside & part[shape] if shape else np.zeros_like(inside)

    layouts = [
        ((2, 2, 22, 22, "upper_left"), (10, 10, 30, 30, "lower_right"), (3, 22, 12, 31, "full")),
        ((0, 8, 24, 32, "lower_right"), (8, 0, 32, 24, "upper_left"), (24, 24, 31, 31, None)),
    ]
    images, boxes, masks, classes = [], [], [], []
    for index in range(4):
        layout = layouts[index % 2]
        flip = index >= 2
        image_masks, image_boxes = [], []
        for top, left, bottom, right, shape in layout:
            mask = box_mask(top, left, bottom, right, shape)
            box = np.array([top, left, bottom, right], np.float32) / size
            if flip:  # mirrored left-right
                mask = mask[:, ::-1]
                box = np.array([box[0], 1.0 - box[3], box[2], 1.0 - box[1]], np.float32)
            image_masks.append(mask)
            image_boxes.append(box)
        images.append(np.full((size, size, 3), index / 4.0, np.float32))
        boxes.append(np.stack(image_boxes))
        masks.append(np.stack(image_masks)[..., None].astype(np.uint8))
        classes.append(10 * index + np.arange(len(layout)))
    tensors = {
        "boxes": tf.ragged.constant(boxes, ragged_rank=1, dtype=tf.float32),
        "classes": tf.ragged.constant(classes, dtype=tf.int64),
        "instance_masks": tf.RaggedTensor.from_tensor(tf.constant(np.stack(masks))),
    }
    return tf.constant(np.stack(images)), tensors, np.stack(masks)[..., 0] > 0, boxes


def _shown_by_box(box, region, own: bool, min_visibility: float) -> bool:
    def area(b):
        return max(b[2] - b[0], 0.0) * max(b[3] - b[1], 0.0)

    clipped = [max(box[0], region[0]), max(box[1], region[1])]
    clipped += [min(box[2], region[2]), min(box[3], region[3])]
    if own:
        hidden = area(clipped) / area(box)
        return hidden < 1.0 and 1.0 - hidden >= min_visibility
    return area(clipped) > 0.0 and area(clipped) / area(box) >= min_visibility


def test_cutmix_judges_objects_by_their_instance_masks_as_erasing_does():
    # random_erasing(erase_targets) keeps an object when at least
    # min_visibility of its instance mask shows; cutmix the same, for its own
    # objects (outside the rectangle) and its partner's (inside): a triangle
    # whose box mostly shows but whose pixels are mostly covered is dropped.
    from kiln.reader import mixing

    spec = TargetSpec(kinds=("boxes", "instance_masks"), min_visibility=0.25)
    images, tensors, masks, boxes = _triangle_batch()
    with_targets = validate(["cutmix"])[0].definition.with_targets
    box_rule_differs = 0
    for index in range(40):
        seed = tf.constant([7, index], tf.int32)
        inside, partners, _, region = mixing._cutmix_region(
            images, seed, alpha=1.0, probability=1.0
        )
        _, mixed = with_targets(
            images, BatchTargets(tensors, spec), seed, alpha=1.0, probability=1.0
        )
        inside, partners, region = inside.numpy(), partners.numpy(), region.numpy()
        for element in range(4):
            expected_classes, expected_masks = [], []
            for source, own in ((element, True), (int(partners[element]), False)):
                for k, mask in enumerate(masks[source]):
                    shows = mask & ~inside if own else mask & inside
                    by_box = _shown_by_box(boxes[source][k], region, own, spec.min_visibility)
                    if mask.any():
                        kept = bool(shows.any()) and shows.sum() >= 0.25 * mask.sum()
                        box_rule_differs += kept != by_box
                    else:  # an empty stored mask: judged by the box
                        kept = by_box
                    if kept:
                        expected_classes.append(10 * source + k)
                        expected_masks.append(shows)
            got = {name: value[element].numpy() for name, value in mixed.tensors.items()}
            assert list(got["classes"]) == expected_classes, (index, element)
            np.testing.assert_array_equal(
                got["instance_masks"][..., 0] > 0,
                np.reshape(expected_masks, (-1, *inside.shape)),
            )
    # The seeds tried include pastes where the box and the mask disagree.
    assert box_rule_differs > 0


@pytest.mark.parametrize("batch", [2, 3, 4, 5])
def test_cutmix_never_pastes_an_image_into_itself(batch):
    # A random permutation maps some image to itself in most batches: its
    # pixels stayed, while every object the rectangle cut came out twice
    # (once its own, once as the "partner's"). Each image of _triangle_batch
    # has its own grey level and each object its own class id (10 * image + k).
    spec = TargetSpec(kinds=("boxes", "instance_masks"), min_visibility=0.25)
    images, tensors, _, _ = _triangle_batch()
    images = tf.concat([images, images * 0.5 + 0.1], 0)[:batch]  # each its own grey
    tensors = {name: tf.concat([value, value], 0)[:batch] for name, value in tensors.items()}
    tensors["classes"] = tf.ragged.map_flat_values(
        lambda c: c + 100 * tf.cast(tf.repeat(tf.range(batch) >= 4, 3), tf.int64),
        tensors["classes"],
    )
    with_targets = validate(["cutmix"])[0].definition.with_targets
    for index in range(30):
        seed = tf.constant([3, index], tf.int32)
        mixed_images, mixed = with_targets(
            images, BatchTargets(tensors, spec), seed, alpha=1.0, probability=1.0
        )
        changed = np.any(mixed_images.numpy() != images.numpy(), axis=(1, 2, 3))
        classes = mixed.tensors["classes"]
        for element in range(batch):
            ids = classes[element].numpy().tolist()
            assert len(ids) == len(set(ids)), (index, element, ids)
            sources = {(i % 100) // 10 + 4 * (i >= 100) for i in ids}
            # Its own objects and at most one other image's.
            assert len(sources - {element}) <= 1, (index, element, ids)
            if sources - {element}:
                assert changed[element], (index, element)


def test_batch_ops_leave_a_batch_of_one_alone():
    spec = TargetSpec(kinds=("boxes", "instance_masks"), min_visibility=0.25)
    images, tensors, _, _ = _triangle_batch()
    images, tensors = images[:1], {name: value[:1] for name, value in tensors.items()}
    labels = tf.constant([[0.0, 1.0, 0.0]])
    for name in ("cutmix", "mixup"):
        definition = validate([name])[0].definition
        for index in range(10):
            seed = tf.constant([5, index], tf.int32)
            out, out_labels = definition.fn(images, labels, seed, alpha=1.0, probability=1.0)
            np.testing.assert_array_equal(out.numpy(), images.numpy())
            np.testing.assert_array_equal(out_labels.numpy(), labels.numpy())
            if name == "cutmix":
                out, moved = definition.with_targets(
                    images, BatchTargets(tensors, spec), seed, alpha=1.0, probability=1.0
                )
                np.testing.assert_array_equal(out.numpy(), images.numpy())
                for column, value in tensors.items():
                    np.testing.assert_array_equal(
                        moved.tensors[column].to_tensor().numpy(), value.to_tensor().numpy()
                    )
