"""An augmentation list checked against the dataset before any data is read.

`load`, `load_for_model` and `kiln build` share one check
(`Augmenter.check_dataset`): targets the ops cannot move or mix, RGB-only
ops on grey images, crops larger than the stored images. Each refusal names
the list entry (``augment[1].mixup``). Real builds, read by the real reader.
"""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader import AugmentConfigError, TargetSpec, validate
from kiln.reader.augmenter import Augmenter
from kiln.reader.ops import AUGMENTATIONS
from kiln.reader.targets import TargetError
from reader import scene_records

OBJECTS = {"boxes": {"min_visibility": 0.25}, "mask": {"ignore_value": 255}}


@pytest.fixture(scope="module")
def objects_dataset(tmp_path_factory):
    """Four scenes with boxes and a class mask (64x64 PNG, train only)."""
    root = str(tmp_path_factory.mktemp("objects"))
    return scene_records.build_scenes(root, OBJECTS, [], count=4, num_shards=1)


@pytest.fixture(scope="module")
def grey_dataset(build_dataset):
    """The demo images stored with one channel (as tests/test_build.py builds them)."""
    return build_dataset(image={"channels": 1}, encoding={"format": "raw"})


def test_load_for_model_refuses_an_rgb_op_on_grey_images_before_making_the_layer(grey_dataset):
    path = grey_dataset.dataset_dir
    message = r"^augment\[1\]\.random_hue: needs 3-channel \(RGB\) images; this dataset's images "
    message += r"have 1 channel\(s\)"
    ops = ["random_flip_left_right", "random_hue"]
    with pytest.raises(AugmentConfigError, match=message):
        kiln.reader.load_for_model(path, batch_size=4, seed=1, augment=ops)
    # load refuses it alike (before, the first trace of the map did, with another message).
    with pytest.raises(AugmentConfigError, match=message):
        kiln.reader.load(path, batch_size=4, seed=1, augment=ops)
    # The parameters decide: color_jitter without saturation and hue takes one channel.
    jitter = [{"color_jitter": {"saturation": 0.0, "hue": 0.0}}]
    kiln.reader.load_for_model(path, batch_size=4, seed=1, augment=jitter)
    with pytest.raises(AugmentConfigError, match=r"augment\[0\]\.color_jitter: needs 3-channel"):
        kiln.reader.load_for_model(path, batch_size=4, seed=1, augment=["color_jitter"])
    # Outside training the op does not run (it has no inference form): nothing to refuse.
    _, layer = kiln.reader.load_for_model(path, "validation", batch_size=4, augment=ops)
    assert layer.random is False


def test_target_refusals_name_the_list_entry(objects_dataset):
    path = objects_dataset.dataset_dir
    with pytest.raises(TargetError, match=r"^augment\[1\]\.mixup: batch op 'mixup' cannot mix"):
        kiln.reader.load(path, batch_size=4, seed=1, augment=["random_flip_left_right", "mixup"])


@pytest.mark.parametrize(
    "op",
    [
        {"random_rotation": {"fill_mode": "wrap"}},
        {"random_rotation": {"angle_range": [-10, 0], "fill_mode": "reflect"}},
        {"random_zoom": {"factor_range": [0.5, 1.2], "fill_mode": "wrap"}},
        {"random_zoom": {"factor_range": [0.5, 0.9], "fill_mode": "reflect"}},
    ],
)
def test_fill_modes_that_copy_objects_are_refused_with_boxes(objects_dataset, op):
    name = next(iter(op))
    message = rf"^augment\[1\]\.{name}: fill_mode '\w+' fills the uncovered border with copies"
    augment = ["random_flip_left_right", op]
    with pytest.raises(TargetError, match=message):
        kiln.reader.load(objects_dataset.dataset_dir, batch_size=4, seed=1, augment=augment)
    with pytest.raises(TargetError, match=message):
        kiln.reader.load_for_model(
            objects_dataset.dataset_dir, batch_size=4, seed=1, augment=augment
        )


def test_fill_modes_are_free_where_nothing_is_copied_or_nothing_has_a_box(
    objects_dataset, png_dataset
):
    # Zooming in fills nothing; constant and nearest copy no object.
    for op in (
        {"random_zoom": {"factor_range": [1.0, 1.5], "fill_mode": "wrap"}},
        {"random_rotation": {"fill_mode": "nearest"}},
        {"random_rotation": {"angle_range": [0, 0], "fill_mode": "reflect"}},
    ):
        kiln.reader.load(objects_dataset.dataset_dir, batch_size=4, seed=1, augment=[op])
    # Without boxes, a copy has nothing to miss: the class mask is filled as the image is.
    wrap = [{"random_rotation": {"fill_mode": "wrap"}}]
    Augmenter(tuple(validate(wrap))).check_targets(TargetSpec(kinds=("mask",)))
    kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=1, augment=wrap)


def test_a_users_op_that_needs_rgb_is_refused_on_grey_images_before_reading(grey_dataset):
    @kiln.reader.register_augmentation("random_warm_tint", geometric=False, needs_rgb=True)
    def random_warm_tint(image, seed, *, strength: float = 0.1):
        # Red up, blue down: an RGB-only op.
        amount = tf.random.stateless_uniform([], seed, 0.0, strength)
        return tf.clip_by_value(image + amount * tf.constant([1.0, 0.0, -1.0]), 0.0, 1.0)

    @kiln.reader.register_augmentation(
        "random_maybe_tint", geometric=False, needs_rgb=lambda *, tint: tint
    )
    def random_maybe_tint(image, seed, *, tint: bool = True):
        return image

    try:
        path = grey_dataset.dataset_dir
        message = r"^augment\[1\]\.random_warm_tint: needs 3-channel \(RGB\) images; "
        message += r"this dataset's images have 1 channel\(s\)"
        ops = ["random_flip_left_right", "random_warm_tint"]
        for load in (kiln.reader.load, kiln.reader.load_for_model):
            with pytest.raises(AugmentConfigError, match=message):
                load(path, batch_size=4, seed=1, augment=ops)
        # The parameters decide when the op says how.
        kiln.reader.load(
            path, batch_size=4, seed=1, augment=[{"random_maybe_tint": {"tint": False}}]
        )
        with pytest.raises(AugmentConfigError, match=r"augment\[0\]\.random_maybe_tint: needs"):
            kiln.reader.load(path, batch_size=4, seed=1, augment=["random_maybe_tint"])
    finally:
        AUGMENTATIONS.remove("random_warm_tint")
        AUGMENTATIONS.remove("random_maybe_tint")


@pytest.mark.parametrize(
    "augment, shape, message",
    [
        (
            ["random_flip_left_right", "random_hue"],
            (32, 32, 1),
            r"^AugmentationLayer\.augment\[1\]\.random_hue: needs 3-channel \(RGB\) images; "
            r"the layer's input images have 1 channel\(s\)$",
        ),
        (
            [{"random_crop": {"size": 48}}],
            (32, 40, 3),
            r"^AugmentationLayer\.augment\[0\]\.random_crop: .*the layer's input images",
        ),
    ],
)
def test_a_layer_made_directly_refuses_inputs_its_ops_cannot_take(augment, shape, message):
    # Made by hand rather than by load_for_model, the layer knows the images
    # only from the model's input: it checks them when the model is built.
    layer = kiln.reader.AugmentationLayer(augment)
    with pytest.raises(AugmentConfigError, match=message):
        layer(tf.keras.Input(shape, dtype="uint8"))
    # Images it can take build as before.
    kiln.reader.AugmentationLayer(augment)(tf.keras.Input((64, 64, 3), dtype="uint8"))


def test_a_rotation_of_less_than_a_degree_is_warned_once(png_dataset, caplog):
    # Keras' RandomRotation(0.1) is a tenth of a turn (36 degrees); copied as
    # kiln's angle_range [-0.1, 0.1] it is a tenth of a degree: valid, so
    # not refused, but said once, naming the entry, when the list is checked
    # (not per epoch, nor per element).
    augment = [
        "random_flip_left_right",
        {"random_rotation": {"angle_range": [-0.1, 0.1], "fill_mode": "reflect"}},
    ]
    with caplog.at_level(logging.WARNING, logger="kiln.reader"):
        for _ in range(2):
            dataset = kiln.reader.load(
                png_dataset.dataset_dir, "train", batch_size=4, seed=0, augment=augment
            )
            next(iter(dataset))
        validate(augment)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [
        "augment[1].random_rotation.angle_range: [-0.1, 0.1] rotates by 0.1 degree at most; "
        "angle_range is in degrees, counter-clockwise: Keras' RandomRotation(factor=f), in "
        "turns, is angle_range [-360 f, 360 f] (docs/migrating.md)"
    ]
    assert warned[0].name == "kiln.reader.ops"


@pytest.mark.parametrize(
    "angle_range",
    [[-0.3, 0.0], [0.0, 0.0], [-1.0, 1.0], [-0.5, 2.0], [-15.0, 15.0]],
    ids=["a_zero_bound", "none", "a_degree", "one_bound_of_degrees", "default"],
)
def test_rotations_of_a_degree_or_with_a_zero_bound_are_not_warned(angle_range, caplog):
    with caplog.at_level(logging.WARNING, logger="kiln.reader"):
        validate([{"random_rotation": {"angle_range": angle_range}}])
    assert caplog.records == []


def test_a_build_warns_of_a_rotation_of_less_than_a_degree(demo_corpus, tmp_path, caplog):
    # The build checks the list with the reader's validate: said before it runs.
    from conftest import make_config
    from kiln.pipeline import config

    augment = [{"random_rotation": {"angle_range": [-0.2, 0.25]}}]
    with caplog.at_level(logging.WARNING, logger="kiln.reader"):
        config.load(make_config(demo_corpus.out_dir, output=str(tmp_path), augment=augment))
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "augment[0].random_rotation.angle_range: [-0.2, 0.25] rotates by 0.25 degree at most"
    ]
