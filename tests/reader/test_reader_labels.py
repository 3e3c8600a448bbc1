"""Labels as losses want them: one-hot, multi-hot and label smoothing, on real builds."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader.targets import TargetError
from kiln.schemas import Schema

pytestmark = pytest.mark.usefixtures("no_global_seed")

keras = tf.keras


def labels_of(dataset) -> np.ndarray:
    return np.concatenate([label.numpy() for _, label in dataset])


def stored_labels(result, split: str) -> dict[bytes, dict]:
    """key -> the record's decoded targets, read from the shards without the reader."""
    import os

    schema = Schema.from_json(result.info.schema)
    out = {}
    for shard in result.info.splits[split].shards:
        path = os.path.join(result.dataset_dir, shard.filename)
        for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
            record = schema.decode(serialized)
            out[record["key"]] = record
    return out


def test_one_hot_and_smoothing_follow_the_class_ids(png_dataset):
    path, classes = png_dataset.dataset_dir, png_dataset.info.num_classes
    plain = {"batch_size": 8, "shuffle": False, "augment": None}
    ids = labels_of(kiln.reader.load(path, **plain))
    assert ids.dtype == np.int64 and len(set(ids.tolist())) == classes

    hot = kiln.reader.load(path, one_hot=True, **plain)
    assert hot.element_spec[1] == tf.TensorSpec([None, classes], tf.float32)
    np.testing.assert_array_equal(labels_of(hot), np.eye(classes, dtype=np.float32)[ids])

    smoothed = labels_of(kiln.reader.load(path, one_hot=True, label_smoothing=0.2, **plain))
    np.testing.assert_allclose(smoothed, np.eye(classes)[ids] * 0.8 + 0.2 / classes, atol=1e-7)
    # The same as Keras's own smoothing in CategoricalCrossentropy.
    logits = tf.random.stateless_normal([len(ids), classes], seed=[1, 2])
    ours = keras.losses.CategoricalCrossentropy(from_logits=True)(smoothed, logits)
    theirs = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2)(
        np.eye(classes)[ids], logits
    )
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


def test_mixed_labels_are_smoothed_not_one_hot_again(png_dataset):
    path, classes = png_dataset.dataset_dir, png_dataset.info.num_classes
    augment = ["random_flip_left_right", {"mixup": {"alpha": 0.4}}]

    def read(**knobs):
        dataset = kiln.reader.load(path, batch_size=8, seed=5, augment=augment, **knobs)
        batches = list(dataset)
        return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])

    images, mixed = read()
    assert not np.isin(mixed, [0.0, 1.0]).all(), "mixup mixed nothing"
    same_images, one_hot = read(one_hot=True)
    np.testing.assert_array_equal(one_hot, mixed)
    np.testing.assert_array_equal(same_images, images)
    _, smoothed = read(label_smoothing=0.1)
    np.testing.assert_allclose(smoothed, mixed * 0.9 + 0.1 / classes, atol=1e-7)


def test_a_mixing_list_gives_validation_the_training_label_format(png_dataset):
    """The inference form of a list with mixup mixes nothing but keeps its
    vectors: one list, one loss and the same knobs serve fit's train and
    validation data."""
    path, classes = png_dataset.dataset_dir, png_dataset.info.num_classes
    augment = [{"random_resized_crop": {"size": 32}}, {"mixup": {"alpha": 0.2}}]
    knobs = {"batch_size": 8, "seed": 3, "augment": augment, "label_smoothing": 0.1}
    train = kiln.reader.load(path, "train", **knobs)
    validation = kiln.reader.load(path, "validation", **knobs)
    assert validation.element_spec[1] == train.element_spec[1]
    assert validation.element_spec[1] == tf.TensorSpec([None, classes], tf.float32)
    ids = labels_of(kiln.reader.load(path, "validation", batch_size=8, augment=None))
    smoothed = labels_of(validation)
    np.testing.assert_allclose(smoothed, np.eye(classes)[ids] * 0.9 + 0.1 / classes, atol=1e-7)

    model = keras.Sequential(
        [keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(classes)]
    )
    model.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True))
    history = model.fit(train, validation_data=validation, epochs=1, verbose=0)
    assert np.isfinite(history.history["val_loss"][0])


def test_multi_label_datasets_get_multi_hot_labels(multilabel_dataset):
    path, info = multilabel_dataset.dataset_dir, multilabel_dataset.info
    classes = info.num_classes
    stored = stored_labels(multilabel_dataset, "train")
    assert any(len(record["labels"]) > 1 for record in stored.values())

    features = kiln.reader.load(
        path, batch_size=8, seed=1, one_hot=True, label_smoothing=0.1, as_supervised=False
    )
    assert features.element_spec["labels"] == tf.TensorSpec([None, classes], tf.float32)
    assert features.element_spec["label"] == tf.TensorSpec([None, classes], tf.float32)
    seen = 0
    for batch in features.as_numpy_iterator():
        for key, labels, label in zip(batch["key"], batch["labels"], batch["label"], strict=True):
            record = stored[key]
            hot = np.zeros(classes)
            hot[record["labels"]] = 1.0
            np.testing.assert_allclose(labels, hot * 0.9 + 0.05, atol=1e-7)
            np.testing.assert_allclose(
                label, np.eye(classes)[record["label"]] * 0.9 + 0.1 / classes, atol=1e-7
            )
            seen += 1
    assert seen == info.splits["train"].num_examples

    # Unbatched, and as (image, targets): the same vectors per element.
    single = kiln.reader.load(path, "test", batch_size=None, one_hot=True)
    image, targets = next(iter(single))
    assert targets["labels"].shape == (classes,) and targets["labels"].dtype == tf.float32
    assert targets["label"].shape == (classes,)
    assert set(np.unique(targets["labels"].numpy())) <= {0.0, 1.0}
    # Keras's BinaryCrossentropy smooths multi-hot labels the same way.
    logits = tf.random.stateless_normal([4, classes], seed=[3, 4])
    hot = np.eye(classes, dtype=np.float32)[[0, 1, 2, 3]] + np.eye(classes)[[1, 2, 3, 0]]
    ours = keras.losses.BinaryCrossentropy(from_logits=True)(hot * 0.9 + 0.05, logits)
    theirs = keras.losses.BinaryCrossentropy(from_logits=True, label_smoothing=0.1)(hot, logits)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    ("knobs", "error", "message"),
    [
        ({"label_smoothing": 0.1}, ValueError, "pass one_hot=True"),
        ({"one_hot": True, "label_smoothing": 1.0}, ValueError, r"in \[0, 1\)"),
        ({"one_hot": True, "label_smoothing": -0.1}, ValueError, r"in \[0, 1\)"),
        ({"one_hot": True, "label_smoothing": True}, ValueError, r"in \[0, 1\)"),
        ({"one_hot": True, "label_smoothing": "0.1"}, ValueError, r"in \[0, 1\)"),
        ({"one_hot": 1}, ValueError, "one_hot must be True or False"),
    ],
)
def test_label_options_are_checked_before_reading(png_dataset, knobs, error, message):
    with pytest.raises(error, match=message):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=1, **knobs)


def test_one_hot_needs_per_image_labels(tmp_path_factory):
    from reader import scene_records

    boxes_only = scene_records.build_scenes(
        str(tmp_path_factory.mktemp("boxes-only")), {"boxes": {}}, [], count=2, num_shards=1
    )
    with pytest.raises(TargetError, match="no per-image class ids"):
        kiln.reader.load(boxes_only.dataset_dir, batch_size=2, seed=1, one_hot=True)
    # Not "pass one_hot=True", which this dataset refuses as above.
    with pytest.raises(
        TargetError,
        match=r"^label_smoothing=0\.1: this dataset has no per-image class ids to encode "
        r"\(label or labels; targets \['boxes'\]\)",
    ):
        kiln.reader.load(boxes_only.dataset_dir, batch_size=2, seed=1, label_smoothing=0.1)


# --- class ids as int32 (ReadOptions.label_dtype) ----------------------------------------


def int32() -> kiln.reader.ReadOptions:
    return kiln.reader.ReadOptions(label_dtype="int32")


def test_label_dtype_int32_gives_labels_as_int32_with_the_same_ids(png_dataset):
    path = png_dataset.dataset_dir
    plain = {"batch_size": 8, "seed": 1}
    ids = labels_of(kiln.reader.load(path, **plain))
    narrow = kiln.reader.load(path, options=int32(), **plain)
    assert narrow.element_spec[1] == tf.TensorSpec([None], tf.int32)
    np.testing.assert_array_equal(labels_of(narrow), ids.astype(np.int32))
    # The dict of features, single elements, the model-side dataset, class weights: int32.
    features = kiln.reader.load(path, as_supervised=False, options=int32(), **plain)
    assert features.element_spec["label"].dtype == tf.int32
    assert kiln.reader.load(path, options=int32()).element_spec[1].dtype == tf.int32
    for_model, _ = kiln.reader.load_for_model(path, options=int32(), **plain)
    assert for_model.element_spec[1].dtype == tf.int32
    weighted = kiln.reader.load(path, options=int32(), class_weight="balanced", **plain)
    assert weighted.element_spec[1].dtype == tf.int32
    # Vectors stay float32.
    hot = kiln.reader.load(path, one_hot=True, options=int32(), **plain)
    assert hot.element_spec[1] == tf.TensorSpec([None, png_dataset.info.num_classes], tf.float32)


def test_label_dtype_int32_gives_multi_labels_as_int32(multilabel_dataset):
    path = multilabel_dataset.dataset_dir
    read = {"batch_size": 8, "seed": 1, "as_supervised": False}
    wide = list(kiln.reader.load(path, **read).as_numpy_iterator())
    narrow = kiln.reader.load(path, options=int32(), **read)
    assert narrow.element_spec["labels"].dtype == tf.int32
    assert narrow.element_spec["label"].dtype == tf.int32
    for ours, theirs in zip(narrow.as_numpy_iterator(), wide, strict=True):
        assert ours["label"].dtype == np.int32  # ragged labels: an array per image
        for row, expected in zip(ours["labels"], theirs["labels"], strict=True):
            assert row.dtype == np.int32
            np.testing.assert_array_equal(row, expected)


@pytest.fixture(scope="module")
def boxes_dataset(tmp_path_factory):
    from reader import scene_records

    return scene_records.build_scenes(
        str(tmp_path_factory.mktemp("boxes")), {"boxes": {}}, [], count=3, num_shards=1
    )


@pytest.mark.parametrize("max_objects", [None, 6])
def test_label_dtype_int32_gives_object_classes_as_int32(boxes_dataset, max_objects):
    read = {"batch_size": 3, "seed": 1, "max_objects": max_objects}
    _, wide = next(iter(kiln.reader.load(boxes_dataset.dataset_dir, **read)))
    _, narrow = next(iter(kiln.reader.load(boxes_dataset.dataset_dir, options=int32(), **read)))
    assert narrow["classes"].dtype == tf.int32
    if max_objects is not None:  # padded objects' classes are -1, as in int64
        assert (wide["classes"].numpy() == -1).any()
    np.testing.assert_array_equal(
        narrow["classes"].numpy() if max_objects else narrow["classes"].flat_values.numpy(),
        (wide["classes"] if max_objects else wide["classes"].flat_values).numpy(),
    )


@pytest.mark.parametrize(
    ("label_dtype", "expected"),
    [
        ("int32", "int32"),
        (np.int32, "int32"),
        (np.dtype("int32"), "int32"),
        (tf.int32, "int32"),
        ("int64", "int64"),
        (tf.int64, "int64"),
    ],
)
def test_label_dtype_is_a_name_or_a_numpy_or_tensorflow_dtype(label_dtype, expected):
    options = kiln.reader.ReadOptions(label_dtype=label_dtype)
    assert options.label_dtype == expected
    assert options == kiln.reader.ReadOptions(label_dtype=expected)


@pytest.mark.parametrize("label_dtype", ["int16", np.float32, tf.uint8, 32, None])
def test_other_label_dtypes_are_refused_when_the_options_are_made(label_dtype):
    with pytest.raises(
        ValueError,
        match=r"^ReadOptions\.label_dtype must be one of \('int64', 'int32'\) \(the class ids' "
        r"dtype\), got ",
    ):
        kiln.reader.ReadOptions(label_dtype=label_dtype)
