"""kiln augmentation ops: the reader's Dataset.map traces every registered op and its inference form."""

import random

import numpy as np
import tensorflow as tf

import kiln.reader as kr
from kiln.reader import register_augmentation


@register_augmentation("random_blur", geometric=False)
def random_blur(image, seed, *, max_sigma: float = 1.0):
    sigma = random.uniform(0.1, max_sigma)  # expect: K101
    print("blurring", sigma)  # expect: K103
    if tf.random.stateless_uniform([], seed) > 0.5:  # expect: K104
        image = image * 0.9
    return image + np.random.normal()  # expect: K101


def _centre(image, *, size: int = 8):
    print("centre crop")  # expect: K103
    return tf.image.resize_with_crop_or_pad(image, size, size)


@register_augmentation("random_window", inference=_centre)
def random_window(image, seed, *, size: int = 8, probability: float = 0.5):
    if probability > 0.5:  # configuration: a keyword-only parameter
        image = image * 1.0
    if image.shape[0] > size:  # a static shape
        image = tf.image.stateless_random_crop(image, [size, size, 3], seed)
    return image


@kr.register_augmentation("random_scale", geometric=False)
def random_scale(image, seed, *, factor: float = 1.0):
    return image * float(tf.reduce_mean(image)) * factor  # expect: K102


@register_augmentation("random_invert", geometric=False)
def random_invert(image, seed, *, probability: float = 0.5):
    invert = tf.random.stateless_uniform([], seed) < probability
    return tf.where(invert, 1.0 - image, image)


def setup_only(config):
    # Not an op: runs once in Python, where print and random are fine.
    print("choosing", random.choice(config))
