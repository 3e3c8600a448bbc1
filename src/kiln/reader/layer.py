"""A Keras layer that applies a kiln augmentation list to a batch inside the model.

For `kiln.reader.load_for_model`: the dataset yields unaugmented uint8
batches plus each element's seed, and this layer augments them where the
model runs (e.g. on a GPU), with the same ops and seeds as the tf.data path,
so the results are identical. Outside training it needs images only, so a
model that contains it predicts, saves (``.keras``, loadable after
``import kiln.reader``: `kiln.reader.saving`) and exports a serving
signature on images alone. TensorFlow backend only (it calls TF ops).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from kiln.reader.augmenter import Augmenter, standardize
from kiln.reader.ops import validate
from kiln.reader.targets import ElementTargets, TargetSpec, pad_objects, unpad_objects

# As in the tf.data path: the same unconverted code, so both trace alike.
_unconverted = tf.autograph.experimental.do_not_convert

_NEEDS_SEEDS = (
    "AugmentationLayer(training=True) needs the batch's 'augment_seed' "
    "(kiln.reader.load_for_model yields it): train a model whose inputs are "
    "{'image', 'augment_seed'}, and predict or serve one on images only that "
    "shares the layers"
)


# The name `kiln.reader.saving` registers a stand-in under, for loading before this import.
@tf.keras.utils.register_keras_serializable(package="kiln", name="AugmentationLayer")
class AugmentationLayer(tf.keras.layers.Layer):
    """Augments ``{"image": uint8 [B, H, W, C], "augment_seed": int32 [B, 2]}``.

    The images must be uint8 (declare the model's input ``keras.Input(...,
    dtype="uint8")``): any other dtype is refused when the layer is called,
    since a float image cannot tell 0..255 from [0, 1], and Keras' default
    float32 Input turns the uint8 batch into float 0..255.

    With ``training=True`` (Keras passes it during `fit`) each image gets the
    element ops with its own seed; otherwise (evaluation, prediction, serving)
    each op's deterministic inference form runs and the seeds are not used:
    pass just the image batch. The output is float32 in [0, 1], or
    standardized when `mean`/`std` are given.

    A Keras model needs every one of its inputs, so train and serve two
    models that share this layer and the network after it: one on
    ``{"image", "augment_seed"}`` for `fit`, one on the image alone for
    `predict`, ``model.save`` and ``model.export`` (README: "Augmenting
    inside the model").

    With targets (``{"image", "augment_seed", "targets": {...}}``, the
    targets dict that `load_for_model` yields beside the
    batch), it returns ``(images, targets)``: boxes, masks and keypoints
    moved with their images exactly as in the tf.data path. Targets it
    would move (boxes and the other per-object columns, masks) anywhere
    else in the dict, as in the flat dict of ``load_for_model(...,
    as_supervised=False)``, are refused: the layer returns images only,
    and those targets would no longer match them. So are targets under
    ``"targets"`` that the dataset does not declare (a ``mask`` for a
    classification dataset, a misspelt name), which it would return unmoved;
    some of the columns that move objects together without the others (boxes
    without the dataset's instance masks, keypoints without their
    visibility: `_check_whole_objects`); padded per-object columns without
    ``num_objects``; and, in training, images alone of a dataset whose boxes, masks or
    keypoints its ops would move.

    Args:
      augment: Augmentation list in YAML form (element ops only).
      random: False applies only the inference form, even in training.
      mean: Per-channel mean on the 0..255 scale, to standardize the output.
      std: Per-channel standard deviation on the 0..255 scale.
      targets: The dataset's resolved targets (kiln.json ``targets``, which
        `load` passes), needed to move targets.
    """

    def __init__(
        self,
        augment: Sequence[Any],
        *,
        random: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        targets: Mapping[str, Any] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # Keras compiles a model's steps with XLA where a GPU is present
        # (jit_compile="auto") unless a layer says it cannot be, as Keras' own
        # RandomCrop and RandomRotation do. XLA has no kernel for
        # random_resized_crop's StatelessSampleDistortedBoundingBox nor for the
        # rotation's and zoom's ImageProjectiveTransformV3 (fit fails before its
        # first step), and its stateless random ops draw other numbers than
        # the tf.data path's (crops, flips and colours unlike load's).
        self.supports_jit = False
        augmentations = tuple(validate(augment, field="AugmentationLayer.augment"))
        if any(a.definition.kind != "element" for a in augmentations):
            raise ValueError(
                "AugmentationLayer applies element ops only; mixup and cutmix "
                "change labels and must run in the tf.data pipeline"
            )
        if (mean is None) != (std is None):
            raise ValueError("AugmentationLayer: give both mean and std, or neither")
        self.augment = [a.to_json() for a in augmentations]
        self.random = random
        self.mean = None if mean is None else [float(m) for m in mean]
        self.std = None if std is None else [float(s) for s in std]
        self._random = Augmenter(augmentations, training=True)
        self._inference = Augmenter(augmentations, training=False)
        self.targets = None if targets is None else dict(targets)
        self._spec = TargetSpec.from_json(self.targets)
        if not self._spec.classification_only:
            self._random.check_targets(self._spec)
            self._inference.check_targets(self._spec)

    def build(self, input_shape):
        """Refuses, when the model is built, images the ops cannot take: an
        op that needs RGB on 1-channel images, a crop larger than the
        images (as `load` does for a dataset), when the shape says."""
        shape = input_shape.get("image") if isinstance(input_shape, Mapping) else input_shape
        if shape is not None:
            shape = tf.TensorShape(shape)
            if shape.rank == 4 and shape[-1] is not None:
                whose = "the layer's input images"
                for augmenter in (self._random, self._inference):
                    augmenter.check_channels(
                        int(shape[-1]), "AugmentationLayer.augment", whose=whose
                    )
            if shape.rank == 4 and shape[1] is not None and shape[2] is not None:
                for augmenter in (self._random, self._inference):
                    augmenter.check_sizes(
                        (int(shape[1]), int(shape[2])),
                        "AugmentationLayer.augment",
                        stored="the layer's input images",
                    )
        super().build(input_shape)

    def call(self, inputs, training=None):
        images = inputs["image"] if isinstance(inputs, dict) else inputs
        _check_batch(images)
        _check_uint8(images)
        if isinstance(inputs, dict):
            images, seeds = inputs["image"], inputs.get("augment_seed")
            if inputs.get("targets") is not None:
                _check_known_targets(inputs["targets"], self._spec)
                _check_padding_counted(inputs["targets"], self._spec)
                _check_whole_objects(inputs["targets"], self._spec)
                return self._call_with_targets(images, seeds, inputs["targets"], training)
            _check_no_loose_targets(inputs, self._spec)
        else:
            images, seeds = inputs, None
        if training and self.random:
            if seeds is None:
                raise ValueError(_NEEDS_SEEDS)
            _check_seeds(seeds)
            _check_targets_follow(self._random, self._spec)
            seeds = tf.cast(seeds, tf.int32)
            out = tf.map_fn(
                _unconverted(lambda pair: self._random.apply(pair[0], pair[1])),
                (images, seeds),
                fn_output_signature=tf.float32,
            )
        else:
            out = tf.map_fn(
                _unconverted(lambda image: self._inference.apply(image, None)),
                images,
                fn_output_signature=tf.float32,
            )
        if self.mean is not None and self.std is not None:  # both or neither
            out = standardize(out, self.mean, self.std)
        return out

    def _call_with_targets(self, images, seeds, targets: Mapping[str, Any], training):
        """``(images, targets)``: each element's targets moved with its image, as
        in the tf.data path: ragged per-object columns in, ragged out; padded
        ones (``load_for_model(max_objects=M)``: with ``num_objects``) in,
        padded to the same M out, ``num_objects`` counting what is left."""
        spec = self._spec
        max_objects = _padded_objects(targets, spec)
        if max_objects is not None:
            targets = unpad_objects(targets, spec)
        # Element ops move the per-object columns and the masks only; the
        # per-image label, labels (a ragged row per image) and extras pass
        # through, as in the tf.data path.
        moving = {*spec.object_columns, "mask"}
        names = [name for name in spec.names if name in targets and name in moving]
        randomly = bool(training and self.random)
        if randomly and seeds is None:
            raise ValueError(_NEEDS_SEEDS)
        augmenter = self._random if randomly else self._inference
        if seeds is None:
            seeds = tf.zeros([tf.shape(images)[0], 2], tf.int32)
        _check_seeds(seeds)
        seeds = tf.cast(seeds, tf.int32)
        columns = set(spec.object_columns)

        def one(element):
            image, seed, tensors = element
            moved_image, moved = augmenter.apply_with_targets(
                image, ElementTargets(dict(tensors), spec), seed if randomly else None
            )
            return moved_image, {name: moved.tensors[name] for name in names}

        def signature(name):
            value = targets[name]
            if name in columns:
                # Per element [N, ...]: the inner dims of boxes, classes and
                # keypoints do not change; instance masks take the size of
                # the output image, set below.
                inner = [None, None, 1] if name == "instance_masks" else value.shape[2:]
                return tf.RaggedTensorSpec(
                    tf.TensorShape([None]).concatenate(inner), value.dtype, ragged_rank=0
                )
            return tf.TensorSpec(None, value.dtype)  # the class mask: [H, W, 1]

        out, moved = tf.map_fn(
            _unconverted(one),
            (images, seeds, {name: targets[name] for name in names}),
            fn_output_signature=(
                tf.TensorSpec(None, tf.float32),
                {name: signature(name) for name in names},
            ),
        )
        if "instance_masks" in moved:
            # The image's static height and width, as in the tf.data path.
            masks = moved["instance_masks"]
            moved["instance_masks"] = masks.with_flat_values(
                tf.ensure_shape(masks.flat_values, [None, *out.shape[1:3], 1])
            )
        if self.mean is not None and self.std is not None:  # both or neither
            out = standardize(out, self.mean, self.std)
        result = dict(targets, **moved)
        if max_objects is not None:
            result = pad_objects(result, spec, max_objects, batched=True)
        return out, result

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            augment=self.augment,
            random=self.random,
            mean=self.mean,
            std=self.std,
            targets=self.targets,
        )
        return config


def _check_batch(images: Any) -> None:
    """Refuses images that are not a batch: the layer maps over the first
    dimension, which of a single image is its rows."""
    rank = tf.TensorShape(images.shape).rank
    if rank is not None and rank != 4:
        raise ValueError(
            f"AugmentationLayer augments a batch of images [batch, height, width, channels], "
            f"got shape {tf.TensorShape(images.shape)}: load_for_model without batch_size "
            f"yields single elements; pass batch_size (or batch the dataset), or add a batch "
            f"dimension to a single image"
        )


def _check_seeds(seeds: Any) -> None:
    """Refuses seeds that are not one ``[2]`` pair per image: TensorFlow's
    own words for ``[B]`` seeds are ``seed must have shape [2], not []``,
    from inside the map."""
    shape = tf.TensorShape(seeds.shape)
    if shape.rank is not None and (shape.rank != 2 or shape[1] not in (None, 2)):
        raise ValueError(
            f"AugmentationLayer takes 'augment_seed' as int32 [batch, 2], one stateless seed "
            f"pair per image (as load_for_model yields it), got shape {shape}"
        )


def _check_uint8(images: Any) -> None:
    """Refuses images that are not uint8. The layer scales uint8 0..255 to
    [0, 1]; a float image cannot say which scale it is on, and the usual one
    is a uint8 batch that a Keras Input without ``dtype="uint8"`` (float32 by
    default) cast to float 0..255, which the ops would clip to white."""
    dtype = tf.as_dtype(images.dtype)
    if dtype == tf.uint8:
        return
    hint = ""
    if tf.distribute.has_strategy():
        hint = (
            ". Under a tf.distribute strategy Keras' fit is the other cause: a model not "
            "built yet is built on a first batch that it averages across the replicas "
            "(strategy.reduce), which makes uint8 images float32; build the model before "
            "fit, calling it once on a uint8 batch inside strategy.scope()"
        )
    raise ValueError(
        f"AugmentationLayer takes uint8 images (0..255, as load_for_model yields them), got "
        f"{dtype.name}: a float image may be a uint8 batch cast to 0..255 by a Keras Input "
        f"without dtype (float32 by default), which the layer would take for [0, 1]. Declare "
        f'the model\'s image input keras.Input(..., dtype="uint8"), and pass or serve uint8 '
        f"images{hint}"
    )


def _check_targets_follow(augmenter: Augmenter, spec: TargetSpec) -> None:
    """Refuses to move a detection or segmentation dataset's images randomly
    without its targets: the boxes, masks and keypoints the loss compares
    with would stay where the images' objects no longer are."""
    moving = [a.name for a in augmenter.element_ops if a.definition.geometric]
    if not spec.geometric or not moving:
        return
    raise ValueError(
        f"AugmentationLayer(training=True) got images without this dataset's targets "
        f"{list(spec.geometric)}, and {moving} move pixels: the targets would no longer match "
        f"the images. Pass them and take both back: images, targets = layer({{**inputs, "
        f"'targets': targets}}, training=True) (load_for_model yields (inputs, targets))"
    )


def _check_known_targets(targets: Mapping[str, Any], spec: TargetSpec) -> None:
    """Refuses targets the dataset does not declare (a mask on a classification
    dataset, a misspelt name): the layer moves only the targets it knows and
    would return the others as they were, no longer matching the images."""
    known = (*spec.names, "num_objects")
    unknown = [name for name in targets if name not in known]
    if not unknown:
        return
    raise ValueError(
        f"AugmentationLayer: the targets {unknown} are not among this dataset's targets "
        f"{list(spec.names)} (kiln.json targets); the layer moves only those and would return "
        f"{unknown} as they were, no longer matching the augmented images. Pass the targets "
        f"load_for_model yields (a dataset with masks or boxes is built with them: "
        f"targets: in the build config)"
    )


def _check_no_loose_targets(inputs: Mapping[str, Any], spec: TargetSpec) -> None:
    """Refuses targets the layer would move beside ``image`` instead of under
    ``targets`` (the flat dict of ``load_for_model(as_supervised=False)``):
    it would return the images moved and those targets as they were."""
    loose = [name for name in (*spec.object_columns, "mask") if name in inputs]
    if not loose:
        return
    carried = [name for name in (*spec.names, "num_objects") if name in inputs]
    raise ValueError(
        f"AugmentationLayer: the inputs carry the targets {loose} beside 'image'; the "
        f"layer moves targets only under the key 'targets' and would return the images "
        f"augmented and these as they were. Pass {{'image': d['image'], 'augment_seed': "
        f"d['augment_seed'], 'targets': {{name: d[name] for name in {carried}}}}} and take "
        f"(images, targets) back, or use load_for_model(..., as_supervised=True), whose "
        f"dataset yields (inputs, targets) for layer({{**inputs, 'targets': targets}})"
    )


def _check_padding_counted(targets: Mapping[str, Any], spec: TargetSpec) -> None:
    """Refuses padded per-object columns (``load_for_model(max_objects=M)``:
    dense ``[B, M, ...]``) without ``num_objects``: the layer could not tell
    the padding rows from objects and would move them as objects (class -1,
    zero boxes, which a flip turns into boxes inside the image)."""
    padded = [
        name
        for name in spec.object_columns
        if name in targets and not isinstance(targets[name], tf.RaggedTensor)
    ]
    if "num_objects" in targets or not padded:
        return
    raise ValueError(
        f"AugmentationLayer: the targets {padded} are padded (load_for_model(max_objects=...) "
        f"pads each element's objects to [batch, max_objects, ...]) but 'num_objects' is "
        f"missing: without it the layer cannot tell the padding rows from objects and would "
        f"move them as objects (class -1, empty boxes). Pass 'num_objects' with them, as "
        f"load_for_model yields it"
    )


def _check_whole_objects(targets: Mapping[str, Any], spec: TargetSpec) -> None:
    """Refuses per-object columns without the others that decide how objects
    move. Which objects a move keeps is decided by their boxes, and on a
    dataset with instance masks by the masks too, to whose pixels the boxes
    are re-fitted: without them the layer would keep other objects, or other
    boxes, than the tf.data path. Keypoints move with their visibility."""
    given = [name for name in spec.object_columns if name in targets]
    if not given:
        return
    needed = {name for name in ("boxes", "instance_masks") if name in spec.kinds}
    if {"keypoints", "keypoint_visibility"} & set(given):
        needed |= {"keypoints", "keypoint_visibility"}
    missing = [name for name in spec.object_columns if name in needed and name not in given]
    if not missing:
        return
    needed_in_order = [name for name in spec.object_columns if name in needed]
    reasons = []
    if {"boxes", "instance_masks"} <= needed:
        reasons.append(
            "which objects a move keeps is decided by their boxes and instance masks, and "
            "the boxes are re-fitted to the masks' pixels"
        )
    elif needed & {"boxes", "instance_masks"}:
        decided = "boxes" if "boxes" in needed else "instance masks"
        reasons.append(f"which objects a move keeps is decided by their {decided}")
    if "keypoints" in needed:
        reasons.append("keypoints move with their visibility")
    raise ValueError(
        f"AugmentationLayer: the targets {given} need {needed_in_order} beside them, missing "
        f"{missing}: {'; '.join(reasons)}, so without them the layer would not move the "
        f"objects as load does. Pass {missing} too (load_for_model yields them with the rest)"
    )


def _padded_objects(targets: Mapping[str, Any], spec: TargetSpec) -> int | None:
    """The static ``max_objects`` of targets padded by `pad_objects`
    (``num_objects`` beside ``[B, M, ...]`` columns), None for ragged ones."""
    columns = [name for name in spec.object_columns if name in targets]
    if "num_objects" not in targets or not columns:
        return None
    size = targets[columns[0]].shape[1]
    if size is None:
        raise ValueError(
            f"AugmentationLayer: padded targets (with num_objects) need a static object "
            f"dimension, got {columns[0]} of shape {targets[columns[0]].shape}"
        )
    return int(size)
