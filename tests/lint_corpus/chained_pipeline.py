"""tf.data pipelines built by chaining; filter, flat_map and interleave functions."""

import numpy as np
import tensorflow as tf


def keep(image, label):
    return np.random.rand() > 0.1  # expect: K101


def expand(image, label):
    print("flat_map")  # expect: K103
    return tf.data.Dataset.from_tensors((image, label)).repeat(2)


def open_shard(path):
    print("interleave")  # expect: K103
    return tf.data.TFRecordDataset(path)


records = (
    tf.data.Dataset.list_files("shards/*.tfrecord")
    .interleave(open_shard, cycle_length=4)
    .map(lambda record: (tf.io.decode_png(record), np.random.randint(10)))  # expect: K101
    .filter(keep)
    .flat_map(expand)
    .batch(8)
    .map(lambda images, labels: (images, labels.numpy()))  # expect: K102
)
