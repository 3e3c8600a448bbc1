"""Targets in the reader: what a record carries beside its image, and how geometry moves it.

A detection, segmentation or keypoint dataset stores, per image (see
`kiln.schemas.schema_for` and the "Detection and segmentation" section of
the README), normalized coordinates of the stored image:

=====================  =========================  ===========================================
name                   per element                meaning
=====================  =========================  ===========================================
``boxes``              float32 ``[N, 4]``         ``[y_min, x_min, y_max, x_max]`` in [0, 1]
``classes``            int64 ``[N]``              class id per box
fields (``iscrowd``)   int64/float32 ``[N]``      declared per-object columns
``keypoints``          float32 ``[N, K, 2]``      ``[y, x]`` in [0, 1]
``keypoint_visibility`` int64 ``[N, K]``          COCO: 0 not labelled, 1 hidden, 2 visible
``mask``               uint8 ``[H, W, 1]``        class id per pixel (semantic segmentation)
``instance_masks``     uint8 ``[N, H, W, 1]``     one 0/1 mask per object
=====================  =========================  ===========================================

Coordinates are continuous: pixel column ``i`` of a ``W`` wide image covers
``[i / W, (i + 1) / W)``. `ElementTargets` holds one element's tensors and
the dataset's `TargetSpec`, and has one method per geometric move (crop,
flip, affine warp, resize of the masks). Every move is a pure function of
the parameters the op drew from its seed, so an op moves the image and its
targets with the same draw. Masks are only ever moved with nearest-neighbour
sampling: class ids are never blended.

Objects that a move pushes (partly) out of the image: boxes are clipped to
the image, and an object whose box keeps less than ``min_visibility`` of
its area (from kiln.json's ``targets.boxes.min_visibility``, the same
threshold as offline) is dropped with all its per-object columns, keypoints
and instance mask. A box that keeps no area at all is always dropped.
Keypoints that leave the image become visibility 0, and a keypoint of
visibility 0 carries no position: its coordinates are (0, 0), as in COCO and
in the build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when targets are moved, not to declare the ops
    tf = LazyModule("tensorflow")


# Target kinds whose values are tied to pixel positions: an op that moves
# pixels must move them too.
GEOMETRIC_KINDS = ("boxes", "mask", "instance_masks", "keypoints")
# Every kind a dataset can declare (kiln.json `targets`).
KINDS = ("label", "labels", "boxes", "mask", "instance_masks", "keypoints", "extra")


class TargetError(ValueError):
    """Targets and an augmentation (or a reader option) cannot go together; says why."""


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """What a dataset's records carry beside the image, from kiln.json's ``targets``.

    Attributes:
      kinds: Declared target kinds (`KINDS`), e.g. ``("boxes", "mask")``.
      fields: Per-object columns besides ``classes`` (e.g. ``("iscrowd",)``).
      extras: Per-image extra columns, passed through untouched.
      keypoint_names: Names of the K keypoints of every object.
      flip_pairs: Index pairs of keypoints that swap under a mirror flip
        (e.g. left and right eye).
      min_visibility: Objects keeping less than this fraction of their box
        area after a crop, rotation or zoom are dropped.
      ignore_value: Mask value for pixels with no known class (what a
        rotation or zoom-out fills the mask with where the image gets
        `fill_value`).
      mask_encoding: How the records store the semantic mask: ``"png"`` or
        ``"raw"`` (one byte per pixel); png for a kiln.json from before the
        choice.
    """

    kinds: tuple[str, ...] = ("label",)
    fields: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()
    keypoint_names: tuple[str, ...] = ()
    flip_pairs: tuple[tuple[int, int], ...] = ()
    min_visibility: float = 0.0
    ignore_value: int = 0
    mask_encoding: str = "png"

    @property
    def geometric(self) -> tuple[str, ...]:
        """The declared kinds an op that moves pixels must move too."""
        return tuple(kind for kind in GEOMETRIC_KINDS if kind in self.kinds)

    @property
    def classification_only(self) -> bool:
        """True for today's datasets: one class id per image, nothing else."""
        return set(self.kinds) <= {"label"} and not self.extras

    @property
    def object_columns(self) -> tuple[str, ...]:
        """Names of the per-object tensors (first dimension N), in a fixed order."""
        columns: list[str] = []
        if "boxes" in self.kinds:
            columns += ["boxes", "classes", *self.fields]
        if "keypoints" in self.kinds:
            columns += ["keypoints", "keypoint_visibility"]
        if "instance_masks" in self.kinds:
            columns.append("instance_masks")
        return tuple(columns)

    @property
    def names(self) -> tuple[str, ...]:
        """Every target tensor's name, in the order the reader yields them."""
        names: list[str] = [kind for kind in ("label", "labels") if kind in self.kinds]
        names += [c for c in self.object_columns if c != "instance_masks"]
        if "mask" in self.kinds:
            names.append("mask")
        if "instance_masks" in self.kinds:
            names.append("instance_masks")
        return (*names, *self.extras)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> TargetSpec:
        """Reads kiln.json's resolved ``targets`` block (None: classification).

        The block maps each declared kind to its resolved settings, e.g.
        ``{"boxes": {"min_visibility": 0.25, "fields": {"iscrowd": "int"}},
        "keypoints": {"names": [...], "flip_pairs": [[a, b]]}, "mask":
        {"ignore_value": 255, "encoding": "png"}}``.
        """
        if not data:
            return cls()
        kinds = tuple(kind for kind in KINDS if data.get(kind) is not None)
        boxes = data.get("boxes") or {}
        keypoints = data.get("keypoints") or {}
        mask = data.get("mask") or {}
        names = tuple(keypoints.get("names") or ())
        index = {name: i for i, name in enumerate(names)}
        pairs = []
        for pair in keypoints.get("flip_pairs") or ():
            a, b = (index[p] if isinstance(p, str) else int(p) for p in pair)
            pairs.append((a, b))
        extra = data.get("extra") or {}
        return cls(
            kinds=tuple(kind for kind in kinds if kind != "extra"),
            fields=tuple(boxes.get("fields") or {}),
            extras=tuple(extra),
            keypoint_names=names,
            flip_pairs=tuple(pairs),
            min_visibility=float(boxes.get("min_visibility") or 0.0),
            ignore_value=int(mask.get("ignore_value", 0) or 0),
            mask_encoding=str(mask.get("encoding") or "png"),
        )

    def keypoint_permutation(self) -> list[int]:
        """Keypoint order after a mirror flip: every flip pair swapped."""
        order = list(range(len(self.keypoint_names)))
        for a, b in self.flip_pairs:
            order[a], order[b] = order[b], order[a]
        return order


# --- one element's targets ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MaskGrid:
    """Where each pixel of a moved mask comes from: ``mask[rows][:, cols]`` of the mask it moves.

    Crops, mirror flips and nearest-neighbour resizes only choose rows and
    columns of a mask, so a chain of them composes into two index vectors,
    and the mask is read once, by `sample` (two gathers of whole rows),
    instead of once per move: a uint8 one-channel mask has one byte per
    pixel, and the kernels that move images pay per pixel for it.

    A crop of the untouched mask (the augmenter's leading crop) is kept as
    a `window`, and the indices count from its corner: `sample` then cuts
    the window out first, and can move its columns before its rows (see
    `sample`). Until another move needs them, the window's index vectors
    are not made: `rows` and `cols` are None (every row and column of the
    window, in order), and `mirrored` says per axis whether (or where) the
    order is reversed, so that the usual crop, flip and resize compute
    both vectors in one set of ops (`resize`).

    Attributes:
      rows: int32 ``[height]``: the source row of each output row (in the
        window, if any); None: see above.
      cols: int32 ``[width]``: the source column of each output column.
      window: int32 ``(offset [2], size [2])`` of the part of the mask the
        indices count in; None: the whole mask.
      untouched: Whether the grid is still the identity (no move yet).
      mirrored: Per axis (rows, columns), while the vectors are not made:
        False, True, or a bool scalar tensor (mirrored where True).
    """

    rows: tf.Tensor | None
    cols: tf.Tensor | None
    window: tuple[tf.Tensor, tf.Tensor] | None = None
    untouched: bool = False
    mirrored: tuple[Any, Any] = (False, False)

    @classmethod
    def identity(cls, shape: tf.Tensor) -> MaskGrid:
        """Every pixel of a mask of int32 ``shape`` (height, width) where it is."""
        return cls(tf.range(shape[0]), tf.range(shape[1]), untouched=True)

    @property
    def lazy(self) -> bool:
        """Whether the index vectors are not made yet (see the class docstring)."""
        return self.rows is None

    def vectors(self) -> tuple[tf.Tensor, tf.Tensor]:
        """``(rows, cols)``, made if the grid is lazy."""
        if self.rows is not None and self.cols is not None:
            return self.rows, self.cols
        if self.window is None:  # cannot happen: only a window is lazy
            raise RuntimeError("a lazy mask grid without a window")
        size = self.window[1]
        rows, cols = (
            _mirror_index(tf.range(size[axis]), size[axis] - 1, self.mirrored[axis])
            for axis in (0, 1)
        )
        return rows, cols

    def made(self) -> MaskGrid:
        """The same grid with its index vectors made."""
        if not self.lazy:
            return self
        return MaskGrid(*self.vectors(), self.window)

    def crop(self, offset: tf.Tensor, size: tf.Tensor) -> MaskGrid:
        if self.untouched:
            return MaskGrid(None, None, (offset, size))
        grid = self.made()
        return MaskGrid(
            tf.slice(grid.rows, offset[:1], size[:1]),
            tf.slice(grid.cols, offset[1:], size[1:]),
            grid.window,
        )

    def mirror(self, axis: int, when: tf.Tensor | None = None) -> MaskGrid:
        """Mirrored about `axis` (0: rows, 1: columns); only where `when`, if given."""
        if self.lazy and self.mirrored[axis] is False:
            mirrored = list(self.mirrored)
            mirrored[axis] = True if when is None else when
            return MaskGrid(None, None, self.window, mirrored=(mirrored[0], mirrored[1]))
        grid = self.made()
        index = grid.rows if axis == 0 else grid.cols
        mirrored_index = tf.reverse(index, [0])
        if when is not None:
            mirrored_index = tf.where(when, mirrored_index, index)
        if axis == 0:
            return MaskGrid(mirrored_index, grid.cols, grid.window)
        return MaskGrid(grid.rows, mirrored_index, grid.window)

    def resize(self, size: Sequence[int] | tf.Tensor) -> MaskGrid:
        """Resized to ``size`` by nearest neighbour, as ``tf.image.resize(method="nearest")``."""
        if self.lazy and self.window is not None:
            return self._resize_window(self.window[1], size)
        grid = self.made()
        return MaskGrid(
            tf.gather(grid.rows, _nearest_index(tf.size(grid.rows), size[0])),
            tf.gather(grid.cols, _nearest_index(tf.size(grid.cols), size[1])),
            grid.window,
        )

    def _resize_window(self, extent: tf.Tensor, size: Sequence[int] | tf.Tensor) -> MaskGrid:
        """`resize` of a lazy grid: the nearest index into the window's rows
        and columns is the index itself (mirrored: ``last - index``), so the
        gathers of `resize` are not needed, and an output of one static
        height and width computes both axes' indices at once. `extent`:
        the window's size."""
        last = extent - 1
        if isinstance(size, (list, tuple)) and int(size[0]) == int(size[1]):
            count = int(size[0])
            # The float32 steps of `_nearest_index`, both axes at once.
            scale = tf.cast(extent, tf.float32) / float(count)
            positions = tf.constant([[i + 0.5 for i in range(count)]], tf.float32)
            index = tf.cast(tf.floor(positions * scale[:, None]), tf.int32)
            rows, cols = tf.unstack(tf.minimum(index, last[:, None]))
        else:
            rows = _nearest_index(extent[0], size[0])
            cols = _nearest_index(extent[1], size[1])
        return MaskGrid(
            _mirror_index(rows, last[0], self.mirrored[0]),
            _mirror_index(cols, last[1], self.mirrored[1]),
            self.window,
        )

    def sample(self, masks: tf.Tensor, *, batched: bool = False) -> tf.Tensor:
        """uint8 ``[H, W, 1]`` (or ``[N, H, W, 1]``) masks on this grid.

        Columns are gathered as rows of the transposed mask: a gather along
        the last axis of a one-channel mask copies one byte at a time, and
        the transposes, a byte at a time too, are most of the cost. Rows
        first transposes ``len(rows) x width`` bytes and then ``len(rows) x
        len(cols)``; columns first (of the window: of the whole mask it
        would transpose every byte) transposes ``height x width`` and then
        ``height x len(cols)``, fewer when the window has fewer rows than
        the output, i.e. when the resize enlarges it. The window has at most
        the mask's rows, so columns go first when the mask's static height
        is at most the output's (e.g. a random resized crop to the stored
        size); else rows first, as without a window.
        """
        index_rows, index_cols = self.vectors()
        first = 1 if batched else 0
        order = [0, 2, 1] if batched else [1, 0]
        masks = masks[..., 0]
        height = masks.shape[first]  # the window's rows are at most the mask's
        if self.window is not None:
            masks = _slice_window_2d(masks, *self.window, batched=batched)
        if self.window is not None and _at_most(height, index_rows.shape[0]):
            cols = tf.gather(tf.transpose(masks, order), index_cols, axis=first)
            rows = tf.gather(tf.transpose(cols, order), index_rows, axis=first)
            return rows[..., None]
        rows = tf.gather(masks, index_rows, axis=first)
        cols = tf.gather(tf.transpose(rows, order), index_cols, axis=first)
        return tf.transpose(cols, order)[..., None]


def _mirror_index(index: tf.Tensor, last: tf.Tensor, mirrored: Any) -> tf.Tensor:
    """Indices into ``last + 1`` positions, mirrored (``last - index``) where
    `mirrored` (False, True or a bool scalar tensor)."""
    if mirrored is False:
        return index
    flipped = last - index
    return flipped if mirrored is True else tf.where(mirrored, flipped, index)


def _at_most(size: int | None, other: int | None) -> bool:
    """Whether static `size` is known to be at most static `other`."""
    return size is not None and other is not None and size <= other


def _slice_window_2d(masks: tf.Tensor, offset, size, *, batched: bool) -> tf.Tensor:
    """The ``size`` window at ``offset`` of ``[H, W]`` (or ``[N, H, W]``) masks."""
    if batched:
        return tf.slice(masks, tf.concat([[0], offset], 0), tf.concat([[-1], size], 0))
    return tf.slice(masks, offset, size)


def _nearest_index(in_size: tf.Tensor, out_size) -> tf.Tensor:
    """For each of `out_size` output positions the input index TF's
    ``ResizeNearestNeighbor`` (half-pixel centres, no corner alignment)
    samples: ``min(floor((i + 0.5) * in / out), in - 1)``, in float32 as its
    kernel computes it."""
    scale = tf.cast(in_size, tf.float32) / tf.cast(out_size, tf.float32)
    positions = tf.cast(tf.range(out_size), tf.float32) + 0.5
    index = tf.cast(tf.floor(positions * scale), tf.int32)
    return tf.minimum(index, tf.cast(in_size, tf.int32) - 1)


@dataclasses.dataclass(frozen=True)
class ObjectMoves:
    """A crop and the mirror flips after it, not yet applied to the per-object
    coordinates (boxes, keypoints): the moves of the leading crop's path.

    Every step of applying them (`move_objects`) works per object, so the
    reader applies them once per batch, to the objects of all its elements
    at once, instead of a dozen small ops per element and move; applied to
    one element or to a batch, they give the same values.

    Attributes:
      window: float32 ``[4]``: the crop's offset (y, x) as a fraction of
        the image and its scale (y, x), image size over window size; None
        until a crop is deferred.
      flips: ``(axis, when)`` of each mirror flip after the crop, in order:
        axis 0 mirrors rows, 1 columns; `when` a bool scalar (None: always).
    """

    window: tf.Tensor | None = None
    flips: tuple[tuple[int, tf.Tensor | None], ...] = ()

    @property
    def pending(self) -> bool:
        return self.window is not None or bool(self.flips)

    def as_tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
        """``(window [4], whens [F])``: the moves after a crop as tensors that
        batch (the flips' axes, the same for every element, are `flip_axes`)."""
        if self.window is None:
            raise ValueError("only the moves after a crop are deferred to the batch")
        whens = [tf.constant(True) if when is None else when for _, when in self.flips]
        return self.window, tf.stack(whens) if whens else tf.zeros([0], tf.bool)

    @property
    def flip_axes(self) -> tuple[int, ...]:
        return tuple(axis for axis, _ in self.flips)


@dataclasses.dataclass(frozen=True)
class ElementTargets:
    """One element's target tensors (keyed by the names in the module docstring) and its spec.

    Immutable: every move returns a new `ElementTargets`. Tensors that a move
    does not concern (label, labels, extras) pass through.

    While deferring (see `deferring_moves`), ``mask`` and ``instance_masks``
    in `tensors` are the masks before the moves the `grid` holds, and the
    per-object columns the objects before the crop and flips `moves`
    holds: crops, mirror flips and mask resizes then only update the two,
    and `materialized` moves the masks and objects once. Every other move
    materializes first; the augmenter hands ops other than kiln's own flips
    materialized targets only.
    """

    tensors: Mapping[str, tf.Tensor]
    spec: TargetSpec
    grid: MaskGrid | None = None
    moves: ObjectMoves | None = None

    def replace(self, **tensors: tf.Tensor) -> ElementTargets:
        return ElementTargets({**self.tensors, **tensors}, self.spec, self.grid, self.moves)

    def get(self, name: str) -> tf.Tensor | None:
        return self.materialized().tensors.get(name)

    @property
    def has_masks(self) -> bool:
        return "mask" in self.tensors or "instance_masks" in self.tensors

    @property
    def has_objects(self) -> bool:
        return "boxes" in self.tensors or "keypoints" in self.tensors

    def deferring_moves(self) -> ElementTargets:
        """The same targets, with crops, flips and resizes of the masks
        (`MaskGrid`) and crops and flips of the objects (`ObjectMoves`)
        deferred until `materialized`."""
        grid, moves = self.grid, self.moves
        if grid is None and self.has_masks:
            if "mask" in self.tensors:
                shape = tf.shape(self.tensors["mask"])[:2]
            else:
                shape = tf.shape(self.tensors["instance_masks"])[1:3]
            grid = MaskGrid.identity(shape)
        if moves is None and self.has_objects:
            moves = ObjectMoves()
        return ElementTargets(self.tensors, self.spec, grid, moves)

    def materialized(self, *, objects: bool = True) -> ElementTargets:
        """The masks moved by the deferred moves, and (with `objects`) the
        objects; the targets themselves if none are deferred.

        Without `objects`, the objects' moves stay deferred (`moves`): the
        reader applies them to a whole batch (`move_batch_objects`).
        """
        if self.grid is None and (self.moves is None or not objects):
            return self
        out = dict(self.tensors)
        if self.grid is not None:
            if "mask" in out:
                out["mask"] = self.grid.sample(out["mask"])
            if "instance_masks" in out:
                out["instance_masks"] = self.grid.sample(out["instance_masks"], batched=True)
        moves = self.moves
        if moves is None or not objects:
            return ElementTargets(out, self.spec, None, moves)
        moved, keep = move_objects(out, self.spec, moves)
        if moves.window is not None and "instance_masks" in moved and "boxes" in moved:
            moved["boxes"] = tightened(
                moved["boxes"], moved["instance_masks"], _cut(out["boxes"], moves.window)
            )
        result = ElementTargets(moved, self.spec)
        return result.keep_objects(keep) if keep is not None else result

    # -- selecting objects ------------------------------------------------------------

    def keep_objects(self, keep: tf.Tensor) -> ElementTargets:
        """Only the objects where the bool ``[N]`` `keep` is True, in every per-object column."""
        columns = [name for name in self.spec.object_columns if name in self.tensors]
        if not columns:
            return self
        # One index for every column, where a boolean_mask per column would
        # find the kept objects again for each.
        kept = tf.reshape(tf.where(keep), [-1])
        return self.replace(**{name: tf.gather(self.tensors[name], kept) for name in columns})

    # -- moves --------------------------------------------------------------------------

    def crop(self, offset: tf.Tensor, size: tf.Tensor, shape: tf.Tensor) -> ElementTargets:
        """The targets of the ``size`` window at ``offset`` of an image of ``shape``.

        All three are int32 ``[2]`` (height, width) pixel vectors, as a
        cropping op's `Window.sample` returns them.
        """
        moves = self.moves
        if moves is not None and moves.pending:  # not a leading crop: move the objects now
            return self.materialized().deferring_moves().crop(offset, size, shape)
        shape_f = tf.cast(shape, tf.float32)
        offset_f = tf.cast(offset, tf.float32) / shape_f
        scale = shape_f / tf.cast(size, tf.float32)
        window = tf.concat([offset_f, scale], 0)
        out = dict(self.tensors)
        keep = None
        if moves is not None:
            moves = ObjectMoves(window)
        else:
            out, keep = move_objects(out, self.spec, ObjectMoves(window))
        grid = self.grid
        if grid is not None:
            grid = grid.crop(offset, size)
        else:
            if "mask" in out:
                out["mask"] = _slice_window(out["mask"], offset, size)
            if "instance_masks" in out:
                out["instance_masks"] = _slice_window(
                    out["instance_masks"], offset, size, batched=True
                )
                if moves is None and "boxes" in out:
                    out["boxes"] = tightened(
                        out["boxes"], out["instance_masks"], _cut(self.tensors["boxes"], window)
                    )
        result = ElementTargets(out, self.spec, grid, moves)
        return result.keep_objects(keep) if keep is not None else result

    def resize_masks(self, size: Sequence[int] | tf.Tensor) -> ElementTargets:
        """Masks resized to ``size`` (nearest neighbour); coordinates, being
        normalized, are unchanged by a resize."""
        if self.grid is not None:
            return ElementTargets(self.tensors, self.spec, self.grid.resize(size), self.moves)
        out = {}
        if "mask" in self.tensors:
            out["mask"] = _resize_nearest(self.tensors["mask"], size)
        if "instance_masks" in self.tensors:
            out["instance_masks"] = _resize_nearest(self.tensors["instance_masks"], size)
        return self.replace(**out) if out else self

    def flip_left_right(self, when: tf.Tensor | None = None) -> ElementTargets:
        """Mirrored horizontally; keypoints of each flip pair swap names.

        Args:
          when: A bool scalar: mirrored only where it is True (the targets of
            a random flip, without a `tf.cond` around them). None: always.
        """
        return self._mirror(axis=1, when=when)

    def flip_up_down(self, when: tf.Tensor | None = None) -> ElementTargets:
        """Mirrored vertically (where `when`, as `flip_left_right`). A mirror
        image swaps left and right of the subject whichever axis it mirrors
        about (a vertical flip is a half-turn and a horizontal flip), so flip
        pairs swap here too."""
        return self._mirror(axis=0, when=when)

    def _mirror(self, axis: int, when: tf.Tensor | None) -> ElementTargets:
        moves = self.moves
        if moves is not None:
            moves = ObjectMoves(moves.window, (*moves.flips, (axis, when)))
            out = dict(self.tensors)
        else:
            out = _mirror_objects(self.tensors, self.spec, axis, when)
        grid = self.grid
        if grid is not None:
            grid = grid.mirror(axis, when)
        else:
            reversing = {"mask": axis, "instance_masks": axis + 1}
            for name, mask_axis in reversing.items():
                if name not in out:
                    continue
                mask = out[name]
                if when is None:
                    out[name] = tf.reverse(mask, axis=[mask_axis])
                else:  # a pass over the mask only where it flips
                    out[name] = tf.cond(
                        when,
                        lambda mask=mask, mask_axis=mask_axis: tf.reverse(mask, axis=[mask_axis]),
                        lambda mask=mask: mask,
                    )
        return ElementTargets(out, self.spec, grid, moves)

    def warp(self, transform: tf.Tensor, shape: tf.Tensor, *, fill_mode: str) -> ElementTargets:
        """The targets of an image warped by an affine `ImageProjectiveTransformV3` transform.

        Args:
          transform: float32 ``[8]``: ``[a0, a1, a2, b0, b1, b2, 0, 0]``,
            mapping each OUTPUT pixel (x, y) to the input point it samples,
            ``(a0 x + a1 y + a2, b0 x + b1 y + b2)`` in pixel indices (the
            form TF's image transforms take; the image op used the same).
          shape: int32 ``[2]``: height and width of the image (kept).
          fill_mode: The image's fill mode. The semantic mask follows it
            (``constant`` fills `ignore_value`: those pixels have no class);
            instance masks always fill 0 (a reflected copy of an object
            is not that object).

        A mirror (a transform whose determinant is negative) swaps the
        keypoints of each flip pair, as `flip_left_right` does.

        Boxes become the enclosing box of their four transformed corners
        (of the part of the transformed box inside the image, when it
        leaves the image), or, with instance masks, the box of the
        transformed mask's pixels (tight for any shape, where the corners'
        box of a rotated ellipse is not). Objects are filtered by
        ``min_visibility``: the fraction of the transformed corners' box
        that stays inside the image, as offline.
        """
        height_width = tf.cast(shape, tf.float32)
        forward = _forward_affine(transform, height_width)  # normalized (y, x) in -> out
        out = dict(self.materialized().tensors)
        keep = None
        if "boxes" in out:
            corners = _apply_affine(_corners(out["boxes"]), forward)
            _, keep = _clip_boxes(_extent(corners), self.spec.min_visibility)
            out["boxes"] = _visible_extent(corners)
        if "keypoints" in out:
            points, visibility = _hide_outside(
                _apply_affine(out["keypoints"], forward), out["keypoint_visibility"]
            )
            order = self.spec.keypoint_permutation()
            if order != sorted(order):
                # A mirror (the map's determinant is negative) swaps the
                # subject's left and right, as the flips do.
                mirrored = transform[0] * transform[4] - transform[1] * transform[3] < 0
                points = tf.where(mirrored, tf.gather(points, order, axis=1), points)
                visibility = tf.where(mirrored, tf.gather(visibility, order, axis=1), visibility)
            out["keypoints"], out["keypoint_visibility"] = points, visibility
        if "mask" in out:
            out["mask"] = _warp_masks(
                out["mask"][None], transform, shape, fill_mode, self.spec.ignore_value
            )[0]
        if "instance_masks" in out:
            had_pixels = _has_pixels(out["instance_masks"])
            masks = _warp_masks(out["instance_masks"], transform, shape, "constant", 0)
            out["instance_masks"] = masks
            if "boxes" in out:
                from_masks, filled = mask_boxes(masks)
                out["boxes"] = tf.where(filled[:, None], from_masks, out["boxes"])
                # A mask that had pixels and lost them all left the image. A
                # stored empty mask (a polygon too small to cover a pixel's
                # centre: the build keeps it) tells nothing: its box decides.
                kept = filled | tf.logical_not(had_pixels)
                keep = keep & kept if keep is not None else kept
        result = ElementTargets(out, self.spec)  # masks materialized above
        return result.keep_objects(keep) if keep is not None else result

    def erase(self, inside: tf.Tensor) -> ElementTargets:
        """Targets of an image whose bool ``[H, W]`` region `inside` was erased.

        The semantic mask gets `ignore_value` there, instance masks 0;
        keypoints under it become visibility 0; objects whose instance mask
        (or, without masks, whose box) keeps less than ``min_visibility``
        are dropped (an object whose stored instance mask is empty, by its
        box). Boxes are left as they are (the object's extent did not
        change, only what shows of it).
        """
        out = dict(self.materialized().tensors)
        keep = None
        if "mask" in out:
            out["mask"] = tf.where(
                inside[:, :, None], tf.constant(self.spec.ignore_value, tf.uint8), out["mask"]
            )
        if "keypoints" in out:
            shape = tf.shape(inside)
            pixel = tf.cast(
                tf.floor(out["keypoints"] * tf.cast(shape, tf.float32)), tf.int32
            )  # [N, K, 2]
            pixel = tf.clip_by_value(pixel, 0, shape - 1)
            covered = tf.gather_nd(inside, pixel)
            out["keypoints"], out["keypoint_visibility"] = zero_unlabelled(
                out["keypoints"],
                tf.where(
                    covered, tf.zeros_like(out["keypoint_visibility"]), out["keypoint_visibility"]
                ),
            )
        if "boxes" in out:
            shape = tf.cast(tf.shape(inside), tf.float32)
            rows = tf.reduce_any(inside, axis=1)
            cols = tf.reduce_any(inside, axis=0)
            box = _mask_extent(rows, cols) / tf.tile(shape, [2])  # the erased rectangle
            covered = _intersection_area(out["boxes"], box[None]) / tf.maximum(
                _area(out["boxes"]), 1e-12
            )
            keep = ((1.0 - covered) >= self.spec.min_visibility) & (covered < 1.0)
        if "instance_masks" in out:
            before = tf.reduce_sum(tf.cast(out["instance_masks"], tf.float32), [1, 2, 3])
            masks = tf.where(
                inside[None, :, :, None], tf.constant(0, tf.uint8), out["instance_masks"]
            )
            after = tf.reduce_sum(tf.cast(masks, tf.float32), [1, 2, 3])
            out["instance_masks"] = masks
            by_mask = (after > 0) & (after >= self.spec.min_visibility * before)
            # A stored empty mask (see `warp`) is judged by its box.
            keep = by_mask if keep is None else tf.where(before > 0, by_mask, keep)
        result = ElementTargets(out, self.spec)  # masks materialized above
        return result.keep_objects(keep) if keep is not None else result


@dataclasses.dataclass(frozen=True)
class BatchTargets:
    """A batch's targets, for batch ops: per-object columns are `tf.RaggedTensor`
    ``[batch, (objects), ...]``, the mask a dense ``[batch, H, W, 1]``,
    ``label`` a float32 one-hot and ``labels`` a float32 multi-hot ``[batch,
    num_classes]`` (mixed by the ops: a weight per class), extras as read."""

    tensors: Mapping[str, Any]
    spec: TargetSpec

    def replace(self, **tensors: Any) -> BatchTargets:
        return BatchTargets({**self.tensors, **tensors}, self.spec)

    @classmethod
    def for_mixing(
        cls, batch: Mapping[str, Any], spec: TargetSpec, num_classes: int
    ) -> BatchTargets:
        """The targets of a batch of reader features, with the class ids of
        ``label`` and ``labels`` turned into the class vectors batch ops mix."""
        tensors = {name: batch[name] for name in spec.names}
        if "label" in tensors:
            tensors["label"] = tf.one_hot(tensors["label"], num_classes, dtype=tf.float32)
        if "labels" in tensors:
            tensors["labels"] = multi_hot(tensors["labels"], num_classes)
        return cls(tensors, spec)


def multi_hot(labels: Any, num_classes: int) -> tf.Tensor:
    """float32 ``[batch, num_classes]``: 1 for each class id in a row of the
    ragged int ``[batch, (labels)]`` `labels` (an empty row: all 0)."""
    counts = tf.reduce_sum(tf.one_hot(labels, num_classes, dtype=tf.float32), axis=1)
    return tf.minimum(counts, 1.0)


# --- moving objects ----------------------------------------------------------------


def move_objects(
    tensors: Mapping[str, tf.Tensor], spec: TargetSpec, moves: ObjectMoves, *, batched: bool = False
) -> tuple[dict[str, tf.Tensor], tf.Tensor | None]:
    """Boxes and keypoints through `moves`, and which objects to keep (None: all).

    The per-object columns are those of one element (``[N, ...]``, the
    moves' tensors scalars and ``[4]``), or the flat values of a batch's
    (``[T, ...]``, the moves' tensors with a leading ``[T]``: each object's
    element's, with `batched`): every step is per object, so both give the
    same values.
    Objects are not dropped here; the caller keeps those where the result
    is True (`ElementTargets.keep_objects`, `move_batch_objects`).
    """
    out = dict(tensors)
    keep = None
    if moves.window is not None:
        window = moves.window
        if "boxes" in out:
            offset, scale = window[..., :2], window[..., 2:]
            boxes = (out["boxes"] - tf.concat([offset, offset], -1)) * tf.concat([scale, scale], -1)
            out["boxes"], keep = _clip_boxes(boxes, spec.min_visibility)
        if "keypoints" in out:
            window = _per_object(window, out["keypoints"], batched)
            out["keypoints"], out["keypoint_visibility"] = _hide_outside(
                (out["keypoints"] - window[..., :2]) * window[..., 2:], out["keypoint_visibility"]
            )
    for axis, when in moves.flips:
        out = _mirror_objects(out, spec, axis, when, batched)
    return out, keep


def _per_object(value: tf.Tensor, like: tf.Tensor, batched: bool) -> tf.Tensor:
    """A batch's ``[T, ...]`` per-object move parameter with axes added after
    T to broadcast against `like`; one element's (no T axis) as it is."""
    if not batched:
        return value
    missing = like.shape.rank - value.shape.rank
    return value[(slice(None),) + (None,) * missing] if missing > 0 else value


def _mirror_objects(
    tensors: Mapping[str, tf.Tensor],
    spec: TargetSpec,
    axis: int,
    when: tf.Tensor | None,
    batched: bool = False,
) -> dict[str, tf.Tensor]:
    """Boxes and keypoints mirrored about `axis` (0: rows, 1: columns), where
    `when` (None: always); flip pairs of keypoints swap."""
    out = dict(tensors)
    flipped = {}
    if "boxes" in out:
        y0, x0, y1, x1 = tf.unstack(out["boxes"], axis=-1)
        if axis == 1:
            flipped["boxes"] = tf.stack([y0, 1.0 - x1, y1, 1.0 - x0], axis=-1)
        else:
            flipped["boxes"] = tf.stack([1.0 - y1, x0, 1.0 - y0, x1], axis=-1)
    if "keypoints" in out:
        flip = tf.constant([1.0, -1.0] if axis == 1 else [-1.0, 1.0], tf.float32)
        shift = tf.constant([0.0, 1.0] if axis == 1 else [1.0, 0.0], tf.float32)
        points = out["keypoints"] * flip + shift
        visibility = out["keypoint_visibility"]
        order = spec.keypoint_permutation()
        if order != sorted(order):
            points = tf.gather(points, order, axis=1)
            visibility = tf.gather(visibility, order, axis=1)
            flipped["keypoint_visibility"] = visibility
        flipped["keypoints"], _ = zero_unlabelled(points, visibility)
    for name, value in flipped.items():
        out[name] = (
            value if when is None else tf.where(_per_object(when, value, batched), value, out[name])
        )
    return out


def move_batch_objects(
    columns: Mapping[str, tf.RaggedTensor],
    spec: TargetSpec,
    window: tf.Tensor,
    whens: tf.Tensor,
    flip_axes: Sequence[int],
) -> dict[str, tf.RaggedTensor]:
    """A batch's per-object columns (ragged ``[B, (N), ...]``) moved by each
    element's deferred `ObjectMoves` (`ObjectMoves.as_tensors`, batched:
    `window` ``[B, 4]``, `whens` ``[B, F]``), with the objects that leave
    the image dropped: the values `ElementTargets.materialized` gives each
    element, in one set of ops for the batch."""
    names = [name for name in spec.object_columns if name in columns]
    if not names:
        return dict(columns)
    first = columns[names[0]]
    element = first.value_rowids()
    flips = tuple(
        (axis, tf.gather(whens[:, index], element)) for index, axis in enumerate(flip_axes)
    )
    moves = ObjectMoves(tf.gather(window, element), flips)
    values, keep = move_objects(
        {name: columns[name].values for name in names}, spec, moves, batched=True
    )
    if keep is None:
        return {name: first.with_values(values[name]) for name in names}
    kept = tf.reshape(tf.where(keep), [-1])
    counts = tf.reduce_sum(tf.cast(first.with_values(keep), tf.int64), axis=1)
    splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(counts)], 0)
    return {
        name: tf.RaggedTensor.from_row_splits(tf.gather(values[name], kept), splits, validate=False)
        for name in names
    }


# --- kernels ---------------------------------------------------------------------------


def _area(boxes: tf.Tensor) -> tf.Tensor:
    return tf.maximum(boxes[..., 2] - boxes[..., 0], 0.0) * tf.maximum(
        boxes[..., 3] - boxes[..., 1], 0.0
    )


def _intersection_area(boxes: tf.Tensor, other: tf.Tensor) -> tf.Tensor:
    top_left = tf.maximum(boxes[..., :2], other[..., :2])
    bottom_right = tf.minimum(boxes[..., 2:], other[..., 2:])
    extent = tf.maximum(bottom_right - top_left, 0.0)
    return extent[..., 0] * extent[..., 1]


def _clip_boxes(boxes: tf.Tensor, min_visibility: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Boxes clipped to [0, 1] and which to keep: some area left, and at
    least `min_visibility` of it (a box with no area: kept while inside)."""
    clipped = tf.clip_by_value(boxes, 0.0, 1.0)
    area = _area(boxes)
    kept_area = _area(clipped)
    inside = tf.reduce_all(tf.equal(clipped, boxes), axis=-1)
    fraction = tf.math.divide_no_nan(kept_area, area)
    keep = tf.where(area > 0.0, (kept_area > 0.0) & (fraction >= min_visibility), inside)
    return clipped, keep


def _cut(boxes: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """bool ``[N]``: whether the crop `window` (`ObjectMoves.window`) cuts each box."""
    offset, scale = window[:2], window[2:]
    moved = (boxes - tf.concat([offset, offset], 0)) * tf.concat([scale, scale], 0)
    return tf.reduce_any((moved < 0.0) | (moved > 1.0), axis=-1)


def tightened(boxes: tf.Tensor, masks: tf.Tensor, which: tf.Tensor) -> tf.Tensor:
    """`boxes` where the bool ``[N]`` `which` cut to their ``[N, H, W, 1]``
    instance masks' pixels: the intersection of the box and the mask's
    pixel box, as the build does (`kiln.transforms.targets.tightened`). A
    box whose mask has no pixel, or whose intersection with it is empty,
    stays as it is. The masks are read only when a box was cut (most crops
    cut none)."""

    def cut_boxes():
        from_masks, filled = mask_boxes(masks)
        cut = tf.concat(
            [
                tf.maximum(boxes[:, :2], from_masks[:, :2]),
                tf.minimum(boxes[:, 2:], from_masks[:, 2:]),
            ],
            axis=-1,
        )
        valid = which & filled & (cut[:, 2] > cut[:, 0]) & (cut[:, 3] > cut[:, 1])
        return tf.where(valid[:, None], cut, boxes)

    return tf.cond(tf.reduce_any(which), cut_boxes, lambda: boxes)


def _hide_outside(points: tf.Tensor, visibility: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Visibility 0 for keypoints outside the image ([0, 1] in both coordinates)."""
    inside = tf.reduce_all((points >= 0.0) & (points <= 1.0), axis=-1)
    return zero_unlabelled(points, tf.where(inside, visibility, tf.zeros_like(visibility)))


def zero_unlabelled(points: tf.Tensor, visibility: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Keypoints of visibility 0 carry no position: coordinates (0, 0), as in
    COCO and in the build (`kiln.transforms.targets`)."""
    labelled = (visibility > 0)[..., None]
    return tf.where(labelled, points, tf.zeros_like(points)), visibility


def _slice_window(mask: tf.Tensor, offset, size, *, batched: bool = False) -> tf.Tensor:
    offset, size = tf.cast(offset, tf.int32), tf.cast(size, tf.int32)
    if batched:
        begin = tf.concat([[0], offset, [0]], 0)
        extent = tf.concat([[-1], size, [-1]], 0)
    else:
        begin = tf.concat([offset, [0]], 0)
        extent = tf.concat([size, [-1]], 0)
    out = tf.slice(mask, begin, extent)
    out.set_shape(mask.shape[:1].concatenate([None, None, 1]) if batched else [None, None, 1])
    return out


def _resize_nearest(mask: tf.Tensor, size) -> tf.Tensor:
    """uint8 masks resized by nearest neighbour (TF keeps the dtype for that method)."""
    resized = tf.image.resize(mask, size, method="nearest")
    if isinstance(size, (list, tuple)):
        static = [size[0], size[1], 1]
        resized = tf.ensure_shape(resized, mask.shape[:-3].concatenate(static))
    return resized


def _forward_affine(transform: tf.Tensor, height_width: tf.Tensor) -> tf.Tensor:
    """The 2x3 map of normalized ``(y, x)`` input points to output points.

    `transform` maps output pixel indices to input ones (TF's convention,
    pixel centres at whole numbers); kiln's coordinates are continuous
    (centres at ``i + 0.5``) and normalized.
    """
    a0, a1, a2, b0, b1, b2 = (transform[i] for i in range(6))
    # Output -> input in continuous pixel (x, y): p = A q + t - A h + h, h = 0.5.
    linear = tf.stack([tf.stack([a0, a1]), tf.stack([b0, b1])])  # on (x, y)
    half = tf.constant([0.5, 0.5], tf.float32)
    shift = tf.stack([a2, b2]) + half - tf.linalg.matvec(linear, half)
    inverse = tf.linalg.inv(linear)
    inverse_shift = -tf.linalg.matvec(inverse, shift)  # input (x, y) -> output (x, y)
    # In normalized (y, x): swap the axes and scale by the size.
    height, width = height_width[0], height_width[1]
    i00, i01, i10, i11 = inverse[1, 1], inverse[1, 0], inverse[0, 1], inverse[0, 0]
    rows = tf.stack(
        [
            tf.stack([i00, i01 * width / height, inverse_shift[1] / height]),
            tf.stack([i10 * height / width, i11, inverse_shift[0] / width]),
        ]
    )
    return rows  # [2, 3] on (y, x, 1)


def _apply_affine(points: tf.Tensor, forward: tf.Tensor) -> tf.Tensor:
    """``[..., 2]`` normalized (y, x) points through a 2x3 `forward` map."""
    return tf.linalg.matvec(forward[:, :2], points) + forward[:, 2]


def _corners(boxes: tf.Tensor) -> tf.Tensor:
    """``[N, 4, 2]`` (y, x) corners of ``[N, 4]`` boxes, in order around the box."""
    y0, x0, y1, x1 = tf.unstack(boxes, axis=-1)
    return tf.stack(
        [
            tf.stack([y0, x0], -1),
            tf.stack([y0, x1], -1),
            tf.stack([y1, x1], -1),
            tf.stack([y1, x0], -1),
        ],
        axis=-2,
    )


def _extent(points: tf.Tensor) -> tf.Tensor:
    """The box ``[y_min, x_min, y_max, x_max]`` of ``[N, P, 2]`` points."""
    return tf.concat([tf.reduce_min(points, axis=-2), tf.reduce_max(points, axis=-2)], axis=-1)


def _visible_extent(corners: tf.Tensor) -> tf.Tensor:
    """The box of the part of each convex quadrilateral (``[N, 4, 2]``) inside [0, 1]^2.

    The box of an intersection of convex shapes is spanned by the
    quadrilateral's corners inside the image, the points where its sides
    cross the image's borders, and the image's corners inside it. Tighter
    than clipping the corners' box when a rotated box leaves the image
    across a corner. Empty (all zeros) where nothing is inside.
    """
    start, end = corners, tf.roll(corners, shift=-1, axis=-2)  # the 4 sides
    candidates = [corners]
    valid = [_inside_unit(corners)]
    for axis in (0, 1):
        for border in (0.0, 1.0):
            delta = end[..., axis] - start[..., axis]
            t = tf.math.divide_no_nan(border - start[..., axis], delta)
            point = start + t[..., None] * (end - start)
            crossing = (tf.abs(delta) > 0.0) & (t >= 0.0) & (t <= 1.0)
            other = point[..., 1 - axis]
            candidates.append(point)
            valid.append(crossing & (other >= 0.0) & (other <= 1.0))
    unit = tf.constant([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]], tf.float32)
    # An image corner is inside a convex quadrilateral when it is on the same
    # side of all four sides.
    side = end - start  # [N, 4, 2]
    to_corner = unit[None, :, None, :] - start[:, None, :, :]  # [N, corner, side, 2]
    cross = side[:, None, :, 0] * to_corner[..., 1] - side[:, None, :, 1] * to_corner[..., 0]
    inside = tf.reduce_all(cross >= 0.0, axis=-1) | tf.reduce_all(cross <= 0.0, axis=-1)
    candidates.append(tf.broadcast_to(unit[None], tf.shape(corners)))
    valid.append(inside)
    points = tf.concat(candidates, axis=-2)  # [N, 24, 2]
    flags = tf.concat(valid, axis=-1)[..., None]  # [N, 24, 1]
    low = tf.reduce_min(tf.where(flags, points, 2.0), axis=-2)
    high = tf.reduce_max(tf.where(flags, points, -1.0), axis=-2)
    box = tf.concat([low, high], axis=-1)
    any_inside = tf.reduce_any(flags[..., 0], axis=-1, keepdims=True)
    return tf.where(any_inside, tf.clip_by_value(box, 0.0, 1.0), tf.zeros_like(box))


def _inside_unit(points: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all((points >= 0.0) & (points <= 1.0), axis=-1)


def _warp_masks(masks, transform, shape, fill_mode: str, fill_value: int) -> tf.Tensor:
    """uint8 ``[B, H, W, 1]`` masks through the image's transform, nearest neighbour."""
    warped = tf.raw_ops.ImageProjectiveTransformV3(
        images=masks,
        transforms=transform[None],
        output_shape=shape,
        fill_value=tf.constant(fill_value, tf.float32),
        interpolation="NEAREST",
        fill_mode=fill_mode.upper(),
    )
    return tf.ensure_shape(warped, masks.shape)


def _mask_extent(rows: tf.Tensor, cols: tf.Tensor) -> tf.Tensor:
    """Pixel box ``[y_min, x_min, y_max, x_max]`` (continuous) of the set rows and columns."""
    height, width = tf.shape(rows)[-1], tf.shape(cols)[-1]

    def extent(flags, length):
        index = tf.range(length, dtype=tf.int32)
        first = tf.reduce_min(tf.where(flags, index, length), axis=-1)
        last = tf.reduce_max(tf.where(flags, index, -1), axis=-1) + 1
        return tf.cast(first, tf.float32), tf.cast(last, tf.float32)

    y0, y1 = extent(rows, height)
    x0, x1 = extent(cols, width)
    return tf.stack([y0, x0, y1, x1], axis=-1)


def _has_pixels(masks: tf.Tensor) -> tf.Tensor:
    """bool ``[N]``: whether each ``[N, H, W, 1]`` mask has a pixel set."""
    return tf.reduce_any(masks > 0, axis=[1, 2, 3])


def mask_boxes(masks: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The normalized tight box of each ``[N, H, W, 1]`` mask, and whether it has any pixel."""
    filled = masks[..., 0] > 0
    rows = tf.reduce_any(filled, axis=2)  # [N, H]
    cols = tf.reduce_any(filled, axis=1)  # [N, W]
    shape = tf.cast(tf.shape(masks)[1:3], tf.float32)
    boxes = _mask_extent(rows, cols) / tf.tile(shape, [2])
    return boxes, tf.reduce_any(rows, axis=1)


# --- declaring what an op does to targets ---------------------------------------------


def refuse_unsupported(
    op_name: str,
    supported: tuple[str, ...] | None,
    geometric: bool,
    spec: TargetSpec,
    where: str | None = None,
) -> None:
    """Raises TargetError when op `op_name` cannot move this dataset's targets.

    Args:
      supported: Target kinds the op's target form handles (None: it has none).
      geometric: Whether the op may move pixels (a user op not declared
        ``geometric=False`` is assumed to).
      where: The op's place in its list (``augment[2].random_shift``), to
        start the message with.
    """
    needed = spec.geometric
    if not needed or not geometric:
        return
    subject = f"{where}: augmentation op {op_name!r}" if where else f"augmentation op {op_name!r}"
    if supported is None:
        raise TargetError(
            f"{subject} may move pixels (a user op is geometric unless "
            f"registered with geometric=False) and has no target handling, so this dataset's "
            f"{list(needed)} would no longer match the image after it. Register it with "
            f"geometric=False if it only changes pixel values, or give it "
            f"with_targets=fn(image, targets, seed, **params) -> (image, targets) and "
            f"supports={list(needed)} (see kiln.reader.targets.ElementTargets for the moves)."
        )
    missing = [kind for kind in needed if kind not in supported]
    if missing:
        raise TargetError(
            f"{subject} moves pixels and handles targets {list(supported)} "
            f"only; this dataset also has {missing}, which would no longer match the image "
            f"after it"
        )


def cond(
    predicate: tf.Tensor,
    apply: Callable[[], tuple[tf.Tensor, ElementTargets]],
    otherwise: Callable[[], tuple[tf.Tensor, ElementTargets]],
    targets: ElementTargets,
) -> tuple[tf.Tensor, ElementTargets]:
    """`tf.cond` over ``(image, targets)`` pairs (the tensors, not the spec, go through it)."""

    def unpack(branch):
        def run():
            image, result = branch()
            # Both branches give moved masks, so their outputs match.
            return image, dict(result.materialized().tensors)

        return run

    image, tensors = tf.cond(predicate, unpack(apply), unpack(otherwise))
    return image, ElementTargets(tensors, targets.spec)


def pad_objects(targets: dict, spec: TargetSpec, max_objects: int, batched: bool) -> dict:
    """Per-object columns padded (or cut) to `max_objects`, plus ``num_objects``.

    Batched columns are ragged ``[B, (N), ...]`` and become dense ``[B, M,
    ...]``; unbatched ones are dense ``[N, ...]`` and become ``[M, ...]``.
    Padding is 0, except ``classes`` (-1, so a padded object cannot pass for
    class 0). Objects beyond `max_objects` are cut (the first ones are kept).
    """
    out = dict(targets)
    columns = [name for name in spec.object_columns if name in targets]
    if not columns:
        return out
    first = targets[columns[0]]
    if batched:
        count = tf.cast(first.row_lengths(), tf.int32)
    else:
        count = tf.shape(first)[0]
    out["num_objects"] = tf.minimum(count, max_objects)
    for name in columns:
        value = targets[name]
        pad = -1 if name == "classes" else 0
        if batched:
            trailing = value.shape[2:].as_list()
            out[name] = value.to_tensor(
                default_value=tf.constant(pad, value.dtype), shape=[None, max_objects, *trailing]
            )
        else:
            kept = value[:max_objects]
            trailing = value.shape[1:].as_list()
            amount = max_objects - tf.shape(kept)[0]
            paddings = [[0, amount]] + [[0, 0]] * len(trailing)
            out[name] = tf.ensure_shape(
                tf.pad(kept, paddings, constant_values=tf.constant(pad, value.dtype)),
                [max_objects, *trailing],
            )
    return out


def unpad_objects(targets: Mapping[str, Any], spec: TargetSpec) -> dict:
    """The inverse of `pad_objects` for a batch: each per-object column ragged
    ``[B, (N), ...]``, its first ``num_objects`` rows per element; without
    ``num_objects``."""
    count = targets["num_objects"]
    out = {name: value for name, value in targets.items() if name != "num_objects"}
    for name in spec.object_columns:
        if name in targets:
            out[name] = tf.RaggedTensor.from_tensor(targets[name], lengths=count)
    return out
