"""A module that also uses Hugging Face datasets: only clear tf.data maps are traced."""

import random

import datasets
import tensorflow as tf


def tokenize(example):
    # Hugging Face map runs this in Python per example.
    example["noise"] = random.random()
    print(example)
    return example


def augment(image):
    print("traced by tf.data")  # expect: K103
    return image


def build(name):
    dataset = datasets.load_dataset(name)["train"].map(tokenize)
    train = dataset.map(tokenize, batched=False)
    tf_ds = train.to_tf_dataset(columns=["image"]).map(augment, num_parallel_calls=4)
    other = tf.data.Dataset.from_tensor_slices([0.0]).map(augment)
    return tf_ds, other


def resize_keras(image, label):
    print("traced by tf.data too")  # expect: K103
    return tf.image.resize(image, [32, 32]), label


def from_keras(directory):
    return tf.keras.utils.image_dataset_from_directory(directory).map(resize_keras)
