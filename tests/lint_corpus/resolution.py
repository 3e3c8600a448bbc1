"""How traced functions are found: by name, lambdas, partial, factories, calls."""

import functools
import random
from functools import partial

import tensorflow as tf


def build(files, config):
    ds = tf.data.TFRecordDataset(files)
    ds = ds.map(parse_defined_later)
    ds = ds.map(lambda record: decode(record, config["size"]))
    ds = ds.map(functools.partial(augment, strength=config["strength"]))
    ds = ds.map(partial(scale, config["factor"]))

    def nested(image):
        print("nested")  # expect: K103
        return image

    ds = ds.map(nested)
    ds = ds.map(tf.function(wrapped_by_tf_function))
    ds = ds.map(map_func=by_keyword)
    return ds


def parse_defined_later(record):
    print("parsed")  # expect: K103
    return record


def decode(record, size):
    image = tf.io.decode_png(record)
    if size > 64:  # size comes from config at the call site: fine
        image = tf.image.resize(image, [size, size])
    return check_range(image, size)


def check_range(image, size):
    # Reached through decode: the call graph is followed, and the finding is here.
    if tf.reduce_max(image) > size:  # expect: K104
        image = image / 255
    return deeper(image)


def deeper(image):
    return deepest(image) + random.random()  # expect: K101


def deepest(image):
    return image.numpy()  # expect: K102


def augment(image, strength=1.0):
    if strength > 0.5:  # bound by partial: configuration
        image = tf.image.adjust_contrast(image, strength)
    if image[0, 0, 0] > 0:  # expect: K104
        image = -image
    return image


def scale(factor, image):
    # `factor` is bound by partial; `image` is the element.
    if factor != 1:
        image = image * factor
    while image[0] > 1:  # expect: K105
        image = image / 2
    return image


def wrapped_by_tf_function(image):
    return image + random.gauss(0, 1)  # expect: K101


def by_keyword(image):
    return tf.cond(image[0] > 0, lambda: flip(image), lambda: image)


def flip(image):
    print("flip")  # expect: K103
    return tf.reverse(image, [0])


@tf.function
def train_step(images, labels, training=True):
    if training:  # default value: a Python flag
        images = images * 2
    if tf.reduce_sum(labels) > 0:  # expect: K104
        images = images + 1
    print("tracing train_step")  # expect: K103
    return images


@tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
def serve(batch):
    return batch.numpy()  # expect: K102


def recursive(image, n):
    # Recursion must not hang the checker.
    return recursive(image, n - 1) if n else image


def unused_helper(image):
    print("never traced")  # not called from traced code: fine
    return image


ds_recursive = tf.data.Dataset.range(3).map(lambda x: recursive(x, 3))


def per_row(row):
    if tf.reduce_sum(row) > 0:  # expect: K104
        row = -row
    return row


def name_of(kind):
    if kind == "rgb":  # called by map() on configuration only: fine
        return "colour"
    return kind


def handed_on(image, kinds=("rgb", "gray")):
    rows = tf.map_fn(per_row, image)
    names = list(map(name_of, kinds))

    def darker():
        print("darker branch")  # expect: K103
        return rows * 0.5

    def unchanged():
        return rows

    return tf.cond(tf.reduce_mean(rows) > 0.5, darker, unchanged), names


ds_handed_on = tf.data.Dataset.from_tensor_slices([[[0.0]]]).map(handed_on)
