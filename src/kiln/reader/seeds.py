"""Where every random number in the reader comes from: one base seed, folded with stateless ops.

The contract (tested):
  (a) the same seed gives the identical stream in another process;
  (b) every epoch differs, also when Keras re-iterates a one-epoch dataset;
  (c) different elements get different seeds;
  (d) ``seed=None`` draws a fresh base seed per `load` call and says which,
      once per call, as a warning (visible without any logging set up), so a
      run can be reproduced.
Pass k of a seed is the same whether it comes from iterating the dataset k
times (Keras epochs) or from ``repeat=k``.

An element's seed is ``fold_in(fold_in(fold_in(base, epoch_key), pipeline),
position)`` with `tf.random.fold_in` (stateless, so it is the same on any
tf.data thread); `position` counts the elements of this pass in shuffled
order. ``epoch_key`` is drawn once per pass over the data by
``tf.data.Dataset.random(seed, rerandomize_each_iteration=True)``: its
sequence of per-pass values is fixed by the seed, and iterator checkpoints
save its position. Shuffle orders use `Dataset.shuffle` with integer seeds
derived here and ``reshuffle_each_iteration=True`` (also a seeded sequence).

TensorFlow mixes the global seed (`tf.random.set_seed`), when one is set,
into `Dataset.shuffle` and `Dataset.random`: streams are equal across
processes that set the same global seed or none.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import TYPE_CHECKING

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when seeds are drawn as tensors
    tf = LazyModule("tensorflow")

logger = logging.getLogger(__name__)

_INT31 = 2**31


def resolve(seed: int | None, *, matters: bool = True) -> int:
    """The base seed: `seed` itself, or a fresh random one when None.

    `matters`: whether the stream depends on the seed (a shuffle or random
    augmentation); a drawn seed that changes nothing is not reported.

    A drawn seed is logged as a WARNING: Python prints warnings to stderr
    even where logging was never configured, so whoever runs the training
    sees the seed that reproduces the run. (Not `warnings.warn`: it shows a
    message once per place in the code, not once per call.)
    """
    if seed is None:
        seed = secrets.randbits(63)
        if not matters:
            return seed
        logger.warning(
            "kiln.reader: seed=None, drew seed %d (pass seed=%d to reproduce this stream)",
            seed,
            seed,
        )
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
    return seed


def derive(seed: int, purpose: str) -> int:
    """A 63-bit integer seed for one purpose (file order, record order, epoch keys).

    A hash, not Python's `hash()`, so it is the same in every process.
    """
    digest = hashlib.sha256(f"kiln.reader/{purpose}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def base_pair(seed: int) -> tf.Tensor:
    """The shape-[2] int32 root of all element seeds."""
    value = derive(seed, "elements")
    return tf.constant([value % _INT31, (value >> 31) % _INT31], tf.int32)


def pass_words(seed: int, pipeline: int) -> tf.data.Dataset:
    """An endless dataset repeating one int32 word, drawn anew on each pass.

    The word is the first half of ``fold_in(pass_seed, anything)``, where
    ``pass_seed = fold_in(fold_in(base_pair(seed), epoch_key), pipeline)``:
    computed once per pass instead of once per element.
    """
    base = base_pair(seed)

    def word_of(key):
        pass_seed = tf.random.fold_in(
            tf.random.fold_in(base, tf.cast(key % _INT31, tf.int32)),
            tf.constant(pipeline, tf.int32),
        )
        return tf.random.fold_in(pass_seed, tf.constant(0, tf.int32))[0]

    keys = tf.data.Dataset.random(seed=derive(seed, "epochs"), rerandomize_each_iteration=True)
    return keys.take(1).flat_map(lambda key: tf.data.Dataset.from_tensors(word_of(key)).repeat())


def element_seed(word: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """Seed(s) of the element(s) at `position` of a pass: ``fold_in(pass_seed, position)``.

    Works on scalars (one ``[2]`` seed) and on vectors (``[n, 2]`` seeds),
    because `tf.random.fold_in` puts the folded-in value in the second half.
    """
    return tf.stack([word, tf.cast(position, tf.int32)], axis=-1)


def batch_seed(element_seeds: tf.Tensor) -> tf.Tensor:
    """One seed per batch (for mixup/cutmix), from its first element's seed.

    Derived from data the batch carries, so the tf.data path and a model-side
    layer fed the same batch agree.
    """
    return tf.random.fold_in(element_seeds[0], tf.constant(-1, tf.int32))
