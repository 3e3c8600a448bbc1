"""Resuming a seeded stream at a step without an iterator checkpoint: ``load(skip=...)``.

A JAX or PyTorch trainer saves its step with its own checkpoints (orbax, a
file), not a `tf.train.Checkpoint` of the input; after a restart it loads the
same dataset with ``skip=step`` and must get exactly the batches an
uninterrupted run would have got next, without reading everything before.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.schemas import RECORD
from reader.builds import TRAIN_AUGMENT

pytestmark = pytest.mark.usefixtures("no_global_seed")


def batches(dataset, count=None):
    """The dataset's first `count` batches (all of them when None) as NumPy."""
    if count is not None:
        dataset = dataset.take(count)
    return list(dataset.as_numpy_iterator())


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for step, (one, other) in enumerate(zip(got, expected, strict=True)):
        for left, right in zip(tf.nest.flatten(one), tf.nest.flatten(other), strict=True):
            np.testing.assert_array_equal(left, right, err_msg=f"batch {step}")


@pytest.mark.parametrize("pipelines", [1, 2])
def test_skip_continues_the_uninterrupted_stream_across_passes(png_dataset, pipelines):
    """Steps of three passes, one pipeline and two (hosts): with a batch op
    (mixup: its seed comes from the batch) and batches that straddle passes."""
    path = png_dataset.dataset_dir
    augment = TRAIN_AUGMENT + ["mixup"]
    for index in range(pipelines):
        context = tf.distribute.InputContext(pipelines, index, pipelines)

        def make(skip=0, context=context):
            return kiln.reader.load(
                path,
                batch_size=5,
                seed=4,
                augment=augment,
                repeat=True,
                drop_remainder=True,
                input_context=context,
                skip=skip,
            )

        per_pass = len(
            kiln.reader.load(path, batch_size=5, seed=4, augment=augment, input_context=context)
        )
        steps = 3 * per_pass
        uninterrupted = batches(make(), steps)
        # Inside the first pass, at and around pass boundaries, near the end.
        for step in sorted({1, per_pass - 1, per_pass, per_pass + 1, 2 * per_pass + 2, steps - 1}):
            assert_same_batches(batches(make(step), steps - step), uninterrupted[step:])


def test_skip_is_dataset_skip_on_a_finite_read(png_dataset):
    path = png_dataset.dataset_dir
    kwargs = {"batch_size": 7, "seed": 2, "repeat": 3, "as_supervised": False}
    total = len(kiln.reader.load(path, **kwargs))
    for skip in (1, total // 3, total - 1):
        # A new load each time: every iteration of a dataset reads its next passes.
        whole = kiln.reader.load(path, **kwargs)
        skipped = kiln.reader.load(path, skip=skip, **kwargs)
        assert skipped.cardinality() == total - skip
        assert_same_batches(batches(skipped), batches(whole.skip(skip)))
    # Single elements: skip counts elements.
    elements = kiln.reader.load(path, "validation", seed=2)
    assert_same_batches(
        batches(kiln.reader.load(path, "validation", seed=2, skip=3)), batches(elements)[3:]
    )


def test_skipped_records_are_not_decoded(png_dataset, tmp_path):
    """The records a skip leaves out are passed over serialized: records whose
    images cannot be decoded are read past without an error, which
    ``Dataset.skip`` on the loaded dataset (decoding everything) raises."""
    copy = str(tmp_path / os.path.basename(png_dataset.dataset_dir))
    shutil.copytree(png_dataset.dataset_dir, copy)
    (shard,) = png_dataset.info.splits["validation"].shards
    filename = os.path.join(copy, shard.filename)
    records = [r.numpy() for r in tf.data.TFRecordDataset(filename)]
    broken = 3
    with tf.io.TFRecordWriter(filename) as writer:
        for position, serialized in enumerate(records):
            if position < broken:
                serialized = RECORD.encode(dict(RECORD.decode(serialized), image=b"not a png"))
            writer.write(serialized)

    resumed = kiln.reader.load(copy, "validation", augment=None, as_supervised=False, skip=broken)
    expected = kiln.reader.load(png_dataset.dataset_dir, "validation", augment=None)
    assert_same_batches(
        [(b["image"], b["label"]) for b in batches(resumed)], batches(expected)[broken:]
    )
    decoding_everything = kiln.reader.load(copy, "validation", augment=None).skip(broken)
    with pytest.raises(tf.errors.InvalidArgumentError):
        batches(decoding_everything)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"skip": -1}, r"skip must be an int >= 0 \(batches to leave out\), got -1"),
        ({"skip": True}, r"skip must be an int >= 0 .*, got True"),
        ({"skip": 2.0}, r"skip must be an int >= 0 .*, got 2.0"),
        (
            {"split": "validation", "batch_size": 4, "skip": 1000},
            r"split 'validation': skip=1000 leaves nothing of this read's \d+ batches "
            r"\(one pass\); skip fewer, or read more passes \(repeat\)",
        ),
        (
            {"batch_size": 4, "skip": 3, "options": kiln.reader.ReadOptions(dynamic_sharding=True)},
            r"skip=3 with ReadOptions\(dynamic_sharding=True\): tf.data service hands out",
        ),
    ],
)
def test_skip_errors_name_what_is_wrong(png_dataset, kwargs, message):
    with pytest.raises(ValueError, match=message):
        kiln.reader.load(png_dataset.dataset_dir, **kwargs)


def test_skip_takes_a_numpy_integer_and_is_endless_with_repeat(png_dataset):
    path = png_dataset.dataset_dir
    dataset = kiln.reader.load(path, batch_size=4, seed=1, repeat=True, skip=np.int64(10**6))
    assert dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    images, _ = next(iter(dataset))
    assert images.shape[0] == 4


def test_load_for_model_skips_alike(png_dataset):
    path = png_dataset.dataset_dir
    whole, _ = kiln.reader.load_for_model(path, batch_size=6, seed=3, repeat=2)
    skipped, _ = kiln.reader.load_for_model(path, batch_size=6, seed=3, repeat=2, skip=4)
    assert_same_batches(batches(skipped), batches(whole.skip(4)))
