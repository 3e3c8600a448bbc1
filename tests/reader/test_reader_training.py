"""Training with the reader: Keras fit, iterator checkpoints, and augmentation inside the model."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from reader.builds import TRAIN_AUGMENT, golden_config, write_golden_corpus

keras = tf.keras

EVERY_ELEMENT_OP = [
    {"random_resized_crop": {"size": 20, "scale_range": [0.3, 1.0]}},
    "random_flip_left_right",
    "random_flip_up_down",
    "color_jitter",
    {"random_rotation": {"angle_range": [-30, 30]}},
    "random_erasing",
    {"random_grayscale": {"probability": 0.3}},
    "random_brightness",
    "random_contrast",
    "random_saturation",
    "random_hue",
    {"random_crop": {"size": 16}},
]


def tiny_classifier(inputs, features, num_classes):
    x = keras.layers.Conv2D(
        16, 3, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed=1)
    )(features)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(
        num_classes, kernel_initializer=keras.initializers.GlorotUniform(seed=2)
    )(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def test_keras_fit_on_demo_data_loss_goes_down(png_dataset):
    path = png_dataset.dataset_dir
    train = kiln.reader.load(path, batch_size=8, seed=0, normalize=True)
    validation = kiln.reader.load(path, "validation", batch_size=8, normalize=True)
    inputs = keras.Input((24, 24, 3))
    model = tiny_classifier(inputs, inputs, png_dataset.info.num_classes)
    history = model.fit(train, validation_data=validation, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-2:]) < losses[0] * 0.9, losses
    assert len(history.history["val_loss"]) == 8


def test_keras_fit_with_augmentation_in_the_model(png_dataset):
    train, augment = kiln.reader.load_for_model(
        png_dataset.dataset_dir, batch_size=8, seed=0, normalize=True
    )
    inputs = {
        "image": keras.Input((32, 32, 3), dtype="uint8", name="image"),
        "augment_seed": keras.Input((2,), dtype="int32", name="augment_seed"),
    }
    model = tiny_classifier(inputs, augment(inputs), png_dataset.info.num_classes)
    history = model.fit(train, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert np.mean(losses[-2:]) < losses[0] * 0.9, losses
    # Without seeds (evaluation, serving) the layer applies the deterministic forms.
    images = next(iter(train))[0]["image"]
    assert augment(images, training=False).shape == (8, 24, 24, 3)


def test_keras_fit_with_jit_compile_runs_the_layer_without_xla(png_dataset):
    # Keras compiles fit's step with XLA where a GPU is present (jit_compile="auto")
    # unless a layer says it cannot be: XLA has no kernel for random_resized_crop's
    # StatelessSampleDistortedBoundingBox nor the rotation's ImageProjectiveTransformV3
    # (fit failed before its first step), and its stateless random ops draw other
    # numbers than the tf.data path's, so crops and flips differed from load's.
    train, augment = kiln.reader.load_for_model(
        png_dataset.dataset_dir, batch_size=8, seed=0, augment=EVERY_ELEMENT_OP
    )
    inputs = {
        "image": keras.Input((32, 32, 3), dtype="uint8", name="image"),
        "augment_seed": keras.Input((2,), dtype="int32", name="augment_seed"),
    }
    model = tiny_classifier(inputs, augment(inputs), png_dataset.info.num_classes)
    with pytest.warns(UserWarning, match="doesn't support `jit_compile=True`"):
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
        history = model.fit(train, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert model.jit_compile is False
    # So does a layer loaded from the model's config (a saved model).
    clone = kiln.reader.AugmentationLayer.from_config(augment.get_config())
    assert clone.supports_jit is False


@pytest.mark.parametrize("fixture", ["jpeg_dataset", "raw_dataset"])
def test_iterator_checkpoint_resumes_exactly(fixture, request, tmp_path):
    path = request.getfixturevalue(fixture).dataset_dir

    def make():
        return kiln.reader.load(path, batch_size=5, seed=9, repeat=2, as_supervised=False)

    iterator = iter(make())
    for _ in range(7):  # mid-epoch: 47 records are 9.4 batches
        next(iterator)
    saved = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "reader"))
    expected = [(b["key"].numpy().tolist(), b["image"].numpy()) for b in iterator]
    assert len(expected) > 10  # crosses into the second pass

    restored = iter(make())
    tf.train.Checkpoint(iterator=restored).read(saved).assert_consumed()
    resumed = [(b["key"].numpy().tolist(), b["image"].numpy()) for b in restored]
    assert [keys for keys, _ in resumed] == [keys for keys, _ in expected]
    for (_, a), (_, b) in zip(resumed, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_at_any_step_restores_every_later_pass(raw_dataset, tmp_path):
    # A checkpoint at each step of three passes, wherever tf.data's buffers
    # had read ahead to. With reshuffling shuffles under `repeat` (stream
    # version 2), TF 2.21 restored the pass after the one being read in
    # another order: 13 of these 29 checkpoints on a busy machine.
    def make():
        return kiln.reader.load(
            raw_dataset.dataset_dir, batch_size=5, seed=9, repeat=3, as_supervised=False
        )

    def keys(batches):
        return [batch["key"].numpy().tolist() for batch in batches]

    uninterrupted = keys(make())
    assert len(uninterrupted) == 29  # 3 x 47 records
    records = [key for batch in uninterrupted for key in batch]
    passes = [records[:47], records[47:94], records[94:]]
    assert passes[0] != passes[1] != passes[2] and sorted(passes[0]) == sorted(passes[2])
    wrong = []
    for step in range(len(uninterrupted)):
        iterator = iter(make())
        for _ in range(step):
            next(iterator)
        saved = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / f"step{step}"))
        restored = iter(make())
        tf.train.Checkpoint(iterator=restored).read(saved).assert_consumed()
        if keys(restored) != uninterrupted[step:]:
            wrong.append(step)
    assert wrong == []


def test_an_iterator_checkpoint_restores_only_into_the_version_it_was_written_on(tmp_path):
    """Restored into a dataset of another version (its path follows LATEST, and a
    build published a version since), the iterator read on from positions in
    the old version's files: records twice and others not at all, silently."""
    from kiln.pipeline import build

    write_golden_corpus(str(tmp_path / "images"))
    first = build(golden_config(str(tmp_path)), [])
    for index in range(6):  # new images: the next build publishes another version
        image = np.full((16, 16, 3), 40 * index, np.uint8)
        (tmp_path / "images" / "a" / f"new_{index}.png").write_bytes(
            tf.io.encode_png(image).numpy()
        )
    second = build(golden_config(str(tmp_path)), [])
    assert second.info.version != first.info.version
    latest = str(tmp_path / "datasets" / "golden")
    assert kiln.reader.locate(latest) == second.dataset_dir

    def make(path):
        return kiln.reader.load(path, batch_size=4, seed=5, repeat=True, as_supervised=False)

    iterator = iter(make(first.dataset_dir))
    next(iterator)
    checkpoint = tf.train.Checkpoint(data=iterator).write(str(tmp_path / "checkpoints" / "c"))
    following = [next(iterator)["key"].numpy() for _ in range(20)]

    same = iter(make(first.dataset_dir))
    tf.train.Checkpoint(data=same).read(checkpoint).assert_consumed()
    for keys in following:
        np.testing.assert_array_equal(next(same)["key"].numpy(), keys)

    other = iter(make(latest))
    tf.train.Checkpoint(data=other).read(checkpoint)
    message = (
        rf"restored from a checkpoint written while reading\] \[golden/{first.info.version}, "
        rf"split train\] \[and this dataset reads\] \[golden/{second.info.version}, split "
        rf"train\].*load the version folder the checkpoint was written with"
    )
    delivered = []
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        for _ in following:
            delivered.append(next(other)["key"].numpy())
    # Batches the checkpoint held in its buffers, made before it was written,
    # are the old version's next ones; every batch made after the restore fails.
    assert len(delivered) < len(following) // 2
    for keys, expected in zip(delivered, following, strict=False):
        np.testing.assert_array_equal(keys, expected)


@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset", "raw_dataset"])
def test_augmentation_in_the_model_equals_the_data_path(fixture, request):
    path = request.getfixturevalue(fixture).dataset_dir
    for augment, normalize in ((TRAIN_AUGMENT, False), (EVERY_ELEMENT_OP, True)):
        data = kiln.reader.load(
            path, batch_size=8, seed=21, repeat=2, augment=augment, normalize=normalize
        )
        model_side, layer = kiln.reader.load_for_model(
            path, batch_size=8, seed=21, repeat=2, augment=augment, normalize=normalize
        )
        assert model_side.element_spec[0]["image"].dtype == tf.uint8
        # Called in this iteration only, with this iteration's layer.
        in_graph = tf.function(lambda batch: layer(batch, training=True))  # noqa: B023
        count = 0
        for (expected, labels), (features, model_labels) in zip(data, model_side, strict=True):
            np.testing.assert_array_equal(labels, model_labels)
            np.testing.assert_array_equal(layer(features, training=True), expected)
            np.testing.assert_array_equal(in_graph(features), expected)
            count += 1
        assert count == data.cardinality()


def test_layer_round_trips_through_keras_config(png_dataset):
    _, layer = kiln.reader.load_for_model(png_dataset.dataset_dir, batch_size=4, normalize=True)
    clone = kiln.reader.AugmentationLayer.from_config(layer.get_config())
    batch = tf.cast(tf.random.stateless_uniform([2, 32, 32, 3], [1, 2], maxval=255), tf.uint8)
    seeds = tf.constant([[1, 2], [3, 4]], tf.int32)
    inputs = {"image": batch, "augment_seed": seeds}
    np.testing.assert_array_equal(clone(inputs, training=True), layer(inputs, training=True))
    with pytest.raises(ValueError, match="needs the batch's 'augment_seed'"):
        layer(batch, training=True)
    # One int per image instead of a pair: TensorFlow said "seed must have
    # shape [2], not []" from inside the layer's map.
    for wrong in (tf.constant([1, 3], tf.int32), tf.constant([[1, 2, 3], [4, 5, 6]], tf.int32)):
        with pytest.raises(ValueError, match=r"'augment_seed' as int32 \[batch, 2\].*got shape"):
            layer({"image": batch, "augment_seed": wrong}, training=True)


def test_layer_refuses_a_single_image_saying_it_needs_a_batch(png_dataset):
    # Without batch_size load_for_model yields single elements; the layer maps
    # over the first dimension, which of one image is its rows.
    crop = [{"random_crop": {"size": 24}}]
    dataset, layer = kiln.reader.load_for_model(png_dataset.dataset_dir, seed=1, augment=crop)
    features, _ = next(iter(dataset))
    assert features["image"].shape == (32, 32, 3)
    with pytest.raises(ValueError, match=r"a batch of images .* got shape \(32, 32, 3\)"):
        layer(features, training=True)
    with pytest.raises(ValueError, match=r"pass batch_size"):
        layer(features["image"], training=False)
    batched = {name: value[None] for name, value in features.items()}
    assert layer(batched, training=True).shape == (1, 24, 24, 3)
