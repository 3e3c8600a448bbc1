"""Labels in the form a loss wants: one-hot, multi-hot and label smoothing, as TF ops.

Keras 3's sparse losses take class ids and have no ``label_smoothing``; its
dense losses take one-hot vectors and do. `LabelEncoding` turns the class ids
the reader yields into those vectors:

- ``label`` (one class per image), int64 ``[batch]``: one-hot float32
  ``[batch, num_classes]``; smoothing as Keras's `CategoricalCrossentropy`
  does it, ``y * (1 - s) + s / num_classes``.
- ``labels`` (multi-label), int64 ``[batch, (n)]`` (ragged when batched):
  multi-hot float32 ``[batch, num_classes]``, 1 for each class the image
  carries; smoothing as Keras's `BinaryCrossentropy` does it,
  ``y * (1 - s) + s / 2``.
- class ids that stay ids (``label``, ``labels`` without `one_hot`,
  per-object ``classes``) in int32 instead of int64, when asked
  (``ReadOptions(label_dtype="int32")``: JAX without x64, TPU pipelines).

A ``label`` or ``labels`` that mixup or cutmix already mixed is a float32
one-hot or multi-hot vector: it is only smoothed. Per-object ``classes`` of
detection datasets stay class ids.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule
from kiln.reader.targets import TargetError, TargetSpec

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when labels are encoded, not to validate the options
    tf = LazyModule("tensorflow")

# The target kinds that hold class ids per image.
LABEL_KINDS = ("label", "labels")


@dataclasses.dataclass(frozen=True)
class LabelEncoding:
    """How the reader hands out a dataset's per-image class ids.

    Attributes:
      num_classes: The dataset's class count (kiln.json ``class_names``).
      one_hot: Vectors instead of ids: one-hot ``label``, multi-hot ``labels``.
      label_smoothing: In [0, 1): the share of each vector spread evenly
        (see the module docstring). Needs vectors: `one_hot`, or a batch op
        that mixes labels (mixup, cutmix), which one-hots ``label`` itself.
      id_dtype: The dtype of the ids that stay ids: ``"int64"`` (as stored)
        or ``"int32"`` (`kiln.reader.ReadOptions.label_dtype`).
    """

    num_classes: int
    one_hot: bool = False
    label_smoothing: float = 0.0
    id_dtype: str = "int64"

    @classmethod
    def checked(
        cls,
        num_classes: int,
        spec: TargetSpec,
        *,
        one_hot: Any,
        label_smoothing: Any,
        mixes_labels: bool,
        id_dtype: str = "int64",
    ) -> LabelEncoding:
        """The encoding, after checking the options against the dataset.

        Args:
          spec: The dataset's targets.
          mixes_labels: The augmentation list has a batch op (mixup,
            cutmix), whose labels are class vectors: ``label`` and
            ``labels`` are vectors then, in the list's inference form too
            (which mixes nothing), so that train and validation batches
            have one label format.

        Raises:
          ValueError: for an option of the wrong type or range, or label
            smoothing on class ids.
          TargetError: for `one_hot` or `label_smoothing` on a dataset without
            per-image labels.
        """
        if not isinstance(one_hot, bool):
            raise ValueError(f"one_hot must be True or False, got {one_hot!r}")
        if (
            isinstance(label_smoothing, bool)
            or not isinstance(label_smoothing, numbers.Real)
            or not 0.0 <= float(label_smoothing) < 1.0
        ):
            raise ValueError(f"label_smoothing must be a number in [0, 1), got {label_smoothing!r}")
        present = [kind for kind in LABEL_KINDS if kind in spec.kinds]
        if not present and (one_hot or label_smoothing):
            # Checked before the hint below to pass one_hot=True, refused here too.
            asked = "one_hot=True" if one_hot else f"label_smoothing={label_smoothing}"
            raise TargetError(
                f"{asked}: this dataset has no per-image class ids to encode (label or labels; "
                f"targets {list(spec.kinds)}); per-object classes stay ids"
            )
        if mixes_labels and present:
            one_hot = True
        if label_smoothing and not one_hot:
            raise ValueError(
                f"label_smoothing={label_smoothing} smooths one-hot labels; pass one_hot=True "
                f"(and a loss that takes them, e.g. CategoricalCrossentropy) or use mixup/cutmix, "
                f"which one-hot the label"
            )
        return cls(num_classes, one_hot, float(label_smoothing), id_dtype)

    @property
    def changes_labels(self) -> bool:
        return self.one_hot or self.label_smoothing > 0.0 or self.id_dtype != "int64"

    def ids(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor | tf.RaggedTensor:
        """Class ids (int64 as parsed) in `id_dtype`."""
        return ids if ids.dtype.name == self.id_dtype else tf.cast(ids, self.id_dtype)

    def label(self, label: tf.Tensor) -> tf.Tensor:
        """One-hot (smoothed) ``label``: int ids ``[...]`` -> float32 ``[..., num_classes]``;
        an already mixed float32 one-hot label is only smoothed."""
        if label.dtype.is_integer:
            if not self.one_hot:
                return self.ids(label)
            label = tf.one_hot(label, self.num_classes, dtype=tf.float32)
        if self.label_smoothing:
            label = label * (1.0 - self.label_smoothing) + self.label_smoothing / self.num_classes
        return label

    def labels(self, labels: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Multi-hot (smoothed) ``labels``: ids ``[n]`` or ragged ``[batch, (n)]`` ->
        float32 ``[num_classes]`` or ``[batch, num_classes]``; already mixed
        float32 multi-hot labels (mixup, cutmix) are only smoothed."""
        if labels.dtype.is_floating:
            hot = labels
        elif not self.one_hot:
            return self.ids(labels)
        else:
            hot = tf.math.bincount(
                tf.cast(labels, tf.int32),
                minlength=self.num_classes,
                maxlength=self.num_classes,
                binary_output=True,
                axis=-1,
            )
            # bincount of a ragged batch loses the static shape; the batch size is the rows'.
            hot = tf.ensure_shape(tf.cast(hot, tf.float32), labels.shape[:-1] + [self.num_classes])
        if self.label_smoothing:
            hot = hot * (1.0 - self.label_smoothing) + self.label_smoothing / 2.0
        return hot

    def targets(self, targets: Mapping[str, Any]) -> dict[str, Any]:
        """A targets (or record features) dict with ``label`` and ``labels``
        encoded, per-object ``classes`` in `id_dtype`."""
        out = dict(targets)
        if "label" in out:
            out["label"] = self.label(out["label"])
        if "labels" in out:
            out["labels"] = self.labels(out["labels"])
        if "classes" in out:
            out["classes"] = self.ids(out["classes"])
        return out
