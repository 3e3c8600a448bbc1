"""An image's targets (boxes, per-object columns, keypoints, masks) in its pixel coordinates.

The build job turns a row's annotations into a `Targets` in the pixels of the
decoded file, and `Chain.apply` moves it through EXIF orientation and every
offline transform with the image (`Targets.mapped`), dropping and counting
the objects that leave the image. The job then normalizes what is left for
the record.

Coordinates are continuous pixel coordinates of the current image: pixel
column ``i`` covers ``[i, i + 1)`` (so a pixel's centre is ``i + 0.5``),
``(0, 0)`` is the top-left corner of the image and ``(width, height)`` its
bottom-right corner. A box ``[x_min, y_min, x_max, y_max]`` that covers
pixels ``i..j`` is ``[i, ..., j + 1, ...]``; a keypoint on pixel ``(i, j)``'s
centre is ``(i + 0.5, j + 0.5)``.

The rules, applied after each transform that moves pixels:

- **Boxes** become the box enclosing their mapped corners, clipped to the
  image. With instance masks, the box of an object that a step cut (the
  image edge clipped its box) or turned (a map that is not axis-aligned)
  is then tightened to its moved mask's pixels: the intersection of the
  box and the mask's pixel box (a crop through a triangle leaves a smaller
  piece than the clipped box, and the corners' box of a turned ellipse is
  not tight). A mask left without a pixel keeps the box.
- **Visible fraction** of a box = its area after clipping / its area as
  mapped, before clipping; computed at each step from the box that step
  mapped (so two crops that each keep 60% of a box keep it at a threshold
  of 0.5, although 36% of the original is left). A box with no width (or
  no height) counts that side as fully visible when it lies within the
  image, and invisible otherwise.
- An object whose visible fraction is below ``min_visibility``, or is 0
  (nothing of it left in the image), is **dropped** with everything that
  belongs to it (per-object columns, keypoints, instance mask), and counted
  in `Targets.dropped_objects`. Never silently: the job reports the count.
- **Keypoints** map as points. A keypoint that leaves the image (outside
  ``[0, width] x [0, height]``) becomes visibility 0. A map that mirrors
  (an EXIF orientation that does, a user transform's flip) swaps the
  keypoints of each flip pair (`Targets.mirror_order`). A keypoint with
  visibility 0 carries no position: its coordinates are ``(0, 0)``, as in
  COCO, from the moment a `Targets` is made.
- **Masks** (the semantic mask and the instance masks) are resampled with
  the same map, nearest-neighbour only (class ids are never blended);
  pixels that come from outside the input (padding) get ``mask_fill`` in
  the semantic mask (the job passes the ignore value) and 0 in instance
  masks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.transforms.geometry import CoordinateMap

# COCO keypoint visibility: 0 not labelled (or out of the image), 1 labelled
# but hidden, 2 labelled and visible.
KEYPOINT_VISIBILITIES = (0, 1, 2)


class TargetsError(ValueError):
    """Targets whose arrays do not fit together or do not fit their image.

    A property of the data (a mask the size of another image), not of the
    config: the build job reports the file and carries on.
    """


@dataclasses.dataclass(frozen=True, eq=False)
class Targets:
    """The targets of one image, NumPy arrays in pixels of the current image.

    Construction validates and normalizes the arrays (copies: a `Targets`
    never shares memory with the caller's arrays): coordinates become
    float64, masks uint8, keypoints of visibility 0 get coordinates
    ``(0, 0)``.

    Attributes:
      boxes: ``[N, 4]`` ``x_min, y_min, x_max, y_max``, finite, ``min <= max``
        (N may be 0).
      objects: Per-object columns aligned with `boxes` (``"classes"``, fields
        such as ``"iscrowd"``): arrays whose first dimension is N.
      keypoints: ``[N, K, 3]`` ``x, y, visibility`` (0, 1 or 2), or None.
      mask: ``[H, W]`` uint8 class ids (semantic segmentation), or None.
      instance_masks: ``[N, H, W]`` uint8 0/1, one per object, or None.
      dropped_objects: Objects removed so far because too little of them was
        left in the image (`min_visibility`).
      mirror_order: The keypoints' order after a mirror image (each flip pair
        swapped: ``targets.keypoints.flip_pairs``), or None: a map that
        mirrors (`CoordinateMap.mirrors`) reorders them, as the reader's
        flips do, so a point named ``left_eye`` stays on the subject's left.
    """

    boxes: np.ndarray
    objects: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    keypoints: np.ndarray | None = None
    mask: np.ndarray | None = None
    instance_masks: np.ndarray | None = None
    dropped_objects: int = 0
    mirror_order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        boxes = _float_array(self.boxes, "boxes")
        if boxes.size == 0:
            boxes = boxes.reshape(0, 4)
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise TargetsError(f"boxes must have shape [N, 4], got {boxes.shape}")
        if np.any(boxes[:, 2] < boxes[:, 0]) or np.any(boxes[:, 3] < boxes[:, 1]):
            raise TargetsError("boxes must have x_min <= x_max and y_min <= y_max")
        set_(self, "boxes", boxes)
        count = len(boxes)

        objects = {}
        for name, column in dict(self.objects).items():
            array = np.array(column, copy=True)
            if array.ndim < 1 or len(array) != count:
                raise TargetsError(
                    f"objects[{name!r}] must have one entry per box ({count}), "
                    f"got shape {array.shape}"
                )
            objects[name] = array
        set_(self, "objects", objects)

        if self.keypoints is not None:
            keypoints = _float_array(self.keypoints, "keypoints")
            if keypoints.ndim != 3 or keypoints.shape[0] != count or keypoints.shape[2] != 3:
                raise TargetsError(
                    f"keypoints must have shape [N={count}, K, 3], got {keypoints.shape}"
                )
            if not np.isin(keypoints[:, :, 2], KEYPOINT_VISIBILITIES).all():
                raise TargetsError("keypoint visibilities must be 0, 1 or 2")
            keypoints[keypoints[:, :, 2] == 0, :2] = 0.0
            set_(self, "keypoints", keypoints)
        if self.mirror_order is not None:
            order = tuple(int(i) for i in self.mirror_order)
            points = 0 if self.keypoints is None else self.keypoints.shape[1]
            if sorted(order) != list(range(points)):
                raise TargetsError(
                    f"mirror_order must be an order of the {points} keypoints, got {order}"
                )
            set_(self, "mirror_order", order)

        if self.mask is not None:
            mask = _uint8_array(self.mask, "mask")
            if mask.ndim != 2:
                raise TargetsError(f"mask must have shape [H, W], got {mask.shape}")
            set_(self, "mask", mask)

        if self.instance_masks is not None:
            instance_masks = _uint8_array(self.instance_masks, "instance_masks")
            if instance_masks.ndim != 3 or instance_masks.shape[0] != count:
                raise TargetsError(
                    f"instance_masks must have shape [N={count}, H, W], got {instance_masks.shape}"
                )
            if self.mask is not None and instance_masks.shape[1:] != self.mask.shape:
                raise TargetsError(
                    f"instance_masks are {instance_masks.shape[1]}x{instance_masks.shape[2]} "
                    f"(HxW) but the mask is {self.mask.shape[0]}x{self.mask.shape[1]}"
                )
            set_(self, "instance_masks", instance_masks)

        if (
            isinstance(self.dropped_objects, bool)
            or not isinstance(self.dropped_objects, (int, np.integer))
            or self.dropped_objects < 0
        ):
            raise TargetsError(
                f"dropped_objects must be a count >= 0, got {self.dropped_objects!r}"
            )
        set_(self, "dropped_objects", int(self.dropped_objects))

    # --- reading ----------------------------------------------------------------------

    @property
    def num_objects(self) -> int:
        return len(self.boxes)

    def mask_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of the masks, or None when there are none."""
        if self.mask is not None:
            return self.mask.shape[0], self.mask.shape[1]
        if self.instance_masks is not None:
            return self.instance_masks.shape[1], self.instance_masks.shape[2]
        return None

    def check_size(self, height: int, width: int) -> None:
        """Raises `TargetsError` when the masks are not ``height x width`` (the image's size)."""
        size = self.mask_size()
        if size is not None and size != (height, width):
            raise TargetsError(
                f"the masks are {size[0]}x{size[1]} (HxW) but the image is {height}x{width}"
            )

    def normalized_boxes(self, height: int, width: int) -> np.ndarray:
        """``[N, 4]`` float32 ``y_min, x_min, y_max, x_max`` in [0, 1] of a ``height x width``
        image: the records' (and TFDS BBoxFeature's) form."""
        boxes = self.boxes[:, [1, 0, 3, 2]] / np.array([height, width, height, width], np.float64)
        return np.clip(boxes, 0.0, 1.0).astype(np.float32)

    def normalized_keypoints(self, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """``([N, K, 2] float32 y, x in [0, 1], [N, K] int64 visibility)``: the records' form.

        Raises:
          ValueError: if there are no keypoints.
        """
        if self.keypoints is None:
            raise ValueError("these targets have no keypoints")
        points = self.keypoints[:, :, [1, 0]] / np.array([height, width], np.float64)
        return (
            np.clip(points, 0.0, 1.0).astype(np.float32),
            self.keypoints[:, :, 2].astype(np.int64),
        )

    # --- changing (every method returns a new Targets) ---------------------------------

    def replace(self, **changes: Any) -> Targets:
        """A copy with some attributes changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def select(self, keep: np.ndarray) -> Targets:
        """Keeps the objects where `keep` (bool ``[N]``) is true; the others are
        counted in `dropped_objects`."""
        keep = np.asarray(keep, bool)
        if keep.shape != (self.num_objects,):
            raise ValueError(f"keep must have shape [{self.num_objects}], got {keep.shape}")
        if keep.all():
            return self
        return Targets(
            boxes=self.boxes[keep],
            objects={name: column[keep] for name, column in self.objects.items()},
            keypoints=None if self.keypoints is None else self.keypoints[keep],
            mask=self.mask,
            instance_masks=None if self.instance_masks is None else self.instance_masks[keep],
            dropped_objects=self.dropped_objects + int((~keep).sum()),
            mirror_order=self.mirror_order,
        )

    def clipped(self, height: int, width: int, *, min_visibility: float) -> Targets:
        """Clips boxes and keypoints to a ``height x width`` image, without moving them.

        The rules of `mapped` (visible fraction, dropping, keypoints outside)
        for the identity map: what `Chain.apply` does to the targets as
        given, before the first transform.
        """
        return self.mapped(CoordinateMap.identity(height, width), min_visibility=min_visibility)

    def mapped(
        self, coordinate_map: CoordinateMap, *, min_visibility: float, mask_fill: int = 0
    ) -> Targets:
        """The targets moved by `coordinate_map` into its ``height x width`` image.

        Boxes become the enclosing box of their mapped corners and are
        clipped to the image; objects with a visible fraction below
        `min_visibility` (or of 0) are dropped and counted; keypoints map as
        points, those outside the image become visibility 0; masks are
        resampled nearest-neighbour, with `mask_fill` (semantic mask) or 0
        (instance masks) where the input has no pixel. See the module
        docstring for the exact rules.

        Args:
          coordinate_map: Where the transform moves coordinates, and the
            output size.
          min_visibility: In [0, 1].
          mask_fill: The semantic mask's value for pixels from outside the
            input (the job passes the dataset's ignore value).

        Raises:
          ValueError: if `min_visibility` is outside [0, 1].
        """
        if not 0.0 <= min_visibility <= 1.0:
            raise ValueError(f"min_visibility must be in [0, 1], got {min_visibility!r}")
        height, width = coordinate_map.size
        identity = coordinate_map.is_identity

        boxes = self.boxes if identity else coordinate_map.map_boxes(self.boxes)
        clipped = _clip_boxes(boxes, height, width)
        fraction = visible_fraction(boxes, clipped, height, width)
        keep = (fraction >= min_visibility) & (fraction > 0)

        keypoints = None
        if self.keypoints is not None:
            keypoints = self.keypoints.copy()
            labelled = keypoints[:, :, 2] > 0
            if not identity:
                keypoints[:, :, :2] = coordinate_map.map_points(keypoints[:, :, :2])
            if self.mirror_order is not None and coordinate_map.mirrors:
                keypoints = keypoints[:, list(self.mirror_order)]
                labelled = keypoints[:, :, 2] > 0
            x, y = keypoints[:, :, 0], keypoints[:, :, 1]
            inside = (x >= 0) & (x <= width) & (y >= 0) & (y <= height)
            keypoints[labelled & ~inside, 2] = 0  # coordinates zeroed below

        mask, instance_masks = self.mask, self.instance_masks
        every = bool(keep.all())
        if instance_masks is not None and not every:
            instance_masks = instance_masks[keep]
        # An identity map may still grow the canvas (a pad by one pixel puts
        # the extra column on the right): masks move unless nothing changes.
        if not (identity and self.mask_size() in (None, (height, width))):
            if mask is not None:
                mask = coordinate_map.warp_mask(mask, fill=mask_fill)
            if instance_masks is not None:
                instance_masks = coordinate_map.warp_masks(instance_masks, 0)

        if keypoints is not None:
            keypoints[keypoints[:, :, 2] == 0, :2] = 0.0
            if not every:
                keypoints = keypoints[keep]
        moved_boxes = clipped if every else clipped[keep]
        if instance_masks is not None and len(moved_boxes):
            changed: np.ndarray = np.any(clipped != boxes, axis=1)
            if not coordinate_map.is_axis_aligned:
                changed = np.ones_like(changed)
            moved_boxes = tightened(
                moved_boxes, instance_masks, changed if every else changed[keep]
            )
        # Every array is new or unchanged (never the caller's: the
        # constructor copied those), so no validation or copy again.
        return _trusted(
            boxes=moved_boxes,
            objects=self.objects if every else {n: c[keep] for n, c in self.objects.items()},
            keypoints=keypoints,
            mask=mask,
            instance_masks=instance_masks,
            dropped_objects=self.dropped_objects + int((~keep).sum()),
            mirror_order=self.mirror_order,
        )


def _trusted(**fields: Any) -> Targets:
    """A `Targets` of arrays that are already valid and owned (see `Targets.mapped`)."""
    targets = object.__new__(Targets)
    for field in dataclasses.fields(Targets):
        object.__setattr__(targets, field.name, fields[field.name])
    return targets


def visible_fraction(boxes: np.ndarray, clipped: np.ndarray, height: int, width: int) -> np.ndarray:
    """Per box: area of `clipped` / area of `boxes` (both ``[N, 4]``), in [0, 1].

    Per side: the clipped length over the length; a side of length 0 counts
    1 when it lies within ``[0, width]`` (or ``[0, height]``), else 0.
    """
    fractions = []
    for low, high, size in ((0, 2, width), (1, 3, height)):
        length = boxes[:, high] - boxes[:, low]
        kept = np.maximum(clipped[:, high] - clipped[:, low], 0.0)
        point_inside = (boxes[:, low] >= 0) & (boxes[:, low] <= size)
        with np.errstate(divide="ignore", invalid="ignore"):
            fractions.append(
                np.where(length > 0, kept / np.where(length > 0, length, 1.0), point_inside)
            )
    return np.clip(fractions[0] * fractions[1], 0.0, 1.0)


def tightened(boxes: np.ndarray, instance_masks: np.ndarray, which: np.ndarray) -> np.ndarray:
    """`boxes` (``[N, 4]`` pixels) where `which` (bool ``[N]``) cut to their
    ``[N, H, W]`` instance mask's pixels: the intersection of the box and
    the pixel box of the mask. A box whose mask has no pixel, or whose
    intersection with it is empty, stays as it is. Returns a new array when
    anything changes, else `boxes`."""
    index = np.flatnonzero(which)
    if not len(index):
        return boxes
    masks: np.ndarray = instance_masks[index] > 0
    rows: np.ndarray = np.any(masks, axis=2)  # [M, H]
    cols: np.ndarray = np.any(masks, axis=1)  # [M, W]
    filled = rows.any(axis=1)
    if not filled.any():
        return boxes
    height, width = rows.shape[1], cols.shape[1]
    pixel_boxes = np.stack(
        [
            cols.argmax(axis=1),
            rows.argmax(axis=1),
            width - cols[:, ::-1].argmax(axis=1),
            height - rows[:, ::-1].argmax(axis=1),
        ],
        axis=1,
    ).astype(np.float64)
    box = boxes[index]
    cut = np.concatenate(
        [np.maximum(box[:, :2], pixel_boxes[:, :2]), np.minimum(box[:, 2:], pixel_boxes[:, 2:])],
        axis=1,
    )
    valid = filled & (cut[:, 2] > cut[:, 0]) & (cut[:, 3] > cut[:, 1])
    out = boxes.copy()
    out[index[valid]] = cut[valid]
    return out


def _clip_boxes(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    clipped = boxes.copy()
    clipped[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0.0, width)
    clipped[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0.0, height)
    return clipped


def _float_array(value: Any, name: str) -> np.ndarray:
    try:
        array = np.array(value, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as e:
        raise TargetsError(f"{name} must be an array of numbers: {e}") from None
    if not np.isfinite(array).all():
        raise TargetsError(f"{name} must be finite (no NaN or infinity)")
    return array


def _uint8_array(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype != np.uint8:
        if array.dtype == bool or (
            np.issubdtype(array.dtype, np.integer)
            and (array.size == 0 or (array.min() >= 0 and array.max() <= 255))
        ):
            return array.astype(np.uint8)
        raise TargetsError(f"{name} must hold uint8 values, got {array.dtype}")
    return np.array(array, copy=True)


def orient_targets(targets: Targets, orientation: int, height: int, width: int) -> Targets:
    """Moves targets annotated on a file's stored pixels with its EXIF orientation.

    The counterpart of `kiln.transforms.orient`, which turns the
    ``height x width`` stored pixels upright. Flips and transposes keep
    everything inside the image, so no object is dropped.

    Raises:
      TargetsError: if the masks are not ``height x width``.
      ValueError: if `orientation` is not 1..8.
    """
    targets.check_size(height, width)
    if orientation == 1:
        return targets
    coordinate_map = CoordinateMap.for_orientation(orientation, height, width)
    return targets.mapped(coordinate_map, min_visibility=0.0)
