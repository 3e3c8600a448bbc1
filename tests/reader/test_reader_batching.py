"""`RaggedEncoding`: ragged_batch's encoding inside the element map, then a plain batch.

Kernel tier: tensors made here. The reader's use of it on a real build (the
batch right after the element map, the values of before) is tested in
test_reader_targets.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kiln.reader.batching import RaggedEncoding


def _elements(count: int) -> tf.data.Dataset:
    """Elements with tensors of every kind `ragged_batch` treats apart: a
    scalar, a fixed shape, an unknown first axis, and an unknown inner axis."""

    def element(index):
        n = tf.cast(index % 3, tf.int32)
        m = tf.cast(index % 2 + 1, tf.int32)
        return {
            "key": tf.strings.as_string(index),
            "fixed": tf.fill([2, 2], tf.cast(index, tf.float32)),
            "boxes": tf.reshape(tf.range(4 * n, dtype=tf.float32), [n, 4])
            + tf.cast(index, tf.float32),
            "labels": tf.range(n, dtype=tf.int64),
            "grid": tf.fill(tf.stack([n + 1, m, 3]), tf.cast(index, tf.uint8)),
        }, tf.fill([2], index > 2)

    return tf.data.Dataset.range(count).map(element)


def _as_lists(batch):
    return tf.nest.map_structure(
        lambda t: t.to_list() if isinstance(t, tf.RaggedTensor) else t.numpy().tolist(), batch
    )


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_a_plain_batch_of_encoded_elements_decodes_to_ragged_batch(drop_remainder):
    expected = _elements(7).ragged_batch(3, drop_remainder=drop_remainder)
    encoding = RaggedEncoding()
    encoded = _elements(7).map(lambda *element: encoding.encode(element))
    batched = encoded.batch(3, drop_remainder=drop_remainder)
    # A plain batch of fixed-shape tensors: what tf.data fuses with the map before it.
    assert all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(batched.element_spec))
    decoded = batched.map(lambda *batch: encoding.decode(batch, 3 if drop_remainder else None))
    assert decoded.element_spec == expected.element_spec
    got, want = list(decoded), list(expected)
    assert len(got) == len(want) == (2 if drop_remainder else 3)
    for one, other in zip(got, want, strict=True):
        assert _as_lists(one) == _as_lists(other)
        for a, b in zip(
            tf.nest.flatten(one, expand_composites=True),
            tf.nest.flatten(other, expand_composites=True),
            strict=True,
        ):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_decode_before_encode_is_refused():
    with pytest.raises(RuntimeError, match="before an element was encoded"):
        RaggedEncoding().decode({})
