"""The seed contract: (a) same seed, same stream in another process; (b) every epoch differs;
(c) every element differs; (d) seed=None is fresh per run and shown (a warning on stderr, once
per call, without any logging set up) so it can be reproduced."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader import seeds as seeding
from reader.builds import keys_of, split_keys
from reader.fresh_process import fresh_environment, run_python

pytestmark = pytest.mark.usefixtures("no_global_seed")

# Two Keras-style epochs (two iterations of a one-pass dataset) and one
# repeat=2 dataset, each element as (key, sha256 of its float32 pixels).
STREAM = """
import hashlib, json, sys
import kiln.reader

def stream(dataset):
    return [[key.decode(), hashlib.sha256(image.tobytes()).hexdigest()]
            for batch in dataset
            for key, image in zip(batch["key"].numpy(), batch["image"].numpy())]

path = sys.argv[1]
one_pass = kiln.reader.load(path, batch_size=8, seed=123, as_supervised=False)
repeated = kiln.reader.load(path, batch_size=8, seed=123, repeat=2, as_supervised=False)
print(json.dumps({"epochs": [stream(one_pass), stream(one_pass)], "repeated": stream(repeated)}))
"""


def stream_here(path: str) -> dict:
    namespace = {}
    # The fresh process's own code (STREAM is this file's), run here too.
    exec(STREAM.split("path = sys.argv[1]")[0], namespace)  # noqa: S102
    stream = namespace["stream"]
    one_pass = kiln.reader.load(path, batch_size=8, seed=123, as_supervised=False)
    repeated = kiln.reader.load(path, batch_size=8, seed=123, repeat=2, as_supervised=False)
    return {"epochs": [stream(one_pass), stream(one_pass)], "repeated": stream(repeated)}


def test_a_same_seed_same_stream_in_another_process(jpeg_dataset):
    there = json.loads(run_python(STREAM, jpeg_dataset.dataset_dir).strip().splitlines()[-1])
    here = stream_here(jpeg_dataset.dataset_dir)
    assert there == here
    # A fresh dataset object in the same process gives the same stream too.
    assert stream_here(jpeg_dataset.dataset_dir) == here


def test_b_every_epoch_differs(jpeg_dataset):
    streams = stream_here(jpeg_dataset.dataset_dir)
    total = jpeg_dataset.info.splits["train"].num_examples
    first, second = streams["epochs"]
    assert len(dict(first)) == len(dict(second)) == total
    # Different order, and every image augmented differently.
    assert [key for key, _ in first] != [key for key, _ in second]
    assert all(dict(first)[key] != digest for key, digest in second)
    # Pass k is the same whether it comes from iterating k times (Keras
    # epochs) or from repeat=k: both are a function of the seed and k.
    assert streams["repeated"] == first + second


def test_b_passes_far_apart_differ_too(golden_dataset):
    # Passes 6250 and 117780 of seed 1: their epoch keys agree mod 2**31,
    # all that version 7 used of them, so they gave the same orders and
    # augmentation (on any dataset). Each read starts at its pass by `skip=`.
    path = golden_dataset.dataset_dir
    total = golden_dataset.info.splits["train"].num_examples

    def pass_number(number):
        dataset = kiln.reader.load(
            path, seed=1, repeat=True, as_supervised=False, skip=(number - 1) * total
        )
        return [
            (element["key"].numpy().decode(), hashlib.sha256(element["image"].numpy()).hexdigest())
            for element in dataset.take(total)
        ]

    early, late = pass_number(6250), pass_number(117780)
    stored = sorted(key.decode() for key in split_keys(golden_dataset, "train"))
    assert sorted(dict(early)) == sorted(dict(late)) == stored
    assert [key for key, _ in early] != [key for key, _ in late]
    assert all(dict(early)[key] != digest for key, digest in late)


def test_b_the_first_120000_passes_have_distinct_words_and_orders():
    # Every pass's identity, as the reader derives it from its epoch key:
    # the word its element seeds are mixed from and its shuffles' seeds.
    # (Version 7 had at most 2**31 identities: passes 6250 and 117780 were one.)
    count = 120_000
    batches = seeding.epoch_keys(1).repeat().take(count).batch(8192)
    keys = tf.constant(np.concatenate([batch.numpy() for batch in batches]))

    @tf.function
    def identities(keys):
        return tf.map_fn(
            lambda key: (
                seeding.pass_word(1, key),
                seeding.pass_shuffle_seed(1, key, "files"),
                seeding.pass_shuffle_seed(1, key, "records"),
            ),
            keys,
            fn_output_signature=(tf.int32, tf.int64, tf.int64),
            parallel_iterations=64,
        )

    words, files, records = (values.numpy().reshape(count, -1) for values in identities(keys))
    for values in (words, files, records):
        assert len({tuple(row) for row in values.tolist()}) == count


def test_c_every_element_gets_its_own_seed_and_its_own_augmentation(png_dataset):
    dataset, _ = kiln.reader.load_for_model(
        png_dataset.dataset_dir, batch_size=8, seed=6, repeat=3, as_supervised=False
    )
    seeds = np.concatenate([batch["augment_seed"].numpy() for batch in dataset])
    assert len(seeds) == 3 * png_dataset.info.splits["train"].num_examples
    assert len({tuple(seed) for seed in seeds}) == len(seeds)
    # The same stored image in the same pass gets a different brightness
    # delta depending on its position: read the stream unshuffled, with and
    # without the op, and compare the per-element deltas.
    plain = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=64, shuffle=False, seed=6, augment=None
    )
    bright = kiln.reader.load(
        png_dataset.dataset_dir,
        batch_size=64,
        shuffle=False,
        seed=6,
        augment=[{"random_brightness": {"max_delta": 0.3}}],
    )
    a, b = next(iter(plain))[0].numpy(), next(iter(bright))[0].numpy()
    unclipped = (b > 0) & (b < 1)
    deltas = [np.median((b[i] - a[i])[unclipped[i]]) for i in range(len(a))]
    assert len({round(float(d), 5) for d in deltas}) == len(deltas)


def test_d_seed_none_is_fresh_per_run_and_logged(png_dataset, caplog):
    path = png_dataset.dataset_dir

    def digest(dataset):
        return hashlib.sha256(b"".join(image.numpy().tobytes() for image, _ in dataset)).hexdigest()

    with caplog.at_level(logging.WARNING, logger="kiln.reader.seeds"):
        first = kiln.reader.load(path, batch_size=8)
        second = kiln.reader.load(path, batch_size=8)
    drawn = [int(s) for s in re.findall(r"drew seed (\d+)", caplog.text)]
    assert len(drawn) == 2 and drawn[0] != drawn[1]
    assert {record.levelno for record in caplog.records} == {logging.WARNING}
    first_digest = digest(first)
    assert first_digest != digest(second)
    # The logged seed reproduces the run.
    assert digest(kiln.reader.load(path, batch_size=8, seed=drawn[0])) == first_digest
    assert keys_of(
        kiln.reader.load(path, batch_size=8, seed=drawn[1], as_supervised=False)
    ) != keys_of(kiln.reader.load(path, batch_size=8, seed=drawn[0], as_supervised=False))


def test_d_seed_none_under_several_input_pipelines_says_no_seed_reproduces_the_run(
    png_dataset, caplog
):
    """Each pipeline's `load` draws its own seed: the usual "pass seed=N to
    reproduce this stream" would promise what no single seed gives."""
    import tensorflow as tf

    with caplog.at_level(logging.WARNING, logger="kiln.reader.seeds"):
        for index in range(2):
            context = tf.distribute.InputContext(
                num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=2
            )
            kiln.reader.load(png_dataset.dataset_dir, batch_size=8, input_context=context)
    assert re.findall(
        r"drew seed \d+ for input pipeline (\d) of 2: every pipeline draws its "
        r"own, so no one seed reproduces this run",
        caplog.text,
    ) == ["0", "1"]
    assert "to reproduce this stream" not in caplog.text


def test_d_a_drawn_seed_is_shown_without_any_logging_set_up(png_dataset):
    # A training script that never configures logging: the seed must still
    # reach its stderr, once per load call, and only for seed=None and a
    # stream the seed changes (validation reads in order, in the inference
    # form: no seed to report).
    script = (
        "import sys, kiln.reader\n"
        "path = sys.argv[1]\n"
        "kiln.reader.load(path, batch_size=8)\n"
        "kiln.reader.load(path, 'validation', batch_size=8)\n"
        "kiln.reader.load(path, batch_size=8)\n"
        "kiln.reader.load(path, batch_size=8, seed=3)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script, png_dataset.dataset_dir],
        capture_output=True,
        text=True,
        env=fresh_environment(),
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    shown = re.findall(r"seed=None, drew seed (\d+) \(pass seed=(\d+) to", completed.stderr)
    assert len(shown) == 2 and all(drawn == again for drawn, again in shown), completed.stderr


def test_a_numpy_integer_seed_is_that_seed(png_dataset):
    path = png_dataset.dataset_dir

    def stream(seed):
        dataset = kiln.reader.load(path, batch_size=8, seed=seed, as_supervised=False)
        return [(batch["key"].numpy().tolist(), batch["image"].numpy()) for batch in dataset]

    expected = stream(3)
    for seed in (np.int64(3), np.int32(3), np.uint8(3)):
        got = stream(seed)
        assert [keys for keys, _ in got] == [keys for keys, _ in expected]
        for (_, image), (_, wanted) in zip(got, expected, strict=True):
            np.testing.assert_array_equal(image, wanted)
    for seed in (True, np.bool_(True), 3.0, "3"):
        with pytest.raises(TypeError, match="seed must be an int"):
            kiln.reader.load(path, batch_size=8, seed=seed)
