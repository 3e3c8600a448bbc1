"""The format and pixel size an image file declares, read from its header before decoding.

`decode_image` refuses a decompression bomb (a small file declaring a huge
image) before OpenCV allocates anything, so the size checked here must be
the size OpenCV's decoder is going to allocate, even for a file crafted to
make two readers disagree. Hence:

- `identify` tries the formats in the order OpenCV 5 tries its decoders
  (``imgcodecs/src/loadsave.cpp``), with the same signature checks: the
  format named is the decoder ``cv2.imdecode`` picks.
- Each reader follows the code its decoder runs: libjpeg-turbo's marker
  loop, libwebp's ``WebPGetFeatures`` on the first 32 bytes, libtiff's first
  directory, OpenJPEG's SIZ marker, and OpenCV's own readers for BMP, GIF,
  Radiance HDR, Sun raster, PNM, PAM and PFM (``fgets`` line buffers and
  ``sscanf`` included). Where a reader cannot be sure to read what the
  decoder reads, it refuses the file rather than guess: each accepts a
  subset of what its decoder accepts.
- `imagesize` reads AVIF's size (the primary item's ``ispe`` box; the AV1
  sequence headers, which size what libavif decodes, are read here). Its
  readers for the other formats disagree with the decoders on crafted
  files (it keeps the last JPEG frame header before the scan and reads
  ``FF 00`` as a marker with a length, reads GIF sizes as signed, ends PNM
  comments only at LF, reads the JP2 ``ihdr`` box rather than the
  codestream, misses raw WebP bitstreams, does not look past a PNG's
  IHDR), so those are read here.
- What a decoder allocates from other header fields before reading the
  pixels is bounded too: PNG chunks no longer than the file, at most 4096
  JPEG 2000 tiles.

Only the first frame of a multi-frame file is decoded (`decode_image`), and
OpenCV decodes it onto a canvas of the header's size: a GIF frame must lie
inside the logical screen, WebP and APNG frames inside the canvas, and TIFF
pages after the first are never read.
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Callable
from typing import NamedTuple

import imagesize


class ImageHeader(NamedTuple):
    """What a file's header declares.

    Attributes:
      format: The format's name, as in error messages ("JPEG", "PNG"...).
      width, height: The image size in pixels.
      decode_pixels: The pixels decoding allocates at once: width * height,
        or more when the decoder works on something larger than the image
        (TIFF tiles, an AVIF's coded AV1 frames).
    """

    format: str
    width: int
    height: int
    decode_pixels: int


class UnsupportedVariant(ValueError):
    """A format OpenCV reads, in a variant kiln does not decode because its
    size cannot be read before decoding (AVIF image sequences) or kiln has no
    use for it (more than 4 channels)."""


# Leading bytes of image formats OpenCV does not read: "unsupported_format"
# is a clearer reason than "not_an_image". (OpenEXR is off in the
# opencv-python-headless build; it would need a reader here to be accepted.)
_OTHER_IMAGE_SIGNATURES = (
    (b"8BPS", "Photoshop PSD"),
    (b"\x00\x00\x01\x00", "Windows icon"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"\x76\x2f\x31\x01", "OpenEXR"),
    (b"DDS ", "DirectDraw surface"),
    (b"qoif", "QOI"),
)
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"mif1", b"msf1")
_AVIF_BRANDS = (b"avif", b"avis")
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
_J2K_SIGNATURE = b"\xff\x4f\xff\x51"
_TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


def identify(data: bytes) -> tuple[str, str | None]:
    """(kind, format name) of a file: kind is "opencv" (a format OpenCV
    decodes: the name is a key of `read`'s readers), "other_image" (an image
    format OpenCV does not read) or "unknown" (no image signature)."""
    for name, claims, _ in _DECODERS:
        if claims(data):
            return "opencv", name
    for magic, name in _OTHER_IMAGE_SIGNATURES:
        if data.startswith(magic):
            return "other_image", name
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        return "other_image", "HEIF/HEIC"
    if b"<svg" in data[:1024]:
        return "other_image", "SVG"
    return "unknown", None


def read(data: bytes, format_name: str) -> ImageHeader:
    """The header of a file `identify` named `format_name`.

    Raises:
      UnsupportedVariant: a variant kiln does not decode.
      ValueError: the header is damaged, truncated, or not one the reader is
        sure the decoder reads the same way.
    """
    reader = _READERS[format_name]
    try:
        width, height, *buffers = reader(data)
    except (struct.error, OverflowError, IndexError):  # a field past the end of the file
        raise ValueError("truncated header") from None
    if width <= 0 or height <= 0:
        raise ValueError(f"invalid size {width}x{height}")
    return ImageHeader(format_name, width, height, max([width * height, *buffers]))


# --- readers, each returning (width, height[, decode pixels]) -------------------------


def _bmp(data: bytes):
    (header_size,) = struct.unpack_from("<i", data, 14)
    if header_size >= 36:  # BITMAPINFOHEADER and its successors: signed 32-bit sizes
        width, height = struct.unpack_from("<ii", data, 18)
    elif header_size == 12:  # OS/2 BITMAPCOREHEADER: unsigned 16-bit sizes
        width, height = struct.unpack_from("<HH", data, 18)
    else:
        raise ValueError(f"unknown BMP header size {header_size}")
    if height == -(2**31):  # abs() overflows in C
        raise ValueError("invalid height")
    return width, abs(height)  # negative: rows stored top-down


def _gif(data: bytes):
    if data[:6] not in (b"GIF87a", b"GIF89a"):
        raise ValueError("unknown GIF version")
    return struct.unpack_from("<HH", data, 6)  # the logical screen: every frame lies inside it


def _is_avif(data: bytes) -> bool:
    # libavif (OpenCV's AVIF check) wants a first 'ftyp' box naming an AVIF brand.
    if data[4:8] != b"ftyp":
        return False
    size = min(struct.unpack_from(">I", data, 0)[0], len(data))
    brands = [data[i : i + 4] for i in range(8, size, 4)]
    return any(brand in _AVIF_BRANDS for brand in brands[:1] + brands[2:])  # skip minor version


def _avif(data: bytes):
    """The primary item's 'ispe' box (read by imagesize) is the size OpenCV
    returns, but libavif decodes each AV1 payload at the size its sequence
    header gives (up to 16384x16384), whatever 'ispe' says: the largest coded
    frame of the file's AV1 items counts in the pixels decoded."""
    # libavif decodes the tracks of an image sequence (major brand 'avis', or
    # any brand but 'avif' with a 'moov' box), sized by the track header.
    boxes = _iso_boxes(data, 0, len(data))
    major = data[8:12]
    if major == b"avis" or (major != b"avif" and b"moov" in boxes):
        raise UnsupportedVariant("AVIF image sequences are not supported")
    width, height = _imagesize(data)
    if b"meta" not in boxes:
        raise ValueError("no meta box")
    frames = [_av1_max_frame(item) for item in _avif_av1_items(data, *boxes[b"meta"])]
    return width, height, *(frame_width * frame_height for frame_width, frame_height in frames)


def _iso_boxes(data: bytes, start: int, end: int) -> dict[bytes, tuple[int, int]]:
    """Box type -> (payload start, box end) of the boxes from `start` to `end`
    (the first of each type)."""
    boxes: dict[bytes, tuple[int, int]] = {}
    for kind, payload, box_end in _boxes(data, start, end):
        boxes.setdefault(kind, (payload, box_end))
    return boxes


def _boxes(data: bytes, start: int, end: int):
    """(type, payload start, box end) of each box from `start` to `end`, in
    order: the box layout of ISO BMFF (AVIF) and JP2 alike."""
    offset = start
    while offset + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, offset)
        header = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, offset + 8)
            header = 16
        elif size == 0:  # the last box
            size = end - offset
        if size < header or offset + size > end:
            raise ValueError("invalid box size")
        yield kind, offset + header, offset + size
        offset += size


def _avif_av1_items(data: bytes, meta_start: int, meta_end: int) -> list[bytes]:
    """The data of every 'av01' item (the image, its alpha plane, grid tiles...)."""
    children = _iso_boxes(data, meta_start + 4, meta_end)  # after the full box header
    if b"iinf" not in children or b"iloc" not in children:
        raise ValueError("no iinf or iloc box")
    start, end = children[b"iinf"]
    if end - start < 6:
        raise ValueError("invalid iinf box")
    version = data[start]
    entries_start = start + (6 if version == 0 else 8)
    av01_items = set()
    offset = entries_start
    while offset + 8 <= end:  # 'infe' boxes
        size, kind = struct.unpack_from(">I4s", data, offset)
        if size < 8 or offset + size > end:
            raise ValueError("invalid infe box")
        if kind == b"infe" and size >= 22 and data[offset + 8] in (2, 3):
            wide = data[offset + 8] == 3
            item_id = struct.unpack_from(">I" if wide else ">H", data, offset + 12)[0]
            item_type = data[offset + 12 + (4 if wide else 2) + 2 :][:4]
            if item_type == b"av01":
                av01_items.add(item_id)
        offset += size
    idat = children.get(b"idat", (0, 0))
    items = []
    for item_id, method, extents in _iloc(data, *children[b"iloc"]):
        if item_id not in av01_items:
            continue
        if method not in (0, 1):
            raise ValueError("AV1 item data in another item")
        origin, limit = (0, len(data)) if method == 0 else idat
        item = b""
        for extent_offset, extent_length in extents:
            begin = origin + extent_offset
            finish = limit if extent_length == 0 else begin + extent_length
            if finish > limit or len(item) + finish - begin > len(data):
                raise ValueError("AV1 item data outside the file")
            item += data[begin:finish]
        items.append(item)
    if not items:
        raise ValueError("no AV1 image item")
    return items


def _iloc(data: bytes, start: int, end: int):
    """(item id, construction method, [(offset, length)]) of each item in an 'iloc' box."""
    if end - start < 8:
        raise ValueError("invalid iloc box")
    version = data[start]
    offset_size, length_size = data[start + 4] >> 4, data[start + 4] & 0x0F
    base_offset_size, index_size = data[start + 5] >> 4, data[start + 5] & 0x0F
    position = start + 6

    def take(size):
        nonlocal position
        if size not in (0, 2, 4, 8) or position + size > end:
            raise ValueError("invalid iloc box")
        value = int.from_bytes(data[position : position + size], "big")
        position += size
        return value

    for _ in range(take(2 if version < 2 else 4)):
        item_id = take(2 if version < 2 else 4)
        method = take(2) & 0x0F if version in (1, 2) else 0
        take(2)  # data reference index
        base = take(base_offset_size)
        extents = []
        for _ in range(take(2)):
            if version in (1, 2):
                take(index_size)
            extents.append((base + take(offset_size), take(length_size)))
        yield item_id, method, extents


def _av1_max_frame(item: bytes) -> tuple[int, int]:
    """The largest maximum frame size of the sequence header OBUs in an AV1
    payload: no frame of the payload is larger."""
    largest, offset = (0, 0), 0
    while offset < len(item):
        header = item[offset]
        obu_type, extension, has_size = (header >> 3) & 0x0F, (header >> 2) & 1, (header >> 1) & 1
        offset += 1 + extension
        if has_size:
            size = 0
            for index in range(8):  # leb128
                if offset >= len(item):
                    raise ValueError("truncated OBU")
                byte = item[offset]
                offset += 1
                size |= (byte & 0x7F) << (7 * index)
                if not byte & 0x80:
                    break
        else:
            size = len(item) - offset
        if offset + size > len(item):
            raise ValueError("truncated OBU")
        if obu_type == 1:  # sequence header
            frame = _av1_sequence_frame_size(item[offset : offset + size])
            largest = max(largest, frame, key=lambda pair: pair[0] * pair[1])
        offset += size
    return largest


def _av1_sequence_frame_size(payload: bytes) -> tuple[int, int]:
    """max_frame_width_minus_1 + 1, max_frame_height_minus_1 + 1 of an AV1
    sequence header OBU (AV1 specification, section 5.5)."""
    bits = _BitReader(payload)
    bits.read(3)  # seq_profile
    bits.read(1)  # still_picture
    if bits.read(1):  # reduced_still_picture_header
        bits.read(5)  # seq_level_idx[0]
    else:
        decoder_model_info = False
        buffer_delay_length = 0
        if bits.read(1):  # timing_info_present_flag
            bits.read(32)  # num_units_in_display_tick
            bits.read(32)  # time_scale
            if bits.read(1):  # equal_picture_interval
                bits.uvlc()  # num_ticks_per_picture_minus_1
            decoder_model_info = bool(bits.read(1))
            if decoder_model_info:
                buffer_delay_length = bits.read(5) + 1
                bits.read(32)  # num_units_in_decoding_tick
                bits.read(5)  # buffer_removal_time_length_minus_1
                bits.read(5)  # frame_presentation_time_length_minus_1
        initial_display_delay = bits.read(1)
        for _ in range(bits.read(5) + 1):  # operating points
            bits.read(12)  # operating_point_idc
            if bits.read(5) > 7:  # seq_level_idx
                bits.read(1)  # seq_tier
            if decoder_model_info and bits.read(1):  # decoder_model_present_for_this_op
                bits.read(buffer_delay_length)  # decoder_buffer_delay
                bits.read(buffer_delay_length)  # encoder_buffer_delay
                bits.read(1)  # low_delay_mode_flag
            if initial_display_delay and bits.read(1):
                bits.read(4)  # initial_display_delay_minus_1
    width_bits, height_bits = bits.read(4) + 1, bits.read(4) + 1
    return bits.read(width_bits) + 1, bits.read(height_bits) + 1


class _BitReader:
    def __init__(self, data: bytes):
        self._data, self._position = data, 0

    def read(self, count: int) -> int:
        value = 0
        for _ in range(count):
            byte, bit = divmod(self._position, 8)
            if byte >= len(self._data):
                raise ValueError("truncated AV1 sequence header")
            value = value << 1 | (self._data[byte] >> (7 - bit)) & 1
            self._position += 1
        return value

    def uvlc(self) -> int:
        leading_zeros = 0
        while not self.read(1):
            leading_zeros += 1
            if leading_zeros >= 32:
                return 2**32 - 1
        return self.read(leading_zeros) + (1 << leading_zeros) - 1


_C_SPACE = rb"[ \t\n\v\f\r]*"
_HDR_RESOLUTION = re.compile(  # sscanf(line, "-Y %d +X %d", &height, &width)
    rb"-Y" + _C_SPACE + rb"([+-]?[0-9]+)" + _C_SPACE + rb"\+X" + _C_SPACE + rb"([+-]?[0-9]+)"
)


def _radiance_hdr(data: bytes):
    """OpenCV's RGBE_ReadHeader: lines read with ``fgets(buf, 128)``, so a
    line of 127 characters or more counts as several."""
    lines = _c_lines(data, 128)
    next(lines)  # "#?RADIANCE" or "#?RGBE"
    has_format = False
    for line in lines:
        if line.startswith(b"\n"):  # the blank line that ends the header
            break
        if line == b"FORMAT=32-bit_rle_rgbe\n":
            has_format = True
    else:
        raise ValueError("no end of header")
    if not has_format:
        raise ValueError("no FORMAT=32-bit_rle_rgbe line")
    match = _HDR_RESOLUTION.match(next(lines, b""))
    if not match:
        raise ValueError("no '-Y height +X width' line (the only orientation OpenCV reads)")
    height, width = (_c_int(value) for value in match.groups())
    return width, height


def _c_lines(data: bytes, buffer_size: int):
    """What successive ``fgets(buf, buffer_size, file)`` calls read, as C
    strings (cut at the first NUL)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start, start + buffer_size - 1)
        end = end + 1 if end >= 0 else min(start + buffer_size - 1, len(data))
        yield data[start:end].split(b"\0", 1)[0]
        start = end


def _c_int(text: bytes) -> int:
    if len(text.lstrip(b"+-")) > 9:  # beyond a C int: overflow semantics differ
        raise ValueError("number too large")
    return int(text)


# libjpeg-turbo: the frame header markers it decodes (baseline, extended,
# progressive, lossless; arithmetic sequential and progressive), the
# segments it skips by their length, and the markers without a length.
_JPEG_FRAME_MARKERS = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC9, 0xCA))
_JPEG_SEGMENT_MARKERS = frozenset((0xC4, 0xCC, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)))
_JPEG_STANDALONE_MARKERS = frozenset((0x01, *range(0xD0, 0xD8)))


def _jpeg(data: bytes):
    """The first frame header, found the way libjpeg's ``next_marker`` does:
    bytes up to the next FF are skipped, fill FFs swallowed, and ``FF 00``
    is data, not a marker. Any other marker before the frame header (a second
    SOI, EOI, SOS, an unsupported frame type) makes libjpeg fail."""
    offset = 2
    while True:
        marker = 0
        while marker == 0:
            offset = data.find(b"\xff", offset)
            if offset < 0:
                raise ValueError("no frame header")
            while offset < len(data) and data[offset] == 0xFF:
                offset += 1
            if offset == len(data):
                raise ValueError("no frame header")
            marker = data[offset]
            offset += 1
        if marker in _JPEG_FRAME_MARKERS:
            _length, _precision, height, width = struct.unpack_from(">HBHH", data, offset)
            return width, height
        if marker in _JPEG_SEGMENT_MARKERS:
            (length,) = struct.unpack_from(">H", data, offset)
            if length < 2:
                raise ValueError(f"invalid length {length} of marker 0x{marker:02X}")
            offset += length
        elif marker not in _JPEG_STANDALONE_MARKERS:
            raise ValueError(f"marker 0x{marker:02X} before the frame header")


def _is_webp(data: bytes) -> bool:
    return (data[:4] == b"RIFF" and data[8:12] == b"WEBP") or _webp_features(data) is not None


def _webp(data: bytes):
    size = _webp_features(data)
    if size is None:
        raise ValueError("invalid WebP header")
    return size


_WEBP_MAX_CHUNK_PAYLOAD = 2**32 - 1 - 8 - 1


def _webp_features(data: bytes) -> tuple[int, int] | None:
    """libwebp's ``WebPGetFeatures`` on the first 32 bytes, as OpenCV calls it
    to choose the decoder and to size the image: (width, height), or None
    where it fails. The canvas of an extended (VP8X) file, else the size in
    the VP8 or VP8L bitstream (which the RIFF container may omit)."""
    if len(data) < 32:
        return None
    data = data[:32]
    offset = riff_size = 0
    if data[:4] == b"RIFF":
        if data[8:12] != b"WEBP":
            return None
        (riff_size,) = struct.unpack_from("<I", data, 4)
        if not 12 <= riff_size <= _WEBP_MAX_CHUNK_PAYLOAD:
            return None
        offset = 12
    canvas = None
    if data[offset : offset + 4] == b"VP8X":
        (chunk_size,) = struct.unpack_from("<I", data, offset + 4)
        if chunk_size != 10 or not riff_size:
            return None
        flags = data[offset + 8]
        width = 1 + int.from_bytes(data[offset + 12 : offset + 15], "little")
        height = 1 + int.from_bytes(data[offset + 15 : offset + 18], "little")
        if width * height >= 2**32:
            return None
        canvas = (width, height)
        if flags & 0x02:  # animated: frames lie inside the canvas
            return canvas
        offset += 18
    # Past this point, running out of the 32 bytes is success for an
    # extended file (the canvas is the size) and failure otherwise.
    if (riff_size and canvas) or (not riff_size and data[offset : offset + 4] == b"ALPH"):
        total = 22  # "WEBP" + the VP8X chunk
        while True:
            if len(data) - offset < 8:
                return canvas
            (chunk_size,) = struct.unpack_from("<I", data, offset + 4)
            if chunk_size > _WEBP_MAX_CHUNK_PAYLOAD:
                return None
            disk_size = (8 + chunk_size + 1) & ~1
            total += disk_size
            if riff_size and total > riff_size:
                return None
            if data[offset : offset + 4] in (b"VP8 ", b"VP8L"):
                break
            if len(data) - offset < disk_size:
                return canvas
            offset += disk_size
    if len(data) - offset < 8:
        return canvas
    if data[offset : offset + 4] in (b"VP8 ", b"VP8L"):
        lossless = data[offset : offset + 4] == b"VP8L"
        (stream_size,) = struct.unpack_from("<I", data, offset + 4)
        if riff_size >= 12 and stream_size > riff_size - 12:
            return None
        offset += 8
    else:  # a bare bitstream
        stream = data[offset:]
        lossless = len(stream) >= 5 and stream[0] == 0x2F and stream[4] >> 5 == 0
        stream_size = len(stream)
    if stream_size > _WEBP_MAX_CHUNK_PAYLOAD:
        return None
    stream = data[offset:]
    if lossless:
        if len(stream) < 5:
            return canvas
        bits = int.from_bytes(stream[1:5], "little")
        if stream[0] != 0x2F or bits >> 29 != 0:
            return None
        size = ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    else:
        if len(stream) < 10:
            return canvas
        if stream[3:6] != b"\x9d\x01\x2a":
            return None
        bits = int.from_bytes(stream[0:3], "little")
        if bits & 1 or (bits >> 1) & 7 > 3 or not (bits >> 4) & 1 or bits >> 5 >= stream_size:
            return None  # not a shown key frame of a known profile
        size = (
            int.from_bytes(stream[6:8], "little") & 0x3FFF,
            int.from_bytes(stream[8:10], "little") & 0x3FFF,
        )
        if 0 in size:
            return None
    if canvas is not None and canvas != size:
        return None
    return size


def _sun_raster(data: bytes):
    return struct.unpack_from(">ii", data, 4)


def _is_pnm(data: bytes) -> bool:
    return data[:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace()


def _pnm(data: bytes):
    """OpenCV's PxM reader: numbers separated by whitespace, and comments
    from '#' to the end of the line (CR or LF)."""
    width, offset = _pnm_number(data, 2)
    height, offset = _pnm_number(data, offset)
    if data[1:2] not in b"14":
        maxval, _ = _pnm_number(data, offset)
        if not 0 < maxval < 2**16:
            raise ValueError(f"invalid maximum value {maxval}")
    return width, height


def _pnm_number(data: bytes, offset: int) -> tuple[int, int]:
    """OpenCV's ReadNumber from `offset`: (value, offset after the byte that ended it)."""

    def byte():
        nonlocal offset
        if offset >= len(data):
            raise ValueError("truncated header")
        offset += 1
        return data[offset - 1 : offset]

    code = byte()
    while not code.isdigit():
        if code == b"#":
            while code not in (b"\n", b"\r"):
                code = byte()
            code = byte()
        elif code.isspace():
            while code.isspace():
                code = byte()
        else:
            raise ValueError("unexpected byte in the header")
    value = 0
    while code.isdigit():
        value = value * 10 + int(code)
        if value > 2**31 - 1:
            raise ValueError("number too large")
        code = byte()
    return value, offset


_PAM_FIELDS = (b"WIDTH", b"HEIGHT", b"DEPTH", b"MAXVAL", b"TUPLTYPE")
_PAM_LINE_BYTES = re.compile(rb"[ \t\x21-\x7e]*")  # printable ASCII, spaces and tabs


def _pam(data: bytes):
    """OpenCV's PAM reader, for headers of LF-terminated lines of printable
    ASCII: ``KEY value`` lines (each key once) and comments, up to ENDHDR.
    Stricter than OpenCV on purpose: where it is looser (CR line ends,
    values continued on the next line), the two could read different sizes."""
    if data[2:3] != b"\n":
        raise ValueError("only LF line ends are read")
    fields: dict[bytes, bytes] = {}
    offset = 3
    while True:
        end = data.find(b"\n", offset)
        if end < 0:
            raise ValueError("no ENDHDR")
        line, offset = data[offset:end], end + 1
        if not _PAM_LINE_BYTES.fullmatch(line):
            raise ValueError("unexpected byte in the header")
        words = line.split(None, 1)
        if not words or words[0].startswith(b"#"):
            continue
        if words == [b"ENDHDR"]:
            break
        key, value = words[0], words[1].rstrip() if len(words) > 1 else b""
        if key not in _PAM_FIELDS or key in fields:
            raise ValueError("unknown or repeated header field")
        if key != b"TUPLTYPE" and not re.fullmatch(rb"[0-9]{1,9}", value):
            raise ValueError(f"{key.decode('ascii')} is not a number")
        fields[key] = value
    if not all(key in fields for key in _PAM_FIELDS[:4]):
        raise ValueError("WIDTH, HEIGHT, DEPTH or MAXVAL missing")
    depth, maxval = int(fields[b"DEPTH"]), int(fields[b"MAXVAL"])
    if not 0 < maxval < 2**16:
        raise ValueError(f"invalid maximum value {maxval}")
    if not 1 <= depth <= 4:
        raise UnsupportedVariant(f"PAM images with {depth} channels are not supported")
    return int(fields[b"WIDTH"]), int(fields[b"HEIGHT"])


def _pfm(data: bytes):
    """OpenCV's PFM reader: "PF" or "Pf", LF, then width and height, each
    ended by one whitespace byte (read with atoi: only plain digits are
    accepted here)."""
    match = re.match(rb"P[Ff]\n([0-9]{1,9})[ \t\n\v\f\r]([0-9]{1,9})[ \t\n\v\f\r]", data)
    if not match:
        raise ValueError("expected 'PF' or 'Pf', LF, width and height")
    return int(match[1]), int(match[2])


_TIFF_SIZE_TAGS = {256: "ImageWidth", 257: "ImageLength", 322: "TileWidth", 323: "TileLength"}


def _tiff(data: bytes):
    """The first directory (the page OpenCV decodes), as libtiff reads it.
    Its tile buffer counts too: OpenCV allocates and fills a whole tile,
    even one far larger than the image."""
    order = "<" if data[:2] == b"II" else ">"
    if data[2:4] in (b"*\x00", b"\x00*"):  # classic TIFF
        (directory,) = struct.unpack_from(order + "I", data, 4)
        count_format, entry_size, value_types = "H", 12, {3: "H", 4: "I"}
    else:  # BigTIFF
        if struct.unpack_from(order + "HH", data, 4) != (8, 0):
            raise ValueError("invalid BigTIFF header")
        (directory,) = struct.unpack_from(order + "Q", data, 8)
        count_format, entry_size, value_types = "Q", 20, {3: "H", 4: "I", 16: "Q"}
    (count,) = struct.unpack_from(order + count_format, data, directory)
    first_entry = directory + struct.calcsize(count_format)
    if count == 0 or first_entry + count * entry_size > len(data):
        raise ValueError("truncated or empty directory")
    fields: dict[int, int] = {}
    for entry in range(first_entry, first_entry + count * entry_size, entry_size):
        tag, field_type = struct.unpack_from(order + "HH", data, entry)
        if tag not in _TIFF_SIZE_TAGS:
            continue
        # Strict where libtiff is lenient (other integer types, a repeated
        # tag: libtiff keeps the first), so that both read the same value.
        value_count = struct.unpack_from(
            order + ("I" if entry_size == 12 else "Q"), data, entry + 4
        )[0]
        if tag in fields or value_count != 1 or field_type not in value_types:
            raise ValueError(f"unexpected {_TIFF_SIZE_TAGS[tag]} field")
        value_offset = entry + (8 if entry_size == 12 else 12)
        (fields[tag],) = struct.unpack_from(order + value_types[field_type], data, value_offset)
    if 256 not in fields or 257 not in fields:
        raise ValueError("no ImageWidth or ImageLength")
    width, height = fields[256], fields[257]
    if (322 in fields) != (323 in fields):
        raise ValueError("TileWidth without TileLength or the reverse")
    tile_width = fields.get(322) or width  # 0: OpenCV reads a whole row, or column
    tile_height = fields.get(323) or height
    return width, height, tile_width * tile_height


def _png(data: bytes):
    """The IHDR chunk, which OpenCV wants first and 13 bytes long; and every
    chunk up to IEND no longer than the rest of the file: OpenCV allocates
    and zeroes a chunk's declared length (up to 4 GB) before reading it."""
    length, kind, width, height = struct.unpack_from(">I4sII", data, 8)
    if kind != b"IHDR" or length != 13:
        raise ValueError("the first chunk is not a 13-byte IHDR")
    offset = 8
    while offset < len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        offset += 12 + length
        if offset > len(data):
            raise ValueError("a chunk longer than the rest of the file")
        if kind == b"IEND":
            break
    return width, height


def _imagesize(data: bytes) -> tuple[int, int]:
    try:
        info = imagesize.get_info(
            io.BytesIO(data), dpi=False, colors=False, exif_rotation=False, channels=False
        )
    except Exception as e:  # a parser of untrusted bytes may fail in any way
        raise ValueError(f"imagesize: {type(e).__name__}") from None
    return info.width, info.height


def _jpeg_2000(data: bytes):
    """OpenJPEG sizes the image by the codestream's SIZ marker (not the JP2
    'ihdr' box): Xsiz - XOsiz by Ysiz - YOsiz. In a JP2 file the codestream
    is the first top-level 'jp2c' box."""
    offset = 0
    if data.startswith(_JP2_SIGNATURE):
        codestreams = (
            payload for kind, payload, _ in _boxes(data, 0, len(data)) if kind == b"jp2c"
        )
        first = next(codestreams, None)
        if first is None:
            raise ValueError("no codestream box")
        offset = first
    if data[offset : offset + 4] != _J2K_SIGNATURE:
        raise ValueError("codestream does not start with SOC and SIZ")
    (
        _lsiz,
        _rsiz,
        x_size,
        y_size,
        x_offset,
        y_offset,
        tile_width,
        tile_height,
        tile_x_offset,
        tile_y_offset,
        components,
    ) = struct.unpack_from(">HHIIIIIIIIH", data, offset + 4)
    if x_size <= x_offset or y_size <= y_offset:
        raise ValueError("empty image area")
    if not 1 <= components <= 4:
        raise UnsupportedVariant(f"JPEG 2000 images with {components} components are not supported")
    if not (
        0 < tile_width and 0 < tile_height and tile_x_offset < x_size and tile_y_offset < y_size
    ):
        raise ValueError("invalid tiling")
    tiles = -(-(x_size - tile_x_offset) // tile_width) * -(-(y_size - tile_y_offset) // tile_height)
    if tiles > _J2K_MAX_TILES:
        raise UnsupportedVariant(
            f"JPEG 2000 images of more than {_J2K_MAX_TILES} tiles are not supported"
        )
    return x_size - x_offset, y_size - y_offset


# OpenJPEG allocates the coding parameters of every tile up front, kilobytes
# a tile, and allows 65535 tiles: a file of a few hundred bytes can claim
# hundreds of megabytes. Encoders use a single tile or tiles of 256x256 and more.
_J2K_MAX_TILES = 4096


_Reader = Callable[[bytes], tuple]
# OpenCV 5's decoders in the order it tries them (JPEG XL, OpenEXR and GDAL,
# off in this build, are not tried: files in those formats are refused).
_DECODERS: tuple[tuple[str, Callable[[bytes], bool], _Reader], ...] = (
    ("BMP", lambda data: data.startswith(b"BM"), _bmp),
    ("GIF", lambda data: data.startswith(b"GIF"), _gif),
    ("AVIF", _is_avif, _avif),
    ("Radiance HDR", lambda data: data.startswith((b"#?RGBE", b"#?RADIANCE")), _radiance_hdr),
    ("JPEG", lambda data: data.startswith(b"\xff\xd8\xff"), _jpeg),
    ("WebP", _is_webp, _webp),
    ("Sun raster", lambda data: data.startswith(b"\x59\xa6\x6a\x95"), _sun_raster),
    ("PNM", _is_pnm, _pnm),
    ("PAM", lambda data: data[:2] == b"P7" and data[2:3].isspace(), _pam),
    ("PFM", lambda data: data[:2] in (b"PF", b"Pf") and data[2:3].isspace(), _pfm),
    ("TIFF", lambda data: data.startswith(_TIFF_SIGNATURES), _tiff),
    ("PNG", lambda data: data.startswith(b"\x89PNG\r\n\x1a\n"), _png),
    ("JPEG 2000", lambda data: data.startswith((_JP2_SIGNATURE, _J2K_SIGNATURE)), _jpeg_2000),
)
_READERS = {name: reader for name, _, reader in _DECODERS}
