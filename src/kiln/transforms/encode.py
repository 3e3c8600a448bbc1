"""A uint8 image array to the bytes stored in a record: JPEG, PNG or raw pixels.

Every encoder setting that affects the bytes is fixed here rather than left
to OpenCV's defaults, so a build is byte-identical across runs and does not
change silently when a default moves between OpenCV versions. (The bytes
still depend on the libjpeg-turbo and zlib inside the OpenCV wheel, which is
one reason kiln pins its dependencies; PNG and raw pixels decode identically
regardless.)

An image the format cannot hold is refused before the encoder runs, with
the limit in the message: JPEG stores at most 65500 pixels per side, and
OpenCV's PNG encoder 1000000 (`MAX_SIDE`). Such an image, or any other the
encoder fails on, raises `EncodeError`, which the build turns into a
dropped file (stage ``encode``, reason ``encode_failed``), never a failed
job. Each failure is in the exception; OpenCV's own log line about it names
no file (the build silences OpenCV's logger, `set_opencv_log_level`).
"""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np

FORMATS = ("jpeg", "png", "raw")

# zlib level 6: the usual balance; higher levels cost much more time for
# slightly smaller files, which a build of millions of images feels.
PNG_COMPRESSION = 6

# Pixels per side each format can store. JPEG: libjpeg's JPEG_MAX_DIMENSION,
# which OpenCV's encoder enforces. PNG: the file format allows 2**31 - 1, but
# libpng refuses more than its default user limit of 1000000 (width or
# height) when writing too, and OpenCV keeps that default. Raw pixels have
# none (`image.max_pixels` and the transforms bound them).
MAX_SIDE = {"jpeg": 65500, "png": 1_000_000}


class EncodeError(ValueError):
    """A valid image that `encode_image` cannot store in the format asked for:
    larger than the format's `MAX_SIDE`, or refused by the encoder. A
    problem of this image, not of the call (invalid arguments raise a plain
    ValueError)."""


def check_encodable(height: int, width: int, format: str) -> None:
    """Raises `EncodeError` if `format` cannot store a `width` x `height` image."""
    limit = MAX_SIDE.get(format)
    if limit is None or max(height, width) <= limit:
        return
    others = [
        name if name not in MAX_SIDE else f"{name} (up to {MAX_SIDE[name]})"
        for name in FORMATS
        if name != format and MAX_SIDE.get(name, max(height, width)) >= max(height, width)
    ]
    raise EncodeError(
        f"the image to store is {width}x{height} (WxH), more than the {limit} pixels per "
        f"side that {format} can hold; store it as {' or '.join(others)} (encoding.format), "
        f"or make it smaller with the transforms"
    )


def encode_image(
    image: np.ndarray,
    *,
    format: Literal["jpeg", "png", "raw"],
    quality: int = 95,
) -> bytes:
    """Encodes a uint8 ``HxWxC`` RGB (C 3) or gray (C 1) image.

    Args:
      image: The pixels, RGB order.
      format: ``"jpeg"`` (lossy, `quality` 1..100), ``"png"`` (lossless) or
        ``"raw"`` (the pixels in C order: ``H * W * C`` bytes, row-major HWC;
        the record's height, width and channels give the shape back).
      quality: JPEG quality, 1..100; ignored for png and raw.

    Returns:
      The encoded bytes; identical for identical input.

    Raises:
      EncodeError: if the format cannot store this image (a side beyond
        `MAX_SIDE`), or its encoder fails.
      ValueError: if the image is not uint8 HxWx{1,3}, or the format or
        quality is invalid.
    """
    if (
        not isinstance(image, np.ndarray)
        or image.dtype != np.uint8
        or image.ndim != 3
        or image.shape[2] not in (1, 3)
        or image.shape[0] == 0
        or image.shape[1] == 0
    ):
        described = (
            f"{image.dtype} array of shape {image.shape}"
            if isinstance(image, np.ndarray)
            else type(image).__name__
        )
        raise ValueError(
            f"encode_image: expected a non-empty uint8 HxWxC array with C 1 or 3, got {described}"
        )
    if format not in FORMATS:
        raise ValueError(f"encode_image: unknown format {format!r}; expected one of {FORMATS}")
    if format == "raw":
        return np.ascontiguousarray(image).tobytes(order="C")
    if (
        isinstance(quality, bool)
        or not isinstance(quality, (int, np.integer))
        or not 1 <= quality <= 100
    ):
        raise ValueError(f"encode_image: quality must be an integer 1..100, got {quality!r}")
    height, width = image.shape[:2]
    check_encodable(height, width, format)

    # OpenCV encoders take BGR, and HxW for one channel. cvtColor swaps the
    # channels into a new contiguous array ~50x faster than NumPy copies the
    # reversed view (~2 us against ~120 us for 224x224: NumPy copies a
    # negative-stride axis element by element).
    if image.shape[2] == 1:
        pixels = np.ascontiguousarray(image[:, :, 0])
    else:
        pixels = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    if format == "jpeg":
        extension = ".jpg"
        # 4:2:0 chroma subsampling, baseline (not progressive), standard
        # Huffman tables: the most common JPEG, which every decoder
        # (tf.io.decode_jpeg included) reads on its fastest path.
        params = [
            cv2.IMWRITE_JPEG_QUALITY,
            int(quality),
            cv2.IMWRITE_JPEG_PROGRESSIVE,
            0,
            cv2.IMWRITE_JPEG_OPTIMIZE,
            0,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
        ]
    else:
        extension = ".png"
        params = [
            cv2.IMWRITE_PNG_COMPRESSION,
            PNG_COMPRESSION,
            cv2.IMWRITE_PNG_STRATEGY,
            cv2.IMWRITE_PNG_STRATEGY_DEFAULT,
            cv2.IMWRITE_PNG_FILTER,
            cv2.IMWRITE_PNG_FAST_FILTERS,
        ]
    try:
        ok, encoded = cv2.imencode(extension, pixels, params)
        failure = ""
    except cv2.error as e:
        ok, failure = False, f" ({str(e).strip().splitlines()[-1]})"
    if not ok:
        raise EncodeError(
            f"OpenCV could not encode the {width}x{height} (WxH) image as {format}{failure}"
        )
    return encoded.tobytes()
