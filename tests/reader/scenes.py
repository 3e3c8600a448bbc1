"""Filled shapes with exactly known boxes, masks and keypoint markers, and the checks on them.

A scene is a black image with a few axis-aligned rectangles, each of its own
pure colour and class, with two small keypoint markers inside ("left": white,
"right": yellow, with ``flip_pairs: [[left, right]]``). Its targets are exact
by construction. After any geometric augmentation, the checks recover each
object from the image's pixels alone (by its colour) and compare:

- the object's box must enclose its pixels tightly (IoU >= 0.9 with the box
  of the pixels, or of the transformed instance mask);
- the class mask must agree with the image's pixels;
- each visible keypoint must land on a marker pixel.
"""

from __future__ import annotations

import numpy as np

SIZE = 64
# Objects at least this many pixels on each side must reach IoU 0.9 with their
# pixels. A nearest-neighbour resampling puts each pixel edge within half a
# pixel of the exact edge (a pixel centred on it goes either way): on both
# axes that costs up to ((s - 0.5) / (s + 0.5))^2 of IoU, above 0.9 from 20
# pixels a side.
IOU_SIDE = 20
# How far (pixels) a box edge may be from its shape's pixels: a resampled
# straight edge is within half a pixel, the tip of a rotated corner (a
# wedge thinner than a pixel near its end) within about one and a half.
EDGE_PX = 1.5
CLASSES = ("background", "blue", "green", "red")
OBJECT_COLOURS = {1: (40, 80, 250), 2: (40, 220, 60), 3: (230, 40, 40)}
MARKER_COLOURS = ((255, 255, 255), (255, 255, 0))  # left, right
KEYPOINT_NAMES = ("left", "right")
# Pixel rectangles [top, left, bottom, right) and their class.
RECTANGLES = (
    ((6, 8, 30, 40), 1),
    ((34, 30, 58, 56), 2),
    ((10, 44, 26, 60), 3),
)


def scene(variant: int = 0, size: int = SIZE) -> dict:
    """One scene as NumPy arrays: pixels and targets in the reader's conventions.

    `variant` shifts the rectangles, so a dataset of scenes has different
    images. Returns ``image`` uint8 ``[size, size, 3]``, ``boxes`` float32
    normalized ``[N, 4]`` (y_min, x_min, y_max, x_max), ``classes`` int64,
    ``keypoints`` float32 ``[N, 2, 2]`` (y, x), ``keypoint_visibility``,
    ``mask`` uint8 ``[size, size, 1]`` and ``instance_masks`` uint8
    ``[N, size, size, 1]``, plus ``pixel_boxes`` (x_min, y_min, x_max, y_max
    in pixels, the manifest's convention) and ``pixel_keypoints`` ([x, y, v]
    flattened per object).
    """
    image = np.zeros((size, size, 3), np.uint8)
    mask = np.zeros((size, size, 1), np.uint8)
    boxes, classes, keypoints, instance, pixel_boxes, pixel_keypoints = [], [], [], [], [], []
    shift = variant % 5
    for (top, left, bottom, right), class_id in RECTANGLES:
        top, bottom = top + shift, bottom + shift
        left, right = left - shift, right - shift
        image[top:bottom, left:right] = OBJECT_COLOURS[class_id]
        mask[top:bottom, left:right] = class_id
        one = np.zeros((size, size, 1), np.uint8)
        one[top:bottom, left:right] = 1
        instance.append(one)
        boxes.append([top / size, left / size, bottom / size, right / size])
        pixel_boxes.append([left, top, right, bottom])
        classes.append(class_id)
        middle = (top + bottom) // 2
        points = []
        flat = []
        for marker, column in enumerate((left + 3, right - 4)):
            image[middle - 1 : middle + 2, column - 1 : column + 2] = MARKER_COLOURS[marker]
            # The marker's centre pixel, in continuous coordinates.
            points.append([(middle + 0.5) / size, (column + 0.5) / size])
            flat += [column + 0.5, middle + 0.5, 2]
        keypoints.append(points)
        pixel_keypoints.append(flat)
    return {
        "image": image,
        "boxes": np.asarray(boxes, np.float32),
        "classes": np.asarray(classes, np.int64),
        "keypoints": np.asarray(keypoints, np.float32),
        "keypoint_visibility": np.full((len(boxes), 2), 2, np.int64),
        "mask": mask,
        "instance_masks": np.stack(instance),
        "pixel_boxes": pixel_boxes,
        "pixel_keypoints": pixel_keypoints,
    }


def iou(a, b) -> float:
    top_left = np.maximum(a[:2], b[:2])
    bottom_right = np.minimum(a[2:], b[2:])
    inter = float(np.prod(np.clip(bottom_right - top_left, 0, None)))
    area = lambda box: float(np.prod(np.clip(box[2:] - box[:2], 0, None)))  # noqa: E731
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def pixel_box(flags: np.ndarray) -> np.ndarray | None:
    """Normalized tight box of the True pixels of a ``[H, W]`` array (None if empty)."""
    rows, cols = np.nonzero(flags)
    if rows.size == 0:
        return None
    height, width = flags.shape
    return np.array(
        [
            rows.min() / height,
            cols.min() / width,
            (rows.max() + 1) / height,
            (cols.max() + 1) / width,
        ]
    )


def near(image: np.ndarray, colour, tolerance: float = 60.0) -> np.ndarray:
    """Pixels of a float [0, 1] or uint8 image within `tolerance` (0..255) of `colour`."""
    pixels = image.astype(np.float64)
    if image.dtype != np.uint8:
        pixels = pixels * 255.0
    return np.linalg.norm(pixels - np.asarray(colour, np.float64), axis=-1) < tolerance


# Every colour a scene has, background first: each pixel is read as the nearest one.
_PALETTE = [(0, 0, 0), *OBJECT_COLOURS.values(), *MARKER_COLOURS]
_MARKER_LABEL = -1


def classify(image: np.ndarray) -> np.ndarray:
    """Per pixel: 0 background, a class id, or -1 for a marker, by the nearest scene colour.

    Resampling blends colours at shape edges; the nearest colour reads a
    pixel as the shape when more than half of it is, as a rasterizer would.
    """
    pixels = image.astype(np.float64)
    if image.dtype != np.uint8:
        pixels = pixels * 255.0
    distances = np.stack(
        [np.linalg.norm(pixels - np.asarray(c, np.float64), axis=-1) for c in _PALETTE], axis=-1
    )
    labels = np.array([0, *OBJECT_COLOURS, _MARKER_LABEL, _MARKER_LABEL])
    return labels[np.argmin(distances, axis=-1)]


def object_pixels(image: np.ndarray, class_id: int) -> np.ndarray:
    """The pixels of the object of `class_id`: those read as its colour."""
    return classify(image) == class_id


def check_element(
    image: np.ndarray, targets: dict, *, min_area_px: float = 30.0, iou_side: float = 0.0
) -> list[str]:
    """Every way the targets disagree with the pixels, as messages (empty: all agree).

    Boxes: every edge within `EDGE_PX` of the shape's pixels, and IoU >= 0.9
    with them for objects at least `IOU_SIDE` pixels on each side (below
    that, half a pixel per edge alone can cost more than 10% IoU).

    Args:
      image: The augmented image, float [0, 1] or uint8 ``[H, W, 3]``.
      targets: The augmented targets (NumPy), unbatched, unpadded.
      min_area_px: Objects whose box is smaller (pixels) are only checked
        for presence: a sliver is a few pixels of rounding.
      iou_side: Overrides `IOU_SIDE`, for lists that resample twice (two
        resamplings move a pixel edge by up to one pixel: IoU 0.9 then
        needs about 40 pixels a side).
    """
    iou_side = iou_side or IOU_SIDE
    problems = []
    height, width = image.shape[:2]
    scale = np.array([height, width, height, width], np.float64)
    boxes = np.asarray(targets["boxes"], np.float64)
    classes = np.asarray(targets["classes"])
    for index, (box, class_id) in enumerate(zip(boxes, classes, strict=True)):
        pixels = object_pixels(image, int(class_id))
        truth = pixel_box(pixels)
        sides = (box[2:] - box[:2]) * scale[:2]
        if truth is None:
            if float(np.prod(sides)) >= min_area_px:
                problems.append(f"object {index} (class {class_id}): box {box} but no pixels")
            continue
        if float(np.prod(sides)) < min_area_px:
            continue
        references = [("pixels", truth)]
        if "instance_masks" in targets:
            from_mask = pixel_box(np.asarray(targets["instance_masks"][index])[..., 0] > 0)
            if from_mask is None:
                problems.append(f"object {index}: box {box} but an empty instance mask")
                continue
            references.append(("its instance mask", from_mask))
        for what, reference in references:
            off = np.abs(box - reference) * scale
            if np.any(off > EDGE_PX) or (min(sides) >= iou_side and iou(box, reference) < 0.9):
                problems.append(
                    f"object {index} (class {class_id}): box {box} vs {what} {reference} "
                    f"(edges off by {off.round(2)} px, IoU {iou(box, reference):.3f})"
                )
    if "mask" in targets:
        mask = np.asarray(targets["mask"])[..., 0]
        read = classify(image)
        for class_id in OBJECT_COLOURS:
            body = read == class_id
            if body.sum() < min_area_px:
                continue
            agree = float((mask[body] == class_id).mean())
            if agree < 0.9:
                problems.append(
                    f"class {class_id}: only {agree:.2f} of its pixels have it in the mask"
                )
            shown = read[mask == class_id]
            shown_fraction = float(np.isin(shown, (class_id, _MARKER_LABEL)).mean())
            if shown_fraction < 0.9:
                problems.append(
                    f"class {class_id}: only {shown_fraction:.2f} of its mask shows its colour"
                )
    if "keypoints" in targets:
        visibility = np.asarray(targets["keypoint_visibility"])
        markers = near(image, MARKER_COLOURS[0], 90.0) | near(image, MARKER_COLOURS[1], 90.0)
        for index, points in enumerate(np.asarray(targets["keypoints"])):
            for k, (y, x) in enumerate(points):
                if visibility[index, k] == 0:
                    continue
                row, col = int(np.floor(y * height)), int(np.floor(x * width))
                if not (0 <= row < height and 0 <= col < width):
                    problems.append(f"keypoint {index}/{k} at {(y, x)} is visible but outside")
                    continue
                window = markers[max(0, row - 1) : row + 2, max(0, col - 1) : col + 2]
                if not window.any():
                    problems.append(f"keypoint {index}/{k} at pixel {(row, col)} is off its marker")
    return problems
