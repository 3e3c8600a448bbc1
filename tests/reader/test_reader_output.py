"""The image a trainer asks for: float32, bfloat16 or uint8, channels last or first (masks too)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from reader import scene_records
from reader.builds import stored_images

pytestmark = pytest.mark.usefixtures("no_global_seed")


def features(dataset) -> list[dict]:
    return list(dataset.as_numpy_iterator())


@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset", "raw_dataset"])
def test_uint8_is_the_stored_pixels_and_bfloat16_the_float_values(fixture, request):
    result = request.getfixturevalue(fixture)
    path = result.dataset_dir
    read = {"batch_size": 8, "shuffle": False, "augment": None, "as_supervised": False}
    floats = features(kiln.reader.load(path, **read))
    pixels = kiln.reader.load(path, dtype="uint8", **read)
    assert pixels.element_spec["image"] == tf.TensorSpec([None, 32, 32, 3], tf.uint8)
    stored = stored_images(result, "train")
    for batch in pixels.as_numpy_iterator():
        for key, image in zip(batch["key"], batch["image"], strict=True):
            np.testing.assert_array_equal(image, stored[key])
    halves = kiln.reader.load(path, dtype=tf.bfloat16, **read)
    assert halves.element_spec["image"].dtype == tf.bfloat16
    for half, full in zip(halves, floats, strict=True):
        np.testing.assert_array_equal(
            half["image"].numpy(), tf.cast(full["image"], tf.bfloat16).numpy()
        )


@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset"])
def test_augmented_uint8_rounds_the_float_stream(fixture, request):
    path = request.getfixturevalue(fixture).dataset_dir
    floats = [image for image, _ in kiln.reader.load(path, batch_size=8, seed=4)]
    pixels = [image for image, _ in kiln.reader.load(path, batch_size=8, seed=4, dtype="uint8")]
    exact = total = 0
    for small, full in zip(pixels, floats, strict=True):
        assert small.dtype == tf.uint8
        rounded = np.round(np.clip(full.numpy() * 255.0, 0, 255)).astype(np.int16)
        if fixture == "png_dataset":  # rounded from the float stream itself
            np.testing.assert_array_equal(small.numpy(), rounded)
        # For JPEG the crop's resize computes on the 0..255 scale: the same
        # values, rounded, but for float error at a half (docs/reader.md).
        difference = np.abs(small.numpy().astype(np.int16) - rounded)
        assert difference.max() <= 1
        scaled = full.numpy() * 255.0
        assert np.all(np.abs(scaled - np.floor(scaled) - 0.5)[difference > 0] < 1e-4)
        exact += int((difference == 0).sum())
        total += difference.size
    assert exact / total > 0.999


@pytest.mark.parametrize(
    "augment",
    [
        [{"random_crop": {"size": 24}}, "random_flip_left_right", "color_jitter"],
        [{"random_resized_crop": {"size": 24}}, {"random_rotation": {"angle_range": [-9, 9]}}],
    ],
)
def test_uint8_is_the_float_stream_rounded_outside_the_resize_on_the_0_255_scale(
    jpeg_dataset, augment
):
    """What docs/reader.md says holds exactly: uint8 is ``round(255 * x)``
    unless a JPEG's leading resizing crop is the list's last step but for
    flips and colour (a crop without resize, or an op after the resize)."""
    read = {"batch_size": 8, "seed": 4, "augment": augment}
    floats = [image for image, _ in kiln.reader.load(jpeg_dataset.dataset_dir, **read)]
    pixels = kiln.reader.load(jpeg_dataset.dataset_dir, dtype="uint8", **read)
    for full, (small, _) in zip(floats, pixels, strict=True):
        np.testing.assert_array_equal(
            small.numpy(), np.round(np.clip(full.numpy() * 255.0, 0, 255)).astype(np.uint8)
        )


def test_channels_first_is_the_transposed_image(png_dataset):
    path = png_dataset.dataset_dir
    read = {"batch_size": 8, "seed": 4, "normalize": True, "drop_remainder": True}
    last = kiln.reader.load(path, **read)
    first = kiln.reader.load(path, data_format="channels_first", **read)
    assert first.element_spec[0] == tf.TensorSpec([8, 3, 24, 24], tf.float32)
    for (a, label_a), (b, label_b) in zip(last, first, strict=True):
        np.testing.assert_array_equal(b.numpy(), np.transpose(a.numpy(), [0, 3, 1, 2]))
        np.testing.assert_array_equal(label_a.numpy(), label_b.numpy())
    single = kiln.reader.load(path, "test", batch_size=None, data_format="channels_first")
    assert single.element_spec[0].shape == (3, 24, 24)


@pytest.fixture(scope="module")
def masks_dataset(tmp_path_factory):
    """Scenes with boxes, a class mask and instance masks: PNG, 64x64, 1 shard."""
    targets = {"boxes": {}, "mask": {"ignore_value": 255}, "instance_masks": {}}
    return scene_records.build_scenes(
        str(tmp_path_factory.mktemp("mask-scenes")), targets, [], count=4, num_shards=1
    )


@pytest.mark.parametrize("max_objects", [None, 3])
def test_masks_follow_the_image_layout(masks_dataset, max_objects):
    path = masks_dataset.dataset_dir
    augment = [{"random_crop": {"size": 48}}, "random_flip_left_right"]
    read = {"batch_size": 2, "seed": 7, "augment": augment, "max_objects": max_objects}
    last = kiln.reader.load(path, **read)
    first = kiln.reader.load(path, data_format="channels_first", dtype="bfloat16", **read)
    image_spec, target_spec = first.element_spec
    assert image_spec == tf.TensorSpec([None, 3, 48, 48], tf.bfloat16)
    assert target_spec["mask"] == tf.TensorSpec([None, 1, 48, 48], tf.uint8)
    assert target_spec["instance_masks"].shape[-3:] == (1, 48, 48)
    assert target_spec["instance_masks"].dtype == tf.uint8
    for (image, targets), (image_first, targets_first) in zip(last, first, strict=True):
        np.testing.assert_array_equal(
            image_first.numpy(), tf.cast(tf.transpose(image, [0, 3, 1, 2]), tf.bfloat16).numpy()
        )
        np.testing.assert_array_equal(
            targets_first["mask"].numpy(), np.transpose(targets["mask"].numpy(), [0, 3, 1, 2])
        )
        for index in range(2):
            masks = np.asarray(targets["instance_masks"][index])
            np.testing.assert_array_equal(
                np.asarray(targets_first["instance_masks"][index]),
                np.transpose(masks, [0, 3, 1, 2]),
            )
        np.testing.assert_array_equal(
            np.asarray(targets_first["boxes"].numpy()), np.asarray(targets["boxes"].numpy())
        )


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"dtype": "uint8", "normalize": True}, "normalize=False"),
        ({"data_format": "NCHW"}, "data_format must be one of"),
        ({"dtype": "bfloat16", "for_model": True}, "load_for_model takes no dtype="),
        ({"data_format": "channels_first", "for_model": True}, "takes no data_format="),
    ],
)
def test_output_options_are_checked_before_reading(png_dataset, knobs, message):
    knobs = dict(knobs)
    read = kiln.reader.load_for_model if knobs.pop("for_model", False) else kiln.reader.load
    with pytest.raises(ValueError, match=message):
        read(png_dataset.dataset_dir, batch_size=8, seed=1, **knobs)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float32", tf.float32),
        (tf.float32, tf.float32),
        (np.float32, tf.float32),
        (np.dtype("float32"), tf.float32),
        ("bfloat16", tf.bfloat16),
        (tf.bfloat16, tf.bfloat16),
        (np.uint8, tf.uint8),
        (np.dtype("uint8"), tf.uint8),
    ],
)
def test_dtype_is_a_name_or_a_tensorflow_or_numpy_dtype(png_dataset, dtype, expected):
    dataset = kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=1, dtype=dtype)
    assert dataset.element_spec[0].dtype == expected
    image, _ = next(iter(dataset))
    assert image.dtype == expected


@pytest.mark.parametrize(
    ("dtype", "shown"),
    [
        (np.float64, r"<class 'numpy\.float64'> \(float64\)"),
        (tf.float16, r"tf\.float16$"),
        ("float16", r"'float16'$"),
        ("floats", r"'floats'$"),
        (True, r"True$"),  # tf.as_dtype reads it as an enum value: float32
        (1, r"1$"),
        (None, r"None$"),
    ],
)
def test_other_dtypes_are_refused_naming_what_was_passed(png_dataset, dtype, shown):
    with pytest.raises(
        ValueError,
        match=r"dtype must be one of \('float32', 'bfloat16', 'uint8'\), as a name or a "
        r"TensorFlow or NumPy dtype \(tf\.float32, np\.float32\), got " + shown,
    ):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=1, dtype=dtype)


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"dtype": "bfloat16"}, "dtype='bfloat16'"),
        ({"dtype": tf.uint8}, "dtype='uint8'"),
        ({"data_format": "channels_first"}, "data_format='channels_first'"),
        (
            {"dtype": np.uint8, "data_format": "channels_first"},
            "dtype='uint8' or data_format='channels_first'",
        ),
    ],
)
def test_load_for_model_names_only_the_output_options_passed(png_dataset, knobs, named):
    with pytest.raises(ValueError) as raised:
        kiln.reader.load_for_model(png_dataset.dataset_dir, batch_size=8, seed=1, **knobs)
    message = str(raised.value)
    assert message.startswith(f"load_for_model takes no {named}: its dataset yields uint8 ")
    for option in ("dtype", "data_format"):
        assert (f"{option}=" in message) == (option in knobs), message
    # The defaults, however spelled, are accepted.
    dataset, _ = kiln.reader.load_for_model(
        png_dataset.dataset_dir, batch_size=8, seed=1, dtype=np.float32
    )
    assert dataset.element_spec[0]["image"].dtype == tf.uint8
