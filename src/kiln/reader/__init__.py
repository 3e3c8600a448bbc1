"""Reads kiln datasets for training: a thin tf.data reader with seeded, TF-op-only augmentation.

    import kiln.reader

    train = kiln.reader.load("gs://bucket/datasets/shapes", "train", batch_size=64, seed=1)
    model.fit(train, epochs=10)

Imports TensorFlow, NumPy, pydantic (for the parameters of augmentation
ops, validated as in `kiln.registry`) and the standard library only: never
Beam, OpenCV or yaml, so training jobs install just ``pip install kiln``.

Public API:
  load: the `tf.data.Dataset` of a split (see `kiln.reader.dataset.load`).
  load_for_model: ``(dataset, layer)``: unaugmented uint8 batches with
    their seeds, and the Keras layer that augments them inside the model.
  ReadOptions: the rarely changed options of `load` (shuffle buffer, order,
    the class ids' dtype).
  info: the dataset's `kiln.schemas.DatasetInfo` without building a dataset.
  class_counts, class_weights: a split's images per class id, and
    per-class weights ("balanced") for `load(class_weight=...)` or Keras.
  positive_weights: a multi-label dataset's per-class ``pos_weight`` for
    `tf.nn.weighted_cross_entropy_with_logits`.
  locate: the version folder a path resolves to (follows `LATEST`).
  pool_host_memory: has TensorFlow pool the host memory it frees (its BFC
    allocator), so float32 batches above 32 MB are not fresh pages from the
    kernel every batch; process-wide, before TensorFlow's first op.
  register_augmentation: decorator for your own augmentation ops.
  validate: checks an augmentation list in YAML form (names, parameters).
  names: registered augmentation op names.
  AugmentationLayer: the Keras layer of `load_for_model`; a model saved
    with it loads with `keras.models.load_model` after ``import kiln.reader``.
  ReplicaIterator: per-replica input under a `tf.distribute` strategy that
    `tf.train.Checkpoint` can save (`kiln.reader.replicas`).
  ElementTargets, TargetSpec, TargetError: targets (boxes, masks,
    keypoints) and how augmentations move them (`kiln.reader.targets`).

Modules: `ops` declares augmentation ops (and holds kiln's element ops),
`mixing` the batch ops, `augmenter` applies a validated list, `dataset`
reads, `location` finds a dataset and reads its kiln.json, `layer` is the
Keras layer, `saving` makes it loadable, `options` holds `ReadOptions`,
`replicas` feeds a strategy's replicas, `host_memory` pools host memory,
`seeds` derives per-element seeds, `targets` moves boxes, masks and
keypoints with the image; `labels` (one-hot, multi-hot, smoothing),
`class_weights` and `output` (image dtype and layout) give the last step the
form a trainer asked for, and `padding` fills the last batches of a read that
counts every record (``pad_remainder``). Importing the package registers kiln's own ops and
the layer's Keras name without importing TensorFlow (`kiln.lazy_import`,
`kiln.reader.saving`): validating an augmentation list, `info` and `locate`
on local paths do not need it; `load` and the layer do, and import it when
first asked for.
"""

from typing import TYPE_CHECKING

# Imported for their registrations: mixup and cutmix; the layer's name with Keras.
from kiln.reader import mixing, saving  # noqa: F401
from kiln.reader.class_weights import class_counts, class_weights, positive_weights
from kiln.reader.host_memory import pool_host_memory
from kiln.reader.location import info, locate
from kiln.reader.ops import (
    Augmentation,
    AugmentConfigError,
    names,
    register_augmentation,
    validate,
)
from kiln.reader.options import ReadOptions
from kiln.reader.targets import ElementTargets, TargetError, TargetSpec

__all__ = [
    "AugmentConfigError",
    "Augmentation",
    "AugmentOpError",
    "AugmentationLayer",
    "DEFAULT_SHUFFLE_BUFFER",
    "ElementTargets",
    "ReadOptions",
    "ReplicaIterator",
    "TargetError",
    "TargetSpec",
    "class_counts",
    "class_weights",
    "positive_weights",
    "info",
    "pool_host_memory",
    "load",
    "load_for_model",
    "locate",
    "names",
    "register_augmentation",
    "validate",
]


if TYPE_CHECKING:
    # What `__getattr__` imports when first asked for, as type checkers must
    # see it: without these, mypy and pyright type `kiln.reader.load` as Any
    # and check no call to it.
    from kiln.reader.augmenter import AugmentOpError
    from kiln.reader.dataset import DEFAULT_SHUFFLE_BUFFER, load, load_for_model
    from kiln.reader.layer import AugmentationLayer
    from kiln.reader.replicas import ReplicaIterator


def __getattr__(name: str):
    # The parts that need TensorFlow (and the layer, Keras) are imported when
    # first asked for: `kiln.reader.load`, `from kiln.reader import load`.
    if name in ("load", "load_for_model", "DEFAULT_SHUFFLE_BUFFER"):
        from kiln.reader import dataset

        return getattr(dataset, name)
    if name == "AugmentOpError":
        from kiln.reader.augmenter import AugmentOpError

        return AugmentOpError
    if name == "AugmentationLayer":
        from kiln.reader.layer import AugmentationLayer

        return AugmentationLayer
    if name == "ReplicaIterator":
        from kiln.reader.replicas import ReplicaIterator

        return ReplicaIterator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
