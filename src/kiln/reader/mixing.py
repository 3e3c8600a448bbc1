"""Batch-level augmentation ops that mix pairs of images and their labels (mixup, cutmix).

A batch op is ``fn(images, labels, seed, **params) -> (images, labels)`` on a
float32 ``[batch, height, width, channels]`` batch and float32 one-hot (or
already mixed) ``[batch, num_classes]`` labels, with one shape-[2] int32 seed
per batch. Each image is mixed with a partner: another image of the batch,
never itself (`_partners`), so a batch of one is left as it is. The mixing
weight comes from Beta(alpha, alpha), drawn as a ratio of two stateless Gamma
samples taken in log space (exact for small alpha).

On a dataset with targets an op mixes `BatchTargets` instead of labels
(``with_targets``). Class vectors mix like labels: ``label`` (one-hot) and
multi-label ``labels`` (multi-hot, `BatchTargets.for_mixing`) get the same
weights as the pixels, so a class both images carry keeps weight 1. Per-image
extra columns stay the element's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from kiln.lazy_import import LazyModule
from kiln.reader.ops import builtin_op
from kiln.reader.targets import BatchTargets, tightened, zero_unlabelled
from kiln.registry import Probability

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when an op runs: validating a list of ops needs only the declarations
    tf = LazyModule("tensorflow")


# The smallest normal float32: a Gamma(alpha + 1) draw this small (for
# alpha + 1 >= 1, as likely as never) is taken as it, not as log(0).
_FLOAT32_TINY = 2.0**-126


def _log_gamma(seed: tf.Tensor, alpha: float) -> tf.Tensor:
    """The log of one Gamma(alpha, 1) draw, exact for every ``alpha > 0``.

    ``Gamma(alpha) = Gamma(alpha + 1) * U ** (1 / alpha)`` (Marsaglia and
    Tsang 2000), taken in log space. A Gamma(alpha) draw itself underflows
    float32 for small alpha: `tf.random.stateless_gamma` returns FLT_MIN for
    most draws at alpha 0.01 and for all at 1e-6, and a ratio of two such
    draws is exactly 0.5.
    """
    seeds = tf.random.split(seed, 2)
    boosted = tf.random.stateless_gamma([], seed=seeds[0], alpha=alpha + 1.0)
    # 1 - U lies in (0, 1]: its log is finite.
    uniform = tf.random.stateless_uniform([], seed=seeds[1])
    return tf.math.log(tf.maximum(boosted, _FLOAT32_TINY)) + tf.math.log1p(-uniform) / alpha


def _beta(seed: tf.Tensor, alpha: float) -> tf.Tensor:
    """One Beta(alpha, alpha) draw: ``Ga / (Ga + Gb)`` of two Gamma(alpha)
    draws, as ``sigmoid(log Ga - log Gb)`` so that it holds for small alpha."""
    seeds = tf.random.split(seed, 2)
    return tf.sigmoid(_log_gamma(seeds[0], alpha) - _log_gamma(seeds[1], alpha))


def _partners(seed: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """Each element's partner, never the element itself (for ``batch >= 2``).

    The batch is put in a seeded random order and each element is paired with
    the one ``offset`` places after it in that order (cyclically), ``offset``
    uniform in ``[1, batch - 1]``. A plain random permutation maps some
    element to itself in most batches (always in a batch of one): its pixels
    stayed the same while cutmix doubled every object the rectangle cut. A
    batch of one has no other partner: the ops leave it alone (`_mixes`).
    """
    seeds = tf.random.split(seed, 2)
    order = tf.argsort(tf.random.stateless_uniform([batch], seed=seeds[0]))
    offset = tf.random.stateless_uniform(
        [], seed=seeds[1], minval=1, maxval=tf.maximum(batch, 2), dtype=tf.int32
    )
    place = tf.argsort(order)  # where each element is in `order`
    return tf.gather(order, (place + offset) % batch)


def _mixes(seed: tf.Tensor, probability: float, batch: tf.Tensor) -> tf.Tensor:
    """Whether a batch op mixes this batch: with `probability`, and only when
    the batch has two or more images (one image has no partner)."""
    return _applies(seed, probability) & (batch > 1)


def _applies(seed: tf.Tensor, probability: float) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed=seed) < probability


# The targets that are one weight per class: mixed like the pixels.
_CLASS_VECTORS = ("label", "labels")


def _mix_class_vectors(tensors: dict, partners, own_weight, partner_weight) -> dict:
    """``label`` and ``labels`` of each element: ``own_weight`` of its own plus
    ``partner_weight`` of its partner's (the same expressions as the labels
    of the op without targets, so both round alike)."""
    return {
        name: own_weight * tensors[name] + partner_weight * tf.gather(tensors[name], partners)
        for name in _CLASS_VECTORS
        if name in tensors
    }


def _mixup_weights(images, seed, *, alpha, probability):
    """mixup's draws: the weight of each image's own pixels and its partners."""
    seeds = tf.random.split(seed, 3)
    batch = tf.shape(images)[0]
    lam = tf.where(_mixes(seeds[2], probability, batch), _beta(seeds[0], alpha), 1.0)
    return lam, _partners(seeds[1], batch)


def _mixup_targets(images, targets: BatchTargets, seed, *, alpha, probability):
    """mixup of a batch whose targets are class vectors (``label``, ``labels``)."""
    lam, partners = _mixup_weights(images, seed, alpha=alpha, probability=probability)
    images = lam * images + (1.0 - lam) * tf.gather(images, partners)
    return images, targets.replace(
        **_mix_class_vectors(dict(targets.tensors), partners, lam, 1.0 - lam)
    )


@builtin_op("mixup", kind="batch", with_targets=_mixup_targets, supports=("labels",))
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
    With `probability` per batch; otherwise (and in a batch of one) the
    batch is unchanged. Multi-label ``labels`` (multi-hot) mix alike.
    Refused for boxes, masks and keypoints: a blend of two images' objects
    has no single right target."""
    lam, partners = _mixup_weights(images, seed, alpha=alpha, probability=probability)
    images = lam * images + (1.0 - lam) * tf.gather(images, partners)
    labels = lam * labels + (1.0 - lam) * tf.gather(labels, partners)
    return images, labels


def _cutmix_region(images, seed, *, alpha, probability):
    """cutmix's draws: the pasted region (bool ``[H, W]``), the partners, the
    pasted fraction, and the region as a normalized box (empty when the
    batch is left alone)."""
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
    applies = _mixes(seeds[4], probability, shape[0])
    inside &= applies
    partners = _partners(seeds[3], shape[0])
    pasted = tf.reduce_sum(tf.cast(inside, tf.float32)) / (height * width)
    region = tf.stack([top / height, left / width, bottom / height, right / width])
    region = tf.where(applies, region, tf.zeros([4]))
    return inside, partners, pasted, region


def _cutmix_targets(images, targets: BatchTargets, seed, *, alpha, probability):
    """cutmix on images and their targets, with cutmix's own draws.

    ``label`` and ``labels`` are mixed by the area pasted, as `cutmix`
    mixes labels. The class mask is pasted like the pixels. Boxes: the element's own
    objects stay unless the pasted rectangle hides more than ``1 -
    min_visibility`` of their box (or all of it); the partner's objects are
    clipped to the rectangle and kept when at least ``min_visibility`` of
    their box shows. Per-object columns follow their boxes; instance masks
    keep only the pixels that show (own: outside the rectangle, partner's:
    inside), and a partner's box that the rectangle cuts is tightened to its
    mask's pixels (as a crop's); keypoints that do not show get visibility 0.
    With instance masks, what shows of an object is judged by its mask, not
    its box, as ``random_erasing(erase_targets=True)`` does: kept when at
    least ``min_visibility`` of its mask's pixels show (an object whose stored
    mask is empty, by its box). The own objects' boxes stay whole (the
    object did not change, only what shows of it), as erasing leaves them.
    """
    inside, partners, pasted, region = _cutmix_region(
        images, seed, alpha=alpha, probability=probability
    )
    images = tf.where(inside[None, :, :, None], tf.gather(images, partners), images)
    tensors = dict(targets.tensors)
    tensors.update(_mix_class_vectors(tensors, partners, 1.0 - pasted, pasted))
    if "mask" in tensors:
        mask = tensors["mask"]
        tensors["mask"] = tf.where(inside[None, :, :, None], tf.gather(mask, partners), mask)
    if "boxes" in tensors:
        tensors.update(_paste_objects(tensors, partners, region, inside, targets.spec))
    return images, targets.replace(**tensors)


def _hide_keypoints(points, visibility, inside, height_width, pasted: bool):
    pixel = tf.cast(tf.floor(points * tf.cast(height_width, tf.float32)), tf.int32)
    pixel = tf.clip_by_value(pixel, 0, height_width - 1)
    under = tf.gather_nd(inside, pixel)
    hidden = tf.logical_not(under) if pasted else under
    return tf.where(hidden, tf.zeros_like(visibility), visibility)


def _zero_hidden(points, visibility):
    return zero_unlabelled(points, visibility)[0]


def _paste_objects(tensors, partners, region, inside, spec) -> dict:
    columns = [name for name in spec.object_columns if name in tensors]
    boxes = tensors["boxes"]  # RaggedTensor [batch, (objects), 4]
    min_visibility = spec.min_visibility

    def own_kept(flat):
        area = _area(flat)
        hidden = tf.math.divide_no_nan(_intersection(flat, region[None]), area)
        return (hidden < 1.0) & (1.0 - hidden >= min_visibility)

    def partner_kept(flat):
        area = _area(flat)
        clipped = _clip_to(flat, region)
        shown = tf.math.divide_no_nan(_area(clipped), area)
        return (_area(clipped) > 0.0) & (shown >= min_visibility)

    keep_own = tf.ragged.map_flat_values(own_kept, boxes)
    own = {name: tensors[name] for name in columns}
    partner = {name: tf.gather(tensors[name], partners) for name in columns}
    keep_partner = tf.ragged.map_flat_values(partner_kept, partner["boxes"])
    whole_boxes = partner["boxes"]
    partner["boxes"] = tf.ragged.map_flat_values(lambda b: _clip_to(b, region), whole_boxes)
    height_width = tf.shape(inside)
    if "keypoints" in columns:
        # Own keypoints under the pasted rectangle and the partner's outside it are hidden.
        for group, pasted in ((own, False), (partner, True)):
            group["keypoint_visibility"] = tf.ragged.map_flat_values(
                lambda points, visibility, pasted=pasted: _hide_keypoints(
                    points, visibility, inside, height_width, pasted
                ),
                group["keypoints"],
                group["keypoint_visibility"],
            )
        for group in (own, partner):
            group["keypoints"] = tf.ragged.map_flat_values(
                _zero_hidden, group["keypoints"], group["keypoint_visibility"]
            )
    if "instance_masks" in columns:
        own_before, partner_before = own["instance_masks"], partner["instance_masks"]
        own["instance_masks"] = tf.ragged.map_flat_values(
            lambda masks: tf.where(inside[None, :, :, None], tf.zeros_like(masks), masks),
            own_before,
        )
        partner["instance_masks"] = tf.ragged.map_flat_values(
            lambda masks: tf.where(inside[None, :, :, None], masks, tf.zeros_like(masks)),
            partner_before,
        )
        # What shows of an object is what shows of its mask, as random_erasing
        # judges it: kept when at least min_visibility of its pixels show.
        keep_own = keep_own.with_flat_values(
            _kept_by_mask(
                own_before.flat_values,
                own["instance_masks"].flat_values,
                keep_own.flat_values,
                min_visibility,
            )
        )
        keep_partner = keep_partner.with_flat_values(
            _kept_by_mask(
                partner_before.flat_values,
                partner["instance_masks"].flat_values,
                keep_partner.flat_values,
                min_visibility,
            )
        )
        clipped = partner["boxes"].flat_values
        cut = tf.reduce_any(tf.not_equal(clipped, whole_boxes.flat_values), axis=-1)
        partner["boxes"] = partner["boxes"].with_flat_values(
            tightened(clipped, partner["instance_masks"].flat_values, cut)
        )
    return {
        name: tf.concat(
            [
                tf.ragged.boolean_mask(own[name], keep_own),
                tf.ragged.boolean_mask(partner[name], keep_partner),
            ],
            axis=1,
        )
        for name in columns
    }


def _kept_by_mask(before, after, by_box, min_visibility):
    """Which objects to keep, by their ``[N, H, W, 1]`` instance masks before
    and after the paste: some pixels show, and at least `min_visibility` of
    them (`kiln.reader.targets.ElementTargets.erase`'s rule). An object whose
    stored mask is empty (a polygon too small to cover a pixel's centre) is
    judged `by_box`."""
    before = tf.reduce_sum(tf.cast(before, tf.float32), [1, 2, 3])
    after = tf.reduce_sum(tf.cast(after, tf.float32), [1, 2, 3])
    by_mask = (after > 0) & (after >= min_visibility * before)
    return tf.where(before > 0, by_mask, by_box)


def _area(boxes):
    return tf.maximum(boxes[:, 2] - boxes[:, 0], 0.0) * tf.maximum(boxes[:, 3] - boxes[:, 1], 0.0)


def _clip_to(boxes, region):
    return tf.concat(
        [tf.maximum(boxes[:, :2], region[None, :2]), tf.minimum(boxes[:, 2:], region[None, 2:])],
        axis=1,
    )


def _intersection(boxes, other):
    return _area(_clip_to(boxes, other[0]))


@builtin_op(
    "cutmix",
    kind="batch",
    with_targets=_cutmix_targets,
    supports=("labels", "boxes", "mask", "instance_masks", "keypoints"),
)
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
    batch; otherwise (and in a batch of one) the batch is unchanged. The
    partner is always another image. On detection and segmentation
    datasets the class mask is pasted with the pixels, and objects follow
    (see `_cutmix_targets`); multi-label ``labels`` (multi-hot) are mixed by
    the pasted area like labels.
    """
    inside, partners, pasted, _ = _cutmix_region(images, seed, alpha=alpha, probability=probability)
    images = tf.where(inside[None, :, :, None], tf.gather(images, partners), images)
    labels = (1.0 - pasted) * labels + pasted * tf.gather(labels, partners)
    return images, labels
