"""Class weights from kiln.json, and per-example weights in Keras fit, also under a strategy."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader.targets import TargetError
from kiln.schemas import RECORD
from reader.fresh_process import run_python
from reader.test_reader_training import tiny_classifier

pytestmark = pytest.mark.usefixtures("no_global_seed")

keras = tf.keras


def stored_label_counts(result, split: str) -> collections.Counter:
    """Class id -> records, counted from the shards without the reader."""
    import os

    counts: collections.Counter = collections.Counter()
    for shard in result.info.splits[split].shards:
        path = os.path.join(result.dataset_dir, shard.filename)
        for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
            counts[int(RECORD.decode(serialized)["label"])] += 1
    return counts


def test_counts_and_balanced_weights_by_class_id(png_dataset):
    path = png_dataset.dataset_root
    for split in ("train", "validation", "test"):
        stored = stored_label_counts(png_dataset, split)
        counts = kiln.reader.class_counts(path, split)
        assert counts == {index: stored[index] for index in range(4)}
        weights = kiln.reader.class_weights(path, split)
        total, present = sum(stored.values()), len(stored)
        expected = {c: total / (present * stored[c]) if stored[c] else 0.0 for c in range(4)}
        assert weights == pytest.approx(expected)
        # Every class weighs the same in the loss, and the mean weight of an example is 1.
        assert len({round(weights[c] * n, 9) for c, n in stored.items()}) == 1
        assert sum(weights[c] * n for c, n in stored.items()) == pytest.approx(total)
    assert kiln.reader.class_counts(kiln.reader.info(path)) == kiln.reader.class_counts(path)


def test_a_class_without_examples_weighs_zero(empty_class_dataset):
    info = empty_class_dataset.info
    assert info.class_names[-1] == "unicorn"
    counts = kiln.reader.class_counts(info)
    assert counts[4] == 0 and all(counts[c] > 0 for c in range(4))
    weights = kiln.reader.class_weights(info)
    assert weights[4] == 0.0
    total = sum(counts.values())
    # n_classes counts the four classes that have examples: the mean weight stays 1.
    assert weights == pytest.approx({**{c: total / (4 * counts[c]) for c in range(4)}, 4: 0.0})


def test_balanced_weights_need_label_counts(multilabel_dataset):
    with pytest.raises(TargetError, match="count images per class over label and"):
        kiln.reader.class_weights(multilabel_dataset.dataset_dir)
    with pytest.raises(ValueError, match="method must be one of"):
        kiln.reader.class_weights(multilabel_dataset.dataset_dir, method="inverse")
    # An explicit dict weighs the label of a dataset with targets: (image, targets, weight).
    dataset = kiln.reader.load(
        multilabel_dataset.dataset_dir, batch_size=8, seed=1, class_weight={1: 3.0}
    )
    for _, targets, weights in dataset:
        expected = np.where(targets["label"].numpy() == 1, 3.0, 1.0)
        np.testing.assert_array_equal(weights.numpy(), expected)


def test_load_yields_each_examples_weight(png_dataset):
    path = png_dataset.dataset_dir
    weights = kiln.reader.class_weights(path)
    table = np.array([weights[c] for c in range(4)], np.float32)
    dataset = kiln.reader.load(path, batch_size=8, seed=2, class_weight="balanced")
    assert dataset.element_spec[2] == tf.TensorSpec([None], tf.float32)
    plain = kiln.reader.load(path, batch_size=8, seed=2)
    for (image, label, weight), (same_image, same_label) in zip(dataset, plain, strict=True):
        np.testing.assert_array_equal(image.numpy(), same_image.numpy())
        np.testing.assert_array_equal(label.numpy(), same_label.numpy())
        np.testing.assert_array_equal(weight.numpy(), table[label.numpy()])

    # Labels mixed by mixup mix their weights too; smoothing comes after the weights.
    mixed = kiln.reader.load(
        path,
        batch_size=8,
        seed=2,
        augment=[{"mixup": {"alpha": 0.4}}],
        class_weight="balanced",
        label_smoothing=0.1,
    )
    raw = kiln.reader.load(path, batch_size=8, seed=2, augment=[{"mixup": {"alpha": 0.4}}])
    for (_, _, weight), (_, label) in zip(mixed, raw, strict=True):
        np.testing.assert_allclose(weight.numpy(), label.numpy() @ table, rtol=1e-6)


@pytest.mark.parametrize(
    ("class_weight", "message"),
    [
        ({7: 1.0}, "class id 7 is not one of the dataset's 4 classes"),
        ({0: -1.0}, "finite number >= 0"),
        ({0: float("nan")}, "finite number >= 0"),
        ({"circle": 2.0}, "keys are class ids"),
        ([1.0, 2.0], "'balanced' or a"),
        # Named as load's argument, with the dict form, not as class_weights' method.
        (
            "inverse",
            r"^class_weight must be 'balanced' or a \{class id: weight\} dict, got 'inverse'",
        ),
    ],
)
def test_class_weight_is_checked_before_reading(png_dataset, class_weight, message):
    with pytest.raises(ValueError, match=message):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=1, class_weight=class_weight)
    with pytest.raises(ValueError, match="as_supervised=False"):
        kiln.reader.load(
            png_dataset.dataset_dir, batch_size=8, class_weight="balanced", as_supervised=False
        )


def test_keras_fit_with_weights_from_load_equals_fit_with_class_weight(png_dataset):
    """The per-example weights train exactly as Keras's own ``class_weight``."""
    path = png_dataset.dataset_dir
    weights = kiln.reader.class_weights(path)
    read = {"batch_size": 8, "shuffle": False, "augment": None}

    def trained(dataset, **fit):
        inputs = keras.Input((32, 32, 3))
        model = tiny_classifier(inputs, inputs, 4)
        history = model.fit(dataset, epochs=2, verbose=0, **fit)
        return history.history["loss"], model.get_weights()

    ours, ours_weights = trained(kiln.reader.load(path, class_weight="balanced", **read))
    keras_own, keras_weights = trained(kiln.reader.load(path, **read), class_weight=weights)
    unweighted, _ = trained(kiln.reader.load(path, **read))
    np.testing.assert_allclose(ours, keras_own, rtol=1e-5)
    for a, b in zip(ours_weights, keras_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert not np.allclose(ours, unweighted, rtol=1e-3), "the weights changed nothing"


# Two logical CPUs must be configured before TensorFlow initializes its devices.
MIRRORED_FIT = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import kiln.reader

path = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def make(**knobs):
    def dataset_fn(context):
        return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(8), seed=1,
                                input_context=context, **knobs)
    return strategy.distribute_datasets_from_function(dataset_fn)

with strategy.scope():
    model = keras.Sequential([keras.Input((24, 24, 3)), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(4)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
try:
    model.fit(make(), epochs=1, verbose=0, class_weight=kiln.reader.class_weights(path))
    refused = None
except Exception as e:
    refused = f"{type(e).__name__}: {e}"
history = model.fit(make(class_weight="balanced"), epochs=2, verbose=0)
print(json.dumps({"refused": refused, "loss": history.history["loss"]}))
"""


def test_weights_from_load_train_under_a_strategy_where_class_weight_is_refused(png_dataset):
    out = json.loads(run_python(MIRRORED_FIT, png_dataset.dataset_dir).strip().splitlines()[-1])
    # Keras applies class_weight with Dataset.map, which a distributed dataset has not.
    assert out["refused"] is not None and "has no attribute 'map'" in out["refused"], out
    assert len(out["loss"]) == 2 and np.isfinite(out["loss"]).all()


def test_model_side_batches_carry_labels_and_weights_too(png_dataset):
    path = png_dataset.dataset_dir
    weights = kiln.reader.class_weights(path)
    dataset, _ = kiln.reader.load_for_model(
        path, batch_size=8, seed=2, one_hot=True, class_weight="balanced"
    )
    inputs_spec, label_spec, weight_spec = dataset.element_spec
    assert inputs_spec["image"].dtype == tf.uint8
    assert label_spec == tf.TensorSpec([None, 4], tf.float32)
    assert weight_spec == tf.TensorSpec([None], tf.float32)
    for _, label, weight in dataset:
        ids = np.argmax(label.numpy(), axis=1)
        np.testing.assert_allclose(weight.numpy(), [weights[int(c)] for c in ids], rtol=1e-6)
