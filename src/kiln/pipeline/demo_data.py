"""`kiln demo-data OUT`: generate a small labelled image folder to build from.

Shapes drawn with OpenCV, one class per shape, laid out the way the
``image_folder`` source reads them (``OUT/<class>/<image>``)::

    kiln demo-data build/demo-data                 # 300 images + 3 broken files
    kiln demo-data build/demo-data --num-images 40 --seed 1 --no-broken
    kiln demo-data build/photos --photos --num-images 20   # 800x600 photo-like JPEGs
    kiln demo-data build/demo-detection --targets  # boxes, masks, keypoints: see demo_targets

The images vary the way real data does: sizes 48..160 px and rarely
square, backgrounds of gradients, noise, stripes or flat colour, JPEG and
PNG mixed, some grayscale, some JPEGs stored sideways with an EXIF
orientation tag (upright once decoded). A few broken files (empty,
truncated, not an image) show how a build reports bad input.

Everything is drawn from ``numpy.random.default_rng([seed, stream, index])``,
one generator per image, so the same seed writes byte-identical files, and
the first N images are the same whatever `num_images` is.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Callable

import cv2
import numpy as np

from kiln.pipeline.demo_drawing import (
    CLASSES,
    SUBPIXEL_BITS,
    as_stored_for,
    contrasting_colour,
    draw_background,
    prepare_folder,
    shape_vertices,
    with_exif_orientation,
    write_file,
)
from kiln.transforms import encode_image
from kiln.transforms.functional import to_grayscale

logger = logging.getLogger(__name__)


# Share of images that are grayscale / JPEGs stored sideways with an EXIF tag.
GRAYSCALE_FRACTION = 0.08
ORIENTED_FRACTION = 0.08

_BROKEN_FILES = {  # path -> the decode reason a build reports for it
    "circle/broken_empty.jpg": "empty",
    "square/broken_truncated.jpg": "corrupt",
    "triangle/broken_not_an_image.png": "not_an_image",
}
_NOT_AN_IMAGE = (
    b"This is not a PNG file. kiln demo-data writes it on purpose, to show how a "
    b"build drops and reports a file it cannot decode.\n"
)
# Separate random streams, so adding one kind of file never shifts another.
_SHAPES_STREAM, _BROKEN_STREAM, _PHOTOS_STREAM = 0, 1, 2
_OWN_FILE = re.compile(
    "^(" + "|".join(CLASSES) + r")_\d{4}\.(jpg|png)$"
    r"|^broken_\w+\.(jpg|png)$|^photo_\d{4}\.jpg$"
)


@dataclasses.dataclass(frozen=True)
class DemoSummary:
    """What `generate` or `generate_photos` wrote.

    Attributes:
      out_dir: The folder written.
      class_counts: Good images per class, classes sorted.
      broken: Relative path (``class/name``) of each deliberately broken
        file -> the `kiln.transforms.DecodeError` reason it must get.
    """

    out_dir: str
    class_counts: dict[str, int]
    broken: dict[str, str]

    @property
    def num_images(self) -> int:
        return sum(self.class_counts.values())

    def describe(self) -> str:
        counts = ", ".join(f"{name} {count}" for name, count in self.class_counts.items())
        broken = f" and {len(self.broken)} broken files" if self.broken else ""
        return (
            f"wrote {self.num_images} images in {len(self.class_counts)} classes "
            f"({counts}){broken} to {self.out_dir}"
        )


def generate(
    out_dir: str | os.PathLike,
    *,
    num_images: int = 300,
    seed: int = 0,
    include_broken: bool = True,
    progress: Callable[[int], None] | None = None,
) -> DemoSummary:
    """Writes the demo shapes folder; byte-identical for the same arguments.

    Image ``i`` has class ``CLASSES[i % 4]`` and is named
    ``<class>/<class>_<i:04d>.<jpg|png>``.

    Args:
      out_dir: Created if missing. If it exists it must be empty or hold
        only files this module writes (it is then replaced), so a user's
        folder is never deleted.
      num_images: Good images to write (the broken files come on top).
      seed: Picks every random choice.
      include_broken: Also write the files listed in `DemoSummary.broken`.
      progress: Called with the number of images written after each one.

    Raises:
      FileExistsError: if `out_dir` holds anything this module did not write.
      ValueError: if `num_images` or `seed` is negative.
    """
    _check_counts(num_images, seed)
    out_dir = os.fspath(out_dir)
    prepare_folder(out_dir, foreign_entry, "kiln demo-data")
    counts = dict.fromkeys(CLASSES, 0)
    for index in range(num_images):
        class_name = CLASSES[index % len(CLASSES)]
        rng = np.random.default_rng([seed, _SHAPES_STREAM, index])
        name, data = _shape_file(rng, class_name, index)
        write_file(out_dir, f"{class_name}/{name}", data)
        counts[class_name] += 1
        if progress is not None:
            progress(index + 1)
    broken = {}
    if include_broken:
        truncated = encode_image(
            _draw_shape_image(np.random.default_rng([seed, _BROKEN_STREAM]), "square"),
            format="jpeg",
            quality=90,
        )
        contents = {
            "empty": b"",
            "corrupt": truncated[: len(truncated) * 2 // 5],
            "not_an_image": _NOT_AN_IMAGE,
        }
        for path, reason in _BROKEN_FILES.items():
            write_file(out_dir, path, contents[reason])
        broken = dict(_BROKEN_FILES)
    summary = DemoSummary(out_dir, counts, broken)
    logger.info("%s", summary.describe())
    return summary


def generate_photos(
    out_dir: str | os.PathLike,
    *,
    num_images: int,
    size: tuple[int, int] = (800, 600),
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> DemoSummary:
    """Writes photo-like JPEGs in class subfolders, for benchmarks.

    Unlike the flat demo shapes, these cost what real photos cost to decode
    and resize: smooth colour fields, several octaves of texture, shaded
    shapes, slight blur and sensor-like noise, JPEG quality 90 (files the
    size of real photos of that resolution). Named
    ``<class>/photo_<i:04d>.jpg``; the same seed writes the same bytes.

    Args:
      out_dir: As in `generate`.
      num_images: Images to write, classes in turn.
      size: ``(width, height)`` in pixels, as photo sizes are usually given.
      seed: Picks every random choice.
      progress: Called with the number of images written after each one.
    """
    _check_counts(num_images, seed)
    width, height = size
    if width < 16 or height < 16:
        raise ValueError(f"size must be at least 16x16, got {size}")
    out_dir = os.fspath(out_dir)
    prepare_folder(out_dir, foreign_entry, "kiln demo-data")
    counts = dict.fromkeys(CLASSES, 0)
    for index in range(num_images):
        class_name = CLASSES[index % len(CLASSES)]
        rng = np.random.default_rng([seed, _PHOTOS_STREAM, index])
        image = _photo_image(rng, class_name, width, height)
        write_file(
            out_dir,
            f"{class_name}/photo_{index:04d}.jpg",
            encode_image(image, format="jpeg", quality=90),
        )
        counts[class_name] += 1
        if progress is not None:
            progress(index + 1)
    return DemoSummary(out_dir, counts, {})


def _check_counts(num_images: int, seed: int) -> None:
    if num_images < 0:
        raise ValueError(f"num_images must be >= 0, got {num_images}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


# --- one image ------------------------------------------------------------------------


def _shape_file(rng: np.random.Generator, class_name: str, index: int) -> tuple[str, bytes]:
    """(file name, file bytes) of one demo image."""
    image = _draw_shape_image(rng, class_name)
    if rng.random() < GRAYSCALE_FRACTION:
        image = to_grayscale(image)
    if rng.random() < 0.5:
        return f"{class_name}_{index:04d}.png", encode_image(image, format="png")
    quality = int(rng.integers(80, 96))
    orientation = 1
    if rng.random() < ORIENTED_FRACTION:
        # Store the pixels as a camera held sideways would, and say so in
        # EXIF; a correct decoder shows the upright image.
        orientation = int(rng.choice([3, 6, 8]))
        image = as_stored_for(image, orientation)
    data = encode_image(image, format="jpeg", quality=quality)
    if orientation != 1:
        data = with_exif_orientation(data, orientation)
    return f"{class_name}_{index:04d}.jpg", data


def _draw_shape_image(rng: np.random.Generator, class_name: str) -> np.ndarray:
    height, width = (int(v) for v in rng.integers(48, 161, size=2))
    image = draw_background(rng, height, width)
    colour = contrasting_colour(rng, image)
    radius = float(rng.uniform(0.28, 0.45)) * min(height, width)
    centre = (
        float(rng.uniform(radius, width - radius)),
        float(rng.uniform(radius, height - radius)),
    )
    _draw_shape(image, class_name, centre, radius, float(rng.uniform(0, 2 * math.pi)), colour)
    return image


def _draw_shape(image, class_name, centre, radius, angle, colour) -> None:
    scale = 1 << SUBPIXEL_BITS
    cx, cy = centre
    if class_name == "circle":
        cv2.circle(
            image,
            (round(cx * scale), round(cy * scale)),
            round(radius * scale),
            colour,
            thickness=-1,
            lineType=cv2.LINE_AA,
            shift=SUBPIXEL_BITS,
        )
        return
    points = shape_vertices(class_name, centre, radius, angle)
    cv2.fillPoly(image, [points], colour, lineType=cv2.LINE_AA, shift=SUBPIXEL_BITS)


def _photo_image(rng: np.random.Generator, class_name: str, width: int, height: int) -> np.ndarray:
    # Smooth light and colour across the frame.
    grid = rng.uniform(30, 225, size=(3, 4, 3)).astype(np.float32)
    image = np.clip(cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC), 0, 255)
    image = image.astype(np.uint8)
    # Clutter, then the subject of the class, large and near the centre.
    for _ in range(int(rng.integers(3, 7))):
        other = CLASSES[int(rng.integers(len(CLASSES)))]
        radius = float(rng.uniform(0.04, 0.15)) * min(width, height)
        centre = (float(rng.uniform(0, width)), float(rng.uniform(0, height)))
        _draw_shape(
            image,
            other,
            centre,
            radius,
            float(rng.uniform(0, 2 * math.pi)),
            tuple(int(c) for c in rng.integers(0, 256, size=3)),
        )
    radius = float(rng.uniform(0.22, 0.35)) * min(width, height)
    centre = (
        width / 2 + float(rng.uniform(-0.1, 0.1)) * width,
        height / 2 + float(rng.uniform(-0.1, 0.1)) * height,
    )
    _draw_shape(
        image,
        class_name,
        centre,
        radius,
        float(rng.uniform(0, 2 * math.pi)),
        contrasting_colour(rng, image),
    )
    # Texture over everything (so shapes are not flat), lens blur, sensor noise.
    shaded: np.ndarray = image.astype(np.float32)
    for cells, amplitude in ((12, 18.0), (48, 10.0), (160, 6.0)):
        noise = rng.normal(0.0, amplitude, size=(max(1, cells * height // width), cells))
        shaded += cv2.resize(
            noise.astype(np.float32), (width, height), interpolation=cv2.INTER_CUBIC
        )[:, :, np.newaxis]
    shaded = cv2.GaussianBlur(shaded, (0, 0), 1.2)
    shaded += rng.normal(0.0, 3.0, size=shaded.shape).astype(np.float32)
    return np.clip(np.rint(shaded), 0, 255).astype(np.uint8)


# --- files ------------------------------------------------------------------------


def foreign_entry(out_dir: str) -> str | None:
    """The first path in the folder `out_dir` that `generate` and
    `generate_photos` do not write (they write class folders of their own
    images), or None: the folder is empty or an earlier demo of theirs."""
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry)
        foreign = (
            entry not in CLASSES
            or not os.path.isdir(path)
            or any(not _OWN_FILE.match(name) for name in os.listdir(path))
        )
        if foreign:
            return path
    return None


def other_demo(out_dir: str, targets: bool) -> str | None:
    """What to do instead when `out_dir` holds the demo the other mode
    writes (``--targets`` or not): each mode refuses the other's folder,
    which it did not write, but the folder is no stranger's either; else None."""
    from kiln.pipeline import demo_targets

    if not os.path.isdir(out_dir) or not os.listdir(out_dir):
        return None
    if targets and foreign_entry(out_dir) is None:
        return (
            f"{out_dir} holds the class folders that kiln demo-data writes without --targets, "
            f"not the detection demo of --targets; drop --targets to write that demo again, "
            f"or choose another folder"
        )
    if not targets and demo_targets.foreign_entry(out_dir) is None:
        return (
            f"{out_dir} holds the detection demo that kiln demo-data --targets writes, not "
            f"class folders; pass --targets to write that demo again, or choose another folder"
        )
    return None
