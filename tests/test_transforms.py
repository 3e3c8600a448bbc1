"""Kernel tests for the built-in offline transforms, config validation and plugins."""

import pickle
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kiln import transforms
from kiln.transforms import TransformConfigError, TransformError
from kiln.transforms import functional as F
from kiln.transforms.chain import TRANSFORMS
from kiln.transforms.targets import Targets


def gray(rows):
    """A one-channel HxWx1 uint8 image from nested lists."""
    return np.asarray(rows, np.uint8)[:, :, np.newaxis]


def arange_image(height, width, channels=1):
    return np.arange(height * width * channels, dtype=np.uint8).reshape(height, width, channels)


# --- center_crop ------------------------------------------------------------------


def test_center_crop_takes_the_middle_window():
    image = arange_image(5, 4)  # rows 0-3, 4-7, ..., 16-19
    np.testing.assert_array_equal(
        F.center_crop(image, size=[3, 2]), gray([[5, 6], [9, 10], [13, 14]])
    )


def test_center_crop_odd_margin_cuts_the_extra_from_bottom_and_right():
    image = arange_image(5, 4)
    # Height margin 3 -> 1 above, 2 below; width margin 1 -> 0 left, 1 right.
    np.testing.assert_array_equal(F.center_crop(image, size=[2, 3]), gray([[4, 5, 6], [8, 9, 10]]))


def test_center_crop_int_size_is_square_and_keeps_rgb():
    image = arange_image(4, 4, 3)
    out = F.center_crop(image, size=2)
    assert out.shape == (2, 2, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, image[1:3, 1:3])


def test_center_crop_of_a_smaller_image_raises_transform_error_naming_sizes():
    with pytest.raises(TransformError, match=r"5x4.*6x6"):
        F.center_crop(arange_image(5, 4), size=6)
    assert issubclass(TransformError, ValueError)


# --- pad and letterbox ---------------------------------------------------------------


def test_pad_to_size_centres_with_the_fill_value():
    out = F.pad(gray([[1, 2, 3], [4, 5, 6]]), size=[4, 6], value=7)
    np.testing.assert_array_equal(
        out,
        gray(
            [
                [7, 7, 7, 7, 7, 7],
                [7, 1, 2, 3, 7, 7],
                [7, 4, 5, 6, 7, 7],
                [7, 7, 7, 7, 7, 7],
            ]
        ),
    )


def test_pad_to_square_adds_the_odd_row_at_the_bottom():
    out = F.pad(gray([[1, 2, 3], [4, 5, 6]]), to_square=True)
    np.testing.assert_array_equal(out, gray([[1, 2, 3], [4, 5, 6], [0, 0, 0]]))
    tall = F.pad(gray([[1], [2], [3]]), to_square=True, value=9)
    np.testing.assert_array_equal(tall, gray([[9, 1, 9], [9, 2, 9], [9, 3, 9]]))


def test_pad_rgb_fill_colour_and_its_gray_level_on_one_channel():
    rgb = F.pad(np.zeros((1, 1, 3), np.uint8), size=[1, 3], value=[255, 0, 0])
    np.testing.assert_array_equal(rgb[0], [[255, 0, 0], [0, 0, 0], [255, 0, 0]])
    one = F.pad(gray([[0]]), size=[1, 3], value=[255, 0, 0])
    np.testing.assert_array_equal(one, gray([[76, 0, 76]]))  # ITU-R 601 red


def test_pad_smaller_than_the_image_raises_transform_error():
    with pytest.raises(TransformError, match=r"2x3.*2x2"):
        F.pad(gray([[1, 2, 3], [4, 5, 6]]), size=[2, 2])


def test_pad_needs_exactly_one_of_size_and_to_square():
    with pytest.raises(ValueError, match="exactly one of size and to_square"):
        F.pad(gray([[1]]))
    with pytest.raises(ValueError, match="exactly one of size and to_square"):
        F.pad(gray([[1]]), size=3, to_square=True)


def test_letterbox_fits_then_pads():
    # 1x2 into 4x4: the width limits (scale 2), so 2x4 content with one bar above and below.
    out = F.letterbox(gray([[10, 20]]), size=4, value=9, interpolation="nearest")
    np.testing.assert_array_equal(
        out,
        gray(
            [
                [9, 9, 9, 9],
                [10, 10, 20, 20],
                [10, 10, 20, 20],
                [9, 9, 9, 9],
            ]
        ),
    )


def test_letterbox_height_limited_shrinks_with_rounded_width():
    image = np.full((10, 5, 3), 200, np.uint8)
    out = F.letterbox(image, size=[4, 4], value=[1, 2, 3])
    # Height 10 -> 4 (scale 0.4), width 5 -> round(2.0) = 2, bars of 1 column each side.
    assert out.shape == (4, 4, 3)
    np.testing.assert_array_equal(out[:, 1:3], np.full((4, 2, 3), 200, np.uint8))
    np.testing.assert_array_equal(out[:, 0], np.tile([1, 2, 3], (4, 1)))
    np.testing.assert_array_equal(out[:, 3], np.tile([1, 2, 3], (4, 1)))


# --- resize --------------------------------------------------------------------------


def test_resize_nearest_enlarges_by_repeating_pixels():
    out = F.resize(gray([[1, 2], [3, 4]]), size=4, interpolation="nearest")
    np.testing.assert_array_equal(
        out, gray([[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])
    )


def test_resize_nearest_shrinks_by_sampling_pixel_centres():
    out = F.resize(arange_image(4, 4), size=2, interpolation="nearest")
    np.testing.assert_array_equal(out, gray([[5, 7], [13, 15]]))


def test_resize_area_averages_blocks_and_auto_uses_it_when_shrinking():
    image = (arange_image(4, 4) * 4).astype(np.uint8)  # 2x2 blocks with integer means
    expected = gray([[10, 18], [42, 50]])
    np.testing.assert_array_equal(F.resize(image, size=2, interpolation="area"), expected)
    np.testing.assert_array_equal(F.resize(image, size=2), expected)


def test_resize_linear_uses_pixel_centres():
    out = F.resize(gray([[0, 100]]), size=[1, 4], interpolation="linear")
    np.testing.assert_array_equal(out, gray([[0, 25, 75, 100]]))


def test_resize_auto_enlarges_with_bicubic():
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    auto = F.resize(image, size=[10, 14])
    np.testing.assert_array_equal(auto, F.resize(image, size=[10, 14], interpolation="cubic"))
    assert not np.array_equal(auto, F.resize(image, size=[10, 14], interpolation="area"))


@pytest.mark.parametrize(
    "shape, kwargs, expected",
    [
        ((3, 5, 1), {"shorter_side": 2}, (2, 3, 1)),  # 5 * 2/3 = 3.33 -> 3
        ((2, 3, 3), {"shorter_side": 3}, (3, 5, 3)),  # 3 * 3/2 = 4.5 -> 5 (halves up)
        ((5, 3, 3), {"shorter_side": 2}, (3, 2, 3)),  # portrait
        ((4, 6, 3), {"longer_side": 3}, (2, 3, 3)),
        ((6, 4, 1), {"longer_side": 9}, (9, 6, 1)),
        ((4, 4, 3), {"shorter_side": 7}, (7, 7, 3)),  # square
        ((200, 1, 3), {"longer_side": 10}, (10, 1, 3)),  # never below 1
        ((4, 6, 3), {"size": [3, 5]}, (3, 5, 3)),
        ((4, 6, 1), {"size": 8}, (8, 8, 1)),
    ],
)
def test_resize_output_shapes_and_rounding(shape, kwargs, expected):
    assert F.resize(np.zeros(shape, np.uint8), **kwargs).shape == expected


def test_resize_to_the_same_size_returns_the_pixels_unchanged():
    image = arange_image(3, 4, 3)
    np.testing.assert_array_equal(F.resize(image, size=[3, 4], interpolation="cubic"), image)


def test_resize_needs_exactly_one_size():
    with pytest.raises(ValueError, match="exactly one of shorter_side, longer_side, size"):
        F.resize(arange_image(2, 2))
    with pytest.raises(ValueError, match="got shorter_side and size"):
        F.resize(arange_image(2, 2), shorter_side=2, size=3)


# --- to_grayscale -------------------------------------------------------------------


def test_to_grayscale_uses_itu_r_601_weights():
    image = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30]]], np.uint8)
    # 0.299 R + 0.587 G + 0.114 B, rounded: 76.2, 149.7, 29.1, 18.15
    np.testing.assert_array_equal(F.to_grayscale(image), gray([[76, 150, 29, 18]]))


def test_to_grayscale_keep_channels_repeats_luma_and_gray_passes_through():
    image = np.array([[[255, 0, 0]]], np.uint8)
    np.testing.assert_array_equal(F.to_grayscale(image, keep_channels=True), [[[76, 76, 76]]])
    one = gray([[3, 4]])
    np.testing.assert_array_equal(F.to_grayscale(one), one)
    np.testing.assert_array_equal(F.to_grayscale(one, keep_channels=True)[0, 1], [4, 4, 4])


# --- equalize -----------------------------------------------------------------------


def test_equalize_spreads_levels_over_the_full_range():
    np.testing.assert_array_equal(F.equalize(gray([[10, 20, 30, 40]])), gray([[0, 85, 170, 255]]))
    np.testing.assert_array_equal(
        F.equalize(gray([[10, 20], [10, 20]])), gray([[0, 255], [0, 255]])
    )


def test_equalize_rgb_works_on_luma_and_keeps_hue():
    grays = np.repeat(gray([[10, 20, 30, 40]]), 3, axis=2)
    np.testing.assert_array_equal(
        F.equalize(grays), np.repeat(gray([[0, 85, 170, 255]]), 3, axis=2)
    )
    reds = np.array([[[100, 50, 50], [110, 60, 60]]], np.uint8)
    out = F.equalize(reds)
    assert F.to_grayscale(out)[0, 0, 0] <= 12 and F.to_grayscale(out)[0, 1, 0] >= 243
    assert out[0, 1, 0] > out[0, 1, 1] and out[0, 1, 0] > out[0, 1, 2]  # still reddish


# --- common contract ----------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((4, 4), np.uint8),  # no channel axis
        np.zeros((4, 4, 4), np.uint8),  # RGBA
        np.zeros((4, 4, 3), np.float32),  # not uint8
    ],
)
def test_kernels_reject_arrays_that_are_not_uint8_hwc(bad):
    with pytest.raises(ValueError, match="uint8 HxWxC"):
        F.center_crop(bad, size=2)


def test_kernels_do_not_modify_their_input_and_are_deterministic_across_threads():
    image = np.random.default_rng(1).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    before = image.copy()
    chain = transforms.parse(
        [
            {"resize": {"shorter_side": 24}},
            {"center_crop": {"size": 20}},
            {"letterbox": {"size": [16, 30]}},
            "equalize",
            "to_grayscale",
        ]
    )
    expected = chain(image)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: chain(image), range(16)))
    for result in results:
        assert result.tobytes() == expected.tobytes()
    np.testing.assert_array_equal(image, before)


# --- config validation --------------------------------------------------------------


def test_parse_builds_a_chain_with_defaults_filled_in():
    chain = transforms.parse(
        [{"resize": {"shorter_side": 72}}, {"center_crop": {"size": [64, 60]}}, "to_grayscale"]
    )
    assert chain.to_json() == [
        {
            "resize": {
                "shorter_side": 72,
                "longer_side": None,
                "size": None,
                "interpolation": "auto",
            }
        },
        {"center_crop": {"size": [64, 60]}},
        {"to_grayscale": {"keep_channels": False}},
    ]
    out = chain(np.zeros((90, 120, 3), np.uint8))
    assert out.shape == (64, 60, 1)


@pytest.mark.parametrize(
    "specs, message",
    [
        (
            ["blur"],
            # Close to no known name: most likely one's own, not registered.
            r"^transforms\[0\]: unknown offline transform 'blur' \(known: center_crop, .*, "
            r"to_grayscale\); a transform of your own is registered with "
            r"@kiln\.transforms\.register in a module the config names under plugins:$",
        ),
        (
            ["resise"],
            r"^transforms\[0\]: unknown offline transform 'resise'; did you mean 'resize'\?$",
        ),
        (
            [{"resize": {"size": "64"}}],
            r"^transforms\[0\]\.resize\.size: expected a positive integer or \[height, width\]",
        ),
        (
            [{"resize": {"size": [64, 64, 3]}}],
            r"^transforms\[0\]\.resize\.size: expected a positive integer",
        ),
        ([{"resize": {"size": True}}], r"^transforms\[0\]\.resize\.size: "),
        (
            ["to_grayscale", {"resize": {"shorter_side": 0}}],
            r"^transforms\[1\]\.resize\.shorter_side: must be > 0, got 0",
        ),
        (
            [{"resize": {"shorter_side": "72"}}],
            r"^transforms\[0\]\.resize\.shorter_side: expected an integer, got '72'",
        ),
        (
            [{"resize": {"size": 8, "interpolation": "bilinear"}}],
            r"^transforms\[0\]\.resize\.interpolation: expected one of \['auto', 'area', ",
        ),
        (
            [{"resize": {"size": 8, "sise": 9}}],
            r"^transforms\[0\]\.resize\.sise: unknown parameter; did you mean 'size'\?$",
        ),
        (
            [{"pad": {"size": 8, "value": 256}}],
            r"^transforms\[0\]\.pad\.value: expected a level 0\.\.255",
        ),
        ([{"pad": {"size": 8, "value": [1, 2]}}], r"^transforms\[0\]\.pad\.value: "),
        (
            [{"center_crop": {}}],
            r"^transforms\[0\]\.center_crop\.size: required parameter is missing",
        ),
        ([{"center_crop": 64}], r"^transforms\[0\]\.center_crop: parameters must be a mapping"),
        (
            [{"resize": {}, "pad": {}}],
            r"^transforms\[0\]: expected a transform name or a one-key mapping",
        ),
        # Rules across parameters are checked at config time too, naming the parameters.
        (
            [{"resize": {}}],
            r"^transforms\[0\]\.resize: "
            r"give exactly one of shorter_side, longer_side, size \(got none\)",
        ),
        (
            [{"resize": {"shorter_side": 8, "size": 8}}],
            r"^transforms\[0\]\.resize: .*got shorter_side and size",
        ),
        ([{"pad": {"value": 3}}], r"^transforms\[0\]\.pad: give exactly one of size and to_square"),
    ],
)
def test_parse_reports_the_entry_and_field(specs, message):
    with pytest.raises(TransformConfigError, match=message):
        transforms.parse(specs)


def test_parse_names_the_config_field_it_was_given():
    with pytest.raises(TransformConfigError, match=r"^preview\.transforms\[0\]"):
        transforms.parse(["nope"], field="preview.transforms")


def test_chain_to_json_round_trips_and_chains_pickle():
    chain = transforms.parse(
        [
            {"letterbox": {"size": [20, 30], "value": [1, 2, 3]}},
            {"pad": {"to_square": True}},
            {"resize": {"longer_side": 12}},
        ]
    )
    assert transforms.parse(chain.to_json()) == chain
    restored = pickle.loads(pickle.dumps(chain))
    assert restored == chain
    image = np.random.default_rng(2).integers(0, 256, (13, 29, 3), dtype=np.uint8)
    np.testing.assert_array_equal(restored(image), chain(image))
    single = pickle.loads(pickle.dumps(chain.transforms[0]))
    np.testing.assert_array_equal(single(image), chain.transforms[0](image))


# --- user plugins -------------------------------------------------------------------

PLUGIN = '''
"""A user's own offline transform, registered by name."""
from typing import Annotated

import numpy as np
from pydantic import Field

from kiln.transforms import register


def _check(*, low, high):
    if low >= high:
        raise ValueError(f"low ({low}) must be below high ({high})")


@register("clamp_levels", check=_check)
def clamp_levels(image, *, low: Annotated[int, Field(ge=0, le=255)] = 0,
                 high: Annotated[int, Field(ge=0, le=255)] = 255):
    _check(low=low, high=high)
    return np.clip(image, low, high).astype(np.uint8)
'''


def test_user_plugin_is_imported_by_name_validated_and_applied(tmp_path, monkeypatch):
    (tmp_path / "kiln_test_user_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kiln_test_user_plugin", raising=False)
    transforms.import_plugins(["kiln_test_user_plugin"])
    assert "clamp_levels" in transforms.names()

    chain = transforms.parse([{"clamp_levels": {"low": 10, "high": 20}}])
    np.testing.assert_array_equal(chain(gray([[0, 15, 30]])), gray([[10, 15, 20]]))
    # A pickled chain refers to the plugin by name: it works where the module is imported.
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(chain))(gray([[99]])), gray([[20]]))

    with pytest.raises(TransformConfigError, match=r"transforms\[0\]\.clamp_levels\.high: "):
        transforms.parse([{"clamp_levels": {"high": 300}}])
    with pytest.raises(
        TransformConfigError,
        match=r"transforms\[0\]\.clamp_levels: low \(30\) must be below high \(20\)",
    ):
        transforms.parse([{"clamp_levels": {"low": 30, "high": 20}}])


def test_import_plugins_reports_a_missing_module():
    with pytest.raises(
        TransformConfigError, match=r"plugins\[0\]: cannot import module 'no_such_kiln_plugin'"
    ):
        transforms.import_plugins(["no_such_kiln_plugin"])


def test_register_refuses_bad_signatures_and_taken_names():
    with pytest.raises(ValueError, match="must be keyword-only"):
        transforms.register("kiln_test_positional")(lambda image, size: image)
    with pytest.raises(ValueError, match=r"parameter 'level' has no type annotation"):
        transforms.register("kiln_test_unannotated")(lambda image, *, level=3: image)
    with pytest.raises(ValueError, match="already registered"):
        transforms.register("resize")(lambda image: image)


def test_a_transform_that_returns_no_uint8_image_is_named():
    # A user's transform that forgets to convert back: the file is dropped
    # (TransformError) naming the transform, not "the transforms returned".
    def to_float(image):
        return image.astype(np.float32) / 255

    transforms.register("kiln_test_to_float", geometry="none")(to_float)
    try:
        chain = transforms.parse([{"resize": {"shorter_side": 8}}, "kiln_test_to_float"])
        image = np.full((16, 12, 3), 100, np.uint8)
        message = (
            r"^transforms\[1\]\.kiln_test_to_float returned a float32 array of shape "
            r"\(11, 8, 3\); a transform returns a uint8 HxWxC array$"
        )
        with pytest.raises(transforms.TransformError, match=message):
            chain(image)
        with pytest.raises(transforms.TransformError, match=message):
            chain.apply(image, Targets(boxes=np.zeros((0, 4))), min_visibility=0.0)
    finally:
        TRANSFORMS.remove("kiln_test_to_float")
