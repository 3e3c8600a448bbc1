"""`kiln demo-data --targets OUT`: a small detection, segmentation and keypoints dataset.

Scenes of one to four shapes (the classes of `kiln.pipeline.demo_data`) on
the same varied backgrounds, each shape drawn without anti-aliasing from its
own mask, so its box, masks and keypoints are exact: the box is the tight
box of the mask's pixels, the semantic mask and the image agree pixel for
pixel. Written twice, as the two sources read it::

    OUT/images/scene_0000.png         the images (PNG and JPEG, a few stored
                                      sideways with an EXIF orientation tag)
    OUT/masks/scene_0000.png          semantic mask: class id per pixel
                                      (0 background, then the shapes, sorted)
    OUT/masks/scene_0000_1.png        instance mask of object 1: 0 or 1
    OUT/manifest.jsonl                one JSONL manifest row per image
    OUT/instances.json                the same images as a COCO instances file
                                      (polygons, RLE for circles, keypoints)

Every coordinate is in pixels of the file as stored, before its EXIF
orientation (the kiln convention: a sideways file's targets are sideways
too), continuous (pixel column i covers [i, i + 1)). Keypoints per object:
``center``, ``left`` (the leftmost point of the outline, as stored) and
``right``; a horizontal flip swaps the last two (``flip_pairs``). Each is
the centre of the pixel the point falls in; the COCO file writes it as COCO
does, as the integer indices of that pixel (kiln reads them back + 0.5:
`kiln.pipeline.coco`).

A few more images carry one broken annotation each (`BROKEN`), to show how a
build reports them; ``--no-broken`` leaves them out. Everything is drawn from
``numpy.random.default_rng([seed, stream, index])``: the same seed writes
the same bytes, and the first N scenes do not depend on how many are written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from typing import Any

import cv2
import numpy as np

from kiln.pipeline import demo_drawing
from kiln.transforms import encode_image
from kiln.transforms.functional import to_grayscale

logger = logging.getLogger(__name__)

SHAPES = demo_drawing.CLASSES
BACKGROUND = "background"
CLASSES = (BACKGROUND, *SHAPES)  # sorted: the semantic mask's values index this
KEYPOINTS = ("center", "left", "right")
MANIFEST = "manifest.jsonl"
COCO = "instances.json"

# What each deliberately broken scene gets wrong (the rest of it is good).
BROKEN = {
    "broken_inverted_box": "an object's x_max is below its x_min",
    "broken_unknown_class": "an object's class is not in the class list",
    "broken_missing_mask": "an object's instance mask file does not exist",
    "broken_mask_size": "the semantic mask is smaller than the image",
    "broken_short_polygon": "an object's polygon has two points",
}
# In instances.json, the unknown class is a category id not in 'categories',
# and one more annotation names an image id not in 'images'.
COCO_DANGLING_IMAGE_ID = 999_999
COCO_UNDECLARED_CATEGORY_ID = 99

ORIENTED_FRACTION = 0.1
GRAYSCALE_FRACTION = 0.08
_SCENES_STREAM, _BROKEN_STREAM = 3, 4  # apart from demo_data's streams
_OWN_ENTRY = re.compile(r"^(images|masks|manifest\.jsonl|instances\.json)$")
_OWN_FILE = re.compile(r"^(scene_\d{4}|broken_\w+)(_\d+)?\.(png|jpg)$")


@dataclasses.dataclass(frozen=True)
class DemoObject:
    """One shape of a scene, in pixels of the image as stored.

    Attributes:
      class_name: Its class.
      box: ``(x_min, y_min, x_max, y_max)``, the tight box of `mask`.
      mask: ``[H, W]`` bool, the shape's pixels.
      keypoints: ``[(x, y, v)]`` in `KEYPOINTS` order, v = 2 (visible).
      polygon: Its outline's vertices ``[x, y, ...]`` (continuous
        coordinates), or None for a circle.
    """

    class_name: str
    box: tuple[int, int, int, int]
    mask: np.ndarray
    keypoints: tuple[tuple[float, float, int], ...]
    polygon: tuple[float, ...] | None


@dataclasses.dataclass(frozen=True)
class DemoScene:
    """One image and its objects, as stored."""

    name: str
    image: np.ndarray
    objects: tuple[DemoObject, ...]
    orientation: int
    format: str  # "png" or "jpeg" (always JPEG with an EXIF orientation)

    @property
    def semantic_mask(self) -> np.ndarray:
        mask = np.zeros(self.image.shape[:2], np.uint8)
        for found in self.objects:
            mask[found.mask] = CLASSES.index(found.class_name)
        return mask


@dataclasses.dataclass(frozen=True)
class DemoTargetsSummary:
    """What `generate` wrote.

    Attributes:
      out_dir: The folder written.
      num_images: Good scenes.
      object_counts: Objects of the good scenes per class, classes sorted.
      broken: Name of each broken scene -> what is wrong with it.
    """

    out_dir: str
    num_images: int
    object_counts: dict[str, int]
    broken: dict[str, str]

    def describe(self) -> str:
        counts = ", ".join(f"{name} {count}" for name, count in self.object_counts.items())
        broken = f" and {len(self.broken)} with a broken annotation" if self.broken else ""
        return (
            f"wrote {self.num_images} images of {sum(self.object_counts.values())} objects "
            f"({counts}){broken} to {self.out_dir}: {MANIFEST} and {COCO}"
        )


def generate(
    out_dir: str | os.PathLike, *, num_images: int = 60, seed: int = 0, include_broken: bool = True
) -> DemoTargetsSummary:
    """Writes the detection demo; byte-identical for the same arguments.

    Args:
      out_dir: Created if missing. If it exists it must be empty or hold
        only what this function writes (it is then replaced).
      num_images: Good scenes to write (the broken ones come on top).
      seed: Picks every random choice.
      include_broken: Also write the scenes of `BROKEN`.

    Raises:
      FileExistsError: `out_dir` holds anything this module did not write.
      ValueError: `num_images` or `seed` is negative.
    """
    if num_images < 0 or seed < 0:
        raise ValueError(f"num_images and seed must be >= 0, got {num_images} and {seed}")
    out_dir = os.fspath(out_dir)
    demo_drawing.prepare_folder(out_dir, foreign_entry, "kiln demo-data --targets")
    scenes = [
        draw_scene(np.random.default_rng([seed, _SCENES_STREAM, index]), f"scene_{index:04d}")
        for index in range(num_images)
    ]
    broken = []
    if include_broken:
        broken = [
            draw_scene(np.random.default_rng([seed, _BROKEN_STREAM, index]), name, oriented=False)
            for index, name in enumerate(BROKEN)
        ]
    manifest_rows, coco = [], _CocoWriter()
    for scene in scenes + broken:
        image_file = _write_image(out_dir, scene)
        manifest_rows.append(_manifest_row(out_dir, scene, image_file))
        coco.add(scene, image_file)
    if include_broken:
        coco.add_dangling()
    demo_drawing.write_file(
        out_dir, MANIFEST, "".join(json.dumps(row) + "\n" for row in manifest_rows).encode()
    )
    demo_drawing.write_file(out_dir, COCO, (json.dumps(coco.document(), indent=1) + "\n").encode())
    counts = dict.fromkeys(SHAPES, 0)
    for scene in scenes:
        for found in scene.objects:
            counts[found.class_name] += 1
    summary = DemoTargetsSummary(out_dir, len(scenes), counts, dict(BROKEN) if broken else {})
    logger.info("%s", summary.describe())
    return summary


# --- one scene --------------------------------------------------------------------


def draw_scene(rng: np.random.Generator, name: str, *, oriented: bool = True) -> DemoScene:
    """A scene of one to four shapes, one per cell of a 2x2 grid (never overlapping)."""
    height, width = (int(v) for v in rng.integers(96, 193, size=2))
    image = demo_drawing.draw_background(rng, height, width)
    cells = rng.permutation(4)[: int(rng.integers(1, 5))]
    objects = []
    for cell in sorted(int(c) for c in cells):
        class_name = SHAPES[int(rng.integers(len(SHAPES)))]
        left, top = (cell % 2) * width // 2, (cell // 2) * height // 2
        cell_width, cell_height = width // 2, height // 2
        radius = float(rng.uniform(0.25, 0.42)) * min(cell_width, cell_height)
        centre = (
            left + float(rng.uniform(radius + 1, cell_width - radius - 1)),
            top + float(rng.uniform(radius + 1, cell_height - radius - 1)),
        )
        angle = float(rng.uniform(0, 2 * math.pi))
        mask, outline = _shape_mask((height, width), class_name, centre, radius, angle)
        colour = demo_drawing.contrasting_colour(rng, image)
        image[mask] = colour
        objects.append((class_name, mask, centre, outline))
    if rng.random() < GRAYSCALE_FRACTION:
        image = to_grayscale(image)  # a single-channel file
    orientation = 1
    if oriented and rng.random() < ORIENTED_FRACTION:
        orientation = int(rng.choice([3, 6, 8]))
    file_format = "jpeg" if orientation != 1 or rng.random() < 0.3 else "png"
    stored = demo_drawing.as_stored_for(image, orientation)
    return DemoScene(
        name,
        stored,
        tuple(
            _stored_object(class_name, mask, centre, outline, orientation, (height, width))
            for class_name, mask, centre, outline in objects
        ),
        orientation,
        file_format,
    )


def _shape_mask(
    shape: tuple[int, int],
    class_name: str,
    centre: tuple[float, float],
    radius: float,
    angle: float,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The shape's pixels (drawn without anti-aliasing: exact) and its
    vertices in continuous coordinates (None for a circle)."""
    scale = 1 << demo_drawing.SUBPIXEL_BITS
    canvas = np.zeros(shape, np.uint8)
    cx, cy = centre
    if class_name == "circle":
        cv2.circle(
            canvas,
            (round(cx * scale), round(cy * scale)),
            round(radius * scale),
            1,
            thickness=-1,
            lineType=cv2.LINE_8,
            shift=demo_drawing.SUBPIXEL_BITS,
        )
        return canvas.astype(bool), None
    fixed = demo_drawing.shape_vertices(class_name, centre, radius, angle)
    cv2.fillPoly(canvas, [fixed], 1, lineType=cv2.LINE_8, shift=demo_drawing.SUBPIXEL_BITS)
    # OpenCV's integer coordinates are pixel centres: + 0.5 in continuous ones.
    return canvas.astype(bool), fixed / scale + 0.5


def _stored_object(class_name, mask, centre, outline, orientation, upright_shape) -> DemoObject:
    """The object in the stored file's pixels (rotated as the image is)."""
    stored_mask = demo_drawing.as_stored_for(mask, orientation)
    rows = np.flatnonzero(stored_mask.any(axis=1))
    columns = np.flatnonzero(stored_mask.any(axis=0))
    box = (int(columns[0]), int(rows[0]), int(columns[-1]) + 1, int(rows[-1]) + 1)
    if outline is None:  # a circle: its outline from its pixels
        outline = _mask_outline(mask)
    height, width = upright_shape
    points = np.array([(centre[0] + 0.5, centre[1] + 0.5), *outline], np.float64)
    stored_points = _stored_points(points, orientation, width, height)
    stored_centre, stored_outline = stored_points[0], stored_points[1:]
    left = stored_outline[np.argmin(stored_outline[:, 0])]
    right = stored_outline[np.argmax(stored_outline[:, 0])]
    # Each keypoint at the centre of the pixel it falls in: COCO writes
    # keypoints as pixel indices, so the COCO file holds them exactly too.
    stored_height, stored_width = stored_mask.shape
    keypoints = tuple(
        (_pixel_centre(x, stored_width), _pixel_centre(y, stored_height), 2)
        for x, y in (stored_centre, left, right)
    )
    polygon = None
    if class_name != "circle":
        polygon = tuple(round(float(v), 4) for v in stored_outline.reshape(-1))
    return DemoObject(class_name, box, stored_mask, keypoints, polygon)


def _pixel_centre(value: float, size: int) -> float:
    """The centre of the pixel a continuous coordinate falls in (the last
    pixel for a point on the far edge)."""
    return min(math.floor(value), size - 1) + 0.5


def _mask_outline(mask: np.ndarray) -> np.ndarray:
    """The centres of a mask's outer boundary pixels, continuous coordinates."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    return contours[0].reshape(-1, 2).astype(np.float64) + 0.5


def _stored_points(points: np.ndarray, orientation: int, width: int, height: int) -> np.ndarray:
    """Upright continuous points in the pixels `demo_drawing.as_stored_for` stores."""
    x, y = points[:, 0], points[:, 1]
    if orientation == 3:  # turned half way
        return np.stack([width - x, height - y], axis=1)
    if orientation == 6:  # np.rot90(k=1): stored[r, c] = upright[c, width - 1 - r]
        return np.stack([y, width - x], axis=1)
    if orientation == 8:  # np.rot90(k=-1): stored[r, c] = upright[height - 1 - c, r]
        return np.stack([height - y, x], axis=1)
    return points.copy()


# --- the two sources ----------------------------------------------------------------


def _write_image(out_dir: str, scene: DemoScene) -> str:
    """Writes the scene's image; returns its path relative to OUT/images."""
    if scene.format == "png":
        name = f"{scene.name}.png"
        data = encode_image(scene.image, format="png")
    else:
        name = f"{scene.name}.jpg"
        data = encode_image(scene.image, format="jpeg", quality=92)
        if scene.orientation != 1:
            data = demo_drawing.with_exif_orientation(data, scene.orientation)
    demo_drawing.write_file(out_dir, f"images/{name}", data)
    return name


def _manifest_row(out_dir: str, scene: DemoScene, image_file: str) -> dict[str, Any]:
    semantic = scene.semantic_mask
    if scene.name == "broken_mask_size":
        semantic = semantic[:-8, :-8]
    demo_drawing.write_file(
        out_dir, f"masks/{scene.name}.png", encode_image(semantic[:, :, np.newaxis], format="png")
    )
    objects = []
    for index, found in enumerate(scene.objects, start=1):
        entry: dict[str, Any] = {
            "bbox": list(found.box),
            "class": found.class_name,
            "keypoints": [value for point in found.keypoints for value in point],
        }
        mask_file = f"masks/{scene.name}_{index}.png"
        if index == 1 and scene.name == "broken_short_polygon":
            entry["segmentation"] = [list(found.keypoints[1][:2] + found.keypoints[2][:2])]
        elif index == 1 and scene.name == "broken_missing_mask":
            entry["mask"] = "masks/missing.png"
        else:
            demo_drawing.write_file(
                out_dir,
                mask_file,
                encode_image(found.mask.astype(np.uint8)[:, :, np.newaxis], format="png"),
            )
            entry["mask"] = mask_file
        if index == 1 and scene.name == "broken_inverted_box":
            x_min, y_min, x_max, y_max = found.box
            entry["bbox"] = [x_max, y_min, x_min, y_max]
        if index == 1 and scene.name == "broken_unknown_class":
            entry["class"] = "hexagon"
        objects.append(entry)
    return {"path": f"images/{image_file}", "mask": f"masks/{scene.name}.png", "objects": objects}


class _CocoWriter:
    """The scenes as a COCO instances document (no semantic masks: COCO has none)."""

    def __init__(self):
        self._images: list[dict[str, Any]] = []
        self._annotations: list[dict[str, Any]] = []

    def add(self, scene: DemoScene, image_file: str) -> None:
        image_id = len(self._images) + 1
        height, width = scene.image.shape[:2]
        self._images.append(
            {"id": image_id, "file_name": image_file, "width": width, "height": height}
        )
        for index, found in enumerate(scene.objects, start=1):
            x_min, y_min, x_max, y_max = found.box
            segmentation: Any
            if found.polygon is None:
                segmentation = uncompressed_rle(found.mask)
            else:
                segmentation = [list(found.polygon)]
            if index == 1 and scene.name == "broken_short_polygon":
                segmentation = [list(found.polygon[:4]) if found.polygon else [0, 0, 1, 1]]
            bbox = [x_min, y_min, x_max - x_min, y_max - y_min]
            if index == 1 and scene.name == "broken_inverted_box":
                bbox = [x_max, y_min, x_min - x_max, y_max - y_min]
            category_id = SHAPES.index(found.class_name) + 1
            if index == 1 and scene.name == "broken_unknown_class":
                category_id = COCO_UNDECLARED_CATEGORY_ID
            self._annotations.append(
                {
                    "id": len(self._annotations) + 1,
                    "image_id": image_id,
                    "category_id": category_id,
                    "bbox": bbox,
                    "area": int(found.mask.sum()),
                    "iscrowd": 0,
                    "segmentation": segmentation,
                    "keypoints": [
                        value for point in found.keypoints for value in _pixel_index(point)
                    ],
                    "num_keypoints": len(found.keypoints),
                }
            )

    def add_dangling(self) -> None:
        self._annotations.append(
            {
                "id": len(self._annotations) + 1,
                "image_id": COCO_DANGLING_IMAGE_ID,
                "category_id": 1,
                "bbox": [0, 0, 4, 4],
                "area": 16,
                "iscrowd": 0,
                "segmentation": [[0, 0, 4, 0, 4, 4, 0, 4]],
            }
        )

    def document(self) -> dict[str, Any]:
        return {
            "info": {"description": "kiln demo-data --targets", "version": "1"},
            "images": self._images,
            "annotations": self._annotations,
            "categories": [
                {
                    "id": index,
                    "name": name,
                    "supercategory": "shape",
                    "keypoints": list(KEYPOINTS),
                    "skeleton": [[1, 2], [1, 3]],
                }
                for index, name in enumerate(SHAPES, start=1)
            ],
        }


def _pixel_index(point: tuple[float, float, int]) -> tuple[int, int, int]:
    """A keypoint as COCO writes it: the integer indices of its pixel, whose
    centre (+ 0.5, as kiln reads COCO) is the continuous point. The demo's
    keypoints are pixel centres, so the round trip is exact."""
    x, y, visibility = point
    column, row = math.floor(x), math.floor(y)
    if (x - column, y - row) != (0.5, 0.5):
        raise ValueError(f"keypoint {point} is not a pixel centre")
    return column, row, visibility


def uncompressed_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE of a mask: run lengths over its pixels in
    column-major order, starting with a run of zeros (maybe empty)."""
    flat = mask.astype(np.uint8).flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0, *counts]
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


# --- files ------------------------------------------------------------------------


def foreign_entry(out_dir: str) -> str | None:
    """The first path in the folder `out_dir` that `generate` does not
    write, or None: the folder is empty or an earlier demo of its."""
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry)
        foreign = not _OWN_ENTRY.match(entry) or (
            os.path.isdir(path)
            and any(not _OWN_FILE.match(name) for name in os.listdir(path))
            or os.path.isdir(path) != (entry in ("images", "masks"))
        )
        if foreign:
            return path
    return None
