"""A training script that also uses pandas and a process pool."""

import multiprocessing

import pandas as pd
import tensorflow as tf


def label_of(name):
    print(name)  # pandas runs this in Python per row: fine
    return name.split("/")[0]


def load_manifest(path):
    frame = pd.read_csv(path)
    frame["label"] = frame["path"].map(label_of)
    return frame


def decode(path):
    print("decode")  # expect: K103
    return tf.io.decode_png(tf.io.read_file(path))


def augment(image):
    print("augment")  # expect: K103
    return image


def make_dataset(paths):
    return tf.data.Dataset.from_tensor_slices(paths)


def build(paths, reader):
    with multiprocessing.Pool(2) as workers:
        sizes = workers.map(len, paths)
    train_ds = reader(paths).map(decode)  # named like a dataset: traced
    images = make_dataset(paths).map(augment)  # built by a function named like one: traced
    labels = reader(paths).map(label_of)  # nothing says tf.data here: not traced
    return train_ds, images, labels, sizes
