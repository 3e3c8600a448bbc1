"""image_header: the size a file declares is the size OpenCV decodes.

Files come from two independent encoders (OpenCV and Pillow) and from the
builders in `bombs`; the crafted cases are files on which a simpler reader
(imagesize's, or a line-based one) reads another size than the decoder.
The last tests mutate and cut real files and check, for every variant the
header reader accepts, that OpenCV decodes the size it read or fails.
"""

import io
import random
import struct

import cv2
import numpy as np
import pytest
from PIL import Image

import bombs
from kiln.transforms import image_header
from kiln.transforms.image_header import UnsupportedVariant, identify, read

RNG = np.random.default_rng(7)


def opencv(extension, image, *params):
    ok, encoded = cv2.imencode(extension, image, list(params))
    assert ok, extension
    return encoded.tobytes()


def pillow(image, fmt, **save_args):
    buffer = io.BytesIO()
    image = Image.fromarray(image) if isinstance(image, np.ndarray) else image
    image.save(buffer, fmt, **save_args)
    return buffer.getvalue()


def decoded_shape(data):
    try:
        pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:
        return None
    return None if pixels is None else pixels.shape[:2]


def header_of(data):
    kind, name = identify(data)
    assert kind == "opencv", (kind, name)
    return read(data, name)


def real_files(height, width):
    """(expected format, bytes) of one image, written every way the two encoders can."""
    rgb = RNG.integers(0, 256, (height, width, 3), dtype=np.uint8)
    gray = rgb[:, :, 0]
    floats = rgb.astype(np.float32) / 255
    frames = [Image.fromarray(rgb), Image.fromarray(rgb[::-1].copy())]
    animated_webp, animated_gif = io.BytesIO(), io.BytesIO()
    frames[0].save(animated_webp, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    frames[0].save(animated_gif, "GIF", save_all=True, append_images=frames[1:])
    files = [
        ("BMP", opencv(".bmp", rgb)),
        ("BMP", pillow(gray, "BMP")),
        ("BMP", bombs.bmp_os2(width, height)),
        ("GIF", pillow(rgb, "GIF")),
        ("GIF", animated_gif.getvalue()),
        ("AVIF", opencv(".avif", rgb)),
        ("AVIF", pillow(rgb, "AVIF")),
        ("AVIF", opencv(".avif", np.dstack([rgb, gray]))),
        ("Radiance HDR", opencv(".hdr", floats)),
        ("JPEG", opencv(".jpg", rgb)),
        ("JPEG", pillow(gray, "JPEG")),
        ("JPEG", pillow(rgb, "JPEG", progressive=True)),
        ("WebP", opencv(".webp", rgb, cv2.IMWRITE_WEBP_QUALITY, 80)),
        ("WebP", opencv(".webp", rgb, cv2.IMWRITE_WEBP_QUALITY, 101)),
        ("WebP", pillow(np.dstack([rgb, gray]), "WEBP")),
        ("WebP", animated_webp.getvalue()),
        ("Sun raster", opencv(".ras", rgb)),
        ("PNM", opencv(".pgm", gray)),
        ("PNM", opencv(".ppm", rgb)),
        ("PNM", opencv(".pbm", gray)),
        ("PNM", opencv(".ppm", rgb, cv2.IMWRITE_PXM_BINARY, 0)),
        ("PNM", pillow(rgb, "PPM")),
        ("PAM", opencv(".pam", rgb)),
        ("PFM", opencv(".pfm", floats)),
        ("PFM", opencv(".pfm", floats[:, :, 0])),
        ("TIFF", opencv(".tif", rgb)),
        ("TIFF", pillow(rgb, "TIFF", compression="tiff_lzw")),
        ("TIFF", bombs.tiff(width, height, order=">", big=True, pixels=gray.tobytes())),
        ("PNG", opencv(".png", rgb)),
        ("PNG", pillow(gray, "PNG")),
        ("JPEG 2000", pillow(rgb, "JPEG2000")),
        ("JPEG 2000", pillow(rgb, "JPEG2000", no_jp2=True)),
    ]
    return files


SIZES = [(11, 17), (7, 300), (1, 1)]


@pytest.mark.parametrize("height, width", SIZES)
def test_the_header_size_is_the_decoded_size(height, width):
    for expected, data in real_files(height, width):
        header = header_of(data)
        assert header.format == expected
        assert (header.height, header.width) == (height, width) == decoded_shape(data), expected
        assert header.decode_pixels == height * width


# --- files on which a simpler reader reads another size than the decoder ---------


def test_jpeg_fill_bytes_and_ff00_are_skipped_as_libjpeg_skips_them():
    # imagesize reads "FF 00 <length>" as a segment and lands in an APP1
    # segment holding a 16x16 frame header; libjpeg skips FF 00 as stray data
    # and reads the real 3000x2000 frame header.
    big = opencv(".jpg", np.full((2000, 3000, 3), 128, np.uint8))
    sof = big.index(b"\xff\xc0")
    big_sof = big[sof : sof + 2 + struct.unpack(">H", big[sof + 2 : sof + 4])[0]]
    rest = big[2:sof] + big[sof + len(big_sof) :]
    small_sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, 16, 16, 3) + bytes(9)
    app1 = (
        b"\xff\xe1" + struct.pack(">H", 2 + 2 + len(small_sof) + 4) + b"\0\0" + small_sof + bytes(4)
    )
    data = b"\xff\xd8\xff\x00" + struct.pack(">H", 2 + len(big_sof) + 4 + 2) + big_sof + app1 + rest
    header = header_of(data)
    assert (header.height, header.width) == (2000, 3000) == decoded_shape(data)


def test_a_second_jpeg_frame_header_is_not_read():
    data = bombs.jpeg_declaring(16, 16)
    sof = data.index(b"\xff\xc0")
    segment = data[sof : sof + 19]
    twice = (
        data[:sof]
        + segment
        + bytearray(segment[:5])
        + struct.pack(">HH", 9000, 9000)
        + segment[9:]
        + data[sof + 19 :]
    )
    assert header_of(bytes(twice))[1:3] == (16, 16)
    assert decoded_shape(bytes(twice)) is None  # libjpeg refuses two frame headers


def test_pnm_comments_end_at_cr_as_in_opencv():
    data = b"P5\n# comment\r40 30\n2 1\n255\n" + bytes(40 * 30)  # "2 1" is pixel data
    header = header_of(data)
    assert (header.height, header.width) == (30, 40) == decoded_shape(data)


def test_radiance_header_lines_are_read_in_opencvs_127_byte_pieces():
    # fgets(buf, 128) stops before the LF: then "\n" ends the header.
    long_comment = b"#" + b"x" * 126 + b"\n"
    data = (
        b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n"
        + long_comment
        + b"-Y 30 +X 20\n\n-Y 2 +X 2\n"
        + bytes(4 * 30 * 20)
    )
    header = header_of(data)
    assert (header.height, header.width) == (30, 20) == decoded_shape(data)


def test_gif_sizes_are_unsigned():
    header = header_of(bombs.gif_screen(40000, 2))
    assert (header.width, header.height) == (40000, 2)
    assert decoded_shape(bombs.gif_screen(40000, 2)) == (2, 40000)


def test_os2_bmp_sizes_are_16_bit():
    data = bombs.bmp_os2(5, 3)
    assert header_of(data)[1:3] == (5, 3) and decoded_shape(data) == (3, 5)


def test_webp_bitstreams_without_a_riff_container_are_webp():
    image = RNG.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    lossless = opencv(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 101)
    lossy = opencv(".webp", image, cv2.IMWRITE_WEBP_QUALITY, 80)
    for data in (lossless[20:], lossy[12:]):  # a bare VP8L bitstream; a "VP8 " chunk
        header = header_of(data)
        assert header.format == "WebP"
        assert (header.height, header.width) == (40, 50) == decoded_shape(data)


def test_jpeg_2000_size_comes_from_the_codestream_not_the_jp2_header_box():
    data = bytearray(pillow(RNG.integers(0, 256, (30, 20, 3), dtype=np.uint8), "JPEG2000"))
    ihdr = data.index(b"ihdr")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", 3, 2)  # height, width
    assert header_of(bytes(data))[1:3] == (20, 30)
    assert decoded_shape(bytes(data)) in (None, (30, 20))


def test_tiff_tiles_larger_than_the_image_count_in_the_pixels_decoded():
    data = bombs.tiff(16, 16, tile=(512, 256))
    header = header_of(data)
    assert (header.width, header.height, header.decode_pixels) == (16, 16, 512 * 256)
    assert decoded_shape(data) == (16, 16)
    ordinary = bombs.tiff(100, 40, tile=(32, 16), pixels=bytes(32 * 16))
    assert header_of(ordinary).decode_pixels == 4000


def test_avif_coded_frames_larger_than_the_declared_size_count_in_the_pixels_decoded():
    # libavif decodes the AV1 frame at its own size and returns the 'ispe'
    # size: 8x8 declared, 1024x768 decoded.
    data = bytearray(opencv(".avif", np.zeros((768, 1024, 3), np.uint8)))
    ispe = data.index(b"ispe")
    data[ispe + 8 : ispe + 16] = struct.pack(">II", 8, 8)
    header = header_of(bytes(data))
    assert (header.width, header.height, header.decode_pixels) == (8, 8, 1024 * 768)


# --- refused -------------------------------------------------------------------------


def ftyp(major, *compatible):
    body = major + b"\0\0\0\0" + b"".join(compatible)
    return struct.pack(">I", 8 + len(body)) + b"ftyp" + body


@pytest.mark.parametrize(
    "data, error",
    [
        (ftyp(b"avis", b"avis", b"msf1") + struct.pack(">I", 8) + b"moov", UnsupportedVariant),
        (ftyp(b"mif1", b"avif") + struct.pack(">I", 8) + b"moov", UnsupportedVariant),
        (b"P7\nWIDTH 4\nHEIGHT 4\nDEPTH 5\nMAXVAL 255\nENDHDR\n", UnsupportedVariant),
        (b"P7\rWIDTH 4\rHEIGHT 4\rDEPTH 3\rMAXVAL 255\rENDHDR\r", ValueError),
        (b"P7\nWIDTH 4\nWIDTH 9000\nHEIGHT 4\nDEPTH 3\nMAXVAL 255\nENDHDR\n", ValueError),
        (b"P7\nWIDTH 4\nHEIGHT 4\nDEPTH 3\nENDHDR\n", ValueError),
        (b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n+X 20 -Y 30\n", ValueError),
        (b"#?RADIANCE\n\n-Y 30 +X 20\n", ValueError),
        (b"P5\n4 3\n70000\n", ValueError),
        (b"P6\n99999999999 3\n255\n", ValueError),
        (b"PF\n-4 3\n-1.0\n", ValueError),
        (b"\xff\xd8\xff\xd8", ValueError),
        (b"\xff\xd8\xff\xc8" + bytes(20), ValueError),
        (b"\xff\xd8\xff\xda\x00\x02", ValueError),
        (b"GIF88a" + bytes(10), ValueError),
        (b"BM" + bytes(12) + struct.pack("<i", 20) + bytes(20), ValueError),
        (b"II*\x00\x08\x00\x00\x00\x00\x00", ValueError),
        (
            b"\xff\x4f\xff\x51" + struct.pack(">HHIIIIIIIIH", 53, 0, 10, 10, 0, 0, 10, 10, 0, 0, 5),
            UnsupportedVariant,
        ),
        (b"\x59\xa6\x6a\x95" + struct.pack(">ii", -5, 4), ValueError),
        (bombs.png_with_a_chunk_of(1000), ValueError),
        (bombs.png_declaring(16, 16)[:8] + bombs.chunk(b"IHDR", bytes(14)), ValueError),
        (bombs.jp2_tiles(255, 256, 1), UnsupportedVariant),
        (bombs.jp2_tiles(255, 256, 1, codestream_only=False), UnsupportedVariant),
    ],
    ids=[
        "avif-sequence",
        "avif-tracks",
        "pam-5-channels",
        "pam-cr",
        "pam-repeated-width",
        "pam-no-maxval",
        "hdr-rotated",
        "hdr-no-format",
        "pnm-maxval",
        "pnm-huge",
        "pfm-negative",
        "jpeg-soi-twice",
        "jpeg-unsupported-frame",
        "jpeg-scan-first",
        "gif-version",
        "bmp-header-size",
        "tiff-empty-directory",
        "j2k-5-components",
        "sun-raster-negative",
        "png-chunk-past-the-end",
        "png-ihdr-length",
        "j2k-65280-tiles",
        "jp2-65280-tiles",
    ],
)
def test_headers_that_are_refused(data, error):
    kind, name = identify(data)
    assert kind == "opencv"
    with pytest.raises(error):
        read(data, name)


def test_jpeg_2000_tiles_up_to_4096():
    assert header_of(bombs.jp2_tiles(64, 64, 1))[1:3] == (64, 64)  # 4096 tiles of 1x1
    with pytest.raises(UnsupportedVariant, match="more than 4096 tiles"):
        header_of(bombs.jp2_tiles(65, 64, 1))


def test_tiff_size_fields_must_be_plain_and_single():
    data = bytearray(bombs.tiff(8, 8, pixels=bytes(64)))
    width_entry = data.index(struct.pack("<HH", 256, 4))
    twice = bytes(data[: width_entry + 12]) + bytes(data[width_entry:])  # ImageWidth repeated
    twice = twice[:8] + struct.pack("<H", struct.unpack_from("<H", twice, 8)[0] + 1) + twice[10:]
    with pytest.raises(ValueError, match="ImageWidth"):
        read(twice, "TIFF")
    data[width_entry + 2 : width_entry + 4] = struct.pack("<H", 11)  # FLOAT
    with pytest.raises(ValueError, match="ImageWidth"):
        read(bytes(data), "TIFF")


# --- identify: OpenCV's order and signature checks ----------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"BM" + b"\0\0ftypavif" + bytes(40), ("opencv", "BMP")),  # BMP is tried before AVIF
        (b"GIF87a", ("opencv", "GIF")),
        (b"GIF", ("opencv", "GIF")),  # OpenCV's GIF check reads 3 bytes
        (ftyp(b"mif1", b"miaf", b"avif"), ("opencv", "AVIF")),
        (ftyp(b"heic", b"mif1"), ("other_image", "HEIF/HEIC")),
        (b"RIFF\0\0\0\0WEBPVP8 " + bytes(4), ("opencv", "WebP")),  # damaged: read refuses it
        (b"P4 1 1\n\0", ("opencv", "PNM")),
        (b"P7\n", ("opencv", "PAM")),
        (b"Pf\n", ("opencv", "PFM")),
        (b"P8\n", ("unknown", None)),
        (b"P6x", ("unknown", None)),
        (b"MM\x00+", ("opencv", "TIFF")),
        (b"II+\x00", ("opencv", "TIFF")),
        (b"8BPS\0\1", ("other_image", "Photoshop PSD")),
        (b"qoif", ("other_image", "QOI")),
        (b"just text", ("unknown", None)),
        (b"", ("unknown", None)),
    ],
)
def test_identify(data, expected):
    assert identify(data) == expected


# --- OpenCV never decodes another size than the header reader read ---------------------
# ... nor allocates much more than its pixels. Cut and mutated files run in a
# fresh process (a mutant may make OpenCV allocate gigabytes), which reports
# the files the reader accepted and OpenCV decoded at another size, and those
# after which the process's peak memory rose by more than 64 MB.


def agrees_with_opencv(data):
    """False if the header reader accepts `data` and OpenCV decodes another size."""
    kind, name = identify(data)
    if kind != "opencv":
        return True
    try:
        header = read(data, name)
    except ValueError:  # refused: never decoded
        return True
    if header.decode_pixels > 2**20:  # refused by a small max_pixels; never decoded
        return True
    shape = decoded_shape(data)
    return shape is None or shape == (header.height, header.width)


def variants(kind, seed):
    """Cut or mutated copies of the real files and the small bombs."""
    rng = random.Random(seed)
    files = real_files(11, 17) + [(name, data) for name, data in bombs.bombs(48, 32).items()]
    for name, data in files:
        if kind == "cut":
            for length in range(0, min(len(data), 700)):
                yield name, data[:length]
            continue
        for _ in range(60):
            mutant = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                near_the_start = rng.random() < 0.8
                position = rng.randrange(min(len(mutant), 160) if near_the_start else len(mutant))
                action = rng.random()
                if action < 0.6:
                    mutant[position] = rng.choice(
                        [
                            0,
                            1,
                            0x0A,
                            0x0D,
                            0x20,
                            0x23,
                            0x2F,
                            0x30,
                            0x39,
                            0x7F,
                            0x80,
                            0xFF,
                            rng.randrange(256),
                        ]
                    )
                elif action < 0.8:
                    del mutant[position]
                else:
                    mutant.insert(position, rng.choice([0x00, 0x0A, 0x20, 0xFF, 0x31]))
            yield name, bytes(mutant)


def check_variants(kind, seed):
    """Runs in the child: a JSON line of what went wrong."""
    import json
    import resource

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    disagreements, memory = [], []
    for name, data in variants(kind, seed):
        before = peak_mb()
        if not agrees_with_opencv(data):
            disagreements.append([name, data[:120].hex()])
        if peak_mb() - before > 64:
            memory.append([name, round(peak_mb() - before), data[:120].hex()])
    print(json.dumps({"disagreements": disagreements, "memory": memory}))


@pytest.mark.parametrize("kind, seed", [("cut", 0), ("mutated", 0), ("mutated", 1), ("mutated", 2)])
def test_variants_agree_with_opencv_and_stay_small(kind, seed):
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {here!r}); "
            f"import test_image_header; test_image_header.check_variants({kind!r}, {seed})",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found == {"disagreements": [], "memory": []}


def test_every_decoder_in_identify_has_a_reader():
    assert [name for name, _, _ in image_header._DECODERS] == list(image_header._READERS)
