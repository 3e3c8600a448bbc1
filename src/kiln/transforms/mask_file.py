"""A mask file's bytes to the class ids written in it (``H x W`` uint8), never converted.

A mask holds class ids, not colours or luma, so its samples are read as
written or the file is refused (`MaskFileError`):

- PNG, the format masks are written in, in every single-channel layout:
  grayscale of 8 bits, and of 1, 2 or 4 bits, whose samples OpenCV (libpng)
  widens to 8 bits by replication (a 1-bit 1 becomes 255: silently another
  class, or the ignore value), so the widening is undone; and palette
  (indexed) PNGs, Pascal VOC's ``SegmentationClass`` format, whose indices
  are the class ids. OpenCV has no flag that keeps palette indices (it
  expands them to colours), but a palette PNG's image data is laid out
  exactly as a grayscale PNG's of the same bit depth: its header is
  rewritten to say grayscale, and the palette and other ancillary chunks are
  left out, before OpenCV decodes it. No pixel is decoded here.
- Lossy formats are refused, whatever they decode to: JPEG, lossy WebP
  (VP8), AVIF and JPEG 2000 (lossy unless encoded reversibly and kept whole,
  which the file does not say). Lossy compression invents values at the
  edges between classes: some are not class ids, others are the wrong ones.
- Other formats OpenCV reads (BMP, TIFF, PNM...) are refused too: each has
  variants OpenCV decodes to other values than the ones written (it maps a
  BMP's palette to its gray levels, widens 1-bit BMP, TIFF and PBM images,
  scales a PGM of a maximum below 255, and a TIFF may hold JPEG data), and
  telling them apart would take a reader of every format's header. Masks
  are PNGs, as the build's masks are written; any image converts to one.
- More than 8 bits (16-bit PNG), more than one channel (colour, gray with
  alpha) and floating point are refused, saying what the file is.

The header, and so the pixel count, is read (`image_header`) before
anything is decoded: a mask can be a decompression bomb too.

Pure and thread-safe: the same bytes always give the same array.
"""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np

from kiln.transforms import image_header

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_GRAY, _PNG_PALETTE = 0, 3
# What a palette PNG keeps when read as grayscale: the image data and the
# chunks that frame it. The palette and transparency become meaningless
# (and a palette tRNS is not a grayscale one), and no other chunk changes
# the samples OpenCV returns.
_PNG_IMAGE_CHUNKS = (b"IHDR", b"IDAT", b"IEND")

# Formats whose compression changes pixel values (or may: the file does not
# say whether a JPEG 2000 codestream is lossless), by `image_header` name.
_LOSSY_FORMATS = {
    "JPEG": "a JPEG mask",
    "AVIF": "an AVIF mask",
    "JPEG 2000": "a JPEG 2000 mask (lossless only if encoded reversibly and kept whole, "
    "which the file does not say)",
}
_CHANNELS = {2: "gray with alpha", 3: "colour", 4: "colour with alpha"}
# PNG colour types of more than one channel, and their channels: named from
# the header, since OpenCV decodes gray with alpha as 4 channels (BGRA).
_PNG_CHANNELS = {2: 3, 4: 2, 6: 4}


class MaskFileError(ValueError):
    """A mask file whose class ids cannot be read as written; the message says why."""


def decode_mask_file(data: bytes, max_pixels: int) -> np.ndarray:
    """The class ids a mask file holds, as ``H x W`` uint8 (see the module docstring).

    Args:
      data: The file's bytes.
      max_pixels: Files whose header declares more pixels are refused
        before decoding.

    Raises:
      MaskFileError: not an image of at most `max_pixels` pixels, lossy,
        not one channel of at most 8 bits, or does not decode.
    """
    kind, name = image_header.identify(data)
    try:
        header_ok = name is not None and image_header.read(data, name).decode_pixels <= max_pixels
    except ValueError:
        header_ok = False
    if kind != "opencv" or name is None or not header_ok:
        raise MaskFileError(f"not a PNG (or image) file of at most {max_pixels} pixels")
    lossy = _LOSSY_FORMATS.get(name)
    if name == "WebP" and _is_lossy_webp(data):
        lossy = "a lossy WebP mask"
    if lossy:
        raise MaskFileError(
            f"{lossy}: lossy compression changes class ids at the edges between classes; "
            f"save masks as PNG"
        )
    if name != "PNG":
        raise MaskFileError(
            f"a {name} mask: masks are read from PNG files only, whose every layout (8-bit, "
            f"1, 2 or 4 bits, palette) gives the class ids as written; {name} files have "
            f"variants that decode to other values (palettes, fewer bits, scaled samples): "
            f"save the mask as PNG"
        )
    return _png_class_ids(data)


def _imdecode(data: bytes) -> np.ndarray:
    mask = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if mask is None:
        raise MaskFileError("the mask file does not decode")
    return mask


def _single_channel(mask: np.ndarray, name: str) -> np.ndarray:
    """The decoded pixels if they are one channel of 8 bits, else why not."""
    if mask.ndim == 3 and mask.shape[2] == 1:
        mask = mask[:, :, 0]
    channels = 1 if mask.ndim == 2 else mask.shape[2]
    if channels != 1:
        raise _channels_error(channels, name)
    if mask.dtype != np.uint8:
        depth = f"{mask.dtype.itemsize * 8}-bit" if mask.dtype.kind == "u" else str(mask.dtype)
        raise MaskFileError(
            f"a {depth} {name}: class ids are read from masks of at most 8 bits (ids "
            f"0..255); save the mask with 8 bits"
        )
    return np.ascontiguousarray(mask)


def _channels_error(channels: int, name: str) -> MaskFileError:
    what = _CHANNELS.get(channels, f"{channels} channels")
    return MaskFileError(
        f"a {what} {name} ({channels} channels): a mask holds one channel of class ids and "
        f"kiln does not map colours to classes; save the ids as a grayscale or palette PNG"
    )


def _png_class_ids(data: bytes) -> np.ndarray:
    """A single-channel PNG's samples as written (see the module docstring).
    `image_header` has checked that IHDR comes first and that every chunk
    lies inside the file."""
    depth, colour = data[24], data[25]
    if colour in _PNG_CHANNELS:
        raise _channels_error(_PNG_CHANNELS[colour], "PNG")
    if colour == _PNG_PALETTE:
        if depth not in (1, 2, 4, 8):
            raise MaskFileError(f"the mask file does not decode (a palette PNG of {depth} bits)")
        data = _palette_as_gray(data)
    mask = _single_channel(_imdecode(data), "PNG")
    if colour in (_PNG_GRAY, _PNG_PALETTE) and depth < 8:
        # libpng widens a d-bit sample v to 8 bits as v * (255 // (2**d - 1)).
        scale = 255 // (2**depth - 1)
        if (mask % scale).any():  # never guess: OpenCV did not widen as expected
            raise MaskFileError(f"the {depth}-bit samples could not be read as written")
        mask = mask // scale
    return mask


def _palette_as_gray(data: bytes) -> bytes:
    """A palette PNG as the grayscale PNG of its indices: the same image data
    under a header that says grayscale (`_PNG_IMAGE_CHUNKS`)."""
    ihdr = data[16:29]
    if struct.unpack_from(">I", data, 29)[0] != zlib.crc32(b"IHDR" + ihdr):
        raise MaskFileError("the mask file does not decode (a damaged PNG header)")
    gray = ihdr[:9] + bytes([_PNG_GRAY]) + ihdr[10:]
    parts = [_PNG_SIGNATURE, data[8:16], gray, struct.pack(">I", zlib.crc32(b"IHDR" + gray))]
    offset = 33
    while offset < len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        end = offset + 12 + length
        if kind in _PNG_IMAGE_CHUNKS:
            parts.append(data[offset:end])
        if kind == b"IEND":
            break
        offset = end
    return b"".join(parts)


def _is_lossy_webp(data: bytes) -> bool:
    """Whether a WebP file's image is a VP8 (lossy) bitstream rather than VP8L
    (lossless): the first of them among the RIFF container's chunks (a bare
    bitstream, without the container, is VP8L only if it starts 0x2F)."""
    if data[:4] != b"RIFF":
        return data[:1] != b"\x2f"
    offset = 12
    while offset + 8 <= len(data):
        kind = data[offset : offset + 4]
        if kind in (b"VP8 ", b"VP8L"):
            return kind == b"VP8 "
        if kind == b"ANMF":  # an animation frame: its image chunk follows a 16-byte header
            offset += 8 + 16
            continue
        (length,) = struct.unpack_from("<I", data, offset + 4)
        offset += 8 + length + (length & 1)
    return False
