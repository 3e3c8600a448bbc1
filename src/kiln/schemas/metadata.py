"""The dataset metadata file (`kiln.json`) and the names of a dataset's files.

A build writes `kiln.json` last, so its presence marks a complete dataset.
It holds nothing that depends on the wall clock: building the same inputs
with the same config gives the same bytes. Since format version 2 it
carries a checksum of its own content (`DatasetInfo.checksum`), checked
whenever it is loaded, and the sha256 of the two reports beside it.

Standard library only (plus `tf.io.gfile` for reading local or gs:// paths),
and the pydantic `targets` declaration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import kiln
from kiln.errors import did_you_mean
from kiln.schemas.targets import CLASSIFICATION, TargetsConfig

METADATA_FILENAME = "kiln.json"
ERRORS_FILENAME = "errors.jsonl"
DUPLICATES_FILENAME = "duplicates.jsonl"
INDEX_FILENAME = "index.jsonl"
DROPPED_OBJECTS_FILENAME = "dropped_objects.jsonl"
LATEST_FILENAME = "LATEST"
STAGING_PREFIX = ".staging-"
# A dataset folder's build lock (kiln.schemas.dataset_lock).
LOCK_FILENAME = ".lock"

# The first format whose kiln.json carries `checksum`, `errors_sha256` and
# `duplicates_sha256`; older files load without them (nothing to check).
CHECKSUM_FORMAT_VERSION = 2
CHECKSUM_FIELD = "checksum"


class MetadataError(ValueError):
    """A dataset folder's metadata is missing, incomplete or malformed."""


class MetadataChecksumError(MetadataError):
    """kiln.json's content does not match the checksum it records: it was
    edited after the build wrote it.

    Attributes:
      recorded: The checksum the file records (None: it records none).
      actual: The checksum of the content found.
      info: The metadata as found, parsed but not to be trusted (`kiln
        verify` compares it with the files to say what else disagrees).
    """

    def __init__(self, source: str, recorded: str | None, actual: str, info: DatasetInfo):
        self.recorded, self.actual, self.info = recorded, actual, info
        if recorded is None:
            message = (
                f"{source} records no checksum, which format version "
                f"{CHECKSUM_FORMAT_VERSION} and later always write: the field was "
                f"removed after it was written"
            )
        else:
            message = (
                f"{source} was modified after it was written: checksum {recorded} "
                f"recorded, its content hashes to {actual}"
            )
        super().__init__(message)


# What `json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`
# builds on every call, built once: the same text, without constructing an
# encoder per call (about half of its cost for the small entries the build
# hashes per file). `encode` keeps no state between calls, so threads share it.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(data: Any) -> str:
    """JSON with sorted keys and no whitespace: equal data, equal text."""
    return _CANONICAL.encode(data)


def content_checksum(data: Mapping[str, Any]) -> str:
    """The checksum kiln.json records of its content (see `DatasetInfo.checksum`).

    Args:
      data: The JSON object of a kiln.json, as parsed; its ``checksum``
        member, if any, is left out.
    """
    content = {name: value for name, value in data.items() if name != CHECKSUM_FIELD}
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


# A split name ends up in shard file names (`<name>-<split>.tfrecord-...`):
# '-' would make them ambiguous, so splits may not contain it.
SPLIT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_]*$"


def ordered_splits(names: Iterable[str]) -> list[str]:
    """Split names in the order people read them, everywhere kiln lists splits:
    train, validation, test, then the others alphabetically."""
    names = set(names)
    usual = [name for name in _USUAL_SPLITS if name in names]
    return usual + sorted(names - set(usual))


_USUAL_SPLITS = ("train", "validation", "test")


def share_text(reached: float, requested: float | None) -> str:
    """``80.4% (asked 80%)``: a split's share of the examples, and the requested one."""
    text = f"{100 * reached:.1f}%"
    if requested is not None:
        text += f" (asked {100 * requested:.4g}%)"
    return text


def shard_filename(
    name: str, split: str, index: int, num_shards: int, compression: str | None = None
) -> str:
    """`<name>-<split>.tfrecord-00000-of-00004`, with `.gz` when gzipped."""
    suffix = ".gz" if compression == "gzip" else ""
    return f"{name}-{split}.tfrecord-{index:05d}-of-{num_shards:05d}{suffix}"


@dataclasses.dataclass
class ShardInfo:
    """One shard file of a split."""

    filename: str
    num_records: int
    num_bytes: int
    sha256: str


@dataclasses.dataclass
class ChannelStatistics:
    """Per-channel statistics of the stored pixels (0..255 scale)."""

    count: int  # pixels per channel that went into the statistics
    mean: list[float]
    std: list[float]


# Bucket edges of the object size histograms: sqrt(box area) in stored
# pixels. COCO's small/medium/large split at 32 and 96.
OBJECT_SIZE_EDGES = [0.0, 8.0, 16.0, 32.0, 64.0, 96.0, 128.0, 256.0, 512.0]


@dataclasses.dataclass
class ClassObjects:
    """The objects of one class in one split, and their sizes.

    A box's size is the square root of its area in stored pixels; the
    statistics are exact whatever order the job merges them in (integer
    counts, a sum of floats in exact rational arithmetic, min and max).

    Attributes:
      count: Objects stored.
      size_min, size_max, size_mean: Of sqrt(area), stored pixels.
      size_histogram: Objects per size bucket: ``[edges[i], edges[i+1])``,
        the last one open-ended (`ObjectStatistics.size_edges`).
    """

    count: int
    size_min: float
    size_max: float
    size_mean: float
    size_histogram: list[int]


@dataclasses.dataclass
class ObjectStatistics:
    """The objects of one split (datasets with ``boxes``).

    Attributes:
      classes: Class name -> `ClassObjects` (every class, zeros included).
      images_without_objects: Stored images with no object.
      dropped: Reason -> objects removed while the image was kept:
        ``min_visibility`` (an offline transform left too little of the box
        in the image), and the bad-annotation reasons under
        ``bad_objects: drop_object``.
      size_edges: The histogram's bucket edges (`OBJECT_SIZE_EDGES`).
      most_objects: The most objects one stored image has (what
        ``max_objects`` must be for the reader to cut none); None in
        datasets written before kiln counted it.
    """

    classes: dict[str, ClassObjects]
    images_without_objects: int
    dropped: dict[str, int]
    size_edges: list[float] = dataclasses.field(default_factory=lambda: list(OBJECT_SIZE_EDGES))
    most_objects: int | None = None

    @property
    def num_objects(self) -> int:
        return sum(c.count for c in self.classes.values())

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ObjectStatistics:
        return cls(
            classes={name: ClassObjects(**value) for name, value in data["classes"].items()},
            images_without_objects=int(data["images_without_objects"]),
            dropped={reason: int(count) for reason, count in data["dropped"].items()},
            size_edges=[float(edge) for edge in data["size_edges"]],
            most_objects=None if data.get("most_objects") is None else int(data["most_objects"]),
        )


@dataclasses.dataclass
class SplitInfo:
    """One split: its shards, counts and pixel statistics.

    ``images_without_classes``: with targets and no ``label``, the images
    that carry no class at all (no labels, no objects, no mask class): the
    negatives of a multi-label or detection dataset, which `class_counts`
    does not show. None for classification datasets (every image has its
    label) and datasets written before kiln counted them.
    """

    name: str
    num_examples: int
    shards: list[ShardInfo]
    class_counts: dict[str, int]
    statistics: ChannelStatistics | None = None
    images_without_classes: int | None = None

    @property
    def filenames(self) -> list[str]:
        return [s.filename for s in self.shards]


def _format_version(value: Any, source: str) -> int:
    """kiln.json's `format_version`: a positive JSON integer. A 0, a negative
    number, a fraction or a boolean was written by no kiln, and read as a
    number it would pass for format 1, whose files have no checksum."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise MetadataError(
        f"{source}: format_version must be a positive integer (this kiln writes "
        f"{kiln.FORMAT_VERSION}), got {json.dumps(value)}"
    )


def _size(value: Any, field: str, source: str) -> list[int]:
    """A ``[height, width]`` of positive JSON integers (`smallest_size`):
    anything else would let `kiln.reader.load` check crops against a size
    no image has."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        return [int(v) for v in value]
    raise MetadataError(
        f"{source}: {field} must be [height, width] of positive integers, got {json.dumps(value)}"
    )


@dataclasses.dataclass
class DatasetInfo:
    """Everything `kiln.json` says about a dataset.

    Attributes:
      name: Dataset name from the config.
      version: Version id (derived from the input, config and processing
        fingerprints, `kiln.pipeline.versioning`).
      kiln_version: Version of kiln that wrote the dataset.
      format_version: `kiln.FORMAT_VERSION` of the writer, a positive integer
        (anything else in kiln.json is refused when it is read).
      config: The resolved build config (all defaults filled in), without
        locations: the output root and the source's location are not part of
        it nor of the version (see `provenance`).
      config_fingerprint: sha256 of the canonical JSON of `config`.
      schema: `kiln.schemas.RECORD.to_json()` of the writer.
      class_names: The class names (``source.classes`` in its order, or the
        names found, sorted); a label is an index into this list.
      encoding: ``{"format": "jpeg"|"png"|"raw", "quality": int|None}``.
      channels: Stored channels (1 or 3).
      image_size: ``[height, width]`` if every stored image has that size,
        else None.
      smallest_size: When the stored images vary in size (`image_size` is
        None): ``[least height, least width]`` over every split, each the
        least of its own (from two images, maybe), so that `kiln.reader.load`
        refuses a crop larger than some image before reading any. None
        (left out of the file) when `image_size` is set, with no image, and
        in datasets written before kiln recorded it.
      compression: None or "gzip".
      splits: Split name -> `SplitInfo`.
      augment: Default augmentation list for the train split.
      duplicates: Number of source files whose content duplicates another's
        (the extra copies: a group of three identical files counts 2).
      dropped: Dropped-file counts by reason.
      errors_sha256: sha256 (hex) of the bytes of ``errors.jsonl``, the
        dropped-files report. None in formats before 2.
      duplicates_sha256: sha256 (hex) of the bytes of ``duplicates.jsonl``,
        the duplicates report (one row per group of identical content).
        None in formats before 2.
      index_sha256: sha256 (hex) of the bytes of ``index.jsonl``, the record
        index (one line per record: where it is, its key and content hash,
        its pixel sums; see `kiln.pipeline.record_index`). None in datasets
        written before kiln wrote it.
      dropped_objects_sha256: sha256 (hex) of the bytes of
        ``dropped_objects.jsonl``, which names every object removed from a
        stored image (`objects`' ``dropped`` counts them; see
        `kiln.pipeline.error_report`). Datasets with boxes only; None (left
        out of the file) otherwise and before kiln wrote it.
      processing: What decides a record's bytes given its source file:
        ``{"version": int, "fingerprint": hex}``, the kiln processing
        version and the processing fingerprint
        (`kiln.pipeline.incremental`), which the version name hashes too;
        with a semantic mask also ``"mask_counts": 1``: its class_counts
        count the classes each mask shows (absent before kiln did); with
        instance masks ``"instance_boxes"``, with a COCO source and keypoints
        ``"coco_keypoints"``, with ``image.jpeg_scaled_decode`` and masks
        ``"reduced_masks"``, with a nearest-neighbour ``resize`` or
        ``letterbox`` ``"nearest_resize"``, with plugins and targets that
        transforms move ``"user_geometry"``, with keypoint flip pairs
        ``"mirrored_keypoints"``: the versions of those parts of kiln's
        processing (`kiln.pipeline.incremental`). An
        incremental build reuses records of a version only if both equal
        its own. None in datasets written before kiln recorded it.
      targets: The resolved ``targets:`` declaration (`TargetsConfig` as
        JSON: kinds, keypoint names, flip pairs, min_visibility,
        ignore_value, field types); None (left out of the file) for a
        classification dataset, whose records carry ``label`` only.
        `schema` is the record schema these targets give.
      objects: Split name -> `ObjectStatistics`, for datasets with boxes;
        None (left out of the file) otherwise.
      provenance: Where the build read from, outside `config`, its
        fingerprint and the version: ``{"source": {"root"|"path": ...,
        "allowed_roots": [...]}}`` (absolute). Builds of the same files from
        two locations give the same version and shards; the published
        version keeps the provenance of the build that first published it.
        Empty in datasets written before kiln recorded it (their `config`
        holds the location).
      checksum: sha256 (hex) of kiln.json's own content, so an edit is
        noticed (format 2 and later; None before). Canonical content: the
        file's JSON object without its ``checksum`` member, serialized with
        keys sorted at every level, no whitespace (separators ``,`` and
        ``:``), non-ASCII characters as themselves and numbers as Python's
        `json` writes them (shortest round-trip floats, ``1.0`` stays a
        float), then UTF-8 encoded:
        `canonical_json` and `content_checksum`. It is computed from the
        parsed object, so the file's indentation and key order do not
        matter, and it covers every member, including any this version of
        kiln does not know. `loads` and `from_json` check it (`dumps` and
        `sealed` set it). It detects edits and damage, not tampering: whoever
        edits the file can recompute it.
    """

    name: str
    version: str
    kiln_version: str
    format_version: int
    config: dict[str, Any]
    config_fingerprint: str
    schema: dict[str, Any]
    class_names: list[str]
    encoding: dict[str, Any]
    channels: int
    image_size: list[int] | None
    compression: str | None
    splits: dict[str, SplitInfo]
    augment: list[Any] = dataclasses.field(default_factory=list)
    duplicates: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    errors_sha256: str | None = None
    duplicates_sha256: str | None = None
    index_sha256: str | None = None
    dropped_objects_sha256: str | None = None
    processing: dict[str, Any] | None = None
    targets: dict[str, Any] | None = None
    objects: dict[str, ObjectStatistics] | None = None
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    smallest_size: list[int] | None = None
    checksum: str | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def objects_dropped(self) -> dict[str, int]:
        """Reason -> objects removed from stored images, over every split
        (`ObjectStatistics.dropped`; ``dropped_objects.jsonl`` names them)."""
        counts: dict[str, int] = {}
        for split in (self.objects or {}).values():
            for reason, count in split.dropped.items():
                counts[reason] = counts.get(reason, 0) + count
        return dict(sorted(counts.items()))

    @property
    def targets_config(self) -> TargetsConfig:
        """The targets the records carry (`CLASSIFICATION` when `targets` is None)."""
        if self.targets is None:
            return CLASSIFICATION
        return TargetsConfig.model_validate(self.targets)

    @property
    def class_count_kinds(self) -> tuple[str, ...]:
        """The targets whose classes ``class_counts`` counts: an image counts
        once for each class it shows over these. Its label; its labels; its
        objects' classes (boxes); the classes its semantic mask shows
        (``mask``, only where `processing` says ``mask_counts``: datasets
        built before kiln counted them do not)."""
        targets = self.targets_config
        kinds = [k for k in ("label", "labels", "boxes") if getattr(targets, k) is not None]
        if targets.mask is not None and (self.processing or {}).get("mask_counts"):
            kinds.append("mask")
        return tuple(kinds)

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            # Keras' subset names ("training") are a common near miss of "train".
            raise MetadataError(
                f"dataset {self.name!r} has no split {name!r}; it has {sorted(self.splits)}"
                f"{did_you_mean(name, self.splits) if isinstance(name, str) else ''}"
            )
        return self.splits[name]

    def split_shares(self) -> dict[str, tuple[float, float | None]]:
        """Per split, in `ordered_splits` order: the fraction of the examples it
        holds, and the fraction the config's ``splits.fractions`` asked for
        (None when the splits come from the source)."""
        total = sum(split.num_examples for split in self.splits.values())
        requested = self.requested_fractions() or {}
        return {
            name: (
                self.splits[name].num_examples / total if total else 0.0,
                requested.get(name),
            )
            for name in ordered_splits(self.splits)
        }

    def requested_fractions(self) -> dict[str, float] | None:
        """The config's ``splits.fractions`` (None: splits from the source)."""
        splits = self.config.get("splits") or {}
        if splits.get("from_source") or not splits.get("fractions"):
            return None
        return {name: float(value) for name, value in splits["fractions"].items()}

    def largest_class_deviation(self) -> float | None:
        """The largest ``|examples of a class in a split - fraction x the
        class's examples|`` over classes and splits, in examples: how far the
        splits are from stratified (``splits.stratify`` keeps it below 1 in a
        fresh build). None when splits come from the source."""
        requested = self.requested_fractions()
        if requested is None:
            return None
        worst = 0.0
        for name in self.class_names:
            size = sum(split.class_counts.get(name, 0) for split in self.splits.values())
            for split_name, fraction in requested.items():
                split = self.splits.get(split_name)
                count = split.class_counts.get(name, 0) if split is not None else 0
                worst = max(worst, abs(count - fraction * size))
        return worst

    @property
    def has_checksum(self) -> bool:
        """Whether this format records `checksum` and the reports' sha256."""
        return self.format_version >= CHECKSUM_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # Left out when absent, so a classification dataset's kiln.json
        # keeps the bytes it had before targets existed.
        for name in ("targets", "objects"):
            if data[name] is None:
                del data[name]
        for objects in (data.get("objects") or {}).values():
            if objects["most_objects"] is None:  # written before kiln counted it
                del objects["most_objects"]
        for split in data["splits"].values():
            if split["images_without_classes"] is None:  # classification, or older
                del split["images_without_classes"]
        if not self.has_checksum:  # older formats: their fields only
            for name in ("errors_sha256", "duplicates_sha256", CHECKSUM_FIELD):
                if data[name] is None:
                    del data[name]
        # Absent before kiln wrote them (and the dropped objects without boxes).
        for name in ("index_sha256", "dropped_objects_sha256", "processing", "smallest_size"):
            if data[name] is None:
                del data[name]
        if not self.provenance:  # written before kiln recorded it
            del data["provenance"]
        return data

    def sealed(self) -> DatasetInfo:
        """This info with `checksum` set to its content's (format 2 and later)."""
        if not self.has_checksum:
            return self
        return dataclasses.replace(self, checksum=content_checksum(self.to_json()))

    def dumps(self) -> str:
        """Canonical JSON text: sorted keys, so identical info gives identical bytes.

        From format 2, with `checksum` computed from the content written, so
        the file always matches its checksum.
        """
        return json.dumps(self.sealed().to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "kiln.json") -> DatasetInfo:
        """The info of a parsed kiln.json.

        Raises:
          MetadataChecksumError: the content does not match its checksum
            (format 2 and later; a file of a newer format than this kiln's is
            not checked here, its checksum may be defined differently: readers
            refuse it, see `kiln.reader.info`).
          MetadataError: naming `source`, when a field is missing or malformed.
        """
        info = cls._from_json(data, source)
        # A checksum is checked wherever there is one, so lowering
        # format_version does not skip it.
        checked = info.has_checksum or info.checksum is not None
        if checked and info.format_version <= kiln.FORMAT_VERSION:
            actual = content_checksum(data)
            if info.checksum != actual:
                raise MetadataChecksumError(source, info.checksum, actual, info)
        return info

    @classmethod
    def _from_json(cls, data: dict[str, Any], source: str) -> DatasetInfo:
        try:
            splits = {}
            for split_name, split in data["splits"].items():
                stats = split.get("statistics")
                splits[split_name] = SplitInfo(
                    name=split["name"],
                    num_examples=int(split["num_examples"]),
                    shards=[ShardInfo(**shard) for shard in split["shards"]],
                    class_counts=dict(split["class_counts"]),
                    statistics=ChannelStatistics(**stats) if stats else None,
                    images_without_classes=(
                        None
                        if split.get("images_without_classes") is None
                        else int(split["images_without_classes"])
                    ),
                )
            fields = {f.name for f in dataclasses.fields(cls)}
            missing = {
                f.name
                for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            } - set(data)
            if missing:
                raise MetadataError(f"{source}: missing field(s) {sorted(missing)}")
            kwargs = {k: v for k, v in data.items() if k in fields}
            kwargs["splits"] = splits
            kwargs["format_version"] = _format_version(data["format_version"], source)
            if data.get("smallest_size") is not None:
                kwargs["smallest_size"] = _size(data["smallest_size"], "smallest_size", source)
            if data.get("objects") is not None:
                kwargs["objects"] = {
                    split: ObjectStatistics.from_json(value)
                    for split, value in data["objects"].items()
                }
            return cls(**kwargs)
        except MetadataError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataError(f"{source}: malformed metadata ({type(e).__name__}: {e})") from e

    @classmethod
    def loads(cls, text: str, source: str = "kiln.json") -> DatasetInfo:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise MetadataError(f"{source}: not valid JSON ({e})") from e
        if not isinstance(data, dict):
            raise MetadataError(f"{source}: expected a JSON object")
        return cls.from_json(data, source)
