"""Drawing shared by the demo generators (`demo_data`, `demo_targets`): the shape
classes, backgrounds, contrasting colours and EXIF orientation of stored pixels;
and the folder they write to (`prepare_folder`, `write_file`)."""

from __future__ import annotations

import math
import os
import shutil
import struct
from collections.abc import Callable

import numpy as np

from kiln.transforms.functional import to_grayscale

CLASSES = ("circle", "square", "star", "triangle")  # sorted: label ids follow this order
SUBPIXEL_BITS = 4  # OpenCV draws at 1/16 pixel: smooth, still integer coordinates


def shape_vertices(
    class_name: str, centre: tuple[float, float], radius: float, angle: float
) -> np.ndarray:
    """The int32 ``[V, 2]`` x, y vertices of a square, star or triangle in
    OpenCV's fixed-point coordinates (`SUBPIXEL_BITS`), for ``cv2.fillPoly``:
    the image (`demo_data`) and the mask (`demo_targets`) draw the same ones."""
    scale = 1 << SUBPIXEL_BITS
    cx, cy = centre
    if class_name == "star":
        radii = [radius if i % 2 == 0 else radius * 0.45 for i in range(10)]
    else:
        radii = [radius] * {"square": 4, "triangle": 3}[class_name]
    step = 2 * math.pi / len(radii)
    return np.array(
        [
            [
                round((cx + r * math.cos(angle + i * step)) * scale),
                round((cy + r * math.sin(angle + i * step)) * scale),
            ]
            for i, r in enumerate(radii)
        ],
        np.int32,
    )


def draw_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    kind = rng.choice(["gradient", "noise", "stripes", "solid"])
    first, second = rng.integers(0, 256, size=(2, 3)).astype(np.float32)
    if kind == "gradient":
        angle = float(rng.uniform(0, 2 * math.pi))
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        along = x * math.cos(angle) + y * math.sin(angle)
        t = ((along - along.min()) / max(float(np.ptp(along)), 1.0))[:, :, np.newaxis]
        image = first * (1 - t) + second * t
    elif kind == "noise":
        image = first + rng.normal(0.0, 28.0, size=(height, width, 3)).astype(np.float32)
    elif kind == "stripes":
        period = int(rng.integers(6, 24))
        y, x = np.mgrid[0:height, 0:width]
        band = ((x + y) // period) % 2 if rng.random() < 0.5 else (y // period) % 2
        image = np.where(band[:, :, np.newaxis] == 0, first, second)
    else:
        image = np.broadcast_to(first, (height, width, 3))
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> tuple[int, int, int]:
    """A colour whose luma differs from the background's mean by at least 80 levels."""
    mean_luma = float(to_grayscale(background).mean())
    while True:
        colour = rng.integers(0, 256, size=3)
        luma = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
        if abs(luma - mean_luma) >= 80:
            return int(colour[0]), int(colour[1]), int(colour[2])


def as_stored_for(upright: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels a file tagged `orientation` stores so that it displays `upright`."""
    stored = {
        1: lambda a: a,
        3: lambda a: a[::-1, ::-1],
        6: lambda a: np.rot90(a, k=1),  # shown after turning 90 degrees clockwise
        8: lambda a: np.rot90(a, k=-1),
    }[orientation](upright)
    return np.ascontiguousarray(stored)


def with_exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """Inserts an APP1 EXIF segment holding only the orientation tag."""
    tiff = (
        b"MM\x00\x2a"
        + struct.pack(">I", 8)  # big-endian TIFF, IFD0 at 8
        + struct.pack(">H", 1)  # one entry:
        + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)  # Orientation, SHORT, 1 value
        + struct.pack(">I", 0)
    )  # no next IFD
    payload = b"Exif\x00\x00" + tiff
    segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    # After SOI and the JFIF APP0 segment, where readers look for it.
    insert_at = 2
    if jpeg[2:4] == b"\xff\xe0":
        insert_at = 4 + struct.unpack(">H", jpeg[4:6])[0]
    return jpeg[:insert_at] + segment + jpeg[insert_at:]


def prepare_folder(out_dir: str, foreign_entry: Callable[[str], str | None], command: str) -> None:
    """Creates `out_dir`, or empties an earlier demo in it; refuses to touch
    anything else.

    Args:
      out_dir: The folder to write the demo to.
      foreign_entry: The first path in a folder that the demo does not
        write, or None.
      command: The command that writes the demo, for the error message.

    Raises:
      FileExistsError: `out_dir` is a file, or holds something `command`
        did not write.
    """
    if not os.path.exists(out_dir):
        os.makedirs(out_dir)
        return
    if not os.path.isdir(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not a folder")
    foreign = foreign_entry(out_dir)
    if foreign is not None:
        raise FileExistsError(
            f"{out_dir} is not empty and {foreign} was not written by {command}; "
            f"choose an empty or new folder"
        )
    for entry in os.listdir(out_dir):
        path = os.path.join(out_dir, entry)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def write_file(out_dir: str, relative_path: str, data: bytes) -> None:
    """Writes `data` to `relative_path` ("/"-separated) under `out_dir`, creating folders."""
    path = os.path.join(out_dir, *relative_path.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
