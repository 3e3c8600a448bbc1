"""Batch-level augmentation ops that mix pairs of images and their labels (mixup, cutmix).

A batch op is ``fn(images, labels, seed, **params) -> (images, labels)`` on a
float32 ``[batch, height, width, channels]`` batch and float32 one-hot (or
already mixed) ``[batch, num_classes]`` labels, with one shape-[2] int32 seed
per batch. Each image is mixed with the image at a seeded permutation of the
batch; the mixing weight comes from Beta(alpha, alpha), drawn as a ratio of
two stateless Gamma samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from kiln.lazy_import import LazyModule
from kiln.reader.ops import builtin_op
from kiln.registry import Probability

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when an op runs: validating a list of ops needs only the declarations
    tf = LazyModule("tensorflow")


def _beta(seed: tf.Tensor, alpha: float) -> tf.Tensor:
    seeds = tf.random.split(seed, 2)
    first = tf.random.stateless_gamma([], seed=seeds[0], alpha=alpha)
    second = tf.random.stateless_gamma([], seed=seeds[1], alpha=alpha)
    return first / (first + second)


def _partners(seed: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    return tf.argsort(tf.random.stateless_uniform([batch], seed=seed))


def _applies(seed: tf.Tensor, probability: float) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed=seed) < probability


@builtin_op("mixup", kind="batch")
def mixup(
    images,
    labels,
    seed,
    *,
    alpha: Annotated[float, Field(ge=1e-6)] = 0.2,
    probability: Probability = 1.0,
):
    """Blends each image with a partner: ``lam * x + (1 - lam) * x[partner]``,
    labels alike, one ``lam ~ Beta(alpha, alpha)`` per batch (Zhang et al. 2018).
    With `probability` per batch; otherwise the batch is unchanged."""
    seeds = tf.random.split(seed, 3)
    lam = tf.where(_applies(seeds[2], probability), _beta(seeds[0], alpha), 1.0)
    partners = _partners(seeds[1], tf.shape(images)[0])
    images = lam * images + (1.0 - lam) * tf.gather(images, partners)
    labels = lam * labels + (1.0 - lam) * tf.gather(labels, partners)
    return images, labels


@builtin_op("cutmix", kind="batch")
def cutmix(
    images,
    labels,
    seed,
    *,
    alpha: Annotated[float, Field(ge=1e-6)] = 1.0,
    probability: Probability = 1.0,
):
    """Pastes a rectangle of each image's partner into it (Yun et al. 2019).

    The rectangle has area ``1 - lam`` of the image (``lam ~ Beta(alpha,
    alpha)``, one per batch), a uniform centre, and is clipped to the image;
    labels are mixed by the area actually pasted. With `probability` per
    batch; otherwise the batch is unchanged.
    """
    seeds = tf.random.split(seed, 5)
    shape = tf.shape(images)
    height, width = tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
    lam = _beta(seeds[0], alpha)
    cut = tf.sqrt(1.0 - lam)
    center_y = tf.random.stateless_uniform([], seed=seeds[1]) * height
    center_x = tf.random.stateless_uniform([], seed=seeds[2]) * width
    top = tf.clip_by_value(tf.round(center_y - cut * height / 2), 0.0, height)
    bottom = tf.clip_by_value(tf.round(center_y + cut * height / 2), 0.0, height)
    left = tf.clip_by_value(tf.round(center_x - cut * width / 2), 0.0, width)
    right = tf.clip_by_value(tf.round(center_x + cut * width / 2), 0.0, width)
    rows = tf.range(height)[:, None]
    cols = tf.range(width)[None, :]
    inside = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
    inside &= _applies(seeds[4], probability)
    partners = _partners(seeds[3], shape[0])
    images = tf.where(inside[None, :, :, None], tf.gather(images, partners), images)
    pasted = tf.reduce_sum(tf.cast(inside, tf.float32)) / (height * width)
    labels = (1.0 - pasted) * labels + pasted * tf.gather(labels, partners)
    return images, labels
