"""Where the reader runs besides one process: tf.data service workers, MirroredStrategy replicas."""

from __future__ import annotations

import collections
import hashlib
import json

import pytest

import kiln.reader
from reader.builds import TRAIN_AUGMENT, split_keys
from reader.fresh_process import run_python


@pytest.fixture(scope="module")
def tf_data_service():
    """A tf.data service on localhost: a dispatcher and two workers, stopped afterwards."""
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = []
    try:
        for _ in range(2):
            workers.append(
                service.WorkerServer(service.WorkerConfig(dispatcher_address=address, port=0))
            )
        yield dispatcher.target
    finally:
        for worker in workers:
            worker._stop()
        dispatcher._stop()


def elements(dataset) -> collections.Counter:
    """Each element as (key, sha256 of its augmented pixels), counted."""
    return collections.Counter(
        (key, hashlib.sha256(image.tobytes()).hexdigest())
        for batch in dataset
        for key, image in zip(batch["key"].numpy(), batch["image"].numpy(), strict=True)
    )


def through_service(dataset, target: str, mode: str):
    import tensorflow as tf

    return dataset.apply(
        tf.data.experimental.service.distribute(processing_mode=mode, service=target)
    )


def test_distributed_epoch_delivers_every_record_once_per_pass_augmented_as_locally(
    png_dataset, tf_data_service
):
    def make(**kwargs):
        return kiln.reader.load(
            png_dataset.dataset_dir, batch_size=8, seed=4, repeat=2, as_supervised=False, **kwargs
        )

    local = elements(make())
    # Two workers, each handed shard files by the dispatcher as it asks.
    distributed = elements(
        through_service(
            make(options=kiln.reader.ReadOptions(dynamic_sharding=True)),
            tf_data_service,
            "distributed_epoch",
        )
    )
    every = split_keys(png_dataset, "train")
    assert collections.Counter(key for key, _ in distributed) == collections.Counter(every * 2)
    # Each record's augmentation in each pass is the local stream's.
    assert distributed == local
    assert len(local) == 2 * len(every)  # two passes, every image augmented anew


def test_distributed_epoch_without_dynamic_sharding_fails_instead_of_repeating_records(
    png_dataset, tf_data_service
):
    """Without the flag the service cannot split the pipeline's files: one
    worker is given the pass and the other, given nothing, fails the pass's
    cardinality. It must not deliver every record once per worker."""
    import tensorflow as tf

    dataset = kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=4, as_supervised=False)
    distributed = through_service(dataset, tf_data_service, "distributed_epoch")
    with pytest.raises(tf.errors.OpError, match=r"expected to contain \d+ elements but contained"):
        elements(distributed)


def test_parallel_epochs_every_worker_delivers_the_seeded_stream(png_dataset, tf_data_service):
    dataset = kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=4, as_supervised=False)
    local = elements(dataset)
    distributed = elements(through_service(dataset, tf_data_service, "parallel_epochs"))
    assert distributed == local + local  # two workers, each the whole stream


def test_dynamic_sharding_excludes_an_input_context(png_dataset):
    import tensorflow as tf

    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    with pytest.raises(ValueError, match=r"dynamic_sharding=True\): tf\.data service hands out"):
        kiln.reader.load(
            png_dataset.dataset_dir,
            batch_size=8,
            options=kiln.reader.ReadOptions(dynamic_sharding=True),
            input_context=context,
        )


# Two logical CPUs must be configured before TensorFlow initializes its
# devices, which other tests in this process already did: a fresh process.
MIRRORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
contexts = []

def dataset_fn(context):
    contexts.append([context.num_input_pipelines, context.num_replicas_in_sync])
    return kiln.reader.load(sys.argv[1], batch_size=context.get_per_replica_batch_size(8),
                            seed=3, input_context=context, as_supervised=False)

@tf.function
def step(batch):
    return strategy.run(lambda b: (tf.reduce_mean(b["image"]), b["key"]), args=(batch,))

replicas = [[], []]
for batch in strategy.distribute_datasets_from_function(dataset_fn):
    _, keys = step(batch)
    for index, part in enumerate(strategy.experimental_local_results(keys)):
        replicas[index] += [key.decode() for key in part.numpy().tolist()]
print(json.dumps({"contexts": contexts, "replicas": replicas}))
"""


def test_mirrored_strategy_replicas_see_disjoint_data(png_dataset):
    out = json.loads(run_python(MIRRORED, png_dataset.dataset_dir).strip().splitlines()[-1])
    assert out["contexts"] == [[1, 2]]
    first, second = out["replicas"]
    assert first and second and not set(first) & set(second)
    every = [key.decode() for key in split_keys(png_dataset, "train")]
    assert collections.Counter(first + second) == collections.Counter(every)


# Keras's evaluate under a two-replica strategy that also distributes the
# training data per replica (the README's pattern), on a split of one shard
# file, against the same model outside it.
KERAS_EVALUATE_MIRRORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader

path = sys.argv[1]
info = kiln.reader.info(path)
assert len(info.splits["validation"].shards) == 1
validation = kiln.reader.load(path, "validation", batch_size=4)

def model():
    layers = [tf.keras.Input(validation.element_spec[0].shape[1:]),
              tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(info.num_classes)]
    built = tf.keras.Sequential(layers)
    built.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return built

plain = model()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    mirrored = model()
mirrored.set_weights(plain.get_weights())
train = strategy.distribute_datasets_from_function(
    lambda context: kiln.reader.load(path, batch_size=4, seed=1, input_context=context),
    tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA))
mirrored.fit(train, epochs=1, verbose=0)
mirrored.set_weights(plain.get_weights())
print(json.dumps({"plain": plain.evaluate(validation, verbose=0),
                  "mirrored": mirrored.evaluate(validation, verbose=0)}))
"""


def test_keras_evaluates_a_one_file_split_under_mirrored_strategy(png_dataset):
    out = json.loads(run_python(KERAS_EVALUATE_MIRRORED, png_dataset.dataset_dir).splitlines()[-1])
    # Every element once: the same loss and accuracy as outside the strategy.
    assert out["mirrored"] == pytest.approx(out["plain"], rel=1e-5)


# Trains some steps on two replicas, saves (model variable and input
# position), then either continues (save) or restores and continues (restore).
REPLICA_CHECKPOINT = """
import itertools, json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader

path, directory, mode = sys.argv[1:4]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def dataset_fn(context):
    return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(8), seed=3,
                            repeat=2, input_context=context, as_supervised=False)

with strategy.scope():
    weight = tf.Variable(0.0)
inputs = kiln.reader.ReplicaIterator(strategy, dataset_fn)
checkpoint = tf.train.Checkpoint(weight=weight, data=inputs)

@tf.function
def train_step(batch):
    def replica_step(b):
        mean = tf.reduce_mean(b["image"])
        tf.distribute.get_replica_context().merge_call(
            lambda strategy, value: weight.assign_add(
                strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)), args=(mean,))
        return b["key"], tf.reduce_sum(b["image"], axis=[1, 2, 3])
    return strategy.run(replica_step, args=(batch,))

def run(steps=None):
    out = []
    for batch in itertools.islice(inputs, steps):
        keys, sums = train_step(batch)
        out.append([[[k.decode() for k in k_.numpy().tolist()], [round(float(s), 3) for s in s_]]
                    for k_, s_ in zip(strategy.experimental_local_results(keys),
                                      strategy.experimental_local_results(sums))])
    return out

if mode == "save":
    first = run(5)
    checkpoint.write(directory)
    print(json.dumps({"first": first, "rest": run(), "weight": float(weight.numpy())}))
else:
    checkpoint.read(directory).assert_consumed()
    print(json.dumps({"rest": run(), "weight": float(weight.numpy())}))
"""


def test_replica_iterator_checkpoint_resumes_in_a_fresh_process(png_dataset, tmp_path):
    path, directory = png_dataset.dataset_dir, str(tmp_path / "ckpt")
    saved = json.loads(run_python(REPLICA_CHECKPOINT, path, directory, "save").splitlines()[-1])
    restored = json.loads(
        run_python(REPLICA_CHECKPOINT, path, directory, "restore").splitlines()[-1]
    )
    # The restored run continues with exactly the uninterrupted run's batches
    # (keys and augmented pixels), into the second pass, and the same weight.
    assert restored["rest"] == saved["rest"] and len(saved["rest"]) > 5
    assert restored["weight"] == pytest.approx(saved["weight"], rel=1e-6)
    steps = saved["first"] + saved["rest"]
    # Both replicas take every step, on disjoint records of equal shares.
    assert all(len(step) == 2 and step[0][0] and step[1][0] for step in steps)
    first = [key for step in steps for key in step[0][0]]
    second = [key for step in steps for key in step[1][0]]
    assert not set(first) & set(second)
    # 47 records: two shares of 23 per pass (the larger share skips one).
    total = png_dataset.info.splits["train"].num_examples
    assert len(first) == len(second) == 2 * (total // 2)
    assert max(collections.Counter(first + second).values()) == 2  # at most once per pass


def test_replica_iterator_serves_the_default_strategy(png_dataset):
    """The default strategy (no `tf.distribute` scope: one replica, here) has
    no `worker_devices`; ReplicaIterator serves it as it says, with the one
    replica reading the whole split."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()

    def dataset_fn(context):
        return kiln.reader.load(
            png_dataset.dataset_dir,
            batch_size=context.get_per_replica_batch_size(8),
            seed=3,
            input_context=context,
            as_supervised=False,
        )

    inputs = kiln.reader.ReplicaIterator(strategy, dataset_fn)
    keys = [key for batch in inputs for key in strategy.run(lambda b: b["key"], args=(batch,))]
    plain = kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=3, as_supervised=False)
    assert [key.numpy() for key in keys] == [k for b in plain for k in b["key"].numpy()]


def test_replica_iterator_names_a_misplaced_argument(png_dataset):
    """The arguments swapped failed with "'function' object has no attribute
    'num_replicas_in_sync'", a dataset for the function with "not callable"."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()

    def dataset_fn(context):
        return kiln.reader.load(png_dataset.dataset_dir, batch_size=8, input_context=context)

    with pytest.raises(
        TypeError, match=r"strategy must be a tf\.distribute\.Strategy, got function"
    ):
        kiln.reader.ReplicaIterator(dataset_fn, strategy)
    dataset = kiln.reader.load(png_dataset.dataset_dir, batch_size=8)
    with pytest.raises(TypeError, match=r"dataset_fn must be a function of a tf\.distribute\."):
        kiln.reader.ReplicaIterator(strategy, dataset)


def test_replica_iterator_refuses_a_second_loop_after_its_datasets_ended(png_dataset):
    """An epoch loop over one ReplicaIterator of one-pass datasets ran its
    first epoch, then every later one on nothing, silently."""
    import tensorflow as tf

    def dataset_fn(context):
        return kiln.reader.load(
            png_dataset.dataset_dir, batch_size=16, seed=3, input_context=context
        )

    inputs = kiln.reader.ReplicaIterator(tf.distribute.get_strategy(), dataset_fn)
    total = png_dataset.info.splits["train"].num_examples
    assert sum(1 for _ in inputs) == -(-total // 16)
    with pytest.raises(StopIteration):
        next(inputs)  # an iterator that ended stays ended
    with pytest.raises(RuntimeError, match=r"iterated again after its datasets ended.*repeat=True"):
        for _ in inputs:
            pass


# dataset_fns that read the same records on both replicas, and two that do not.
REPLICA_CONTEXT_IGNORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader

path = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
load = lambda **kwargs: kiln.reader.load(path, batch_size=4, seed=3, **kwargs)
dataset_fns = {
    "ignored": lambda context: load(),
    "ignored, then prefetched": lambda context: load().prefetch(1),
    "replica 0's": lambda context: load(input_context=tf.distribute.InputContext(2, 0, 2)),
    "passed on": lambda context: load(input_context=context),
    "tf.data service's": lambda context: load(
        options=kiln.reader.ReadOptions(dynamic_sharding=True)),
}
out = {}
for name, dataset_fn in dataset_fns.items():
    try:
        next(kiln.reader.ReplicaIterator(strategy, dataset_fn))
        out[name] = "read"
    except ValueError as error:
        out[name] = str(error)
print(json.dumps(out))
"""


def test_replica_iterator_refuses_a_dataset_fn_that_does_not_pass_on_its_context(png_dataset):
    """A dataset_fn that did not pass its context to `load` had both
    replicas read the whole split: the same records in every step, silently."""
    path = png_dataset.dataset_dir
    out = json.loads(run_python(REPLICA_CONTEXT_IGNORED, path).strip().splitlines()[-1])
    advice = (
        "in every step; pass on the context it is given: "
        "kiln.reader.load(path, ..., input_context=context)"
    )
    ignored = (
        f"ReplicaIterator: dataset_fn read split 'train' of {path} without the "
        f"tf.distribute.InputContext it was given (pipeline 0 of 2, for replica 0): every "
        f"replica would read the whole split, the same records {advice}"
    )
    assert out == {
        "ignored": ignored,
        "ignored, then prefetched": ignored,
        "replica 0's": (
            f"ReplicaIterator: dataset_fn read split 'train' of {path} with an input_context "
            f"for pipeline 0 of 2, not the one it was given (pipeline 1 of 2, for replica 1): "
            f"replicas would read the same share, the same records {advice}"
        ),
        "passed on": "read",
        "tf.data service's": service_refused(path, replica=0),
    }


def service_refused(path: str, replica: int) -> str:
    return (
        f"ReplicaIterator: dataset_fn read split 'train' of {path} with "
        f"ReadOptions(dynamic_sharding=True), for tf.data service (pipeline {replica} of 2, "
        f"for replica {replica}): ReplicaIterator gives every replica its own input pipeline, "
        f"so every replica's service job hands it every file (the same records on every "
        f"replica), or, with a job_name they share, the replicas run out at different steps "
        f"and the iterator stops at the first (records left unread); and an iterator reading "
        f"from tf.data service cannot be checkpointed. Pass on the context it is given "
        f"(kiln.reader.load(path, ..., input_context=context)), or distribute the service's "
        f"dataset with strategy.distribute_datasets_from_function"
    )


# A ReplicaIterator over tf.data service reads: each replica's `distribute`
# made its own job, and every job handed its replica every shard.
REPLICA_SERVICE = """
import collections, json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader

path, target = sys.argv[1:3]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def dataset_fn(context):
    dataset = kiln.reader.load(path, batch_size=4, seed=3, as_supervised=False,
                               options=kiln.reader.ReadOptions(dynamic_sharding=True))
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode="distributed_epoch", service=target))

try:
    inputs = kiln.reader.ReplicaIterator(strategy, dataset_fn)
except ValueError as error:
    print(json.dumps(str(error)))
else:
    keys = collections.Counter(
        key for batch in inputs for values in strategy.experimental_local_results(batch)
        for key in values["key"].numpy().tolist())
    print(json.dumps(f"read: {len(keys)} records, each read {sorted(set(keys.values()))} times"))
"""


def test_replica_iterator_refuses_tf_data_service_reads(png_dataset, tf_data_service):
    """Each replica's pipeline was its own service job, handed every shard:
    both replicas trained on every record of the pass, silently."""
    path = png_dataset.dataset_dir
    out = json.loads(run_python(REPLICA_SERVICE, path, tf_data_service).strip().splitlines()[-1])
    assert out == service_refused(path, replica=0)


# A ReplicaIterator checkpoint restored under another replica count: TF
# restores the iterators it finds by index, silently, into other shares.
REPLICA_COUNT_CHANGED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader

path, directory = sys.argv[1:3]
two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
one = tf.distribute.get_strategy()

def dataset_fn(context):
    return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(4), seed=3,
                            repeat=True, input_context=context)

def written_with(strategy, name):
    inputs = kiln.reader.ReplicaIterator(strategy, dataset_fn)
    next(inputs)
    return tf.train.Checkpoint(data=inputs).write(f"{directory}/{name}")

def restored_into(strategy, checkpoint):
    inputs = kiln.reader.ReplicaIterator(strategy, dataset_fn)
    try:
        tf.train.Checkpoint(data=inputs).restore(checkpoint)  # as the README restores
    except ValueError as error:
        return str(error)
    next(inputs)
    return "restored"

from_two, from_one = written_with(two, "two"), written_with(one, "one")
print(json.dumps({"two into one": restored_into(one, from_two),
                  "one into two": restored_into(two, from_one),
                  "two into two": restored_into(two, from_two)}))
"""


def test_replica_iterator_refuses_a_checkpoint_of_another_replica_count(build_dataset, tmp_path):
    """Four shard files: one replica reads all four whole, two replicas two
    each, so their pipelines have the same structure and TF restored two
    replicas' positions into one without a word (a wrong stream: records
    repeated within a pass)."""
    four = build_dataset(sharding={"num_shards": {"train": 4}}, augment=TRAIN_AUGMENT)
    out = json.loads(
        run_python(REPLICA_COUNT_CHANGED, four.dataset_dir, str(tmp_path)).splitlines()[-1]
    )
    assert out["two into two"] == "restored"
    assert out["two into one"].startswith(
        "ReplicaIterator: the checkpoint was written with 2 replicas and this strategy has 1: "
    )
    assert "written with 1 replicas and this strategy has 2" in out["one into two"]


# Keras fit under MirroredStrategy with kiln's per-replica pipelines: steps
# announced (from the dataset's cardinality) and steps run, per epoch.
KERAS_FIT_PER_REPLICA = """import json, sys, warnings
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import kiln.reader
keras = tf.keras
path = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def dataset_fn(context):
    return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(8), seed=3,
                            input_context=context, normalize=True)

class Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.announced, self.ran = self.params["steps"], []
    def on_epoch_begin(self, epoch, logs=None):
        self.ran.append(0)
    def on_train_batch_end(self, batch, logs=None):
        self.ran[-1] += 1

with strategy.scope():
    model = keras.Sequential([keras.Input((24, 24, 3)),
                              keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
# One kiln pipeline per replica: the dataset's cardinality is then the
# replica's step count, which Keras announces.
options = tf.distribute.InputOptions(
    experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    experimental_fetch_to_device=False)
train = strategy.distribute_datasets_from_function(dataset_fn, options)
steps = Steps()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.fit(train, epochs=2, verbose=0, callbacks=[steps])
ran_out = [str(w.message)[:80] for w in caught if "ran out" in str(w.message)]
print(json.dumps({"announced": steps.announced, "ran": steps.ran, "warnings": ran_out}))
"""


def test_keras_fit_under_mirrored_strategy_runs_the_steps_it_announces(png_dataset):
    out = json.loads(run_python(KERAS_FIT_PER_REPLICA, png_dataset.dataset_dir).splitlines()[-1])
    total = png_dataset.info.splits["train"].num_examples
    # Two replicas, 23 records each (47 // 2), batches of 4: 6 steps an epoch.
    assert out["announced"] == -(-(total // 2) // 4)
    assert out["ran"] == [out["announced"]] * 2
    assert out["warnings"] == []


def test_a_worker_in_another_working_directory_reads_a_relative_dataset_path(
    png_dataset, tmp_path, monkeypatch
):
    """A trainer passes ``build/datasets/shapes`` and the tf.data service's
    workers run elsewhere (their own processes, their own working
    directories): the files in the graph must not be relative to the
    trainer's. They were, and the worker failed with NotFoundError."""
    import os
    import subprocess
    import sys

    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = subprocess.Popen(  # TensorFlow alone: the graph holds no Python
        [
            sys.executable,
            "-c",
            "import tensorflow as tf; s = tf.data.experimental.service; "
            f"s.WorkerServer(s.WorkerConfig(dispatcher_address={address!r}, port=0)).join()",
        ],
        cwd=elsewhere,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        parent, name = os.path.split(png_dataset.dataset_root)
        monkeypatch.chdir(parent)
        dataset = kiln.reader.load(name, batch_size=8, seed=4, as_supervised=False)
        local = elements(dataset)
        distributed = elements(through_service(dataset, dispatcher.target, "parallel_epochs"))
        assert distributed == local
    finally:
        worker.kill()
        worker.wait(timeout=60)
        dispatcher._stop()
