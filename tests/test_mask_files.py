"""Mask files are read as the class ids written in them, or refused saying why.

OpenCV expands a palette PNG (Pascal VOC's ``SegmentationClass``) into
colours, which kiln refused as "3 channel(s)"; it widens 1-, 2- and 4-bit
grayscale to 8 bits (a 1-bit 1 became 255: with ``ignore_value: 255`` the
foreground was silently ignored); and lossy files (JPEG, AVIF) were decoded
with the values their compression invents at class edges. Unit tests of
`kiln.transforms.decode_mask_file` on hand-written PNGs of each layout, and
a real build on the DirectRunner read back with `kiln.reader`.
"""

from __future__ import annotations

import io
import os
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

import kiln.reader
import targets_data as data
from kiln.pipeline import build
from kiln.transforms import MaskFileError, decode_mask_file
from test_targets_build import error_rows, png_pixels, records

LOSSY = "lossy compression changes class ids at the edges between classes; save masks as PNG"


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(values: np.ndarray, bits: int, colour: int, chunks: bytes = b"") -> bytes:
    """A PNG of one sample per pixel (gray: colour 0, palette: 3) of `bits`
    bits, written byte by byte: `chunks` go between IHDR and IDAT."""
    height, width = values.shape
    rows = b""
    for row in values.astype(np.uint8):
        samples = np.unpackbits(row[:, None], axis=1)[:, 8 - bits :]
        rows += b"\x00" + np.packbits(samples.ravel()).tobytes()  # filter type None
    header = struct.pack(">IIBBBBB", width, height, bits, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunks
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def voc_palette() -> list[int]:
    """Pascal VOC's colour map (its devkit's ``labelcolormap``): index 255,
    the border, is a light beige, 1 dark red, 2 dark green..."""
    out = []
    for index in range(256):
        red = green = blue = 0
        for bit in range(8):
            red |= ((index >> (3 * bit)) & 1) << (7 - bit)
            green |= ((index >> (3 * bit + 1)) & 1) << (7 - bit)
            blue |= ((index >> (3 * bit + 2)) & 1) << (7 - bit)
        out += [red, green, blue]
    return out


def voc_png(values: np.ndarray) -> bytes:
    """A palette PNG as Pillow writes VOC's masks (``Image.putpalette``)."""
    image = Image.fromarray(values.astype(np.uint8), "P")
    image.putpalette(voc_palette())
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def every_value(bits: int) -> np.ndarray:
    """3 x 7 samples holding every value `bits` bits can (rows of odd width:
    the last byte of each row is padded)."""
    return (np.arange(21).reshape(3, 7) * 5 % 2**bits).astype(np.uint8)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_a_palette_png_gives_its_indices(bits):
    values = every_value(bits)
    palette = bytes(255 - i % 256 for i in range(3 * 2**bits))  # colours unlike the indices
    transparent = chunk(b"tRNS", b"\x00\x80")  # what an editor may add: not a class id
    for extra in (b"", transparent):
        got = decode_mask_file(png(values, bits, 3, chunk(b"PLTE", palette) + extra), 10**4)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, values)


def test_a_voc_mask_gives_its_class_ids_and_border():
    values = np.array([[0, 0, 255, 15], [1, 255, 20, 0]], np.uint8)
    np.testing.assert_array_equal(decode_mask_file(voc_png(values), 100), values)


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_a_low_bit_depth_gray_png_is_not_scaled(bits):
    values = every_value(bits)
    assert values.max() == 2**bits - 1
    for extra in (b"", chunk(b"tRNS", b"\x00\x00")):
        np.testing.assert_array_equal(decode_mask_file(png(values, bits, 0, extra), 10**4), values)


def test_an_eight_bit_gray_png_is_read_as_is():
    values = np.arange(256, dtype=np.uint8).reshape(16, 16)
    ok, encoded = cv2.imencode(".png", values)
    assert ok
    np.testing.assert_array_equal(decode_mask_file(encoded.tobytes(), 256), values)
    np.testing.assert_array_equal(decode_mask_file(png(values, 8, 0), 256), values)


def a_mask_with_edges() -> np.ndarray:
    return np.kron(np.array([[0, 1, 2, 255], [2, 0, 255, 1]], np.uint8), np.ones((8, 8), np.uint8))


def pillow_file(pixels: np.ndarray, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **options)
    return out.getvalue()


@pytest.mark.parametrize(
    "encode, named",
    [
        (
            lambda m: cv2.imencode(".jpg", m, [cv2.IMWRITE_JPEG_QUALITY, 100])[1].tobytes(),
            "a JPEG mask",
        ),
        (lambda m: cv2.imencode(".avif", m)[1].tobytes(), "an AVIF mask"),
        (lambda m: pillow_file(m, "WEBP", quality=90), "a lossy WebP mask"),
        (
            lambda m: pillow_file(m, "JPEG2000", irreversible=True),
            "a JPEG 2000 mask (lossless only if encoded reversibly and kept whole, which the "
            "file does not say)",
        ),
    ],
    ids=["jpeg", "avif", "lossy-webp", "jpeg-2000"],
)
def test_a_lossy_mask_file_is_refused_saying_why(encode, named):
    with pytest.raises(MaskFileError) as caught:
        decode_mask_file(encode(a_mask_with_edges()), 10**4)
    assert str(caught.value) == f"{named}: {LOSSY}"


@pytest.mark.parametrize(
    "pixels, message",
    [
        (
            np.zeros((4, 4), np.uint16),
            "a 16-bit PNG: class ids are read from masks of at most 8 bits (ids 0..255); save "
            "the mask with 8 bits",
        ),
        (
            np.zeros((4, 4, 3), np.uint8),
            "a colour PNG (3 channels): a mask holds one channel of class ids and kiln does not "
            "map colours to classes; save the ids as a grayscale or palette PNG",
        ),
    ],
)
def test_a_mask_of_more_bits_or_channels_is_refused_saying_what_it_is(pixels, message):
    ok, encoded = cv2.imencode(".png", pixels)
    assert ok
    with pytest.raises(MaskFileError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        decode_mask_file(encoded.tobytes(), 100)


def test_a_gray_with_alpha_png_is_named_as_written():
    """OpenCV decodes it as 4 channels (BGRA): named from the PNG's header."""
    header = struct.pack(">IIBBBBB", 3, 2, 8, 4, 0, 0, 0)  # 3x2, 8 bits, gray with alpha
    rows = b"".join(b"\x00" + bytes([1, 255] * 3) for _ in range(2))
    encoded = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    with pytest.raises(MaskFileError) as caught:
        decode_mask_file(encoded, 100)
    assert str(caught.value).startswith("a gray with alpha PNG (2 channels): a mask holds one")


@pytest.mark.parametrize(
    "extension, name",
    [(".tiff", "TIFF"), (".bmp", "BMP"), (".pgm", "PNM")],
)
def test_a_mask_in_another_format_is_refused_saying_why(extension, name):
    # Even an 8-bit gray one, which OpenCV would read as written: its format
    # has variants (a 1-bit TIFF, a BMP palette, a PGM of maximum 1) that it
    # would not, and only PNG's are told apart here.
    ok, encoded = cv2.imencode(extension, a_mask_with_edges())
    assert ok
    with pytest.raises(MaskFileError) as caught:
        decode_mask_file(encoded.tobytes(), 10**4)
    assert str(caught.value).startswith(
        f"a {name} mask: masks are read from PNG files only, whose every layout"
    )
    assert str(caught.value).endswith("save the mask as PNG")


def test_a_palette_png_with_a_damaged_header_is_not_repaired():
    encoded = bytearray(png(every_value(8), 8, 3, chunk(b"PLTE", bytes(768))))
    encoded[29] ^= 0xFF  # IHDR's CRC: rewriting the header must not make it valid
    with pytest.raises(MaskFileError, match="does not decode"):
        decode_mask_file(bytes(encoded), 100)


# --- a real build -----------------------------------------------------------------------

CLASSES = ["background", "aeroplane", "bicycle"]
HEIGHT, WIDTH = 24, 32


def semantic(index: int) -> np.ndarray:
    """Image `index`'s class ids: background, a plane, a bicycle, and VOC's
    border (255) around the plane."""
    mask = np.zeros((HEIGHT, WIDTH), np.uint8)
    mask[2 + index : 14, 3:15] = 255
    mask[3 + index : 13, 4:14] = 1
    mask[16:22, 18 + index : 30] = 2
    return mask


def write(path, data_bytes: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data_bytes)


def segmentation_corpus(folder) -> str:
    """Six images, each of one grey level (10 * index + 5, which names it) with
    one object (the plane); the masks' formats are the test."""
    rows = []
    for index in range(6):
        data.write_png(
            folder / "images" / f"{index}.png",
            np.full((HEIGHT, WIDTH, 3), 10 * index + 5, np.uint8),
        )
        plane = np.zeros((HEIGHT, WIDTH), np.uint8)
        plane[3 + index : 13, 4:14] = 1
        rows.append(
            {
                "path": f"images/{index}.png",
                "mask": f"masks/{index}.png",
                "objects": [
                    {
                        "bbox": [4, 3 + index, 14, 13],
                        "class": "aeroplane",
                        "mask": f"masks/{index}_0.png",
                    }
                ],
            }
        )
        # A 1-bit palette instance mask whose index 0 is white: its indices count, not its luma.
        write(
            folder / rows[-1]["objects"][0]["mask"],
            png(plane, 1, 3, chunk(b"PLTE", b"\xff" * 3 + b"\x00" * 3)),
        )
        write(folder / rows[-1]["mask"], voc_png(semantic(index)))
    # Image 1: a 1-bit grayscale mask of the plane alone (its 1 is not the ignore value).
    write(folder / "masks" / "1.png", png((semantic(1) == 1).astype(np.uint8), 1, 0))
    # Image 4: a JPEG semantic mask, image 5: a JPEG instance mask (with a .png name).
    write(folder / "masks" / "4.png", cv2.imencode(".jpg", semantic(4))[1].tobytes())
    write(
        folder / "masks" / "5_0.png",
        cv2.imencode(".jpg", (semantic(5) == 1).astype(np.uint8))[1].tobytes(),
    )
    return data.write_manifest(folder, rows)


def test_voc_palette_masks_build_and_read_back_as_their_indices(tmp_path):
    manifest = segmentation_corpus(tmp_path)
    result = build(
        {
            "name": "voc-masks",
            "source": {"type": "manifest", "path": manifest, "classes": CLASSES},
            "output": str(tmp_path / "out"),
            "encoding": {"format": "png"},
            "targets": {"mask": {"ignore_value": 255}, "boxes": {}, "instance_masks": {}},
            "splits": {"fractions": {"train": 1.0}},
            "errors": {"max_fraction": 0.5},
        }
    )
    masks = tmp_path / "masks"
    assert sorted(error_rows(result), key=lambda row: row["key"]) == [
        {
            "key": "images/4.png",
            "message": f"mask ({masks / '4.png'}): a JPEG mask: {LOSSY}",
            "reason": "corrupt_mask",
            "stage": "targets",
            "uri": str(tmp_path / "images" / "4.png"),
        },
        {
            "key": "images/5.png",
            "message": f"objects[0].mask ({masks / '5_0.png'}): a JPEG mask: {LOSSY}",
            "reason": "corrupt_mask",
            "stage": "targets",
            "uri": str(tmp_path / "images" / "5.png"),
        },
    ]
    expected = {index: semantic(index) for index in (0, 2, 3)}
    expected[1] = (semantic(1) == 1).astype(np.uint8)
    dataset = kiln.reader.load(
        result.dataset_dir,
        "train",
        batch_size=None,
        seed=3,
        augment=None,
        shuffle=False,
        dtype="uint8",
    )
    seen = set()
    for image, targets in dataset:
        index = (int(image.numpy()[0, 0, 0]) - 5) // 10
        np.testing.assert_array_equal(targets["mask"].numpy()[:, :, 0], expected[index])
        seen.add(index)
    assert seen == {0, 1, 2, 3}
    # Each image's class counts include what its mask shows (the border is ignored).
    assert result.info.splits["train"].class_counts == {
        "aeroplane": 4,
        "background": 4,
        "bicycle": 3,
    }
    for key, record in records(result).items():
        index = int(os.path.basename(key)[0])
        plane = (semantic(index) == 1).astype(np.uint8)
        (instance,) = record["instance_masks"]
        np.testing.assert_array_equal(png_pixels(instance), plane)


@pytest.mark.timeout(120)
def test_a_mask_path_that_is_a_named_pipe_is_a_missing_mask_not_a_hang(tmp_path):
    """Reading a named pipe blocks until someone writes to it: a mask file
    that is one (put there by mistake, or since the listing) is refused
    without being read, and its image dropped as a mask that cannot be read,
    while the other images are stored."""
    manifest = segmentation_corpus(tmp_path)
    pipe = tmp_path / "masks" / "2.png"
    pipe.unlink()
    os.mkfifo(pipe)
    result = build(
        {
            "name": "pipes",
            "source": {"type": "manifest", "path": manifest, "classes": CLASSES},
            "output": str(tmp_path / "out"),
            "encoding": {"format": "png"},
            "targets": {"mask": {"ignore_value": 255}},
            "splits": {"fractions": {"train": 1.0}},
            "errors": {"max_fraction": 0.5},
        }
    )

    dropped = {row["key"]: row for row in error_rows(result)}
    assert dropped["images/2.png"]["reason"] == "missing_mask"
    assert "not a regular file but a named pipe (FIFO)" in dropped["images/2.png"]["message"]
    assert result.info.splits["train"].num_examples == 6 - len(dropped)
