"""tf.py_function and friends: the call is flagged, the wrapped Python is not traced."""

import random

import numpy as np
import tensorflow as tf
import tensorflow.compat.v1 as tf1


def _decode_with_pillow(path):
    # Runs eagerly, once per element, inside py_function: .numpy() and random work here.
    data = path.numpy()
    return np.frombuffer(data, np.uint8) + random.randint(0, 3)


def load(path):
    image = tf.py_function(_decode_with_pillow, [path], tf.uint8)  # expect: K107
    image.set_shape([None])
    return image


def load_numpy(path):
    return tf.numpy_function(func=lambda p: np.load(p.decode()), inp=[path], Tout=tf.float32)  # expect: K107


def load_v1(path):
    return tf1.py_func(lambda p: print(p) or p, [path], tf.string)  # expect: K107


files = tf.data.Dataset.list_files("*.png")
images = files.map(load).map(load_numpy).map(load_v1)


def rows(count):
    # Called by from_generator in Python for every element: not traced.
    for index in range(int(count)):
        print(index)
        yield np.random.rand(2)


def expand(count):
    return tf.data.Dataset.from_generator(
        rows, args=(count,), output_signature=tf.TensorSpec([2], tf.float64))


counts = tf.data.Dataset.range(3).flat_map(expand)
