"""JPEGs decoded at 1/2, 1/4 or 1/8 when the chain's first resize shrinks them anyway.

The reduced path (`decode_with_orientation` with ``jpeg_reduction``, then
`decode_scale.with_resize_to`'s chain) against the full one (a full decode,
then the chain as configured): the same output size for every input size
and orientation, pixels within a small mean difference, targets that still
follow the image.
"""

from __future__ import annotations

import functools
import io

import cv2
import numpy as np
import pytest
from PIL import Image

from kiln import transforms
from kiln.transforms import decode_scale
from test_transform_targets import IGNORE, check_follows, draw_scene

SHORTER_256 = transforms.parse([{"resize": {"shorter_side": 256}}, {"center_crop": {"size": 224}}])


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB image with an asymmetric gradient (a wrong flip or turn shows)."""
    rng = np.random.default_rng(seed)
    noise = cv2.GaussianBlur(rng.integers(0, 256, (height, width, 3), np.uint8), (0, 0), 4)
    ys, xs = np.mgrid[0:height, 0:width]
    ramp = (200 * xs / max(width - 1, 1) + 50 * ys / max(height - 1, 1)).astype(np.int32)
    image = noise.astype(np.int32) // 3 + ramp[:, :, None] * np.array([1, 0, 0]) // 2
    image[: height // 4, : width // 4] = (0, 220, 40)  # a block in the top left corner
    return np.clip(image, 0, 255).astype(np.uint8)


def jpeg(image: np.ndarray, orientation: int = 1, mode: str = "RGB", **options) -> bytes:
    picture = Image.fromarray(image)
    if mode != "RGB":
        picture = picture.convert(mode)
    buffer = io.BytesIO()
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    options.setdefault("quality", 95)
    picture.save(buffer, "JPEG", **options)
    return buffer.getvalue()


def full_and_reduced(data: bytes, chain: transforms.Chain, **decode):
    """(full path's output, reduced path's output, the reduced decode)."""
    full = chain(transforms.decode_image(data, **decode))
    decoded = transforms.decode_with_orientation(
        data, jpeg_reduction=functools.partial(decode_scale.jpeg_reduction, chain), **decode
    )
    if decoded.reduction > 1:
        chain = decode_scale.with_resize_to(chain, *decode_scale.upright_size(decoded))
    return full, chain(decoded.image), decoded


def mean_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int32) - b.astype(np.int32)).mean())


# --- choosing the factor ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "height", "width", "expected"),
    [
        ([{"resize": {"shorter_side": 256}}], 600, 800, 2),
        ([{"resize": {"shorter_side": 256}}], 3000, 4000, 8),
        ([{"resize": {"shorter_side": 256}}], 4000, 3000, 8),
        ([{"resize": {"shorter_side": 256}}], 300, 300, 1),  # 150 < 256
        ([{"resize": {"shorter_side": 256}}], 1024, 2000, 4),  # 256 x 500 exactly
        ([{"resize": {"shorter_side": 256}}], 1020, 2000, 2),  # 255 at 1/4: one short
        ([{"resize": {"shorter_side": 256}}], 100, 100, 1),  # enlarging
        ([{"resize": {"longer_side": 256}}], 600, 2100, 8),
        ([{"resize": {"size": 224}}], 600, 800, 2),
        # Not square: a factor that suits it upright either way (orientation unknown).
        ([{"resize": {"size": [100, 400]}}], 800, 1600, 2),
        ([{"resize": {"shorter_side": 256, "interpolation": "lanczos"}}], 3000, 4000, 8),
        ([{"resize": {"shorter_side": 256, "interpolation": "nearest"}}], 3000, 4000, 1),
        ([{"center_crop": {"size": 2000}}, {"resize": {"shorter_side": 100}}], 3000, 4000, 1),
        ([], 3000, 4000, 1),
    ],
)
def test_the_largest_factor_that_still_gives_at_least_the_resize_size(
    specs, height, width, expected
):
    assert decode_scale.jpeg_reduction(transforms.parse(specs), height, width) == expected


def test_opencv_decodes_at_libjpegs_rounded_up_size():
    rng = np.random.default_rng(1)
    for height, width in [(1, 1), (7, 9), (15, 17), (33, 801), (599, 799)]:
        data = jpeg(rng.integers(0, 256, (height, width, 3), np.uint8))
        for reduction in (2, 4, 8):
            decoded = transforms.decode_with_orientation(
                data, jpeg_reduction=lambda h, w, r=reduction: r
            )
            assert decoded.reduction == reduction
            assert decoded.image.shape[:2] == transforms.decode.reduced_size(
                height, width, reduction
            )
            assert decoded.stored_size == (height, width)


# --- the same sizes, nearly the same pixels ----------------------------------------------


def test_every_odd_size_gives_the_full_paths_size():
    # Sizes whose reduced side rounds differently: a resize computed from the
    # reduced size would be a pixel off for some of them.
    chains = [
        transforms.parse([{"resize": {"shorter_side": 61}}]),
        transforms.parse([{"resize": {"longer_side": 97}}]),
        transforms.parse([{"resize": {"size": [37, 53]}}]),
    ]
    rng = np.random.default_rng(2)
    reduced = 0
    for height in range(203, 420, 23):
        for width in range(211, 560, 29):
            data = jpeg(photo(height, width, seed=int(rng.integers(1000))), quality=75)
            for chain in chains:
                full, scaled, decoded = full_and_reduced(data, chain)
                assert scaled.shape == full.shape, (height, width, chain.to_json())
                reduced += decoded.reduction > 1
                assert mean_difference(scaled, full) < 3.0
    assert reduced > 200  # nearly all of them were decoded reduced


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_once_and_the_image_comes_out_upright(orientation):
    image = photo(600, 840, seed=orientation)
    data = jpeg(image, orientation)
    full, scaled, decoded = full_and_reduced(data, SHORTER_256)
    assert decoded.reduction == 2 and decoded.orientation == orientation
    assert scaled.shape == full.shape == (224, 224, 3)
    # A wrong flip or turn moves the corner block and the ramp: tens of levels.
    assert mean_difference(scaled, full) < 1.5
    assert not np.array_equal(scaled, full)


@pytest.mark.parametrize(
    ("mode", "channels", "options"),
    [
        ("RGB", 3, {}),
        ("RGB", 1, {}),
        ("L", 1, {}),
        ("L", 3, {}),
        ("CMYK", 3, {}),
        ("RGB", 3, {"progressive": True}),
        ("RGB", 3, {"subsampling": 0}),  # 4:4:4
    ],
)
def test_gray_cmyk_and_progressive_jpegs_give_the_same_kind_of_image(mode, channels, options):
    data = jpeg(photo(1200, 1040, seed=3), mode=mode, **options)
    full, scaled, decoded = full_and_reduced(data, SHORTER_256, channels=channels)
    assert decoded.reduction == 4
    assert scaled.shape == full.shape == (224, 224, channels)
    assert mean_difference(scaled, full) < 1.5
    assert not np.array_equal(scaled, full)


def test_other_formats_are_decoded_in_full():
    image = photo(600, 800)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    asked = []

    def reduction(height, width):
        asked.append((height, width))
        return 2

    decoded = transforms.decode_with_orientation(buffer.getvalue(), jpeg_reduction=reduction)
    assert decoded.reduction == 1 and asked == []
    np.testing.assert_array_equal(decoded.image, image)


def test_size_limits_apply_to_the_size_the_header_declares():
    data = jpeg(photo(600, 800))
    halve = functools.partial(decode_scale.jpeg_reduction, SHORTER_256)
    with pytest.raises(transforms.DecodeError) as too_many:
        transforms.decode_with_orientation(data, max_pixels=600 * 800 - 1, jpeg_reduction=halve)
    assert too_many.value.reason == "too_many_pixels"
    with pytest.raises(transforms.DecodeError) as too_small:
        transforms.decode_with_orientation(data, min_size=601, jpeg_reduction=halve)
    assert too_small.value.reason == "too_small"
    # 300x400 decoded: the stored 600x800 is what min_size checks.
    assert (
        transforms.decode_with_orientation(data, min_size=600, jpeg_reduction=halve).reduction == 2
    )


def test_a_jpeg_the_reduced_decode_fails_on_is_decoded_in_full_and_reported():
    data = jpeg(photo(600, 800))
    broken = data[:200] + b"\x00" * 50  # the header intact, the scan gone
    halve = functools.partial(decode_scale.jpeg_reduction, SHORTER_256)
    try:
        expected = transforms.decode_image(broken)
    except transforms.DecodeError as e:
        with pytest.raises(transforms.DecodeError) as error:
            transforms.decode_with_orientation(broken, jpeg_reduction=halve)
        assert (error.value.reason, str(error.value)) == (e.reason, str(e))
    else:
        assert transforms.decode_with_orientation(broken, jpeg_reduction=halve).image.shape == (
            expected.shape[0] // 2,
            expected.shape[1] // 2,
            3,
        )


# --- targets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("orientation", "height", "width", "shorter_side", "reduction"),
    [
        (1, 400, 520, 180, 2),
        (3, 400, 520, 180, 2),
        (6, 400, 520, 180, 2),
        (7, 400, 520, 180, 2),
        (8, 720, 960, 160, 4),
        (2, 720, 960, 160, 4),
    ],
)
def test_targets_follow_a_reduced_decode(orientation, height, width, shorter_side, reduction):
    """The standard of `test_transform_targets`: boxes enclose the shapes
    shown (IoU >= 0.9), masks agree with their pixels, keypoints sit on
    their markers; here with the stored pixels decoded reduced."""
    scene = draw_scene(height, width, seed=20 + orientation)
    chain = transforms.parse(
        [{"resize": {"shorter_side": shorter_side}}, {"center_crop": {"size": shorter_side - 16}}]
    )
    data = jpeg(scene.image, orientation, subsampling=0)
    decoded = transforms.decode_with_orientation(
        data, jpeg_reduction=functools.partial(decode_scale.jpeg_reduction, chain)
    )
    assert decoded.reduction == reduction
    image, out = decode_scale.apply_reduced(
        chain, decoded, scene.targets, min_visibility=0.3, mask_fill=IGNORE
    )
    _, whole = decode_scale.apply_reduced(chain, decoded, scene.targets, min_visibility=1.0)
    # The image the build stores without targets (and the size of the full path's).
    np.testing.assert_array_equal(
        image,
        decode_scale.with_resize_to(chain, *decode_scale.upright_size(decoded))(decoded.image),
    )
    assert image.shape == chain(transforms.decode_image(data)).shape

    def run(marker: np.ndarray) -> np.ndarray:  # the full path, for the markers
        return chain(np.ascontiguousarray(transforms.orient(marker, orientation)))

    check_follows(scene, image, out, run, whole=whole)


def test_targets_of_another_size_than_the_stored_image_are_refused():
    scene = draw_scene(200, 240, seed=1)
    chain = transforms.parse([{"resize": {"shorter_side": 90}}])
    decoded = transforms.decode_with_orientation(
        jpeg(np.zeros((200, 241, 3), np.uint8)),
        jpeg_reduction=functools.partial(decode_scale.jpeg_reduction, chain),
    )
    assert decoded.reduction == 2
    with pytest.raises(transforms.TargetsError):
        decode_scale.apply_reduced(chain, decoded, scene.targets, min_visibility=0.0)
