"""Python code that is not traced: none of it may be reported."""

import multiprocessing
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf


def preprocess(path):
    # Plain Python run per item by a process pool: randomness and print are fine.
    print("processing", path)
    if random.random() > 0.5:
        return np.fliplr(np.load(path))
    return np.load(path)


def generate():
    # from_generator runs this in Python for every element: not traced.
    for _ in range(10):
        yield np.random.rand(4).astype(np.float32)


def main(paths):
    with multiprocessing.Pool(4) as pool:
        arrays = pool.map(preprocess, paths)
    executor = ThreadPoolExecutor(2)
    more = list(executor.map(preprocess, paths))
    doubled = list(map(preprocess, paths))
    ds = tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec([4], tf.float32))
    for element in ds.take(2):
        print(element.numpy())
        if element[0] > 0.5:
            print("eager code outside map: fine")
    return arrays, more, doubled
