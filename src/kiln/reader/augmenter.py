"""Applies a configured augmentation list to one element or one batch, in the data path or a model.

A user's op is checked the first time it runs (`check_op`): traced as
tf.data traces it and run with many seeds, it is refused if its randomness
is drawn while tracing (the seed changes nothing, a fresh trace does), if
the same seed gives different outputs, or if it cannot be traced; an op
that no seed and no trace changes is deterministic with its parameters,
and accepted. kiln's own ops are trusted.

`Augmenter` is shared by the tf.data pipeline (per element, after decoding)
and `AugmentationLayer` (per element of a batch inside a model), so both give
identical results for identical seeds. In the data path a JPEG is decoded
only inside the first op's crop window when that op is a crop
(`tf.io.decode_and_crop_jpeg`); the window is widened by a small margin and
sliced afterwards, so the pixels equal those of a full decode followed by
the crop (chroma upsampling needs its neighbours).

Where the work is cheapest: when the list starts with a crop, the ops right
after it that only mirror (`OpDefinition.mirror`) and then the colour ops
(`OpDefinition.pixelwise`) run on the uint8 window, before it is resized to
the output size: fewer pixels (the window is usually smaller than the
output), one byte each, and the first colour op converts to float inside
its own pass. Flipping commutes with cropping and resizing; a colour op on
the window differs from one on the resized window only in where values are
clipped and in the mean it scales contrast about (the window's, not its
resized copy's). The order of the list is otherwise kept: an op is moved
only past the crop's resize, never past another op. Every op after a crop
is a full pass over its image, so passes over the smaller uint8 window
instead of the float output are most of what the reader can save. For
uint8 output the last of those colour ops gives levels (``255 * x + 0.5``,
`OpDefinition.levels`): the resize keeps them, and the cast to uint8
rounds, with no pass of its own to scale or round.

Targets (boxes, masks, keypoints: `kiln.reader.targets`) take the same path
(`apply_with_targets`): the leading crop's window crops them, the mirror
ops flip them in the window's frame (a flip commutes with the resize for
normalized coordinates too), colour ops pass them through, the crop's
finish resizes the masks to its output size, and every later op moves them
with its `OpDefinition.with_targets` form, drawing the same random values
from the same seed as the image. A dataset without targets never enters
that path: its ops and their graph are the same as before targets existed.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.errors import first_line
from kiln.lazy_import import LazyModule
from kiln.reader import seeds as seeding
from kiln.reader.ops import Augmentation, AugmentConfigError, slice_window, to_float
from kiln.reader.targets import (
    BatchTargets,
    ElementTargets,
    TargetError,
    TargetSpec,
    refuse_unsupported,
)
from kiln.schemas import decode_image

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when images are augmented, not to name the errors
    tf = LazyModule("tensorflow")

logger = logging.getLogger(__name__)

# An element's image and its targets (None for datasets without targets).
_Element = tuple["tf.Tensor", "ElementTargets | None"]


class AugmentOpError(ValueError):
    """A registered op misbehaves (ignores its seed, uses Python values of tensors)."""


# What `Augmenter.check_sizes` compares with, in its messages, unless told.
STORED_SIZE = "the dataset's stored images (kiln.json image_size)"

# Pixels of context around a fused JPEG crop window; a full decode's chroma
# upsampling looks one pixel beyond the window, 4 leaves room to spare.
_JPEG_WINDOW_MARGIN = 4


@dataclasses.dataclass(frozen=True)
class Augmenter:
    """A validated augmentation list, ready to run.

    Attributes:
      augmentations: Element ops first, then batch ops (see `ops.validate`).
      training: True applies the random ops; False applies each op's
        deterministic inference form (e.g. a centre crop of the same size),
        and no batch ops.
    """

    augmentations: tuple[Augmentation, ...] = ()
    training: bool = True

    @property
    def element_ops(self) -> list[Augmentation]:
        return [a for a in self.augmentations if a.definition.kind == "element"]

    @property
    def batch_ops(self) -> list[Augmentation]:
        if not self.training:
            return []
        return [a for a in self.augmentations if a.definition.kind == "batch"]

    @property
    def mixes_labels(self) -> bool:
        """Whether the list has a batch op (mixup, cutmix), whose labels are
        class vectors: in its inference form too, which applies none, so that
        training and evaluation get labels of one format."""
        return any(a.definition.kind == "batch" for a in self.augmentations)

    def most_objects(self, stored: int) -> int:
        """The most objects an element can have after the batch ops, given
        the most it has as stored.

        Element ops only drop objects (crops, rotations). A batch op that
        mixes boxes (cutmix) adds the objects it pastes from a partner, each
        of which has at most as many: it can double the count.
        """
        most = stored
        for augmentation in self.batch_ops:
            if "boxes" in (augmentation.definition.supports or ()):
                most *= 2
        return most

    @property
    def has_element_work(self) -> bool:
        """Whether any element op does something (inference forms may do nothing)."""
        if self.training:
            return bool(self.element_ops)
        return any(a.definition.inference is not None for a in self.element_ops)

    def apply(self, image: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        """Element ops on one decoded image; returns float32 in [0, 1].

        Args:
          image: uint8 or float ``[height, width, channels]``; uint8 is scaled
            to [0, 1] (after a leading crop, so only the window is converted).
          seed: shape-[2] int32 element seed (unused when not training).
        """
        return self._apply(image, seed, None)[0]

    def apply_with_targets(
        self, image: tf.Tensor, targets: ElementTargets, seed: tf.Tensor | None
    ) -> tuple[tf.Tensor, ElementTargets]:
        """`apply` moving the image's targets with it: every op draws its random
        parameters once, from its seed, for both. The image equals `apply`'s."""
        image, moved = self._apply(image, seed, targets)
        if moved is None:  # cannot happen: given targets, every step returns them
            raise RuntimeError("the augmenter lost the targets")
        return image, moved.materialized()

    def _apply(self, image, seed, targets: ElementTargets | None) -> _Element:
        window = self._leading_window()
        if window is None:
            return self._after_window(image, seed, targets, first=0)
        first = self.element_ops[0]
        shape = tf.shape(image)[:2]
        offset, size = window.sample(shape, self._first_seed(seed), **first.kwargs)
        if targets is not None:
            targets = targets.deferring_moves().crop(offset, size, shape)
        return self._after_window(slice_window(image, offset, size), seed, targets, first=1)

    def _leading_window(self):
        ops = self.element_ops
        if not ops:
            return None
        definition = ops[0].definition
        return definition.window if self.training else definition.inference_window

    def _first_seed(self, seed: tf.Tensor | None) -> tf.Tensor | None:
        return self._op_seed(seed, 0) if self.training else None

    def decode_and_apply(
        self,
        features: dict,
        seed: tf.Tensor | None,
        *,
        encoding: str,
        channels: int,
        image_size: Sequence[int] | None,
        uint8: bool = False,
    ) -> tf.Tensor:
        """Decodes a parsed record's image and applies the element ops.

        Equal to ``apply(decode_image(...), seed)``; faster for JPEG when the
        first op is a crop, because only its window is decoded. With `uint8`,
        the image may come back as uint8 (the float result on the 0..255
        scale, rounded) where the last op can finish that way more cheaply;
        else it is float32 in [0, 1].
        """
        return self._decode_and_apply(
            features,
            seed,
            None,
            encoding=encoding,
            channels=channels,
            image_size=image_size,
            uint8=uint8,
        )[0]

    def decode_and_apply_with_targets(
        self,
        features: dict,
        targets: ElementTargets,
        seed: tf.Tensor | None,
        *,
        encoding: str,
        channels: int,
        image_size: Sequence[int] | None,
        uint8: bool = False,
        defer_objects: bool = False,
    ) -> tuple[tf.Tensor, ElementTargets]:
        """`decode_and_apply` moving the record's targets with the image
        (equal to `apply_with_targets` on the decoded image).

        With `defer_objects`, a crop's and its flips' moves of boxes and
        keypoints that are still deferred at the end are left to the caller,
        in the targets' `moves` (see `kiln.reader.targets.move_batch_objects`)."""
        image, moved = self._decode_and_apply(
            features,
            seed,
            targets,
            encoding=encoding,
            channels=channels,
            image_size=image_size,
            uint8=uint8,
        )
        if moved is None:  # cannot happen: given targets, every step returns them
            raise RuntimeError("the augmenter lost the targets")
        cropped = moved.moves is not None and moved.moves.window is not None
        return image, moved.materialized(objects=not (defer_objects and cropped))

    def _decode_and_apply(
        self,
        features: dict,
        seed: tf.Tensor | None,
        targets: ElementTargets | None,
        *,
        encoding: str,
        channels: int,
        image_size: Sequence[int] | None,
        uint8: bool = False,
    ) -> _Element:
        ops = self.element_ops
        window = self._leading_window() if encoding == "jpeg" else None
        if window is None:
            image = decode(features, encoding=encoding, channels=channels, image_size=image_size)
            return self._apply(image, seed, targets)
        encoded = features["image"]
        # The stored size, known without reading the JPEG header when the
        # dataset has one size.
        shape = (
            tf.constant(list(image_size), tf.int32)
            if image_size is not None
            else tf.io.extract_jpeg_shape(encoded)[:2]
        )
        offset, size = window.sample(shape, self._first_seed(seed), **ops[0].kwargs)
        start = tf.maximum(offset - _JPEG_WINDOW_MARGIN, 0)
        end = tf.minimum(offset + size + _JPEG_WINDOW_MARGIN, shape)
        wide = tf.io.decode_and_crop_jpeg(
            encoded, tf.concat([start, end - start], 0), channels=channels
        )
        cropped = slice_window(wide, offset - start, size)
        if targets is not None:
            targets = targets.deferring_moves().crop(offset, size, shape)
        return self._after_window(cropped, seed, targets, first=1, uint8=uint8)

    def _after_window(
        self,
        image: tf.Tensor,
        seed: tf.Tensor | None,
        targets: ElementTargets | None,
        first: int,
        uint8: bool = False,
    ) -> _Element:
        """The ops from index `first` on, given the (uint8) crop window or whole image.

        With a leading crop (``first == 1``) its finishing step (e.g. the
        resize) runs after the mirror and pixelwise ops that follow it (see
        the module docstring); the targets were cropped with the window.
        """
        ops = self.element_ops
        index = first
        if first == 1:
            while index < len(ops) and ops[index].definition.mirror:
                image, targets = self._run_one(image, seed, targets, index)
                index += 1
            end = index
            while end < len(ops) and ops[end].definition.pixelwise:
                end += 1
            window = self._leading_window()
            crop = ops[0]
            # uint8 output right after the colour ops: the last one gives
            # levels, which the crop's resize keeps and a cast rounds.
            last = ops[end - 1].definition.levels if index < end == len(ops) else None
            finish_levels = window.finish_levels if uint8 and self.training else None
            if last is None or finish_levels is None:
                last = finish_levels = None
            # The first colour op scales the uint8 window inside its own pass.
            while index < end - (last is not None):
                image, targets = self._run_one(image, seed, targets, index)
                index += 1
            finished = None
            if last is not None and finish_levels is not None:
                image = last(image, self._op_seed(seed, index), **ops[index].kwargs)
                finished = finish_levels(image, **crop.kwargs)
            elif uint8 and index == len(ops) and window.finish_uint8 is not None:
                # The crop's finish is the last step: straight to uint8.
                window_image = image
                finished = self._call(
                    crop, lambda: window.finish_uint8(window_image, **crop.kwargs), window_image
                )
            if finished is not None:
                if targets is not None:
                    targets = _finish_targets(targets, finished)
                return finished, targets
            image = to_float(image)
            image = self._call(crop, lambda: window.finish(image, **crop.kwargs), image)
            if targets is not None:
                targets = _finish_targets(targets, image)
            return self._run(image, seed, targets, first=index)
        return self._run(to_float(image), seed, targets, first=index)

    def apply_batch(
        self, images: tf.Tensor, labels: tf.Tensor, element_seeds: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Batch ops (mixup, cutmix) on a float batch and one-hot float labels."""
        ops = self.batch_ops
        if not ops:
            return images, labels
        seed = seeding.batch_seed(element_seeds)
        for index, augmentation in enumerate(ops):
            op_seed = tf.random.fold_in(seed, tf.constant(index, tf.int32))
            images, labels = augmentation.definition.fn(
                images, labels, op_seed, **augmentation.kwargs
            )
        return images, labels

    def apply_batch_with_targets(
        self, images: tf.Tensor, targets: BatchTargets, element_seeds: tf.Tensor
    ) -> tuple[tf.Tensor, BatchTargets]:
        """Batch ops on a float batch and its targets (see `kiln.reader.mixing`)."""
        ops = self.batch_ops
        if not ops:
            return images, targets
        seed = seeding.batch_seed(element_seeds)
        for index, augmentation in enumerate(ops):
            op_seed = tf.random.fold_in(seed, tf.constant(index, tf.int32))
            with_targets = augmentation.definition.with_targets
            if with_targets is None:  # refused by `check_targets` before any data
                raise TargetError(f"{augmentation.name} cannot mix targets")
            images, targets = with_targets(images, targets, op_seed, **augmentation.kwargs)
        return images, targets

    def check_dataset(
        self,
        spec: TargetSpec,
        *,
        channels: int,
        image_size: Sequence[int] | None,
        field: str = "augment",
        stored: str = STORED_SIZE,
    ) -> None:
        """Refuses, before any data is read, a list this dataset cannot take.

        The checks that need only what is known of the dataset: its target
        kinds (`check_targets`), its channels (`check_channels`) and its
        stored size, when it has one (`check_sizes`). `load`,
        `load_for_model` and `kiln build` (`check_stored_list`) all run
        this, so a list the build stores is one `load` accepts.

        Raises:
          TargetError: for an op that cannot move or mix the targets.
          AugmentConfigError: for an op that needs RGB or a larger image.
          Either names the op (``augment[2].random_hue``).
        """
        self.check_targets(spec, field)
        self.check_channels(channels, field)
        self.check_sizes(image_size, field, stored=stored)

    def check_channels(
        self, channels: int, field: str = "augment", *, whose: str = "this dataset's images"
    ) -> None:
        """Refuses, before any data is read, an op that needs RGB images the
        dataset does not have (the op would fail when first traced).

        Only the ops that run are checked: all of them in training, those
        with an inference form otherwise. `whose`: the images the channels
        are of, for the message.

        Raises:
          AugmentConfigError: naming the op and the channels.
        """
        if channels == 3:
            return
        for index, augmentation in enumerate(self.element_ops):
            definition = augmentation.definition
            if definition.needs_rgb is None or not self._runs(definition):
                continue
            if definition.needs_rgb(**augmentation.kwargs):
                raise AugmentConfigError(
                    f"{field}[{index}].{augmentation.name}: needs 3-channel (RGB) images; "
                    f"{whose} have {channels} channel(s)"
                    + (
                        " (image.channels in its build config)"
                        if whose == "this dataset's images"
                        else ""
                    )
                )

    def check_sizes(
        self,
        image_size: Sequence[int] | None,
        field: str = "augment",
        *,
        stored: str = STORED_SIZE,
    ) -> None:
        """Refuses, before any data is read, an op given images smaller than it needs.

        Follows the size through the element ops (a crop sets it, kiln's other
        ops keep it) from the stored `image_size`; stops where it becomes
        unknown (images of varying size, or after a user's op). The check is
        the same in training and inference: a crop's inference form keeps its
        size.

        Args:
          image_size: ``[height, width]`` of every stored image, or None.
          field: The list's name in messages.
          stored: What `image_size` is the size of, for messages.

        Raises:
          AugmentConfigError: naming the op, its size and the size it gets.
        """
        size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
        source = stored
        for index, augmentation in enumerate(self.element_ops):
            if size is None:
                return
            definition = augmentation.definition
            if definition.smallest_input is not None:
                needed = definition.smallest_input(**augmentation.kwargs)
                if needed[0] > size[0] or needed[1] > size[1]:
                    raise AugmentConfigError(
                        f"{field}[{index}].{augmentation.name}: size {list(needed)} "
                        f"(height, width) does not fit in {list(size)}, the size of {source}"
                    )
            if definition.output_size is not None:
                height, width = definition.output_size(**augmentation.kwargs)
                size = (int(height), int(width))
                source = f"the output of {field}[{index}].{augmentation.name}"
            elif not definition.builtin:
                size = None

    def check_targets(self, spec: TargetSpec, field: str = "augment") -> None:
        """Refuses, before any data is read, ops that cannot move this dataset's targets.

        Batch ops are checked also where they do not run (``training=False``,
        evaluation): a list that cannot train on the dataset is wrong there too.

        Raises:
          TargetError: naming the op (``augment[1].random_zoom``) and why.
        """
        for index, augmentation in enumerate(self.element_ops):
            definition = augmentation.definition
            where = f"{field}[{index}].{augmentation.name}"
            if definition.targets_problem is not None and self._runs(definition):
                problem = definition.targets_problem(spec.kinds, **augmentation.kwargs)
                if problem:
                    raise TargetError(f"{where}: {problem}")
            if definition.window is not None:
                continue  # the reader crops targets with the window
            refuse_unsupported(
                augmentation.name,
                definition.supports if definition.with_targets is not None else None,
                definition.geometric,
                spec,
                where=where,
            )
            if (
                not self.training
                and spec.geometric
                and definition.geometric
                and not definition.builtin
                and definition.inference is not None
                and definition.inference_with_targets is None
            ):
                raise TargetError(
                    f"{where}: augmentation op {augmentation.name!r}: its inference form may "
                    f"move pixels and cannot move this dataset's {list(spec.geometric)}; "
                    f"register it with inference_with_targets=fn(image, targets, **params) -> "
                    f"(image, targets) (the inference form moving the targets too), or with "
                    f"geometric=False if it moves no pixel"
                )
        for index, augmentation in enumerate(self.augmentations):
            if augmentation.definition.kind != "batch":
                continue
            supported = augmentation.definition.supports or ()
            kinds = [k for k in spec.kinds if k != "label" and k not in supported]
            if kinds:
                raise TargetError(
                    f"{field}[{index}].{augmentation.name}: batch op "
                    f"{augmentation.name!r} cannot mix this dataset's targets "
                    f"{kinds}: it handles {['label', *supported]} only. Mixing two images' "
                    f"{kinds[0]} has no single right answer; drop {augmentation.name} from the "
                    f"augmentation list for this dataset"
                )

    def _runs(self, definition) -> bool:
        """Whether the op runs in this augmenter: its random form in
        training, else its inference form, if it has one."""
        return self.training or definition.inference is not None

    def _run(
        self, image: tf.Tensor, seed: tf.Tensor | None, targets: ElementTargets | None, first: int
    ) -> _Element:
        for index in range(first, len(self.element_ops)):
            image, targets = self._run_one(image, seed, targets, index)
        return image, targets

    def _run_one(
        self, image: tf.Tensor, seed: tf.Tensor | None, targets: ElementTargets | None, index: int
    ) -> _Element:
        augmentation = self.element_ops[index]
        definition = augmentation.definition
        kwargs = augmentation.kwargs
        if targets is not None and not (
            definition.builtin and (definition.mirror or definition.pixelwise)
        ):
            # Deferred mask moves (`MaskGrid`) are for kiln's flips (colour
            # ops leave targets alone): any other op gets moved masks.
            targets = targets.materialized()
        if self.training:
            if not definition.builtin:
                # First use: check the user op on an image of the shape it
                # gets here, eagerly, outside the graph being traced.
                known = image.shape.rank == 3 and image.shape[:2].is_fully_defined()
                with tf.init_scope():
                    check_op(augmentation, _shape_for_check(image.shape), targets, known=known)
            op_seed = self._op_seed(seed, index)
            if targets is None:
                return self._call(
                    augmentation, lambda: definition.fn(image, op_seed, **kwargs), image
                ), None
            if definition.window is not None:
                return self._window_with_targets(
                    augmentation, definition.window, image, targets, op_seed
                )
            with_targets = definition.with_targets
            if with_targets is not None:
                return self._call(
                    augmentation,
                    lambda: checked_with_targets(
                        augmentation.name, with_targets(image, targets, op_seed, **kwargs)
                    ),
                    image,
                )
            # Checked by `check_targets`: the op moves no pixels, or the
            # dataset has no geometric targets.
            return self._call(
                augmentation, lambda: definition.fn(image, op_seed, **kwargs), image
            ), targets
        if targets is not None and definition.inference_window is not None:
            return self._window_with_targets(
                augmentation, definition.inference_window, image, targets, None
            )
        inference_with_targets = definition.inference_with_targets
        if targets is not None and inference_with_targets is not None:
            return self._call(
                augmentation,
                lambda: checked_with_targets(
                    augmentation.name,
                    inference_with_targets(image, targets, **kwargs),
                    "inference_with_targets",
                ),
                image,
            )
        if definition.inference is not None:
            return self._call(
                augmentation, lambda: definition.inference(image, **kwargs), image
            ), targets
        return image, targets

    def _window_with_targets(
        self, augmentation, window, image, targets: ElementTargets, seed
    ) -> tuple[tf.Tensor, ElementTargets]:
        """A cropping op anywhere in the list: the window crops image and targets."""
        shape = tf.shape(image)[:2]
        offset, size = window.sample(shape, seed, **augmentation.kwargs)
        cropped = slice_window(image, offset, size)
        out = self._call(
            augmentation, lambda: window.finish(cropped, **augmentation.kwargs), cropped
        )
        return out, _finish_targets(targets.deferring_moves().crop(offset, size, shape), out)

    @staticmethod
    def _op_seed(seed: tf.Tensor, index: int) -> tf.Tensor:
        return tf.random.fold_in(seed, tf.constant(index, tf.int32))

    @staticmethod
    def _call(augmentation: Augmentation, run, image: tf.Tensor):
        """`run()`: the op applied to `image` (a user op's output checked)."""
        if augmentation.definition.builtin:
            return run()
        try:
            out = run()
        except (AugmentOpError, TargetError, AugmentConfigError):
            raise  # kiln's own refusals, already in words
        except (
            AttributeError,
            NotImplementedError,
            TypeError,
            ValueError,
            tf.errors.OperatorNotAllowedInGraphError,
        ) as e:
            raise trace_error(augmentation.name, e) from e
        _check_output(augmentation.name, out[0] if isinstance(out, tuple) else out, image)
        return out


def _check_output(name: str, image: Any, given: tf.Tensor) -> None:
    """Refuses a user op's image that is not float32: every op takes and returns
    float32 in [0, 1], which the next op, ``normalize`` and the output `dtype`
    rely on (a uint8 0..255 image came out as "float" 0..255 in bfloat16); or
    whose channels are not those of the image it was `given` (an RGB to gray
    op's output would not be the dataset's ``channels``, which kiln.json,
    ``normalize`` and the model's input declare)."""
    dtype = getattr(image, "dtype", None)
    if dtype != tf.float32:
        got = getattr(dtype, "name", type(image).__name__)
        raise AugmentOpError(
            f"augmentation op {name!r} returned a {got} image; augmentation ops take and return "
            f"float32 images in [0, 1] (the next op, normalize and the output dtype rely on "
            f"it): compute in float32, or return tf.image.convert_image_dtype(image, "
            f"tf.float32) for a uint8 image"
        )
    channels = image.shape[-1] if image.shape.rank else None
    expected = given.shape[-1] if given.shape.rank else None
    if channels is not None and expected is not None and channels != expected:
        raise AugmentOpError(
            f"augmentation op {name!r} returned an image of {channels} channels from one "
            f"of {expected}; augmentation ops keep the dataset's channels (kiln.json "
            f"'channels', which normalize and the model's input rely on): convert channels "
            f"in the model, or store them so with the build's transforms"
        )


def check_stored_list(
    augmentations: Sequence[Augmentation],
    spec: TargetSpec,
    *,
    channels: int,
    image_size: Sequence[int] | None,
    field: str = "augment",
    stored: str = STORED_SIZE,
) -> None:
    """`Augmenter.check_dataset` for a dataset's stored list, in both forms
    `load` runs it in: random (the train split's default) and the inference
    form (every other split). What `kiln build` checks before it stores a
    list, so that `load` accepts what the build publishes.

    Raises:
      TargetError, AugmentConfigError: as `Augmenter.check_dataset`.
    """
    for training in (True, False):
        Augmenter(tuple(augmentations), training=training).check_dataset(
            spec, channels=channels, image_size=image_size, field=field, stored=stored
        )


def _finish_targets(targets: ElementTargets, image: tf.Tensor) -> ElementTargets:
    """Masks brought to the size of the finished (e.g. resized) crop, and
    moved: the crop, the flips after it and this resize in one gather. The
    objects' moves stay deferred (a resize does not move normalized
    coordinates): later ops other than flips materialize them."""
    if not targets.has_masks:
        return targets
    static = image.shape[:2]
    size = static.as_list() if static.is_fully_defined() else tf.shape(image)[:2]
    return targets.resize_masks(size).materialized(objects=False)


def decode(
    features: dict, *, encoding: str, channels: int, image_size: Sequence[int] | None
) -> tf.Tensor:
    """The stored image of a parsed record as uint8, with a static shape when known."""
    image = decode_image(
        features["image"], features["height"], features["width"], channels, encoding
    )
    if image_size is not None:
        image = tf.ensure_shape(image, [image_size[0], image_size[1], channels])
    return image


def standardize(images: tf.Tensor, mean: Sequence[float], std: Sequence[float]) -> tf.Tensor:
    """``(pixel - mean) / std`` on the 0..255 scale, for float images in [0, 1].

    Computed as ``(image - mean / 255) * (255 / std)`` with the constants
    folded in float64: a Sub then a Mul, which graph optimizers leave alone
    (a Mul next to the ``* (1 / 255)`` of decoding would be merged with it),
    so the data path and the layer round alike.
    """
    mean01 = np.asarray(mean, np.float64) / 255.0
    scale = 255.0 / np.asarray(std, np.float64)
    return (images - tf.constant(mean01, tf.float32)) * tf.constant(scale, tf.float32)


def _shape_for_check(shape: tf.TensorShape) -> tuple[int, int, int]:
    dims = shape.as_list() if shape.rank == 3 else [None, None, 3]
    height, width, channels = (
        d if d is not None else default for d, default in zip(dims, (64, 64, 3), strict=True)
    )
    return height, width, channels


# --- first-use checks of user ops -----------------------------------------------------

_CHECKED: set = set()
_CHECK_SEEDS = 64
# The test images' sides when the op's input size is not known (`check_op`).
_CHECK_SIDES = (64, 256, 1024)
# Fresh traces compared when every seed gives one output (see `check_op`).
_CHECK_TRACES = 8

_TRACE_PITFALL = (
    "Dataset.map traces an op once into a graph; Python and NumPy code in it "
    "(random.random(), np.random.*, .numpy(), if on a tensor) runs once, while "
    "tracing, and its result is baked into the graph as a constant."
)


def check_op(
    augmentation: Augmentation,
    shape: Sequence[int],
    targets: ElementTargets | None = None,
    *,
    known: bool = True,
) -> None:
    """Rejects a user op whose randomness is not its seed's, or that needs Python values of tensors.

    Traces the op once, like `tf.data` does, and runs the trace on one input
    image with `_CHECK_SEEDS` different seeds. When every seed gives the
    same output, the op either draws its random values while being traced
    (Python's `random`, NumPy: baked into the graph, the same for every
    element and epoch) or is deterministic with these parameters (a
    probability of 1, a range ``[1, 1]``, a shift of at most 0 pixels). The
    two are told apart by tracing it again, `_CHECK_TRACES` times, afresh:
    randomness drawn while tracing gives another graph, hence another output,
    on some trace (or moves Python's or NumPy's global random state while
    tracing); a deterministic op gives the same output on every trace, and is
    accepted (logged at INFO). An op whose outputs do follow its seed is
    refused too when tracing it moved Python's or NumPy's global random
    state: that draw is a constant of the process, another in every run.
    kiln's own ops are trusted and skipped; results are cached per
    (function, params, shape, targets).

    On a dataset with targets an op with a ``with_targets`` form runs that
    form, so that is what is checked: on the test image and test targets of
    the dataset's kinds (`_test_targets`), every output tensor compared.

    Args:
      augmentation: The configured op.
      shape: ``[height, width, channels]`` of the test image (the dataset's
        image size when known).
      targets: The targets the op gets in the pipeline (symbolic: their
        names, dtypes and spec are what is used), or None.
      known: Whether `shape` is the size the op gets. False (the images vary
        in size): the test image is 64x64, or 256x256 or 1024x1024 if the op
        fails on smaller ones; if it fails on all, the op is not checked
        (a warning says so).

    Raises:
      AugmentOpError: if the op fails on an image of the size it gets, if
        the op's output changes from trace to trace but
        not with the seed (randomness baked in while tracing), if tracing
        it draws from Python's or NumPy's global random generator, if the same
        seed gives different outputs (stateful randomness), or if tracing
        fails because the op converts a tensor to a Python/NumPy value,
        or if an op without an inference form changes the image size.
    """
    definition = augmentation.definition
    if definition.builtin or definition.kind != "element":
        return
    if targets is None or definition.with_targets is None:
        targets = None
    # Keyed by the functions too: a new function under a known name is checked again.
    cache_key = (
        definition.fn,
        augmentation,
        tuple(shape),
        known,
        None if targets is None else _targets_key(definition.with_targets, targets),
    )
    if cache_key in _CHECKED:
        return
    name = augmentation.name
    # The test image: the size the op gets, or when that varies (`known`
    # False) the first size it runs on: an op may need a larger image (a
    # crop of 100 pixels) than the first guess.
    sizes = [tuple(shape)] if known else [(side, side, shape[2]) for side in _CHECK_SIDES]
    failed: tf.errors.OpError | None = None
    for size in sizes:
        try:
            _check_on(augmentation, size, targets)
        except tf.errors.OpError as e:  # the op failed running on the test image
            if known:
                raise AugmentOpError(
                    f"augmentation op {name!r} failed on an image of the size it gets here "
                    f"({size[0]}x{size[1]}x{size[2]}): {type(e).__name__}: {_op_error(e)}"
                ) from None
            failed = e
            continue
        except AugmentOpError as e:
            # A shape's ValueError while tracing (a crop larger than the test
            # image, checked statically): another size may do, where it varies.
            if known or not _shape_problem(e) or size == sizes[-1]:
                raise
            continue
        break
    else:
        # Not checked: the images vary in size, and the op failed on every
        # test size; training still runs it on the real images.
        logger.warning(
            "augmentation op %r could not be checked for its randomness: it failed on test "
            "images of %s pixels (the dataset's images vary in size): %s",
            name,
            ", ".join(f"{side}x{side}" for side in _CHECK_SIDES),
            _op_error(failed) if failed is not None else "",
        )
    _CHECKED.add(cache_key)


def _shape_problem(error: AugmentOpError) -> bool:
    """Whether tracing an op failed with a ValueError of its own (a shape it
    cannot take), not kiln's refusal of what it does."""
    cause = error.__cause__
    return isinstance(cause, ValueError) and not isinstance(
        cause, (AugmentOpError, TargetError, AugmentConfigError)
    )


def _op_error(error: tf.errors.OpError) -> str:
    """What a TensorFlow op said (``assertion failed: [Need value.shape >=
    size, ...]``), without the function it ran in or the stack of where it
    was defined that TensorFlow puts first in a graph's errors."""
    lines = [line.strip() for line in error.message.splitlines()]
    said = [
        line
        for line in lines
        if line
        and not line.startswith(("Graph execution error", "Detected at node", "File ", "[["))
    ]
    text = first_line(RuntimeError(said[0] if said else error.message))
    return re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)


def _check_on(
    augmentation: Augmentation, shape: Sequence[int], targets: ElementTargets | None
) -> None:
    """`check_op` on one test image of `shape`."""
    name = augmentation.name
    # A fixed, asymmetric image, so flips and crops visibly change it.
    image = tf.constant(np.random.default_rng(0).random(tuple(shape), dtype=np.float32))
    test_targets = None if targets is None else _test_targets(targets, shape)
    seeds = tf.random.experimental.stateless_split(tf.constant([20240, 7], tf.int32), _CHECK_SEEDS)
    before = _global_random_state()
    run = _trace(augmentation, image, test_targets)
    drew = _global_random_state() != before
    outputs = [run(image, seeds[i]) for i in range(_CHECK_SEEDS)]
    if all(_equal(outputs[0], out) for out in outputs[1:]):
        _check_deterministic(augmentation, image, test_targets, seeds[0], outputs[0], drew)
    if drew:
        # It uses its seed, and a global draw besides: a constant of this
        # trace, so of this process; another process (a rerun, another
        # host) bakes in another value, and the same seed another stream.
        raise AugmentOpError(
            f"augmentation op {name!r} draws from Python's or NumPy's global random generator "
            f"while being traced: the value it draws is the same for every element and epoch, "
            f"and another in every process, so the same seed gives another stream in every "
            f"run. {_TRACE_PITFALL} Draw every random value from the `seed` argument with "
            f"tf.random.stateless_uniform / tf.random.stateless_* or "
            f"tf.image.stateless_random_* (split it with tf.random.split for several draws)."
        )
    # Every seed again: a stateful coin (``tf.random.uniform([]) < 0.5``) gives
    # one seed's output again half the time, and 64 of them all alike hardly ever.
    again = [run(image, seeds[i]) for i in range(_CHECK_SEEDS)]
    if not all(_equal(out, repeat) for out, repeat in zip(outputs, again, strict=True)):
        raise AugmentOpError(
            f"augmentation op {name!r} gave different outputs for the same seed: it uses "
            f"stateful randomness (tf.random.uniform, tf.random.Generator, a Keras random "
            f"layer), which is not reproducible under a parallel tf.data map. Draw random "
            f"values from the `seed` argument with tf.random.stateless_* or "
            f"tf.image.stateless_random_* instead."
        )
    _check_size_kept(augmentation, shape, [out[0] for out in outputs])


def _equal(one: Sequence[np.ndarray], other: Sequence[np.ndarray]) -> bool:
    """Whether two runs of an op gave the same tensors (`_trace`'s outputs)."""
    return len(one) == len(other) and all(
        np.array_equal(a, b) for a, b in zip(one, other, strict=True)
    )


def _targets_key(with_targets, targets: ElementTargets) -> tuple:
    """What `check_op`'s test targets are made of: the op's targets form, the
    spec, and each tensor's name and dtype."""
    dtypes = tuple(sorted((name, t.dtype.name) for name, t in targets.tensors.items()))
    return (with_targets, targets.spec, dtypes)


# Test objects for `_test_targets`: ``[y_min, x_min, y_max, x_max]``, normalized.
_TEST_BOXES = ((0.1, 0.2, 0.6, 0.7), (0.3, 0.1, 0.9, 0.5), (0.55, 0.5, 0.95, 0.9))


def _test_targets(targets: ElementTargets, shape: Sequence[int]) -> ElementTargets:
    """Targets of the same names, dtypes and spec as `targets` (the pipeline's,
    symbolic), with values: three objects (boxes, classes, fields, keypoints
    inside their boxes, instance masks filling them), a semantic mask of
    the image's size with a few classes, zeros for labels and extras."""
    height, width = int(shape[0]), int(shape[1])
    rng = np.random.default_rng(1)
    boxes = np.array(_TEST_BOXES, np.float32)
    count = len(boxes)
    points = max(len(targets.spec.keypoint_names), 1)
    object_columns = targets.spec.object_columns
    values = {}
    for name, tensor in targets.materialized().tensors.items():
        if name == "boxes":
            value: Any = boxes
        elif name == "keypoints":
            low, high = boxes[:, None, :2], boxes[:, None, 2:]
            value = low + rng.uniform(0.1, 0.9, (count, points, 2)) * (high - low)
        elif name == "keypoint_visibility":
            value = np.full((count, points), 2)
        elif name == "mask":
            value = rng.integers(0, 4, (height, width, 1))
        elif name == "instance_masks":
            value = np.zeros((count, height, width, 1))
            for index, (y0, x0, y1, x1) in enumerate(boxes):
                rows = slice(int(y0 * height), max(int(y1 * height), int(y0 * height) + 1))
                cols = slice(int(x0 * width), max(int(x1 * width), int(x0 * width) + 1))
                value[index, rows, cols] = 1
        elif name in object_columns:  # classes and the declared fields
            value = np.arange(1, count + 1)
        else:  # label, labels, extras: passed through
            rank = tensor.shape.rank or 0
            dims = [d if d is not None else 2 for d in tensor.shape.as_list()] if rank else []
            value = np.full(dims, b"" if tensor.dtype == tf.string else 0, object)
        values[name] = tf.constant(value, dtype=tensor.dtype)
    return ElementTargets(values, targets.spec)


def _check_size_kept(
    augmentation: Augmentation, shape: Sequence[int], outputs: Sequence[np.ndarray]
) -> None:
    """Refuses an op without an inference form that changes the image size:
    where no random augmentation runs (other splits, ``training=False``, the
    layer outside training) it is skipped, and those images would keep
    their size while training's change."""
    if augmentation.definition.inference is not None:
        return
    size = (int(shape[0]), int(shape[1]))
    changed = [out.shape[:2] for out in outputs if tuple(out.shape[:2]) != size]
    if not changed:
        return
    name = augmentation.name
    out_height, out_width = changed[0]
    raise AugmentOpError(
        f"augmentation op {name!r} changes the image size ({size[0]}x{size[1]} in, "
        f"{out_height}x{out_width} out) and was registered without an inference= form: where "
        f"no random augmentation runs (other splits, training=False, the model's layer outside "
        f"training) it is skipped, and those images keep their size, so the model would train "
        f"and evaluate on two scales. Give it a deterministic form with the same output size: "
        f"register_augmentation({name!r}, inference=fn), fn(image, **params) (a centre crop or "
        f"a resize)."
    )


def _trace(augmentation: Augmentation, image: tf.Tensor, targets: ElementTargets | None):
    """A fresh trace of the op (a new `tf.function`), as `tf.data` traces it:
    ``run(image, seed)`` gives its outputs as arrays, the image first; with
    `targets`, of its ``with_targets`` form, then every target tensor by name."""
    definition, kwargs = augmentation.definition, augmentation.kwargs
    name, with_targets = augmentation.name, definition.with_targets

    def op(img, seed):
        if targets is None or with_targets is None:
            return [checked_image(name, definition.fn(img, seed, **kwargs))]
        out = with_targets(img, targets, seed, **kwargs)
        out_image, moved = checked_with_targets(name, out)
        tensors = moved.materialized().tensors
        return [out_image, *(tensors[key] for key in sorted(tensors))]

    # autograph=False: the reader does not convert ops either (see dataset.py).
    traced = tf.function(op, autograph=False)
    try:
        concrete = traced.get_concrete_function(
            tf.TensorSpec(image.shape, tf.float32), tf.TensorSpec([2], tf.int32)
        )
    except AugmentOpError:
        raise
    except Exception as e:  # the message depends on what the op did; explain all alike
        raise trace_error(name, e) from e
    _refuse_python_calls(name, concrete.graph.as_graph_def())
    return lambda img, seed: [t.numpy() for t in concrete(img, seed)]


# The ops `tf.py_function`, `tf.numpy_function` and `tf.compat.v1.py_func` put in a graph.
_PYTHON_CALL_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})


def _refuse_python_calls(name: str, graph: Any) -> None:
    """Refuses an op whose graph (its nested functions too: a `tf.cond`'s
    branches) calls back into Python: the call holds the GIL, and a dataset
    holding it cannot be checkpointed ("PyFunc is stateful"), serialized or
    run by a tf.data service worker, which is what kiln's ops promise."""
    nodes = [*graph.node, *(node for f in graph.library.function for node in f.node_def)]
    calls = sorted({node.op for node in nodes if node.op in _PYTHON_CALL_OPS})
    if calls:
        raise AugmentOpError(
            f"augmentation op {name!r} calls Python per element (tf.py_function or "
            f"tf.numpy_function: {', '.join(calls)} in its graph): it holds the GIL, loses "
            f"static shapes, and a dataset running it cannot be checkpointed, serialized or "
            f"run by a tf.data service worker. Write it in TensorFlow ops, or do the work "
            f"offline in kiln build (a registered transform); `kiln lint` finds such calls "
            f"(K107)."
        )


def checked_image(name: str, out: Any) -> Any:
    """A user op's output, if it is one tensor (the image)."""
    if not isinstance(out, (tf.Tensor, np.ndarray)):
        raise AugmentOpError(
            f"augmentation op {name!r} returned a {_type_name(out)}; an op returns the "
            f"image, one float32 tensor"
        )
    return out


def _type_name(value: Any) -> str:
    return "tensor" if isinstance(value, tf.Tensor) else type(value).__name__


def checked_with_targets(
    name: str, out: Any, form: str = "with_targets"
) -> tuple[Any, ElementTargets]:
    """A user op's `form` output (``with_targets``, ``inference_with_targets``),
    if it is ``(image, targets)``."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], ElementTargets)):
        got = (
            f"a tuple of {', '.join(map(_type_name, out))}"
            if isinstance(out, tuple)
            else f"a {_type_name(out)}"
        )
        raise AugmentOpError(
            f"the {form} form of augmentation op {name!r} returned {got}; it returns "
            f"(image, targets): the image and the ElementTargets it was given, moved as the "
            f"image was (targets.crop, targets.warp, ...)"
        )
    checked_image(name, out[0])
    return out


def _check_deterministic(
    augmentation: Augmentation,
    image: tf.Tensor,
    targets: ElementTargets | None,
    seed: tf.Tensor,
    output: Sequence[np.ndarray],
    drew: bool,
) -> None:
    """For an op whose every seed gave `output`: refuses it if its randomness
    was drawn while tracing (`drew`: Python's or NumPy's global random state
    moved; or a fresh trace gives another output), else accepts it as
    deterministic with these parameters."""
    name, kwargs = augmentation.name, augmentation.kwargs
    drawing = "tracing it drew from Python's or NumPy's global random generator"
    observed = drawing if drew else None
    for _ in range(_CHECK_TRACES):
        if observed is not None:
            break
        before = _global_random_state()
        run = _trace(augmentation, image, targets)
        if _global_random_state() != before:
            observed = drawing
        elif not _equal(run(image, seed), output):
            observed = "a fresh trace gave another"
    if observed is None:
        logger.info(
            "augmentation op %r gives the same output for every seed and on every trace: "
            "deterministic with the parameters %s (accepted)",
            name,
            kwargs,
        )
        return
    raise AugmentOpError(
        f"augmentation op {name!r} ignores its seed: {_CHECK_SEEDS} seeds gave one output, "
        f"but {observed}, so its random values come from Python or NumPy at trace time. "
        f"{_TRACE_PITFALL} Draw random values from the `seed` argument with "
        f"tf.random.stateless_uniform / tf.random.stateless_* or tf.image.stateless_random_* "
        f"(split it with tf.random.split for several draws)."
    )


def _global_random_state() -> tuple:
    """Python's and NumPy's global random states, to tell whether tracing drew from them."""
    numpy_state: dict = dict(np.random.get_state(legacy=False))
    position = numpy_state["state"]
    return (
        random.getstate(),
        position["key"].tobytes(),
        position["pos"],
        numpy_state["has_gauss"],
        numpy_state["gauss"],
    )


def trace_error(name: str, error: Exception) -> AugmentOpError:
    """Explains why op `name` could not be traced into a graph."""
    text = f"{type(error).__name__}: {error}"
    if "numpy" in str(error) or isinstance(error, NotImplementedError):
        hint = (
            "It converts a tensor to a NumPy/Python value (.numpy(), np.asarray, float(t)), "
            "which only exists in eager mode: inside tf.data the image is a symbolic "
            "tensor with no value yet. Write the op with TensorFlow ops on tensors "
            "(tf.*, tf.image.*, tf.random.stateless_*); use tf.cond or tf.where instead "
            "of `if` on a tensor. If the work needs NumPy or OpenCV and is deterministic, "
            "it belongs offline in a kiln.transforms transform."
        )
    elif isinstance(error, (tf.errors.OperatorNotAllowedInGraphError, TypeError)):
        hint = (
            "It uses a tensor as a Python value (`if tensor:`, `bool(tensor)`, a Python "
            "loop over a tensor). Use tf.cond / tf.where for data-dependent choices."
        )
    elif isinstance(error, ValueError):
        hint = (
            "Where the dataset's images vary in size, their height and width are unknown "
            "while tracing (image.shape holds None): take them from tf.shape(image)."
        )
    else:
        hint = "Write it with TensorFlow ops only."
    return AugmentOpError(
        f"augmentation op {name!r} cannot run inside tf.data: tracing it failed with {text}. "
        f"{_TRACE_PITFALL} {hint}"
    )
