"""Methods passed to map: self.method, instance.method, Class.method, __call__, bases."""

import functools
import random

import tensorflow as tf


class BaseAugment:
    def jitter(self, image):
        print("base jitter")  # expect: K103
        return image


class Pipeline(BaseAugment):
    def __init__(self, files, flip=True):
        self.files = files
        self.flip = flip
        self.augment_fn = functools.partial(self.crop, size=32)

    def build(self):
        ds = tf.data.TFRecordDataset(self.files)
        ds = ds.map(self.parse)
        ds = ds.map(self.augment)
        ds = ds.map(self.jitter)
        ds = ds.map(self.augment_fn)
        ds = ds.map(Pipeline.normalize)
        ds = ds.map(self.rescale)
        return ds

    def parse(self, record):
        return tf.io.decode_png(record)

    def augment(self, image):
        if self.flip:  # configuration on self: fine
            image = tf.image.flip_left_right(image)
        image = self._maybe_darken(image)
        return image

    def _maybe_darken(self, image):
        if tf.reduce_mean(image) > 0.8:  # expect: K104
            image = image * 0.5
        return image

    def crop(self, image, size):
        if size > 16:
            image = image[:size, :size]
        return image + random.random()  # expect: K101

    @staticmethod
    def normalize(image):
        return image.numpy() / 255  # expect: K102

    @classmethod
    def rescale(cls, image):
        return tf.cond(image[0] > 1, lambda: image / 2, lambda: image)

    @tf.function
    def step(self, batch):
        print(batch)  # expect: K103
        return batch


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        if self.size:  # configuration: fine
            image = tf.image.resize(image, [self.size, self.size])
        print("resize")  # expect: K103
        return image


class Blur:
    def apply(self, image):
        return image + random.random()  # expect: K101


resize = Resize(64)
blur = Blur()
images = tf.data.Dataset.from_tensor_slices([[0.0]]).map(resize).map(blur.apply)
