"""Augmentation ops: list validation, registration, the first-use checks, each op's behaviour."""

from __future__ import annotations

import logging
import math
import pathlib
import random
import re
import runpy

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader import AugmentConfigError, AugmentOpError, register_augmentation, validate
from kiln.reader.augmenter import Augmenter
from kiln.reader.ops import AUGMENTATIONS, color_twist

BUILTINS = [
    "color_jitter",
    "cutmix",
    "mixup",
    "random_brightness",
    "random_contrast",
    "random_crop",
    "random_erasing",
    "random_flip_left_right",
    "random_flip_up_down",
    "random_grayscale",
    "random_hue",
    "random_resized_crop",
    "random_rotation",
    "random_saturation",
]

# kiln's colour ops (`OpDefinition.pixelwise`), each with a coin where it has one.
COLOUR_SPECS = [
    "random_brightness",
    "random_contrast",
    "random_saturation",
    "random_hue",
    "color_jitter",
    {"color_jitter": {"probability": 0.5}},
    {"random_grayscale": {"probability": 0.5}},
]


@pytest.fixture
def user_ops():
    """Registers test ops; removes them afterwards so tests stay independent."""
    before = set(AUGMENTATIONS.names())
    yield
    for name in set(AUGMENTATIONS.names()) - before:
        AUGMENTATIONS.remove(name)


def image(height=20, width=16, channels=3, seed=0) -> tf.Tensor:
    return tf.constant(
        np.random.default_rng(seed).random((height, width, channels), dtype=np.float32)
    )


def seeds(count: int) -> list[tf.Tensor]:
    return list(tf.random.split(tf.constant([3, 4], tf.int32), count))


def run(spec, img, seed):
    return Augmenter(tuple(validate([spec]))).apply(img, seed)


# --- validation ------------------------------------------------------------------------


def test_builtins_registered():
    assert set(BUILTINS) <= set(kiln.reader.names())


def test_validate_fills_defaults_and_normalizes():
    resolved = validate(
        [
            "random_flip_left_right",
            {"random_resized_crop": {"size": 56}},
            {"random_brightness": None},
        ]
    )
    assert [a.to_json() for a in resolved] == [
        {"random_flip_left_right": {"probability": 0.5}},
        {
            "random_resized_crop": {
                "antialias": False,
                "method": "bilinear",
                "ratio_range": [0.75, 4 / 3],
                "scale_range": [0.08, 1.0],
                "size": [56, 56],
            }
        },
        {"random_brightness": {"max_delta": 0.2}},
    ]
    # The resolved form validates to itself (it is what kiln.json stores).
    assert validate([a.to_json() for a in resolved]) == resolved
    assert validate(None) == [] and validate([]) == []


@pytest.mark.parametrize(
    "specs, message",
    [
        (["random_flip"], "augment[0]: unknown augmentation op 'random_flip'"),
        ([{"random_crop": {}}], "augment[0].random_crop.size: required parameter is missing"),
        (
            ["random_flip_left_right", {"random_flip_left_right": {"prob": 0.5}}],
            "augment[1].random_flip_left_right.prob: unknown parameter; "
            "did you mean 'probability'?",
        ),
        (
            [{"random_flip_left_right": {"probability": 1.5}}],
            "augment[0].random_flip_left_right.probability: must be <= 1.0, got 1.5",
        ),
        (
            [{"random_resized_crop": {"size": 8, "scale_range": [0.9, 0.2]}}],
            "augment[0].random_resized_crop.scale_range: expected low <= high, got [0.9, 0.2]",
        ),
        (
            [{"random_resized_crop": {"size": 8, "scale_range": [0.0, 0.5]}}],
            "augment[0].random_resized_crop: scale_range: "
            "fractions of the image area must be in (0, 1]",
        ),
        (
            [{"random_crop": {"size": [8, -1]}}],
            "augment[0].random_crop.size: "
            "expected a positive integer or [height, width], got [8, -1]",
        ),
        (
            [{"random_rotation": {"angle_range": 10}}],
            "augment[0].random_rotation.angle_range: expected two numbers [low, high], got 10",
        ),
        (
            [{"random_rotation": {"fill_mode": "mirror"}}],
            "augment[0].random_rotation.fill_mode: expected one of ['constant', 'reflect', 'wrap', "
            "'nearest'], got 'mirror'",
        ),
        (
            [{"random_flip_left_right": {"probability": True}}],
            "augment[0].random_flip_left_right.probability: expected a number, got true",
        ),
        (
            [{"random_flip_left_right": 0.5}],
            "augment[0].random_flip_left_right: parameters must be a mapping, got 0.5",
        ),
        ([{"a": {}, "b": {}}], "augment[0]: expected an op name or a one-key mapping"),
        (
            ["mixup", "random_flip_left_right"],
            "augment[1].random_flip_left_right: element ops must come before batch ops",
        ),
        ("random_flip_left_right", "augment: expected a list of ops"),
    ],
)
def test_validate_names_entry_and_parameter(specs, message):
    with pytest.raises(AugmentConfigError) as error:
        validate(specs)
    assert message in str(error.value)
    assert isinstance(error.value, ValueError)  # what the build config checker catches


@pytest.mark.parametrize(
    "spec, message",
    [
        # Keras' parameter names, and its numbers where kiln's mean something else.
        (
            {"random_rotation": {"factor": 0.1}},
            "augment[0].random_rotation.factor: unknown parameter (known: angle_range, "
            "fill_mode, fill_value, interpolation); angle_range is in degrees, "
            "counter-clockwise: Keras' RandomRotation(factor=f), in turns, is "
            "angle_range [-360 f, 360 f]",
        ),
        (
            {"random_rotation": {"angle_range": 0.1}},
            "augment[0].random_rotation.angle_range: expected two numbers [low, high], got 0.1; "
            "angle_range is in degrees",
        ),
        (
            {"random_zoom": {"height_factor": 0.1}},
            "augment[0].random_zoom.height_factor: unknown parameter (known: factor_range, "
            "fill_mode, fill_value, interpolation); factor_range is a scale factor, above 1 "
            "zooming in: Keras' RandomZoom(h), whose positive h zooms out, is factor_range "
            "[1 / (1 + h), 1 / (1 - h)], [0.909, 1.111] for h = 0.1",
        ),
        (
            {"random_zoom": {"factor_range": [-0.1, 0.1]}},
            "augment[0].random_zoom.factor_range: both ends must be > 0, got [-0.1, 0.1]; "
            "factor_range is a scale factor",
        ),
        (
            {"random_contrast": {"factor": 0.2}},
            "augment[0].random_contrast.factor: unknown parameter; did you mean "
            "'factor_range'?; Keras' RandomContrast(f) is factor_range [1 - f, 1 + f]",
        ),
        (
            {"random_brightness": {"factor": 0.2}},
            "augment[0].random_brightness.factor: unknown parameter (known: max_delta); "
            "max_delta is on kiln's [0, 1] scale: Keras' RandomBrightness(f), a fraction of "
            "its value_range, is max_delta f",
        ),
        (
            {"random_brightness": {"max_delta": 0.2, "value_range": [0, 255]}},
            "augment[0].random_brightness.value_range: unknown parameter (known: max_delta); "
            "max_delta is on kiln's [0, 1] scale",
        ),
        (
            {"random_crop": {"size": 48, "height": 48}},
            "augment[0].random_crop.height: unknown parameter (known: size); Keras' "
            "RandomCrop(height, width) is size [height, width]",
        ),
    ],
)
def test_keras_parameters_are_translated_in_the_error(spec, message):
    """A user porting Keras preprocessing layers is told kiln's parameter and
    the conversion, on the one line that names the entry (docs/migrating.md
    checks each conversion numerically against Keras)."""
    with pytest.raises(AugmentConfigError) as error:
        validate([spec])
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "Resizing",
            "unknown augmentation op 'Resizing'; resizing is not random, so kiln does it once, "
            "in the build: the config's transforms: [resize: {size: [height, width]}] "
            "(random_crop and random_resized_crop take a size online)",
        ),
        (
            "resize",
            "unknown augmentation op 'resize'; resizing is not random, so kiln does it once, "
            "in the build: the config's transforms: [resize: {size: [height, width]}] "
            "(random_crop and random_resized_crop take a size online)",
        ),
        (
            "center_crop",
            "unknown augmentation op 'center_crop'; a centre crop is not random, so kiln does "
            "it once, in the build: the config's transforms: [center_crop: {size: [height, "
            "width]}] (random_crop becomes a centre crop of its size outside training)",
        ),
        (
            "Rescaling",
            "unknown augmentation op 'Rescaling'; not needed: kiln.reader's images are float32 "
            "in [0, 1] already (normalize=True standardizes them, dtype='uint8' gives 0..255)",
        ),
        (
            "RandomFlip",
            "unknown augmentation op 'RandomFlip'; Keras' RandomFlip('horizontal') is "
            "random_flip_left_right, 'vertical' random_flip_up_down",
        ),
        (
            "Normalization",
            "unknown augmentation op 'Normalization'; not random, and not an op: load(..., "
            "normalize=True) standardizes with the train split's per-channel mean and std "
            "that the build stored (Keras' Normalization(mean=mean, variance=std ** 2) on "
            "0..255)",
        ),
        # Not 'did you mean random_rotation': the note is about this very name.
        (
            "RandomTranslation",
            "unknown augmentation op 'RandomTranslation'; kiln has no translation op: "
            "register one with @kiln.reader.register_augmentation (docs/migrating.md has "
            "random_translation, with Keras' RandomTranslation pixels)",
        ),
        (
            "random_translation",
            "unknown augmentation op 'random_translation'; kiln has no translation op: "
            "register one with @kiln.reader.register_augmentation (docs/migrating.md has "
            "random_translation, with Keras' RandomTranslation pixels)",
        ),
        # A close registered name still wins: it is the likelier meaning.
        (
            "RandomRotation",
            "unknown augmentation op 'RandomRotation'; did you mean 'random_rotation'?",
        ),
    ],
)
def test_keras_layers_that_are_not_ops_say_what_to_do_instead(name, message):
    """Keras' Resizing, CenterCrop and Rescaling sit among its random layers;
    ported one by one into an augmentation list, they are refused with where
    their work goes in kiln, not with the list of ops and how to register one."""
    with pytest.raises(AugmentConfigError) as error:
        validate(["random_flip_left_right", {name: {}}])
    assert str(error.value) == f"augment[1]: {message}"


def test_an_unknown_op_is_offered_every_close_name(png_dataset):
    """``random_flip`` begins both flips: `load` offers both, not only the first."""
    with pytest.raises(AugmentConfigError) as error:
        kiln.reader.load(png_dataset.dataset_dir, batch_size=8, augment=["random_flip"])
    assert str(error.value) == (
        "augment[0]: unknown augmentation op 'random_flip'; "
        "did you mean 'random_flip_left_right' or 'random_flip_up_down'?"
    )
    # The same with a slip in its last character: both, not the shorter one.
    with pytest.raises(AugmentConfigError) as error:
        validate(["random_flipp"])
    assert str(error.value).endswith(
        "; did you mean 'random_flip_left_right' or 'random_flip_up_down'?"
    )
    # A plain typo keeps its one suggestion: the other flip is much less close.
    with pytest.raises(AugmentConfigError) as error:
        validate(["random_flip_left_rigth"])
    assert str(error.value).endswith("; did you mean 'random_flip_left_right'?")
    # An abbreviation of more names than are offered lists every op instead.
    with pytest.raises(AugmentConfigError, match=r"'random' \(known: color_jitter, cutmix"):
        validate(["random"])
    # A name close to none: most likely the user's own op, not registered
    # (or its module not imported): the message says how one is.
    with pytest.raises(AugmentConfigError) as error:
        validate(["my_posterize"])
    assert str(error.value).endswith(
        "; an op of your own is registered with @kiln.reader.register_augmentation in a module "
        "that a build config names under plugins:, and training code imports before loading"
    )


# --- registration and first-use checks ---------------------------------------------------


def test_user_op_registers_validates_and_runs(user_ops):
    @register_augmentation("random_invert")
    def random_invert(image, seed, *, probability: float = 0.5):
        flip = tf.random.stateless_uniform([], seed) < probability
        return tf.where(flip, 1.0 - image, image)

    assert "random_invert" in kiln.reader.names()
    assert validate(["random_invert"])[0].to_json() == {"random_invert": {"probability": 0.5}}
    with pytest.raises(AugmentConfigError, match=r"random_invert\.probability: expected a number"):
        validate([{"random_invert": {"probability": "often"}}])
    img = image()
    outputs = [run({"random_invert": {"probability": 0.5}}, img, s).numpy() for s in seeds(16)]
    assert any(np.allclose(o, img) for o in outputs)
    assert any(np.allclose(o, 1 - img.numpy()) for o in outputs)


def test_registration_rejects_bad_signatures_and_duplicates(user_ops):
    with pytest.raises(ValueError, match="expected the signature fn"):
        register_augmentation("no_seed")(lambda image, *, p=1: image)
    with pytest.raises(ValueError, match="'p' must be keyword-only"):
        register_augmentation("positional")(lambda image, seed, p=1: image)
    # Without an annotation a config's "x" would reach the op unchecked.
    with pytest.raises(ValueError, match=r"'unannotated': parameter 'k' has no type annotation"):
        register_augmentation("unannotated")(lambda image, seed, *, k=1: image)
    assert "unannotated" not in kiln.reader.names()
    with pytest.raises(ValueError, match="already registered"):
        register_augmentation("random_crop")(lambda image, seed: image)


def test_op_ignoring_its_seed_is_rejected_with_the_tracing_pitfall(user_ops):
    @register_augmentation("python_random_flip")
    def python_random_flip(image, seed):
        # Runs once, while tracing: every element gets the same choice.
        return tf.reverse(image, [1]) if random.random() < 0.5 else image

    with pytest.raises(AugmentOpError) as error:
        run("python_random_flip", image(), seeds(1)[0])
    message = str(error.value)
    # What was seen and its likely cause first, in one sentence; then the pitfall and the fix.
    assert message.split(". ")[0] == (
        "augmentation op 'python_random_flip' ignores its seed: 64 seeds gave one output, but "
        "tracing it drew from Python's or NumPy's global random generator, so its random "
        "values come from Python or NumPy at trace time"
    )
    assert "traces an op once" in message and "baked into the graph as a constant" in message
    assert "tf.random.stateless_uniform" in message


def test_op_drawing_at_trace_time_is_refused_however_rarely_its_draw_shows(user_ops):
    @register_augmentation("rare_python_flip")
    def rare_python_flip(image, seed):
        # Flips on one trace in fifty: fresh traces alone would rarely see it.
        return tf.reverse(image, [1]) if random.random() < 0.02 else image

    @register_augmentation("fresh_generator_noise")
    def fresh_generator_noise(image, seed):
        # A new NumPy generator per trace: no global state moves, the output does.
        return image + float(np.random.default_rng().uniform(0.0, 0.1))

    with pytest.raises(AugmentOpError, match="drew from Python's or NumPy's global random"):
        run("rare_python_flip", image(), seeds(1)[0])
    with pytest.raises(AugmentOpError, match="one output, but a fresh trace gave another"):
        run("fresh_generator_noise", image(), seeds(1)[0])


def test_op_using_its_seed_and_a_global_draw_at_trace_time_is_refused(user_ops, png_dataset):
    # Its outputs follow the seed, but the gain is drawn once, while tracing:
    # one constant for every element and epoch, another in every process.
    @register_augmentation("flip_and_numpy_gain")
    def flip_and_numpy_gain(image, seed):
        gain = np.random.uniform(0.5, 1.5)
        flip = tf.random.stateless_uniform([], seed) < 0.5
        return tf.clip_by_value(tf.where(flip, image[:, ::-1], image) * gain, 0.0, 1.0)

    @register_augmentation("flip_and_python_shift")
    def flip_and_python_shift(image, seed):
        shift = random.uniform(0.0, 0.1)
        flip = tf.random.stateless_uniform([], seed) < 0.5
        return tf.where(flip, image[:, ::-1], image) * (1.0 - shift)

    refused = (
        r"augmentation op '{}' draws from Python's or NumPy's global random generator while "
        r"being traced: .*another in every process.*baked into the graph as a constant.*"
        r"tf\.random\.stateless_uniform"
    )
    for name in ("flip_and_numpy_gain", "flip_and_python_shift"):
        with pytest.raises(AugmentOpError, match=refused.format(name)):
            run(name, image(), seeds(1)[0])
    # Raised by load(), before anything is read.
    with pytest.raises(AugmentOpError, match=refused.format("flip_and_numpy_gain")):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, augment=["flip_and_numpy_gain"])


def test_op_changing_the_size_without_an_inference_form_is_refused(user_ops, png_dataset):
    # Skipped where no random augmentation runs, it would leave validation at
    # the stored size while training's images shrink.
    @register_augmentation("random_shrink")
    def random_shrink(image, seed, *, size: int = 16):
        small = tf.image.resize(image, [size, size])
        return tf.where(tf.random.stateless_uniform([], seed) < 0.5, small, small[:, ::-1])

    path = png_dataset.dataset_dir
    stored = (
        kiln.reader.load(path, "validation", batch_size=4, augment=[]).element_spec[0].shape[1:3]
    )
    refused = (
        rf"augmentation op 'random_shrink' changes the image size \({stored[0]}x{stored[1]} in, "
        r"16x16 out\) and was registered without an inference= form: .*"
        r"register_augmentation\('random_shrink', inference=fn\)"
    )
    with pytest.raises(AugmentOpError, match=refused):
        kiln.reader.load(path, batch_size=4, seed=1, augment=["random_shrink"])
    with pytest.raises(AugmentOpError, match=refused):
        run("random_shrink", image(*stored), seeds(1)[0])

    # With an inference form of the same size, both splits come out alike.
    AUGMENTATIONS.remove("random_shrink")
    register_augmentation(
        "random_shrink", inference=lambda image, *, size=16: tf.image.resize(image, [size, size])
    )(random_shrink)
    train = kiln.reader.load(path, batch_size=4, seed=1, augment=["random_shrink"])
    validation = kiln.reader.load(path, "validation", batch_size=4, augment=["random_shrink"])
    assert train.element_spec[0].shape[1:3] == validation.element_spec[0].shape[1:3] == (16, 16)
    assert next(iter(train))[0].shape[1:3] == (16, 16)


def _documented_ops(folder) -> None:
    """Registers the ops of every example of docs/augmentations.md, in one process, as a
    project importing both example modules would."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "augmentations.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "@register" in b]
    assert len(blocks) == 2
    for index, block in enumerate(blocks):
        # Real files, as plugin modules are: AutoGraph reads the functions' source.
        module = folder / f"documented_ops_{index}.py"
        module.write_text(block)
        runpy.run_path(str(module))


def test_the_documented_examples_register_together(user_ops, tmp_path):
    # A project may import both example modules of docs/augmentations.md: no name is taken twice.
    _documented_ops(tmp_path)
    documented = {"random_negative", "random_shift", "random_invert", "random_gamma"}
    assert documented <= set(kiln.reader.names())


def test_documented_ops_with_deterministic_parameters_are_accepted(
    user_ops, png_dataset, tmp_path, caplog
):
    _documented_ops(tmp_path)
    plain = next(
        iter(kiln.reader.load(png_dataset.dataset_dir, batch_size=8, shuffle=False, augment=None))
    )
    stored = plain[0].numpy()
    cases = [
        ({"random_invert": {"probability": 1.0}}, 1.0 - stored),
        ({"random_negative": {"probability": 1.0}}, 1.0 - stored),
        ({"random_gamma": {"gamma_range": [1, 1]}}, stored),
        ({"random_shift": {"max_pixels": 0}}, stored),
    ]
    caplog.set_level(logging.INFO, logger="kiln.reader.augmenter")
    for op, expected in cases:
        dataset = kiln.reader.load(
            png_dataset.dataset_dir, batch_size=8, seed=1, shuffle=False, augment=[op]
        )
        images = next(iter(dataset))[0].numpy()
        np.testing.assert_allclose(images, expected, atol=1e-6, err_msg=str(op))
    accepted = [r for r in caplog.records if "deterministic with the parameters" in r.message]
    assert len(accepted) == len(cases) and {r.levelno for r in accepted} == {logging.INFO}


def test_an_op_that_needs_a_larger_image_is_checked_on_one_when_sizes_vary(user_ops, caplog):
    """The first-use check runs the op on a test image of the size it gets;
    when the dataset's sizes vary that is a guess (64x64), and a crop of 100
    pixels failed on it with TensorFlow's error, refusing a good op (and
    `kiln build` stopped on it as an internal error)."""
    from kiln.reader.augmenter import check_op

    def centre(image, *, size: int = 100):
        return image[:size, :size]

    @register_augmentation("crop_100", geometric=False, inference=centre)
    def crop_100(image, seed, *, size: int = 100):
        return tf.image.stateless_random_crop(image, [size, size, 3], seed)

    @register_augmentation("stateful_crop_100", geometric=False, inference=centre)
    def stateful_crop_100(image, seed, *, size: int = 100):
        return tf.image.random_crop(image, [size, size, 3])

    (crop,) = validate(["crop_100"])
    check_op(crop, (64, 64, 3), known=False)  # checked on 256x256
    (stateful,) = validate(["stateful_crop_100"])
    with pytest.raises(AugmentOpError, match="'stateful_crop_100' gave different outputs"):
        check_op(stateful, (64, 64, 3), known=False)
    # Where 64x64 is the size the op gets, it fails there in training too.
    with pytest.raises(
        AugmentOpError,
        match=r"'crop_100' failed on an image of the size it gets here \(64x64x3\): "
        r"InvalidArgumentError: assertion failed: \[Need value.shape >= size",
    ):
        check_op(crop, (64, 64, 3))
    # Larger than every test image: not checked, and said so.
    (huge,) = validate([{"crop_100": {"size": 2000}}])
    with caplog.at_level(logging.WARNING, logger="kiln.reader.augmenter"):
        check_op(huge, (64, 64, 3), known=False)
    assert [r.getMessage() for r in caplog.records] == [
        "augmentation op 'crop_100' could not be checked for its randomness: it failed on test "
        "images of 64x64, 256x256, 1024x1024 pixels (the dataset's images vary in size): "
        "assertion failed: [Need value.shape >= size, got ] [1024 1024 3] [2000 2000 3]"
    ]


def test_shape_errors_while_tracing_are_refused_in_words_or_retried_on_larger_images(user_ops):
    """A crop that TensorFlow refuses while tracing (its size checked
    statically) is retried on larger test images where sizes vary, as one
    that fails running is; an op that cannot take an image of unknown size
    (``tf.unstack`` of it) is refused naming it, not with a raw ValueError."""
    from kiln.reader.augmenter import Augmenter, check_op

    def corner(image, *, size: int = 100):
        return image[:size, :size]

    @register_augmentation("corner_crop", geometric=False, inference=corner)
    def corner_crop(image, seed, *, size: int = 100):
        return tf.image.crop_to_bounding_box(image, 0, 0, size, size)

    @register_augmentation("per_row_gain", geometric=False)
    def per_row_gain(image, seed):
        rows = tf.unstack(image)  # needs a known height
        return tf.stack([row * tf.random.stateless_uniform([], seed, 0.9, 1.0) for row in rows])

    (crop,) = validate(["corner_crop"])
    check_op(crop, (64, 64, 3), known=False)  # traced and checked on 256x256
    with pytest.raises(AugmentOpError, match="tracing it failed with ValueError"):
        check_op(crop, (64, 64, 3))  # 64x64 is the size it gets

    augmenter = Augmenter(tuple(validate(["per_row_gain"])), training=True)
    traced = tf.function(augmenter.apply, autograph=False)
    with pytest.raises(
        AugmentOpError,
        match=r"'per_row_gain' cannot run inside tf.data: tracing it failed with ValueError: "
        r"Cannot infer argument `num` from shape \(None, None, 3\).*take them from "
        r"tf.shape\(image\)",
    ):
        traced.get_concrete_function(
            tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([2], tf.int32)
        )


def test_op_with_stateful_randomness_is_rejected(user_ops):
    @register_augmentation("stateful_noise")
    def stateful_noise(image, seed):
        return image + tf.random.uniform(tf.shape(image), maxval=0.1)

    with pytest.raises(
        AugmentOpError, match="different outputs for the same seed: it uses stateful randomness"
    ):
        run("stateful_noise", image(), seeds(1)[0])


@pytest.mark.parametrize("call", ["numpy_function", "py_function_in_a_cond"])
def test_an_op_calling_python_is_refused_when_the_dataset_is_made(user_ops, png_dataset, call):
    """A seeded op whose work runs in NumPy through tf.numpy_function (or
    tf.py_function, here inside a tf.cond's branch) passed every check, and
    failed only later: a checkpoint of the iterator ("PyFunc is stateful"),
    or a tf.data service worker. `kiln lint` flags it; `load` refuses it."""
    name = f"numpy_gamma_{call}"

    def gamma_in_numpy(image, gamma):
        return np.power(image, gamma).astype(np.float32)

    @register_augmentation(name)
    def numpy_gamma(image, seed):
        gamma = tf.random.stateless_uniform([], seed, 0.8, 1.2)
        if call == "numpy_function":
            out = tf.numpy_function(gamma_in_numpy, [image, gamma], tf.float32)
        else:
            out = tf.cond(
                gamma > 1.0,
                lambda: tf.py_function(gamma_in_numpy, [image, gamma], tf.float32),
                lambda: image,
            )
        return tf.ensure_shape(out, image.shape)

    with pytest.raises(
        AugmentOpError, match=rf"augmentation op '{name}' calls Python per element .*\(K107\)"
    ):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=1, augment=[name])


def test_a_stateful_coin_is_rejected_whatever_its_draws(user_ops):
    # A coin drawn from a stateful generator gives one seed's output again
    # half the time: checked on a single seed, most of these passed.
    def coin_from(generator):
        def coin(image, seed):
            flip = generator.uniform([]) < 0.5
            return tf.where(flip, tf.image.flip_left_right(image), image)

        return coin

    for start in range(12):
        name = f"stateful_coin_{start}"
        register_augmentation(name)(coin_from(tf.random.Generator.from_seed(start)))
        with pytest.raises(AugmentOpError, match="different outputs for the same seed"):
            run(name, image(), seeds(1)[0])


def test_an_op_returning_another_dtype_is_refused_naming_it(user_ops, png_dataset):
    # A uint8 0..255 result came out as the dataset's images (bfloat16 up to
    # 255 with dtype="bfloat16"), or failed in normalize's Sub, unnamed.
    @register_augmentation("random_negative_uint8")
    def random_negative_uint8(image, seed):
        negative = tf.random.stateless_uniform([], seed) < 0.5
        return tf.cast(tf.where(negative, 1.0 - image, image) * 255.0, tf.uint8)

    def to_uint8(image):
        return tf.cast(image * 255.0, tf.uint8)

    register_augmentation("random_same_uint8", inference=to_uint8)(random_negative_uint8)
    refused = (
        r"^augmentation op '{}' returned a uint8 image; augmentation ops take and return "
        r"float32 images in \[0, 1\]"
    )
    path = png_dataset.dataset_dir
    for kwargs in ({}, {"dtype": "bfloat16"}, {"normalize": True}):
        with pytest.raises(AugmentOpError, match=refused.format("random_negative_uint8")):
            kiln.reader.load(
                path, batch_size=8, seed=1, augment=["random_negative_uint8"], **kwargs
            )
    # Its inference form too (validation), and in the model-side layer.
    with pytest.raises(AugmentOpError, match=refused.format("random_same_uint8")):
        kiln.reader.load(path, "validation", batch_size=8, augment=["random_same_uint8"])
    dataset, layer = kiln.reader.load_for_model(
        path, batch_size=8, seed=1, augment=["random_negative_uint8"]
    )
    inputs, _ = next(iter(dataset))
    with pytest.raises(AugmentOpError, match="returned a uint8 image"):
        layer(inputs, training=True)


def test_an_op_changing_the_channels_is_refused_naming_it(user_ops, png_dataset):
    # An RGB to gray op made 1-channel batches from a dataset kiln.json says
    # has 3 channels: normalize's per-channel statistics and the model's
    # input no longer match, and nothing said so.
    @register_augmentation("random_gray")
    def random_gray(image, seed):
        gray = tf.image.rgb_to_grayscale(image)
        return tf.where(tf.random.stateless_uniform([], seed) < 0.5, gray, gray * 0.5)

    path = png_dataset.dataset_dir
    with pytest.raises(
        AugmentOpError,
        match=r"^augmentation op 'random_gray' returned an image of 1 channels from one of 3",
    ):
        kiln.reader.load(path, batch_size=8, seed=1, augment=["random_gray"])
    dataset, layer = kiln.reader.load_for_model(path, batch_size=8, seed=1, augment=["random_gray"])
    inputs, _ = next(iter(dataset))
    with pytest.raises(AugmentOpError, match="returned an image of 1 channels"):
        layer(inputs, training=True)


def test_op_calling_numpy_fails_at_trace_time_with_an_explanation(user_ops):
    @register_augmentation("numpy_brightness")
    def numpy_brightness(image, seed):
        delta = np.random.default_rng(int(seed.numpy()[0])).uniform(-0.1, 0.1)
        return image + delta

    with pytest.raises(AugmentOpError) as error:
        run("numpy_brightness", image(), seeds(1)[0])
    message = str(error.value)
    assert "'numpy_brightness' cannot run inside tf.data" in message
    assert ".numpy()" in message and "symbolic tensor" in message


def test_user_op_checks_guard_the_reader(user_ops, png_dataset):
    @register_augmentation("numpy_noise")
    def numpy_noise(image, seed):
        return image + np.random.uniform(-0.1, 0.1)

    @register_augmentation("python_if")
    def python_if(image, seed):
        if tf.random.stateless_uniform([], seed) < 0.5:  # needs tf.cond
            return image[:, ::-1]
        return image

    # Raised by load(), before anything is read.
    with pytest.raises(AugmentOpError, match="'numpy_noise' ignores its seed"):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, augment=["numpy_noise"])
    with pytest.raises(AugmentOpError, match=r"'python_if' cannot run inside tf\.data.*tf\.cond"):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, augment=["python_if"])


def test_user_op_in_the_reader(user_ops, png_dataset):
    @register_augmentation("random_invert")
    def random_invert(image, seed, *, probability: float = 0.5):
        return tf.where(tf.random.stateless_uniform([], seed) < probability, 1.0 - image, image)

    plain = kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=1, augment=None)
    inverted = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=8, seed=1, augment=["random_invert"]
    )
    outcomes = []
    for (a, _), (b, _) in zip(plain, inverted, strict=True):
        for before, after in zip(a.numpy(), b.numpy(), strict=True):
            if np.allclose(after, 1.0 - before, atol=1e-6):
                outcomes.append("inverted")
            else:
                np.testing.assert_array_equal(after, before)
                outcomes.append("kept")
    assert set(outcomes) == {"inverted", "kept"}


# --- the built-in ops ------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "random_flip_left_right",
        "random_flip_up_down",
        {"random_crop": {"size": [12, 10]}},
        {"random_resized_crop": {"size": 8}},
        "random_brightness",
        "random_contrast",
        "random_saturation",
        "random_hue",
        "color_jitter",
        "random_rotation",
        "random_erasing",
        {"random_grayscale": {"probability": 0.5}},
    ],
)
def test_op_is_a_function_of_its_seed(spec):
    img = image()
    a, b, c = seeds(3)
    first = run(spec, img, a).numpy()
    np.testing.assert_array_equal(first, run(spec, img, a).numpy())
    outputs = [run(spec, img, s).numpy() for s in seeds(12)]
    assert any(not np.array_equal(outputs[0], o) for o in outputs[1:])
    assert first.dtype == np.float32 and 0.0 <= first.min() and first.max() <= 1.0


def test_flips_and_probability_extremes():
    img = image()
    s = seeds(1)[0]
    np.testing.assert_array_equal(
        run({"random_flip_left_right": {"probability": 1.0}}, img, s), img[:, ::-1]
    )
    np.testing.assert_array_equal(
        run({"random_flip_up_down": {"probability": 1.0}}, img, s), img[::-1]
    )
    np.testing.assert_array_equal(
        run({"random_flip_left_right": {"probability": 0.0}}, img, s), img
    )
    np.testing.assert_array_equal(run({"random_erasing": {"probability": 0.0}}, img, s), img)


def test_reregistering_a_name_checks_the_new_function(user_ops):
    @register_augmentation("my_flip")
    def good(image, seed):
        return tf.cond(
            tf.random.stateless_uniform([], seed) < 0.5, lambda: image[:, ::-1], lambda: image
        )

    run("my_flip", image(), seeds(1)[0])
    AUGMENTATIONS.remove("my_flip")

    @register_augmentation("my_flip")
    def bad(image, seed):
        return image[:, ::-1] if random.random() < 0.5 else image

    with pytest.raises(AugmentOpError, match="'my_flip' ignores its seed"):
        run("my_flip", image(), seeds(1)[0])


@pytest.mark.parametrize(
    "spec",
    [
        {"random_resized_crop": {"size": 12, "scale_range": [0.05, 1]}},
        {"random_crop": {"size": [17, 9]}},
    ],
)
@pytest.mark.parametrize("training", [True, False])
def test_fused_jpeg_window_decoding_equals_decode_then_crop(spec, training):
    # 4:2:0 chroma: decoding only a window upsamples chroma at its edges
    # differently unless the window has context around it.
    pixels = tf.cast(tf.random.stateless_uniform([61, 47, 3], [5, 6], maxval=256), tf.uint8)
    encoded = tf.io.encode_jpeg(pixels, quality=75, chroma_downsampling=True)
    features = {
        "image": encoded,
        "height": tf.constant(61, tf.int64),
        "width": tf.constant(47, tf.int64),
    }
    augmenter = Augmenter(tuple(validate([spec, "random_flip_left_right"])), training=training)
    full = tf.io.decode_jpeg(encoded, channels=3)
    for s in seeds(40):
        fused = augmenter.decode_and_apply(
            features, s, encoding="jpeg", channels=3, image_size=None
        )
        np.testing.assert_array_equal(fused, augmenter.apply(full, s))


@pytest.mark.parametrize("spec", COLOUR_SPECS)
def test_colour_ops_read_uint8_as_pixel_over_255(spec):
    # The reader hands colour ops the uint8 crop window.
    pixels = tf.cast(tf.random.stateless_uniform([20, 16, 3], [7, 8], maxval=256), tf.uint8)
    as_float = tf.cast(pixels, tf.float32) / 255.0
    (op,) = validate([spec])
    for s in seeds(8):
        out = op.definition.fn(pixels, s, **op.kwargs)
        assert out.dtype == tf.float32
        np.testing.assert_allclose(out, op.definition.fn(as_float, s, **op.kwargs), atol=2e-6)


def test_every_colour_op_has_a_levels_form():
    names = {name for name in AUGMENTATIONS.names() if AUGMENTATIONS.get(name).pixelwise}
    assert names == {next(iter(s)) if isinstance(s, dict) else s for s in COLOUR_SPECS}
    assert all(AUGMENTATIONS.get(name).levels is not None for name in names)


@pytest.mark.parametrize("spec", COLOUR_SPECS)
@pytest.mark.parametrize("dtype", [tf.uint8, tf.float32])
def test_a_colour_ops_levels_form_is_its_output_times_255_plus_a_half(spec, dtype):
    # For uint8 output the reader runs the last colour op before the crop's
    # resize as levels (255 x + 0.5), so a truncating cast rounds.
    pixels = tf.cast(tf.random.stateless_uniform([20, 16, 3], [7, 8], maxval=256), tf.uint8)
    image = pixels if dtype == tf.uint8 else tf.cast(pixels, tf.float32) / 255.0
    (op,) = validate([spec])
    for s in seeds(8):
        levels = op.definition.levels(image, s, **op.kwargs)
        assert levels.dtype == tf.float32 and levels.shape == image.shape
        out = op.definition.fn(image, s, **op.kwargs)
        np.testing.assert_allclose(levels, 255.0 * out + 0.5, atol=2e-4)
        assert 0.5 <= float(tf.reduce_min(levels)) and float(tf.reduce_max(levels)) <= 255.5
    # The form leaves nothing behind: the op alone gives floats in [0, 1] again.
    assert float(tf.reduce_max(op.definition.fn(image, seeds(1)[0], **op.kwargs))) <= 1.0


def test_uint8_output_after_colour_ops_rounds_by_the_cast_alone():
    # The levels form's point: no pass to scale the window, none to round the
    # output. Pinned in the graph, values as the float path's, rounded.
    pixels = tf.cast(tf.random.stateless_uniform([40, 36, 3], [1, 9], maxval=256), tf.uint8)
    features = {"image": tf.io.encode_jpeg(pixels, quality=95)}
    augmenter = Augmenter(
        tuple(
            validate(
                [{"random_resized_crop": {"size": 24}}, "random_flip_left_right", "color_jitter"]
            )
        )
    )

    def decode(seed, uint8):
        return augmenter.decode_and_apply(
            features, seed, encoding="jpeg", channels=3, image_size=None, uint8=uint8
        )

    graph = (
        tf.function(lambda s: decode(s, True))
        .get_concrete_function(tf.TensorSpec([2], tf.int32))
        .graph
    )
    assert "Round" not in {op.type for op in graph.get_operations()}
    for s in seeds(12):
        small = decode(s, True).numpy().astype(np.int16)
        scaled = decode(s, False).numpy() * 255.0
        difference = np.abs(small - np.round(scaled))
        assert difference.max() <= 1
        assert np.all(np.abs(scaled - np.floor(scaled) - 0.5)[difference > 0] < 1e-3)


def test_flips_and_colour_run_on_the_window_before_its_resize():
    # The reader moves flips and colour ops past the crop's resize. Flipping
    # commutes with it; a colour op that does not clip (mid-range pixels, a
    # small brightness change) gives what it gives after the resize.
    pixels = tf.cast(
        tf.random.stateless_uniform([40, 36, 3], [1, 9], minval=80, maxval=170), tf.uint8
    )
    specs = [
        {"random_resized_crop": {"size": [24, 28], "scale_range": [0.2, 1.0]}},
        {"random_flip_left_right": {"probability": 0.5}},
        {"random_brightness": {"max_delta": 0.1}},
    ]
    resolved = validate(specs)
    augmenter = Augmenter(tuple(resolved))
    for s in seeds(12):
        image = tf.cast(pixels, tf.float32) / 255.0
        for index, op in enumerate(resolved):  # one by one, in list order
            image = op.definition.fn(image, tf.random.fold_in(s, index), **op.kwargs)
        np.testing.assert_allclose(augmenter.apply(pixels, s), image, atol=2e-6)


def test_random_crop_takes_a_window_of_the_image():
    img = image(20, 16)
    for s in seeds(8):
        out = run({"random_crop": {"size": [12, 10]}}, img, s).numpy()
        assert out.shape == (12, 10, 3)
        windows = [img[y : y + 12, x : x + 10].numpy() for y in range(9) for x in range(7)]
        assert any(np.array_equal(out, w) for w in windows)


def test_random_crop_larger_than_image_fails_clearly():
    with pytest.raises(tf.errors.InvalidArgumentError, match="smaller than the crop size"):
        run({"random_crop": {"size": [32, 32]}}, image(20, 16), seeds(1)[0])


def test_random_resized_crop_respects_scale_and_output_size():
    img = tf.cast(tf.reshape(tf.range(40 * 40 * 3) % 251, [40, 40, 3]), tf.uint8)
    spec = {
        "random_resized_crop": {
            "size": [10, 14],
            "scale_range": [0.25, 0.5],
            "ratio_range": [1.0, 1.0],
        }
    }
    definition = validate([spec])[0]
    for s in seeds(10):
        op_seed = tf.random.fold_in(s, 0)
        offset, size = definition.definition.window.sample(
            tf.constant([40, 40]), op_seed, **definition.kwargs
        )
        area = float(size[0] * size[1]) / (40 * 40)
        assert 0.25 - 0.03 <= area <= 0.5 + 0.03 and abs(int(size[0]) - int(size[1])) <= 1
        assert 0 <= int(offset[0]) <= 40 - int(size[0]) and 0 <= int(offset[1]) <= 40 - int(size[1])
        out = run(spec, img, s)
        expected = (
            tf.image.resize(
                img[offset[0] : offset[0] + size[0], offset[1] : offset[1] + size[1]], [10, 14]
            )
            / 255.0
        )
        np.testing.assert_allclose(out, expected, atol=1e-6)


def test_inference_forms_are_deterministic_and_keep_the_output_size():
    img = image(20, 30)
    augmenter = Augmenter(
        tuple(
            validate(
                [{"random_resized_crop": {"size": 10}}, "random_flip_left_right", "color_jitter"]
            )
        ),
        training=False,
    )
    out = augmenter.apply(img, None).numpy()
    assert out.shape == (10, 10, 3)
    # The largest centred square (20x20 of 20x30), resized; flip and jitter do nothing.
    np.testing.assert_allclose(out, tf.image.resize(img[:, 5:25], [10, 10]), atol=1e-6)
    crop = Augmenter(tuple(validate([{"random_crop": {"size": [10, 10]}}])), training=False)
    np.testing.assert_array_equal(crop.apply(img, None), img[5:15, 10:20])


# RGB -> YIQ (the colour space of `color_twist`'s hue rotation, as documented).
_TO_YIQ = np.array(
    [[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]]
)


def _twisted(pixels, *, brightness, contrast, saturation, hue):
    """`color_twist`'s documented map in float64: clip(c H S p + b + (1 - c) mean luma)."""
    rgb = pixels.astype(np.float64) / 255.0
    luma = rgb @ _TO_YIQ[0]
    saturated = luma[..., None] + saturation * (rgb - luma[..., None])
    yiq = saturated @ _TO_YIQ.T
    cos, sin = np.cos(2 * np.pi * hue), np.sin(2 * np.pi * hue)
    turned = np.stack(
        [yiq[..., 0], cos * yiq[..., 1] - sin * yiq[..., 2], sin * yiq[..., 1] + cos * yiq[..., 2]],
        -1,
    )
    back = turned @ np.linalg.inv(_TO_YIQ).T
    return np.clip(contrast * back + brightness + (1 - contrast) * luma.mean(), 0.0, 1.0)


@pytest.mark.parametrize("height, width", [(1, 1), (5, 7), (8, 3), (13, 16)])
def test_color_twist_mixes_every_pixel_as_rows_of_eight(height, width):
    # The colour matrix runs as one matmul of rows of 8 pixels against a
    # [24, 24] block diagonal: a [pixels, 3] x [3, 3] matmul cost as much as
    # the crop's resize (BENCHMARKS.md). Pixel counts that are not a multiple
    # of 8 are padded; every pixel still gets its own colour.
    pixels = tf.cast(
        tf.random.stateless_uniform([height, width, 3], [3, height], maxval=256), tf.uint8
    )
    params = {"brightness": 0.05, "contrast": 1.3, "saturation": 0.6, "hue": 0.07}
    out = color_twist(pixels, **{k: tf.constant(v) for k, v in params.items()})
    assert out.shape == (height, width, 3)
    np.testing.assert_allclose(out, _twisted(pixels.numpy(), **params), atol=2e-6)

    traced = tf.function(
        lambda image: color_twist(image, **{k: tf.constant(v) for k, v in params.items()})
    ).get_concrete_function(tf.TensorSpec([None, None, 3], tf.uint8))
    pixel_operands = [
        op.inputs[0].shape[-1]
        for op in traced.graph.get_operations()
        if op.type == "MatMul" and op.inputs[0].shape[0] != 1  # not the [1, 4] weights
    ]
    assert pixel_operands == [24]


def test_color_twist_parts():
    img = image()
    grey = np.full((4, 4, 3), 0.3, np.float32)
    # Grey pixels are fixed points of saturation and hue.
    np.testing.assert_allclose(
        color_twist(tf.constant(grey), saturation=tf.constant(1.7), hue=tf.constant(0.2)),
        grey,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        color_twist(img, brightness=tf.constant(0.1)), np.clip(img + 0.1, 0, 1), atol=1e-6
    )
    # Saturation 0 gives the luma in every channel (what random_grayscale uses).
    luma = np.tensordot(img.numpy(), [0.299, 0.587, 0.114], 1)
    np.testing.assert_allclose(
        color_twist(img, saturation=tf.constant(0.0)), np.repeat(luma[..., None], 3, -1), atol=1e-6
    )
    # Contrast scales distances from the mean luma.
    mean = luma.mean()
    np.testing.assert_allclose(
        color_twist(img, contrast=tf.constant(0.5)),
        np.clip(0.5 * img + 0.5 * mean, 0, 1),
        atol=1e-6,
    )
    # A full hue turn is the identity; half a turn changes colours but not luma.
    np.testing.assert_allclose(color_twist(img, hue=tf.constant(1.0)), img, atol=1e-5)
    mid = tf.constant(np.full((2, 2, 3), [0.4, 0.5, 0.6], np.float32))
    turned = color_twist(mid, hue=tf.constant(0.5)).numpy()
    assert not np.allclose(turned, mid)
    np.testing.assert_allclose(
        np.tensordot(turned, [0.299, 0.587, 0.114], 1),
        0.4 * 0.299 + 0.5 * 0.587 + 0.6 * 0.114,
        atol=1e-5,
    )


def test_rgb_only_ops_reject_grey_images():
    with pytest.raises(ValueError, match="'random_saturation' needs 3-channel"):
        run("random_saturation", image(channels=1), seeds(1)[0])
    # Brightness and contrast work on one channel.
    assert run("random_brightness", image(channels=1), seeds(1)[0]).shape == (20, 16, 1)


def test_rotation_by_a_fixed_angle():
    img = image(9, 9)
    spec = {"random_rotation": {"angle_range": [90, 90], "interpolation": "nearest"}}
    # A quarter turn counter-clockwise about the centre of a square image.
    np.testing.assert_allclose(run(spec, img, seeds(1)[0]), np.rot90(img.numpy()), atol=1e-6)


def test_random_erasing_erases_one_rectangle_within_scale():
    img = tf.ones([20, 20, 3])
    spec = {"random_erasing": {"probability": 1.0, "scale_range": [0.1, 0.2], "value": 0.0}}
    for s in seeds(6):
        out = run(spec, img, s).numpy()
        erased = out[..., 0] == 0.0
        rows, cols = np.nonzero(erased)
        assert erased.sum() == (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert 0.05 * 400 <= erased.sum() <= 0.3 * 400


def test_random_erasing_of_zero_area_erases_nothing():
    img = image()
    spec = {"random_erasing": {"probability": 1.0, "scale_range": [0.0, 0.0], "value": 0.5}}
    for s in seeds(6):
        np.testing.assert_array_equal(run(spec, img, s).numpy(), img.numpy())
    # The smallest area that is not 0 still erases a pixel.
    tiny = {"random_erasing": {"probability": 1.0, "scale_range": [1e-6, 1e-6], "value": 0.5}}
    for s in seeds(6):
        assert (run(tiny, img, s).numpy() != img.numpy()).any(axis=-1).sum() == 1


def beta_middle(alpha: float, eps: float) -> float:
    """P(eps < X < 1 - eps) for X ~ Beta(alpha, alpha), exactly (no scipy here).

    ``1 - 2 I_eps(alpha, alpha)``, the regularized incomplete beta function from
    its series ``B(x; a, b) = x^a sum_n (1 - b)_n x^n / (n! (a + n))``.
    """
    total, term, n = 0.0, 1.0, 0
    while True:
        added = term * eps**n / (alpha + n)
        total += added
        if abs(added) < 1e-17 * abs(total):
            break
        n += 1
        term *= (n - alpha) / n
    beta = math.exp(2 * math.lgamma(alpha) - math.lgamma(2 * alpha))
    return 1.0 - 2.0 * eps**alpha * total / beta


def own_weights(spec, count: int = 4000) -> np.ndarray:
    """The weight each element keeps of its own label, one batch of 8 per seed.

    The smallest diagonal entry of the mixed one-hot labels: an element
    keeps ``lam`` (mixup) or ``1 - pasted`` (cutmix) of its own label: its
    partner is always another element.
    """
    augmenter = Augmenter(tuple(validate([spec])))
    images = tf.stack([tf.fill([8, 8, 3], i / 8) for i in range(8)])
    labels = tf.one_hot(tf.range(8), 8)

    def own(seed):
        _, mixed = augmenter.apply_batch(images, labels, tf.tile(seed[None], [8, 1]))
        return tf.reduce_min(tf.linalg.diag_part(mixed))

    batch_seeds = tf.random.split(tf.constant([7, 9]), count)
    return next(iter(tf.data.Dataset.from_tensor_slices(batch_seeds).map(own).batch(count))).numpy()


@pytest.mark.parametrize("alpha", [1e-6, 0.001, 0.01, 0.2])
def test_mixup_weight_is_beta_distributed(alpha):
    lam = own_weights({"mixup": {"alpha": alpha}})
    # Two Gamma(alpha) draws underflowed to the same FLT_MIN: lam was exactly 0.5.
    assert (lam == 0.5).sum() == 0
    middle = beta_middle(alpha, 0.01)
    tolerance = 4 * math.sqrt(middle * (1 - middle) / lam.size) + 2 / lam.size
    assert ((lam > 0.01) & (lam < 0.99)).mean() == pytest.approx(middle, abs=tolerance)
    # Symmetric: as many near 0 as near 1.
    assert (lam <= 0.5).mean() == pytest.approx(0.5, abs=4 * math.sqrt(0.25 / lam.size))


def test_mixup_weight_with_alpha_one_is_uniform():
    lam = np.sort(own_weights({"mixup": {"alpha": 1.0}}))
    # Kolmogorov-Smirnov distance to U(0, 1), against its 1% critical value.
    cdf = np.arange(1, lam.size + 1) / lam.size
    distance = max(np.max(cdf - lam), np.max(lam - (cdf - 1 / lam.size)))
    assert distance < 1.63 / math.sqrt(lam.size)


def test_cutmix_with_small_alpha_pastes_nothing_or_most():
    kept = own_weights({"cutmix": {"alpha": 1e-6}})
    # lam ~ Beta(1e-6, 1e-6) is 0 or 1 (each half the time): nothing is
    # pasted, or a rectangle the size of the image, clipped (at least a quarter).
    assert (kept == 1.0).mean() == pytest.approx(0.5, abs=4 * math.sqrt(0.25 / kept.size))
    assert np.all((kept == 1.0) | (kept <= 0.75))


def test_mixup_and_cutmix_mix_labels_by_the_pixels_they_mix():
    images = tf.stack([tf.fill([8, 8, 3], float(i) / 10) for i in range(6)])
    labels = tf.one_hot(tf.range(6), 6)
    augmenter = Augmenter(tuple(validate([{"mixup": {"alpha": 0.4}}, "cutmix"])))
    mix = Augmenter(tuple(validate(["mixup"])))
    element_seeds = tf.stack(seeds(6))
    mixed, mixed_labels = mix.apply_batch(images, labels, element_seeds)
    np.testing.assert_allclose(tf.reduce_sum(mixed_labels, 1), 1.0, atol=1e-6)
    # Each image is lam * itself + (1 - lam) * its partner; labels say the same.
    partners = []
    for i in range(6):
        row = mixed_labels[i].numpy()
        own = row[i]
        others = [j for j in range(6) if j != i and row[j] > 0]
        partner = others[0] if others else i
        partners.append(partner)
        expected = own * images[i] + (1 - own) * images[partner]
        np.testing.assert_allclose(mixed[i], expected, atol=1e-5)
    assert partners != list(range(6))
    cut = Augmenter(tuple(validate([{"cutmix": {"alpha": 1.0}}])))
    out, out_labels = cut.apply_batch(images, labels, element_seeds)
    for i in range(6):
        own = np.isclose(out[i].numpy()[..., 0], i / 10).mean()
        assert out_labels[i, i].numpy() == pytest.approx(own, abs=1e-6) or own == 1.0
    both, both_labels = augmenter.apply_batch(images, labels, element_seeds)
    np.testing.assert_allclose(tf.reduce_sum(both_labels, 1), 1.0, atol=1e-6)


def _prose(name: str) -> str:
    """A doc of the repository with its line breaks (and comment marks) as single spaces."""
    text = (pathlib.Path(__file__).parents[2] / name).read_text(encoding="utf-8")
    return re.sub(r"\s+(?:# )?", " ", text)


def test_the_docs_give_random_resized_crops_inference_form_as_validation_gets_it(png_dataset):
    path = png_dataset.dataset_dir
    crop = [{"random_resized_crop": {"size": 24, "scale_range": [0.5, 1.0]}}]
    validation = next(iter(kiln.reader.load(path, "validation", batch_size=4, augment=crop)))[0]
    stored = next(iter(kiln.reader.load(path, "validation", batch_size=4, augment=None)))[0]
    assert stored.shape[1] == stored.shape[2]  # square images, square output
    # The whole image resized, not a centre crop of the output's size.
    np.testing.assert_array_equal(validation, tf.image.resize(stored, [24, 24]))
    margin = (stored.shape[1] - 24) // 2
    assert not np.allclose(validation, stored[:, margin : margin + 24, margin : margin + 24])
    described = (
        "`random_resized_crop` the largest centred window of the output's aspect ratio "
        "resized to its size"
    )
    for doc in ("README.md", "docs/augmentations.md"):
        assert described in _prose(doc), doc
    # The README's load_for_model example: the demo's stored list starts with
    # random_resized_crop to 56x56 from 64x64 images.
    assert "deterministic form (here random_resized_crop's: the whole 64x64 image resized" in (
        _prose("README.md")
    )


def test_the_docs_derive_element_seeds_from_the_record_key_not_its_position():
    # kiln.reader.seeds: (seed, pass, the record's key); the element's position
    # and the input pipeline reading it play no part.
    for doc in ("README.md", "docs/augmentations.md"):
        derivations = re.findall(
            r"derived with stateless (?:TF )?ops from \(([^)]*)\)", _prose(doc)
        )
        assert derivations, doc
        for inputs in derivations:
            assert "key" in inputs and "position" not in inputs and "pipeline" not in inputs, (
                doc,
                inputs,
            )
