"""decode_image: every format OpenCV reads, EXIF orientation, alpha, depth, and each failure reason.

Fixtures are written with Pillow (an independent encoder) or OpenCV, in memory.
"""

import io
import pickle
import struct

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

import bombs
from kiln import transforms
from kiln.transforms import DecodeError, decode_image, image_header
from kiln.transforms import decode as decode_module
from kiln.transforms.functional import to_grayscale

RNG = np.random.default_rng(1234)
# 8x8 blocks of random colours: survives JPEG at quality 100 almost exactly,
# and no two blocks alike, so any flip or rotation shows.
BLOCKS = np.kron(RNG.integers(0, 256, (3, 4, 3)), np.ones((8, 8, 1))).astype(np.uint8)  # 24x32
NOISE = RNG.integers(0, 256, (11, 17, 3), dtype=np.uint8)


def pillow_bytes(image, fmt, mode=None, **save_args) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image, mode) if mode else Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_args)
    return buffer.getvalue()


def opencv_bytes(bgr, extension) -> bytes:
    ok, encoded = cv2.imencode(extension, bgr)
    assert ok
    return encoded.tobytes()


def max_abs_diff(a, b) -> int:
    assert a.shape == b.shape, (a.shape, b.shape)
    return int(np.abs(a.astype(int) - b.astype(int)).max())


# --- formats ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, save_args",
    [
        ("PNG", {}),
        ("BMP", {}),
        ("TIFF", {}),
        ("TIFF", {"compression": "tiff_lzw"}),
        ("WEBP", {"lossless": True}),
        ("JPEG2000", {}),
    ],
)
def test_lossless_formats_decode_exactly(fmt, save_args):
    out = decode_image(pillow_bytes(NOISE, fmt, **save_args))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, NOISE)


@pytest.mark.parametrize("extension", [".ras", ".ppm", ".pam"])
def test_opencv_only_formats_decode_exactly(extension):
    out = decode_image(opencv_bytes(NOISE[:, :, ::-1], extension))
    np.testing.assert_array_equal(out, NOISE)


@pytest.mark.parametrize(
    "save_args",
    [
        {"quality": 100, "subsampling": 0},
        {"quality": 100, "subsampling": 0, "progressive": True},
    ],
)
def test_jpeg_baseline_and_progressive(save_args):
    out = decode_image(pillow_bytes(BLOCKS, "JPEG", **save_args))
    assert out.shape == (24, 32, 3)
    assert max_abs_diff(out, BLOCKS) <= 3


def test_cmyk_jpeg_becomes_rgb():
    cmyk = Image.new("CMYK", (20, 10), (0, 255, 255, 0))  # pure red in CMYK
    out = decode_image(pillow_bytes(cmyk, "JPEG", quality=100))
    assert out.shape == (10, 20, 3)
    assert max_abs_diff(out, np.full((10, 20, 3), (255, 0, 0))) <= 3


def test_gray_sources_give_one_channel_or_three_equal_channels():
    gray = NOISE[:, :, 0]
    for data in (pillow_bytes(gray, "PNG"), pillow_bytes(gray, "TIFF")):
        one = decode_image(data, channels=1)
        np.testing.assert_array_equal(one, gray[:, :, np.newaxis])
        three = decode_image(data, channels=3)
        np.testing.assert_array_equal(three, np.repeat(gray[:, :, np.newaxis], 3, axis=2))
    jpeg = decode_image(pillow_bytes(BLOCKS[:, :, 0], "JPEG", quality=100), channels=1)
    assert jpeg.shape == (24, 32, 1) and max_abs_diff(jpeg, BLOCKS[:, :, :1]) <= 2


def test_colour_to_one_channel_uses_the_grayscale_kernel():
    np.testing.assert_array_equal(
        decode_image(pillow_bytes(NOISE, "PNG"), channels=1), to_grayscale(NOISE)
    )


def test_palette_png_and_gif():
    palette_image = Image.fromarray(np.array([[0, 1, 2]], np.uint8), "P")
    palette_image.putpalette([10, 20, 30, 40, 50, 60, 70, 80, 90])
    expected = np.array([[[10, 20, 30], [40, 50, 60], [70, 80, 90]]], np.uint8)
    np.testing.assert_array_equal(decode_image(pillow_bytes(palette_image, "PNG")), expected)
    np.testing.assert_array_equal(decode_image(pillow_bytes(palette_image, "GIF")), expected)
    # A transparent palette entry is composited over white like any alpha.
    transparent = decode_image(pillow_bytes(palette_image, "PNG", transparency=0))
    np.testing.assert_array_equal(transparent[0, 0], [255, 255, 255])
    np.testing.assert_array_equal(transparent[0, 1:], expected[0, 1:])


def test_alpha_is_composited_over_white():
    rgba = np.array(
        [[[200, 100, 50, 255], [200, 100, 50, 0], [200, 100, 50, 128], [0, 0, 0, 128]]], np.uint8
    )
    out = decode_image(pillow_bytes(rgba, "PNG"))
    # c * a/255 + 255 * (1 - a/255), rounded: (200*128 + 255*127) / 255 = 227.4
    np.testing.assert_array_equal(
        out, [[[200, 100, 50], [255, 255, 255], [227, 177, 152], [127, 127, 127]]]
    )
    webp = decode_image(pillow_bytes(rgba, "WEBP", lossless=True, exact=True))
    np.testing.assert_array_equal(webp, out)


def test_gray_with_alpha():
    la = np.array([[[100, 0], [100, 255]]], np.uint8)
    data = pillow_bytes(la, "PNG", mode="LA")
    np.testing.assert_array_equal(decode_image(data, channels=1), [[[255], [100]]])
    np.testing.assert_array_equal(decode_image(data, channels=3), [[[255] * 3, [100] * 3]])


def test_16_bit_png_rounds_to_8_bit():
    values = np.array([0, 128, 129, 257, 32767, 65407, 65535], np.uint16)
    rgb16 = np.stack([values, values[::-1], np.full_like(values, 1000)], axis=-1)[np.newaxis]
    out = decode_image(opencv_bytes(rgb16[:, :, ::-1], ".png"))
    np.testing.assert_array_equal(out, np.rint(rgb16 / 257.0).astype(np.uint8))
    assert out[0, :, 0].tolist() == [0, 0, 1, 1, 127, 255, 255]
    gray16 = decode_image(opencv_bytes(values[np.newaxis], ".png"), channels=1)
    np.testing.assert_array_equal(gray16[0, :, 0], out[0, :, 0])


def test_16_bit_png_with_alpha():
    bgra16 = np.array([[[0, 0, 65535, 65535], [0, 0, 65535, 0]]], np.uint16)
    np.testing.assert_array_equal(
        decode_image(opencv_bytes(bgra16, ".png")), [[[255, 0, 0], [255, 255, 255]]]
    )


def test_float_hdr_is_clipped_and_scaled():
    linear = np.array([[[0.0, 0.5, 1.0], [2.0, 0.25, 0.0]]], np.float32)  # RGB
    out = decode_image(opencv_bytes(linear[:, :, ::-1], ".hdr"))
    expected = np.array([[[0, 128, 255], [255, 64, 0]]])
    assert max_abs_diff(out, expected) <= 2  # RGBE keeps 8 bits of mantissa


def test_multi_frame_gif_gives_the_first_frame():
    frames = [Image.new("RGB", (4, 3), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    np.testing.assert_array_equal(decode_image(buffer.getvalue()), np.full((3, 4, 3), (255, 0, 0)))


# --- EXIF orientation ---------------------------------------------------------------


def with_orientation(fmt, orientation, **save_args) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return pillow_bytes(BLOCKS, fmt, exif=exif.tobytes(), **save_args)


# What each orientation tag means for the stored pixels, written out independently.
UPRIGHT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: np.transpose(a, (1, 0, 2)),
    6: lambda a: np.rot90(a, k=-1),  # clockwise
    7: lambda a: np.rot90(a, k=-1)[::-1],  # transverse
    8: lambda a: np.rot90(a, k=1),  # counter-clockwise
}


@pytest.mark.parametrize(
    "fmt, save_args, tolerance",
    [
        ("JPEG", {"quality": 100, "subsampling": 0}, 3),
        ("PNG", {}, 0),
        ("WEBP", {"lossless": True}, 0),
        ("TIFF", {}, 0),
    ],
)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(fmt, save_args, tolerance, orientation):
    data = with_orientation(fmt, orientation, **save_args)
    out = decode_image(data)
    expected = UPRIGHT[orientation](BLOCKS)
    assert out.shape == expected.shape
    assert max_abs_diff(out, expected) <= tolerance
    # Pillow's own reading of the same file agrees.
    pillow = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data)).convert("RGB")))
    assert max_abs_diff(out, pillow) <= tolerance


def test_orientation_applies_with_alpha_and_one_channel():
    exif = Image.Exif()
    exif[0x0112] = 6
    rgba = np.dstack([BLOCKS, np.full(BLOCKS.shape[:2], 255, np.uint8)])
    out = decode_image(pillow_bytes(rgba, "PNG", exif=exif.tobytes()), channels=1)
    np.testing.assert_array_equal(out, to_grayscale(np.ascontiguousarray(np.rot90(BLOCKS, k=-1))))


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_oriented_pixels_are_a_contiguous_copy_of_the_upright_view(orientation, channels):
    # The decoder turns pixels upright with OpenCV's calls (a new array)
    # rather than by copying `orient`'s strided view: the same pixels.
    stored = np.ascontiguousarray(BLOCKS[:, :, :channels])
    out = transforms.oriented(stored, orientation)
    np.testing.assert_array_equal(out, UPRIGHT[orientation](stored))
    np.testing.assert_array_equal(out, transforms.orient(stored, orientation))
    assert out.flags.c_contiguous and out.dtype == np.uint8


def test_invalid_orientation_value_is_ignored():
    np.testing.assert_array_equal(decode_image(with_orientation("PNG", 9)), BLOCKS)


# --- failures ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, reason, message",
    [
        (b"", "empty", "empty"),
        (b"just some text, not a picture\n", "not_an_image", "not an image"),
        (b"<!DOCTYPE html><html><body>404</body></html>", "not_an_image", "not an image"),
        (b"8BPS" + bytes(60), "unsupported_format", "Photoshop"),
        (b"\x00\x00\x00\x18ftypheic" + bytes(60), "unsupported_format", "HEIF"),
        (
            b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>',
            "unsupported_format",
            "SVG",
        ),
        (pillow_bytes(NOISE, "JPEG")[:300], "corrupt", "JPEG"),
        (pillow_bytes(NOISE, "JPEG", progressive=True)[:-200], "corrupt", "JPEG"),
        (pillow_bytes(NOISE, "PNG")[:-100], "corrupt", "PNG"),
        (pillow_bytes(NOISE, "WEBP")[:40], "corrupt", "WebP"),
        (pillow_bytes(NOISE, "TIFF")[:200], "corrupt", "TIFF"),
    ],
    ids=[
        "empty",
        "text",
        "html",
        "psd",
        "heic",
        "svg",
        "jpeg-header-only",
        "jpeg-progressive-cut",
        "png-cut",
        "webp-cut",
        "tiff-cut",
    ],
)
def test_bad_files_raise_decode_error_with_reason(data, reason, message):
    with pytest.raises(DecodeError, match=message) as caught:
        decode_image(data)
    assert caught.value.reason == reason


def test_damaged_png_data_is_corrupt():
    data = bytearray(pillow_bytes(NOISE, "PNG"))
    data[data.index(b"IDAT") + 10] ^= 0xFF
    with pytest.raises(DecodeError) as caught:
        decode_image(bytes(data))
    assert caught.value.reason == "corrupt"


def opencv_tiff(image: np.ndarray, compression: int) -> tuple[bytearray, list[tuple[int, int]]]:
    """A TIFF OpenCV writes, and each strip's (offset, byte count)."""
    ok, encoded = cv2.imencode(".tif", image, [cv2.IMWRITE_TIFF_COMPRESSION, compression])
    assert ok
    data = bytearray(encoded.tobytes())
    assert data[:4] == b"II*\x00"
    (directory,) = struct.unpack_from("<I", data, 4)
    (entries,) = struct.unpack_from("<H", data, directory)
    fields = {}
    for entry in range(directory + 2, directory + 2 + 12 * entries, 12):
        tag, kind, count, value = struct.unpack_from("<HHII", data, entry)
        if tag in (273, 279):  # StripOffsets, StripByteCounts: LONGs
            assert kind == 4
            values = struct.unpack_from(f"<{count}I", data, value) if count > 1 else (value,)
            fields[tag] = list(values)
    return data, list(zip(fields[273], fields[279], strict=True))


# Noise: LZW finds little to repeat, so most of a strip's bytes are codes.
TIFF_PIXELS = RNG.integers(0, 256, (64, 48, 3), dtype=np.uint8)


def test_a_valid_lzw_or_deflate_tiff_decodes_exactly():
    for compression in (cv2.IMWRITE_TIFF_COMPRESSION_LZW, cv2.IMWRITE_TIFF_COMPRESSION_DEFLATE):
        data, _ = opencv_tiff(TIFF_PIXELS, compression)
        # The same pixels as before the TIFF check: OpenCV's decode, BGR to RGB.
        np.testing.assert_array_equal(decode_image(bytes(data)), TIFF_PIXELS[:, :, ::-1])


@pytest.mark.parametrize(
    "damage",
    ["lzw-garbage", "lzw-last-strip", "deflate-garbage", "strip-cut-short"],
)
def test_a_tiff_whose_strip_data_is_damaged_is_corrupt(damage):
    """OpenCV decodes these with a TIFF error in its log and returns an image
    with garbage or black where the strip was; kiln drops them. (Damage that
    is itself valid compressed data, such as LZW codes overwritten with
    other codes, decodes to other pixels in any decoder: no check sees it.)"""
    compression = (
        cv2.IMWRITE_TIFF_COMPRESSION_DEFLATE
        if damage.startswith("deflate")
        else cv2.IMWRITE_TIFF_COMPRESSION_LZW
    )
    data, strips = opencv_tiff(TIFF_PIXELS, compression)
    offset, count = strips[-1] if damage == "lzw-last-strip" else strips[0]
    if damage == "strip-cut-short":
        data[offset + count // 2 : offset + count] = bytes(count - count // 2)
    else:
        data[offset + 20 : offset + 120] = b"\xff" * 100
    # What OpenCV alone makes of it: an image, and no error.
    pixels = cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_UNCHANGED)
    assert pixels is not None and pixels.shape == TIFF_PIXELS.shape

    with pytest.raises(DecodeError) as caught:
        decode_image(bytes(data))

    assert caught.value.reason == "corrupt"
    assert str(caught.value).startswith(
        "TIFF image data is damaged: a strip or tile does not decode ("
    )
    assert "\n" not in str(caught.value)


@pytest.fixture
def opencv_must_not_decode(monkeypatch):
    def must_not_decode(*args, **kwargs):
        raise AssertionError("OpenCV was asked to decode a file refused by its header")

    monkeypatch.setattr(decode_module.cv2, "imdecodeWithMetadata", must_not_decode)


BOMBS = bombs.bombs(12000, 12000)


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_decompression_bombs_are_refused_from_the_header_before_decoding(
    name, opencv_must_not_decode
):
    declared = (
        r"declares 16x16 \(WxH\) but its decoder works on 144000000 pixels"
        if "tiles" in name
        else r"declares 12000x12000 \(WxH\) = 144000000 pixels"
    )
    with pytest.raises(DecodeError, match=declared + r".*more than max_pixels 1000000") as caught:
        decode_image(BOMBS[name], max_pixels=1_000_000)
    assert caught.value.reason == "too_many_pixels"


def test_an_avif_frame_larger_than_its_declared_size_is_refused(opencv_must_not_decode):
    # libavif would decode the 1024x768 AV1 frame, whatever 'ispe' (8x8) says.
    frame = cv2.imencode(".avif", np.zeros((768, 1024, 3), np.uint8))[1].tobytes()
    data = bytearray(frame)
    ispe = data.index(b"ispe")
    data[ispe + 8 : ispe + 16] = struct.pack(">II", 8, 8)
    with pytest.raises(
        DecodeError, match=r"declares 8x8 .* decoder works on 786432 pixels"
    ) as caught:
        decode_image(bytes(data), max_pixels=100_000)
    assert caught.value.reason == "too_many_pixels"


@pytest.mark.parametrize("name", sorted(bombs.allocation_bombs()))
def test_files_that_would_make_opencv_allocate_from_other_fields_are_refused(
    name, opencv_must_not_decode
):
    data, reason = bombs.allocation_bombs()[name]
    with pytest.raises(DecodeError) as caught:
        decode_image(data)
    assert caught.value.reason == reason


def test_the_reported_radiance_hdr_bomb_is_refused_before_decoding(opencv_must_not_decode):
    data = bombs.radiance_hdr(12000, 12000)  # 9 MB; 3.4 GB once decoded
    assert len(data) > 9_000_000
    with pytest.raises(DecodeError, match="declares 12000x12000") as caught:
        decode_image(data, max_pixels=89_478_485)
    assert caught.value.reason == "too_many_pixels"


@pytest.mark.parametrize(
    "data, message",
    [
        (
            b"\x00\x00\x00\x14ftypavis\x00\x00\x00\x00avis" + b"\x00\x00\x00\x08moov",
            "AVIF image sequences are not supported",
        ),
        (
            b"P7\nWIDTH 2\nHEIGHT 2\nDEPTH 6\nMAXVAL 255\nENDHDR\n" + bytes(24),
            "PAM images with 6 channels are not supported",
        ),
    ],
)
def test_variants_whose_size_is_not_read_are_unsupported(data, message, opencv_must_not_decode):
    with pytest.raises(DecodeError, match=message) as caught:
        decode_image(data)
    assert caught.value.reason == "unsupported_format"


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"SECRET-TOKEN-1234 is not an image\n", "not_an_image"),
        (b"\x89PNG\r\n\x1a\nSECRET-TOKEN-1234", "corrupt"),
        (b"P7\nSECRET-TOKEN-1234 1\nENDHDR\n", "corrupt"),
        (b"#?RADIANCE\nSECRET-TOKEN-1234\n\n-Y 2 +X 2\n", "corrupt"),
    ],
)
def test_messages_never_quote_the_file(data, reason, opencv_must_not_decode):
    with pytest.raises(DecodeError) as caught:
        decode_image(data)
    assert caught.value.reason == reason
    assert "SECRET" not in str(caught.value) and "TOKEN" not in str(caught.value)


def test_before_decoding_gets_the_pixels_to_decode_before_opencv_runs(monkeypatch):
    events = []
    real_decode = decode_module.cv2.imdecodeWithMetadata
    monkeypatch.setattr(
        decode_module.cv2,
        "imdecodeWithMetadata",
        lambda *args: events.append("decode") or real_decode(*args),
    )
    decode_image(pillow_bytes(NOISE, "PNG"), before_decoding=events.append)
    assert events == [17 * 11, "decode"]
    tiles = bombs.tiff(16, 16, tile=(64, 32))
    decode_image(tiles, before_decoding=events.append)
    assert events[2:] == [64 * 32, "decode"]
    with pytest.raises(DecodeError):  # refused: never admitted
        decode_image(pillow_bytes(NOISE, "PNG"), max_pixels=100, before_decoding=events.append)
    assert len(events) == 4


def test_the_decoded_size_is_checked_too_should_a_header_reader_disagree(monkeypatch):
    sun_raster = opencv_bytes(NOISE[:, :, ::-1], ".ras")
    assert decode_image(sun_raster, max_pixels=187).shape == (11, 17, 3)
    understated = image_header.ImageHeader("Sun raster", 5, 5, 25)
    monkeypatch.setattr(decode_module.image_header, "read", lambda data, name: understated)
    with pytest.raises(DecodeError, match=r"is 17x11 \(WxH\) = 187 pixels") as caught:
        decode_image(sun_raster, max_pixels=100)
    assert caught.value.reason == "too_many_pixels"


def test_too_small_names_the_size_and_the_limit():
    with pytest.raises(DecodeError, match=r"17x11 \(WxH\), smaller than min_size 12") as caught:
        decode_image(pillow_bytes(NOISE, "PNG"), min_size=12)
    assert caught.value.reason == "too_small"
    assert decode_image(pillow_bytes(NOISE, "PNG"), min_size=11).shape == (11, 17, 3)


def test_decode_error_pickles_with_its_reason():
    error = pickle.loads(pickle.dumps(DecodeError("corrupt", "JPEG data is truncated")))
    assert error.reason == "corrupt" and str(error) == "JPEG data is truncated"
    assert isinstance(error, ValueError)
    with pytest.raises(ValueError, match="unknown decode error reason"):
        DecodeError("bad", "x")


@pytest.mark.parametrize("kwargs", [{"channels": 4}, {"max_pixels": 0}, {"min_size": 0}])
def test_invalid_arguments_are_value_errors_not_decode_errors(kwargs):
    with pytest.raises(ValueError) as caught:
        decode_image(pillow_bytes(NOISE, "PNG"), **kwargs)
    assert not isinstance(caught.value, DecodeError)
