"""Clocks, unique ids and OS entropy in traced functions: taken once, at trace time."""

import datetime
import os
import secrets
import time
import uuid
from datetime import datetime as dt
from time import perf_counter as clock

import tensorflow as tf


def stamp(image, label):
    taken = time.time()  # expect: K110
    started = clock()  # expect: K110
    day = datetime.date.today().isoformat()  # expect: K110
    now = dt.now()  # expect: K110
    name = uuid.uuid4().hex  # expect: K110
    salt = os.urandom(4) + secrets.token_bytes(4)  # expect: K110
    token = secrets.randbelow(10)  # expect: K110
    return image, label, taken + started, day, now, name, salt, token


dataset = tf.data.TFRecordDataset(["a.tfrecord"]).map(stamp)


def per_element_time(image):
    # Fine: tf.timestamp() is an op, it runs for every element.
    return image, tf.timestamp()


dataset = dataset.map(per_element_time)


def built_once(files):
    # Fine: runs once, in Python, while the pipeline is built.
    run_id = uuid.uuid4().hex
    started = time.time()
    return tf.data.Dataset.from_tensor_slices(files), run_id, started
