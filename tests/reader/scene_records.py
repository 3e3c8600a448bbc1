"""Scene datasets written with the record schema's own encoder (`kiln.schemas.schema_for`).

A stand-in for `kiln build` while the build job cannot write targets yet:
the records are what the schema declares (normalized boxes, keypoints as
[y, x] plus visibility, masks as PNG bytes), encoded by `Schema.encode`,
with a kiln.json (`DatasetInfo`) beside them, so `kiln.reader` reads them
exactly as it reads a build.
"""

from __future__ import annotations

import hashlib
import os

import tensorflow as tf

import kiln
from kiln.schemas import DatasetInfo, ShardInfo, SplitInfo, schema_for, shard_filename
from kiln.schemas.targets import TargetsConfig
from reader import scenes


def write_dataset(
    root: str, targets: dict, augment: list, *, count: int, num_shards: int = 2
) -> str:
    """Writes `count` scenes as a dataset version folder under `root`; returns it."""
    config = TargetsConfig.model_validate(targets)
    schema = schema_for(config)
    directory = os.path.join(root, "scenes", "v1")
    os.makedirs(directory, exist_ok=True)
    records = []
    for index in range(count):
        data = scenes.scene(index)
        record = {
            "image": tf.io.encode_png(data["image"]).numpy(),
            "height": scenes.SIZE,
            "width": scenes.SIZE,
            "channels": 3,
            "key": f"images/scene_{index:02d}.png",
            "sha256": hashlib.sha256(str(index).encode()).hexdigest(),
            "boxes": data["boxes"],
            "classes": data["classes"],
            "keypoints": data["keypoints"],
            "keypoint_visibility": data["keypoint_visibility"],
            "mask": tf.io.encode_png(data["mask"]).numpy(),
            "instance_masks": [tf.io.encode_png(m).numpy() for m in data["instance_masks"]],
        }
        records.append({name: record[name] for name in schema.names})
    shards = []
    for shard in range(num_shards):
        name = shard_filename("scenes", "train", shard, num_shards)
        path = os.path.join(directory, name)
        with tf.io.TFRecordWriter(path) as writer:
            for record in records[shard::num_shards]:
                writer.write(schema.encode(record))
        with open(path, "rb") as f:
            content = f.read()
        shards.append(
            ShardInfo(
                name,
                len(records[shard::num_shards]),
                len(content),
                hashlib.sha256(content).hexdigest(),
            )
        )
    info = DatasetInfo(
        name="scenes",
        version="v1",
        kiln_version=kiln.__version__,
        format_version=kiln.FORMAT_VERSION,
        config={},
        config_fingerprint="scenes",
        schema=schema.to_json(),
        class_names=list(scenes.CLASSES),
        encoding={"format": "png"},
        channels=3,
        image_size=[scenes.SIZE, scenes.SIZE],
        compression=None,
        splits={"train": SplitInfo("train", count, shards, {})},
        augment=augment,
        targets=config.to_json(),
    )
    with open(os.path.join(directory, "kiln.json"), "w") as f:
        f.write(info.sealed().dumps())
    return directory
