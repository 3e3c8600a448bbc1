"""The reader on a real detection + segmentation build: targets follow every augmentation.

The dataset is written by `kiln build` from a JSONL manifest of scenes
(`scenes.scene`: filled rectangles with exactly known boxes, class mask,
instance masks and keypoint markers), so these tests read what users get.
Every check recovers the objects from the augmented pixels alone; the
geometric ops resample with nearest-neighbour, so those pixels are exact
(see test_reader_targets_ops.py), and colour ops, which would change the
colours the checks read objects by, are tested apart.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader.targets import TargetError
from reader import scenes

pytestmark = pytest.mark.usefixtures("no_global_seed")

NUM_SCENES = 8
TARGETS = {
    "boxes": {"min_visibility": 0.25},
    "mask": {"ignore_value": 255},
    "instance_masks": {},
    "keypoints": {"names": list(scenes.KEYPOINT_NAMES), "flip_pairs": [["left", "right"]]},
}
STORED_AUGMENT = [
    {"random_resized_crop": {"size": 48, "scale_range": [0.4, 1.0], "method": "nearest"}},
    "random_flip_left_right",
]
LISTS = {
    "stored": "default",
    "geometry": [
        {"random_resized_crop": {"size": 56, "scale_range": [0.5, 1.0], "method": "nearest"}},
        "random_flip_left_right",
        {"random_rotation": {"angle_range": [-25, 25], "interpolation": "nearest"}},
        "random_flip_up_down",
        {"random_zoom": {"factor_range": [0.8, 1.25], "interpolation": "nearest"}},
        {"random_erasing": {"probability": 0.5}},
    ],
    "crop": [{"random_crop": {"size": 40}}, {"random_brightness": {"max_delta": 0.2}}],
}


def write_scenes(root: str, count: int = NUM_SCENES) -> str:
    """Scene images, masks and a JSONL manifest with boxes, keypoints and masks (pixels)."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    os.makedirs(os.path.join(root, "masks"), exist_ok=True)

    def png(path, array):
        with open(os.path.join(root, path), "wb") as f:
            f.write(tf.io.encode_png(array).numpy())

    lines = []
    for index in range(count):
        data = scenes.scene(index)
        png(f"images/scene_{index:02d}.png", data["image"])
        png(f"masks/scene_{index:02d}.png", data["mask"])
        objects = []
        for j, class_id in enumerate(data["classes"]):
            instance = f"masks/scene_{index:02d}_{j}.png"
            png(instance, data["instance_masks"][j])
            objects.append(
                {
                    "bbox": data["pixel_boxes"][j],
                    "class": scenes.CLASSES[int(class_id)],
                    "keypoints": data["pixel_keypoints"][j],
                    "mask": instance,
                }
            )
        lines.append(
            json.dumps(
                {
                    "path": f"images/scene_{index:02d}.png",
                    "objects": objects,
                    "mask": f"masks/scene_{index:02d}.png",
                }
            )
        )
    manifest = os.path.join(root, "manifest.jsonl")
    with open(manifest, "w") as f:
        f.write("\n".join(lines) + "\n")
    return manifest


@pytest.fixture(scope="session")
def scenes_dataset(tmp_path_factory):
    """The scenes built by `kiln build`: PNG, 64x64, train only, 2 shards, STORED_AUGMENT."""
    from kiln.pipeline import build

    root = str(tmp_path_factory.mktemp("scenes"))
    manifest = write_scenes(root)
    config = {
        "name": "scenes",
        "source": {"type": "manifest", "path": manifest, "classes": list(scenes.CLASSES)},
        "output": os.path.join(root, "datasets"),
        "transforms": [],
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"num_shards": 2},
        "targets": TARGETS,
        "augment": STORED_AUGMENT,
    }
    return build(config, [])


def elements(dataset) -> list[tuple[np.ndarray, dict]]:
    """Unbatched ``(image, targets)`` pairs as NumPy."""
    return [
        (image.numpy(), {name: value.numpy() for name, value in targets.items()})
        for image, targets in dataset
    ]


def unbatch(images, targets) -> list[tuple[np.ndarray, dict]]:
    """Per element ``(image, targets)`` of a batch (ragged rows become dense arrays)."""
    out = []
    for index in range(int(images.shape[0])):
        one = {}
        for name, value in targets.items():
            row = value[index]
            one[name] = row.numpy() if hasattr(row, "numpy") else np.asarray(row)
        out.append((images[index].numpy(), one))
    return out


def test_stored_targets_are_the_scenes(scenes_dataset):
    stored = elements(
        kiln.reader.load(scenes_dataset.dataset_dir, batch_size=None, augment=None, shuffle=False)
    )
    assert len(stored) == NUM_SCENES
    for image, targets in stored:
        assert not scenes.check_element(image, targets)
        assert targets["boxes"].shape == (3, 4)
        assert targets["instance_masks"].shape == (3, 64, 64, 1)


@pytest.mark.parametrize("name", sorted(LISTS))
def test_targets_follow_the_pixels_for_many_seeds(scenes_dataset, name):
    dataset = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=None, seed=11, repeat=4, augment=LISTS[name]
    )
    seen = 0
    for index, (image, targets) in enumerate(elements(dataset)):
        # "geometry" resamples more than once: see check_element.
        problems = scenes.check_element(image, targets, iou_side=20 if name == "geometry" else 0)
        assert not problems, f"{name}, element {index}: {problems}"
        seen += 1
    assert seen == 4 * NUM_SCENES


def test_model_layer_moves_targets_exactly_as_the_data_path(scenes_dataset):
    augment = LISTS["geometry"]
    data = kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, seed=5, augment=augment)
    model_dataset, layer = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=4, seed=5, augment=augment, augment_on="model"
    )
    step = tf.function(lambda inputs, targets: layer(dict(inputs, targets=targets), training=True))
    compared = 0
    for (images, targets), (inputs, raw) in zip(data, model_dataset, strict=True):
        layer_images, layer_targets = step(inputs, raw)
        np.testing.assert_allclose(layer_images.numpy(), images.numpy(), atol=1e-6)
        for name in ("boxes", "classes", "keypoints", "keypoint_visibility", "mask"):
            expected, actual = targets[name], layer_targets[name]
            if isinstance(expected, tf.RaggedTensor):
                expected, actual = expected.to_list(), actual.to_list()
                np.testing.assert_allclose(
                    np.asarray(sum(actual, []), np.float64).ravel(),
                    np.asarray(sum(expected, []), np.float64).ravel(),
                    atol=1e-6,
                )
            else:
                np.testing.assert_array_equal(actual.numpy(), expected.numpy())
        for image, moved in unbatch(
            layer_images, {k: v for k, v in layer_targets.items() if k not in ("instance_masks",)}
        ):
            assert not scenes.check_element(image, moved)
        compared += 1
    assert compared == 2


def test_same_seed_same_targets_other_seed_other_targets(scenes_dataset):
    def boxes(seed):
        dataset = kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, seed=seed)
        return [targets["boxes"].to_list() for _, targets in dataset]

    assert boxes(3) == boxes(3)
    assert boxes(3) != boxes(4)


def test_batches_are_ragged_and_max_objects_makes_them_static(scenes_dataset):
    ragged = kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, seed=1)
    spec = ragged.element_spec[1]
    assert isinstance(spec["boxes"], tf.RaggedTensorSpec)
    assert spec["mask"].shape.as_list() == [None, 48, 48, 1]
    padded = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=4, seed=1, max_objects=5, drop_remainder=True
    )
    images_spec, targets_spec = padded.element_spec
    assert images_spec.shape.as_list() == [4, 48, 48, 3]
    assert targets_spec["boxes"].shape.as_list() == [4, 5, 4]
    assert targets_spec["keypoints"].shape.as_list() == [4, 5, 2, 2]
    assert targets_spec["instance_masks"].shape.as_list() == [4, 5, 48, 48, 1]
    for (_, dense), (_, rows) in zip(padded, ragged, strict=True):
        counts = rows["boxes"].row_lengths().numpy()
        np.testing.assert_array_equal(dense["num_objects"].numpy(), counts)
        for index, count in enumerate(counts):
            np.testing.assert_array_equal(dense["boxes"][index, :count], rows["boxes"][index])
            assert np.all(dense["classes"][index, count:].numpy() == -1)


def test_cutmix_mixes_targets_with_the_pixels_and_mixup_is_refused(scenes_dataset):
    dataset = kiln.reader.load(
        scenes_dataset.dataset_dir,
        batch_size=4,
        seed=2,
        augment=[{"random_crop": {"size": 64}}, "cutmix"],
    )
    for images, targets in dataset:
        for image, one in unbatch(images, targets):
            # Own boxes keep their extent while the paste hides part of the
            # object: check the class mask and the keypoints against the pixels.
            one = dict(one, boxes=np.zeros((0, 4)), classes=np.zeros((0,), np.int64))
            del one["instance_masks"]
            assert not scenes.check_element(image, one)
    with pytest.raises(TargetError, match=r"mixup.*'boxes'"):
        kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, augment=["mixup"])


def test_training_smoke_segmentation_and_box_regression(scenes_dataset):
    train = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=4, seed=0, max_objects=4, drop_remainder=True
    )
    segmentation = train.map(lambda image, targets: (image, targets["mask"]))
    inputs = tf.keras.Input([48, 48, 3])
    hidden = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Conv2D(len(scenes.CLASSES), 1)(hidden))
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(segmentation, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))

    boxes = train.map(lambda image, targets: (image, targets["boxes"][:, 0]))
    regressor = tf.keras.Sequential(
        [
            tf.keras.Input([48, 48, 3]),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(4),
        ]
    )
    regressor.compile("adam", "mse")
    history = regressor.fit(boxes, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
