"""Training under MultiWorkerMirroredStrategy: two real worker processes on localhost.

Each test starts two Python processes with a ``TF_CONFIG`` naming both as the
cluster's workers (free localhost ports, CPU only, one replica each), as a
multi-machine job runs, and reads what each worker reports on its last line.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from reader.builds import split_keys
from reader.fresh_process import fresh_environment

pytestmark = pytest.mark.slow

# The supported path: a custom training loop whose input is a ReplicaIterator
# (each worker's own replicas, each on its share), then, in the same workers,
# one over `distribute_datasets_from_function` (one pipeline per worker).
CUSTOM_LOOP = """
import json, sys
import numpy as np
import tensorflow as tf
import kiln.reader

path = sys.argv[1]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL_BATCH = 4

def dataset_fn(context):
    return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(GLOBAL_BATCH),
                            seed=3, input_context=context, as_supervised=False)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)),
                                 tf.keras.layers.Conv2D(4, 3, activation="relu"),
                                 tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

@tf.function
def train_step(batch):
    def replica_step(element):
        with tf.GradientTape() as tape:
            losses = loss_fn(element["label"], model(element["image"], training=True))
            loss = tf.nn.compute_average_loss(losses, global_batch_size=GLOBAL_BATCH)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return element["key"]
    return strategy.run(replica_step, args=(batch,))

def train(batches):
    keys = []
    for batch in batches:
        local = strategy.experimental_local_results(train_step(batch))
        keys.append([key.decode() for replica in local for key in replica.numpy().tolist()])
    return keys

replica_iterator = train(kiln.reader.ReplicaIterator(strategy, dataset_fn))
distributed = train(strategy.distribute_datasets_from_function(dataset_fn))
weights = float(sum(np.abs(w.numpy()).sum() for w in model.trainable_variables))
print(json.dumps({"replica_iterator": replica_iterator, "distributed": distributed,
                  "weights": weights, "replicas": strategy.num_replicas_in_sync}))
"""

# Each worker checkpoints its ReplicaIterator after two steps, into its own
# folder, then restores its own checkpoint and the other worker's.
CHECKPOINT = """
import json, os, sys, time
import tensorflow as tf
import kiln.reader

path, directory = sys.argv[1:3]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = strategy.cluster_resolver.task_id

def dataset_fn(context):
    return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(4), seed=3,
                            repeat=True, input_context=context, as_supervised=False)

def keys(inputs, steps):
    return [[key.decode() for replica in strategy.experimental_local_results(next(inputs))
             for key in replica["key"].numpy().tolist()] for _ in range(steps)]

uninterrupted = kiln.reader.ReplicaIterator(strategy, dataset_fn)
keys(uninterrupted, 2)
tf.train.Checkpoint(data=uninterrupted).write(f"{directory}/worker-{worker}/ckpt")
open(f"{directory}/worker-{worker}/written", "w").close()
rest = keys(uninterrupted, 6)

resumed = kiln.reader.ReplicaIterator(strategy, dataset_fn)
tf.train.Checkpoint(data=resumed).read(f"{directory}/worker-{worker}/ckpt").assert_consumed()
other = f"{directory}/worker-{1 - worker}"
deadline = time.monotonic() + 60
while not os.path.exists(f"{other}/written") and time.monotonic() < deadline:
    time.sleep(0.1)
try:
    tf.train.Checkpoint(data=kiln.reader.ReplicaIterator(strategy, dataset_fn)).read(
        f"{other}/ckpt")
    refused = None
except ValueError as error:
    refused = str(error)
print(json.dumps({"rest": rest, "resumed": keys(resumed, 6), "other": refused}))
"""

# Keras' own fit under the same strategy, on the same kiln dataset and on a
# dataset of NumPy arrays without kiln: the error each worker gets, if any.
KERAS_FIT = """
import json, sys
import numpy as np
import tensorflow as tf
import kiln.reader

path = sys.argv[1]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)),
                                 tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

def fit(dataset):
    try:
        model.fit(dataset, epochs=1, verbose=0)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return "trained"

arrays = tf.data.Dataset.from_tensor_slices(
    (np.zeros([8, 16, 16, 3], np.float32), np.zeros([8], np.int64))).batch(4)
print(json.dumps({"kiln": fit(kiln.reader.load(path, batch_size=4, seed=3)),
                  "arrays": fit(arrays)}))
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run_workers(script: str, *args: str, timeout: int = 120) -> list[dict]:
    """Runs `script` as both workers of a two-worker cluster; each one's last line, as JSON."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    workers = []
    for index in range(2):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = fresh_environment(
            {
                "TF_CONFIG": json.dumps(config),
                "CUDA_VISIBLE_DEVICES": "",
            }
        )
        workers.append(
            subprocess.Popen(
                [sys.executable, "-c", script, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    outputs = []
    try:
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=timeout)
            assert worker.returncode == 0, f"worker failed ({worker.returncode}):\n{stderr[-4000:]}"
            outputs.append(json.loads(stdout.splitlines()[-1]))
    finally:
        for worker in workers:  # one that failed leaves the other waiting for it
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    return outputs


@pytest.fixture(scope="module")
def even_dataset(tmp_path_factory):
    """16 PNGs of two classes, train only, in one shard: two workers' shares
    (every other record of the shard) are 8 records each, all of the split."""
    import numpy as np
    import tensorflow as tf

    from kiln.pipeline import build

    root = tmp_path_factory.mktemp("multi-worker")
    for index in range(16):
        folder = root / "images" / ("ab"[index % 2])
        folder.mkdir(parents=True, exist_ok=True)
        image = np.full([16, 16, 3], index * 15, np.uint8)
        image[index % 16, :, 1] = 255
        (folder / f"{index:02d}.png").write_bytes(tf.io.encode_png(image).numpy())
    return build(
        {
            "name": "tiny",
            "source": {"type": "image_folder", "root": str(root / "images")},
            "output": str(root / "datasets"),
            "splits": {"fractions": {"train": 1.0}},
            "sharding": {"num_shards": 1},
        },
        [],
    )


def test_custom_loop_trains_both_workers_on_disjoint_complete_shares(even_dataset):
    first, second = run_workers(CUSTOM_LOOP, even_dataset.dataset_dir)
    every = split_keys(even_dataset, "train")
    assert len(every) == 16 and first["replicas"] == second["replicas"] == 2
    for path in ("replica_iterator", "distributed"):
        # Batches of 2 per replica: 8 records each, 4 steps on both workers.
        assert len(first[path]) == len(second[path]) == 4, path
        mine = [key for step in first[path] for key in step]
        theirs = [key for step in second[path] for key in step]
        assert len(mine) == len(set(mine)) == 8, path
        assert len(theirs) == len(set(theirs)) == 8, path
        assert not set(mine) & set(theirs), path
        assert sorted(mine + theirs) == sorted(key.decode() for key in every), path
    # The gradients were all-reduced: both workers end with the same model.
    assert first["weights"] == pytest.approx(second["weights"], rel=1e-6)


def test_each_worker_resumes_its_own_checkpoint_and_refuses_the_other(even_dataset, tmp_path):
    outputs = run_workers(CHECKPOINT, even_dataset.dataset_dir, str(tmp_path))
    for worker, out in enumerate(outputs):
        # Six steps on from step 2, into the second pass (4 steps a pass).
        assert out["resumed"] == out["rest"] and len(out["rest"]) == 6
        assert out["other"] == (
            f"ReplicaIterator: the checkpoint holds the input positions of replicas "
            f"[{1 - worker}] and this worker holds replicas [{worker}]: each worker saves its "
            f"own replicas' positions, in their shares of the data; restore every worker from "
            f"the checkpoint it wrote itself"
        )
    assert not {key for step in outputs[0]["rest"] for key in step} & {
        key for step in outputs[1]["rest"] for key in step
    }


def test_keras_fit_fails_under_multi_worker_strategy_with_any_dataset(even_dataset):
    """Keras 3's `fit` reduces its first batch across replicas with
    `strategy.reduce` (`_maybe_symbolic_build`), which takes one value, not the
    (images, labels) structure, across workers: it fails the same way on a
    dataset of NumPy arrays, so it is not kiln's. README's "Distributed
    training" says so and shows the custom loop above instead. When this
    starts training, Keras has fixed it: update the README."""
    outputs = run_workers(KERAS_FIT, even_dataset.dataset_dir)
    for out in outputs:
        assert out["kiln"].startswith("ValueError: Attempt to convert a value (PerReplica:"), out
        assert out["arrays"].startswith("ValueError: Attempt to convert a value (PerReplica:"), out
