"""Correct online augmentation: TF ops with per-element stateless seeds. Must be clean."""

import tensorflow as tf

TARGET = 224


class Augmentation:
    def __init__(self, seed, flip=True, max_delta=0.1):
        self.seed = seed
        self.flip = flip
        self.max_delta = max_delta

    def __call__(self, index, image, label):
        seeds = tf.random.experimental.stateless_split(
            tf.stack([tf.cast(index, tf.int64), tf.constant(self.seed, tf.int64)]), num=3)
        if self.flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=seeds[0])
        image = tf.image.stateless_random_brightness(image, self.max_delta, seed=seeds[1])
        angle = tf.random.stateless_uniform([], seed=seeds[2], minval=-0.2, maxval=0.2)
        image = tf.where(angle > 0, image, tf.image.flip_up_down(image))
        image = tf.cond(tf.reduce_mean(image) > 0.5, lambda: image * 0.9, lambda: image)
        if image.shape[-1] == 1:
            image = tf.image.grayscale_to_rgb(image)
        tf.debugging.assert_non_negative(label)
        tf.print("augmented", index)
        return image, label


def parse(record):
    features = tf.io.parse_single_example(
        record, {"image": tf.io.FixedLenFeature([], tf.string),
                 "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.io.decode_png(features["image"], channels=3)
    image = tf.image.convert_image_dtype(image, tf.float32)
    image.set_shape([TARGET, TARGET, 3])
    return image, features["label"]


def dataset(files, seed, training=True):
    ds = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
        ds = ds.enumerate().map(
            lambda index, element: Augmentation(seed)(index, *element),
            num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(32).prefetch(tf.data.AUTOTUNE)
