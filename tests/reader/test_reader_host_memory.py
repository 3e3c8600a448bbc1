"""`kiln.reader.pool_host_memory`: TensorFlow's pooling allocator for float32 batches.

Each case runs in a fresh interpreter: the allocator is chosen once per
process, at TensorFlow's first op.
"""

from __future__ import annotations

import json
import subprocess
import sys

from kiln.reader import host_memory
from reader.fresh_process import fresh_environment, run_python

# TensorFlow's oneDNN switch: on, its host allocator is oneDNN's (pooling).
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"

# Batches above glibc's largest mmap threshold (32 MB): 3072 float32 images of
# 32x32x3 are 37.7 MB, fresh pages from the kernel every batch by default.
READ = """
import hashlib, json, logging, resource, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import tensorflow as tf
import kiln.reader
from kiln.reader import host_memory

mode = sys.argv[2]
if mode == "late":
    tf.constant(1.0) + 1.0  # TensorFlow has chosen its allocator
if mode in ("pool", "late"):
    kiln.reader.pool_host_memory()
dataset = kiln.reader.load(sys.argv[1], "train", batch_size=3072, seed=3, repeat=True)
iterator = iter(dataset)
digest = hashlib.sha256()
for _ in range(2):  # warm up: the pool takes its memory
    images, labels = next(iterator)
    digest.update(images.numpy())
    digest.update(labels.numpy())
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    images, labels = next(iterator)
    digest.update(images.numpy())
    digest.update(labels.numpy())
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"pools": host_memory.pools(), "faults_per_batch": faults / 4,
                  "digest": digest.hexdigest(), "dtype": images.dtype.name}))
"""


def _read(dataset_dir: str, mode: str, onednn: str = "0") -> tuple[dict, str]:
    """READ in a fresh interpreter. `onednn`: ``TF_ENABLE_ONEDNN_OPTS``; "0"
    (the default here) gives TensorFlow's own host allocator on every CPU
    (with oneDNN on, the default on recent Intel CPUs, oneDNN's allocator
    pools already: see the last test)."""
    env = fresh_environment()
    env.pop(host_memory.ENVIRONMENT_VARIABLE, None)
    env[ONEDNN_VARIABLE] = onednn
    completed = subprocess.run(
        [sys.executable, "-c", READ, dataset_dir, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1]), completed.stderr


def test_pooled_batches_reuse_memory_and_keep_every_value(jpeg_dataset):
    default, default_log = _read(jpeg_dataset.dataset_dir, "default")
    pooled, pooled_log = _read(jpeg_dataset.dataset_dir, "pool")
    assert default["dtype"] == pooled["dtype"] == "float32"
    assert not default["pools"] and pooled["pools"]
    # The same seeded stream, byte for byte.
    assert pooled["digest"] == default["digest"]
    # Each 37.7 MB batch is fresh memory by default (~4,000 page faults per batch here);
    # the pool reuses its memory (~1,300: what remains is the per-element work's own).
    assert default["faults_per_batch"] > 2000, (default, pooled)
    assert pooled["faults_per_batch"] < default["faults_per_batch"] / 2, (default, pooled)
    assert "pool_host_memory" not in default_log + pooled_log


def test_called_after_the_first_op_it_says_so(jpeg_dataset):
    late, log = _read(jpeg_dataset.dataset_dir, "late")
    assert not late["pools"]
    warnings = [line for line in log.splitlines() if "pool_host_memory() had no effect" in line]
    assert len(warnings) == 1, log[-4000:]
    assert host_memory.ENVIRONMENT_VARIABLE in warnings[0]


def test_importing_and_loading_leave_the_allocator_alone(png_dataset):
    out = run_python(
        "import os, sys\n"
        f"before = os.environ.get({host_memory.ENVIRONMENT_VARIABLE!r})\n"
        "import kiln.reader\n"
        "dataset = kiln.reader.load(sys.argv[1], 'train', batch_size=8, seed=0)\n"
        "next(iter(dataset))\n"
        f"print(os.environ.get({host_memory.ENVIRONMENT_VARIABLE!r}) == before)\n",
        png_dataset.dataset_dir,
        env={},
    )
    assert out.strip() == "True"


def test_with_onednn_tensorflow_pools_already(jpeg_dataset):
    """With oneDNN on (TensorFlow's default on Intel CPUs with AVX512_VNNI or
    AMX), TensorFlow's host allocator is oneDNN's, which pools: the default
    is then as cheap as pool_host_memory(), and the late call warns of nothing."""
    plain, _ = _read(jpeg_dataset.dataset_dir, "default")
    onednn, _ = _read(jpeg_dataset.dataset_dir, "default", onednn="1")
    late, log = _read(jpeg_dataset.dataset_dir, "late", onednn="1")
    assert onednn["pools"] and late["pools"]
    assert onednn["faults_per_batch"] < plain["faults_per_batch"] / 2, (plain, onednn)
    assert "pool_host_memory() had no effect" not in log
