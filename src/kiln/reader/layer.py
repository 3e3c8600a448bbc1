"""A Keras layer that applies a kiln augmentation list to a batch inside the model.

For ``load(..., augment_on="model")``: the dataset yields unaugmented uint8
batches plus each element's seed, and this layer augments them where the
model runs (e.g. on a GPU), with the same ops and seeds as the tf.data path,
so the results are identical. TensorFlow backend only (it calls TF ops).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from kiln.reader.augmenter import Augmenter, standardize
from kiln.reader.ops import validate

# As in the tf.data path: the same unconverted code, so both trace alike.
_unconverted = tf.autograph.experimental.do_not_convert


@tf.keras.utils.register_keras_serializable(package="kiln")
class AugmentationLayer(tf.keras.layers.Layer):
    """Augments ``{"image": uint8 [B, H, W, C], "augment_seed": int32 [B, 2]}``.

    With ``training=True`` (Keras passes it during `fit`) each image gets the
    element ops with its own seed; otherwise (evaluation, prediction, serving)
    each op's deterministic inference form runs and the seeds may be left
    out: pass just the image batch. The output is float32 in [0, 1], or
    standardized when `mean`/`std` are given.

    Args:
      augment: Augmentation list in YAML form (element ops only).
      random: False applies only the inference form, even in training.
      mean: Per-channel mean on the 0..255 scale, to standardize the output.
      std: Per-channel standard deviation on the 0..255 scale.
    """

    def __init__(
        self,
        augment: Sequence[Any],
        *,
        random: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
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

    def call(self, inputs, training=None):
        if isinstance(inputs, dict):
            images, seeds = inputs["image"], inputs.get("augment_seed")
        else:
            images, seeds = inputs, None
        if training and self.random:
            if seeds is None:
                raise ValueError(
                    "AugmentationLayer(training=True) needs the batch's "
                    "'augment_seed' (load(..., augment_on='model') yields it)"
                )
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

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(augment=self.augment, random=self.random, mean=self.mean, std=self.std)
        return config
