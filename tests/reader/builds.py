"""What the reader tests build, and how they read a build back without the reader.

The builds run the real Beam pipeline; reading back uses Python and TF's own
decoders on the shard files, independent of `kiln.reader`, so tests can
compare the reader's output with the ground truth.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from kiln.schemas import RECORD

# The default augmentation stored in the reader-test builds (like configs/demo.yaml).
TRAIN_AUGMENT = [
    {"random_resized_crop": {"size": [24, 24], "scale_range": [0.5, 1.0]}},
    "random_flip_left_right",
    {"random_brightness": {"max_delta": 0.2}},
]

GOLDEN_AUGMENT = [
    {"random_resized_crop": {"size": 12, "scale_range": [0.4, 1.0]}},
    "random_flip_left_right",
    "color_jitter",
    "random_erasing",
]


def write_golden_corpus(root: str) -> None:
    """12 fixed 16x16 PNGs in 2 classes, pixel values from a fixed formula.

    Independent of `kiln demo-data`, so the golden stream pins the reader,
    not the demo generator.
    """
    for index in range(12):
        class_name = ("a", "b")[index % 2]
        rows, cols = np.mgrid[0:16, 0:16]
        image = np.stack(
            [
                (rows * 16 + index * 7) % 256,
                (cols * 15 + index * 29) % 256,
                ((rows + cols) * 8 + index * 53) % 256,
            ],
            axis=-1,
        ).astype(np.uint8)
        os.makedirs(os.path.join(root, class_name), exist_ok=True)
        with open(os.path.join(root, class_name, f"img_{index:02d}.png"), "wb") as f:
            f.write(tf.io.encode_png(image).numpy())


def golden_config(root: str) -> dict:
    """Build config of the golden dataset: raw pixels, train only, 2 shards."""
    return {
        "name": "golden",
        "source": {"type": "image_folder", "root": os.path.join(root, "images")},
        "output": os.path.join(root, "datasets"),
        "encoding": {"format": "raw"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"num_shards": 2},
        "augment": GOLDEN_AUGMENT,
    }


def split_keys(result, split: str) -> list[bytes]:
    """Every record key of a split, read straight from its shards with Python."""
    keys = []
    for shard in result.info.splits[split].shards:
        path = os.path.join(result.dataset_dir, shard.filename)
        for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
            keys.append(RECORD.decode(serialized)["key"])
    return keys


def stored_images(result, split: str) -> dict[bytes, np.ndarray]:
    """Key -> decoded stored image (uint8), read with Python and TF's decoders."""
    images = {}
    for shard in result.info.splits[split].shards:
        path = os.path.join(result.dataset_dir, shard.filename)
        for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
            record = RECORD.decode(serialized)
            if result.info.encoding["format"] == "raw":
                image = np.frombuffer(record["image"], np.uint8).reshape(
                    record["height"], record["width"], record["channels"]
                )
            else:
                image = tf.io.decode_image(record["image"], channels=record["channels"]).numpy()
            images[record["key"]] = image
    return images


def keys_of(dataset) -> list[bytes]:
    """Keys in stream order from a dict-valued (as_supervised=False) dataset."""
    return [key for batch in dataset for key in np.atleast_1d(batch["key"].numpy()).tolist()]


DEMO_CLASSES = ["circle", "square", "star", "triangle"]


def label_manifests(root: str, broken: dict) -> dict[str, str]:
    """JSONL manifests of the demo images under `root` (the broken files left out).

    ``classification``: each image's class folder as its label. ``multilabel``:
    the same label, and ``labels`` holding it plus, for every other image in
    listing order, the next class.
    """
    import json

    paths = sorted(
        f"{name}/{file}"
        for name in DEMO_CLASSES
        for file in os.listdir(os.path.join(root, name))
        if f"{name}/{file}" not in broken
    )
    plain, multi = [], []
    for index, path in enumerate(paths):
        label = path.split("/")[0]
        labels = {label}
        if index % 2:
            labels.add(DEMO_CLASSES[(DEMO_CLASSES.index(label) + 1) % len(DEMO_CLASSES)])
        plain.append({"path": path, "label": label})
        multi.append({"path": path, "label": label, "labels": sorted(labels)})
    out = {}
    for name, rows in (("classification", plain), ("multilabel", multi)):
        out[name] = os.path.join(root, f"{name}.jsonl")
        with open(out[name], "w") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))
    return out
