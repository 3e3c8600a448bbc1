"""Silencing single lines."""

import random

import tensorflow as tf


def augment(image):
    print("tracing augment")  # kiln: noqa
    angle = random.random()  # kiln: noqa[K101]
    other = random.random()  # kiln: noqa[K103]  expect: K101
    both = print(random.random())  # kiln: NOQA[K101, K103]
    message = "# kiln: noqa inside a string does not count"; print(message)  # expect: K103
    return image + angle + other + both


ds = tf.data.Dataset.range(3).map(augment)
