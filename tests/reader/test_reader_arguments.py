"""`load`'s arguments as a trainer uses them: evaluation mode, sizes checked up front,
unbatched by default, `ReadOptions`, and the deprecated spellings that still work."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader import AugmentConfigError, ReadOptions

# Random in every op: two random passes cannot agree.
RANDOM_LIST = [
    {"random_crop": {"size": 20}},
    "random_flip_left_right",
    {"random_brightness": {"max_delta": 0.3}},
]


def images_of(dataset) -> np.ndarray:
    return np.concatenate([images.numpy() for images, _ in dataset])


def test_an_explicit_list_on_validation_is_its_inference_form_by_default(png_dataset):
    path = png_dataset.dataset_dir
    validation = kiln.reader.load(path, "validation", batch_size=8, seed=4, augment=RANDOM_LIST)
    first, second = images_of(validation), images_of(validation)
    np.testing.assert_array_equal(first, second)
    assert first.shape[1:] == (20, 20, 3)  # the crop's centre form keeps its size
    # The centre crop of the stored images, no flip, no brightness change.
    stored = images_of(kiln.reader.load(path, "validation", batch_size=8, augment=None))
    np.testing.assert_array_equal(first, stored[:, 6:26, 6:26])

    randomly = kiln.reader.load(
        path, "validation", batch_size=8, seed=4, augment=RANDOM_LIST, training=True
    )
    assert not np.array_equal(images_of(randomly), images_of(randomly))


def test_training_false_makes_the_train_split_deterministic(png_dataset):
    train = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=8, shuffle=False, augment=RANDOM_LIST, training=False
    )
    np.testing.assert_array_equal(images_of(train), images_of(train))
    with pytest.raises(ValueError, match="training must be True, False or None"):
        kiln.reader.load(png_dataset.dataset_dir, training="eval")


def test_load_for_model_on_validation_gives_a_layer_that_never_augments_randomly(png_dataset):
    path = png_dataset.dataset_dir
    dataset, layer = kiln.reader.load_for_model(
        path, "validation", batch_size=8, seed=4, augment=RANDOM_LIST
    )
    inputs, _ = next(iter(dataset))
    expected = next(iter(kiln.reader.load(path, "validation", batch_size=8, augment=RANDOM_LIST)))
    # Even under training=True (e.g. validation run inside fit) the layer is its inference form.
    np.testing.assert_array_equal(layer(inputs, training=True), expected[0])


def test_a_crop_larger_than_the_stored_images_is_refused_by_load(png_dataset):
    path = png_dataset.dataset_dir
    assert png_dataset.info.image_size == [32, 32]
    with pytest.raises(
        AugmentConfigError,
        match=r"augment\[1\]\.random_crop: size \[40, 40\] \(height, width\) does not fit in "
        r"\[32, 32\], the size of the dataset's stored images \(kiln.json image_size\)",
    ):
        kiln.reader.load(
            path, batch_size=8, augment=["random_flip_left_right", {"random_crop": {"size": 40}}]
        )
    # After a crop, the size it produces is what the next crop gets; the
    # inference form (validation) crops alike and is refused alike.
    with pytest.raises(
        AugmentConfigError,
        match=r"augment\[1\]\.random_crop: size \[28, 28\] .* does not fit in \[24, 24\], "
        r"the size of the output of augment\[0\]\.random_resized_crop",
    ):
        kiln.reader.load(
            path,
            "validation",
            augment=[{"random_resized_crop": {"size": 24}}, {"random_crop": {"size": 28}}],
        )
    # A crop that fits the stored size passes, up to the full size.
    full = kiln.reader.load(path, batch_size=8, augment=[{"random_crop": {"size": 32}}])
    assert full.element_spec[0].shape.as_list() == [None, 32, 32, 3]


def test_crops_are_checked_against_the_least_size_of_images_of_varying_size(varying_dataset):
    """With no one size, kiln.json keeps the least height and the least width
    (smallest_size): a crop larger than either would fail at some image while
    training, so load and load_for_model refuse it before reading."""
    info, path = varying_dataset.info, varying_dataset.dataset_dir
    assert info.image_size is None
    shapes = [
        image.shape[:2]
        for split in info.splits
        for image, _ in kiln.reader.load(path, split, augment=None, seed=0).as_numpy_iterator()
    ]
    least = [min(h for h, _ in shapes), min(w for _, w in shapes)]
    assert len(set(shapes)) > 1
    assert info.smallest_size == least
    stored = (
        f"does not fit in {least}, the size of the dataset's smallest stored images (their "
        f"sizes vary: kiln.json smallest_size, the least height {least[0]}, the least width "
        f"{least[1]})"
    )
    for crop in ([least[0] + 1, 1], [1, least[1] + 1]):
        augment = [{"random_crop": {"size": crop}}]
        with pytest.raises(
            AugmentConfigError, match=re.escape(f"size {crop} (height, width) {stored}")
        ):
            kiln.reader.load(path, augment=augment, seed=0)
        with pytest.raises(AugmentConfigError, match=re.escape(stored)):
            kiln.reader.load_for_model(path, augment=augment, seed=0)
    fitting = kiln.reader.load(path, augment=[{"random_crop": {"size": least}}], seed=0)
    images = list(fitting.as_numpy_iterator())  # every image takes it
    assert len(images) == info.splits["train"].num_examples
    assert {image.shape[:2] for image, _ in images} == {tuple(least)}


def test_batch_size_defaults_to_single_elements(png_dataset):
    dataset = kiln.reader.load(png_dataset.dataset_dir, seed=0)
    assert dataset.element_spec[0].shape.as_list() == [24, 24, 3]
    assert dataset.cardinality() == png_dataset.info.splits["train"].num_examples


@pytest.mark.parametrize(
    "flag",
    [
        "shuffle",
        "training",
        "normalize",
        "drop_remainder",
        "pad_remainder",
        "as_supervised",
        "one_hot",
    ],
)
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(png_dataset, flag):
    # A string is true to Python: shuffle="no" shuffled, as_supervised="false"
    # yielded (image, label), drop_remainder="yes" failed inside TensorFlow.
    allowed = "True, False or None" if flag in ("shuffle", "training") else "True or False"
    for read in (kiln.reader.load, kiln.reader.load_for_model):
        with pytest.raises(ValueError, match=rf"^{flag} must be {allowed}, got 'no'$"):
            read(png_dataset.dataset_dir, batch_size=8, seed=1, **{flag: "no"})
        with pytest.raises(ValueError, match=rf"^{flag} must be {allowed}, got 0$"):
            read(png_dataset.dataset_dir, batch_size=8, seed=1, **{flag: 0})
        # NumPy's bools are bools, for every flag alike.
        assert read(png_dataset.dataset_dir, batch_size=8, seed=1, **{flag: np.False_}) is not None


def test_a_numpy_bool_means_what_the_bool_does(png_dataset):
    path = png_dataset.dataset_dir
    unshuffled = kiln.reader.load(path, batch_size=8, seed=1, shuffle=np.False_, augment=None)
    in_order = kiln.reader.load(path, batch_size=8, shuffle=False, augment=None)
    np.testing.assert_array_equal(images_of(unshuffled), images_of(in_order))
    padded = kiln.reader.load(path, "validation", batch_size=8, pad_remainder=np.True_)
    assert len(padded.element_spec) == 3  # (image, label, weight)
    endless = kiln.reader.load(path, batch_size=8, seed=1, repeat=np.True_)
    assert endless.cardinality() == tf.data.INFINITE_CARDINALITY


def test_read_options_check_themselves_when_made():
    with pytest.raises(ValueError, match=r"ReadOptions\.shuffle_buffer must be a positive int"):
        ReadOptions(shuffle_buffer=0)
    with pytest.raises(ValueError, match=r"ReadOptions\.shuffle_buffer must be an int or None"):
        ReadOptions(shuffle_buffer=True)
    with pytest.raises(ValueError, match=r"ReadOptions\.deterministic must be True or False"):
        ReadOptions(deterministic="yes")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReadOptions().deterministic = False  # type: ignore[misc]
    # A NumPy integer is a count, as load's batch_size and repeat take it.
    numpy_count = ReadOptions(shuffle_buffer=np.int64(200))
    assert numpy_count == ReadOptions(shuffle_buffer=200)
    assert type(numpy_count.shuffle_buffer) is int


def test_a_dict_of_options_is_refused_with_the_read_options_call_to_write(png_dataset):
    path = png_dataset.dataset_dir
    spelled = r"options must be a kiln\.reader\.ReadOptions, not a dict: pass "
    for read in (kiln.reader.load, kiln.reader.load_for_model):
        with pytest.raises(
            TypeError, match=spelled + r"options=kiln\.reader\.ReadOptions\(shuffle_buffer=10\)$"
        ):
            read(path, batch_size=8, options={"shuffle_buffer": 10})
        # An empty dict is refused too, not read as "no options".
        with pytest.raises(TypeError, match=spelled):
            read(path, batch_size=8, options={})
    with pytest.raises(TypeError, match=r"ReadOptions\(deterministic=False, dynamic_sharding"):
        kiln.reader.load(path, options={"deterministic": False, "dynamic_sharding": True})
    with pytest.raises(TypeError, match=r"ReadOptions or None, got int 10"):
        kiln.reader.load(path, options=10)
    # The spelled call works, and a mapping's unknown key is named by ReadOptions itself.
    config = {"shuffle_buffer": 10}
    spelled_out = kiln.reader.load(path, batch_size=8, options=ReadOptions(**config))
    assert spelled_out.cardinality() > 0
    with pytest.raises(TypeError, match="shufle_buffer"):
        ReadOptions(**{"shufle_buffer": 10})


def test_read_options_reach_the_pipeline_and_the_old_keywords_still_work(png_dataset):
    path = png_dataset.dataset_dir

    def keys(dataset):
        return [key for batch in dataset for key in batch["key"].numpy().tolist()]

    def read(**kwargs):
        return kiln.reader.load(path, batch_size=8, seed=2, as_supervised=False, **kwargs)

    unordered = read(options=ReadOptions(deterministic=False))
    assert unordered.options().deterministic is False
    assert read().options().deterministic is True
    # A one-record buffer does not shuffle records: the order differs from the default's.
    tiny = keys(read(options=ReadOptions(shuffle_buffer=1)))
    assert tiny != keys(read())
    with pytest.warns(DeprecationWarning, match=r"ReadOptions\(shuffle_buffer=\.\.\.\)"):
        deprecated = read(shuffle_buffer=1)
    assert keys(deprecated) == tiny
    with pytest.warns(DeprecationWarning, match=r"ReadOptions\(deterministic=\.\.\.\)"):
        assert read(deterministic=False).options().deterministic is False


def test_a_deprecated_keyword_disagreeing_with_options_is_refused(png_dataset):
    path = png_dataset.dataset_dir
    with pytest.raises(
        ValueError,
        match=r"got shuffle_buffer=100 and options=ReadOptions\(shuffle_buffer=50\), which "
        r"disagree: pass only options=kiln\.reader\.ReadOptions\(shuffle_buffer=\.\.\.\)",
    ):
        kiln.reader.load(path, shuffle_buffer=100, options=ReadOptions(shuffle_buffer=50))
    with pytest.raises(
        ValueError, match=r"got deterministic=True and options=ReadOptions\(deterministic=False\)"
    ):
        kiln.reader.load(path, deterministic=True, options=ReadOptions(deterministic=False))
    # Agreeing values, or options leaving the field at its default, still read (with a warning).
    with pytest.warns(DeprecationWarning):
        same = kiln.reader.load(path, shuffle_buffer=50, options=ReadOptions(shuffle_buffer=50))
    with pytest.warns(DeprecationWarning):
        other_field = kiln.reader.load(
            path, deterministic=False, options=ReadOptions(shuffle_buffer=50)
        )
    assert same.options().deterministic is True
    assert other_field.options().deterministic is False


def test_augment_on_model_still_returns_the_pair_with_a_deprecation_warning(png_dataset):
    path = png_dataset.dataset_dir
    with pytest.warns(DeprecationWarning, match="load_for_model"):
        dataset, layer = kiln.reader.load(path, batch_size=8, seed=1, augment_on="model")
    expected, _ = kiln.reader.load_for_model(path, batch_size=8, seed=1)
    first, second = next(iter(dataset))[0], next(iter(expected))[0]
    np.testing.assert_array_equal(first["augment_seed"], second["augment_seed"])
    np.testing.assert_array_equal(first["image"], second["image"])
    assert isinstance(layer, kiln.reader.AugmentationLayer)
    with pytest.raises(ValueError, match="augment_on must be one of"):
        kiln.reader.load(path, augment_on="gpu")
