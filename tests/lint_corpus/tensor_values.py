"""Asking a symbolic tensor for a Python value, printing it, NumPy/OpenCV on it."""

import logging
import os

import cv2
import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras.preprocessing.image import random_rotation


def parse(serialized):
    features = tf.io.parse_single_example(serialized, {"label": tf.io.FixedLenFeature([], tf.int64)})
    label = features["label"]
    label_value = label.numpy()  # expect: K102
    count = int(label)  # expect: K102
    ratio = float(tf.shape(serialized)[0])  # expect: K102
    print("label", label_value, count, ratio)  # expect: K103
    tf.print("label", label)
    width = int(serialized.shape[0])  # static: fine
    return label, width


def resize(image):
    small = cv2.resize(image, (32, 32))  # expect: K108
    mean = np.mean(image)  # expect: K108
    kernel = np.ones((3, 3), np.float32) / 9  # a constant made at trace time: fine
    image = tf.cast(image, np.float32)  # NumPy dtype, not a NumPy call on the tensor
    return small, mean, kernel, image


ds = tf.data.Dataset.list_files("*.tfrecord").map(parse)
ds = ds.map(resize)


def keras_utilities(image, label):
    # Keras's legacy image augmentations and array helpers are NumPy/SciPy code.
    image = tf.keras.preprocessing.image.random_zoom(image, (0.9, 1.1))  # expect: K108
    image = random_rotation(image, 30)  # expect: K108
    array = keras.utils.img_to_array(image)  # expect: K108
    image = tf.keras.preprocessing.image.smart_resize(image, (32, 32))  # TF ops: fine
    label = keras.utils.to_categorical(label, 10)  # handles tensors: fine
    return image, label, array


ds = ds.map(keras_utilities)


ROOT = "/data/images"


def load_by_name(name, label):
    path = f"{ROOT}/{name}.jpg"  # expect: K102
    other = "%s/%s.png" % (ROOT, name)  # expect: K102
    joined = os.path.join(ROOT, name)  # expect: K102
    text = name.decode("utf-8")  # expect: K102
    shown = str(label)  # expect: K102
    template = "{}/{}".format(ROOT, name)  # expect: K102
    good = tf.strings.join([ROOT, "/", name, ".jpg"])  # TF ops: fine
    shape_note = f"{ROOT} {name.shape}"  # a static property: fine
    logging.info(f"tracing with {name}")  # a log line: not this code's business
    error_message = f"bad label {label}"  # a message for a person: fine
    if label.shape.rank != 0:
        raise ValueError(f"label {label} must be a scalar")  # fine
    return tf.io.read_file(path), other, joined, text, shown, template, good, shape_note


ds = ds.map(load_by_name)
