"""kiln.reader side by side with the loaders a user would pick instead: Grain, DALI on CPU.

All read the same JPEGs, built by `kiln build` from the benchmark corpus,
in two datasets: the reader benchmark's 224x224 one
(`reader_bench.build_datasets`) and a 341x256 one (resized to a shorter
side of 256 only, as ImageNet-style pipelines store images). All apply the
same augmentation: a random resized crop to 224 (scale 0.08-1, ratio
3/4-4/3), a horizontal flip half the time, and a colour jitter
(brightness, contrast and saturation 0.4, hue 0.1); each yields batches of
128 images with their labels. Each variant gets the machine's cores as its
threads.

- ``limit``: parse and decode only, in tf.data (as `reader_bench`'s (a)).
- ``kiln``: `kiln.reader.load` with the dataset's stored augmentation list,
  float32 in [0, 1].
- ``kiln_uint8``: the same with ``dtype="uint8"`` (the float conversion left
  to the accelerator, as a trainer would put it in the model).
- ``grain``: Grain: a `MapDataset` over the records' JPEG bytes (read from
  kiln's shards into memory before timing, so Grain pays no file reads or
  parsing), shuffled, `random_map` with OpenCV in uint8 throughout, in
  kiln's order (`cv2.imdecode`, the crop window, `cv2.flip`, the colour
  jitter on the window as one `cv2.transform` with kiln's 3x4 matrix,
  `cv2.resize`), then float32 in [0, 1], on Grain's thread pool
  (`ReadOptions(num_threads=cores)`), batched by Grain.
- ``grain_uint8``: the same handing out uint8 batches.
- ``limit_pooled``, ``kiln_pooled``, ``kiln_uint8_pooled``: ``limit``,
  ``kiln`` and ``kiln_uint8`` in a trainer's process that called
  `kiln.reader.pool_host_memory()` (TensorFlow's pooling host allocator):
  one child process per round measures them, since the allocator is
  chosen once per process. Grain and DALI do not allocate through
  TensorFlow, so their rows hold for that process too.
- ``dali``: NVIDIA DALI's CPU pipeline (``device_id=None``): its TFRecord
  reader on kiln's shards (random shuffle), `decoders.image_random_crop`
  (decodes only the crop window), `resize`, `color_twist`,
  `crop_mirror_normalize` (flip, float32 in [0, 1], HWC).

The peers are installed for the benchmark only
(``benchmarks/requirements-peers.txt``, which `make bench` installs); one
that cannot be imported is reported as not run, with the reason.

Rounds run the variants one after the other, each in a fresh pipeline,
warmed up, over enough batches to cross a pass boundary; the table gives
each variant's median over the rounds.

``python -m benchmarks.peers_bench [--quick]`` measures and rewrites this
section of BENCHMARKS.md alone; `make bench` (benchmarks.run) does too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import machine, page, reader_bench
from benchmarks.reader_bench import (
    BATCH_SIZE,
    BRIGHTNESS,
    CONTRAST,
    HUE,
    IMAGE_SIZE,
    RATIO_RANGE,
    SATURATION,
    SCALE_RANGE,
)

logger = logging.getLogger("benchmarks.peers_bench")  # not __main__ under python -m

ROOT = page.ROOT
SECTION_TITLE = "## Reader against its peers"
# Where the section goes when the page has none yet.
AFTER = "## Reader: batches of"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure.

    Attributes:
      rounds: Rounds of every variant (the table gives medians).
      batches: Batches timed per measurement.
    """

    rounds: int
    batches: int


FULL = Settings(rounds=5, batches=24)
QUICK = Settings(rounds=1, batches=2)


@dataclasses.dataclass(frozen=True)
class Peer:
    """One loader.

    Attributes:
      key: Short name, the JSON key.
      title: What it is, for the table.
      make: ``make(dataset_dir, batch_size, threads, scratch) -> iterator`` of endless
        ``(images, labels)`` batches (anything with ``.shape[0]``).
      needs: The module it needs, reported when missing.
      pooled: Measured in a child process that calls
        `kiln.reader.pool_host_memory()` before TensorFlow's first op (the
        allocator is chosen once per process), one child per round.
    """

    key: str
    title: str
    make: Callable[[str, int, int, str], Iterator]
    needs: str | None = None
    pooled: bool = False


# --- kiln and the limit ---------------------------------------------------------------


def _limit(dataset_dir: str, batch_size: int, threads: int, scratch: str) -> Iterator:
    """Parse and decode each record, as float32 in [0, 1], in tf.data."""
    import tensorflow as tf

    import kiln.reader
    from kiln.schemas import RECORD

    del threads, scratch  # tf.data's own threads
    height, width = kiln.reader.info(dataset_dir).image_size

    def decode(serialized):
        features = RECORD.parse(serialized)
        image = tf.io.decode_jpeg(features["image"], channels=3)
        image.set_shape([height, width, 3])
        return tf.cast(image, tf.float32) * (1.0 / 255.0), features["label"]

    records = reader_bench._records(dataset_dir)
    dataset = records.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size)
    return iter(dataset.prefetch(tf.data.AUTOTUNE))


def _kiln(
    dataset_dir: str, batch_size: int, threads: int, scratch: str, dtype: str = "float32"
) -> Iterator:
    import kiln.reader

    del threads, scratch
    dataset = kiln.reader.load(
        dataset_dir, "train", batch_size=batch_size, seed=1, repeat=True, dtype=dtype
    )
    return iter(dataset)


def _kiln_uint8(dataset_dir: str, batch_size: int, threads: int, scratch: str) -> Iterator:
    return _kiln(dataset_dir, batch_size, threads, scratch, dtype="uint8")


# --- Grain with OpenCV ------------------------------------------------------------------

_LUMA = (0.299, 0.587, 0.114)
# RGB <-> YIQ (the hue rotation's colour space, as kiln's and DALI's colour twist).
_TO_YIQ = (
    (0.299, 0.587, 0.114),
    (0.595716, -0.274453, -0.321263),
    (0.211456, -0.522591, 0.311135),
)


def _records_in_memory(dataset_dir: str) -> list[tuple[bytes, int]]:
    """Every train record's (JPEG bytes, label), read from kiln's shards."""
    import tensorflow as tf

    from kiln.schemas import RECORD

    files, _ = reader_bench._files_and_buffer(dataset_dir)
    records = tf.data.TFRecordDataset(files).map(RECORD.parse)
    return [(r["image"].numpy(), int(r["label"].numpy())) for r in records]


def _crop_window(rng, height: int, width: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (10 tries, then the whole image)."""
    for _ in range(10):
        area = height * width * rng.uniform(*SCALE_RANGE)
        ratio = math.exp(rng.uniform(math.log(RATIO_RANGE[0]), math.log(RATIO_RANGE[1])))
        w = int(round(math.sqrt(area * ratio)))
        h = int(round(math.sqrt(area / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return 0, 0, height, width


def color_matrix(
    brightness: float, contrast: float, saturation: float, hue: float, mean_luma: float
):
    """The colour jitter as one 3x4 matrix on [0, 255] pixels, as kiln's
    `color_twist`: add `brightness` (a fraction of 255), scale by `contrast`
    about `mean_luma` (0-255), blend with the pixel's luma by `saturation`,
    rotate the YIQ chroma plane by `hue` turns."""
    import numpy as np

    to_yiq = np.asarray(_TO_YIQ, np.float64)
    cos, sin = math.cos(hue * 2.0 * math.pi), math.sin(hue * 2.0 * math.pi)
    chroma = np.asarray([[1.0, 0.0, 0.0], [0.0, cos, -sin], [0.0, sin, cos]]) @ np.diag(
        [1.0, saturation, saturation]
    )
    matrix = contrast * (np.linalg.inv(to_yiq) @ chroma @ to_yiq)
    offset = brightness * 255.0 + (1.0 - contrast) * mean_luma
    return np.concatenate([matrix, np.full((3, 1), offset)], axis=1).astype(np.float32)


def opencv_augment(record: tuple[bytes, int], rng) -> tuple[Any, int]:
    """One record decoded and augmented with OpenCV, uint8 out.

    kiln's order, in uint8 throughout: the crop window, the flip, the colour
    jitter on the window (smaller than the output on average), the resize.
    """
    import cv2
    import numpy as np

    encoded, label = record
    image = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR_RGB)
    top, left, h, w = _crop_window(rng, *image.shape[:2])
    window = image[top : top + h, left : left + w]
    if rng.random() < 0.5:
        window = cv2.flip(window, 1)
    mean_luma = float(np.dot(cv2.mean(window)[:3], _LUMA))
    matrix = color_matrix(
        rng.uniform(-BRIGHTNESS, BRIGHTNESS),
        rng.uniform(1 - CONTRAST, 1 + CONTRAST),
        rng.uniform(1 - SATURATION, 1 + SATURATION),
        rng.uniform(-HUE, HUE),
        mean_luma,
    )
    coloured = cv2.transform(window, matrix)  # saturates to [0, 255]
    out = cv2.resize(coloured, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_LINEAR)
    return out, label


def _to_float(record: tuple[Any, int]) -> tuple[Any, int]:
    import numpy as np

    image, label = record
    return image.astype(np.float32) * np.float32(1.0 / 255.0), label


def _grain(
    dataset_dir: str, batch_size: int, threads: int, scratch: str, as_float: bool = True
) -> Iterator:
    import cv2
    import grain

    del scratch
    cv2.setNumThreads(1)  # the pool's threads are the parallelism
    records = _records_in_memory(dataset_dir)
    dataset = (
        grain.MapDataset.source(records).shuffle(seed=1).repeat().random_map(opencv_augment, seed=1)
    )
    if as_float:
        dataset = dataset.map(_to_float)
    iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=threads)).batch(batch_size)
    return iter(iterable)


def _grain_uint8(dataset_dir: str, batch_size: int, threads: int, scratch: str) -> Iterator:
    return _grain(dataset_dir, batch_size, threads, scratch, as_float=False)


# --- DALI on CPU ------------------------------------------------------------------------


def _dali_indexes(dataset_dir: str, scratch: str) -> tuple[list[str], list[str]]:
    """kiln's train shards and DALI index files for them (made once)."""
    files, _ = reader_bench._files_and_buffer(dataset_dir)
    os.makedirs(scratch, exist_ok=True)
    indexes = []
    tool = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
    for path in files:
        index = os.path.join(scratch, os.path.basename(path) + ".idx")
        if not os.path.exists(index) or os.path.getmtime(index) < os.path.getmtime(path):
            subprocess.run([tool, path, index], check=True, capture_output=True)
        indexes.append(index)
    return list(files), indexes


def _dali(dataset_dir: str, batch_size: int, threads: int, scratch: str) -> Iterator:
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    version = os.path.basename(os.path.normpath(dataset_dir))
    files, indexes = _dali_indexes(dataset_dir, os.path.join(scratch, "dali-index", version))
    _, shuffle_buffer = reader_bench._files_and_buffer(dataset_dir)

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=1)
    def pipeline():
        inputs = fn.readers.tfrecord(
            path=files,
            index_path=indexes,
            features={
                "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
            },
            random_shuffle=True,
            initial_fill=shuffle_buffer,
            name="reader",
        )
        images = fn.decoders.image_random_crop(
            inputs["image/encoded"],
            device="cpu",
            output_type=types.RGB,
            random_area=list(SCALE_RANGE),
            random_aspect_ratio=list(RATIO_RANGE),
            num_attempts=10,
        )
        images = fn.resize(images, resize_x=IMAGE_SIZE, resize_y=IMAGE_SIZE)
        images = fn.color_twist(
            images,
            brightness=fn.random.uniform(range=[1 - BRIGHTNESS, 1 + BRIGHTNESS]),
            contrast=fn.random.uniform(range=[1 - CONTRAST, 1 + CONTRAST]),
            saturation=fn.random.uniform(range=[1 - SATURATION, 1 + SATURATION]),
            hue=fn.random.uniform(range=[-360 * HUE, 360 * HUE]),
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="HWC",
            mean=[0.0],
            std=[255.0],
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return images, inputs["image/class/label"]

    pipe = pipeline()
    pipe.build()

    def batches():
        while True:
            images, labels = pipe.run()
            # As NumPy arrays (the buffer, not a copy), what a consumer takes.
            yield np.asarray(images.as_tensor()), np.asarray(labels.as_tensor())

    return batches()


PEERS = (
    Peer("limit", "limit: parse + decode only (tf.data)", _limit),
    Peer("kiln", "kiln.reader, float32", _kiln),
    Peer("kiln_uint8", 'kiln.reader, dtype="uint8"', _kiln_uint8),
    Peer("grain", "Grain + OpenCV threads, float32", _grain, "grain"),
    Peer("grain_uint8", "Grain + OpenCV threads, uint8", _grain_uint8, "grain"),
    Peer("dali", "DALI on CPU, float32", _dali, "nvidia.dali"),
    Peer("limit_pooled", "limit, pool_host_memory()", _limit, pooled=True),
    Peer("kiln_pooled", "kiln.reader, float32, pool_host_memory()", _kiln, pooled=True),
    Peer(
        "kiln_uint8_pooled",
        'kiln.reader, dtype="uint8", pool_host_memory()',
        _kiln_uint8,
        pooled=True,
    ),
)


def _missing(module: str | None) -> str | None:
    """Why `module` cannot be used here (None if it can)."""
    if module is None:
        return None
    try:
        __import__(module)
    except Exception as e:  # an ImportError, or a library failing to load
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _version(module: str) -> str | None:
    import importlib
    import importlib.metadata

    try:
        return importlib.import_module(module).__version__
    except AttributeError:
        return importlib.metadata.version(module)


def measure(
    settings: Settings, datasets: dict[str, str], scratch: str, log=logger.info
) -> dict[str, Any]:
    """Every peer that can run on each dataset (``{label: dataset_dir}``),
    `settings.rounds` rounds side by side (`scratch`: DALI's index files)."""
    import gc

    threads = machine.usable_cores()
    missing = {p.key: _missing(p.needs) for p in PEERS}
    runs = {label: {p.key: [] for p in PEERS if missing[p.key] is None} for label in datasets}
    for round_index in range(settings.rounds):
        for label, dataset_dir in datasets.items():
            for peer in PEERS:
                if missing[peer.key] is not None or peer.pooled:
                    continue
                iterator = peer.make(dataset_dir, BATCH_SIZE, threads, scratch)
                try:
                    # reader_bench's timing: iter() of an iterator is itself.
                    value = reader_bench.throughput(iterator, settings.batches)
                finally:
                    del iterator
                    gc.collect()
                runs[label][peer.key].append(value)
                log(f"peers round {round_index + 1} {label} {peer.key}: {value:.0f} images/s")
        for label, values in _pooled_round(datasets, settings.batches, scratch).items():
            for key, value in values.items():
                runs[label][key].append(value)
                log(f"peers round {round_index + 1} {label} {key}: {value:.0f} images/s")
    described = machine.describe()
    for module, name in (("grain", "grain"), ("nvidia.dali", "dali")):
        if missing[name] is None:
            described["versions"][name] = _version(module)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": described,
        "load_average": machine.load_average(),
        "threads": threads,
        "batch_size": BATCH_SIZE,
        "rounds": settings.rounds,
        "batches": settings.batches,
        "datasets": {
            label: {
                p.key: {
                    "title": p.title,
                    "images_per_second": (
                        statistics.median(runs[label][p.key]) if missing[p.key] is None else None
                    ),
                    "runs": runs[label].get(p.key, []),
                    "not_run": missing[p.key],
                }
                for p in PEERS
            }
            for label in datasets
        },
    }


def _pooled_round(datasets: dict[str, str], batches: int, scratch: str) -> dict[str, Any]:
    """One round of the pooled peers on every dataset, in a child process
    (`pooled_main`): ``{label: {key: images per second}}``."""
    request = {"datasets": datasets, "batches": batches, "scratch": scratch}
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers_bench", "--pooled-round", json.dumps(request)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the pooled round failed: {completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def pooled_main(request: dict[str, Any]) -> dict[str, Any]:
    """The child of `_pooled_round`: pools host memory first, then measures."""
    import kiln.reader
    from kiln.reader import host_memory

    kiln.reader.pool_host_memory()  # before TensorFlow's first op
    threads = machine.usable_cores()
    out: dict[str, Any] = {}
    for label, dataset_dir in request["datasets"].items():
        out[label] = {}
        for peer in PEERS:
            if peer.pooled:
                iterator = peer.make(dataset_dir, BATCH_SIZE, threads, request["scratch"])
                out[label][peer.key] = reader_bench.throughput(iterator, request["batches"])
                del iterator
    if not host_memory.pools():
        raise RuntimeError("TensorFlow's host allocator does not pool: the rows would be wrong")
    return out


def best_peer(peers: dict[str, Any], *, uint8: bool) -> tuple[str, float] | None:
    """The fastest peer that ran on one dataset, of kiln's row's output type."""
    keys = ("grain_uint8",) if uint8 else ("grain", "dali")
    ran = [
        (key, peers[key]["images_per_second"])
        for key in keys
        if peers[key]["images_per_second"] is not None
    ]
    return max(ran, key=lambda item: item[1]) if ran else None


def ratios(peers: dict[str, Any]) -> dict[str, float | None]:
    """On one dataset: kiln against the best peer (same output type) and the limit."""
    out: dict[str, float | None] = {}
    for key, uint8 in (("kiln", False), ("kiln_uint8", True)):
        best = best_peer(peers, uint8=uint8)
        mine = peers[key]["images_per_second"]
        out[f"{key}_vs_best_peer"] = mine / best[1] if best and mine else None
    out["kiln_vs_limit"] = peers["kiln"]["images_per_second"] / peers["limit"]["images_per_second"]
    # The trainer's process with `kiln.reader.pool_host_memory()`: the peers
    # do not allocate through TensorFlow, so their rows are the same.
    best = best_peer(peers, uint8=False)
    pooled = peers["kiln_pooled"]["images_per_second"]
    out["kiln_pooled_vs_best_peer"] = pooled / best[1] if best else None
    out["kiln_pooled_vs_limit"] = pooled / peers["limit_pooled"]["images_per_second"]
    return out


def _machine(results: dict[str, Any]) -> str:
    described = results["machine"]
    versions = ", ".join(
        f"{name} {version}" for name, version in described["versions"].items() if version
    )
    load = results["load_average"]
    return (
        f"{described['cores']} cores of {machine.cpu_name(described)} ({versions}; load average "
        f"{load[0] if load else '?'} at the end)"
    )


def markdown(results: dict[str, Any]) -> str:
    datasets = results["datasets"]
    labels = list(datasets)
    lines = [
        f"{SECTION_TITLE}: Grain with OpenCV, DALI on CPU",
        "",
        f"Measured {results['date']} on {_machine(results)}, `benchmarks/peers_bench.py` "
        f"(`python -m benchmarks.peers_bench` re-measures this section alone). Two datasets "
        f"of the same {STORED_NOTE}; the same augmentation (random resized crop to 224, flip, "
        f"colour jitter), batches of {results['batch_size']}, {results['threads']} threads "
        f"each; medians of {results['rounds']} rounds of {results['batches']} batches. What "
        f"each loader does is in the module's docstring.",
        "",
        "| Loader | " + " | ".join(f"{label}: images/s | vs kiln" for label in labels) + " |",
        "|---|" + "---:|---:|" * len(labels),
    ]
    for key in datasets[labels[0]]:
        row = datasets[labels[0]][key]
        cells = []
        for label in labels:
            value = datasets[label][key]["images_per_second"]
            kiln = datasets[label]["kiln"]["images_per_second"]
            if value is None:
                cells += [f"not run: {row['not_run']}", ""]
            else:
                cells += [f"{value:.0f}", f"{value / kiln:.2f}x"]
        lines.append(f"| {row['title']} | " + " | ".join(cells) + " |")
    lines.append("")
    for label in labels:
        found = ratios(datasets[label])
        parts = []
        for text, key in (
            ("kiln float32 vs the best float32 peer", "kiln_vs_best_peer"),
            ("kiln uint8 vs Grain uint8", "kiln_uint8_vs_best_peer"),
        ):
            value = found[key]
            parts.append(f"{text} " + (f"{value:.2f}x" if value is not None else "(no peer ran)"))
        parts.append(f"kiln float32 vs the decode-only limit {found['kiln_vs_limit']:.2f}x")
        pooled = found["kiln_pooled_vs_best_peer"]
        parts.append(
            "with `pool_host_memory()`: kiln float32 vs the best float32 peer "
            + (f"{pooled:.2f}x" if pooled is not None else "(no peer ran)")
            + f", vs the limit (pooled too) {found['kiln_pooled_vs_limit']:.2f}x"
        )
        lines.append(f"- {label}: " + "; ".join(parts))
    return "\n".join(lines) + "\n\n" + NOTES + "\n"


NOTES = """\
Levers measured (kiln against itself, side by side; a busy shared machine, so paired ratios):

- uint8 output was slower than float32 (median 0.76x of float32 in the same process, 0.49x on
  the 341x256 images): the whole float batch was converted at the end, four passes over
  128x224x224x3 floats. Now each element is cast before batching, and a leading crop's resize
  finishes straight to uint8 on the 0..255 scale (one rounding pass): 1.05x to 1.17x of float32.
- On a busy machine (load ~4, tests running) Grain's uint8 batches were ahead: kiln 0.83-0.88x.
  Grain's uint8 chain stays in uint8 throughout (OpenCV's fixed-point resize and a saturating
  `cv2.transform`), where kiln's colour matrix and resize compute in float; and kiln's element
  function runs about 105 TensorFlow ops per image (window sampling, seed derivations, the
  colour matrix), each with its own dispatch cost, where Grain runs a handful of OpenCV calls.
- The element map followed by a plain batch, which tf.data fuses with the map (the map's
  threads copy each element into its slot of the batch as soon as it is made), instead of a
  parallel batch (a stage of its own, copying the elements later from another thread): float32
  needs 1.04x-1.13x less CPU per image
  (three runs of 5-7 rounds, 16 batches each), wall-clock medians 1.17x (224x224) and 1.11x
  (341x256) at load ~3. The same plain batch with the fusion switched off gained nothing (CPU
  0.99x and 1.07x, wall 0.90x and 0.83x). uint8 output: neutral (CPU 0.98x and 1.04x), its
  elements are a quarter of the bytes. In place.
- XLA (`tf.function(jit_compile=True)`) does not pay on CPU. In a tf.data map on a fixed
  165x165 uint8 window (flip, colour twist, resize to 224x224), the compiled kernels ran at 0.31x
  of stock ops (5 rounds), 0.28x with the random draws inside the compiled function (where XLA's
  stateless random ops draw other numbers than TF's kernels, so a stream would depend on XLA
  being there). XLA's colour twist alone on 224x224 ran 4.5x faster than stock ops (3 rounds):
  its bilinear resize is what loses. The crop window's size changes with every element and XLA
  compiles per shape, so the fused colour can only run on the fixed-size output: the window
  resized first, then flip and colour in XLA, gave 0.86x (224x224) and 0.89x (341x256) of
  kiln's order (3 rounds, load ~4; CPU per image 1.35x and 1.23x).
- Fewer ops per element: the element function on a 16x16 image (pixel work negligible) takes
  122-129 us of CPU per element, 64 us with constant parameters: all the sampling (element
  seed, op seeds, crop window, flip draw and `tf.cond`, colour matrix) costs ~60 us of the
  800-1200 us an image costs here, 5-7% at most. Two cuts that keep the stream, one draw for
  all op seeds (`fold_in(seed, i)` is `[draw(seed), i]`) and the flip as a `tf.reverse` over
  zero or one axes instead of a `tf.cond`, saved 5 us per element, below what the pipeline
  resolves; a one-draw scheme for all parameters would change the stream for at most those
  5-7%. Neither adopted.
- The colour matrix producing the 0..255 scale for uint8 output (one multiply pass over the
  window fewer before the resize): 0.99x CPU per element on the colour + resize chain alone
  (7 rounds), end to end within the noise (0.92x and 1.08x). Outputs would differ by float
  rounding only (7e-6 of the values by 1). Not adopted alone.
- Levels for uint8 output (2026-12-07): the last colour op before the crop's resize gives
  ``255 x + 0.5`` (the scale and the half folded into its matrix, offset and clip), so the
  resize keeps the half and the cast to uint8 rounds by truncating: no multiply pass over the
  window and no rounding pass over the output. The colour + resize chain alone (tf.data, one
  thread, 5 rounds): 385 -> 366 us of CPU per element. End to end, old and new code in
  alternating processes (load ~1): 224x224 1.035x images/s (0.967x CPU per image, 8 rounds of
  40 batches), 341x256 1.013x (0.981x CPU, 10 rounds). Values differ from before only at
  exact half levels (now rounded up, to even before) and by float error next to them. In
  place.
- The crop window resized in uint8 (lists without a colour op before the resize): slower,
  0.80x CPU per element for float32 output and 0.68x for uint8 output (the chain alone, 7
  rounds): TF's bilinear resize is faster on float input.
- tf.data threading (`max_intra_op_parallelism=1`, a private pool of one thread per core):
  neutral, CPU 0.99x-1.03x. `dct_method="INTEGER_FAST"` for the JPEG decode: the same pixels
  and no speed-up with TensorFlow's libjpeg-turbo; `fancy_upscaling=False` (other pixels, by
  up to 80 of 255): no gain either (CPU 0.98x and 0.97x, 5 rounds at load 7-9).
- tf.data's autotuning off (2026-12-07): it times every op of every map call (two clock reads
  and a record per op, to model each stage's cost), and its per-call bookkeeping cost more
  still: a map of 200 trivial ops took 101 -> 61 us of CPU per element without it, one of 2 ops
  ~30 -> ~12 us; on 16x16 images (pixel work negligible) the default augmentation's pipeline
  118 -> 95 us per image. Without it each AUTOTUNE stage runs at one call per core, what
  autotuning arrived at for these CPU-bound stages (`initial_parallelism` set above any core
  count, so a larger host is not capped at tf.data's default of 16). The same pipelines in one
  process, autotuned and not alternating (5 rounds of 24 batches, load 1.0-1.7): 341x256 uint8
  1.04x-1.08x images/s (CPU per image 514 -> 491 us), 224x224 float32 0.92x-1.10x (445 -> 417
  us); in a process that called `pool_host_memory()` 1.04x-1.08x (224x224, 392 -> 366 us) and
  1.03x-1.06x (341x256, 515 -> 490 us). In place; a later `with_options` turns autotuning back
  on (docs/reader.md). Per op, what is left is ~0.15 us of the executor's.
- Where the time goes (224x224, the element function over in-memory records, each variant
  removing one op, CPU per image, 5 paired rounds at load ~3-4): the decode-only limit 747 us,
  kiln 1073 us; without `color_jitter` 869 us (the colour: ~200 us, ~160 of them the
  saturation and hue matrix), without the flip 1042 us (~30 us), the crop alone 845 us (its
  window decode and resize ~100 us over the limit's full decode and float conversion). On one
  thread, on a 160x150 window: the `[pixels, 3] x [3, 3]` colour matmul 155 us, the bilinear
  resize to 224x224 172 us, a cast, add or clip pass 21-28 us.
- The colour matrix as a matmul of rows of 8 pixels against a `[24, 24]` block diagonal of 8
  copies of it (TF's contraction is slow for an inner dimension of 3): 79 us instead of 155 us
  on that window; end to end CPU per image 1.03x (224x224) and 1.05x (341x256) for float32,
  1.02x and 1.08x for uint8 (5 paired rounds, load 4-6). Outputs equal up to float rounding
  (1 ulp on 12-14% of the values; the golden streams hold). In place.
- float32 batches: the limit costs 727 us of CPU per image for float32 batches and 353 us for
  uint8 (4 paired rounds). 128x224x224x3 floats (77 MB) are above glibc malloc's largest mmap
  threshold (32 MB), so every batch is fresh memory from the kernel, a page fault per 4 KB,
  where uint8 batches (19 MB) are reused from the heap: per image, 147 minor page faults and
  315 us of system CPU for float32 batches against 14 and 49 us for uint8 (the limit; kiln's
  float32 output pays alike: 146 and 311 us). With TensorFlow's pooling allocator
  (`TF_CPU_ALLOCATOR_USE_BFC=true`, set before TensorFlow starts; 4 paired rounds of a process
  each way, load 4-7): the limit needs 0.50x the CPU per image (~810 -> ~410 us) and runs 2.6x
  faster, kiln float32 0.64x the CPU (~1150 -> ~740 us), 1.45x faster (0.69x-2.1x between
  rounds), kiln uint8 0.96x the CPU, 1.02x as fast. A process-wide choice for the trainer,
  not kiln's; `dtype="uint8"` avoids the cost. Kiln's float32 ratio to the limit falls as the
  batch memory gets cheaper (CPU 0.67x-0.80x without, 0.52x-0.56x with the pooling allocator):
  the remaining gap is kiln's own pixel work.
- `tf.image.crop_and_resize` (crop and bilinear resize in one op, a flip folded in by swapping
  the box's x1 and x2), measured again on the op alone (the reader's goal notes give the
  pipeline at 0.3x): 3.2x slower than `tf.image.resize` on that window (543 us float input,
  732 us uint8 input with the flip folded in, against 172 us); `ScaleAndTranslate` 610 us. Not
  adopted.
- The colour on whichever of window and output has fewer pixels (resize first when the window
  is larger; the clip then last, which would change seeded streams): 341x256, where half the
  windows are larger than 224x224, CPU 0.98x (5 paired rounds, load ~5). Not adopted.
- Not measured again: one seed draw for all op seeds (5 us per element, above); decoding at a
  reduced DCT scale, since these windows are under twice the output in both dimensions.
- What kiln float32 does that uint8 does not (the element function's graph, 235 nodes, 106 of
  them constants): nothing over the pixels. The 1/255 scale is in the colour matrix, a bilinear
  resize is not clipped, `tf.image.resize` adds only ExpandDims and Squeeze (no copies) around
  ResizeBilinear, and a float32 element is not cast. What float32 adds is the batch: four
  times the bytes copied into it, and its memory. Per image (CPU per image from the process's
  rusage, 5 rounds of a process per variant alternating, 16 batches each, load 5-8): kiln
  float32 709 us user and 373 us system CPU with 150 minor page faults, Grain float32 851 and
  206 us with 28 faults (224x224); 956 + 390 us and 160 faults against 975 + 149 us and 25
  faults (341x256). Kiln's own work is the cheaper; the gap is the kernel's.
- Why Grain's float32 batches are cheaper: NumPy advises transparent huge pages
  (`madvise(MADV_HUGEPAGE)`, this machine's THP mode is `madvise`) for arrays of 4 MB and more,
  so its 77 MB batches fault in 2 MB pages. With that advice switched off
  (`numpy._core.multiarray._set_madvise_hugepage(False)`, 2 paired rounds) Grain float32 took
  164-180 faults and 350-410 us of system CPU per image, and ran at 0.68x-0.75x of itself.
- The same for kiln's batches, without changing a value (the golden streams pass under it):
  glibc's `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (malloc advises huge pages for its
  blocks), set before Python starts: float32 CPU per image 0.78x (0.70-0.80; 1100 -> 837 us,
  below Grain's 1057) at 224x224 and 0.87x (0.81-0.89) at 341x256, uint8 unchanged (1.01x,
  0.94x), 5 paired rounds at load 5-8 (wall-clock 1.28x median at 224x224, too noisy at that
  load to say more). Against TensorFlow's pooling allocator in the same rounds (5, load 7-9):
  hugetlb 0.83x CPU (0.77-0.91), `TF_CPU_ALLOCATOR_USE_BFC=true` 0.71x (0.67-0.74: no zeroing
  of fresh pages at all; 52 us of system CPU per image, 152 with hugetlb, 366 without), wall
  1.27x and 1.42x. Both are process-wide settings for the trainer's launcher (README, "Labels
  and the image format"); `kiln.reader` cannot set either once Python runs (glibc reads its
  tunables at start, its mmap threshold stops at 32 MB, and TensorFlow picks its allocator on
  first use).
- `kiln.reader.pool_host_memory()` makes the pooling allocator a call in the training script
  (before TensorFlow's first op; `load` warns when it came too late). One quiet round (load
  0.3, a fresh process per loader, 16 batches after 4 of warm-up), CPU per image user +
  system: 224x224 kiln float32 761 + 373 us (151 faults) -> 834 + 79 us (12), the limit
  489 + 441 -> 497 + 83 us, Grain float32 1001 + 335 us; 341x256 kiln 1063 + 452 -> 915 +
  86 us, the limit 570 + 711 -> 619 + 155 us, Grain 948 + 215 us. The pooled rows of the
  table above are that process (a child per round).
- glibc's mmap for large blocks cannot be switched off from Python for TensorFlow's threads:
  `mallopt(M_MMAP_MAX, 0)` (and a high trim threshold, or the same as `GLIBC_TUNABLES`) left
  kiln float32 at 149-151 faults per image, since a thread's arena falls back to mmap for a
  block larger than its 64 MB heap whatever the setting. Grain float32 did drop to 9-10
  faults per image under it, 1.14x its speed (2 rounds, load ~1).
- uint8 batches (19 MB) are not always reused from the heap either, under glibc's moving
  thresholds: kiln uint8 took 29.5 minor faults and 120 us of system CPU per image (224x224);
  with them fixed (`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:`
  `glibc.malloc.trim_threshold=268435456`) 9 faults and 49 us, CPU per image 0.90x
  (0.83-0.91), float32 unchanged (1.03x: 77 MB is above any threshold); 3 paired rounds at
  load 6-8. Process-wide too.
- One `ClipByValue` op for the colour's clip instead of `clip_by_value`'s Minimum and Maximum
  (equal outputs): slower, 25 us against 12 us per clip of a 160x150 float window (7 rounds,
  one thread). Not adopted.
- The colour's offset folded into its matmul (`bias_add` on the `[rows, 24]` product, which
  Grappler may fuse into the matmul; with a Relu for the lower clip too): equal outputs and
  signs, CPU per element 1.01x and 1.03x of the current colour on a 160x150 window; the
  offset and clip on the padded product before its slice (their buffers then forwarded):
  0.95x on a 160x150 window, 1.04x on 256x300 (7 rounds each, load 6-9: within the noise).
  Not adopted.
- 0.85x of the decode-only limit is not reached with stock TensorFlow ops: what is left is
  the resize (~150 us) and the colour (~170 us: cast, channel means, matrix, offset, clip, one
  pass each). The next levers: the colour ops on the accelerator (`load_for_model` moves every
  element op there; moving the colour ops alone would take ~170 us per image off the host),
  and a fused kernel doing crop, flip, colour and resize in one uint8 pass as OpenCV does
  (a custom op, outside what `kiln.reader` may import today)."""


# The stored images, for the page.
STORED_NOTE = (
    "corpus built by `kiln build` as JPEGs: 224x224 (resized to 256 and center-cropped, "
    "the reader benchmark's) and 341x256 (resized to a shorter side of 256 only, as "
    "ImageNet-style pipelines store them)"
)
LARGE_TRANSFORMS = [{"resize": {"shorter_side": 256}}]


def build_datasets(manifest: str, output: str) -> dict[str, str]:
    """The peers' datasets: the reader benchmark's 224x224 one and a 341x256 one."""
    from benchmarks.build_bench import build_config
    from kiln.pipeline import build

    datasets = {"224x224": reader_bench.build_datasets(manifest, output)["jpeg"]}
    config = build_config(
        manifest, output, name="peers-jpeg-256", augment=reader_bench.AUGMENT, target_shard_mb=8
    )
    config["transforms"] = LARGE_TRANSFORMS
    dataset_dir = build(config).dataset_dir
    import kiln.reader

    height, width = kiln.reader.info(dataset_dir).image_size
    datasets[f"{width}x{height}"] = dataset_dir
    return datasets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="one round of 2 batches")
    parser.add_argument(
        "--out",
        default=os.path.join(ROOT, "build", "bench"),
        help="scratch folder holding the corpus and datasets (default build/bench)",
    )
    parser.add_argument("--markdown", default=None, help="the page whose section to replace")
    parser.add_argument("--pooled-round", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pooled_round:
        print(json.dumps(pooled_main(json.loads(args.pooled_round))))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("benchmarks").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import run

    out = os.path.abspath(args.out)
    settings = run.QUICK if args.quick else run.FULL
    datasets = build_datasets(run.reader_manifest(settings, out), os.path.join(out, "datasets"))
    results = measure(QUICK if args.quick else FULL, datasets, os.path.join(out, "peers"))
    markdown_path = page.markdown_path(args.markdown, out, args.quick)
    page.write_section(
        results,
        os.path.join(out, "peers.json"),
        markdown_path,
        SECTION_TITLE,
        markdown(results),
        after=AFTER,
    )
    print(f"wrote the peers section of {markdown_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
