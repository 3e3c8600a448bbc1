"""Deterministic sharding: which records go in which shard, in what order.

Every record has a sort key, a 64-bit hash of its stable key. A split with
``n`` shards gives shard ``i`` the hash range ``[i * 2**64 / n, (i+1) * 2**64 / n)``
and each shard is sorted by hash, so reading the shards in order reads the
whole split in hash order (as TFDS does): the global order holds across
shards, and neither the runner, the number of workers nor the listing order
can change a byte. The number of shards per split is fixed in the config or
``ceil(split bytes / target_shard_mb)`` (at most one per record), computed in
the job from the encoded records, so shards come out near the target size.

Shards are written by `WriteShardFn`, not Beam's WriteToTFRecord, which
decides shard contents and order itself. Each shard is written to a unique
temp name and then renamed, so a bundle Beam retries (or runs twice) leaves
exactly one complete, correct file; an interrupted attempt leaves only a
temp file, which the launcher deletes.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import uuid
from typing import Any, Mapping, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from kiln.pipeline import tfrecord
from kiln.schemas import ShardInfo, shard_filename

logger = logging.getLogger(__name__)

_MB = 1 << 20


class ShardedRecord(NamedTuple):
    """A serialized record on its way to a shard."""

    split: str
    sort_key: str   # 16 hex digits: `sort_key(stable key)`
    record: bytes   # serialized tf.train.Example


def sort_key(key: str) -> str:
    """The record's position in the split: first 64 bits of sha256(key), hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def shard_index(sort_key_hex: str, num_shards: int) -> int:
    """The shard whose hash range holds `sort_key_hex`."""
    return (int(sort_key_hex, 16) * num_shards) >> 64


def count_shards(split: str, num_records: int, num_bytes: int,
                 sharding: Mapping[str, Any]) -> int:
    """Shards for a split: fixed by the config, else by the target size.

    Args:
      split: Split name (a fixed count may be given per split).
      num_records: Records in the split.
      num_bytes: Bytes the split's records take in TFRecord framing.
      sharding: The resolved ``sharding`` config.
    """
    fixed = sharding.get("num_shards")
    if isinstance(fixed, Mapping):
        fixed = fixed.get(split)
    if fixed:
        return int(fixed)
    target = float(sharding["target_shard_mb"]) * _MB
    return max(1, min(num_records, math.ceil(num_bytes / target)))


class _HashingWriter:
    """A write-only file wrapper that counts and hashes what passes through."""

    def __init__(self, raw):
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def write(self, data) -> int:
        self._raw.write(data)
        self.sha256.update(data)
        self.num_bytes += len(data)
        return len(data)

    def flush(self) -> None:
        pass  # the raw file is flushed when closed


def write_shard(path: str, temp_path: str, records: list[bytes], compression: str) -> ShardInfo:
    """Writes `records` in order as a TFRecord file at `path`, via `temp_path`.

    Gzip output has a fixed header (no file name, mtime 0), so the bytes are
    deterministic for a given zlib.
    """
    with FileSystems.create(temp_path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        counted = _HashingWriter(raw)
        if compression == "gzip":
            with gzip.GzipFile(filename="", mode="wb", fileobj=counted, mtime=0) as sink:
                for record in records:
                    sink.write(tfrecord.frame(record))
        else:
            for record in records:
                counted.write(tfrecord.frame(record))
    # Rename replaces a file a previous attempt left (same bytes): one file.
    FileSystems.rename([temp_path], [path])
    return ShardInfo(
        filename=path.rsplit("/", 1)[-1],
        num_records=len(records),
        num_bytes=counted.num_bytes,
        sha256=counted.sha256.hexdigest(),
    )


class WriteShardFn(beam.DoFn):
    """((split, index, num_shards), [(sort_key, record) or None]) -> (split, index, ShardInfo).

    None values mark a shard that must exist even if its hash range holds no
    record, so a split always has all its ``-of-N`` files.
    """

    def __init__(self, folder: str, temp_folder: str, name: str, compression: str):
        self._folder = folder
        self._temp_folder = temp_folder
        self._name = name
        self._compression = compression
        self._shards = Metrics.counter("kiln", "shards_written")
        self._records = Metrics.counter("kiln", "records_written")

    def process(self, element):
        (split, index, num_shards), values = element
        ordered = sorted(v for v in values if v is not None)
        filename = shard_filename(
            self._name, split, index, num_shards,
            self._compression if self._compression != "none" else None,
        )
        info = write_shard(
            path=FileSystems.join(self._folder, filename),
            temp_path=FileSystems.join(self._temp_folder, f"{filename}.{uuid.uuid4().hex}"),
            records=[record for _, record in ordered],
            compression=self._compression,
        )
        self._shards.inc()
        self._records.inc(info.num_records)
        yield split, index, info


def _key_by_shard(record: ShardedRecord, num_shards: Mapping[str, int]):
    n = num_shards[record.split]
    return (record.split, shard_index(record.sort_key, n), n), (record.sort_key, record.record)


def _all_shards(split_and_count):
    split, n = split_and_count
    for index in range(n):
        yield (split, index, n), None


class WriteShards(beam.PTransform):
    """Shards, orders and writes the records of every split.

    Input: PCollection[ShardedRecord]. Output: PCollection[(split, index,
    ShardInfo)], one per shard file written to `folder`.

    Args:
      folder: Where the shard files go.
      temp_folder: Where they are written first (same filesystem).
      name: Dataset name, the first part of the file names.
      sharding: The resolved ``sharding`` config.
    """

    def __init__(self, folder: str, temp_folder: str, name: str, sharding: Mapping[str, Any]):
        super().__init__()
        self._folder = folder
        self._temp_folder = temp_folder
        self._name = name
        self._sharding = dict(sharding)

    def expand(self, records):
        sharding = self._sharding
        num_shards = (
            records
            | "MeasureRecords" >> beam.Map(
                lambda r: (r.split, (1, tfrecord.framed_size(len(r.record)))))
            # (split, (1, framed bytes))
            | "SumPerSplit" >> beam.CombinePerKey(beam.combiners.TupleCombineFn(sum, sum))
            # (split, (records, bytes))
            | "CountShards" >> beam.MapTuple(
                lambda split, totals: (split, count_shards(split, totals[0], totals[1], sharding)))
            # (split, num_shards)
        )
        keyed = records | "KeyByShard" >> beam.Map(
            _key_by_shard, num_shards=beam.pvalue.AsDict(num_shards)
        )  # ((split, index, num_shards), (sort_key, record))
        every_shard = num_shards | "ListShards" >> beam.FlatMap(_all_shards)
        # ((split, index, num_shards), None)
        return (
            (keyed, every_shard)
            | "MergeShardMarkers" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            # ((split, index, num_shards), [(sort_key, record) or None])
            | "WriteShardFiles" >> beam.ParDo(WriteShardFn(
                self._folder, self._temp_folder, self._name, sharding["compression"]))
            # (split, index, ShardInfo)
        )
