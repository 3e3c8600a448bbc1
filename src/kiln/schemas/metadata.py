"""The dataset metadata file (`kiln.json`) and the names of a dataset's files.

A build writes `kiln.json` last, so its presence marks a complete dataset.
It holds nothing that depends on the wall clock: building the same inputs
with the same config gives the same bytes.

Standard library only (plus `tf.io.gfile` for reading local or gs:// paths).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

METADATA_FILENAME = "kiln.json"
ERRORS_FILENAME = "errors.jsonl"
LATEST_FILENAME = "LATEST"
STAGING_PREFIX = ".staging-"


class MetadataError(ValueError):
    """A dataset folder's metadata is missing, incomplete or malformed."""


def shard_filename(name: str, split: str, index: int, num_shards: int,
                   compression: str | None = None) -> str:
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


@dataclasses.dataclass
class SplitInfo:
    """One split: its shards, counts and pixel statistics."""

    name: str
    num_examples: int
    shards: list[ShardInfo]
    class_counts: dict[str, int]
    statistics: ChannelStatistics | None = None

    @property
    def filenames(self) -> list[str]:
        return [s.filename for s in self.shards]


@dataclasses.dataclass
class DatasetInfo:
    """Everything `kiln.json` says about a dataset.

    Attributes:
      name: Dataset name from the config.
      version: Version id (derived from the input and config fingerprints).
      kiln_version: Version of kiln that wrote the dataset.
      format_version: `kiln.FORMAT_VERSION` of the writer.
      config: The resolved build config (all defaults filled in).
      config_fingerprint: sha256 of the canonical JSON of `config`.
      schema: `kiln.schemas.RECORD.to_json()` of the writer.
      class_names: Sorted class names; a label is an index into this list.
      encoding: ``{"format": "jpeg"|"png"|"raw", "quality": int|None}``.
      channels: Stored channels (1 or 3).
      image_size: ``[height, width]`` if every stored image has that size,
        else None.
      compression: None or "gzip".
      splits: Split name -> `SplitInfo`.
      augment: Default augmentation list for the train split.
      duplicates: Number of source files whose content duplicates another's.
      dropped: Dropped-file counts by reason.
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

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise MetadataError(
                f"dataset {self.name!r} has no split {name!r}; it has {sorted(self.splits)}"
            )
        return self.splits[name]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def dumps(self) -> str:
        """Canonical JSON text: sorted keys, so identical info gives identical bytes."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "kiln.json") -> "DatasetInfo":
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
                )
            fields = {f.name for f in dataclasses.fields(cls)}
            missing = {f.name for f in dataclasses.fields(cls)
                       if f.default is dataclasses.MISSING
                       and f.default_factory is dataclasses.MISSING} - set(data)
            if missing:
                raise MetadataError(f"{source}: missing field(s) {sorted(missing)}")
            kwargs = {k: v for k, v in data.items() if k in fields}
            kwargs["splits"] = splits
            return cls(**kwargs)
        except MetadataError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataError(f"{source}: malformed metadata ({type(e).__name__}: {e})") from e

    @classmethod
    def loads(cls, text: str, source: str = "kiln.json") -> "DatasetInfo":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise MetadataError(f"{source}: not valid JSON ({e})") from e
        if not isinstance(data, dict):
            raise MetadataError(f"{source}: expected a JSON object")
        return cls.from_json(data, source)
