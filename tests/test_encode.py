"""encode_image: round trips, deterministic bytes, and argument errors."""

import io
import re

import numpy as np
import pytest
from PIL import Image

from kiln.transforms import EncodeError, decode_image, encode_image

RNG = np.random.default_rng(7)
NOISE = RNG.integers(0, 256, (13, 21, 3), dtype=np.uint8)
# A smooth image: what JPEG is for, so its error stays small.
_y, _x = np.mgrid[0:32, 0:48]
SMOOTH = np.stack([_x * 5, _y * 7, 128 + (_x - _y) * 2], axis=-1).clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("image", [NOISE, NOISE[:, :, :1]], ids=["rgb", "gray"])
def test_png_round_trips_exactly(image):
    data = encode_image(image, format="png")
    assert data.startswith(b"\x89PNG")
    np.testing.assert_array_equal(decode_image(data, channels=image.shape[2]), image)
    # An independent decoder reads the same pixels (and the channel order is RGB).
    pillow = np.asarray(Image.open(io.BytesIO(data)))
    np.testing.assert_array_equal(pillow.reshape(image.shape), image)


@pytest.mark.parametrize("image", [NOISE, NOISE[:, :, :1]], ids=["rgb", "gray"])
def test_raw_is_the_c_order_pixels(image):
    data = encode_image(image, format="raw")
    assert len(data) == image.size
    np.testing.assert_array_equal(np.frombuffer(data, np.uint8).reshape(image.shape), image)


def test_raw_of_a_non_contiguous_view_is_still_row_major_hwc():
    view = NOISE[::2, ::-1]
    np.testing.assert_array_equal(
        np.frombuffer(encode_image(view, format="raw"), np.uint8).reshape(view.shape), view
    )


@pytest.mark.parametrize("image", [SMOOTH, SMOOTH[:, :, 1:2]], ids=["rgb", "gray"])
def test_jpeg_round_trips_within_tolerance(image):
    data = encode_image(image, format="jpeg", quality=95)
    assert data.startswith(b"\xff\xd8\xff")
    decoded = decode_image(data, channels=image.shape[2])
    error = np.abs(decoded.astype(int) - image.astype(int))
    assert error.mean() < 1.5 and error.max() <= 12
    pillow = np.asarray(Image.open(io.BytesIO(data)).convert("RGB" if image.shape[2] == 3 else "L"))
    assert np.abs(pillow.reshape(image.shape).astype(int) - image.astype(int)).mean() < 1.5


def test_jpeg_quality_trades_size_for_error():
    low = encode_image(NOISE, format="jpeg", quality=30)
    high = encode_image(NOISE, format="jpeg", quality=95)
    assert len(low) < len(high)


@pytest.mark.parametrize("format", ["jpeg", "png", "raw"])
def test_same_image_gives_the_same_bytes(format):
    first = encode_image(NOISE, format=format)
    assert encode_image(NOISE.copy(), format=format) == first
    assert isinstance(first, bytes)


@pytest.mark.parametrize(
    "image, kwargs, message",
    [
        (NOISE.astype(np.float32), {"format": "png"}, "uint8"),
        (NOISE[:, :, 0], {"format": "png"}, "uint8 HxWxC"),
        (np.zeros((4, 4, 4), np.uint8), {"format": "png"}, "C 1 or 3"),
        (np.zeros((0, 4, 3), np.uint8), {"format": "raw"}, "non-empty"),
        (NOISE, {"format": "webp"}, "unknown format 'webp'"),
        (NOISE, {"format": "jpeg", "quality": 0}, "quality must be an integer 1..100"),
        (NOISE, {"format": "jpeg", "quality": 101}, "quality"),
        (NOISE, {"format": "jpeg", "quality": 90.0}, "quality"),
    ],
)
def test_invalid_arguments(image, kwargs, message):
    with pytest.raises(ValueError, match=message):
        encode_image(image, **kwargs)


@pytest.mark.parametrize(
    "shape, format, message",
    [
        ((20, 70_000, 3), "jpeg", "70000x20 (WxH), more than the 65500 pixels per side"),
        ((65_501, 1, 1), "jpeg", "1x65501 (WxH), more than the 65500"),
        ((1, 1_000_001, 1), "png", "more than the 1000000 pixels per side that png can hold"),
    ],
)
def test_an_image_longer_than_the_format_allows_is_refused_with_its_limit(shape, format, message):
    image = np.zeros(shape, np.uint8)
    with pytest.raises(EncodeError, match=re.escape(message)) as raised:
        encode_image(image, format=format)
    assert "(encoding.format)" in str(raised.value)  # and what can store it instead
    assert "raw" in str(raised.value)


@pytest.mark.parametrize(
    "shape, format",
    [((1, 65_500, 1), "jpeg"), ((65_500, 1, 1), "jpeg"), ((20, 70_000, 3), "png")],
)
def test_an_image_at_the_formats_limit_is_stored(shape, format):
    image = np.full(shape, 200, np.uint8)
    data = encode_image(image, format=format)
    decoded = decode_image(data, channels=shape[2], max_pixels=None)
    assert decoded.shape == shape
    assert encode_image(image, format="raw") == image.tobytes()  # raw has no limit
