"""A model with kiln's augmentation layer: trained with seeds, saved, loaded and served on images.

The model is trained as a trainer would (`load_for_model`, Keras `fit` on
``{"image", "augment_seed"}``), and the model that predicts, is saved and is
exported shares its layers but takes images only. Loading and serving run
in fresh interpreters, where nothing but ``import kiln.reader`` can have
told Keras about the layer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader import saving
from reader.fresh_process import run_python

keras = tf.keras

# Loads the saved model and the exported SavedModel, predicts on the saved images only.
LOAD_AND_SERVE = """
import json, sys
import numpy as np
{first}
tensorflow_after_first = "tensorflow" in sys.modules
{second}
import tensorflow as tf
with open(sys.argv[1]) as f:
    images = np.asarray(json.load(f), np.uint8)
model = keras.models.load_model(sys.argv[2])
served = tf.saved_model.load(sys.argv[3])
signature = served.signatures["serving_default"]
print(json.dumps({{
    "predicted": model.predict(images, verbose=0).tolist(),
    "served": served.serve(tf.constant(images)).numpy().tolist(),
    "tensorflow_after_first": tensorflow_after_first,
    "layer": type(model.get_layer("augment")).__module__,
    "serving_inputs": {{name: [spec.dtype.name, spec.shape.as_list()]
                        for name, spec in signature.structured_input_signature[1].items()}},
}}))
"""

IMPORT_ORDERS = {
    # kiln.reader first (without TensorFlow): Keras learns the name when it is imported,
    # by itself or by TensorFlow.
    "kiln then keras": ("import kiln.reader", "import keras"),
    "kiln then tensorflow": ("import kiln.reader", "import tensorflow as tf\nkeras = tf.keras"),
    # Keras first: importing kiln.reader registers the name at once.
    "keras then kiln": ("import keras", "import kiln.reader"),
}


def classifier(dataset_dir, num_classes):
    """(trainer, model, train): the same layers on ``{"image", "augment_seed"}`` and on images."""
    train, augment = kiln.reader.load_for_model(dataset_dir, batch_size=8, seed=3, normalize=True)
    augment = kiln.reader.AugmentationLayer.from_config(dict(augment.get_config(), name="augment"))
    network = keras.Sequential(
        [
            keras.layers.Conv2D(
                8, 3, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(1)
            ),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes, kernel_initializer=keras.initializers.GlorotUniform(2)),
        ]
    )
    image = keras.Input((32, 32, 3), dtype="uint8", name="image")
    seed = keras.Input((2,), dtype="int32", name="augment_seed")
    trainer = keras.Model(
        {"image": image, "augment_seed": seed},
        network(augment({"image": image, "augment_seed": seed})),
    )
    model = keras.Model(image, network(augment(image)))
    trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return trainer, model, train


@pytest.fixture(scope="module")
def saved_classifier(png_dataset, tmp_path_factory):
    """A trained classifier saved as .keras and exported, with images and its predictions."""
    root = tmp_path_factory.mktemp("serving")
    trainer, model, train = classifier(png_dataset.dataset_dir, png_dataset.info.num_classes)
    images = next(iter(train))[0]["image"].numpy()
    untrained = model.predict(images, verbose=0)
    trainer.fit(train, epochs=2, verbose=0)
    predictions = model.predict(images, verbose=0)
    # The image-only model holds the trainer's weights: training changed what it predicts.
    assert not np.allclose(predictions, untrained)
    paths = {name: str(root / name) for name in ("images.json", "model.keras", "exported")}
    (root / "images.json").write_text(json.dumps(images.tolist()))
    model.save(paths["model.keras"])
    model.export(paths["exported"], verbose=False)
    return paths, images, predictions, model


def test_predict_needs_images_only(saved_classifier, png_dataset):
    _, images, predictions, model = saved_classifier
    assert [tensor.name for tensor in model.inputs] == ["image"]
    np.testing.assert_array_equal(model.predict(images, verbose=0), predictions)
    # Prediction uses the layer's inference form: the deterministic centre crop,
    # exactly what `load` gives the train split with training=False.
    augment = model.get_layer("augment")
    inference = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=8, shuffle=False, normalize=True, training=False
    )
    stored, _ = kiln.reader.load_for_model(
        png_dataset.dataset_dir, batch_size=8, shuffle=False, normalize=True, training=False
    )
    expected = next(iter(inference))[0]
    np.testing.assert_array_equal(augment(next(iter(stored))[0]["image"]), expected)


@pytest.mark.parametrize("order", sorted(IMPORT_ORDERS))
def test_saved_model_loads_after_import_kiln_reader_and_serves_images(saved_classifier, order):
    paths, _, predictions, _ = saved_classifier
    first, second = IMPORT_ORDERS[order]
    out = run_python(
        LOAD_AND_SERVE.format(first=first, second=second),
        paths["images.json"],
        paths["model.keras"],
        paths["exported"],
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["tensorflow_after_first"] == (first == "import keras")
    assert report["layer"] == "kiln.reader.layer"
    # The serving signature takes the uint8 images and nothing else.
    assert list(report["serving_inputs"].values()) == [["uint8", [None, 32, 32, 3]]]
    # JSON carries float32 exactly (as float64 repr).
    np.testing.assert_array_equal(np.asarray(report["predicted"], np.float32), predictions)
    np.testing.assert_allclose(report["served"], predictions, rtol=1e-6, atol=1e-6)


def test_without_import_kiln_reader_keras_cannot_find_the_layer(saved_classifier):
    paths, *_ = saved_classifier
    out = run_python(
        "import sys, keras\n"
        "try:\n"
        "    keras.models.load_model(sys.argv[1])\n"
        "except TypeError as e:\n"
        "    print('refused:', 'kiln>AugmentationLayer' in str(e))\n",
        paths["model.keras"],
    )
    assert out.strip().splitlines()[-1] == "refused: True"


def test_the_layer_registers_under_the_name_kiln_reader_saving_stands_in_for():
    assert keras.utils.get_registered_name(kiln.reader.AugmentationLayer) == (
        saving.REGISTERED_NAME
    )
    assert keras.utils.get_registered_object(saving.REGISTERED_NAME) is (
        kiln.reader.AugmentationLayer
    )


def test_training_without_seeds_says_how_to_build_the_two_models(png_dataset):
    _, augment = kiln.reader.load_for_model(png_dataset.dataset_dir, batch_size=4, seed=0)
    images = tf.zeros([2, 32, 32, 3], tf.uint8)
    with pytest.raises(ValueError, match="predict or serve one on images only"):
        augment(images, training=True)


def test_a_float_image_input_is_refused_naming_the_uint8_input(png_dataset):
    # A Keras Input without dtype is float32: Keras casts the uint8 batch to
    # float 0..255, which the layer would take for [0, 1] floats and clip.
    train, augment = kiln.reader.load_for_model(
        png_dataset.dataset_dir, batch_size=4, seed=0, normalize=True
    )
    inputs, _ = next(iter(train))
    refused = r"takes uint8 images .* got float32: .*keras\.Input\(\.\.\., dtype=\"uint8\"\)"
    image = keras.Input((32, 32, 3), name="image")
    seed = keras.Input((2,), dtype="int32", name="augment_seed")
    with pytest.raises(ValueError, match=refused):
        keras.Model(
            {"image": image, "augment_seed": seed}, augment({"image": image, "augment_seed": seed})
        )
    with pytest.raises(ValueError, match=refused):
        keras.Model(image, augment(image))
    # Called eagerly, in training and in inference, whatever float it is.
    floats = tf.cast(inputs["image"], tf.float32)
    with pytest.raises(ValueError, match=refused):
        augment({"image": floats, "augment_seed": inputs["augment_seed"]}, training=True)
    with pytest.raises(ValueError, match=refused):
        augment(floats / 255.0, training=False)
    with pytest.raises(ValueError, match=r"got int32"):
        augment(tf.cast(inputs["image"], tf.int32), training=False)
    with pytest.raises(ValueError) as outside:
        augment(floats, training=False)
    assert "strategy" not in str(outside.value)
    # Under a strategy Keras' fit makes float images of a model not built yet
    # (it averages a first batch across the replicas): the message says so.
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(
            ValueError,
            match=r"Under a tf\.distribute strategy Keras' fit .* "
            r"calling it once on a uint8 batch inside strategy\.scope\(\)",
        ):
            augment(floats, training=False)
    # The uint8 input gives what `load` gives.
    expected = next(
        iter(kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=0, normalize=True))
    )[0]
    image = keras.Input((32, 32, 3), dtype="uint8", name="image")
    trainer = keras.Model(
        {"image": image, "augment_seed": seed}, augment({"image": image, "augment_seed": seed})
    )
    np.testing.assert_array_equal(trainer(inputs, training=True), expected)
