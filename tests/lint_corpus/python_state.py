"""Python state mutated in traced code (K109), and the correct patterns next to it."""

import collections

import tensorflow as tf

counter = 0
seen = []
cache = {}
labels_seen = set()
history = collections.deque(maxlen=10)
step = tf.Variable(0, dtype=tf.int64)
table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=-1)
SCALE = 2.0


def parse(record):
    global counter
    counter += 1  # expect: K109
    seen.append(record)  # expect: K109
    cache["last"] = record  # expect: K109
    labels_seen.add(record)  # expect: K109
    history.appendleft(record)  # expect: K109
    del cache["first"]  # expect: K109
    cache.setdefault("count", 0)  # expect: K109
    return record


def reset(record):
    global counter, seen
    counter = 0  # expect: K109
    seen = [record]  # expect: K109
    return record


def build_ops(image):
    # Local lists built and returned: the usual way to assemble ops. Fine.
    parts = []
    for channel in range(3):
        parts.append(image[..., channel] * SCALE)
    parts.extend([image[..., 0]])
    stats = {}
    stats["mean"] = tf.reduce_mean(image)
    stats.update(max=tf.reduce_max(image))
    del stats["max"]
    step.assign_add(1)  # a tf.Variable updated by an op: runs per element
    table.insert(tf.constant(["seen"]), tf.constant([1], tf.int64))  # an op too
    offset = counter + len(seen)  # reading module state is configuration
    return tf.stack(parts) + stats["mean"] + offset


def make_counter():
    calls = 0
    memo = []

    def count(image):
        nonlocal calls
        calls += 1  # expect: K109
        memo.append(image)  # expect: K109
        return image

    return count


def with_helper(image):
    total = 0
    collected = []

    def add(value):
        nonlocal total
        total += 1  # the helper runs within this trace: state local to it
        collected.append(value)
        return value

    add(image)
    _record(image)
    return tf.stack(collected) * total


def _record(image):
    seen.append(image)  # expect: K109
    return image


class Stateful:
    def __init__(self):
        self.calls = 0
        self.images = []
        self.steps = tf.Variable(0)
        self.first_shape = None

    @tf.function
    def __call__(self, image):
        self.calls += 1  # expect: K109
        self.images.append(image)  # expect: K109
        self.steps.assign_add(1)
        self.first_shape = image.shape  # plain attribute assignment: not reported
        return image


def not_traced(values):
    # Mutation outside traced code is ordinary Python.
    global counter
    counter += 1
    seen.extend(values)
    cache["values"] = values
    return values


ds = tf.data.Dataset.from_tensor_slices(tf.zeros([4, 8, 8, 3]))
ds = ds.map(parse).map(reset).map(build_ops).map(make_counter()).map(with_helper)
ds = ds.map(Stateful())
not_traced([1, 2])
