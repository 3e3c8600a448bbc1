"""Small image files declaring huge images ("decompression bombs"), in every
format this OpenCV build decodes, and the file builders they need.

Each bomb is a file a decoder would accept up to the point of allocating the
declared image, most of them far enough to fill it: the BMP's RLE data ends
the bitmap at once (OpenCV paints the rest), the GIF's and animated WebP's
1x1 frame goes onto a canvas of the declared size, the Radiance HDR is the
real thing (every scanline run-length encoded, about 9 MB for 12000x12000).
"""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
from PIL import Image

TINY = np.full((8, 8, 3), 90, np.uint8)


def chunk(kind: bytes, body: bytes) -> bytes:
    """A PNG chunk."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real small JPEG with its frame header's size rewritten."""
    data = bytearray(cv2.imencode(".jpg", TINY)[1].tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def bmp_rle8(width: int, height: int) -> bytes:
    """An 8-bit RLE BMP whose data is one end-of-bitmap code."""
    palette = b"\x00\x00\x00\x00" * 256
    offset = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, 2, 2835, 2835, 256, 0)
    return b"BM" + struct.pack("<IHHI", offset + 2, 0, 0, offset) + info + palette + b"\x00\x01"


def bmp_os2(width: int, height: int) -> bytes:
    """A 24-bit BMP with the 12-byte OS/2 header (16-bit sizes)."""
    pitch = (width * 3 + 3) & ~3
    offset = 14 + 12
    return (
        b"BM"
        + struct.pack("<IHHI", offset + pitch * height, 0, 0, offset)
        + struct.pack("<IHHHH", 12, width, height, 1, 24)
        + bytes(pitch * height)
    )


def gif_screen(width: int, height: int) -> bytes:
    """A GIF with a width x height logical screen and one 1x1 frame."""
    return (
        b"GIF89a"
        + struct.pack("<HHBBB", width, height, 0x80, 0, 0)
        + b"\x00\x00\x00\xff\xff\xff"  # 2-colour global table
        + b"\x2c"
        + struct.pack("<HHHHB", 0, 0, 1, 1, 0)  # image descriptor
        + b"\x02\x02\x44\x01\x00"
        + b"\x3b"
    )  # LZW data, trailer


def _riff(*chunks: bytes) -> bytes:
    body = b"WEBP" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _webp_chunk(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("<I", len(body)) + body + (b"\x00" if len(body) % 2 else b"")


def webp_animated(width: int, height: int) -> bytes:
    """An animated WebP: a width x height canvas, one 1x1 lossless frame."""
    frame = cv2.imencode(".webp", TINY[:1, :1], [cv2.IMWRITE_WEBP_QUALITY, 101])[1].tobytes()
    bitstream = frame[12:]  # the "VP8L" chunk
    vp8x = (
        struct.pack("<I", 0x02)
        + (width - 1).to_bytes(3, "little")
        + (height - 1).to_bytes(3, "little")
    )
    anmf = bytes(6) + bytes(3) + bytes(3) + (100).to_bytes(3, "little") + b"\x00" + bitstream
    return _riff(
        _webp_chunk(b"VP8X", vp8x), _webp_chunk(b"ANIM", bytes(6)), _webp_chunk(b"ANMF", anmf)
    )


def webp_lossless_declaring(width: int, height: int) -> bytes:
    """A lossless WebP whose bitstream header declares width x height (at most 16384)."""
    bits = (width - 1) | (height - 1) << 14
    return _riff(_webp_chunk(b"VP8L", b"\x2f" + struct.pack("<I", bits) + bytes(27)))


def tiff(
    width: int,
    height: int,
    *,
    order: str = "<",
    big: bool = False,
    tile: tuple[int, int] | None = None,
    pixels: bytes | None = None,
) -> bytes:
    """An 8-bit gray TIFF (classic or BigTIFF), one strip or one tile, its data
    deflate-compressed (`pixels`: the uncompressed data; zeros if None)."""
    tile_width, tile_height = tile or (width, height)
    if pixels is None:  # zeros, compressed a megabyte at a time
        compressor, left, compressed = zlib.compressobj(9), tile_width * tile_height, b""
        while left:
            compressed += compressor.compress(bytes(min(left, 2**20)))
            left -= min(left, 2**20)
        compressed += compressor.flush()
    else:
        compressed = zlib.compress(pixels, 9)
    offset_tag, count_tag = (324, 325) if tile else (273, 279)
    entries = [
        (256, 4, width),
        (257, 4, height),
        (258, 3, 8),
        (259, 3, 8),
        (262, 3, 1),
        (277, 3, 1),
    ]
    if tile:
        entries += [(322, 4, tile_width), (323, 4, tile_height)]
    else:
        entries += [(278, 4, height)]
    entries += [(offset_tag, 4, 0), (count_tag, 4, len(compressed))]
    entries.sort()
    if big:
        head = (b"II+\x00" if order == "<" else b"MM\x00+") + struct.pack(order + "HHQ", 8, 0, 16)
        count_format, entry_format, field_size = "Q", "HHQ", 8
    else:
        head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "I", 8)
        count_format, entry_format, field_size = "H", "HHI", 4
    next_format = "Q" if big else "I"
    entry_size = struct.calcsize(order + entry_format) + field_size
    data_offset = (
        len(head)
        + struct.calcsize(order + count_format)
        + entry_size * len(entries)
        + struct.calcsize(order + next_format)
    )
    packed = struct.pack(order + count_format, len(entries))
    for tag, kind, value in entries:
        value = data_offset if tag == offset_tag else value
        field = struct.pack(order + ("H" if kind == 3 else "I"), value).ljust(field_size, b"\x00")
        packed += struct.pack(order + entry_format, tag, kind, 1) + field
    packed += struct.pack(order + next_format, 0)
    return head + packed + compressed


def radiance_hdr(width: int, height: int, rows: int | None = None) -> bytes:
    """A run-length encoded Radiance HDR of one colour: `rows` scanlines of
    `height` (all by default; about 760 bytes a scanline at width 12000)."""

    def runs(value: int) -> bytes:
        full, rest = divmod(width, 127)
        return (bytes((128 + 127, value)) * full) + (bytes((128 + rest, value)) if rest else b"")

    scanline = bytes((2, 2, width >> 8, width & 0xFF)) + runs(128) + runs(64) + runs(32) + runs(129)
    return (
        b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n"
        + f"-Y {height} +X {width}\n".encode()
        + scanline * (height if rows is None else rows)
    )


def sun_raster(width: int, height: int) -> bytes:
    return struct.pack(">IiiiiiII", 0x59A66A95, width, height, 8, width * height, 1, 0, 0) + bytes(
        64
    )


def jp2_declaring(width: int, height: int, *, codestream_only: bool = False) -> bytes:
    """A real small JPEG 2000 file with its SIZ marker's size rewritten."""
    buffer = io.BytesIO()  # (OpenCV writes JPEG 2000 to files only)
    Image.fromarray(TINY).save(buffer, "JPEG2000")
    data = bytearray(buffer.getvalue())
    siz = data.index(b"\xff\x4f\xff\x51") + 4
    data[siz + 4 : siz + 12] = struct.pack(">II", width, height)  # Xsiz, Ysiz (offsets are 0)
    data[siz + 20 : siz + 28] = struct.pack(">II", width, height)  # one tile: XTsiz, YTsiz
    if codestream_only:
        return bytes(data[siz - 4 :])
    return bytes(data)


def jp2_tiles(width: int, height: int, tile: int, *, codestream_only: bool = True) -> bytes:
    """A JPEG 2000 codestream of width x height in tiles of tile x tile."""
    data = bytearray(jp2_declaring(width, height, codestream_only=codestream_only))
    siz = data.index(b"\xff\x4f\xff\x51") + 4
    data[siz + 20 : siz + 28] = struct.pack(">II", tile, tile)  # XTsiz, YTsiz
    return bytes(data)


def png_with_a_chunk_of(length: int) -> bytes:
    """A 16x16 PNG whose second chunk declares `length` bytes and holds none."""
    header = struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + struct.pack(">I", length)
        + b"tEXt"
        + bytes(16)
    )


def avif_declaring(width: int, height: int) -> bytes:
    """A real small AVIF with its 'ispe' box rewritten."""
    data = bytearray(cv2.imencode(".avif", TINY)[1].tobytes())
    ispe = data.index(b"ispe")
    data[ispe + 8 : ispe + 16] = struct.pack(">II", width, height)
    return bytes(data)


def allocation_bombs() -> dict[str, tuple[bytes, str]]:
    """Small files whose pixel size is small but whose decoder would allocate
    a lot from other header fields: name -> (data, the decode reason they get)."""
    return {
        "chunk.png": (png_with_a_chunk_of(0xFFFF0000), "corrupt"),  # 4 GB, zeroed, before reading
        "tiles.j2k": (jp2_tiles(255, 256, 1), "unsupported_format"),  # 65280 tiles: about 600 MB
    }


def bombs(width: int, height: int) -> dict[str, bytes]:
    """A file in every format this OpenCV build decodes, each declaring width x
    height pixels (width and height at most 16383, the smallest format limit).
    Keys are file names: format and variant, with the usual extension."""
    return {
        "bomb.bmp": bmp_rle8(width, height),
        "bomb.gif": gif_screen(width, height),
        "bomb.avif": avif_declaring(width, height),
        "bomb.hdr": radiance_hdr(width, height, rows=2),
        "bomb.jpg": jpeg_declaring(width, height),
        "bomb-animated.webp": webp_animated(width, height),
        "bomb-lossless.webp": webp_lossless_declaring(width, height),
        "bomb.ras": sun_raster(width, height),
        "bomb.pbm": b"P4\n%d %d\n" % (width, height) + bytes(64),
        "bomb.pgm": b"P5\n%d %d\n255\n" % (width, height) + bytes(64),
        "bomb.ppm": b"P6 # comment\n%d %d 65535\n" % (width, height) + bytes(64),
        "bomb.pam": b"P7\nWIDTH %d\nHEIGHT %d\nDEPTH 3\nMAXVAL 255\nTUPLTYPE RGB\nENDHDR\n"
        % (width, height)
        + bytes(64),
        "bomb.pfm": b"PF\n%d %d\n-1.0\n" % (width, height) + bytes(64),
        "bomb.tif": tiff(width, height, pixels=bytes(4096)),
        "bomb-big-endian.tif": tiff(width, height, order=">", pixels=bytes(4096)),
        "bomb-bigtiff.tif": tiff(width, height, big=True, pixels=bytes(4096)),
        "bomb-tiles.tif": tiff(16, 16, tile=(width // 16 * 16, height // 16 * 16)),
        "bomb.png": png_declaring(width, height),
        "bomb.jp2": jp2_declaring(width, height),
        "bomb.j2k": jp2_declaring(width, height, codestream_only=True),
    }
