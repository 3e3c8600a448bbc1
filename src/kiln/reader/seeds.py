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

An element's seed is a function of (seed, pass, the record's key) only: the
pass's 64-bit word, drawn from ``fold_in(fold_in(base, epoch_key[0]),
epoch_key[1])`` (`tf.random.fold_in` and the draw are stateless, so the same
on any tf.data thread), mixed with a 62-bit fingerprint of the key. Not of
the element's position in the stream nor of the input pipeline reading it:
a record gets the same augmentation in pass k however the files are shared
out (input pipelines, tf.data service workers handed files at run time), so
any worker can augment any record.
``epoch_key``, two 32-bit values, is drawn once per pass over the data by
``tf.data.Dataset.random(seed, rerandomize_each_iteration=True)``: its
sequence of per-pass values is fixed by the seed, and iterator checkpoints
save its position. A pass's identity thus has 64 bits: two passes of a seed
are the same with a chance of about ``passes**2 / 2**65``.

The pass's file and record orders are functions of (seed, epoch_key) too
(`pass_shuffle_seed`): each pass is built anew from its key, with shuffles
that never reshuffle, so no shuffle state crosses a pass boundary and an
iterator checkpoint restores every later pass exactly. (Until version 2 the
orders came from `Dataset.shuffle(reshuffle_each_iteration=True)` under a
`repeat`; TF 2.21 restored a later pass than the one being read at a
checkpoint in another order, depending on how far tf.data's buffers had
read ahead.) Under tf.data service dynamic sharding, whose pass must
start at the file list, the passes are `repeat` rounds with reshuffling
shuffles: the order there is the dispatcher's anyway, and each record's
augmentation is the same as in the local stream.

`STREAM_VERSION` names this derivation (and the reader's record order): it
changes whenever the stream that a seed gives changes. Version 2: element
seeds from the record's key. Version 3: orders from (seed, pass). Version 4:
mixup and cutmix draw their ``lam ~ Beta(alpha, alpha)`` in log space (two
Gamma(alpha) draws underflowed float32 for small alpha, giving exactly 0.5):
every stream with mixup or cutmix changes, the others stay as in version 3.
Version 5: the box of an object that a crop (or cutmix's rectangle) cuts is
tightened to its moved instance mask's pixels (`kiln.reader.targets.tightened`),
and each of several input pipelines reads a contiguous range of records
(`kiln.reader.dataset._Share`): streams of datasets with instance masks whose
crops cut objects change, and those of several pipelines; a single
pipeline's stream otherwise stays as in version 4. Version 6: cutmix judges
whether an object still shows by its instance mask, not its box, on a
dataset with instance masks (as random_erasing's ``erase_targets`` does):
streams with cutmix on such datasets change, the others stay as in version 5.
Version 7: mixup and cutmix never pair an image with itself (`kiln.reader.mixing._partners`:
a seeded order of the batch, each paired with the one a seeded offset after it), and leave a
batch of one alone: every stream with mixup or cutmix changes, the others stay as in version 6.
Version 8: a pass's identity is two draws of ``Dataset.random`` (64 bits), used whole by its
word and its shuffle seeds: until version 7 it was one draw taken mod 2**31, so passes repeated
(seed 1's passes 6250 and 117780 were equal; some two of 100,000 passes were equal with a
chance of 0.9). Every seeded stream changes: orders and augmentation.

TensorFlow mixes the global seed (`tf.random.set_seed`), when one is set,
into `Dataset.random` (so into every pass's key and orders) and
`Dataset.shuffle`: streams are equal across processes that set the same
global seed or none.
"""

from __future__ import annotations

import hashlib
import logging
import numbers
import secrets
from typing import TYPE_CHECKING

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when seeds are drawn as tensors
    tf = LazyModule("tensorflow")

logger = logging.getLogger(__name__)

_INT31 = 2**31

# Version of the seeded stream (order and augmentation) a seed gives: see the
# module docstring; the golden stream test pins the current one.
STREAM_VERSION = 8


def resolve(
    seed: int | numbers.Integral | None,
    *,
    matters: bool = True,
    pipeline: tuple[int, int] | None = None,
) -> int:
    """The base seed: `seed` as a Python int, or a fresh random one when None.

    Any integer is a seed: an int or a NumPy integer (``np.int64(3)`` is
    seed 3), not a bool.

    `matters`: whether the stream depends on the seed (a shuffle or random
    augmentation); a drawn seed that changes nothing is not reported.
    `pipeline`: ``(index, count)`` of this input pipeline among several (an
    `input_context`): each pipeline's call draws its own seed, so no one
    seed reproduces the run, and the warning says so.

    A drawn seed is logged as a WARNING: Python prints warnings to stderr
    even where logging was never configured, so whoever runs the training
    sees the seed that reproduces the run. (Not `warnings.warn`: it shows a
    message once per place in the code, not once per call.)
    """
    if seed is None:
        seed = secrets.randbits(63)
        if not matters:
            return seed
        if pipeline is not None:
            logger.warning(
                "kiln.reader: seed=None, drew seed %d for input pipeline %d of %d: every "
                "pipeline draws its own, so no one seed reproduces this run (pass the same "
                "seed to every pipeline's load)",
                seed,
                *pipeline,
            )
            return seed
        logger.warning(
            "kiln.reader: seed=None, drew seed %d (pass seed=%d to reproduce this stream)",
            seed,
            seed,
        )
        return seed
    # numbers.Integral: int and NumPy's integers (which are not ints).
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"seed must be an int (or NumPy integer) or None, got {type(seed).__name__} {seed!r}"
        )
    return int(seed)


def derive(seed: int, purpose: str) -> int:
    """A 63-bit integer seed for one purpose (file order, record order, epoch keys).

    A hash, not Python's `hash()`, so it is the same in every process.
    """
    digest = hashlib.sha256(f"kiln.reader/{purpose}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def epoch_keys(seed: int) -> tf.data.Dataset:
    """One shape-[2] int64 key per iteration: the pass's identity, a new one each time.

    The first two elements of ``Dataset.random(rerandomize_each_iteration=True)``
    (each below 2**32, so 64 bits in all: with one element, 32 bits, some
    two of 2**16 passes would likely be equal): iterating it again (the next
    Keras epoch, or the next round of a `repeat` around it) draws the next
    key of a sequence the seed fixes, and iterator checkpoints save its
    position.

    It is read through ``Dataset.range(1).flat_map`` (the same key as
    the random dataset alone), because tf.data service's ``distributed_epoch``
    splits a pipeline by its first source and cannot split
    ``Dataset.random``: it gave every worker the whole pass (each record
    once per worker, silently). ``range(1)`` is one split: one worker reads
    the pass, and the others, given none, fail the pass's cardinality
    assertion (docs/reader.md). Not a zip with ``range(1)``: an iterator
    checkpoint of a zip restores another key (TF 2.21).
    """
    first = _first_two(_keys(seed))
    return tf.data.Dataset.range(1).flat_map(lambda _: first)


def _keys(seed: int) -> tf.data.Dataset:
    """The endless random sequence whose first two elements are each
    iteration's epoch key. No split provider: under tf.data service every
    worker reads it whole."""
    return tf.data.Dataset.random(seed=derive(seed, "epochs"), rerandomize_each_iteration=True)


def _first_two(keys: tf.data.Dataset) -> tf.data.Dataset:
    """The epoch key: the first two elements of `keys`, as one ``[2]`` int64."""
    return keys.take(2).batch(2, drop_remainder=True)


def _pair(value: int) -> tf.Tensor:
    return tf.constant([value % _INT31, (value >> 31) % _INT31], tf.int32)


def _folded(pair: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """``fold_in(fold_in(pair, key[0]), key[1])``: a shape-[2] int64 seed of
    (pair, both 32-bit halves of the epoch key), so of the pass's whole
    64-bit identity (until version 7 the key was folded in mod 2**31: at
    most 2**31 distinct passes, and a seed's passes 6250 and 117780 were the
    same)."""
    return tf.random.fold_in(tf.random.fold_in(pair, key[0]), key[1])


def base_pair(seed: int) -> tf.Tensor:
    """The shape-[2] int32 root of all element seeds."""
    return _pair(derive(seed, "elements"))


def pass_word(seed: int, key: tf.Tensor) -> tf.Tensor:
    """The shape-[2] int32 word of the pass with epoch `key`: 64 bits drawn
    statelessly from ``fold_in(fold_in(base_pair(seed), key[0]), key[1])``."""
    return tf.random.stateless_uniform(
        [2], _folded(base_pair(seed), key), minval=None, maxval=None, dtype=tf.int32
    )


def pass_shuffle_seed(seed: int, key: tf.Tensor, purpose: str) -> tf.Tensor:
    """The int64 seed of one shuffle (``"files"``, ``"records"``) in the pass of `key`.

    An int64 drawn statelessly from ``fold_in(fold_in(pair(derive(seed,
    purpose)), key[0]), key[1])``, as a non-negative 62-bit integer: a pure
    function of (seed, pass), for a ``Dataset.shuffle`` with
    ``reshuffle_each_iteration=False`` made anew for each pass.
    """
    drawn = tf.random.stateless_uniform(
        [], _folded(_pair(derive(seed, purpose)), key), minval=None, maxval=None, dtype=tf.int64
    )
    return tf.bitwise.bitwise_and(drawn, tf.constant(2**62 - 1, tf.int64))


def pass_words(seed: int) -> tf.data.Dataset:
    """An endless dataset repeating the pass's word, drawn anew on each iteration.

    For the tf.data service (dynamic sharding) read, whose passes are
    `repeat` rounds; the other reads take `pass_word` of each epoch key.
    """
    # Not `epoch_keys`: with dynamic sharding the file list is split among
    # the workers, and every worker needs the word (range(1) would be split too).
    return _first_two(_keys(seed)).flat_map(
        lambda key: tf.data.Dataset.from_tensors(pass_word(seed, key)).repeat()
    )


def element_seed(word: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """Seed(s) of the record(s) with `key` in the pass of `word`.

    ``[word[0] ^ high, word[1] ^ low]`` with `high` and `low` the two 31-bit
    halves of the key's 62-bit FarmHash fingerprint
    (`tf.strings.to_hash_bucket_fast`: the same on every platform and TF
    version): distinct keys get distinct seeds (a collision is as likely as
    in a 62-bit hash), and every pass, whose word has 64 bits, another set.
    Works on scalars (a ``[2]`` word, one ``[2]`` seed) and on vectors
    (``[n, 2]`` words, ``[n, 2]`` seeds), as a batch of raw records is
    seeded at once.
    """
    fingerprint = tf.strings.to_hash_bucket_fast(key, 2**62)
    low = tf.cast(fingerprint % _INT31, tf.int32)
    high = tf.cast(fingerprint // _INT31, tf.int32)
    return tf.bitwise.bitwise_xor(word, tf.stack([high, low], axis=-1))


def batch_seed(element_seeds: tf.Tensor) -> tf.Tensor:
    """One seed per batch (for mixup/cutmix), from its first element's seed.

    Derived from data the batch carries, so the tf.data path and a model-side
    layer fed the same batch agree.
    """
    return tf.random.fold_in(element_seeds[0], tf.constant(-1, tf.int32))
