"""Reader measurements: kiln.reader against the limit and the two usual ways of augmenting.

Every variant yields float32 batches of 128 images of 224x224x3 (scaled to
[0, 1]) with their labels, from the same dataset built by `kiln build`, and
reads it the same way: the shard files interleaved, records shuffled in a
buffer of the size kiln's reader picks, batches prefetched. Only what
happens to each image differs:

- ``a``: the limit. Parse and decode only: per element for JPEG
  (`tf.io.decode_jpeg`), one `tf.io.decode_raw` per batch for raw pixels.
- ``kiln_plain``: `kiln.reader.load(augment=None)`: the same work through
  kiln's reader (shows the reader's own overhead).
- ``b``: `kiln.reader.load` with the dataset's stored augmentation list:
  random_resized_crop to 224, random_flip_left_right, color_jitter.
- ``c``: the same augmentations in NumPy/OpenCV inside `tf.numpy_function`,
  per element (what the seeds warn against): torchvision's crop sampling,
  `cv2.resize`, a flip, brightness/contrast/saturation in NumPy and hue
  through OpenCV's HSV conversion.
- ``d``: the same augmentations as Keras preprocessing layers applied to
  each batch in `Dataset.map`: RandomZoom (zoom in by up to 72% of each
  side, i.e. 8% of the area: Keras 3 has no random resized crop),
  RandomFlip, RandomColorJitter.

Beside them, the cost of targets: ``b_targets`` is (b) on the same images
built with boxes (three per image) and a class mask (`build_target_dataset`),
yielding ``(images, {"boxes", "classes", "mask"})`` with the same
augmentation moving the targets too; its per-image cost against (b) on the
JPEG dataset is the number to watch (goal: at most 15% more).
``b_targets_raw`` is the same on the same annotations built with
``mask: {encoding: raw}`` (the class mask stored as one byte per pixel,
decoded with `tf.io.decode_raw` instead of inflating a PNG), against the
same goal.

Throughput is measured after a warm-up (graph building, the first shuffle
buffer fill), over enough batches to cross a pass boundary, so each number
includes refilling the shuffle buffer as a real epoch does.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable

BATCH_SIZE = 128
IMAGE_SIZE = 224
# The default augmentation list the benchmark datasets store.
AUGMENT = [{"random_resized_crop": {"size": IMAGE_SIZE}}, "random_flip_left_right", "color_jitter"]
# color_jitter's defaults, used by the NumPy and Keras variants too.
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0.4, 0.4, 0.4, 0.1
SCALE_RANGE, RATIO_RANGE = (0.08, 1.0), (3 / 4, 4 / 3)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of reading a dataset.

    Attributes:
      key: Short name (``a``, ``b``...), the JSON key.
      title: What it is, for the table.
      make: ``make(dataset_dir, encoding, batch_size) -> tf.data.Dataset`` of
        endless ``(images, labels)`` batches.
      batches: Batches timed per run (fewer for the slow variants).
    """

    key: str
    title: str
    make: Callable
    batches: int


def _files_and_buffer(dataset_dir: str):
    import kiln.reader
    from kiln.reader.dataset import _Share

    directory = kiln.reader.locate(dataset_dir)
    metadata = kiln.reader.info(directory)
    share = _Share.of(directory, metadata.split("train"), metadata, None)
    return share.files, share.default_shuffle_buffer


def _records(dataset_dir: str):
    """Endless shuffled serialized records, read as kiln's reader reads them."""
    import tensorflow as tf

    files, buffer = _files_and_buffer(dataset_dir)
    records = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 16),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return records.shuffle(buffer, seed=1, reshuffle_each_iteration=True).repeat()


def _decoded(dataset_dir: str, encoding: str, as_float: bool):
    """Per-element ``(uint8 or float image, label)``."""
    import tensorflow as tf

    from kiln.schemas import RECORD

    def decode(serialized):
        features = RECORD.parse(serialized)
        if encoding == "jpeg":
            image = tf.io.decode_jpeg(features["image"], channels=3)
        else:
            image = tf.reshape(
                tf.io.decode_raw(features["image"], tf.uint8), [IMAGE_SIZE, IMAGE_SIZE, 3]
            )
        image.set_shape([IMAGE_SIZE, IMAGE_SIZE, 3])
        if as_float:
            image = tf.cast(image, tf.float32) * (1.0 / 255.0)
        return image, features["label"]

    return _records(dataset_dir).map(decode, num_parallel_calls=tf.data.AUTOTUNE)


def _limit(dataset_dir: str, encoding: str, batch_size: int):
    import tensorflow as tf

    from kiln.schemas import RECORD

    if encoding == "jpeg":
        dataset = _decoded(dataset_dir, "jpeg", as_float=True).batch(batch_size)
    else:

        def decode_batch(serialized):
            features = RECORD.parse(serialized)
            pixels = tf.io.decode_raw(features["image"], tf.uint8)
            images = tf.reshape(pixels, [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3])
            return tf.cast(images, tf.float32) * (1.0 / 255.0), features["label"]

        dataset = (
            _records(dataset_dir)
            .batch(batch_size, drop_remainder=True)
            .map(decode_batch, num_parallel_calls=tf.data.AUTOTUNE)
        )
    return dataset.prefetch(tf.data.AUTOTUNE)


def _kiln(dataset_dir: str, encoding: str, batch_size: int, augment="default"):
    import kiln.reader

    del encoding  # kiln.json says
    return kiln.reader.load(
        dataset_dir, "train", batch_size=batch_size, seed=1, repeat=True, augment=augment
    )


def _kiln_plain(dataset_dir: str, encoding: str, batch_size: int):
    return _kiln(dataset_dir, encoding, batch_size, augment=None)


# --- (c) NumPy/OpenCV in tf.numpy_function ---------------------------------------------

_LUMA = (0.299, 0.587, 0.114)


def numpy_augment(image):
    """Random resized crop, flip and colour jitter of one uint8 image, in NumPy/OpenCV.

    Written the usual way: NumPy's global-state-free generator drawn fresh
    per call, so every element differs (but no run is reproducible).
    """
    import cv2
    import numpy as np

    rng = np.random.default_rng()
    height, width = image.shape[:2]
    top, left, crop_h, crop_w = 0, 0, height, width
    for _ in range(10):  # torchvision's RandomResizedCrop.get_params
        area = height * width * rng.uniform(*SCALE_RANGE)
        ratio = math.exp(rng.uniform(math.log(RATIO_RANGE[0]), math.log(RATIO_RANGE[1])))
        w = int(round(math.sqrt(area * ratio)))
        h = int(round(math.sqrt(area / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top, left, crop_h, crop_w = (
                int(rng.integers(0, height - h + 1)),
                int(rng.integers(0, width - w + 1)),
                h,
                w,
            )
            break
    crop = image[top : top + crop_h, left : left + crop_w]
    out = cv2.resize(crop, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_LINEAR)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    x = out.astype(np.float32) * (1.0 / 255.0)
    x += rng.uniform(-BRIGHTNESS, BRIGHTNESS)
    luma = x @ np.asarray(_LUMA, np.float32)
    x = (x - luma.mean()) * rng.uniform(1 - CONTRAST, 1 + CONTRAST) + luma.mean()
    luma = (x @ np.asarray(_LUMA, np.float32))[..., None]
    x = (x - luma) * rng.uniform(1 - SATURATION, 1 + SATURATION) + luma
    hsv = cv2.cvtColor(np.clip(x, 0.0, 1.0), cv2.COLOR_RGB2HSV)  # float: H in degrees
    hsv[..., 0] = (hsv[..., 0] + 360.0 * rng.uniform(-HUE, HUE)) % 360.0
    return np.clip(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB), 0.0, 1.0)


def _numpy_function(dataset_dir: str, encoding: str, batch_size: int):
    import tensorflow as tf

    def augment(image, label):
        out = tf.numpy_function(numpy_augment, [image], tf.float32)
        out.set_shape([IMAGE_SIZE, IMAGE_SIZE, 3])
        return out, label

    dataset = _decoded(dataset_dir, encoding, as_float=False).map(
        augment, num_parallel_calls=tf.data.AUTOTUNE
    )
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


# --- (d) Keras preprocessing layers ---------------------------------------------------


def keras_augmentation():
    """The list as Keras 3 preprocessing layers (values in [0, 1])."""
    import keras

    zoom = -(1.0 - math.sqrt(SCALE_RANGE[0]))  # zoom in to sqrt(8%) of each side at most
    return keras.Sequential(
        [
            keras.layers.RandomZoom(
                height_factor=(zoom, 0.0), width_factor=(zoom, 0.0), fill_mode="reflect"
            ),
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomColorJitter(
                value_range=(0.0, 1.0),
                brightness_factor=BRIGHTNESS,
                contrast_factor=CONTRAST,
                saturation_factor=SATURATION,
                hue_factor=HUE,
            ),
        ]
    )


def _keras_layers(dataset_dir: str, encoding: str, batch_size: int):
    import tensorflow as tf

    layers = keras_augmentation()
    dataset = _decoded(dataset_dir, encoding, as_float=True).batch(batch_size)
    dataset = dataset.map(
        lambda images, labels: (layers(images, training=True), labels),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


# Measured on the datasets with boxes and a class mask (`build_target_dataset`).
TARGET_VARIANTS = (
    Variant("b_targets", "(b) kiln.reader, default augmentation, boxes + class mask", _kiln, 16),
    Variant(
        "b_targets_raw",
        "(b) kiln.reader, default augmentation, boxes + class mask stored raw",
        _kiln,
        16,
    ),
)
# How each targets variant's dataset stores its class mask (`targets.mask.encoding`).
TARGET_MASK_ENCODINGS = {"b_targets": "png", "b_targets_raw": "raw"}
# Objects per image in the targets dataset.
OBJECTS_PER_IMAGE = 3

VARIANTS = (
    Variant("a", "(a) limit: parse + decode only", _limit, 16),
    Variant("kiln_plain", "kiln.reader, augment=None", _kiln_plain, 16),
    Variant("b", "(b) kiln.reader, default augmentation", _kiln, 16),
    Variant("c", "(c) NumPy/OpenCV in tf.numpy_function", _numpy_function, 6),
    Variant("d", "(d) Keras preprocessing layers in Dataset.map", _keras_layers, 8),
)
WARMUP_BATCHES = 3


def throughput(dataset, batches: int, warmup: int = WARMUP_BATCHES) -> float:
    """Images per second of `dataset` over `batches` batches after `warmup`."""
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    images = 0
    for _ in range(batches):
        batch, _ = next(iterator)
        images += int(batch.shape[0])
    return images / (time.perf_counter() - start)


def measure_variant(
    variant: Variant,
    dataset_dir: str,
    encoding: str,
    *,
    batch_size: int = BATCH_SIZE,
    batches: int | None = None,
) -> float:
    """Images per second of one variant, in a fresh pipeline."""
    import gc

    dataset = variant.make(dataset_dir, encoding, batch_size)
    try:
        return throughput(dataset, batches or variant.batches)
    finally:
        del dataset
        gc.collect()


def layer_throughput(dataset_dir: str, batches: int, batch_size: int = BATCH_SIZE) -> float:
    """Images per second of `AugmentationLayer` on 128-image uint8 batches, CPU.

    The layer runs inside a `tf.function`, as in a model's compiled train
    step; its input comes from `kiln.reader.load_for_model` and is held in
    memory, so only the layer is timed.
    """
    import tensorflow as tf

    import kiln.reader

    dataset, layer = kiln.reader.load_for_model(
        dataset_dir, "train", batch_size=batch_size, seed=1, repeat=True
    )
    inputs, _ = next(iter(dataset))
    step = tf.function(lambda batch: layer(batch, training=True))
    step(inputs).numpy()  # trace
    start = time.perf_counter()
    for _ in range(batches):
        out = step(inputs)
    out.numpy()
    return batches * batch_size / (time.perf_counter() - start)


def dataset_size_mb(dataset_dir: str) -> float:
    import kiln.reader

    directory = kiln.reader.locate(dataset_dir)
    return (
        sum(
            os.path.getsize(os.path.join(directory, name))
            for name in os.listdir(directory)
            if ".tfrecord-" in name
        )
        / 2**20
    )


def build_datasets(
    manifest: str, output: str, encodings: tuple[str, ...] = ("jpeg", "raw")
) -> dict[str, str]:
    """The JPEG and raw datasets (or those of `encodings`) the reader is measured on,
    built by `kiln build`.

    Same transforms as the build measurements (224x224), the default
    augmentation list stored, 8 MB shards (several files to interleave). A
    rebuild with an unchanged corpus is found up to date in a second.
    """
    from benchmarks.build_bench import build_config
    from kiln.pipeline import build

    datasets = {}
    for encoding in encodings:
        config = build_config(
            manifest,
            output,
            name=f"reader-{encoding}",
            encoding=encoding,
            augment=AUGMENT,
            target_shard_mb=8,
        )
        datasets[encoding] = build(config).dataset_dir
    return datasets


def write_target_manifest(csv_manifest: str, folder: str) -> str:
    """A JSONL manifest of the CSV manifest's images with boxes and a class mask each.

    Each image gets `OBJECTS_PER_IMAGE` boxes at positions derived from its
    row number (in 2 classes) and a class-mask PNG of its size with those
    boxes filled. Written once; reused while the CSV manifest is unchanged.
    """
    import csv

    import numpy as np
    import tensorflow as tf

    root = os.path.dirname(os.path.abspath(csv_manifest))
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, os.path.basename(csv_manifest).replace(".csv", "-targets.jsonl"))
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(csv_manifest):
        return out
    with open(csv_manifest, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = []
    for index, row in enumerate(rows):
        path = os.path.join(root, row["path"])
        height, width = (int(d) for d in tf.io.extract_jpeg_shape(tf.io.read_file(path))[:2])
        mask = np.zeros((height, width, 1), np.uint8)
        objects = []
        for j in range(OBJECTS_PER_IMAGE):
            # Boxes of 15..45% of each side, spread over the image by row and object.
            size_y = height * (0.15 + 0.1 * ((index + j) % 4))
            size_x = width * (0.15 + 0.1 * ((index + 2 * j) % 4))
            top = (height - size_y) * (((index * 7 + j * 3) % 10) / 10)
            left = (width - size_x) * (((index * 3 + j * 5) % 10) / 10)
            box = [round(left), round(top), round(left + size_x), round(top + size_y)]
            class_id = 1 + (index + j) % 2
            mask[box[1] : box[3], box[0] : box[2]] = class_id
            objects.append({"bbox": box, "class": ("background", "cat", "dog")[class_id]})
        mask_path = os.path.join(folder, f"mask-{index:06d}.png")
        with open(mask_path, "wb") as f:
            f.write(tf.io.encode_png(mask).numpy())
        lines.append(json.dumps({"path": path, "objects": objects, "mask": mask_path}))
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(out + ".tmp", out)
    return out


def build_target_dataset(manifest: str, output: str, mask_encoding: str = "png") -> str:
    """The reader benchmark's JPEG dataset again, with boxes and a class mask per
    image, the mask stored as `mask_encoding` (``png`` or ``raw``)."""
    from benchmarks.build_bench import build_config
    from kiln.pipeline import build

    folder = os.path.join(os.path.dirname(os.path.abspath(output)), "target-annotations")
    targets_manifest = write_target_manifest(manifest, folder)
    config = build_config(
        targets_manifest,
        output,
        name="reader-targets" if mask_encoding == "png" else f"reader-targets-{mask_encoding}",
        encoding="jpeg",
        augment=AUGMENT,
        target_shard_mb=8,
    )
    config["source"]["classes"] = ["background", "cat", "dog"]
    config["source"]["allowed_roots"] = [os.path.dirname(os.path.abspath(manifest))]
    mask: dict = {"ignore_value": 255}
    if mask_encoding != "png":  # the png dataset's config as before the choice
        mask["encoding"] = mask_encoding
    config["targets"] = {"boxes": {"min_visibility": 0.25}, "mask": mask}
    return build(config).dataset_dir


def build_target_datasets(manifest: str, output: str) -> dict[str, str]:
    """`build_target_dataset` of each targets variant: variant key -> dataset folder."""
    return {
        key: build_target_dataset(manifest, output, encoding)
        for key, encoding in TARGET_MASK_ENCODINGS.items()
    }
