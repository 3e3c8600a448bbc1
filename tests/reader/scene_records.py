"""Scene datasets (`scenes`) written by `kiln build` from a JSONL manifest with targets.

The manifest gives each scene's objects as the contract's JSONL lines do:
pixel boxes ``[x_min, y_min, x_max, y_max]``, class names, keypoints
``[x, y, v, ...]`` and an instance mask PNG per object, plus a class-mask
PNG per image; the build normalizes and encodes them, so the reader tests
read exactly what users get.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from reader import scenes


def write_scenes(root: str, count: int) -> str:
    """Scene images, masks and a JSONL manifest with their targets; returns the manifest."""
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
        line = {
            "path": f"images/scene_{index:02d}.png",
            "objects": objects,
            "mask": f"masks/scene_{index:02d}.png",
        }
        lines.append(json.dumps(line))
    manifest = os.path.join(root, "manifest.jsonl")
    with open(manifest, "w") as f:
        f.write("\n".join(lines) + "\n")
    return manifest


def build_scenes(root: str, targets: dict, augment: list, *, count: int, num_shards: int = 2):
    """`count` scenes built by `kiln build` (PNG, 64x64, train only); the `BuildResult`.

    `targets` is the build config's ``targets:`` section; object keys it
    does not declare (e.g. instance masks) are left out of the manifest.
    """
    from kiln.pipeline import build

    manifest = write_scenes(os.path.join(root, "source"), count)
    if "instance_masks" not in targets or "keypoints" not in targets:
        with open(manifest) as f:
            rows = [json.loads(line) for line in f]
        for row in rows:
            for obj in row["objects"]:
                if "instance_masks" not in targets:
                    del obj["mask"]
                if "keypoints" not in targets:
                    del obj["keypoints"]
        with open(manifest, "w") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "name": "scenes",
        "source": {"type": "manifest", "path": manifest, "classes": list(scenes.CLASSES)},
        "output": os.path.join(root, "datasets"),
        "transforms": [],
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"num_shards": num_shards},
        "targets": targets,
        "augment": augment,
    }
    return build(config, [])


def assert_same_targets(expected: dict, actual: dict) -> None:
    """Every target of `expected` equal in `actual` (to float error): ragged
    columns row by row, as the Keras layer must give what `load` gives."""
    for name in sorted(expected):
        want, got = expected[name], actual[name]
        if isinstance(want, tf.RaggedTensor):
            np.testing.assert_array_equal(got.row_lengths(), want.row_lengths(), err_msg=name)
            want, got = want.flat_values, got.flat_values
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, err_msg=name)
