"""Coordinate maps: where an offline transform moves the points of its input image.

Boxes, keypoints and masks follow the image through every offline transform
(`Chain.apply`). Each transform therefore declares how it moves coordinates,
as a `CoordinateMap`: an affine map of continuous pixel coordinates plus the
size of the image it maps into. Resize, crop, pad and letterbox are a scale
and a shift; EXIF orientations are flips and transposes; a user transform
may declare any invertible affine map (a rotation, a shear).

Continuous coordinates (the contract of `kiln.transforms.targets`): pixel
column ``i`` covers ``[i, i + 1)``, so its centre is ``i + 0.5``; ``(0, 0)``
is the top-left corner of the image and ``(width, height)`` its bottom-right
corner. In these coordinates a resize by ``s`` is exactly ``x' = s * x``:
OpenCV's ``x_out = (x_in + 0.5) * s - 0.5`` for pixel indices is the same
map written for pixel centres.

How each kind of target moves (see `CoordinateMap`):

- points (keypoints) map as points;
- a box becomes the smallest box enclosing its four mapped corners (exact
  for scales, shifts, flips and transposes; larger than the object under a
  rotation);
- a mask is resampled with nearest-neighbour interpolation only, so class
  ids are never blended: each output pixel takes the value of the input
  pixel under its centre, or the fill value when its centre falls outside
  the input.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

import cv2
import numpy as np

NO_GEOMETRY: Final = "none"
"""The declaration of a transform that moves no pixel (colour, tone,
sharpening): targets pass through unchanged and the image keeps its size."""

Matrix = tuple[float, float, float, float, float, float]


@dataclasses.dataclass(frozen=True)
class CoordinateMap:
    """An invertible affine map of continuous pixel coordinates, and the output size.

    ``x' = xx * x + xy * y + x0`` and ``y' = yx * x + yy * y + y0``, with
    `matrix` ``(xx, xy, x0, yx, yy, y0)``. Build one with the class methods
    (`scale_translate`, `affine`, `for_orientation`) and chain them with
    `then`.

    Attributes:
      matrix: The six coefficients, row by row.
      height: Height of the image the map maps into.
      width: Width of the image the map maps into.
    """

    matrix: Matrix
    height: int
    width: int

    def __post_init__(self) -> None:
        matrix = tuple(float(v) for v in self.matrix)
        if len(matrix) != 6 or not all(math.isfinite(v) for v in matrix):
            raise ValueError(f"a coordinate map needs 6 finite coefficients, got {self.matrix!r}")
        xx, xy, _, yx, yy, _ = matrix
        if xx * yy - xy * yx == 0:
            raise ValueError(f"a coordinate map must be invertible, got {self.matrix!r}")
        for name in ("height", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"a coordinate map's {name} must be a positive int, got {value!r}")
            object.__setattr__(self, name, int(value))
        object.__setattr__(self, "matrix", matrix)

    # --- construction -------------------------------------------------------------

    @classmethod
    def identity(cls, height: int, width: int) -> CoordinateMap:
        """Moves nothing; the image keeps its ``height x width``."""
        return cls((1.0, 0.0, 0.0, 0.0, 1.0, 0.0), height, width)

    @classmethod
    def scale_translate(
        cls,
        *,
        height: int,
        width: int,
        scale_x: float = 1.0,
        scale_y: float = 1.0,
        shift_x: float = 0.0,
        shift_y: float = 0.0,
    ) -> CoordinateMap:
        """``x' = scale_x * x + shift_x``, ``y' = scale_y * y + shift_y``, into ``height x width``.

        A resize from ``W`` to ``W'`` columns is ``scale_x = W' / W``; cutting
        a window whose left edge is column ``left`` is ``shift_x = -left``;
        padding ``left`` columns is ``shift_x = left``.
        """
        return cls((scale_x, 0.0, shift_x, 0.0, scale_y, shift_y), height, width)

    @classmethod
    def affine(
        cls, matrix: tuple[tuple[float, float, float], tuple[float, float, float]], height, width
    ) -> CoordinateMap:
        """From a 2x3 matrix ``[[xx, xy, x0], [yx, yy, y0]]`` in continuous coordinates.

        OpenCV's ``warpAffine`` matrices work on pixel indices (centres at
        integers); `from_pixel_index_matrix` converts one.
        """
        (xx, xy, x0), (yx, yy, y0) = matrix
        return cls((xx, xy, x0, yx, yy, y0), height, width)

    @classmethod
    def from_pixel_index_matrix(
        cls, matrix: tuple[tuple[float, float, float], tuple[float, float, float]], height, width
    ) -> CoordinateMap:
        """From a 2x3 matrix on pixel indices, as ``cv2.warpAffine`` and
        ``cv2.getRotationMatrix2D`` use (pixel ``i``'s centre is ``i``).

        Continuous coordinates are indices plus 0.5: ``x' - 0.5 = xx * (x -
        0.5) + xy * (y - 0.5) + x0``, so the shift becomes ``x0 + 0.5 - 0.5 *
        (xx + xy)`` (and the same for y). A mirror ``[[-1, 0, W - 1], [0, 1,
        0]]`` is ``x' = W - x``.
        """
        (xx, xy, x0), (yx, yy, y0) = matrix
        return cls(
            (xx, xy, x0 + 0.5 - 0.5 * (xx + xy), yx, yy, y0 + 0.5 - 0.5 * (yx + yy)),
            height,
            width,
        )

    @classmethod
    def for_orientation(cls, orientation: int, height: int, width: int) -> CoordinateMap:
        """What EXIF orientation `orientation` (1..8) does to a stored ``height x width`` image.

        The same flips and transposes as `kiln.transforms.orient`; orientations
        5 to 8 swap the height and the width.
        """
        h, w = float(height), float(width)
        maps: dict[int, tuple[Matrix, int, int]] = {
            1: ((1, 0, 0, 0, 1, 0), height, width),
            2: ((-1, 0, w, 0, 1, 0), height, width),  # mirrored
            3: ((-1, 0, w, 0, -1, h), height, width),  # rotated 180 degrees
            4: ((1, 0, 0, 0, -1, h), height, width),  # flipped vertically
            5: ((0, 1, 0, 1, 0, 0), width, height),  # transposed
            6: ((0, -1, h, 1, 0, 0), width, height),  # 90 degrees clockwise
            7: ((0, -1, h, -1, 0, w), width, height),  # transposed the other way
            8: ((0, 1, 0, -1, 0, w), width, height),  # 90 degrees counter-clockwise
        }
        if orientation not in maps:
            raise ValueError(f"EXIF orientation must be 1..8, got {orientation!r}")
        matrix, out_height, out_width = maps[orientation]
        return cls(matrix, out_height, out_width)

    def then(self, other: CoordinateMap) -> CoordinateMap:
        """This map followed by `other`: the size is `other`'s."""
        a = np.array([self.matrix[:3], self.matrix[3:], (0.0, 0.0, 1.0)])
        b = np.array([other.matrix[:3], other.matrix[3:], (0.0, 0.0, 1.0)])
        xx, xy, x0, yx, yy, y0 = (float(v) for v in (b @ a)[:2].ravel())
        return CoordinateMap((xx, xy, x0, yx, yy, y0), other.height, other.width)

    # --- properties -----------------------------------------------------------------

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)`` of the image the map maps into."""
        return self.height, self.width

    @property
    def is_identity(self) -> bool:
        """Moves no point (the size may still differ from the input's: a pad at the end)."""
        return self.matrix == (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)

    @property
    def mirrors(self) -> bool:
        """Makes a mirror image (a negative determinant: a flip, a transpose):
        the subject's left and right swap."""
        xx, xy, _, yx, yy, _ = self.matrix
        return xx * yy - xy * yx < 0

    @property
    def is_axis_aligned(self) -> bool:
        """Scales, shifts, flips and transposes: an axis-aligned box maps onto a box."""
        xx, xy, _, yx, yy, _ = self.matrix
        return (xy == 0 and yx == 0) or (xx == 0 and yy == 0)

    # --- applying -------------------------------------------------------------------

    def map_points(self, points: np.ndarray) -> np.ndarray:
        """Maps ``[..., 2]`` float ``(x, y)`` points; returns a new float64 array."""
        points = np.asarray(points, np.float64)
        xx, xy, x0, yx, yy, y0 = self.matrix
        x, y = points[..., 0], points[..., 1]
        return np.stack([xx * x + xy * y + x0, yx * x + yy * y + y0], axis=-1)

    def map_boxes(self, boxes: np.ndarray) -> np.ndarray:
        """``[N, 4]`` boxes ``(x_min, y_min, x_max, y_max)`` -> the boxes enclosing their
        mapped corners (not clipped to the image)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        corners = np.stack(
            [
                boxes[:, [0, 1]],
                boxes[:, [2, 1]],
                boxes[:, [0, 3]],
                boxes[:, [2, 3]],
            ],
            axis=1,
        )  # [N, 4 corners, 2]
        mapped = self.map_points(corners)
        return np.concatenate([mapped.min(axis=1), mapped.max(axis=1)], axis=1)

    def warp_mask(self, mask: np.ndarray, fill: int = 0) -> np.ndarray:
        """Resamples a 2-D uint8 mask with nearest-neighbour interpolation.

        Each output pixel takes the input pixel under its centre (the
        preimage of ``(u + 0.5, v + 0.5)``, floored), or `fill` when that
        centre lies outside the input. Axis-aligned maps are computed with
        exact index arithmetic in NumPy (a crop, a pad or an orientation is
        an exact copy of pixels); other maps use ``cv2.warpAffine`` with
        ``INTER_NEAREST``. Values are only ever copied, never blended.
        """
        if mask.ndim != 2:
            raise ValueError(f"warp_mask expects a 2-D mask, got shape {mask.shape}")
        return self.warp_masks(mask[np.newaxis], fill)[0]

    def warp_masks(self, masks: np.ndarray, fill: int = 0) -> np.ndarray:
        """`warp_mask` for a ``[N, H, W]`` stack (instance masks), all at once."""
        if masks.ndim != 3:
            raise ValueError(f"warp_masks expects [N, H, W] masks, got shape {masks.shape}")
        _, in_height, in_width = masks.shape
        xx, xy, x0, yx, yy, y0 = self.matrix
        if xy == 0 and yx == 0:
            rows, row_ok = _source_indices(self.height, yy, y0, in_height)
            cols, col_ok = _source_indices(self.width, xx, x0, in_width)
            out = masks.take(rows, axis=1).take(cols, axis=2)
        elif xx == 0 and yy == 0:
            # x' depends on y only and y' on x only: output row v reads input
            # column cols[v], output column u reads input row rows[u].
            rows, col_ok = _source_indices(self.width, xy, x0, in_height)
            cols, row_ok = _source_indices(self.height, yx, y0, in_width)
            out = masks.take(rows, axis=1).take(cols, axis=2).transpose(0, 2, 1)
        else:
            index_matrix = np.array(
                [
                    [xx, xy, x0 + 0.5 * (xx + xy) - 0.5],
                    [yx, yy, y0 + 0.5 * (yx + yy) - 0.5],
                ]
            )
            warped = [
                cv2.warpAffine(
                    np.ascontiguousarray(mask),
                    index_matrix,
                    (self.width, self.height),
                    flags=cv2.INTER_NEAREST,
                    borderMode=cv2.BORDER_CONSTANT,
                    borderValue=int(fill),
                )
                for mask in masks
            ]
            return np.stack(warped) if warped else np.zeros((0, *self.size), masks.dtype)
        out = np.ascontiguousarray(out)
        if not row_ok.all():
            out[:, ~row_ok, :] = fill
        if not col_ok.all():
            out[:, :, ~col_ok] = fill
        return out


def resize_indices(length: int, source_length: int) -> np.ndarray:
    """The input pixel under each output pixel's centre when ``source_length``
    pixels are resized to ``length``: what `CoordinateMap.warp_masks` copies
    for a resize's map (``scale = length / source_length``, the same float),
    so a nearest-neighbour resize of the image copies the pixels its masks
    copy, ties and all."""
    return _source_indices(length, length / source_length, 0.0, source_length)[0]


def _source_indices(
    length: int, scale: float, shift: float, source_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """For output pixels ``0..length-1`` along one axis of ``t' = scale * t + shift``:
    the source pixel under each centre (clamped into range) and whether it is inside."""
    centres = np.arange(length, dtype=np.float64) + 0.5
    source = np.floor((centres - shift) / scale)
    inside = (source >= 0) & (source < source_length)
    return np.clip(source, 0, source_length - 1).astype(np.intp), inside
