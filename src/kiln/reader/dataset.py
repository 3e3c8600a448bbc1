"""Reads a dataset written by `kiln build` into a `tf.data.Dataset`, TF ops only.

Per pass over the data: list the split's shards from `kiln.json`, keep this
input pipeline's share, shuffle the file order (seeded), read with a parallel
interleave, shuffle records in a bounded buffer (seeded), then per element:
parse, derive the element's seed from its key, decode and augment; then
batch, apply batch ops (mixup, cutmix), normalize, prefetch.

Nothing in the graph calls back into Python (no `py_function`), so the
dataset serializes: it runs on TPU hosts, in tf.data service workers, and
its iterators can be checkpointed (under a `tf.distribute` strategy, one per
replica: `kiln.reader.ReplicaIterator`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from kiln.reader import host_memory
from kiln.reader import seeds as seeding
from kiln.reader.augmenter import Augmenter, AugmentOpError, decode, standardize
from kiln.reader.batching import RaggedEncoding
from kiln.reader.class_weights import ExampleWeights
from kiln.reader.labels import LabelEncoding
from kiln.reader.location import info, locate
from kiln.reader.ops import AugmentConfigError, to_float, validate
from kiln.reader.options import ReadOptions, as_read_options
from kiln.reader.output import ImageFormat, Output
from kiln.reader.padding import RemainderPadding
from kiln.reader.targets import (
    BatchTargets,
    ElementTargets,
    TargetError,
    TargetSpec,
    move_batch_objects,
    pad_objects,
)
from kiln.schemas import (
    METADATA_FILENAME,
    RECORD,
    DatasetInfo,
    MetadataError,
    Schema,
    SplitInfo,
    decode_mask,
    schema_for,
)
from kiln.schemas.location import join, read_buffer_bytes
from kiln.schemas.targets import SEED_KEY

if TYPE_CHECKING:
    from kiln.reader.layer import AugmentationLayer
    from kiln.reader.ops import Augmentation
    from kiln.schemas import TargetsConfig

logger = logging.getLogger(__name__)

# The shuffle buffer holds encoded records: by default as many as fit in
# SHUFFLE_BUFFER_BYTES, but at least MIN and at most DEFAULT_SHUFFLE_BUFFER
# records (and never more than the share has, which is then fully shuffled).
DEFAULT_SHUFFLE_BUFFER = 10_000
_MIN_SHUFFLE_BUFFER = 1_000
SHUFFLE_BUFFER_BYTES = 256 << 20
# Files read at once per input pipeline.
_CYCLE_LENGTH = 16
# `_static_parallelism`: tf.data runs an AUTOTUNE stage at min(this, cores).
_PARALLELISM_ABOVE_ANY_HOST = 1 << 14
_AUGMENT_ON = ("data", "model")


def target_spec(metadata: DatasetInfo) -> TargetSpec:
    """What the dataset's records carry beside the image (kiln.json ``targets``)."""
    return TargetSpec.from_json(metadata.targets)


def load(
    path: str | os.PathLike,
    split: str = "train",
    *,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    seed: int | None = None,
    augment: str | Sequence[Any] | None = "default",
    training: bool | None = None,
    normalize: bool = False,
    repeat: bool | int = False,
    drop_remainder: bool = False,
    pad_remainder: bool = False,
    skip: int = 0,
    input_context: tf.distribute.InputContext | None = None,
    as_supervised: bool = True,
    max_objects: int | None = None,
    one_hot: bool = False,
    label_smoothing: float = 0.0,
    class_weight: str | Mapping[int, float] | None = None,
    dtype: Any = "float32",
    data_format: str = "channels_last",
    options: ReadOptions | None = None,
    augment_on: str = "data",
    shuffle_buffer: int | None = None,
    deterministic: bool | None = None,
):
    """A `tf.data.Dataset` of a split of the kiln dataset at `path`.

    Args:
      path: A dataset version folder, or ``<output>/<name>`` with a `LATEST`
        file (see `locate`). Local or ``gs://``.
      split: Split name, e.g. ``"train"``, ``"validation"``.
      batch_size: Elements per batch (an int or a NumPy integer, as are
        `repeat` and `max_objects`). None (the default, as in `tfds.load`
        and `tf.data`) yields single elements: pass the batch size you train
        with (Keras' `fit` needs batches).
      shuffle: Shuffle file and record order each pass. Default: True for
        ``"train"``, False otherwise.
      seed: Base seed of every random choice (orders, augmentation): an int
        or a NumPy integer (``np.int64(3)`` is seed 3). The same
        seed gives the same stream in any process; None draws a fresh one per
        call and logs it as a warning (on stderr by default), once per call,
        so the run can be reproduced (not with an `input_context`: every
        input pipeline draws its own, as the warning says). See
        `kiln.reader.seeds`.
      augment: ``"default"``: the list stored in the dataset (its build
        config's ``augment:``). A list in the YAML form
        (``["random_flip_left_right", {"random_crop": {"size": 56}}]``): your
        own. None or ``[]``: no augmentation. Either runs randomly or in its
        deterministic inference form, as `training` says. A list the dataset
        cannot take is refused here, before any data is read: a crop larger
        than the stored images (kiln.json ``image_size``; when their sizes
        vary, than the least height or width, ``smallest_size``), an RGB-only op on
        grey images, an op that cannot move or mix the dataset's targets
        (the checks `kiln build` runs on the list it stores).
      training: True applies the list randomly; False applies only each op's
        deterministic inference form (e.g. a centre crop instead of a random
        crop, no flips, no mixup), so every pass over the split is the same
        and every split has the same output size. None (the default): True
        for ``"train"``, False for every other split, for ``"default"`` and
        explicit lists alike.
      normalize: Standardize pixels with the per-channel mean/std stored for
        the train split (``(pixel - mean) / std`` on the 0..255 scale).
        Otherwise images are float32 in [0, 1].
      repeat: False: one pass per iteration (iterate again, e.g. the next
        Keras epoch, and you get a new shuffle and new augmentation). An int:
        that many passes. True: endless.
      drop_remainder: Drop the last partial batch, so every tensor in
        `element_spec` has a fully static shape (needed on TPU), except what
        varies per image: per-object values (ragged unless `max_objects`) and
        multi-label ``labels`` (a ragged row of ids, ``[batch, (labels)]``,
        unless `one_hot`). Needs a known output size: a dataset stored at one
        size, or a crop op with a size.
        A batch larger than all the read holds (no batch at all) is refused.
        For evaluation, `pad_remainder` keeps every record instead.
      pad_remainder: Evaluation that counts every record, in batches of
        static shape: this pipeline reads every record of its range once
        per pass (with `input_context` the pipelines' ranges together are
        the split: none left out, none twice), fills its last partial batch
        up to `batch_size` with padding, and a pipeline with a record fewer
        than another adds a batch of padding alone where needed, so that
        every pipeline yields the same number of full batches,
        ``ceil(ceil(records / pipelines) / batch_size)`` per pass. Padding
        is generated, not read: zeros (image, label 0, boxes, masks, key
        ``b""``), dense ``classes`` -1 and no objects, and it is marked:
        ``(image, label, weight)`` (``(image, targets, weight)``), the
        float32 weight 1 for a record (its class weight, with
        `class_weight`) and 0 for padding, the sample weight Keras's
        `evaluate` and ``weighted_metrics`` count with; a dict
        (`as_supervised` False) gets ``valid``, bool, False for padding.
        Needs `batch_size`; refused with `drop_remainder`, `repeat`
        (iterate once per evaluation: each iteration reads a pass), tf.data
        service dynamic sharding, and mixup or cutmix in training (their
        inference form mixes nothing). See `kiln.reader.padding`.
      skip: Batches (elements without `batch_size`) to leave out at the
        start: the dataset yields what ``load(...).skip(skip)`` yields, the
        same batches with the same augmentation, without reading the passes
        before the one it starts in or decoding the records it skips in that
        one. To resume a ``repeat=True`` run after an interruption without
        an iterator checkpoint, pass the steps it had taken (each host the
        same number, with `input_context`). Exact with the default
        deterministic order (`ReadOptions`). Refused if it leaves nothing
        of a finite read, and with tf.data service dynamic sharding.
      input_context: From `tf.distribute` (e.g. in
        `distribute_datasets_from_function`): this input pipeline reads a
        disjoint share: a contiguous range of the split's records in shard
        order, the ranges of the pipelines differing by at most one record.
        Every pipeline reads ``records // pipelines`` of its range per pass
        (fewer than `pipelines` records wait, different ones each shuffled
        pass), so all take the same number of steps (more pipelines than
        the split has records, so that none would read anything, is
        refused); with `pad_remainder`, all of its range, padded. Give
        each pipeline its per-replica batch size. Keras takes its steps per
        epoch from the cardinality of one pipeline: exact with one pipeline
        per replica (``InputReplicationMode.PER_REPLICA``), too many when
        one pipeline feeds several replicas. Without
        `tf.distribute` (JAX, PyTorch), make one per host:
        ``tf.distribute.InputContext(num_input_pipelines=hosts,
        input_pipeline_id=host)``; an id outside ``0 .. hosts - 1`` is
        refused.
      as_supervised: Yield ``(image, label)``; for a dataset with targets
        (boxes, masks, keypoints, multi-label, extras) ``(image, targets)``
        with `targets` a dict: ``label``, ``labels``, ``boxes``, ``classes``,
        per-object fields, ``keypoints``, ``keypoint_visibility``, ``mask``,
        ``instance_masks`` and extras, as the dataset declares them, moved by
        every augmentation (see `kiln.reader.targets`). Per-object values are
        ragged ``[batch, (objects), ...]`` when batched, unless
        `max_objects` is given. Else a dict of all record features
        (``image`` replaced by the decoded, augmented image, targets by the
        augmented targets; ``height``/``width`` stay the stored size).
      max_objects: For datasets with boxes: pad (or cut) every element's
        objects to this many, so every per-object tensor has a static shape
        (TPU, with ``drop_remainder=True``; multi-label ``labels`` are not
        objects and need `one_hot` for one), and add ``num_objects`` (int32, the count
        before padding, at most `max_objects`). Padded ``classes`` are -1,
        everything else padded is 0. Objects beyond it are cut, the first
        ones kept: choose it from kiln.json's object statistics. cutmix
        pastes a partner's objects into each element, so it can double the
        count: with cutmix choose twice the most objects an image has. A
        warning says when `max_objects` can cut objects.
      one_hot: Class vectors instead of ids: ``label`` one-hot, multi-label
        ``labels`` multi-hot, float32 ``[batch, num_classes]`` (see
        `kiln.reader.labels`). Per-object ``classes`` stay ids.
      label_smoothing: In [0, 1), as Keras's losses smooth: one-hot
        ``y * (1 - s) + s / num_classes``, multi-hot ``y * (1 - s) + s / 2``.
        Needs `one_hot` (or mixup/cutmix, whose labels are one-hot).
      class_weight: ``"balanced"`` (`kiln.reader.class_weights` of this
        split) or ``{class id: weight}`` (ids left out weigh 1): yield
        ``(image, label, sample_weight)``, the weight float32 ``[batch]``
        from each example's label (for labels mixed by mixup/cutmix, the
        mix of their weights), taken before smoothing. Keras weighs the loss
        with it, also under a `tf.distribute` strategy, where
        ``fit(class_weight=...)`` fails. Needs ``as_supervised``.
      dtype: The image's dtype: ``"float32"``, ``"bfloat16"``, or
        ``"uint8"`` (the 0..255 scale rounded, see docs/reader.md for
        the one case that can differ by a level; refused with `normalize`),
        by name or as anything `tf.as_dtype` takes for them (``tf.float32``,
        ``np.float32``, ``np.dtype("uint8")``); other dtypes (``np.float64``)
        raise ValueError. Masks stay uint8. See
        `kiln.reader.output.ImageFormat`.
      data_format: ``"channels_last"`` ``[batch, height, width, channels]``
        or ``"channels_first"`` ``[batch, channels, height, width]``; masks
        (``mask``, ``instance_masks``) move their channel axis likewise.
      options: `ReadOptions`: the shuffle buffer's size, whether the
        element order is fixed, tf.data service's dynamic sharding, and
        the class ids' dtype (int32 for JAX without x64); the defaults
        suit almost every job. A dict is refused with a
        TypeError spelling the `ReadOptions` to pass (see `ReadOptions`).
      augment_on: Deprecated: ``"model"`` returns what `load_for_model`
        returns (with a DeprecationWarning); call that instead.
      shuffle_buffer: Deprecated: ``options=ReadOptions(shuffle_buffer=...)``.
      deterministic: Deprecated: ``options=ReadOptions(deterministic=...)``.
        Either keyword given with `options` that sets the same field to
        another value (one away from its default) raises ValueError.

    Returns:
      The dataset. Images are float32 ``[batch, height, width, channels]``
      unless `dtype` or `data_format` say otherwise. Labels are int64 class
      ids (indices into ``info(path).class_names``; int32 with
      ``ReadOptions(label_dtype="int32")``, as are ``classes``), or float32 one-hot
      ``[batch, num_classes]`` when the list has mixup or cutmix (in its
      inference form too, which mixes nothing: validation batches get the
      training batches' label format) or with `one_hot`. Multi-label ``labels`` are the
      int64 ids of the image's classes, ascending (ragged ``[batch,
      (labels)]`` when batched), or float32 multi-hot ``[batch,
      num_classes]`` (mixed) with mixup or cutmix or `one_hot`. With
      `class_weight` or `pad_remainder` each element has a third member,
      its weight.

    Raises:
      MetadataError: for a path that is not a kiln dataset, or a missing split.
      AugmentConfigError: naming the list entry and parameter that is wrong,
        a crop that does not fit in the stored images, or an RGB-only op on
        grey images.
      AugmentOpError: for a user op that ignores its seed or cannot be traced.
      ValueError: for an argument of the wrong type or value (a flag that is
        not a bool, such as ``shuffle="no"``; ``batch_size=0``), or
        argument combinations that cannot work, with the reason.
      TypeError: for `options` that is not a `ReadOptions` (e.g. a dict), a
        `seed` that is not an integer, or a `path` that is not a str or
        `os.PathLike`.
      TargetError: for an option the dataset's targets do not allow (e.g.
        `one_hot` without per-image labels, `class_weight` without ``label``),
        or an op that cannot move or mix them.
    """
    if augment_on not in _AUGMENT_ON:
        raise ValueError(f"augment_on must be one of {_AUGMENT_ON}, got {augment_on!r}")
    if augment_on == "model":
        warnings.warn(
            "kiln.reader.load(augment_on='model') is deprecated: call "
            "kiln.reader.load_for_model(...), which returns the same (dataset, layer)",
            DeprecationWarning,
            stacklevel=2,
        )
    dataset, layer = _read(
        path,
        split,
        model_side=augment_on == "model",
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        augment=augment,
        training=training,
        normalize=normalize,
        repeat=repeat,
        drop_remainder=drop_remainder,
        pad_remainder=pad_remainder,
        skip=skip,
        input_context=input_context,
        as_supervised=as_supervised,
        max_objects=max_objects,
        one_hot=one_hot,
        label_smoothing=label_smoothing,
        class_weight=class_weight,
        dtype=dtype,
        data_format=data_format,
        options=_with_deprecated(options, shuffle_buffer, deterministic),
    )
    return (dataset, layer) if augment_on == "model" else dataset


def load_for_model(
    path: str | os.PathLike,
    split: str = "train",
    *,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    seed: int | None = None,
    augment: str | Sequence[Any] | None = "default",
    training: bool | None = None,
    normalize: bool = False,
    repeat: bool | int = False,
    drop_remainder: bool = False,
    pad_remainder: bool = False,
    skip: int = 0,
    input_context: tf.distribute.InputContext | None = None,
    as_supervised: bool = True,
    max_objects: int | None = None,
    one_hot: bool = False,
    label_smoothing: float = 0.0,
    class_weight: str | Mapping[int, float] | None = None,
    dtype: Any = "float32",
    data_format: str = "channels_last",
    options: ReadOptions | None = None,
) -> tuple[tf.data.Dataset, AugmentationLayer]:
    """`load` with the element augmentation moved into the model: ``(dataset, layer)``.

    For GPU or TPU machines whose host CPU is the bottleneck. The dataset
    yields unaugmented uint8 images with each element's seed,
    ``({"image": uint8, "augment_seed": int32 [2]}, label)`` (as a dict with
    ``as_supervised=False``: every feature plus ``augment_seed``), and
    `layer` is a Keras `AugmentationLayer` that applies the same element ops
    (and normalization) inside the model: with ``training=True`` and the
    seeds, the results equal `load`'s for the same arguments. Without seeds
    (``training=False``: evaluation, `predict`, a saved or exported model)
    the layer applies the inference form to images alone. Batch ops (mixup,
    cutmix) change labels and need `load`.

    The arguments are `load`'s; `training` (None: True for ``"train"``)
    decides whether the layer may augment randomly at all. `one_hot`,
    `label_smoothing` and `class_weight` shape the labels as in `load`,
    and `pad_remainder` pads as there (padding's ``augment_seed`` is 0);
    `dtype` and `data_format` must stay at their defaults (the layer takes
    uint8 channels-last images: cast or transpose its output in the model).

    With targets, the dataset yields them unmoved beside the inputs and the
    layer moves them: ``images, targets = layer({**inputs, "targets":
    targets}, training=True)``. With `max_objects` the dataset pads the
    objects (static shapes) and the layer keeps them padded to the same
    size, with ``num_objects`` counting those left after its crops. The
    dataset cuts objects beyond `max_objects` before the augmentation
    (`load` after it), so the two agree when no image has more objects
    than `max_objects`.

    The dataset batches the images as stored, before any crop (the crops
    run in the layer): on a dataset whose images vary in size (kiln.json
    ``image_size`` null) a `batch_size` is refused. Resize or crop to one
    size in the build's transforms, or pass ``batch_size=None``; `load`,
    whose crops run before batching, takes such datasets batched.

    Returns:
      ``(dataset, layer)``.

    Raises:
      As `load`, from the same checks of the list against the dataset (an
      RGB-only op on grey images, a crop that does not fit, targets it
      cannot move), raised here rather than at the layer's first call;
      ValueError for batch ops in the list, and for a `batch_size` on a
      dataset whose images vary in size.
    """
    return _read(
        path,
        split,
        model_side=True,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        augment=augment,
        training=training,
        normalize=normalize,
        repeat=repeat,
        drop_remainder=drop_remainder,
        pad_remainder=pad_remainder,
        skip=skip,
        input_context=input_context,
        as_supervised=as_supervised,
        max_objects=max_objects,
        one_hot=one_hot,
        label_smoothing=label_smoothing,
        class_weight=class_weight,
        dtype=dtype,
        data_format=data_format,
        options=as_read_options(options),
    )


def _unbatchable(
    dataset_dir: str,
    split: str,
    image_size: Sequence[int] | None,
    augmenter: Augmenter,
    model_side: bool,
) -> str:
    """Why the images of a batched read have no static size, and what to do."""
    if image_size is not None:
        # The stored size is fixed: an op's output lost it.
        users = [a.name for a in augmenter.element_ops if not a.definition.builtin]
        users = users or [a.name for a in augmenter.element_ops]
        which = f"the op {users[0]!r}" if len(users) == 1 else f"one of the ops {users}"
        return (
            f"{dataset_dir}: images in split {split!r} are stored {image_size[0]}x"
            f"{image_size[1]} (kiln.json image_size), but the output of {which} has no static "
            f"size (its height or width is unknown when traced, e.g. a crop whose size is a "
            f"tensor), so the images cannot be batched. Give the op's output a static shape "
            f"where it returns, e.g. image = tf.ensure_shape(image, [height, width, "
            f"channels]) (and so its inference form), or pass batch_size=None for "
            f"unbatched elements."
        )
    if model_side:
        return (
            f"{dataset_dir}: images in split {split!r} vary in size (kiln.json image_size is "
            f"null), and load_for_model's dataset yields them as stored: its augmentation, "
            f"crops included, runs in the model (the layer), so the dataset cannot batch "
            f"them. Resize or crop them to one size in the build's transforms, pass "
            f"batch_size=None for unbatched elements (the layer takes each as a batch of "
            f"one, image[None]), or use load, whose crops set the size before batching."
        )
    return (
        f"{dataset_dir}: images in split {split!r} vary in size (kiln.json image_size "
        f"is null) and no augmentation op sets an output size, so they cannot be "
        f"batched. Add random_resized_crop or random_crop with a size to `augment` "
        f"(or a resize/crop to the build's transforms), or pass batch_size=None for "
        f"unbatched elements."
    )


def _with_deprecated(
    options: ReadOptions | None, shuffle_buffer: int | None, deterministic: bool | None
) -> ReadOptions:
    """`options` with the deprecated keywords `load` was given applied.

    A keyword and `options` that both set one option (the field away from its
    default) to different values are refused: neither silently wins.
    """
    options = as_read_options(options)
    keywords = {"shuffle_buffer": shuffle_buffer, "deterministic": deterministic}
    given = [name for name, value in keywords.items() if value is not None]
    if not given:
        return options
    defaults = ReadOptions()
    for name in given:
        value, in_options = keywords[name], getattr(options, name)
        if in_options != getattr(defaults, name) and in_options != value:
            raise ValueError(
                f"kiln.reader.load got {name}={value!r} and options=ReadOptions({name}="
                f"{in_options!r}), which disagree: pass only options=kiln.reader.ReadOptions("
                f"{name}=...) ({name}= is deprecated)"
            )
    warnings.warn(
        f"kiln.reader.load({', '.join(f'{name}=...' for name in given)}) is deprecated: "
        f"pass options=kiln.reader.ReadOptions({', '.join(f'{name}=...' for name in given)})",
        DeprecationWarning,
        stacklevel=3,
    )
    return dataclasses.replace(
        options,
        shuffle_buffer=options.shuffle_buffer if shuffle_buffer is None else shuffle_buffer,
        deterministic=options.deterministic if deterministic is None else deterministic,
    )


def _read(
    path: str | os.PathLike,
    split: str,
    *,
    model_side: bool,
    batch_size: int | None,
    shuffle: bool | None,
    seed: int | None,
    augment: str | Sequence[Any] | None,
    training: bool | None,
    normalize: bool,
    repeat: bool | int,
    drop_remainder: bool,
    pad_remainder: bool,
    skip: int,
    input_context: tf.distribute.InputContext | None,
    as_supervised: bool,
    max_objects: int | None,
    one_hot: bool,
    label_smoothing: float,
    class_weight: str | Mapping[int, float] | None,
    dtype: Any,
    data_format: str,
    options: ReadOptions,
):
    """`load`'s work: ``(dataset, layer)``, the layer None unless `model_side`."""
    host_memory.warn_if_too_late()
    shuffle = _flag("shuffle", shuffle, optional=True)
    training = _flag("training", training, optional=True)
    normalize = _flag("normalize", normalize)
    drop_remainder = _flag("drop_remainder", drop_remainder)
    pad_remainder = _flag("pad_remainder", pad_remainder)
    as_supervised = _flag("as_supervised", as_supervised)
    one_hot = _flag("one_hot", one_hot)
    deterministic = options.deterministic
    shuffle_buffer = options.shuffle_buffer
    dynamic_sharding = options.dynamic_sharding
    dataset_dir = locate(path)
    metadata = info(dataset_dir)
    split_info = metadata.split(split)
    batch_size, repeat = _checked_arguments(batch_size, repeat, drop_remainder)
    skip = _checked_skip(skip)
    spec = target_spec(metadata)
    augmenter = _augmenter(metadata, split, augment, dataset_dir, training, spec)
    with_targets = not spec.classification_only
    schema = schema_for(metadata.targets_config) if with_targets else RECORD
    max_objects = _checked_max_objects(max_objects, spec)
    _warn_about_cut_objects(max_objects, metadata, split, augmenter)
    if augmenter.batch_ops and model_side:
        raise ValueError(
            f"load_for_model: {[a.name for a in augmenter.batch_ops]} mix labels, which a "
            f"layer inside the model cannot change; use kiln.reader.load for them"
        )
    output = Output(
        ImageFormat.checked(dtype, data_format, normalize=normalize, model_side=model_side),
        LabelEncoding.checked(
            metadata.num_classes,
            spec,
            one_hot=one_hot,
            label_smoothing=label_smoothing,
            mixes_labels=augmenter.mixes_labels,
            id_dtype=options.label_dtype,
        ),
        _example_weights(class_weight, metadata, split, spec, as_supervised),
    )
    if augmenter.batch_ops and batch_size is None:
        raise ValueError(
            f"{[a.name for a in augmenter.batch_ops]} mix images of a batch: pass a batch_size"
        )
    shuffle = (split == "train") if shuffle is None else bool(shuffle)
    random_ops = augmenter.training and bool(augmenter.augmentations)
    _check_input_context(input_context)
    _record(dataset_dir, split, input_context, dynamic_sharding)
    pipeline = None
    if input_context is not None and input_context.num_input_pipelines > 1:
        pipeline = (input_context.input_pipeline_id, input_context.num_input_pipelines)
    base_seed = seeding.resolve(seed, matters=shuffle or random_ops, pipeline=pipeline)
    if dynamic_sharding and input_context is not None:
        raise ValueError(
            "ReadOptions(dynamic_sharding=True): tf.data service hands out the files, "
            "so there is no input_context share to read; pass one or the other"
        )
    if dynamic_sharding and skip:
        raise ValueError(
            f"skip={skip} with ReadOptions(dynamic_sharding=True): tf.data service hands out "
            f"the files at run time, so a read has no position to skip to; pass one or the other"
        )
    _check_pad_remainder(
        pad_remainder, batch_size, drop_remainder, repeat, dynamic_sharding, augmenter
    )
    share = _Share.of(dataset_dir, split_info, metadata, input_context, whole=pad_remainder)
    padding = (
        RemainderPadding.for_share(
            share.num_records,
            share.most_records,
            batch_size,
            skip,
            mask_fill=spec.ignore_value if "mask" in spec.kinds else 0,
        )
        if pad_remainder and batch_size is not None
        else None
    )
    skip_records = skip * (1 if batch_size is None else batch_size)
    if padding is not None:  # batches of padding alone hold no record to skip
        skip_records = min(skip_records, share.num_records)
    if not dynamic_sharding:
        _check_not_empty(
            share, dataset_dir, split_info, input_context, repeat, batch_size, drop_remainder
        )
        _check_skip(skip, share, dataset_dir, split_info, repeat, batch_size, drop_remainder)

    passes = _passes(
        share,
        base_seed,
        repeat=repeat,
        shuffle=shuffle,
        deterministic=deterministic,
        shuffle_buffer=shuffle_buffer,
        compression=metadata.compression,
        dynamic_sharding=dynamic_sharding,
        skip_records=skip_records,
    )

    keep_seeds = model_side or bool(augmenter.batch_ops)
    if keep_seeds and SEED_KEY in spec.extras:
        # Built before kiln reserved the name: the seeds would replace the column.
        raise TargetError(
            f"this dataset has an extra column named {SEED_KEY!r}, the name of the element "
            f"seeds {'load_for_model passes to the layer' if model_side else 'batch ops take'} "
            f"(the seeds would replace the column); rebuild it with the column renamed"
        )
    decoding = _Decoding(
        augmenter=Augmenter(()) if model_side else augmenter,
        encoding=metadata.encoding["format"],
        channels=metadata.channels,
        image_size=metadata.image_size,
        keep_seeds=keep_seeds,
        # uint8 output of unaugmented images skips the float round trip.
        as_float=not model_side and not output.image_format.keeps_stored_pixels(augmenter),
        schema=schema,
        targets=spec,
        # Boxes and keypoints move once per batch (instance masks, one per
        # object, are moved with their objects per element).
        defer_objects=batch_size is not None and "instance_masks" not in spec.kinds,
        # Cast per element unless later steps compute on the float image
        # (mixing ops, standardization, the model-side layer).
        image_format=(
            output.image_format if not (model_side or augmenter.batch_ops or normalize) else None
        ),
    )
    ragged: RaggedEncoding | None = None
    # The map functions are not AutoGraph-converted: they are TF ops already,
    # and an AugmentOpError from a user op then reaches the caller as itself,
    # not rewrapped in a StagingError. User ops must use tf.cond, not `if`.
    if batch_size is not None and decoding.vectorizable:
        dataset = passes.batch(batch_size, drop_remainder=drop_remainder)
        dataset = dataset.map(
            _unconverted(decoding.raw_batch),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
    else:
        element = decoding.element
        if batch_size is not None and with_targets:
            # Objects per image vary: per-object columns are encoded as
            # ragged_batch encodes them, inside the element map, so that the
            # plain batch below fuses with it (see `kiln.reader.batching`).
            ragged = RaggedEncoding()

            def element(serialized, word):
                return ragged.encode(decoding.element(serialized, word))

        dataset = passes.map(
            _unconverted(element),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
        element_spec = dataset.element_spec if ragged is None else ragged.element_spec
        image_shape = decoding.features_spec(element_spec)["image"].shape
        if batch_size is not None and not image_shape.is_fully_defined():
            raise ValueError(
                _unbatchable(dataset_dir, split, metadata.image_size, augmenter, model_side)
            )
        if batch_size is not None:
            # A plain batch right after the element map, so that tf.data fuses
            # the two (its map_and_batch_fusion): the map's threads copy each
            # element into its slot of the batch as soon as it is made. A
            # parallel batch is a stage of its own, copying the elements later,
            # from another thread (slower: see BENCHMARKS.md).
            dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)

    mean_std = _statistics(metadata, split, dataset_dir) if normalize else None
    num_classes = metadata.num_classes

    def finish_with_targets(batch, deferred=None):
        batch = dict(batch)
        if deferred is not None:
            batch.update(decoding.move_objects(batch, *deferred))
        image = batch["image"]
        if augmenter.batch_ops:
            image, mixed = augmenter.apply_batch_with_targets(
                image, BatchTargets.for_mixing(batch, spec, num_classes), batch.pop("augment_seed")
            )
            batch.update(mixed.tensors)
        if max_objects is not None:
            batch = pad_objects(batch, spec, max_objects, batched=batch_size is not None)
        if mean_std is not None and not model_side:
            image = standardize(image, *mean_std)
        batch["image"] = image
        if as_supervised:
            names = [*spec.names, *(["num_objects"] if "num_objects" in batch else [])]
            targets = {name: batch[name] for name in names}
            if model_side:
                return {"image": image, "augment_seed": batch["augment_seed"]}, targets
            return image, targets
        return batch

    def finish(batch):
        if with_targets:
            return finish_with_targets(batch)
        image = batch["image"]
        if augmenter.batch_ops:
            labels = tf.one_hot(batch["label"], num_classes, dtype=tf.float32)
            image, labels = augmenter.apply_batch(image, labels, batch["augment_seed"])
            batch = dict(batch, label=labels)
            del batch["augment_seed"]
        if mean_std is not None and not model_side:
            image = standardize(image, *mean_std)
        batch["image"] = image
        if as_supervised:
            if model_side:
                return {"image": image, "augment_seed": batch["augment_seed"]}, batch["label"]
            return image, batch["label"]
        return batch

    def finished(*parts):
        if ragged is not None:  # a batch of elements `ragged.encode` made
            encoded = parts[0] if len(parts) == 1 else parts
            decoded = ragged.decode(encoded, batch_size if drop_remainder else None)
            parts = decoded if isinstance(decoded, tuple) else (decoded,)
        if len(parts) == 2:  # the features and the objects' deferred moves
            out = output.apply(finish_with_targets(*parts))
        else:
            out = output.apply(finish(parts[0]))
        return out if padding is None else padding.filled(out)

    dataset = dataset.map(
        _unconverted(finished), num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
    )
    if padding is not None:
        dataset = padding.with_padding_batches(dataset)
    if not dynamic_sharding:
        cardinality = share.cardinality(repeat, batch_size, drop_remainder)
        if cardinality != tf.data.INFINITE_CARDINALITY:
            cardinality -= skip
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cardinality))
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    dataset = _restored_only_into(dataset, f"{metadata.name}/{metadata.version}, split {split}")
    data_options = tf.data.Options()
    data_options.deterministic = deterministic
    # A strategy that shards this dataset itself (Keras's fit/evaluate under
    # MirroredStrategy, `experimental_distribute_dataset`) shards its
    # elements: its default, FILE, fails on a split of fewer shard files than
    # replicas ("Could not apply FILE based sharding"), and the files are read
    # inside each pass's flat_map anyway. With `input_context` kiln has taken
    # its share already and no strategy shards again.
    data_options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    _static_parallelism(data_options)
    dataset = dataset.with_options(data_options)
    if model_side:
        from kiln.reader.layer import AugmentationLayer

        layer = AugmentationLayer(
            [a.to_json() for a in augmenter.augmentations],
            random=augmenter.training,
            mean=None if mean_std is None else mean_std[0],
            std=None if mean_std is None else mean_std[1],
            targets=metadata.targets if with_targets else None,
        )
        return dataset, layer
    return dataset, None


_unconverted = tf.autograph.experimental.do_not_convert


def _static_parallelism(data_options: tf.data.Options) -> None:
    """Runs the pipeline's AUTOTUNE stages at one call per core, without
    tf.data's autotuning.

    Autotuning times every op of every map call (two clock reads and a
    record per op, to model each stage's cost): for kiln's element map,
    ~150 small ops, about 5% of the CPU per image and more on small images
    (BENCHMARKS.md, the peers' levers). Its answer for these stages, which
    are CPU-bound, is the cores anyway. Without it, each AUTOTUNE stage
    starts and stays at ``min(initial_parallelism, cores)``, the cores
    counted where the pipeline runs (a tf.data service worker's own), so
    `initial_parallelism` is set above any core count (its default, 16,
    would cap a larger host). A trainer who wants autotuning back (e.g.
    for heavy stages of its own after `load`, or its RAM budget) sets
    ``options.autotune.enabled = True`` in a later `with_options`, which
    takes precedence.
    """
    data_options.autotune.enabled = False
    data_options.autotune.initial_parallelism = _PARALLELISM_ABOVE_ANY_HOST


def _restored_only_into(dataset: tf.data.Dataset, identity: str) -> tf.data.Dataset:
    """`dataset`, whose iterator, restored from a checkpoint written on
    another version or split, fails at its first element naming both.

    An iterator checkpoint holds positions in the files it read; TensorFlow
    restores them into a dataset of another version without a word, and the
    pass then read records twice and left others out (a script whose path
    follows LATEST, restarted after a build published a version). The
    identity rides along as a `scan`'s state, which the checkpoint saves and
    restores; each element compares it with this dataset's own. Last, after
    the prefetch, so that no element from a restored buffer gets past it.
    """
    expected = tf.constant(identity)

    def check(state, element):
        same = tf.debugging.Assert(
            tf.equal(state, expected),
            [
                "kiln.reader: this iterator was restored from a checkpoint written while reading",
                state,
                "and this dataset reads",
                expected,
                "; the checkpoint's positions are in the other version's files (records "
                "would repeat and go missing): load the version folder the checkpoint was "
                "written with (kiln.reader.locate(path) when the run started)",
            ],
        )
        with tf.control_dependencies([same]):
            return tf.identity(state), element

    return dataset.scan(expected, _unconverted(check))


def _is_count(value) -> bool:
    """Whether `value` is an integer (an int or a NumPy integer, as in
    ``global_batch // np.int64(hosts)``), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _flag(name: str, value: Any, optional: bool = False) -> Any:
    """`value` as a Python bool (None stays None where `optional`), or
    ValueError naming the argument: any string is true to Python, so
    ``shuffle="no"`` or ``normalize="false"`` would silently do the opposite
    of what it says. NumPy's bools are bools."""
    if value is None and optional:
        return None
    if not isinstance(value, (bool, np.bool_)):
        allowed = "True, False or None" if optional else "True or False"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return bool(value)


def _checked_arguments(batch_size, repeat, drop_remainder) -> tuple[int | None, bool | int]:
    """`batch_size` and `repeat` as Python values, or ValueError naming the one that is wrong."""
    if isinstance(repeat, np.bool_):  # a bool, as for load's flags
        repeat = bool(repeat)
    if batch_size is not None and (not _is_count(batch_size) or batch_size <= 0):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if not isinstance(repeat, bool) and (not _is_count(repeat) or repeat < 1):
        raise ValueError(f"repeat must be False, True or a number of passes >= 1, got {repeat!r}")
    if drop_remainder and batch_size is None:
        raise ValueError("drop_remainder=True needs a batch_size")
    return (
        None if batch_size is None else int(batch_size),
        repeat if isinstance(repeat, bool) else int(repeat),
    )


def _check_input_context(input_context) -> None:
    """Refuses what `tf.distribute.InputContext` accepts but cannot be a share:
    an id outside ``0 .. num_input_pipelines - 1`` would read another
    pipeline's share again (ids are taken modulo the count), silently."""
    if input_context is not None and not isinstance(input_context, tf.distribute.InputContext):
        raise TypeError(
            f"input_context must be a tf.distribute.InputContext (what "
            f"distribute_datasets_from_function passes its dataset_fn) or None, got "
            f"{type(input_context).__name__} {input_context!r}"
        )
    if input_context is None:
        return
    count, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if not _is_count(count) or count < 1:
        raise ValueError(
            f"input_context.num_input_pipelines must be a positive int (the number of "
            f"input pipelines, e.g. hosts), got {count!r}"
        )
    if not _is_count(index) or not 0 <= index < count:
        raise ValueError(
            f"input_context.input_pipeline_id must be 0 to {count - 1} (this pipeline among "
            f"num_input_pipelines={count}), got {index!r}"
        )


@dataclasses.dataclass(frozen=True)
class ReadShare:
    """What one `load` (or `load_for_model`) call was asked to read, as
    `recorded_reads` notes it."""

    dataset_dir: str
    split: str
    # (input_pipeline_id, num_input_pipelines) of its input_context; None without one.
    pipeline: tuple[int, int] | None
    dynamic_sharding: bool  # tf.data service hands out its files instead


_recording = threading.local()


@contextlib.contextmanager
def recorded_reads() -> Iterator[list[ReadShare]]:
    """The reads `load` and `load_for_model` are asked for in this thread
    while in it, one `ReadShare` each: how `kiln.reader.ReplicaIterator`
    tells that a dataset_fn passed on the input context it was given."""
    reads: list[ReadShare] = []
    outer = getattr(_recording, "reads", None)
    _recording.reads = reads
    try:
        yield reads
    finally:
        _recording.reads = outer


def _record(dataset_dir: str, split: str, input_context, dynamic_sharding: bool) -> None:
    reads = getattr(_recording, "reads", None)
    if reads is None:
        return
    pipeline = None
    if input_context is not None:
        pipeline = (input_context.input_pipeline_id, input_context.num_input_pipelines)
    reads.append(ReadShare(dataset_dir, split, pipeline, dynamic_sharding))


def _checked_skip(skip) -> int:
    if not _is_count(skip) or skip < 0:
        raise ValueError(f"skip must be an int >= 0 (batches to leave out), got {skip!r}")
    return int(skip)


def _check_pad_remainder(
    pad_remainder, batch_size, drop_remainder, repeat, dynamic_sharding, augmenter: Augmenter
) -> None:
    """Refuses what `pad_remainder` cannot be combined with, naming the other option."""
    if not pad_remainder:
        return
    if batch_size is None:
        raise ValueError(
            "pad_remainder=True fills the last batch up to batch_size: pass a batch_size"
        )
    if drop_remainder:
        raise ValueError(
            "drop_remainder=True and pad_remainder=True: one drops the last partial batch, the "
            "other fills it (every batch is full with either); pass one of them"
        )
    if repeat is True or (repeat is not False and repeat > 1):
        raise ValueError(
            f"pad_remainder=True pads the end of one pass, and with repeat={repeat!r} batches "
            f"run on across passes; leave repeat=False and iterate the dataset once per "
            f"evaluation (each iteration reads a pass)"
        )
    if dynamic_sharding:
        raise ValueError(
            "pad_remainder=True with ReadOptions(dynamic_sharding=True): tf.data service hands "
            "out the files at run time, so no worker knows how much to pad; pass one or the other"
        )
    if augmenter.batch_ops:
        raise ValueError(
            f"pad_remainder=True with {[a.name for a in augmenter.batch_ops]} in training: they "
            f"would mix padding into the records; pad evaluation reads (training=False), where "
            f"they mix nothing"
        )


def _check_skip(
    skip: int, share: _Share, dataset_dir, split_info, repeat, batch_size, drop_remainder
) -> None:
    """Refuses a `skip` that leaves nothing of a finite read: a resumed run
    would otherwise train on an empty dataset without an error."""
    total = share.cardinality(repeat, batch_size, drop_remainder)
    if skip == 0 or total == tf.data.INFINITE_CARDINALITY or skip < total:
        return
    unit = "elements" if batch_size is None else "batches"
    passes = "one pass" if repeat is False or repeat == 1 else f"{repeat} passes"
    raise ValueError(
        f"{dataset_dir}: split {split_info.name!r}: skip={skip} leaves nothing of this read's "
        f"{total} {unit} ({passes}); skip fewer, or read more passes (repeat)"
    )


def _check_not_empty(
    share: _Share, dataset_dir, split_info, input_context, repeat, batch_size, drop_remainder
) -> None:
    """Refuses a read that would yield nothing: Keras trains and evaluates on
    an empty dataset without an error (only "Your input ran out of data").

    Two ways: more input pipelines than the split has records (every
    pipeline reads ``records // pipelines`` records per pass: none), or
    `drop_remainder` with a batch larger than all the read holds.
    """
    name = split_info.name
    pipelines = 1 if input_context is None else input_context.num_input_pipelines
    if share.num_records == 0 and pipelines > 1 and share.most_records is None:
        raise ValueError(
            f"{dataset_dir}: split {name!r} has {split_info.num_examples} records for "
            f"{pipelines} input pipelines (input_context): every pipeline reads records // "
            f"pipelines of them per pass, none, so every pipeline would read nothing; read "
            f"this split with fewer input pipelines, or pass pad_remainder=True (the "
            f"pipelines without a record yield a batch of padding)"
        )
    if share.num_records > 0 and share.cardinality(repeat, batch_size, drop_remainder) == 0:
        whose = "" if pipelines == 1 else " (this input pipeline's share)"
        passes = "" if repeat is False or repeat == 1 else f" x {repeat} passes"
        raise ValueError(
            f"{dataset_dir}: split {name!r}: batch_size={batch_size} with drop_remainder=True "
            f"yields no batch from {share.num_records} records{whose} per pass{passes}; pass "
            f"a smaller batch_size, or drop_remainder=False"
        )


def _checked_max_objects(max_objects: int | None, spec: TargetSpec) -> int | None:
    if max_objects is None:
        return None
    if not _is_count(max_objects) or max_objects < 1:
        raise ValueError(f"max_objects must be a positive int or None, got {max_objects!r}")
    if "boxes" not in spec.kinds:
        raise TargetError(
            f"max_objects={max_objects}: this dataset has no objects (targets {list(spec.kinds)})"
        )
    return int(max_objects)


def _warn_about_cut_objects(
    max_objects: int | None, metadata: DatasetInfo, split: str, augmenter: Augmenter
) -> None:
    """Logs when `max_objects` is below the most objects an element of the split
    can have (kiln.json's ``objects.<split>.most_objects``, doubled by each
    batch op that pastes a partner's objects: cutmix): padding cuts the rest."""
    objects = (metadata.objects or {}).get(split)
    stored = None if objects is None else objects.most_objects
    if max_objects is None or stored is None:
        return
    most = augmenter.most_objects(stored)
    if most <= max_objects:
        return
    if most == stored:
        logger.warning(
            "max_objects=%d cuts objects: images of split %r have up to %d (the first %d "
            "are kept); pass max_objects=%d to keep every object",
            max_objects,
            split,
            most,
            max_objects,
            most,
        )
        return
    adding = [a.name for a in augmenter.batch_ops if "boxes" in (a.definition.supports or ())]
    logger.warning(
        "max_objects=%d cuts objects: images of split %r have up to %d, and up to %d after "
        "%s, which pastes objects of another image into each (the first %d are kept); pass "
        "max_objects=%d to keep every object",
        max_objects,
        split,
        stored,
        most,
        " and ".join(adding),
        max_objects,
        most,
    )


def _example_weights(class_weight, metadata, split, spec, as_supervised):
    if class_weight is None:
        return None
    if not as_supervised:
        raise ValueError(
            "class_weight yields (image, label, sample_weight) for Keras; with "
            "as_supervised=False, weigh the dict's label yourself "
            "(kiln.reader.class_weights gives the dict)"
        )
    return ExampleWeights.checked(class_weight, metadata, split, spec)


def _augmenter(
    metadata: DatasetInfo,
    split: str,
    augment,
    dataset_dir: str,
    training: bool | None,
    spec: TargetSpec,
) -> Augmenter:
    """The validated list, checked against the dataset (`Augmenter.check_dataset`:
    the same checks as `kiln build`'s), for `load` and `load_for_model` alike."""
    randomly = (split == "train") if training is None else training
    field = "augment"
    if isinstance(augment, str):
        if augment != "default":
            raise AugmentConfigError(
                f"augment must be 'default', a list of ops, or None; got {augment!r}"
            )
        field = f"{join(dataset_dir, METADATA_FILENAME)}: augment"
        try:
            stored = validate(metadata.augment, field=field)
        except AugmentConfigError as e:
            plugins = metadata.config.get("plugins") or []
            if plugins and "unknown augmentation op" in str(e):
                # A dataset's files are data: the reader never imports the
                # modules they name. Training code imports its own ops.
                raise AugmentConfigError(
                    f"{e}. The dataset was built with plugins: {plugins}; import the module "
                    f"that registers the op before kiln.reader.load"
                ) from None
            raise
        augmenter = Augmenter(tuple(stored), training=randomly)
    else:
        augmenter = Augmenter(tuple(validate(augment)), training=randomly)
    augmenter.check_dataset(spec, channels=metadata.channels, field=field, **_stored_size(metadata))
    return augmenter


def _stored_size(metadata: DatasetInfo) -> dict[str, Any]:
    """What crops are checked against before reading: the one stored size,
    or, when the sizes vary, the least height and the least width of the
    stored images (kiln.json ``smallest_size``), which every image has at
    least: a crop that does not fit them fails at some image."""
    if metadata.image_size is not None or metadata.smallest_size is None:
        return {"image_size": metadata.image_size}
    height, width = metadata.smallest_size
    return {
        "image_size": metadata.smallest_size,
        "stored": (
            f"the dataset's smallest stored images (their sizes vary: kiln.json smallest_size, "
            f"the least height {height}, the least width {width})"
        ),
    }


def _statistics(metadata: DatasetInfo, split: str, dataset_dir: str):
    for name in ("train", split):
        split_info = metadata.splits.get(name)
        if split_info is not None and split_info.statistics is not None:
            stats = split_info.statistics
            if len(stats.mean) != metadata.channels or len(stats.std) != metadata.channels:
                raise MetadataError(
                    f"{join(dataset_dir, METADATA_FILENAME)}: statistics of split {name!r} "
                    f"have {len(stats.mean)} channel(s), the images {metadata.channels}"
                )
            if min(stats.std) <= 0:
                raise MetadataError(
                    f"{join(dataset_dir, METADATA_FILENAME)}: statistics of split {name!r} "
                    f"have a zero standard deviation {stats.std}; cannot normalize"
                )
            return list(stats.mean), list(stats.std)
    raise MetadataError(
        f"{join(dataset_dir, METADATA_FILENAME)}: normalize=True needs pixel statistics, "
        f"but neither split 'train' nor {split!r} has any"
    )


class _Decoding:
    """Turns ``(serialized, pass_word)`` into decoded, augmented features.

    Per element (parse, decode or fuse the first crop into JPEG decoding,
    augment), or, for raw pixels of one size with nothing to augment per
    element, per batch: one `parse_example` and one `decode_raw` for the
    whole batch, the cheapest way to read raw pixels.
    """

    def __init__(
        self,
        augmenter: Augmenter,
        encoding: str,
        channels: int,
        image_size: Sequence[int] | None,
        keep_seeds: bool,
        as_float: bool,
        schema: Schema = RECORD,
        targets: TargetSpec | None = None,
        image_format: ImageFormat | None = None,
        defer_objects: bool = False,
    ):
        self.augmenter = augmenter
        self.defer_objects = defer_objects
        # Set when `element` is traced with deferred object moves: the axes
        # of their flips, the same for every element (see `move_objects`).
        self.flip_axes: tuple[int, ...] | None = None
        self.image_format = image_format
        self.encoding = encoding
        self.channels = channels
        self.image_size = image_size
        self.keep_seeds = keep_seeds
        self.as_float = as_float
        self.schema = schema
        self.targets = targets or TargetSpec()

    @property
    def vectorizable(self) -> bool:
        return (
            self.encoding == "raw"
            and self.image_size is not None
            and not self.augmenter.has_element_work
            and self.targets.classification_only
        )

    def element(self, serialized, word):
        if not self.targets.classification_only:
            return self._element_with_targets(serialized, word)
        features = RECORD.parse(serialized)
        seed = seeding.element_seed(word, features["key"])
        if self.as_float:
            image = self.augmenter.decode_and_apply(
                features,
                seed,
                encoding=self.encoding,
                channels=self.channels,
                image_size=self.image_size,
                uint8=self._uint8,
            )
        else:
            image = decode(
                features, encoding=self.encoding, channels=self.channels, image_size=self.image_size
            )
        out = dict(features, image=self._cast(image))
        if self.keep_seeds:
            out[SEED_KEY] = seed
        return out

    def _element_with_targets(self, serialized, word):
        features = self.schema.parse(serialized)
        seed = seeding.element_seed(word, features["key"])
        targets = stored_targets(features, self.targets, self.image_size)
        if self.as_float:
            image, targets = self.augmenter.decode_and_apply_with_targets(
                features,
                targets,
                seed,
                encoding=self.encoding,
                channels=self.channels,
                image_size=self.image_size,
                uint8=self._uint8,
                defer_objects=self.defer_objects,
            )
        else:
            image = decode(
                features, encoding=self.encoding, channels=self.channels, image_size=self.image_size
            )
        out = dict(features, image=self._cast(image), **_shaped_like(targets, image).tensors)
        if self.keep_seeds:
            out[SEED_KEY] = seed
        moves = targets.moves
        if moves is None:
            return out
        self.flip_axes = moves.flip_axes
        return out, moves.as_tensors()

    @staticmethod
    def features_spec(element_spec):
        """The features' part of an element's spec (see `element`)."""
        return element_spec[0] if isinstance(element_spec, tuple) else element_spec

    def move_objects(self, batch: dict, window: tf.Tensor, whens: tf.Tensor) -> dict:
        """A batch's per-object columns moved by their elements' deferred moves."""
        if self.flip_axes is None:
            raise RuntimeError("deferred object moves without a traced element")
        columns = {name: batch[name] for name in self.targets.object_columns if name in batch}
        return move_batch_objects(columns, self.targets, window, whens, self.flip_axes)

    @property
    def _uint8(self) -> bool:
        """Whether the augmenter may hand back uint8 images (see `_cast`)."""
        return self.image_format is not None and self.image_format.dtype == "uint8"

    def _cast(self, image: tf.Tensor) -> tf.Tensor:
        """The element's image in the output dtype, when it can be cast here:
        casting each element while it is in cache, before the batch is
        copied (a quarter of the bytes for uint8), is cheaper than casting
        the batch (measured: uint8 output went from 0.78x of float32's
        throughput to faster). The values are the batch cast's."""
        if self.image_format is None or image.dtype == tf.uint8:
            return image
        return self.image_format.image_dtype(image)

    def raw_batch(self, serialized, words):
        if self.image_size is None:  # see `vectorizable`
            raise ValueError("decoding a batch at once needs the dataset's one image size")
        features = RECORD.parse(serialized)
        height, width = self.image_size
        checks = [
            tf.debugging.assert_equal(
                features["height"],
                tf.constant(height, tf.int64),
                message="a raw record's height differs from kiln.json",
            ),
            tf.debugging.assert_equal(
                features["width"],
                tf.constant(width, tf.int64),
                message="a raw record's width differs from kiln.json",
            ),
        ]
        with tf.control_dependencies(checks):
            # Fails (naming DecodeRaw or Reshape) if any record's byte count is off.
            pixels = tf.io.decode_raw(features["image"], tf.uint8)
        image = tf.reshape(pixels, [-1, height, width, self.channels])
        image.set_shape([serialized.shape[0], height, width, self.channels])
        out = dict(features, image=to_float(image) if self.as_float else image)
        if self.keep_seeds:
            out[SEED_KEY] = seeding.element_seed(words, features["key"])
        return out


def check_first_use(
    augmentations: Sequence[Augmentation],
    targets: TargetsConfig | None,
    *,
    channels: int,
    image_size: Sequence[int] | None,
    field: str = "augment",
) -> None:
    """The first-use checks of a list's own element ops (`augmenter.check_op`),
    as `load`'s first trace of the train split runs them: the image and the
    records' targets as `load` parses and decodes them (`stored_targets`),
    traced, with nothing read. What `kiln build` runs before the job, so
    that it does not publish a list `load` refuses at that trace (an op with
    stateful or trace-time randomness, one that returns another dtype, one
    that changes the size without an inference form).

    Args:
      augmentations: The list (`validate`'s).
      targets: The dataset's targets declaration (None: classification).
      channels: The stored images' channels.
      image_size: Their one size, or None (the check's image is then 64x64).
      field: How messages name the list.

    Raises:
      AugmentOpError: naming the entry (``augment[1].my_op: augmentation
        op 'my_op' ...``), as `check_op`.
    """
    spec = TargetSpec.from_json(None if targets is None else targets.to_json())
    schema = schema_for(targets)
    height, width = (None, None) if image_size is None else image_size
    signature = (
        tf.TensorSpec([], tf.string),
        tf.TensorSpec([height, width, channels], tf.uint8),
        tf.TensorSpec([2], tf.int32),
    )
    before: list[Augmentation] = []  # the element ops up to this one
    for index, augmentation in enumerate(augmentations):
        if augmentation.definition.kind != "element":
            continue
        before.append(augmentation)
        if augmentation.definition.builtin:
            continue
        # The list up to this op: its input is what the ops before it make.
        augmenter = Augmenter(tuple(before), training=True)

        def element(serialized, image, seed, augmenter=augmenter):
            if spec.classification_only:
                return augmenter.apply(image, seed)
            stored = stored_targets(schema.parse(serialized), spec, image_size)
            return augmenter.apply_with_targets(image, stored, seed)[0]

        try:
            tf.function(element, autograph=False).get_concrete_function(*signature)
        except AugmentOpError as e:
            raise AugmentOpError(f"{field}[{index}].{augmentation.name}: {e}") from None


def stored_targets(
    features: dict, spec: TargetSpec, image_size: Sequence[int] | None
) -> ElementTargets:
    """One parsed record's targets as the augmenter takes them: masks decoded
    to uint8 ``[H, W, 1]`` (instance masks ``[N, H, W, 1]``)."""
    tensors = {name: features[name] for name in spec.names if name in features}
    height, width = features["height"], features["width"]
    if "mask" in tensors:
        # A raw mask is reshaped to the stored size: kiln.json's one size (a
        # constant shape) or the record's.
        size = (height, width) if image_size is None else tuple(image_size)
        mask = decode_mask(tensors["mask"], spec.mask_encoding, *size)
        mask = tf.expand_dims(mask, 2)  # a reshape: no copy
        if image_size is not None:
            mask = tf.ensure_shape(mask, [image_size[0], image_size[1], 1])
        tensors["mask"] = mask
    if "instance_masks" in tensors:
        encoded = tensors["instance_masks"]
        # N may be 0: `tf.map_fn` of no element cannot stack masks of unknown
        # size, so that case is an empty tensor; the size comes from the
        # record, not from a mask.
        masks = tf.cond(
            tf.size(encoded) > 0,
            lambda: tf.map_fn(
                lambda one: tf.io.decode_png(one, channels=1, dtype=tf.uint8),
                encoded,
                fn_output_signature=tf.TensorSpec([None, None, 1], tf.uint8),
            ),
            lambda: tf.zeros([0, 0, 0, 1], tf.uint8),
        )
        masks = tf.reshape(masks, tf.stack([-1, height, width, 1]))
        if image_size is not None:
            masks = tf.ensure_shape(masks, [None, image_size[0], image_size[1], 1])
        tensors["instance_masks"] = masks
    return ElementTargets(tensors, spec)


def _shaped_like(targets: ElementTargets, image: tf.Tensor) -> ElementTargets:
    """Masks with the image's static height and width (so batches of them are dense)."""
    static = image.shape[:2]
    out = {}
    if "mask" in targets.tensors:
        out["mask"] = tf.ensure_shape(targets.tensors["mask"], static.concatenate([1]))
    if "instance_masks" in targets.tensors:
        out["instance_masks"] = tf.ensure_shape(
            targets.tensors["instance_masks"],
            tf.TensorShape([None]).concatenate(static).concatenate([1]),
        )
    return targets.replace(**out) if out else targets


def _no_shards_message(dataset_dir: str, split_info: SplitInfo, metadata: DatasetInfo) -> str:
    """Why a split without shards cannot be read: as a rule, the build stored
    no example in it (too few images for its fraction, every file of it
    dropped), which the build warned about; the message names the splits
    that can be read."""
    name = split_info.name
    if split_info.num_examples:  # kiln.json counts examples it lists no shard of
        return f"{dataset_dir}: split {name!r} has no shards"
    others = [
        f"{other!r} ({split.num_examples})"
        for other, split in metadata.splits.items()
        if split.num_examples
    ]
    readable = (
        f"the splits with examples: {', '.join(others)}"
        if others
        else "no split has one (an empty dataset, built with errors.allow_empty)"
    )
    return (
        f"{dataset_dir}: split {name!r} has 0 examples in this version "
        f"({metadata.version}): the build stored none in it, so there is nothing to read; "
        f"{readable}"
    )


class _Share:
    """What one input pipeline reads per pass: its files, and how many records.

    With several pipelines (an `input_context`), each reads one contiguous
    range of the split's records in shard order (the shards' record counts
    are in kiln.json): pipeline i of n the records ``i * total // n`` up to
    ``(i + 1) * total // n``, whole shards and at most one part of a shard
    at each end of its range. The ranges differ by at most one record, and
    every pipeline reads ``total // n`` of its records per pass (so that
    replicas fed by different pipelines take the same number of steps):
    fewer than n records of the split wait for a later pass, other ones
    in each shuffled pass. (Shards dealt whole would leave out what the
    shards' sizes differ by: with 7 shards of 22 to 39 records on 4
    pipelines, 18% of the split every pass.)

    ``whole=True`` (``load(pad_remainder=True)``): every pipeline reads its
    whole range, and `most_records`, the largest range's size, is what
    `kiln.reader.padding` pads each pipeline's batches to. A pipeline
    whose range is empty (fewer records than pipelines) reads nothing and
    yields padding alone.
    """

    def __init__(
        self,
        files,
        num_records,
        record_bytes,
        skips=None,
        takes=None,
        available=None,
        most_records=None,
    ):
        self.files = files
        # Per file: the records it reads, `takes` (-1: to the end) after `skips`.
        self.skips = skips or [0] * len(files)
        self.takes = takes or [-1] * len(files)
        self.num_records = num_records  # records per pass
        self.available = num_records if available is None else available
        self.record_bytes = record_bytes  # average encoded record size in the split
        # With padding (`whole`): the records every pipeline's pass is padded to.
        self.most_records = most_records

    @classmethod
    def of(cls, dataset_dir, split_info, metadata, input_context, whole=False) -> _Share:
        files = [join(dataset_dir, s.filename) for s in split_info.shards]
        counts = [s.num_records for s in split_info.shards]
        present = set(tf.io.gfile.listdir(dataset_dir))
        missing = [s.filename for s in split_info.shards if s.filename not in present]
        if missing:
            raise MetadataError(
                f"{dataset_dir}: shard file(s) listed in {METADATA_FILENAME} are missing: "
                f"{missing[:5]}{' ...' if len(missing) > 5 else ''}"
            )
        if not files:
            raise MetadataError(_no_shards_message(dataset_dir, split_info, metadata))
        record_bytes = sum(s.num_bytes for s in split_info.shards) / max(1, sum(counts))
        total = sum(counts)
        if input_context is None or input_context.num_input_pipelines == 1:
            return cls(files, total, record_bytes, most_records=total if whole else None)
        num, index = input_context.num_input_pipelines, input_context.input_pipeline_id
        low, high = index * total // num, (index + 1) * total // num
        mine, skips, takes = [], [], []
        start = 0
        for file, count in zip(files, counts, strict=True):
            first, last = max(low, start), min(high, start + count)
            if first < last:
                mine.append(file)
                skips.append(first - start)
                takes.append(-1 if last == start + count else last - first)
            start += count
        if whole:
            if not mine:  # no record: a read of nothing, for the element structure
                mine, skips, takes = files[:1], [0], [0]
            return cls(mine, high - low, record_bytes, skips, takes, most_records=-(-total // num))
        equal = total // num
        if high - low > equal:
            logger.info(
                "kiln.reader: input pipeline %d of %d reads %d of its %d records per pass, "
                "as many as every pipeline, so that replicas step together",
                index,
                num,
                equal,
                high - low,
            )
        return cls(mine, equal, record_bytes, skips, takes, available=high - low)

    @property
    def default_shuffle_buffer(self) -> int:
        fits = int(SHUFFLE_BUFFER_BYTES // max(self.record_bytes, 1.0))
        return max(1, min(self.num_records, DEFAULT_SHUFFLE_BUFFER, max(_MIN_SHUFFLE_BUFFER, fits)))

    def cardinality(self, repeat, batch_size, drop_remainder) -> int:
        if repeat is True:
            return tf.data.INFINITE_CARDINALITY
        # With padding, every pipeline yields as many batches as the largest share.
        records = self.num_records if self.most_records is None else self.most_records
        elements = records * (1 if repeat is False else repeat)
        if batch_size is None:
            return elements
        return elements // batch_size if drop_remainder else -(-elements // batch_size)


def _passes(
    share: _Share,
    base_seed: int,
    *,
    repeat: bool | int,
    shuffle: bool,
    deterministic: bool,
    shuffle_buffer: int | None,
    compression: str | None,
    dynamic_sharding: bool,
    skip_records: int = 0,
) -> tf.data.Dataset:
    """`repeat`'s passes over this pipeline's records: ``(serialized, pass_word)``,
    less the first `skip_records`.

    Each pass is built from its epoch key (`seeding.epoch_keys`, a new one
    per iteration and per `repeat` round): its file order, record order and
    word are pure functions of (seed, key), its shuffles made anew and never
    reshuffled (`_fixed_shuffle`). No shuffle state crosses a pass boundary,
    so an iterator checkpoint restores every later pass exactly, however far
    tf.data's buffers had read ahead when it was saved. (With
    ``reshuffle_each_iteration=True`` under a `repeat`, TF 2.21 restored the
    pass after the one being read in another order.)

    Under tf.data service dynamic sharding the file list must stay the
    pipeline's first source, the one the service splits among its workers
    (inside `flat_map` it would not be split): there the pass is repeated
    with reshuffling shuffles, as before; the order is the dispatcher's
    anyway. Each record's word, hence its augmentation, is the same in both.

    Skipped records cost little: whole passes are skipped by their keys
    (each pass is made from its key alone), and the rest of them, in the
    pass the read starts in, are skipped as serialized records, before
    anything is parsed or decoded.
    """
    reading = _Reading(share, shuffle, deterministic, shuffle_buffer, compression)
    if dynamic_sharding:
        return _repeated(reading.reshuffled_pass(base_seed), repeat)
    keys = _repeated(seeding.epoch_keys(base_seed), repeat)
    whole_passes, records = divmod(skip_records, share.num_records) if skip_records else (0, 0)
    if whole_passes:
        keys = keys.skip(whole_passes)
    passes = keys.flat_map(lambda key: reading.seeded_pass(base_seed, key))
    return passes.skip(records) if records else passes


def _repeated(dataset: tf.data.Dataset, repeat: bool | int) -> tf.data.Dataset:
    if repeat is True:
        return dataset.repeat()
    if repeat is not False and repeat != 1:
        return dataset.repeat(repeat)
    return dataset


class _Reading:
    """One pass over a share: file shuffle, parallel interleave, record shuffle."""

    def __init__(self, share, shuffle, deterministic, shuffle_buffer, compression):
        self.share = share
        self.shuffle = shuffle
        self.deterministic = deterministic
        self.buffer = shuffle_buffer or share.default_shuffle_buffer
        self.compression_type = {None: "", "gzip": "GZIP"}[compression]
        self.buffer_size = read_buffer_bytes(share.files[0])

    def seeded_pass(self, base_seed: int, key: tf.Tensor) -> tf.data.Dataset:
        """The pass of epoch `key`: orders and word derived from (seed, key)."""

        def order(dataset, size, purpose):
            return _fixed_shuffle(dataset, size, seeding.pass_shuffle_seed(base_seed, key, purpose))

        records = self._records(order)
        word = tf.data.Dataset.from_tensors(seeding.pass_word(base_seed, key)).repeat()
        # Nested as zip makes it: a map only to add the word would cost a
        # function call per element.
        return tf.data.Dataset.zip(records, word)

    def reshuffled_pass(self, base_seed: int) -> tf.data.Dataset:
        """A pass whose shuffles draw new orders on each iteration (tf.data service)."""

        def order(dataset, size, purpose):
            return dataset.shuffle(
                size, seed=seeding.derive(base_seed, purpose), reshuffle_each_iteration=True
            )

        return tf.data.Dataset.zip(self._records(order), seeding.pass_words(base_seed))

    def _records(self, order) -> tf.data.Dataset:
        share = self.share
        files = tf.data.Dataset.from_tensor_slices(
            (
                share.files,
                tf.constant(share.skips, tf.int64),
                tf.constant(share.takes, tf.int64),
            )
        )
        if self.shuffle:
            files = order(files, len(share.files), "files")
        partial = any(share.skips) or any(take >= 0 for take in share.takes)

        def read(filename, skip, take):
            records = tf.data.TFRecordDataset(
                filename, compression_type=self.compression_type, buffer_size=self.buffer_size
            )
            # The ends of a pipeline's range: part of a shard (read past, not parsed).
            return records.skip(skip).take(take) if partial else records

        # Parallel also when deterministic: under tf.data service dynamic
        # sharding with two workers, the sequential interleave after a file
        # shuffle delivered every record twice (TF 2.21).
        records = files.interleave(
            read,
            cycle_length=min(len(share.files), _CYCLE_LENGTH),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=self.deterministic,
        )
        if self.shuffle:
            records = order(records, self.buffer, "records")
        if share.available > share.num_records:
            records = records.take(share.num_records)
        return records


# The second seed of every per-pass shuffle: a constant, so that the pair is
# never (0, 0), which the op would replace with fresh random seeds.
_SHUFFLE_SEED2 = 0x6B696C6E


def _fixed_shuffle(dataset: tf.data.Dataset, size: int, seed: tf.Tensor) -> tf.data.Dataset:
    """``dataset.shuffle(size, seed, reshuffle_each_iteration=False)`` without its
    seed-generator resource.

    Inside a `flat_map` function, `Dataset.shuffle` adds a DummySeedGenerator
    op, which is stateful: iterator checkpoints refuse the function
    ("DummySeedGenerator is stateful"). The plain ShuffleDataset op takes the
    seeds as tensors and holds no state beyond its iterator's.
    """
    spec = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.ShuffleDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        buffer_size=tf.constant(size, tf.int64),
        seed=seed,
        seed2=tf.constant(_SHUFFLE_SEED2, tf.int64),
        output_types=[s.dtype for s in spec],
        output_shapes=[s.shape for s in spec],
        reshuffle_each_iteration=False,
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)
