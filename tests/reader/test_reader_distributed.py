"""Where the reader runs besides one process: tf.data service workers, MirroredStrategy replicas."""

from __future__ import annotations

import collections
import json

import kiln.reader
from reader.builds import split_keys
from reader.fresh_process import run_python


def test_tf_data_service_delivers_every_record(png_dataset):
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1], port=0)
    )
    try:
        dataset = kiln.reader.load(
            png_dataset.dataset_dir, batch_size=8, seed=4, as_supervised=False
        )
        distributed = dataset.apply(
            service.distribute(
                processing_mode=service.ShardingPolicy.OFF,
                service=dispatcher.target,
                job_name="kiln-reader-test",
            )
        )
        keys, shapes = [], set()
        for batch in distributed:
            keys += batch["key"].numpy().tolist()
            shapes.add(tuple(batch["image"].shape[1:]))
        assert collections.Counter(keys) == collections.Counter(split_keys(png_dataset, "train"))
        assert shapes == {(24, 24, 3)}
    finally:
        worker._stop()
        dispatcher._stop()


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
