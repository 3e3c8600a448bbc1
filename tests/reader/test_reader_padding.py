"""``load(pad_remainder=True)``: every record once per pass over all input pipelines, in full
batches, the padding marked, so that evaluation counts every record (real builds, real reader)."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from reader import scene_records
from reader.builds import split_keys
from reader.fresh_process import run_python

pytestmark = pytest.mark.usefixtures("no_global_seed")

keras = tf.keras


def contexts(pipelines: int) -> list[tf.distribute.InputContext]:
    return [
        tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=index, num_replicas_in_sync=pipelines
        )
        for index in range(pipelines)
    ]


def padded_batches(path, split, pipelines, **kwargs) -> list[list[dict]]:
    """Each pipeline's batches (features dicts) of one pass, read with padding."""
    out = []
    for context in contexts(pipelines):
        dataset = kiln.reader.load(
            path, split, input_context=context, as_supervised=False, pad_remainder=True, **kwargs
        )
        batches = list(dataset.as_numpy_iterator())
        assert len(batches) == len(dataset) == dataset.cardinality()
        out.append(batches)
    return out


@pytest.mark.parametrize("pipelines", [1, 3])
def test_every_record_is_read_once_in_full_batches_of_equal_count(png_dataset, pipelines):
    path = png_dataset.dataset_dir
    total = png_dataset.info.splits["train"].num_examples  # 47
    assert total % (5 * pipelines)  # a remainder to pad
    shares = padded_batches(path, "train", pipelines, batch_size=5, seed=2)
    # Every pipeline takes as many steps: the largest share's batches.
    largest = -(-total // pipelines)
    assert [len(batches) for batches in shares] == [-(-largest // 5)] * pipelines
    keys = []
    for batches in shares:
        valid = np.concatenate([batch["valid"] for batch in batches])
        real = int(valid.sum())
        assert valid[:real].all() and not valid[real:].any()  # the records, then padding
        for batch in batches:
            assert batch["image"].shape == (5, 24, 24, 3) and batch["label"].shape == (5,)
            padding = ~batch["valid"]
            assert (batch["image"][padding] == 0).all() and (batch["label"][padding] == 0).all()
            assert (batch["key"][padding] == b"").all() and (batch["height"][padding] == 0).all()
            keys += batch["key"][batch["valid"]].tolist()
    # All pipelines together: the split, each record once.
    assert collections.Counter(keys) == collections.Counter(split_keys(png_dataset, "train"))
    if pipelines == 3:  # 15, 16 and 16 records: the first pads a whole batch
        assert not shares[0][-1]["valid"].any()


@pytest.mark.parametrize("pipelines", [1, 3])
def test_padding_leaves_the_records_as_they_are_without_it(png_dataset, pipelines):
    """Each record's augmentation is a function of (seed, pass, key); one
    pipeline's padded read is the plain read's stream, then padding."""
    path = png_dataset.dataset_dir
    read = {"batch_size": 5, "seed": 2}
    for context, batches in zip(
        contexts(pipelines), padded_batches(path, "train", pipelines, **read), strict=True
    ):
        plain = kiln.reader.load(path, input_context=context, as_supervised=False, **read)
        expected = {
            key: image
            for batch in plain.as_numpy_iterator()
            for key, image in zip(batch["key"], batch["image"], strict=True)
        }
        ours = [
            (key, image)
            for batch in batches
            for key, image, valid in zip(batch["key"], batch["image"], batch["valid"], strict=True)
            if valid
        ]
        if pipelines == 1:
            assert [key for key, _ in ours] == list(expected)
        for key, image in ours:
            if key in expected:  # with 3 pipelines, the plain read leaves one out
                np.testing.assert_array_equal(image, expected[key])


def test_supervised_batches_get_a_sample_weight_of_0_for_padding(png_dataset):
    path = png_dataset.dataset_dir
    total = png_dataset.info.splits["validation"].num_examples
    assert total % 4  # a remainder to pad
    read = {"batch_size": 4, "pad_remainder": True}
    dataset = kiln.reader.load(path, "validation", **read)
    assert dataset.element_spec[2] == tf.TensorSpec([4], tf.float32)
    weights = np.concatenate([weight for _, _, weight in dataset.as_numpy_iterator()])
    assert weights.tolist() == [1.0] * total + [0.0] * (-total % 4)

    # With class weights: each record's class weight, padding 0.
    class_weight = {0: 0.5, 1: 2.0, 2: 3.0, 3: 4.0}
    weighted = kiln.reader.load(path, "validation", class_weight=class_weight, **read)
    labels, weights = (
        np.concatenate(parts)
        for parts in zip(
            *[(label, weight) for _, label, weight in weighted.as_numpy_iterator()], strict=True
        )
    )
    expected = [class_weight[label] for label in labels[:total]] + [0.0] * (-total % 4)
    np.testing.assert_array_equal(weights, np.asarray(expected, np.float32))

    # The model-side dataset: ({"image", "augment_seed"}, label, weight).
    for_model, _ = kiln.reader.load_for_model(path, "validation", **read)
    inputs, label, weight = for_model.element_spec
    assert inputs["image"].shape == [4, 32, 32, 3] and label.shape == [4] and weight.shape == [4]


def _model(input_shape, num_classes):
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(
                num_classes, kernel_initializer=keras.initializers.RandomNormal(seed=1)
            ),
        ]
    )
    model.compile(
        "sgd",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="crossentropy"),
        ],
    )
    return model


def test_keras_evaluate_on_padded_batches_equals_the_whole_split_unpadded(png_dataset):
    """An image of padding (zeros) gets the logits of the bias alone, class 0
    here, and its label is 0: counted, it would raise the accuracy."""
    path, info = png_dataset.dataset_dir, png_dataset.info
    total = info.splits["train"].num_examples
    read = {"batch_size": 5, "shuffle": False, "training": False}
    whole = kiln.reader.load(path, **read)
    model = _model(whole.element_spec[0].shape[1:], info.num_classes)
    expected = model.evaluate(whole, verbose=0, return_dict=True)
    assert expected["loss"] == pytest.approx(expected["crossentropy"], rel=1e-6)

    one = kiln.reader.load(path, pad_remainder=True, **read)
    pipelines = [
        kiln.reader.load(path, pad_remainder=True, input_context=c, **read) for c in contexts(3)
    ]
    three = pipelines[0].concatenate(pipelines[1]).concatenate(pipelines[2])
    for padded, slots in ((one, 50), (three, 3 * 20)):
        got = model.evaluate(padded, verbose=0, return_dict=True)
        assert got["accuracy"] == pytest.approx(expected["accuracy"], rel=1e-6)
        assert got["crossentropy"] == pytest.approx(expected["crossentropy"], rel=1e-5)
        # Keras's own loss divides by every slot of a batch, padding too.
        assert got["loss"] == pytest.approx(expected["crossentropy"] * total / slots, rel=1e-5)
    # `metrics` (not `weighted_metrics`) count the padding as examples.
    model.compile(
        "sgd",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    counted = model.evaluate(one, verbose=0, return_dict=True)
    assert counted["accuracy"] == pytest.approx((expected["accuracy"] * total + 3) / 50)


NUM_SCENES = 7


@pytest.fixture(scope="module")
def scenes_dataset(tmp_path_factory):
    """7 scenes with boxes, keypoints, a class mask and instance masks: PNG, 64x64, 2 shards."""
    from reader import scenes

    targets = {
        "boxes": {},
        "mask": {"ignore_value": 255},
        "instance_masks": {},
        "keypoints": {"names": list(scenes.KEYPOINT_NAMES)},
    }
    return scene_records.build_scenes(
        str(tmp_path_factory.mktemp("padded-scenes")), targets, [], count=NUM_SCENES
    )


@pytest.mark.parametrize("pipelines", [1, 2])
def test_detection_batches_with_max_objects_are_padded_to_static_shapes(scenes_dataset, pipelines):
    path, info = scenes_dataset.dataset_dir, scenes_dataset.info
    most = info.objects["train"].most_objects
    read = {"batch_size": 3, "seed": 1, "max_objects": most}
    shares = padded_batches(path, "train", pipelines, **read)
    # 7 scenes: one pipeline 3 batches; two pipelines (3 and 4 scenes) 2 each.
    assert [len(batches) for batches in shares] == [3] if pipelines == 1 else [2, 2]
    plain = {
        key: dict(zip(batch, values, strict=True))
        for batch in kiln.reader.load(path, as_supervised=False, **read).as_numpy_iterator()
        for key, *values in zip(batch["key"], *batch.values(), strict=True)
    }
    keys = []
    for batches in shares:
        for batch in batches:
            padding = ~batch["valid"]
            assert (batch["classes"][padding] == -1).all()
            assert (batch["num_objects"][padding] == 0).all()
            for name in ("image", "boxes", "keypoints", "instance_masks"):
                assert (batch[name][padding] == 0).all(), name
            # The class mask's padding is the ignore value: a loss that skips it skips padding.
            assert (batch["mask"][padding] == 255).all()
            for index in np.flatnonzero(batch["valid"]):
                key = batch["key"][index]
                keys.append(key)
                for name, value in plain[key].items():
                    np.testing.assert_array_equal(batch[name][index], value, err_msg=name)
    assert len(plain) == NUM_SCENES and sorted(keys) == sorted(plain)

    # As (image, targets, weight): every tensor has a static shape.
    dataset = kiln.reader.load(
        path, pad_remainder=True, input_context=contexts(pipelines)[0], **read
    )
    for spec in tf.nest.flatten(dataset.element_spec):
        assert spec.shape.is_fully_defined() and spec.shape[0] == 3, spec
    *_, (image, targets, weight) = dataset.as_numpy_iterator()
    assert weight.tolist() == ([1.0, 0.0, 0.0] if pipelines == 1 else [0.0, 0.0, 0.0])


def test_detection_batches_without_max_objects_pad_with_elements_of_no_objects(scenes_dataset):
    path = scenes_dataset.dataset_dir
    dataset = kiln.reader.load(path, batch_size=3, seed=1, pad_remainder=True)
    image_spec, targets_spec, _ = dataset.element_spec
    assert targets_spec["boxes"].shape.as_list() == [3, None, 4]
    *_, (image, targets, weight) = dataset
    assert weight.numpy().tolist() == [1.0, 0.0, 0.0]
    assert targets["boxes"].row_lengths().numpy()[1:].tolist() == [0, 0]
    assert targets["instance_masks"].row_lengths().numpy()[1:].tolist() == [0, 0]
    assert targets["boxes"].row_lengths().numpy()[0] > 0


def test_more_input_pipelines_than_records_yield_padding(png_dataset):
    """Refused without padding (a pipeline would read nothing); with it, the
    pipelines without a record yield a batch of padding alone."""
    total = png_dataset.info.splits["validation"].num_examples
    shares = padded_batches(png_dataset.dataset_dir, "validation", total + 2, batch_size=2)
    assert [len(batches) for batches in shares] == [1] * (total + 2)
    keys = [key for (batch,) in shares for key in batch["key"][batch["valid"]]]
    assert sorted(keys) == sorted(split_keys(png_dataset, "validation"))
    assert sum(not batch["valid"].any() for (batch,) in shares) == 2


@pytest.mark.parametrize("skip", [1, 3])
def test_skip_with_padding_is_the_padded_datasets_skip(png_dataset, skip):
    context = contexts(3)[0]  # 15 records: 3 batches of them, one of padding
    read = {"batch_size": 5, "seed": 2, "as_supervised": False, "pad_remainder": True}
    path = png_dataset.dataset_dir
    whole = kiln.reader.load(path, input_context=context, **read)
    skipped = kiln.reader.load(path, input_context=context, skip=skip, **read)
    assert len(skipped) == 4 - skip
    for ours, theirs in zip(skipped, whole.skip(skip), strict=True):
        assert ours["key"].numpy().tolist() == theirs["key"].numpy().tolist()
        assert ours["valid"].numpy().tolist() == theirs["valid"].numpy().tolist()


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"batch_size": None}, r"^pad_remainder=True fills the last batch up to batch_size: pass"),
        (
            {"drop_remainder": True},
            r"^drop_remainder=True and pad_remainder=True: one drops the last partial batch",
        ),
        ({"repeat": 2}, r"^pad_remainder=True pads the end of one pass, and with repeat=2 "),
        ({"repeat": True}, r"with repeat=True batches run on across passes; leave repeat=False"),
        (
            {"options": kiln.reader.ReadOptions(dynamic_sharding=True)},
            r"^pad_remainder=True with ReadOptions\(dynamic_sharding=True\)",
        ),
        (
            {"augment": [{"mixup": {"alpha": 0.2}}], "training": True},
            r"^pad_remainder=True with \['mixup'\] in training: they would mix padding",
        ),
        ({"pad_remainder": 1}, r"^pad_remainder must be True or False, got 1$"),
    ],
)
def test_combinations_padding_cannot_serve_are_refused_in_one_line(png_dataset, knobs, message):
    knobs = {"batch_size": 4, "seed": 1, "pad_remainder": True, **knobs}
    with pytest.raises(ValueError, match=message) as raised:
        kiln.reader.load(png_dataset.dataset_dir, **knobs)
    assert "\n" not in str(raised.value)


def test_mixup_in_its_inference_form_is_padded(png_dataset):
    """On validation the list's mixup mixes nothing (its labels stay one-hot): padded."""
    dataset = kiln.reader.load(
        png_dataset.dataset_dir,
        "validation",
        batch_size=4,
        augment=[{"mixup": {"alpha": 0.2}}],
        pad_remainder=True,
    )
    *_, (_, labels, weight) = dataset.as_numpy_iterator()
    padding = weight == 0
    assert padding.any() and (labels[padding] == 0).all() and labels.shape[1] == 4


# Keras's evaluate under a two-replica MirroredStrategy, one padded pipeline
# per replica, against the same model on the whole split outside it.
KERAS_EVALUATE_PADDED_REPLICAS = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader
keras = tf.keras

path = sys.argv[1]
info = kiln.reader.info(path)
read = {"batch_size": 4, "shuffle": False, "training": False}

def model():
    built = keras.Sequential([
        keras.Input((24, 24, 3)), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(info.num_classes,
                           kernel_initializer=keras.initializers.RandomNormal(seed=1))])
    built.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[
                      keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                      keras.metrics.SparseCategoricalCrossentropy(from_logits=True,
                                                                  name="crossentropy")])
    return built

plain = model()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    mirrored = model()
mirrored.set_weights(plain.get_weights())
padded = strategy.distribute_datasets_from_function(
    lambda context: kiln.reader.load(path, pad_remainder=True, input_context=context, **read),
    tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA))
print(json.dumps({
    "plain": plain.evaluate(kiln.reader.load(path, **read), verbose=0, return_dict=True),
    "mirrored": mirrored.evaluate(padded, verbose=0, return_dict=True)}))
"""


def test_keras_evaluate_on_padded_replicas_equals_the_whole_split(png_dataset):
    out = json.loads(
        run_python(KERAS_EVALUATE_PADDED_REPLICAS, png_dataset.dataset_dir).splitlines()[-1]
    )
    for name in ("accuracy", "crossentropy"):
        assert out["mirrored"][name] == pytest.approx(out["plain"][name], rel=1e-5), name


def test_raw_batches_decoded_at_once_are_padded_too(raw_dataset):
    """Raw pixels with no element op are decoded a batch at a time: padded after it."""
    total = raw_dataset.info.splits["validation"].num_examples
    assert total % 4  # a remainder to pad
    dataset = kiln.reader.load(
        raw_dataset.dataset_dir,
        "validation",
        batch_size=4,
        augment=None,
        as_supervised=False,
        pad_remainder=True,
    )
    assert dataset.element_spec["image"].shape == [4, 32, 32, 3]
    batches = list(dataset.as_numpy_iterator())
    valid = np.concatenate([batch["valid"] for batch in batches])
    assert valid.tolist() == [True] * total + [False] * (-total % 4)
    keys = [key for batch in batches for key in batch["key"][batch["valid"]]]
    assert sorted(keys) == sorted(split_keys(raw_dataset, "validation"))
