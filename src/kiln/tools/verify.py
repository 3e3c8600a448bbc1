"""Checks a built dataset's files against its metadata: the library behind `kiln verify`.

`verify` reads every shard of a version folder and compares what it finds
with `kiln.json`:

- kiln.json itself: its content matches the checksum it records (format 2
  and later), so an edit of anything the files cannot contradict (a
  statistics mean, the augment list, the config) is found too. The other
  checks still run, against the edited values, to say what else disagrees.
- A folder named with a version id is named with its own version's.
- Per shard, in split order: the file exists; its size and sha256 are the
  ones recorded; every record's TFRecord CRCs (of the length and of the
  data) are valid and no record is cut short; the number of records is the
  one recorded; every record parses with the dataset's schema (kiln.json's
  ``schema``), its label is a class id, its channel count is the dataset's,
  its image decodes to the stored height x width x channels (and to
  ``image_size`` when kiln.json has one), and its key is unique in the
  dataset. With targets: boxes lie in [0, 1] with min <= max, every
  per-object feature (classes, fields, keypoints, instance masks) has one
  entry per box, class ids and labels are class ids, keypoint visibilities
  are 0, 1 or 2, and every mask PNG decodes to the image's height x width.
- Per split, when all its shards read cleanly: ``num_examples``, the class
  counts, the per-class object counts and the statistics' pixel count
  equal what the records hold.
- When every shard reads cleanly and the images vary in size: kiln.json's
  ``smallest_size`` is the least height and the least width of the records
  (`kiln.reader.load` checks crops against it).
- The folder holds only what a build writes: the listed shards, kiln.json,
  errors.jsonl, duplicates.jsonl, index.jsonl, dropped_objects.jsonl and
  the TFDS metadata files. Anything else
  (a leftover temp file, a shard from another build) is reported.
- errors.jsonl has the sha256 kiln.json records (format 2 and later), the
  report's fields on every row, and agrees with kiln.json's drop counts.
- duplicates.jsonl (format 2 and later) has the sha256 kiln.json records,
  agrees with kiln.json's ``duplicates`` count and, when every shard read
  cleanly, lists exactly the groups of records with the same content
  sha256 (keys and splits).
- dropped_objects.jsonl (datasets with boxes, since kiln wrote it) has the
  sha256 kiln.json records and names as many dropped objects per split and
  reason as kiln.json's object statistics count.
- TFDS metadata files, when present, are the ones kiln.json implies.

CRCs are checked by TensorFlow's record reader, which verifies both CRCs of
every record and reports a damaged or truncated record as a `DataLossError`,
rather than recomputed with google-crc32c as the build's framing code does:
verify then needs only the reader-level install (TensorFlow and NumPy), and
it reads the records exactly the way training will.

Keys and content hashes are held in memory to find repeated keys and check
the duplicates report: one key and one hash per record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
from typing import Any

import tensorflow as tf

from kiln.reader import info as read_info
from kiln.schemas import (
    DROPPED_OBJECTS_FILENAME,
    DUPLICATES_FILENAME,
    ERRORS_FILENAME,
    INDEX_FILENAME,
    METADATA_FILENAME,
    DatasetInfo,
    MetadataChecksumError,
    MetadataError,
    Schema,
    SplitInfo,
    decode_image,
    decode_mask,
    shard_filename,
)
from kiln.schemas.location import is_remote, is_version_name, locate, read_buffer_bytes
from kiln.schemas.tfds_metadata import (
    TFDS_DATASET_INFO_FILENAME,
    TFDS_FEATURES_FILENAME,
    TfdsUnsupported,
    labels_filename,
    missing_tfds_files,
    tfds_files,
)
from kiln.tools.inspection import (
    consistency_warnings,
    dropped_object_warnings,
    duplicate_warnings,
    read_jsonl,
    split_order,
)

ERROR_ROW_FIELDS = ("key", "uri", "stage", "reason", "message")
DUPLICATE_ROW_FIELDS = {"sha256": str, "keys": list, "splits": list}
_CHUNK = 1 << 20
# TF wraps op errors in its function and op names; the reason is in between.
_TF_MESSAGE = re.compile(r"^(?:\{\{[^}]*\}\}\s*)?(.*?)(?:\s*\[Op:\w+\].*)?$", re.S)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset.

    Attributes:
      where: The file it concerns, relative to the version folder (a shard,
        kiln.json, errors.jsonl), or a split as ``split 'train'``.
      message: What is wrong, with the expected and the found value.
    """

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclasses.dataclass
class Verification:
    """The outcome of `verify`.

    Attributes:
      dataset_dir: The version folder that was checked.
      problems: Everything found wrong: kiln.json's checksum first, then
        shards (in split and shard order), then splits, then the folder's
        other files. Empty when the dataset is intact.
      num_shards: Shards read.
      num_records: Records read and checked.
    """

    dataset_dir: str
    problems: list[Problem]
    num_shards: int = 0
    num_records: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class _SplitTally:
    """What the records of one split hold, to compare with its SplitInfo."""

    records: int = 0
    pixels: int = 0
    labels: dict[int, int] = dataclasses.field(default_factory=dict)
    objects: dict[int, int] = dataclasses.field(default_factory=dict)  # class id -> objects
    without_classes: int = 0  # records that carry no class (targets without a label)
    complete: bool = True  # every shard read without a problem


@dataclasses.dataclass
class _DatasetTally:
    """What the records of every split hold, across splits.

    Attributes:
      keys: Every key read, to find one that repeats.
      copies: Source content sha256 -> ``(key, split)`` of each record
        stored from it, to check duplicates.jsonl.
      least: The least height and the least width of the records read, to
        check kiln.json's ``smallest_size``.
    """

    keys: set[bytes] = dataclasses.field(default_factory=set)
    copies: dict[bytes, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    least: tuple[int, int] | None = None


def verify(path: str) -> Verification:
    """Checks the dataset at `path` against its kiln.json (see the module docstring).

    Args:
      path: A version folder, or ``<output>/<name>`` (follows LATEST), local
        or gs://, as `kiln.reader.locate` accepts.

    Returns:
      The `Verification`; ``ok`` when nothing is wrong.

    Raises:
      MetadataError: when `path` is not a kiln dataset at all (no kiln.json,
        no LATEST naming a version). A kiln.json that exists but does not
        load is a problem in the result instead.
    """
    dataset_dir = locate(path)
    result = Verification(dataset_dir, [])
    try:
        metadata = read_info(dataset_dir)
    except MetadataChecksumError as e:
        # Check the rest against what the file says now, to tell what else differs.
        result.problems.append(Problem(METADATA_FILENAME, str(e)))
        metadata = e.info
    except MetadataError as e:
        return Verification(dataset_dir, [Problem(METADATA_FILENAME, str(e))])
    result.problems += _check_place(dataset_dir, metadata)
    seen = _DatasetTally()
    complete = True
    for name in split_order(metadata):
        split = metadata.splits[name]
        tally = _SplitTally()
        for index, shard in enumerate(split.shards):
            expected_name = shard_filename(
                metadata.name, name, index, len(split.shards), metadata.compression
            )
            if shard.filename != expected_name:
                result.problems.append(
                    Problem(
                        METADATA_FILENAME,
                        f"split {name!r} shard {index} is named "
                        f"{shard.filename!r}; expected {expected_name!r}",
                    )
                )
            found = _check_shard(dataset_dir, shard, name, metadata, tally, seen)
            result.num_shards += 1
            if found:
                tally.complete = False
                result.problems.append(Problem(shard.filename, "; ".join(found)))
        result.num_records += tally.records
        complete = complete and tally.complete
        if tally.complete:
            result.problems += [
                Problem(f"split {name!r}", message)
                for message in _check_split(split, metadata, tally)
            ]
    if complete:
        result.problems += _check_smallest_size(metadata, seen.least)
    result.problems += _check_folder(dataset_dir, metadata)
    result.problems += _check_error_report(dataset_dir, metadata)
    result.problems += _check_report_sha256(dataset_dir, INDEX_FILENAME, metadata.index_sha256)
    result.problems += _check_dropped_objects(dataset_dir, metadata)
    result.problems += _check_duplicate_report(
        dataset_dir, metadata, seen.copies if complete else None
    )
    result.problems += _check_tfds_files(dataset_dir, metadata)
    return result


def _check_place(dataset_dir: str, metadata: DatasetInfo) -> list[Problem]:
    """A version folder named for another version (a rollback or copy by hand
    gone wrong: LATEST would then name records of another version). The
    dataset folder's own name is not checked: a dataset copied under another
    name (a download from a bucket) is intact."""
    split = posixpath.split if is_remote(dataset_dir) else os.path.split
    folder = split(dataset_dir.rstrip("/"))[1]
    if is_version_name(folder) and folder != metadata.version:
        return [
            Problem(
                METADATA_FILENAME,
                f"it is version {metadata.version}, but its folder is named {folder} "
                f"(builds and LATEST find a version by its folder's name: a renamed or "
                f"misplaced copy?)",
            )
        ]
    return []


def _join(directory: str, name: str) -> str:
    return tf.io.gfile.join(directory, name)


def _size_and_sha256(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def tf_message(error: tf.errors.OpError) -> str:
    """The reason in a TF error, in words for the two ways a shard's framing breaks."""
    match = _TF_MESSAGE.match(error.message.strip())
    text = match.group(1).strip() if match else error.message.strip()
    if isinstance(error, tf.errors.DataLossError):
        corrupted = re.search(r"corrupted record at (\d+)", text)
        if corrupted:
            return f"CRC mismatch at byte {corrupted.group(1)} (the file is damaged)"
        truncated = re.search(r"truncated record at (\d+)", text)
        if truncated:
            return f"cut short at byte {truncated.group(1)} (the file is truncated)"
    return text


def _check_shard(
    dataset_dir: str,
    shard,
    split: str,
    metadata: DatasetInfo,
    tally: _SplitTally,
    seen: _DatasetTally,
) -> list[str]:
    """What is wrong with one shard file (empty if nothing); adds its records to `tally`."""
    path = _join(dataset_dir, shard.filename)
    if not tf.io.gfile.exists(path):
        return [f"missing (kiln.json lists it with {shard.num_records} records)"]
    found = []
    size, sha256 = _size_and_sha256(path)
    if size != shard.num_bytes:
        found.append(f"{size} bytes, kiln.json says {shard.num_bytes}")
    if sha256 != shard.sha256:
        found.append(f"sha256 is {sha256}, kiln.json says {shard.sha256}")
    count, problem = _check_records(path, split, metadata, tally, seen)
    if problem is not None:
        found.append(problem)
    elif count != shard.num_records:
        found.append(f"holds {count} records, kiln.json says {shard.num_records}")
    return found


def _record_facts(metadata: DatasetInfo):
    encoding, channels = metadata.encoding["format"], metadata.channels
    schema = Schema.from_json(metadata.schema)
    names = set(schema.names)
    targets = metadata.targets_config
    fields = sorted(targets.boxes.fields) if targets.boxes is not None else []

    mask_encoding = targets.mask.encoding if targets.mask is not None else "png"

    def mask_shape(encoded):  # an instance mask: PNG in every dataset
        return tf.shape(decode_mask(encoded), out_type=tf.int64)

    def semantic_mask_facts(encoded, height, width):
        # A raw mask that is not height*width bytes fails to decode (naming
        # both sizes): a bad record, as a PNG that does not decode. The
        # histogram of its values gives the classes it counts for.
        mask = decode_mask(encoded, mask_encoding, height, width)
        histogram = tf.math.bincount(
            tf.cast(tf.reshape(mask, [-1]), tf.int32), minlength=256, maxlength=256
        )
        return tf.shape(mask, out_type=tf.int64), histogram

    def facts(serialized):
        parsed = schema.parse(serialized)
        image = decode_image(parsed["image"], parsed["height"], parsed["width"], channels, encoding)
        out = {
            "label": parsed["label"] if "label" in names else tf.constant(-1, tf.int64),
            "height": parsed["height"],
            "width": parsed["width"],
            "channels": parsed["channels"],
            "key": parsed["key"],
            "sha256": parsed["sha256"],
            "shape": tf.shape(image, out_type=tf.int64),
        }
        for name in ("labels", "boxes", "classes", "keypoints", "keypoint_visibility"):
            if name in names:
                out[name] = parsed[name]
        for name in fields:
            out[f"field/{name}"] = tf.shape(parsed[name], out_type=tf.int64)[0]
        if "mask" in names:
            out["mask_shape"], out["mask_histogram"] = semantic_mask_facts(
                parsed["mask"], parsed["height"], parsed["width"]
            )
        if "instance_masks" in names:
            out["instance_mask_shapes"] = tf.map_fn(
                mask_shape,
                parsed["instance_masks"],
                fn_output_signature=tf.TensorSpec([2], tf.int64),
            )
        return out

    return tf.autograph.experimental.do_not_convert(facts)


def _check_records(
    path: str, split: str, metadata: DatasetInfo, tally: _SplitTally, seen: _DatasetTally
) -> tuple[int, str | None]:
    """Reads every record of a shard: (records read, the first problem or None)."""
    compression = "GZIP" if metadata.compression == "gzip" else ""
    records = tf.data.TFRecordDataset(
        path, compression_type=compression, buffer_size=read_buffer_bytes(path)
    ).map(_record_facts(metadata), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    image_size = tuple(metadata.image_size) if metadata.image_size else None
    count = 0
    iterator = iter(records.as_numpy_iterator())
    while True:
        try:
            facts = next(iterator)
        except StopIteration:
            return count, None
        except tf.errors.OpError as e:
            # A bad CRC or a cut-off record (DataLossError), or a record that
            # does not parse or decode (InvalidArgumentError).
            return count, f"record {count}: {tf_message(e)}"
        problem = _record_problem(facts, metadata, image_size, seen.keys)
        if problem is not None:
            key = facts["key"].decode("utf-8", "replace")
            return count, f"record {count} (key {key!r}): {problem}"
        seen.copies.setdefault(bytes.fromhex(facts["sha256"].decode()), []).append(
            (facts["key"].decode("utf-8", "replace"), split)
        )
        count += 1
        tally.records += 1
        height, width = int(facts["height"]), int(facts["width"])
        tally.pixels += height * width
        seen.least = (
            (height, width)
            if seen.least is None
            else (min(seen.least[0], height), min(seen.least[1], width))
        )
        classes = _image_classes(facts, metadata)
        for label in classes:
            tally.labels[label] = tally.labels.get(label, 0) + 1
        tally.without_classes += not classes
        for class_id in facts.get("classes", ()):
            tally.objects[int(class_id)] = tally.objects.get(int(class_id), 0) + 1


def _check_smallest_size(metadata: DatasetInfo, least: tuple[int, int] | None) -> list[Problem]:
    """kiln.json's ``smallest_size`` (images of varying size) against the
    least height and width of every record read: `kiln.reader.load` checks
    crops against it, so a wrong one passes a crop that fails in training
    or refuses one that fits."""
    if metadata.smallest_size is None or least is None:
        return []  # one size for all (image_size, checked per record), or written before it
    if tuple(metadata.smallest_size) == least:
        return []
    return [
        Problem(
            METADATA_FILENAME,
            f"smallest_size is {list(metadata.smallest_size)}, the records' least height "
            f"and least width are {list(least)}",
        )
    ]


def _image_classes(facts: dict[str, Any], metadata: DatasetInfo) -> list[int]:
    """The classes a record counts for in class_counts: its label, or with
    targets every class it carries (label, labels, objects, and the classes
    its semantic mask shows), as the job counts them."""
    targets = metadata.targets_config
    if targets.is_classification:
        return [int(facts["label"])]
    classes = {int(c) for c in facts.get("labels", ())} | {int(c) for c in facts.get("classes", ())}
    if int(facts["label"]) >= 0:
        classes.add(int(facts["label"]))
    if targets.mask is not None and "mask" in metadata.class_count_kinds:
        classes.update(targets.mask.classes_shown(facts["mask_histogram"], metadata.num_classes))
    return sorted(classes)


def _target_problem(facts: dict[str, Any], metadata: DatasetInfo) -> str | None:
    """What is wrong with a record's targets, or None."""
    height, width = int(facts["height"]), int(facts["width"])
    classes = metadata.num_classes
    for label in facts.get("labels", ()):
        if not 0 <= int(label) < classes:
            return f"labels holds {int(label)}, not a class id ({classes} classes)"
    if "boxes" in facts:
        boxes = facts["boxes"]
        count = len(boxes)
        if len(boxes) and not (((boxes >= 0) & (boxes <= 1)).all()):
            return f"a box is outside [0, 1]: {boxes.tolist()}"
        if len(boxes) and not (
            (boxes[:, 0] <= boxes[:, 2]).all() and (boxes[:, 1] <= boxes[:, 3]).all()
        ):
            return f"a box has min > max ([y_min, x_min, y_max, x_max]): {boxes.tolist()}"
        lengths = {"classes": len(facts["classes"])}
        for name, value in facts.items():
            if name.startswith("field/"):
                lengths[name[len("field/") :]] = int(value)
        if "keypoints" in facts:
            lengths["keypoints"] = len(facts["keypoints"])
            lengths["keypoint_visibility"] = len(facts["keypoint_visibility"])
        if "instance_mask_shapes" in facts:
            lengths["instance_masks"] = len(facts["instance_mask_shapes"])
        for name, length in lengths.items():
            if length != count:
                return f"{count} boxes but {length} {name}"
        for class_id in facts["classes"]:
            if not 0 <= int(class_id) < classes:
                return f"an object's class {int(class_id)} is not a class id ({classes} classes)"
        if "keypoint_visibility" in facts:
            visibility = facts["keypoint_visibility"]
            if visibility.size and not ((visibility >= 0) & (visibility <= 2)).all():
                return "a keypoint visibility is not 0, 1 or 2"
            points = facts["keypoints"]
            if points.size and not ((points >= 0) & (points <= 1)).all():
                return "a keypoint is outside [0, 1]"
    if "mask_shape" in facts and tuple(facts["mask_shape"]) != (height, width):
        shape = tuple(int(v) for v in facts["mask_shape"])
        return f"the mask decodes to {shape[0]}x{shape[1]}, the image is {height}x{width}"
    for shape in facts.get("instance_mask_shapes", ()):
        if tuple(int(v) for v in shape) != (height, width):
            return (
                f"an instance mask decodes to {int(shape[0])}x{int(shape[1])}, "
                f"the image is {height}x{width}"
            )
    return None


def _record_problem(
    facts: dict[str, Any],
    metadata: DatasetInfo,
    image_size: tuple[int, ...] | None,
    keys: set[bytes],
) -> str | None:
    label, channels = int(facts["label"]), int(facts["channels"])
    height, width = int(facts["height"]), int(facts["width"])
    has_label = metadata.targets_config.label is not None
    if has_label and not 0 <= label < metadata.num_classes:
        return f"label {label} is not a class id (the dataset has {metadata.num_classes} classes)"
    if channels != metadata.channels:
        return f"{channels} channels, the dataset stores {metadata.channels}"
    shape = tuple(int(v) for v in facts["shape"])
    if shape != (height, width, channels):
        return f"the image decodes to {shape}, the record says {(height, width, channels)}"
    if image_size is not None and (height, width) != image_size:
        return (
            f"the image is {height}x{width}, kiln.json says every image is "
            f"{image_size[0]}x{image_size[1]}"
        )
    if not re.fullmatch(rb"[0-9a-f]{64}", facts["sha256"]):
        return f"sha256 feature {facts['sha256'][:80]!r} is not a hex sha256"
    key = facts["key"]
    if not key:
        return "empty key"
    if key in keys:
        return "the key appears more than once in the dataset"
    problem = _target_problem(facts, metadata)
    if problem is not None:
        return problem
    keys.add(key)
    return None


def _check_split(split: SplitInfo, metadata: DatasetInfo, tally: _SplitTally) -> list[str]:
    found = []
    if split.num_examples != tally.records:
        found.append(f"num_examples is {split.num_examples}, the shards hold {tally.records}")
    counted = {metadata.class_names[label]: n for label, n in sorted(tally.labels.items())}
    stated = {name: int(n) for name, n in split.class_counts.items() if n}
    if counted != stated:
        found.append(f"class_counts are {stated}, the records hold {counted}")
    if split.images_without_classes not in (None, tally.without_classes):
        found.append(
            f"images_without_classes is {split.images_without_classes}, the records hold "
            f"{tally.without_classes} images with no class"
        )
    objects = (metadata.objects or {}).get(split.name)
    if objects is not None:
        counted = {metadata.class_names[c]: n for c, n in sorted(tally.objects.items())}
        stated = {name: c.count for name, c in objects.classes.items() if c.count}
        if counted != stated:
            found.append(f"object counts are {stated}, the records hold {counted}")
    stats = split.statistics
    if stats is None:
        if tally.records:
            found.append("has records but no pixel statistics")
    else:
        if stats.count != tally.pixels:
            found.append(
                f"statistics count {stats.count} pixels per channel, the records "
                f"hold {tally.pixels}"
            )
        if len(stats.mean) != metadata.channels or len(stats.std) != metadata.channels:
            found.append(
                f"statistics have {len(stats.mean)} mean and {len(stats.std)} std "
                f"values for {metadata.channels} channel(s)"
            )
        elif not all(0 <= m <= 255 for m in stats.mean) or not all(
            0 <= s <= 127.5 for s in stats.std
        ):
            found.append(
                f"statistics out of range for 0..255 pixels: mean {stats.mean}, std {stats.std}"
            )
    return found


def _allowed_files(metadata: DatasetInfo) -> set[str]:
    shards = {shard.filename for split in metadata.splits.values() for shard in split.shards}
    return shards | {
        METADATA_FILENAME,
        ERRORS_FILENAME,
        DUPLICATES_FILENAME,
        INDEX_FILENAME,
        DROPPED_OBJECTS_FILENAME,
        TFDS_DATASET_INFO_FILENAME,
        TFDS_FEATURES_FILENAME,
        *(
            labels_filename(feature.key)
            for feature in Schema.from_json(metadata.schema).features
            if feature.name in ("label", "labels", "classes")
        ),
    }


def _check_folder(dataset_dir: str, metadata: DatasetInfo) -> list[Problem]:
    present = {entry.rstrip("/") for entry in tf.io.gfile.listdir(dataset_dir)}
    unexpected = sorted(present - _allowed_files(metadata))
    if not unexpected:
        return []
    shown = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
    return [Problem(".", f"{len(unexpected)} file(s) a build does not write: {shown}")]


def _check_report_sha256(dataset_dir: str, name: str, recorded: str | None) -> list[Problem]:
    """A report file against the sha256 kiln.json records (None: an older
    format records none, nothing to check)."""
    if recorded is None:
        return []
    path = _join(dataset_dir, name)
    if not tf.io.gfile.exists(path):
        return [Problem(name, f"missing (kiln.json records its sha256 {recorded})")]
    _, sha256 = _size_and_sha256(path)
    if sha256 != recorded:
        return [
            Problem(
                name,
                f"modified after it was written: sha256 is {sha256}, kiln.json says {recorded}",
            )
        ]
    return []


def _check_error_report(dataset_dir: str, metadata: DatasetInfo) -> list[Problem]:
    found = _check_report_sha256(dataset_dir, ERRORS_FILENAME, metadata.errors_sha256)
    try:
        rows = read_jsonl(_join(dataset_dir, ERRORS_FILENAME))
    except MetadataError as e:
        return found + [Problem(ERRORS_FILENAME, str(e))]
    for number, row in enumerate(rows or [], start=1):
        missing = [name for name in ERROR_ROW_FIELDS if not isinstance(row.get(name), str)]
        if missing:
            found.append(
                Problem(ERRORS_FILENAME, f"line {number}: missing or non-text field(s) {missing}")
            )
            break
    found += [Problem(ERRORS_FILENAME, warning) for warning in consistency_warnings(metadata, rows)]
    return found


def _check_dropped_objects(dataset_dir: str, metadata: DatasetInfo) -> list[Problem]:
    """dropped_objects.jsonl against its sha256 and kiln.json's counts of
    dropped objects (datasets that record it)."""
    if metadata.dropped_objects_sha256 is None:
        return []
    found = _check_report_sha256(
        dataset_dir, DROPPED_OBJECTS_FILENAME, metadata.dropped_objects_sha256
    )
    try:
        rows = read_jsonl(_join(dataset_dir, DROPPED_OBJECTS_FILENAME))
    except MetadataError as e:
        return found + [Problem(DROPPED_OBJECTS_FILENAME, str(e))]
    if rows is None:  # missing: the sha256 check said so
        return found
    return found + [
        Problem(DROPPED_OBJECTS_FILENAME, warning)
        for warning in dropped_object_warnings(metadata, rows)
    ]


def _check_duplicate_report(
    dataset_dir: str, metadata: DatasetInfo, copies: dict[bytes, list[tuple[str, str]]] | None
) -> list[Problem]:
    """duplicates.jsonl against kiln.json and, if `copies` (every record's
    content and key, None when some shard did not read cleanly), the records."""
    if metadata.duplicates_sha256 is None:
        return []  # an older format: no duplicates report
    found = _check_report_sha256(dataset_dir, DUPLICATES_FILENAME, metadata.duplicates_sha256)
    try:
        rows = read_jsonl(_join(dataset_dir, DUPLICATES_FILENAME))
    except MetadataError as e:
        return found + [Problem(DUPLICATES_FILENAME, str(e))]
    if rows is None:
        return found
    for number, row in enumerate(rows, start=1):
        wrong = [
            name
            for name, kind in DUPLICATE_ROW_FIELDS.items()
            if not isinstance(row.get(name), kind)
        ]
        if wrong:
            return found + [
                Problem(
                    DUPLICATES_FILENAME, f"line {number}: missing or malformed field(s) {wrong}"
                )
            ]
        keys, splits = row["keys"], row["splits"]
        if (
            len(keys) < 2
            or len(keys) != len(splits)
            or not all(isinstance(text, str) for text in keys + splits)
        ):
            return found + [
                Problem(
                    DUPLICATES_FILENAME,
                    (
                        f"line {number}: {len(keys)} keys and {len(splits)} splits; a group has "
                        f"two keys or more and a split for each, all text"
                    ),
                )
            ]
    found += [
        Problem(DUPLICATES_FILENAME, warning) for warning in duplicate_warnings(metadata, rows)
    ]
    if copies is not None:
        difference = _duplicates_difference(rows, copies)
        if difference is not None:
            found.append(Problem(DUPLICATES_FILENAME, difference))
    return found


def _duplicates_difference(
    rows: list[dict[str, Any]], copies: dict[bytes, list[tuple[str, str]]]
) -> str | None:
    """Where the report's rows and the records' groups of identical content
    differ (None: they agree), for the first content sha256 that differs."""
    held = {content.hex(): sorted(group) for content, group in copies.items() if len(group) > 1}
    listed = {row["sha256"]: sorted(zip(row["keys"], row["splits"], strict=True)) for row in rows}
    if len(listed) != len(rows):
        return "lists a content sha256 more than once"
    differing = sorted(
        content for content in set(held) | set(listed) if held.get(content) != listed.get(content)
    )
    order = [row["sha256"] for row in rows]
    if (
        not differing
        and order == sorted(order)
        and all(row["keys"] == sorted(row["keys"]) for row in rows)
    ):
        return None
    if not differing:
        return "rows or keys are not sorted"
    content = differing[0]
    return (
        f"lists {len(listed)} group(s) of identical content, the records hold "
        f"{len(held)}; for content {content}, it lists {_copies_text(listed.get(content))}, "
        f"the records hold {_copies_text(held.get(content))}"
    )


def _copies_text(copies: list[tuple[str, str]] | None) -> str:
    if not copies:
        return "no copies"
    return ", ".join(f"{key!r} ({split})" for key, split in copies)


def _check_tfds_files(dataset_dir: str, metadata: DatasetInfo) -> list[Problem]:
    try:
        expected = tfds_files(metadata)
    except TfdsUnsupported:
        return []
    missing = missing_tfds_files(
        expected, lambda name: tf.io.gfile.exists(_join(dataset_dir, name))
    )
    if missing is None:  # a version built before kiln wrote them
        return []
    found = []
    for name, text in sorted(expected.items()):
        path = _join(dataset_dir, name)
        if name in missing:
            found.append(
                Problem(
                    name,
                    "missing, though the other TFDS files are there: "
                    "tfds.builder_from_directory cannot read the version",
                )
            )
            continue
        with tf.io.gfile.GFile(path, "r") as f:
            if f.read() != text:
                found.append(
                    Problem(
                        name,
                        "differs from what kiln.json describes (TFDS would "
                        "read other splits, counts or classes)",
                    )
                )
    return found
