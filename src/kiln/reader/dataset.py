"""Reads a dataset written by `kiln build` into a `tf.data.Dataset`, TF ops only.

Per pass over the data: list the split's shards from `kiln.json`, keep this
input pipeline's share, shuffle the file order (seeded), read with a parallel
interleave, shuffle records in a bounded buffer (seeded), number them, then
per element: parse, derive the element's seed, decode and augment; then
batch, apply batch ops (mixup, cutmix), normalize, prefetch.

Nothing in the graph calls back into Python (no `py_function`), so the
dataset serializes: it runs on TPU hosts, in tf.data service workers, and
its iterators can be checkpointed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from kiln.reader import seeds as seeding
from kiln.reader.augmenter import Augmenter, decode, standardize
from kiln.reader.location import info, join, locate
from kiln.reader.ops import AugmentConfigError, to_float, validate
from kiln.reader.targets import BatchTargets, ElementTargets, TargetError, TargetSpec
from kiln.schemas import (
    METADATA_FILENAME,
    RECORD,
    DatasetInfo,
    MetadataError,
    Schema,
    schema_for,
)

logger = logging.getLogger(__name__)

# The shuffle buffer holds encoded records: by default as many as fit in
# SHUFFLE_BUFFER_BYTES, but at least MIN and at most DEFAULT_SHUFFLE_BUFFER
# records (and never more than the share has, which is then fully shuffled).
DEFAULT_SHUFFLE_BUFFER = 10_000
_MIN_SHUFFLE_BUFFER = 1_000
SHUFFLE_BUFFER_BYTES = 256 << 20
# Files read at once per input pipeline.
_CYCLE_LENGTH = 16
_AUGMENT_ON = ("data", "model")


def target_spec(metadata: DatasetInfo) -> TargetSpec:
    """What the dataset's records carry beside the image (kiln.json ``targets``)."""
    return TargetSpec.from_json(metadata.targets)


def load(
    path: str | os.PathLike,
    split: str = "train",
    *,
    batch_size: int | None,
    shuffle: bool | None = None,
    seed: int | None = None,
    augment: str | Sequence[Any] | None = "default",
    normalize: bool = False,
    repeat: bool | int = False,
    drop_remainder: bool = False,
    input_context: tf.distribute.InputContext | None = None,
    as_supervised: bool = True,
    deterministic: bool = True,
    augment_on: str = "data",
    shuffle_buffer: int | None = None,
    max_objects: int | None = None,
):
    """A `tf.data.Dataset` of a split of the kiln dataset at `path`.

    Args:
      path: A dataset version folder, or ``<output>/<name>`` with a `LATEST`
        file (see `locate`). Local or ``gs://``.
      split: Split name, e.g. ``"train"``, ``"validation"``.
      batch_size: Elements per batch; None yields single elements.
      shuffle: Shuffle file and record order each pass. Default: True for
        ``"train"``, False otherwise.
      seed: Base seed of every random choice (orders, augmentation). The same
        seed gives the same stream in any process; None draws a fresh one per
        call and logs it as a warning (on stderr by default), once per call,
        so the run can be reproduced. See `kiln.reader.seeds`.
      augment: ``"default"``: the list stored in the dataset (its build
        config's ``augment:``) applied randomly for ``"train"``; for other
        splits only its deterministic inference form, so every split has the
        same output size (e.g. a centre crop instead of a random crop). A list
        in the YAML form (``["random_flip_left_right", {"random_crop":
        {"size": 56}}]``) is applied randomly to any split. None or ``[]``:
        no augmentation.
      normalize: Standardize pixels with the per-channel mean/std stored for
        the train split (``(pixel - mean) / std`` on the 0..255 scale).
        Otherwise images are float32 in [0, 1].
      repeat: False: one pass per iteration (iterate again, e.g. the next
        Keras epoch, and you get a new shuffle and new augmentation). An int:
        that many passes. True: endless.
      drop_remainder: Drop the last partial batch, so every tensor in
        `element_spec` has a fully static shape (needed on TPU). Needs a known
        output size: a dataset stored at one size, or a crop op with a size.
      input_context: From `tf.distribute` (e.g. in
        `distribute_datasets_from_function`): this input pipeline reads a
        disjoint share, whole files when there are at least as many files as
        pipelines, else every n-th record. Give each pipeline its per-replica
        batch size.
      as_supervised: Yield ``(image, label)``; for a dataset with targets
        (boxes, masks, keypoints, multi-label, extras) ``(image, targets)``
        with `targets` a dict: ``label``, ``labels``, ``boxes``, ``classes``,
        per-object fields, ``keypoints``, ``keypoint_visibility``, ``mask``,
        ``instance_masks`` and extras, as the dataset declares them, moved by
        every augmentation (see `kiln.reader.targets`). Per-object values are
        ragged ``[batch, (objects), ...]`` when batched, unless
        `max_objects` is given. Else a dict of all record features
        (``image`` replaced by the decoded, augmented image, targets by the
        augmented targets; ``height``/``width`` stay the stored size; plus
        ``augment_seed`` with ``augment_on="model"``).
      deterministic: Keep the element order fixed (the seeded streams depend
        on it). False lets parallel reads and maps deliver out of order:
        faster when some files or images are slow, but not reproducible.
      augment_on: ``"data"`` augments in the tf.data pipeline. ``"model"``
        returns ``(dataset, layer)``: unaugmented uint8 batches with each
        element's seed, ``({"image": uint8, "augment_seed": int32[2]},
        label)``, and a Keras `AugmentationLayer` that applies the same
        augmentation (and normalization) inside the model, e.g. on a GPU.
        Same seed, same results as ``"data"``. Batch ops (mixup, cutmix) need
        ``"data"``.
      shuffle_buffer: Records in the shuffle buffer. Default: as many
        records as fit in 256 MB (by the shards' average record size), at
        least 1000 and at most 10000, and at most this pipeline's share
        (which is then shuffled completely).
      max_objects: For datasets with boxes: pad (or cut) every element's
        objects to this many, so every tensor has a static shape (TPU, with
        ``drop_remainder=True``), and add ``num_objects`` (int32, the count
        before padding, at most `max_objects`). Padded ``classes`` are -1,
        everything else padded is 0. Objects beyond it are cut, the first
        ones kept: choose it from kiln.json's object statistics.

    Returns:
      The dataset; with ``augment_on="model"`` a ``(dataset, layer)`` tuple.
      Images are float32 ``[batch, height, width, channels]`` (uint8 in model
      mode). Labels are int64 class ids (indices into ``info(path).class_names``),
      or float32 one-hot ``[batch, num_classes]`` when the list has mixup or
      cutmix. Multi-label ``labels`` are the int64 ids of the image's
      classes, ascending (ragged ``[batch, (labels)]`` when batched), or
      float32 multi-hot ``[batch, num_classes]`` (mixed) with mixup or cutmix.

    Raises:
      MetadataError: for a path that is not a kiln dataset, or a missing split.
      AugmentConfigError: naming the list entry and parameter that is wrong.
      AugmentOpError: for a user op that ignores its seed or cannot be traced.
      ValueError: for argument combinations that cannot work, with the reason.
    """
    dataset_dir = locate(path)
    metadata = info(dataset_dir)
    split_info = metadata.split(split)
    _check_arguments(batch_size, repeat, augment_on, shuffle_buffer, drop_remainder)
    augmenter = _augmenter(metadata, split, augment, dataset_dir)
    spec = target_spec(metadata)
    with_targets = not spec.classification_only
    schema = schema_for(metadata.targets_config) if with_targets else RECORD
    if with_targets:
        augmenter.check_targets(spec)
    _check_max_objects(max_objects, spec)
    if augmenter.batch_ops and augment_on == "model":
        raise ValueError(
            f"augment_on='model': {[a.name for a in augmenter.batch_ops]} mix labels, which a "
            f"layer inside the model cannot change; use augment_on='data' for them"
        )
    if augmenter.batch_ops and batch_size is None:
        raise ValueError(
            f"{[a.name for a in augmenter.batch_ops]} mix images of a batch: pass a batch_size"
        )
    shuffle = (split == "train") if shuffle is None else bool(shuffle)
    random_ops = augmenter.training and bool(augmenter.augmentations)
    base_seed = seeding.resolve(seed, matters=shuffle or random_ops)
    share = _Share.of(dataset_dir, split_info, metadata, input_context)
    if share.by_element and not deterministic:
        logger.info(
            "kiln.reader: sharding by element needs a fixed record order; "
            "reading files deterministically"
        )

    passes = _one_pass(
        share,
        base_seed,
        shuffle=shuffle,
        deterministic=deterministic,
        shuffle_buffer=shuffle_buffer,
        compression=metadata.compression,
    )
    if repeat is True:
        passes = passes.repeat()
    elif repeat is not False and repeat != 1:
        passes = passes.repeat(repeat)

    model_side = augment_on == "model"
    decoding = _Decoding(
        augmenter=Augmenter(()) if model_side else augmenter,
        encoding=metadata.encoding["format"],
        channels=metadata.channels,
        image_size=metadata.image_size,
        keep_seeds=model_side or bool(augmenter.batch_ops),
        as_float=not model_side,
        schema=schema,
        targets=spec,
    )
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
        dataset = passes.map(
            _unconverted(decoding.element),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
        image_shape = dataset.element_spec["image"].shape
        if batch_size is not None and not image_shape.is_fully_defined():
            raise ValueError(
                f"{dataset_dir}: images in split {split!r} vary in size (kiln.json image_size "
                f"is null) and no augmentation op sets an output size, so they cannot be "
                f"batched. Add random_resized_crop or random_crop with a size to `augment` "
                f"(or a resize/crop to the build's transforms), or pass batch_size=None for "
                f"unbatched elements."
            )
        if batch_size is not None and with_targets:
            # Objects per image vary: per-object columns batch as ragged tensors.
            dataset = dataset.ragged_batch(batch_size, drop_remainder=drop_remainder)
        elif batch_size is not None:
            dataset = dataset.batch(
                batch_size,
                drop_remainder=drop_remainder,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=deterministic,
            )

    mean_std = _statistics(metadata, split, dataset_dir) if normalize else None
    num_classes = metadata.num_classes

    def finish_with_targets(batch):
        image = batch["image"]
        batch = dict(batch)
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

    dataset = dataset.map(
        _unconverted(finish), num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
    )
    cardinality = share.cardinality(repeat, batch_size, drop_remainder)
    if cardinality is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cardinality))
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = deterministic
    dataset = dataset.with_options(options)
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
    return dataset


_unconverted = tf.autograph.experimental.do_not_convert


def _check_arguments(batch_size, repeat, augment_on, shuffle_buffer, drop_remainder) -> None:
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
    ):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if not isinstance(repeat, bool) and (not isinstance(repeat, int) or repeat < 1):
        raise ValueError(f"repeat must be False, True or a number of passes >= 1, got {repeat!r}")
    if augment_on not in _AUGMENT_ON:
        raise ValueError(f"augment_on must be one of {_AUGMENT_ON}, got {augment_on!r}")
    if shuffle_buffer is not None and (not isinstance(shuffle_buffer, int) or shuffle_buffer < 1):
        raise ValueError(f"shuffle_buffer must be a positive int, got {shuffle_buffer!r}")
    if drop_remainder and batch_size is None:
        raise ValueError("drop_remainder=True needs a batch_size")


def _check_max_objects(max_objects: int | None, spec: TargetSpec) -> None:
    if max_objects is None:
        return
    if isinstance(max_objects, bool) or not isinstance(max_objects, int) or max_objects < 1:
        raise ValueError(f"max_objects must be a positive int or None, got {max_objects!r}")
    if "boxes" not in spec.kinds:
        raise TargetError(
            f"max_objects={max_objects}: this dataset has no objects (targets {list(spec.kinds)})"
        )


def _augmenter(metadata: DatasetInfo, split: str, augment, dataset_dir: str) -> Augmenter:
    if isinstance(augment, str):
        if augment != "default":
            raise AugmentConfigError(
                f"augment must be 'default', a list of ops, or None; got {augment!r}"
            )
        try:
            stored = validate(
                metadata.augment, field=f"{join(dataset_dir, METADATA_FILENAME)}: augment"
            )
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
        return Augmenter(tuple(stored), training=(split == "train"))
    return Augmenter(tuple(validate(augment)), training=True)


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
    """Turns ``((position, serialized), pass_word)`` into decoded, augmented features.

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
    ):
        self.augmenter = augmenter
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

    def element(self, numbered, word):
        position, serialized = numbered
        if not self.targets.classification_only:
            return self._element_with_targets(position, serialized, word)
        features = RECORD.parse(serialized)
        seed = seeding.element_seed(word, position)
        if self.as_float:
            image = self.augmenter.decode_and_apply(
                features,
                seed,
                encoding=self.encoding,
                channels=self.channels,
                image_size=self.image_size,
            )
        else:
            image = decode(
                features, encoding=self.encoding, channels=self.channels, image_size=self.image_size
            )
        out = dict(features, image=image)
        if self.keep_seeds:
            out["augment_seed"] = seed
        return out

    def _element_with_targets(self, position, serialized, word):
        features = self.schema.parse(serialized)
        seed = seeding.element_seed(word, position)
        targets = stored_targets(features, self.targets, self.image_size)
        if self.as_float:
            image, targets = self.augmenter.decode_and_apply_with_targets(
                features,
                targets,
                seed,
                encoding=self.encoding,
                channels=self.channels,
                image_size=self.image_size,
            )
        else:
            image = decode(
                features, encoding=self.encoding, channels=self.channels, image_size=self.image_size
            )
        out = dict(features, image=image, **_shaped_like(targets, image).tensors)
        if self.keep_seeds:
            out["augment_seed"] = seed
        return out

    def raw_batch(self, numbered, words):
        if self.image_size is None:  # see `vectorizable`
            raise ValueError("decoding a batch at once needs the dataset's one image size")
        positions, serialized = numbered
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
            out["augment_seed"] = seeding.element_seed(words, positions)
        return out


def stored_targets(
    features: dict, spec: TargetSpec, image_size: Sequence[int] | None
) -> ElementTargets:
    """One parsed record's targets as the augmenter takes them: masks decoded
    to uint8 ``[H, W, 1]`` (instance masks ``[N, H, W, 1]``)."""
    tensors = {name: features[name] for name in spec.names if name in features}
    height, width = features["height"], features["width"]
    if "mask" in tensors:
        mask = tf.io.decode_png(tensors["mask"], channels=1, dtype=tf.uint8)
        if image_size is not None:
            mask = tf.ensure_shape(mask, [image_size[0], image_size[1], 1])
        tensors["mask"] = mask
    if "instance_masks" in tensors:
        masks = tf.map_fn(
            lambda encoded: tf.io.decode_png(encoded, channels=1, dtype=tf.uint8),
            tensors["instance_masks"],
            fn_output_signature=tf.TensorSpec([None, None, 1], tf.uint8),
        )
        # N may be 0: the size comes from the record, not from a mask.
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


def pad_objects(targets: dict, spec: TargetSpec, max_objects: int, batched: bool) -> dict:
    """Per-object columns padded (or cut) to `max_objects`, plus ``num_objects``.

    Batched columns are ragged ``[B, (N), ...]`` and become dense ``[B, M,
    ...]``; unbatched ones are dense ``[N, ...]`` and become ``[M, ...]``.
    Padding is 0, except ``classes`` (-1, so a padded object cannot pass for
    class 0). Objects beyond `max_objects` are cut (the first ones are kept).
    """
    out = dict(targets)
    columns = [name for name in spec.object_columns if name in targets]
    if not columns:
        return out
    first = targets[columns[0]]
    if batched:
        count = tf.cast(first.row_lengths(), tf.int32)
    else:
        count = tf.shape(first)[0]
    out["num_objects"] = tf.minimum(count, max_objects)
    for name in columns:
        value = targets[name]
        pad = -1 if name == "classes" else 0
        if batched:
            trailing = value.shape[2:].as_list()
            out[name] = value.to_tensor(
                default_value=tf.constant(pad, value.dtype), shape=[None, max_objects, *trailing]
            )
        else:
            kept = value[:max_objects]
            trailing = value.shape[1:].as_list()
            amount = max_objects - tf.shape(kept)[0]
            paddings = [[0, amount]] + [[0, 0]] * len(trailing)
            out[name] = tf.ensure_shape(
                tf.pad(kept, paddings, constant_values=tf.constant(pad, value.dtype)),
                [max_objects, *trailing],
            )
    return out


class _Share:
    """The files (and, when files are too few, the record stride) one input pipeline reads."""

    def __init__(self, files, counts, record_bytes, by_element, num_pipelines, pipeline):
        self.files = files
        self.counts = counts
        self.record_bytes = record_bytes  # average encoded record size in the split
        self.by_element = by_element
        self.num_pipelines = num_pipelines
        self.pipeline = pipeline

    @classmethod
    def of(cls, dataset_dir, split_info, metadata, input_context) -> _Share:
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
            raise MetadataError(f"{dataset_dir}: split {split_info.name!r} has no shards")
        record_bytes = sum(s.num_bytes for s in split_info.shards) / max(1, sum(counts))
        if input_context is None or input_context.num_input_pipelines == 1:
            return cls(files, counts, record_bytes, False, 1, 0)
        num, index = input_context.num_input_pipelines, input_context.input_pipeline_id
        if len(files) >= num:
            return cls(files[index::num], counts[index::num], record_bytes, False, num, index)
        logger.info(
            "kiln.reader: %d file(s) for %d input pipelines: sharding by record", len(files), num
        )
        return cls(files, counts, record_bytes, True, num, index)

    @property
    def default_shuffle_buffer(self) -> int:
        fits = int(SHUFFLE_BUFFER_BYTES // max(self.record_bytes, 1.0))
        return max(1, min(self.num_records, DEFAULT_SHUFFLE_BUFFER, max(_MIN_SHUFFLE_BUFFER, fits)))

    @property
    def num_records(self) -> int:
        total = sum(self.counts)
        if self.by_element:
            return len(range(self.pipeline, total, self.num_pipelines))
        return total

    def cardinality(self, repeat, batch_size, drop_remainder) -> int | None:
        if repeat is True:
            return tf.data.INFINITE_CARDINALITY
        elements = self.num_records * (1 if repeat is False else repeat)
        if batch_size is None:
            return elements
        return elements // batch_size if drop_remainder else -(-elements // batch_size)


def _one_pass(
    share: _Share,
    base_seed: int,
    *,
    shuffle: bool,
    deterministic: bool,
    shuffle_buffer: int | None,
    compression: str | None,
) -> tf.data.Dataset:
    """One pass over this pipeline's records: ``((position, serialized), pass_word)``.

    Shuffles use ``reshuffle_each_iteration=True`` with fixed seeds, so each
    pass (each `repeat` round, each new iterator) gets a new order that the
    seed determines.
    """
    files = tf.data.Dataset.from_tensor_slices(share.files)
    # Sharding by record strides one file order shared by all pipelines; a
    # per-pipeline seed (seed=None draws one per call) would break that, so
    # the file order stays fixed there and only records are shuffled.
    if shuffle and not share.by_element:
        files = files.shuffle(
            len(share.files), seed=seeding.derive(base_seed, "files"), reshuffle_each_iteration=True
        )
    compression_type = {None: "", "gzip": "GZIP"}[compression]
    ordered = deterministic or share.by_element
    records = files.interleave(
        lambda filename: tf.data.TFRecordDataset(filename, compression_type=compression_type),
        cycle_length=min(len(share.files), _CYCLE_LENGTH),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=ordered,
    )
    if share.by_element:
        records = records.shard(share.num_pipelines, share.pipeline)
    if shuffle:
        buffer = shuffle_buffer or share.default_shuffle_buffer
        records = records.shuffle(
            buffer, seed=seeding.derive(base_seed, "records"), reshuffle_each_iteration=True
        )
    words = seeding.pass_words(base_seed, share.pipeline)
    # Nested as zip makes it: an extra map only to flatten the tuple would
    # cost a function call per element.
    return tf.data.Dataset.zip(records.enumerate(), words)
