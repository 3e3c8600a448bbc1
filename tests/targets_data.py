"""A small generated detection + segmentation corpus, written as a JSONL manifest.

Each image is ``HEIGHT x WIDTH`` with up to three filled rectangles on a
gray background, one colour per class, so everything about the targets is
known exactly: a rectangle covering pixel columns ``x0..x1-1`` and rows
``y0..y1-1`` has the box ``[x0, y0, x1, y1]``, its instance mask is those
pixels (a mask PNG for even objects, a polygon for odd ones), the semantic
mask holds its class id there (255 elsewhere), and its two keypoints
``tl``/``br`` are the centres of its corner pixels.
"""

from __future__ import annotations

import json
import os
import pathlib

import cv2
import numpy as np

HEIGHT, WIDTH = 48, 64
CLASSES = ["blue", "green", "red"]
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
BACKGROUND = 40
IGNORE = 255

TARGETS = {
    "label": {},
    "labels": {},
    "boxes": {"min_visibility": 0.25, "fields": {"iscrowd": "int"}},
    "mask": {"ignore_value": IGNORE},
    "instance_masks": {},
    "keypoints": {"names": ["tl", "br"], "flip_pairs": [["tl", "br"]]},
    "extra": {"weather": "string", "altitude": "float", "year": "int"},
}


def objects_of(index: int) -> list[dict]:
    """The rectangles of image `index`: 0 to 3, deterministic, not overlapping."""
    rng = np.random.default_rng(index)
    count = index % 4
    out = []
    for slot in range(count):
        # Three columns of 20 pixels: each rectangle stays in its own.
        x0 = 2 + 21 * slot + int(rng.integers(0, 6))
        x1 = x0 + int(rng.integers(6, 13))
        y0 = int(rng.integers(1, 20))
        y1 = y0 + int(rng.integers(6, 26))
        name = CLASSES[(index + slot) % len(CLASSES)]
        out.append({"box": [x0, y0, x1, y1], "class": name, "iscrowd": (index + slot) % 2})
    return out


def image_of(objects: list[dict]) -> np.ndarray:
    image = np.full((HEIGHT, WIDTH, 3), BACKGROUND, np.uint8)
    for item in objects:
        x0, y0, x1, y1 = item["box"]
        image[y0:y1, x0:x1] = COLOURS[item["class"]]
    return image


def semantic_mask_of(objects: list[dict]) -> np.ndarray:
    mask = np.full((HEIGHT, WIDTH), IGNORE, np.uint8)
    for item in objects:
        x0, y0, x1, y1 = item["box"]
        mask[y0:y1, x0:x1] = CLASSES.index(item["class"])
    return mask


def write_png(path: pathlib.Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if pixels.ndim == 3:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    assert cv2.imwrite(str(path), pixels)


def manifest_row(index: int, folder: pathlib.Path, split: str | None = None) -> dict:
    """Writes image `index`, its masks, and returns its manifest row."""
    objects = objects_of(index)
    name = f"{index:03d}"
    write_png(folder / "images" / f"{name}.png", image_of(objects))
    write_png(folder / "masks" / f"{name}.png", semantic_mask_of(objects))
    row_objects = []
    for slot, item in enumerate(objects):
        x0, y0, x1, y1 = item["box"]
        entry = {
            "bbox": [x0, y0, x1, y1],
            "class": item["class"],
            "iscrowd": item["iscrowd"],
            "keypoints": [x0 + 0.5, y0 + 0.5, 2, x1 - 0.5, y1 - 0.5, 2],
        }
        if slot % 2 == 0:
            instance = np.zeros((HEIGHT, WIDTH), np.uint8)
            instance[y0:y1, x0:x1] = 1
            write_png(folder / "masks" / f"{name}_{slot}.png", instance)
            entry["mask"] = f"masks/{name}_{slot}.png"
        else:
            entry["segmentation"] = [[x0, y0, x1, y0, x1, y1, x0, y1]]
        row_objects.append(entry)
    row = {
        "path": f"images/{name}.png",
        "label": objects[0]["class"] if objects else "red",
        "labels": sorted({item["class"] for item in objects}),
        "objects": row_objects,
        "mask": f"masks/{name}.png",
        "weather": ["sunny", "rain"][index % 2],
        "altitude": 10.0 + index / 4,
        "year": 2000 + index,
    }
    if split is not None:
        row["split"] = split
    return row


def write_manifest(folder: pathlib.Path, rows: list[dict], name: str = "manifest.jsonl") -> str:
    path = folder / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def corpus(folder: pathlib.Path, count: int) -> tuple[str, list[dict]]:
    """Writes `count` images and a manifest; returns its path and the rows."""
    rows = [manifest_row(index, folder) for index in range(count)]
    return write_manifest(folder, rows), rows


def records(result) -> dict[str, dict]:
    """key -> decoded record of a build's `result`, every split."""
    import tensorflow as tf

    from kiln.schemas import Schema

    schema = Schema.from_json(result.info.schema)
    out = {}
    for split in result.info.splits.values():
        paths = [os.path.join(result.dataset_dir, shard.filename) for shard in split.shards]
        for serialized in tf.data.TFRecordDataset(paths):
            record = schema.decode(serialized.numpy())
            out[record["key"].decode()] = record
    return out


def error_rows(result) -> dict[str, dict]:
    """key -> errors.jsonl row of a build's `result`."""
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        return {row["key"]: row for row in map(json.loads, f)}
