"""Duplicate content: which stored records' source files are identical, and the report of them.

Two input files with the same bytes (a photo saved twice under two names,
or listed twice) become two records. They are kept, like any other record,
but counted in kiln.json (``duplicates``) and listed in
``duplicates.jsonl`` beside the shards, one `DuplicateGroup` per content
stored more than once, sorted by sha256 so the same inputs give the same
bytes. Copies in different splits leak between them (possible only when the
splits come from the source).

The groups are found from the sorted runs' index (`sharding.SpilledRun`:
each record's split, and its source file's sha256 and key), grouped by
content hash into `DUPLICATE_BUCKETS` buckets: a few elements per run,
not one per image, and each bucket small enough for one worker at any
scale (1/64th of the dataset's hashes and keys: ~150 bytes per image).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from kiln.pipeline import storage
from kiln.schemas import DUPLICATES_FILENAME

DUPLICATE_BUCKETS = 64


@dataclasses.dataclass(frozen=True, order=True)
class DuplicateGroup:
    """Records whose source files have identical bytes: one row of duplicates.jsonl.

    Field order is the report's sort order.

    Attributes:
      sha256: The content's sha256 (hex), as in each record's ``sha256``.
      keys: The records' keys, sorted (at least two).
      splits: ``splits[i]`` is the split ``keys[i]`` is stored in.
    """

    sha256: str
    keys: tuple[str, ...]
    splits: tuple[str, ...]

    @property
    def extra_copies(self) -> int:
        """Copies beyond the first (what kiln.json's ``duplicates`` adds up)."""
        return len(self.keys) - 1

    @property
    def across_splits(self) -> bool:
        """Whether the copies are in more than one split (leakage)."""
        return len(set(self.splits)) > 1

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "keys": list(self.keys), "splits": list(self.splits)}


def _sources_by_bucket(run):
    """SpilledRun -> (bucket, ((sha256, key, split), ...)) for each bucket it has content in."""
    buckets: dict[int, list] = {}
    for (split, *_), (content, key) in zip(run.entries, run.contents, strict=True):
        buckets.setdefault(int(content[:8], 16) % DUPLICATE_BUCKETS, []).append(
            (content, key, split)
        )
    for bucket, sources in buckets.items():
        yield bucket, tuple(sources)


def _bucket_groups(bucket_and_parts) -> Iterable[DuplicateGroup]:
    """One bucket's `DuplicateGroup`s: every content stored more than once."""
    _, parts = bucket_and_parts
    copies: dict[str, list[tuple[str, str]]] = {}
    for sources in parts:
        for content, key, split in sources:
            copies.setdefault(content, []).append((key, split))
    for content, stored in copies.items():
        if len(stored) > 1:
            keys, splits = zip(*sorted(stored), strict=True)
            yield DuplicateGroup(content, keys, splits)


class FindDuplicates(beam.PTransform):
    """Sorted runs of stored records (`sharding.SpilledRun` with their
    ``contents``) -> one `DuplicateGroup` per content that more than one
    record was stored from (none for no runs or no duplicates). Groups by
    content hash, so it scales with the data (unlike a set held in one
    accumulator)."""

    def expand(self, runs):
        return (
            runs
            | "SourcesByBucket" >> beam.FlatMap(_sources_by_bucket)
            # (bucket, ((sha256, key, split), ...)) per run
            | "GatherCopies" >> beam.GroupByKey()
            # (bucket, [((sha256, key, split), ...)])
            | "Groups" >> beam.FlatMap(_bucket_groups)
            # DuplicateGroup
        )


def render(groups: Iterable[DuplicateGroup]) -> bytes:
    """The bytes of duplicates.jsonl: groups sorted, one canonical JSON object per line."""
    lines = [
        json.dumps(group.to_json(), sort_keys=True, ensure_ascii=False) + "\n"
        for group in sorted(groups)
    ]
    return "".join(lines).encode("utf-8")


def write_duplicate_report(folder: str, groups: Iterable[DuplicateGroup]) -> str:
    """Writes ``<folder>/duplicates.jsonl`` (an empty file for no groups);
    returns its sha256 (hex), which kiln.json records.

    The job calls it once, in its last step, with every group gathered
    there: one row per duplicated content, not per image.
    """
    data = render(groups)
    with storage.create(FileSystems.join(folder, DUPLICATES_FILENAME)) as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()
