"""Whole batches to the end of a read, the padding marked: evaluation that counts every record.

``load(pad_remainder=True)`` reads every record of an input pipeline's
range of the split once (see `kiln.reader.dataset._Share`), batches them,
fills the last partial batch up to the batch size, and then adds batches
of padding alone until the pipeline has as many batches as the one with
the most records (the pipelines' ranges differ by at most one record). So
every batch is full, with a static batch size (TPU, a jitted step), every
pipeline takes the same number of steps, and the records of all pipelines
together are the split's, each once: what `clu`'s ``pad_up_to_batches``
and TFDS's ``even_splits(drop_remainder=False)`` give, without reading
anything twice. Padding is made, not read: zeros in every tensor (image,
label 0, boxes, instance masks, an empty key), except dense per-object
``classes``, -1 as `max_objects` pads objects, and the class ``mask``, the
dataset's ignore value (a loss that skips it skips padding too); an element
of padding has no objects.

The padding is marked for the consumer:

- ``(inputs, label or targets)`` gains a third member, the float32
  ``[batch]`` sample weight Keras reads: 1 for a record, 0 for padding, so
  ``weighted_metrics`` count every record once and padding not at all;
  with ``class_weight`` the third member is already there (the class's
  weight) and is 0 for padding;
- a features dict (``as_supervised=False``) gains ``valid``, bool
  ``[batch]``: False for padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when a dataset is built, not to declare the class
    tf = LazyModule("tensorflow")

# The features dict's mark: True for a record, False for padding.
VALID = "valid"
# Dense per-object class ids pad with -1 (as `max_objects` pads objects), so
# that padding cannot pass for class 0.
_PADDED_CLASSES = "classes"
# The class mask pads with the dataset's ignore value (`RemainderPadding.mask_fill`).
_MASK = "mask"


@dataclasses.dataclass(frozen=True)
class RemainderPadding:
    """What one input pipeline pads per pass.

    Attributes:
      batch_size: Elements in every batch, padding included.
      batches: Batches the pipeline yields (all pipelines the same number).
      padding_batches: Of them, the batches of padding alone at the end.
      mask_fill: The class mask's padding: the dataset's ignore value.
    """

    batch_size: int
    batches: int
    padding_batches: int
    mask_fill: int = 0

    @classmethod
    def for_share(
        cls, records: int, most_records: int, batch_size: int, skip: int = 0, mask_fill: int = 0
    ) -> RemainderPadding:
        """The padding of a pipeline that reads `records` of a split whose
        largest share is `most_records`, after `skip` batches."""
        batches = -(-most_records // batch_size) - skip
        left = max(0, records - skip * batch_size)
        with_records = -(-left // batch_size)  # the last one filled up with padding
        return cls(batch_size, batches, batches - with_records, mask_fill)

    def filled(self, batch: Any) -> Any:
        """A finished batch (`kiln.reader.output.Output.apply`'s), marked and
        filled up to `batch_size` with padding."""
        return _each_filled(_marked(batch), self.batch_size, self.mask_fill)

    def with_padding_batches(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset` (of `filled` batches) followed by the batches of padding alone."""
        if not self.padding_batches:
            return dataset
        spec = dataset.element_spec

        def padding(_):
            return _each_filled(
                tf.nest.map_structure(_empty, spec), self.batch_size, self.mask_fill
            )

        padding = tf.autograph.experimental.do_not_convert(padding)
        return dataset.concatenate(tf.data.Dataset.range(self.padding_batches).map(padding))


def _marked(batch: Any) -> Any:
    """`batch` with its mark of real elements: the weight, or ``valid``."""
    if isinstance(batch, Mapping):
        if VALID in batch:  # a user's extra column
            raise ValueError(
                f"pad_remainder=True marks padding with a {VALID!r} feature, and this "
                f"dataset's records have a feature of that name; read it with "
                f"as_supervised=True (a sample weight marks the padding)"
            )
        rows = _rows(batch["image"])
        return dict(batch, **{VALID: tf.ones([rows], tf.bool)})
    if len(batch) == 3:  # class weights: padding weighs 0
        return batch
    inputs, targets = batch
    image = inputs["image"] if isinstance(inputs, Mapping) else inputs
    return inputs, targets, tf.ones([_rows(image)], tf.float32)


def _rows(value: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
    if isinstance(value, tf.RaggedTensor):
        return value.nrows()
    return tf.shape(value, out_type=tf.int64)[0]


def _each_filled(structure: Any, size: int, mask_fill: int, name: str | None = None) -> Any:
    """Every tensor of a batch's tuples and dicts `_filled`; `name`: its dict key."""
    if isinstance(structure, Mapping):
        return {key: _each_filled(value, size, mask_fill, key) for key, value in structure.items()}
    if isinstance(structure, tuple):
        return tuple(_each_filled(value, size, mask_fill) for value in structure)
    return _filled(structure, size, _pad_value(name, structure, mask_fill))


def _pad_value(name: str | None, value: tf.Tensor | tf.RaggedTensor, mask_fill: int) -> int:
    if isinstance(value, tf.RaggedTensor) or not value.dtype.is_integer:
        return 0
    if name == _PADDED_CLASSES:
        return -1
    return mask_fill if name == _MASK else 0


def _filled(value: tf.Tensor | tf.RaggedTensor, size: int, pad: int) -> Any:
    """`value` ``[n, ...]`` as ``[size, ...]``: rows of `pad` (ragged: empty rows) after its own.

    A batch that is full already is passed on as it is (`tf.pad` by nothing
    forwards its input: no copy).
    """
    if isinstance(value, tf.RaggedTensor):
        splits = list(value.nested_row_splits)
        outer = splits[0]
        more = size + 1 - tf.shape(outer, out_type=tf.int64)[0]
        outer = tf.concat([outer, tf.fill([more], outer[-1])], 0)
        outer = tf.ensure_shape(outer, [size + 1])
        return tf.RaggedTensor.from_nested_row_splits(
            value.flat_values, [outer, *splits[1:]], validate=False
        )
    more = size - tf.shape(value)[0]
    paddings = [[0, more]] + [[0, 0]] * (value.shape.rank - 1)
    # tf.zeros: the zero of any dtype (b"" for strings, False for bools).
    fill = tf.constant(pad, value.dtype) if pad else tf.zeros([], value.dtype)
    padded = tf.pad(value, paddings, constant_values=fill)
    return tf.ensure_shape(padded, [size, *value.shape[1:]])


def _empty(spec: tf.TensorSpec | tf.RaggedTensorSpec) -> Any:
    """A batch of no element of `spec` (whose batch axis is ignored)."""
    if isinstance(spec, tf.RaggedTensorSpec):
        rank = spec.ragged_rank
        inner = spec.shape[rank + 1 :]
        if not inner.is_fully_defined():
            raise ValueError(f"pad_remainder=True: cannot make padding of a {spec}")
        values = tf.zeros([0, *inner.as_list()], spec.dtype)
        splits = [tf.zeros([1], spec.row_splits_dtype)] * rank
        return tf.RaggedTensor.from_nested_row_splits(values, splits, validate=False)
    inner = spec.shape[1:]
    if not inner.is_fully_defined():
        raise ValueError(f"pad_remainder=True: cannot make padding of a {spec}")
    return tf.zeros([0, *inner.as_list()], spec.dtype)
