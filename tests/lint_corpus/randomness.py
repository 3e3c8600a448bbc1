"""Python and NumPy randomness in traced functions, under every import spelling."""

import random
import random as rnd
from random import random as draw, uniform

import numpy as np
import numpy.random as npr
from numpy import random as nrand
from numpy.random import default_rng

import tensorflow as tf

GLOBAL_RNG = np.random.default_rng(0)
PY_RNG = random.Random(1)


def augment(image, label):
    if random.random() > 0.5:  # expect: K101
        image = tf.image.flip_left_right(image)
    angle = np.random.uniform(-0.2, 0.2)  # expect: K101
    scale = npr.rand()  # expect: K101
    shift = nrand.randint(0, 4)  # expect: K101
    gamma = draw() + uniform(0.9, 1.1)  # expect: K101
    choice = rnd.choice([1, 2, 3])  # expect: K101
    noise = default_rng(7).normal()  # expect: K101
    jitter = GLOBAL_RNG.uniform() + PY_RNG.random()  # expect: K101
    image = tf.image.adjust_gamma(image, gamma) * scale + angle + shift + choice + noise + jitter
    return image, label


dataset = tf.data.TFRecordDataset(["a.tfrecord"]).map(augment, num_parallel_calls=tf.data.AUTOTUNE)


class Augmenter:
    def __init__(self):
        self.rng = np.random.default_rng(3)
        self.probability = 0.5

    def __call__(self, image):
        if self.rng.uniform() < self.probability:  # expect: K101
            image = tf.image.flip_up_down(image)
        return image


dataset = dataset.map(Augmenter())


def seeded_outside_map(files):
    # Fine: runs once, in Python, while the pipeline is built.
    random.shuffle(files)
    seed = np.random.randint(0, 2**31)
    return tf.data.Dataset.from_tensor_slices(files).shuffle(1000, seed=seed)
