"""Image file bytes to a uint8 RGB (or gray) array, EXIF orientation applied.

`decode_image` reads everything this OpenCV build reads (JPEG baseline,
progressive and CMYK; PNG 8/16-bit, gray, palette, with or without alpha;
BMP; TIFF; WebP; GIF; JPEG 2000; PNM; AVIF...) and turns every way a file
can be bad into a `DecodeError` with a reason from a fixed vocabulary, so
the build job can drop the file, count it and report it.

How it decodes, and why:

- Header first. The width and height are read from the file's header with
  `imagesize` (pure Python, reads only the first bytes) and checked against
  `max_pixels` before OpenCV allocates anything: a 100-byte PNG may declare
  50000x50000 pixels (a "decompression bomb"). OpenCV 5's Python API has no
  header-only read (`imdecodeWithMetadata` decodes the pixels too), and its
  own limit, ``OPENCV_IO_MAX_IMAGE_PIXELS``, is one process-wide setting
  read once, not a per-dataset value.
- Then `cv2.imdecodeWithMetadata` with ``IMREAD_UNCHANGED``: the only mode
  that keeps alpha and 16-bit samples. It does not apply EXIF orientation
  (the colour modes do, but drop alpha), so the orientation tag is read
  from the EXIF block OpenCV returns and applied here, the same way for
  JPEG, PNG and WebP. TIFF's decoder applies its own orientation tag and
  returns no EXIF block, so nothing is applied twice.
- 16-bit samples become 8-bit by rounding (``round(v * 255 / 65535)``);
  floating-point samples (HDR, PFM, float TIFF) are clipped to [0, 1] and
  scaled to 0..255, as OpenCV's own 8-bit conversion does.
- Alpha is composited over white (`ALPHA_BACKGROUND`), not dropped: the
  colour stored under transparent pixels is arbitrary (often black, or
  whatever the encoder left there), while a composite is what a person
  sees on a page, and is deterministic.
- Gray sources stay one channel for ``channels=1`` and are repeated for
  ``channels=3``; colour sources become gray with `to_grayscale`'s ITU-R 601
  weights.
- Multi-frame files (GIF, multi-page TIFF, animated WebP) give the first
  frame.

Pure and thread-safe: the same bytes always give the same array.
"""

from __future__ import annotations

import io
import logging
import struct

import cv2
import imagesize
import numpy as np

from kiln.transforms.functional import to_grayscale

logger = logging.getLogger(__name__)

# Why a file could not be decoded. The build job counts dropped files per
# reason and writes the reason into errors.jsonl, so these strings are part
# of kiln's output format.
REASONS = (
    "empty",              # zero bytes
    "not_an_image",       # no known image signature (text, HTML, random bytes)
    "unsupported_format", # a known image format OpenCV cannot decode (HEIC, PSD, SVG...)
    "corrupt",            # an OpenCV format that fails to decode (truncated, damaged)
    "too_many_pixels",    # width * height > max_pixels
    "too_small",          # height or width < min_size
)

ALPHA_BACKGROUND = 255  # white: see the module docstring

_EXIF_ORIENTATION_TAG = 0x0112

# Leading bytes of the formats this OpenCV build decodes, to tell a damaged
# file ("corrupt") from one that is not an image at all.
_OPENCV_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"II+\x00", "TIFF"), (b"MM\x00+", "TIFF"),
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"#?RADIANCE", "Radiance HDR"), (b"#?RGBE", "Radiance HDR"),
    (b"PF\n", "PFM"), (b"Pf\n", "PFM"),
    (b"\x59\xa6\x6a\x95", "Sun raster"),
)
_PNM_MAGIC = (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6", b"P7")
# Image formats OpenCV does not read: a clearer reason than "not an image".
_OTHER_IMAGE_SIGNATURES = (
    (b"8BPS", "Photoshop PSD"),
    (b"\x00\x00\x01\x00", "Windows icon"),
    (b"\xff\x0a", "JPEG XL"), (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"\x76\x2f\x31\x01", "OpenEXR"),
    (b"DDS ", "DirectDraw surface"),
    (b"qoif", "QOI"),
)


class DecodeError(ValueError):
    """An image file cannot be decoded (or is refused by a size limit).

    Attributes:
      reason: One of `REASONS`, for counting and reporting.
    """

    def __init__(self, reason: str, message: str):
        if reason not in REASONS:
            raise ValueError(f"unknown decode error reason {reason!r}; expected one of {REASONS}")
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        # Exceptions pickle as cls(*args); keep `reason` when Beam ships one.
        return type(self), (self.reason, str(self))


def decode_image(
    data: bytes,
    *,
    channels: int = 3,
    max_pixels: int | None = None,
    min_size: int = 1,
) -> np.ndarray:
    """Decodes an image file's bytes to a uint8 ``HxWxchannels`` array.

    Args:
      data: The whole file.
      channels: 3 for RGB, 1 for gray (ITU-R 601 luma).
      max_pixels: Refuse images whose width * height exceeds this; checked
        from the header before decoding where the format allows (JPEG, PNG,
        GIF, BMP, TIFF, WebP, JPEG 2000, PNM, AVIF), else after decoding.
        None: no limit of kiln's own (OpenCV still refuses more than 2**30).
      min_size: Refuse images whose height or width is below this.

    Returns:
      A C-contiguous uint8 array, RGB order, upright (EXIF orientation
      applied), alpha composited over white.

    Raises:
      DecodeError: with `.reason` one of `REASONS` and a message saying what
        is wrong.
      ValueError: for invalid arguments (a programming error, not bad data).
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}")
    if max_pixels is not None and max_pixels < 1:
        raise ValueError(f"max_pixels must be positive or None, got {max_pixels!r}")
    if min_size < 1:
        raise ValueError(f"min_size must be at least 1, got {min_size!r}")
    data = bytes(data)
    if not data:
        raise DecodeError("empty", "the file is empty (0 bytes)")

    header_size = _size_from_header(data)
    if header_size is not None:
        _check_size(*header_size, max_pixels=max_pixels, min_size=min_size, when="declares")

    pixels, exif = _decode_with_opencv(data)
    height, width = pixels.shape[:2]
    _check_size(width, height, max_pixels=max_pixels, min_size=min_size, when="is")

    image = _to_uint8(pixels)
    image = _to_rgb_or_gray(image, channels)
    orientation = _exif_orientation(exif) if exif is not None else 1
    return np.ascontiguousarray(_orient(image, orientation))


def _size_from_header(data: bytes) -> tuple[int, int] | None:
    """(width, height) the header declares, or None if it cannot be read."""
    try:
        info = imagesize.get_info(io.BytesIO(data), dpi=False, colors=False,
                                  exif_rotation=False, channels=False)
    except Exception as e:  # a parser of untrusted bytes may fail in any way
        logger.debug("image header not readable (%s: %s); checking sizes after decoding",
                     type(e).__name__, e)
        return None
    if info.width <= 0 or info.height <= 0:
        return None
    return info.width, info.height


def _check_size(width: int, height: int, *, max_pixels: int | None, min_size: int,
                when: str) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise DecodeError(
            "too_many_pixels",
            f"the image {when} {width}x{height} (WxH) = {width * height} pixels, "
            f"more than max_pixels {max_pixels}",
        )
    if width < min_size or height < min_size:
        raise DecodeError(
            "too_small", f"the image {when} {width}x{height} (WxH), smaller than min_size {min_size}"
        )


def _format_of(data: bytes, signatures) -> str | None:
    for magic, name in signatures:
        if data.startswith(magic):
            return name
    return None


def _sniff(data: bytes) -> tuple[str, str | None]:
    """(kind, format name): kind is "opencv", "other_image" or "unknown"."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "opencv", "WebP"
    if len(data) >= 12 and data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in (b"avif", b"avis"):
            return "opencv", "AVIF"
        if brand in (b"heic", b"heix", b"hevc", b"hevx", b"mif1", b"msf1"):
            return "other_image", "HEIF/HEIC"
    name = _format_of(data, _OPENCV_SIGNATURES)
    if name:
        return "opencv", name
    if data[:2] in _PNM_MAGIC and len(data) > 2 and data[2:3].isspace():
        return "opencv", "PNM"
    name = _format_of(data, _OTHER_IMAGE_SIGNATURES)
    if name:
        return "other_image", name
    if b"<svg" in data[:1024]:
        return "other_image", "SVG"
    return "unknown", None


def _decode_with_opencv(data: bytes) -> tuple[np.ndarray, bytes | None]:
    """Pixels as OpenCV returns them (BGR[A], any depth) and the EXIF block, if any."""
    buffer = np.frombuffer(data, np.uint8)
    try:
        pixels, metadata_types, metadata = cv2.imdecodeWithMetadata(buffer, cv2.IMREAD_UNCHANGED)
        failure = None
    except cv2.error as e:
        pixels, failure = None, str(e).strip().splitlines()[-1]
    if pixels is None or pixels.size == 0:
        kind, name = _sniff(data)
        detail = f" ({failure})" if failure else ""
        if kind == "opencv":
            raise DecodeError("corrupt", f"{name} data is truncated or damaged{detail}")
        if kind == "other_image":
            raise DecodeError("unsupported_format", f"{name} images are not supported{detail}")
        head = data[:16]
        raise DecodeError("not_an_image", f"not an image file (starts with {head!r}){detail}")
    exif = None
    for kind, block in zip(metadata_types, metadata):
        if kind == cv2.IMAGE_METADATA_EXIF:
            exif = np.asarray(block, np.uint8).tobytes()
    return pixels, exif


def _to_uint8(pixels: np.ndarray) -> np.ndarray:
    if pixels.dtype == np.uint8:
        return pixels
    if pixels.dtype == np.uint16:
        # round(v * 255 / 65535) == round(v / 257), exactly, in integers.
        return ((pixels.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if pixels.dtype in (np.float32, np.float64):
        return np.rint(np.clip(pixels, 0.0, 1.0) * 255.0).astype(np.uint8)
    raise DecodeError("unsupported_format", f"{pixels.dtype} samples are not supported")


def _composite_alpha(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``colour * a + background * (1 - a)``, rounded, in integers."""
    colour = colour.astype(np.uint32)
    alpha = alpha.astype(np.uint32)[:, :, np.newaxis]
    mixed = colour * alpha + ALPHA_BACKGROUND * (255 - alpha)
    return ((mixed + 127) // 255).astype(np.uint8)


def _to_rgb_or_gray(image: np.ndarray, channels: int) -> np.ndarray:
    if image.ndim == 2:
        image = image[:, :, np.newaxis]
    source_channels = image.shape[2]
    if source_channels == 2:  # gray + alpha
        gray = _composite_alpha(image[:, :, :1], image[:, :, 1])
        return gray if channels == 1 else np.repeat(gray, 3, axis=2)
    if source_channels == 1:
        return image if channels == 1 else np.repeat(image, 3, axis=2)
    if source_channels == 4:
        bgr = _composite_alpha(image[:, :, :3], image[:, :, 3])
    elif source_channels == 3:
        bgr = image
    else:
        raise DecodeError("unsupported_format", f"images with {source_channels} channels "
                                                f"are not supported")
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    return rgb if channels == 3 else to_grayscale(rgb)


def _exif_orientation(exif: bytes) -> int:
    """The EXIF orientation tag (1..8) of a TIFF-structured EXIF block; 1 if absent or unreadable."""
    if exif.startswith(b"Exif\x00\x00"):
        exif = exif[6:]
    byte_order = {b"II": "<", b"MM": ">"}.get(exif[:2])
    try:
        if byte_order is None:
            raise ValueError(f"unknown byte order {exif[:2]!r}")
        (first_ifd,) = struct.unpack_from(byte_order + "I", exif, 4)
        (entries,) = struct.unpack_from(byte_order + "H", exif, first_ifd)
        for index in range(entries):
            offset = first_ifd + 2 + 12 * index
            tag, field_type, _count = struct.unpack_from(byte_order + "HHI", exif, offset)
            if tag == _EXIF_ORIENTATION_TAG and field_type == 3:  # SHORT
                (value,) = struct.unpack_from(byte_order + "H", exif, offset + 8)
                if 1 <= value <= 8:
                    return value
                logger.debug("ignoring invalid EXIF orientation %d", value)
                return 1
    except (struct.error, ValueError) as e:
        logger.debug("ignoring unreadable EXIF block (%s)", e)
    return 1


def _orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """Turns stored pixels upright for an EXIF orientation (1..8).

    The tag says where the stored rows and columns belong: 2 mirrored,
    3 rotated 180 degrees, 4 flipped vertically, 5 transposed, 6 needs 90
    degrees clockwise, 7 transposed the other way, 8 needs 90 degrees
    counter-clockwise.
    """
    if orientation == 2:
        return image[:, ::-1]
    if orientation == 3:
        return image[::-1, ::-1]
    if orientation == 4:
        return image[::-1]
    if orientation == 5:
        return image.transpose(1, 0, 2)
    if orientation == 6:
        return image.transpose(1, 0, 2)[:, ::-1]
    if orientation == 7:
        return image[::-1, ::-1].transpose(1, 0, 2)
    if orientation == 8:
        return image.transpose(1, 0, 2)[::-1]
    return image
