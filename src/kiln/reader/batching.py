"""Batches elements whose tensors vary in size with a plain batch, which tf.data fuses with the map.

`Dataset.ragged_batch` turns every tensor of unknown size (per-object
columns ``[N, ...]``, multi-label ids, instance masks) into a variant that
`batch` can stack, in a map of its own between the element map and the
batch. tf.data's map_and_batch_fusion then fuses that small map with the
batch, and the element map stays a stage apart: its elements wait in its
buffer and are copied into the batch later, by another thread.
`RaggedEncoding` does the same encoding inside the element map instead
(`encode`), so a plain `batch` follows the element map and fuses with it, as
it does for classification; `decode` turns the batched variants into the
ragged tensors ``ragged_batch`` would have given, with the same values,
dtypes (int64 row splits) and static shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when a dataset is built, not to declare the class
    tf = LazyModule("tensorflow")


def _ragged_rank(spec: tf.TensorSpec) -> int | None:
    """The ragged rank `ragged_batch` gives an element tensor of this spec
    (its last axis of unknown size), or None for one it batches as it is."""
    shape = spec.shape
    if shape.rank is None or shape.is_fully_defined():
        return None
    return max(axis for axis, size in enumerate(shape.as_list()) if size is None)


class RaggedEncoding:
    """`ragged_batch`'s encoding moved into the element map; `decode` after a plain batch.

    Call `encode` on the element map's output (it records the element's
    structure when the map is traced), batch, then `decode` each batch.
    """

    def __init__(self) -> None:
        # The element map's output spec before encoding, set when it is traced.
        self.element_spec: Any = None

    def encode(self, element: Any) -> Any:
        """The element with every tensor of unknown size as a scalar variant
        (as `ragged_batch` encodes it); tensors of known shape stay as they are."""
        self.element_spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, element)
        return tf.nest.map_structure(_encoded, self.element_spec, element)

    def decode(self, batch: Any, batch_size: int | None = None) -> Any:
        """A batch of encoded elements as `ragged_batch` gives it: each encoded
        tensor a `tf.RaggedTensor` ``[batch, (n), ...]`` with int64 row splits.

        Args:
          batch: The batched output of elements made by `encode`.
          batch_size: The static batch size, when every batch has it
            (``drop_remainder=True``); None when unknown.
        """
        if self.element_spec is None:
            raise RuntimeError("RaggedEncoding.decode before an element was encoded")
        return tf.nest.map_structure(
            lambda spec, value: _decoded(spec, value, batch_size), self.element_spec, batch
        )


def _encoded(spec: tf.TensorSpec, value: tf.Tensor) -> tf.Tensor:
    rank = _ragged_rank(spec)
    if rank is None:
        return value
    if rank == 0:
        splits: list[tf.Tensor] = []
        values = value
    else:
        ragged = tf.RaggedTensor.from_tensor(value, ragged_rank=rank)
        splits, values = list(ragged.nested_row_splits), ragged.flat_values
    return tf.raw_ops.RaggedTensorToVariant(
        rt_nested_splits=splits, rt_dense_values=values, batched_input=False
    )


def _decoded(spec: tf.TensorSpec, value: tf.Tensor, batch_size: int | None) -> Any:
    rank = _ragged_rank(spec)
    if rank is None:
        return value
    splits, values = tf.raw_ops.RaggedTensorFromVariant(
        encoded_ragged=value,
        input_ragged_rank=rank,
        output_ragged_rank=rank + 1,
        Tvalues=spec.dtype,
        Tsplits=tf.int64,
    )
    splits[0].set_shape([None if batch_size is None else batch_size + 1])
    values.set_shape(tf.TensorShape([None]).concatenate(spec.shape[rank + 1 :]))
    return tf.RaggedTensor.from_nested_row_splits(values, splits, validate=False)
