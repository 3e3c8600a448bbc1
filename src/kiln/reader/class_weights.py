"""Class weights from kiln.json's per-class counts, and per-example weights that follow the labels.

`class_counts` gives a split's counts keyed by class id (kiln.json keys them
by class name), `positive_weights` a multi-label dataset's per-class
``pos_weight`` for a weighted binary cross-entropy, `class_weights` the
per-class weight dict that Keras's
``fit(class_weight=...)`` takes. With a dataset from a `tf.distribute`
strategy's ``distribute_datasets_from_function`` that call fails (Keras
applies ``class_weight`` with ``Dataset.map``, which a distributed dataset
has not); ``kiln.reader.load(..., class_weight=...)`` instead yields
``(image, label, sample_weight)``, which Keras weighs the loss with
everywhere (`ExampleWeights`).

"balanced" is scikit-learn's rule, ``n_examples / (n_classes * count)``: every
class then weighs as much in the loss as the others, and the weights average
to 1 over the split's examples. A class with no example in the split (kept
in ``class_names`` so the ids after it do not shift) gets weight 0, and
``n_classes`` counts only the classes that have examples, so that average
stays 1; sklearn refuses such classes instead.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule
from kiln.reader.location import info
from kiln.reader.targets import TargetError, TargetSpec
from kiln.schemas import DatasetInfo

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when weights are applied: the dict needs only kiln.json
    tf = LazyModule("tensorflow")

logger = logging.getLogger(__name__)

METHODS = ("balanced",)

# Where a multi-label dataset's class balance goes instead: into the loss.
_MULTI_LABEL_HINT = (
    "; multi-label labels weigh each class in the loss instead: "
    "kiln.reader.positive_weights(path, split) gives its pos_weight "
    "(tf.nn.weighted_cross_entropy_with_logits, on one_hot=True labels)"
)


def class_counts(dataset: str | os.PathLike | DatasetInfo, split: str = "train") -> dict[int, int]:
    """Images per class id in `split`, from kiln.json (every class, zeros included).

    Args:
      dataset: A dataset path (as `kiln.reader.load` takes) or its `info`.

    For a classification dataset that is the number of examples labelled
    with each class. For a dataset with targets it is the number of images
    that show the class in their label, labels, objects or semantic mask
    (an image with three cats counts once for cat; `DatasetInfo.class_count_kinds`
    names the targets counted).

    Raises:
      MetadataError: for a missing split or a path that is not a dataset.
    """
    metadata = dataset if isinstance(dataset, DatasetInfo) else info(dataset)
    counts = metadata.split(split).class_counts
    return {index: int(counts.get(name, 0)) for index, name in enumerate(metadata.class_names)}


def class_weights(
    dataset: str | os.PathLike | DatasetInfo, split: str = "train", method: str = "balanced"
) -> dict[int, float]:
    """Per-class weights for one label per image: ``{class id: weight}``.

    The dict Keras's ``model.fit(class_weight=...)`` takes, and that
    ``kiln.reader.load(class_weight=...)`` turns into per-example weights.

    Args:
      dataset: A dataset path or its `info`.
      split: Whose counts (the split you train on).
      method: ``"balanced"``: ``n_examples / (n_classes * count)``, 0 for a
        class without examples (see the module docstring).

    Raises:
      ValueError: for an unknown method, or a split without examples.
      TargetError: when the dataset has no ``label``, or its counts are not
        label counts (multi-label, detection or segmentation datasets:
        kiln.json counts images per class over every target that carries
        classes).
    """
    metadata = dataset if isinstance(dataset, DatasetInfo) else info(dataset)
    if method not in METHODS:
        raise ValueError(f"class weight method must be one of {METHODS}, got {method!r}")
    spec = TargetSpec.from_json(metadata.targets)
    if "label" not in spec.kinds:
        raise TargetError(
            f"class weights weigh one label per image; this dataset has no label "
            f"(targets {list(spec.kinds)}){_MULTI_LABEL_HINT if 'labels' in spec.kinds else ''}"
        )
    others = [kind for kind in metadata.class_count_kinds if kind != "label"]
    if others:
        raise TargetError(
            f"balanced class weights need label counts, but kiln.json's class_counts count "
            f"images per class over label and {others}; pass your own {{class id: weight}} dict"
        )
    counts = class_counts(metadata, split)
    total = sum(counts.values())
    present = [index for index, count in counts.items() if count > 0]
    if not present:
        raise ValueError(f"split {split!r} has no examples: no class weights")
    empty = [metadata.class_names[index] for index, count in counts.items() if count == 0]
    if empty:
        logger.info("kiln.reader: class(es) %s have no example in split %r: weight 0", empty, split)
    return {
        index: total / (len(present) * count) if count else 0.0 for index, count in counts.items()
    }


def positive_weights(
    dataset: str | os.PathLike | DatasetInfo, split: str = "train"
) -> dict[int, float]:
    """Per-class positive weights for multi-label training: ``{class id: negatives / positives}``.

    For a dataset whose only classes are its multi-label ``labels``: each
    class's images without it over the images with it, in `split`. The
    ``pos_weight`` of `tf.nn.weighted_cross_entropy_with_logits` (PyTorch's
    ``BCEWithLogitsLoss(pos_weight=...)``), which weighs each class's
    positives as much as its negatives in the loss; take the labels
    multi-hot (``load(..., one_hot=True)``). A class no image of the split
    carries gets 1 (it has no positive to weigh).

    Raises:
      ValueError: for a split without examples.
      TargetError: without ``labels``, or when ``label``, objects or the
        semantic mask carry classes too (kiln.json's counts are then not the
        labels' positives).
    """
    metadata = dataset if isinstance(dataset, DatasetInfo) else info(dataset)
    spec = TargetSpec.from_json(metadata.targets)
    if "labels" not in spec.kinds:
        raise TargetError(
            f"positive weights weigh multi-label labels; this dataset has no labels "
            f"(targets {list(spec.kinds)}): use class_weights for one label per image"
        )
    others = [kind for kind in metadata.class_count_kinds if kind != "labels"]
    if others:
        raise TargetError(
            f"positive weights need the labels' counts, but kiln.json's class_counts count "
            f"images per class over labels and {others}; compute them from your own counts"
        )
    examples = metadata.split(split).num_examples
    if not examples:
        raise ValueError(f"split {split!r} has no examples: no positive weights")
    return {
        index: (examples - count) / count if count else 1.0
        for index, count in class_counts(metadata, split).items()
    }


@dataclasses.dataclass(frozen=True)
class ExampleWeights:
    """Each example's weight from its label: ``weights[label]``, or for a label
    that mixup/cutmix mixed, the mix of the weights (``sum(label * weights)``).

    Attributes:
      weights: One weight per class id.
    """

    weights: tuple[float, ...]

    @classmethod
    def checked(
        cls, class_weight: Any, metadata: DatasetInfo, split: str, spec: TargetSpec
    ) -> ExampleWeights:
        """From ``load``'s `class_weight`: ``"balanced"`` (`class_weights` of
        `split`) or a ``{class id: weight}`` dict (ids left out weigh 1, as in
        Keras).

        Raises:
          ValueError: for ids outside the classes, or weights that are not
            finite non-negative numbers. TargetError: without a ``label``.
        """
        if isinstance(class_weight, str) and class_weight in METHODS:
            return cls(tuple(class_weights(metadata, split, class_weight).values()))
        if not isinstance(class_weight, Mapping):
            raise ValueError(
                f"class_weight must be 'balanced' or a {{class id: weight}} dict, "
                f"got {class_weight!r}"
            )
        if "label" not in spec.kinds:
            raise TargetError(
                f"class_weight weighs examples by their label; this dataset has no label "
                f"(targets {list(spec.kinds)})"
                f"{_MULTI_LABEL_HINT if 'labels' in spec.kinds else ''}"
            )
        num_classes = metadata.num_classes
        weights = [1.0] * num_classes
        for index, weight in class_weight.items():
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                raise ValueError(f"class_weight: keys are class ids (ints), got {index!r}")
            if not 0 <= index < num_classes:
                raise ValueError(
                    f"class_weight: class id {index} is not one of the dataset's "
                    f"{num_classes} classes (0..{num_classes - 1})"
                )
            if (
                isinstance(weight, bool)
                or not isinstance(weight, numbers.Real)
                or not math.isfinite(weight)
                or weight < 0
            ):
                raise ValueError(
                    f"class_weight: the weight of class {index} must be a finite number >= 0, "
                    f"got {weight!r}"
                )
            weights[int(index)] = float(weight)
        return cls(tuple(weights))

    def of(self, label: tf.Tensor) -> tf.Tensor:
        """float32 weights ``[...]`` of int ids ``[...]`` or mixed one-hot ``[..., classes]``."""
        table = tf.constant(self.weights, tf.float32)
        if label.dtype.is_integer:
            return tf.gather(table, label)
        return tf.reduce_sum(label * table, axis=-1)
