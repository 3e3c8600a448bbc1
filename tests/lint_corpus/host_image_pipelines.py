"""Albumentations, imgaug and torchvision transforms called on tensors in a map."""

import albumentations as A
import imgaug.augmenters as iaa
import numpy as np
import tensorflow as tf
from torchvision import transforms as T

TRANSFORMS = A.Compose([A.HorizontalFlip(p=0.5), A.RandomBrightnessContrast(p=0.2)])
SEQUENCE = iaa.Sequential([iaa.Fliplr(0.5)])


def augment(image, label):
    image = TRANSFORMS(image=image)["image"]  # expect: K108
    image = SEQUENCE(image=image)  # expect: K108
    image = A.Rotate(limit=30)(image=image)["image"]  # expect: K108
    return image, label


class Pipeline:
    def __init__(self):
        self.flip = T.RandomHorizontalFlip()

    def __call__(self, image):
        return self.flip(image)  # expect: K108


dataset = tf.data.TFRecordDataset(["a.tfrecord"]).map(augment).map(Pipeline())


def offline(array: np.ndarray) -> np.ndarray:
    # Fine: not traced, a NumPy array in plain Python.
    return TRANSFORMS(image=array)["image"]
