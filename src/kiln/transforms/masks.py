"""COCO segmentations to masks: polygons rasterized at pixel centres, RLE decoded by pycocotools.

The build job rasterizes an object's ``segmentation`` (from a COCO JSON or a
JSONL manifest) into a ``height x width`` uint8 0/1 mask of the stored
(not yet EXIF-oriented) image, then moves it with the image's transforms.

- **Polygons** (``[[x1, y1, x2, y2, ...], ...]``, continuous pixel
  coordinates: pixel column ``i`` covers ``[i, i + 1)``): a pixel is in the
  mask when its centre is inside one of the polygons (their union, as COCO
  merges an object's parts). This is the rule pycocotools (``frPyObjects``
  + ``decode``) approximates: it samples the same centres after snapping
  the vertices to a 1/5-pixel grid, so the two differ only in boundary
  pixels whose centres lie within 1/5 pixel of an edge
  (`tests/test_transform_targets.py` measures it). Not ``cv2.fillPoly``:
  it fills every pixel the outline touches (about half a pixel more on
  every side), which costs a small object a tenth of its IoU with COCO's
  masks. A NumPy scanline fill at pixel centres, exact and deterministic.
- **RLE** (``{"size": [h, w], "counts": ...}``, compressed string or
  uncompressed list): decoded by pycocotools, an optional dependency
  (``pip install "kiln[coco]"``), imported on first use.

Every way a segmentation can be wrong raises `SegmentationError` with a
message, for the job to report as a bad annotation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class SegmentationError(ValueError):
    """A segmentation that cannot be rasterized: the message says why."""


def polygons_to_mask(polygons: Any, height: int, width: int) -> np.ndarray:
    """Rasterizes COCO polygons into a ``height x width`` uint8 mask of 0 and 1.

    A pixel is set when its centre lies inside one of the polygons (even-odd
    rule within a polygon, union across them).

    Args:
      polygons: One or more flat ``[x1, y1, x2, y2, ...]`` lists, at least 3
        points each, in continuous pixel coordinates; parts outside the
        image are cut off.
      height: The image's height.
      width: The image's width.

    Raises:
      SegmentationError: no polygon, a polygon with fewer than 3 points or
        an odd number of coordinates, or a coordinate that is not a finite
        number.
    """
    _check_size(height, width)
    if isinstance(polygons, (str, bytes)) or not isinstance(polygons, Sequence) or not polygons:
        raise SegmentationError("a polygon segmentation must be a non-empty list of polygons")
    mask = np.zeros((height, width), np.uint8)
    for index, polygon in enumerate(polygons):
        _fill_centres(mask, _polygon_points(polygon, index))
    return mask


def _fill_centres(mask: np.ndarray, points: np.ndarray) -> None:
    """Sets the pixels of `mask` whose centres are inside the polygon `points` ([P, 2]).

    A scanline fill at pixel centres: on row ``r`` (``y = r + 0.5``) each
    edge crossing that line (half-open in y, so a vertex on the line counts
    once) toggles inside/outside from the first pixel whose centre is at or
    right of the crossing.
    """
    height, width = mask.shape
    x1, y1 = points[:, 0], points[:, 1]
    x2, y2 = np.roll(x1, -1), np.roll(y1, -1)
    # Rows whose centre line r + 0.5 lies in [min y, max y).
    first = max(0, math.ceil(float(y1.min()) - 0.5))
    last = min(height, math.ceil(float(y1.max()) - 0.5))
    if first >= last:
        return
    centres = np.arange(first, last, dtype=np.float64) + 0.5
    low, high = np.minimum(y1, y2), np.maximum(y1, y2)
    rows, edges = np.nonzero((centres[:, None] >= low) & (centres[:, None] < high))
    along = (centres[rows] - y1[edges]) / (y2[edges] - y1[edges])
    crossing = x1[edges] + along * (x2[edges] - x1[edges])
    columns = np.clip(np.ceil(crossing - 0.5), 0, width).astype(np.intp)
    toggles = np.bincount(rows * (width + 1) + columns, minlength=(last - first) * (width + 1))
    inside = np.cumsum(toggles.reshape(last - first, width + 1)[:, :width], axis=1) & 1
    mask[first:last][inside.astype(bool)] = 1


def _polygon_points(polygon: Any, index: int) -> np.ndarray:
    if isinstance(polygon, (str, bytes)) or not isinstance(polygon, Sequence):
        raise SegmentationError(
            f"polygon {index} must be a list of numbers [x1, y1, x2, y2, ...], got "
            f"{type(polygon).__name__}"
        )
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in polygon):
        raise SegmentationError(f"polygon {index} must hold only numbers")
    if len(polygon) % 2:
        raise SegmentationError(
            f"polygon {index} has an odd number of coordinates ({len(polygon)})"
        )
    if len(polygon) < 6:
        raise SegmentationError(
            f"polygon {index} has {len(polygon) // 2} point(s); a polygon needs at least 3"
        )
    points = np.asarray(polygon, np.float64).reshape(-1, 2)
    if not np.isfinite(points).all():
        raise SegmentationError(f"polygon {index} has a coordinate that is NaN or infinite")
    return points


def rle_to_mask(rle: Mapping[str, Any], height: int, width: int) -> np.ndarray:
    """Decodes a COCO RLE into a ``height x width`` uint8 mask of 0 and 1.

    Args:
      rle: ``{"size": [h, w], "counts": ...}``: counts compressed (a string,
        as in COCO's crowd annotations and results) or uncompressed (a list
        of run lengths, column-major, starting with a run of 0s).
      height: The image's height; ``size`` must match.
      width: The image's width; ``size`` must match.

    Raises:
      SegmentationError: malformed RLE, ``size`` not the image's, run
        lengths that do not add up to ``h * w``.
      ImportError: pycocotools is not installed (``kiln[coco]``).
    """
    _check_size(height, width)
    mask_api = _pycocotools_mask()
    if not isinstance(rle, Mapping) or set(rle) != {"size", "counts"}:
        raise SegmentationError('an RLE segmentation must be {"size": [h, w], "counts": ...}')
    size, counts = rle["size"], rle["counts"]
    if (
        not isinstance(size, Sequence)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in size)
    ):
        raise SegmentationError(f"RLE size must be [height, width], got {size!r}")
    if list(size) != [height, width]:
        raise SegmentationError(
            f"RLE size is {size[0]}x{size[1]} (HxW) but the image is {height}x{width}"
        )
    if isinstance(counts, (str, bytes)):
        data = counts.encode("ascii", "replace") if isinstance(counts, str) else bytes(counts)
        runs = _compressed_runs(data)
        encoded: Any = {"size": [height, width], "counts": data}
    elif isinstance(counts, Sequence):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
            raise SegmentationError("RLE counts must be run lengths: integers >= 0")
        runs = list(counts)
        encoded = None  # converted below, once the runs are known to fit
    else:
        raise SegmentationError("RLE counts must be a string or a list of run lengths")
    # pycocotools' decoder writes runs without a bounds check: runs that do
    # not add up to the mask's size are refused here, before it sees them.
    if sum(runs) != height * width:
        raise SegmentationError(
            f"RLE run lengths add up to {sum(runs)}, not height * width = {height * width}"
        )
    if encoded is None:
        encoded = mask_api.frPyObjects({"size": [height, width], "counts": runs}, height, width)
    return np.ascontiguousarray(mask_api.decode(encoded), np.uint8)


def _compressed_runs(data: bytes) -> list[int]:
    """The run lengths of a COCO compressed RLE string, validated.

    COCO's format (``rleFrString``): each run is a little-endian sequence of
    5-bit groups, one per character (character - 48), bit 0x20 meaning "more
    follows" and bit 0x10 of the last one the sign; from the fourth run on,
    the value is a difference to the run two before. pycocotools parses it
    without checks (a truncated string reads past its end), so kiln parses
    it first and refuses what it cannot have meant.
    """
    runs: list[int] = []
    position = 0
    while position < len(data):
        value, groups, more = 0, 0, True
        while more:
            if position == len(data):
                raise SegmentationError("RLE counts string is truncated")
            if groups == 6:  # 30 bits: more than any image has pixels
                raise SegmentationError("RLE counts string holds a run that is too long")
            group = data[position] - 48
            if not 0 <= group < 64:
                raise SegmentationError("RLE counts string has characters outside COCO's alphabet")
            value |= (group & 0x1F) << (5 * groups)
            more = bool(group & 0x20)
            position += 1
            groups += 1
            if not more and group & 0x10:
                value |= -1 << (5 * groups)
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            raise SegmentationError("RLE counts string decodes to a negative run length")
        runs.append(value)
    return runs


def segmentation_to_mask(segmentation: Any, height: int, width: int) -> np.ndarray:
    """A COCO ``segmentation`` (polygons or RLE) as a uint8 0/1 ``height x width`` mask.

    Raises:
      SegmentationError: see `polygons_to_mask` and `rle_to_mask`.
    """
    if isinstance(segmentation, Mapping):
        return rle_to_mask(segmentation, height, width)
    return polygons_to_mask(segmentation, height, width)


def _check_size(height: int, width: int) -> None:
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise ValueError(f"height and width must be positive ints, got {height!r}, {width!r}")


def _pycocotools_mask() -> Any:
    try:
        from pycocotools import mask
    except ImportError as e:
        raise ImportError(
            'RLE segmentations need pycocotools: pip install "kiln[coco]" '
            f"(or pycocotools itself) ({e})"
        ) from e
    return mask
