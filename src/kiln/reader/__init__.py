"""Reads kiln datasets for training: a thin tf.data reader with seeded, TF-op-only augmentation.

    import kiln.reader

    train = kiln.reader.load("gs://bucket/datasets/shapes", "train", batch_size=64, seed=1)
    model.fit(train, epochs=10)

Imports TensorFlow, NumPy and the standard library only (never Beam, OpenCV,
pydantic or yaml), so training jobs install just ``pip install kiln``.

Public API:
  load: the `tf.data.Dataset` of a split (see `kiln.reader.dataset.load`).
  info: the dataset's `kiln.schemas.DatasetInfo` without building a dataset.
  locate: the version folder a path resolves to (follows `LATEST`).
  register_augmentation: decorator for your own augmentation ops.
  validate: checks an augmentation list in YAML form (names, parameters).
  names: registered augmentation op names.
  AugmentationLayer: the Keras layer for ``augment_on="model"``.
"""

from kiln.reader.augment import (
    AugmentConfigError,
    Augmentation,
    AugmentOpError,
    names,
    register_augmentation,
    validate,
)
from kiln.reader.dataset import DEFAULT_SHUFFLE_BUFFER, info, load, locate

__all__ = [
    "AugmentConfigError", "Augmentation", "AugmentOpError", "AugmentationLayer",
    "DEFAULT_SHUFFLE_BUFFER", "info", "load", "locate", "names", "register_augmentation",
    "validate",
]


def __getattr__(name: str):
    # Keras is imported only when the layer is asked for: it is slow to import
    # and not needed by augment_on="data".
    if name == "AugmentationLayer":
        from kiln.reader.layer import AugmentationLayer

        return AugmentationLayer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
