"""Silencing single lines."""

import random

import tensorflow as tf


def augment(image):
    print("tracing augment")  # kiln: noqa
    angle = random.random()  # kiln: noqa[K101]
    other = random.random()  # kiln: noqa[K103]  expect: K101
    both = print(random.random())  # kiln: NOQA[K101, K103]
    message = "# kiln: noqa inside a string does not count"; print(message)  # expect: K103
    # A statement over several lines: the comment on its first line covers them all.
    size = tf.stack(  # kiln: noqa[K101]
        [random.randint(1, 3), 4])
    other_size = tf.stack(  # kiln: noqa[K103]
        [random.randint(1, 3), 4])  # expect: K101
    if angle > 0.5:  # kiln: noqa
        print("a header's comment does not cover the body")  # expect: K103
    spaced = random.random() + print()  # kiln: noqa[K101 K103]
    return image + angle + other + both + size + other_size + spaced


ds = tf.data.Dataset.range(3).map(augment)
