"""What changed between two versions of a dataset: the library behind `kiln diff`.

`compare` reads two versions (`open_version`: a version folder, or
``<output>/<name>`` for its LATEST) and says, per split and class, which
records were added, removed, changed or moved, how each class's share of the
dataset shifted, how the per-channel mean and std drifted, and the duplicate
and dropped counts before and after. `Thresholds` turn the result into a
verdict a scheduler can stop on (`VersionDiff.violations`).

Records are compared by key and content (the sha256 of the source file). The
counts, shares, statistics and drops come from the two kiln.json files; the
records' keys and hashes, which kiln.json does not carry, from the cheapest
exact place a version has:

1. A shard whose file name and sha256 are the same in both versions, in the
   same split, holds the same records: it is skipped on both sides (when
   both have the same class list, so its label ids name the same classes). Shards
   take fixed hash ranges of a split, so a nightly change of a few percent
   leaves most shards identical and unread.
2. The version's record index (``index.jsonl``, one line per record with its
   split, shard, key, sha256 and class id; checked against kiln.json's
   ``index_sha256``), read line by line without TensorFlow.
3. Otherwise (datasets written before kiln wrote the index) the differing
   shards themselves, through TensorFlow, parsing only the ``key``,
   ``sha256`` and ``label`` features of `kiln.schemas.RECORD`.

Local paths are read with the standard library, so the comparison of two
indexed versions on disk starts without TensorFlow; ``gs://`` paths go
through `tf.io.gfile`, imported only then. Memory: one entry per record of
the old version's differing shards (key, hash, split, class).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from kiln.schemas import location
from kiln.schemas.location import exists, join, open_file, read_buffer_bytes, read_text
from kiln.schemas.metadata import (
    INDEX_FILENAME,
    METADATA_FILENAME,
    DatasetInfo,
    MetadataError,
    SplitInfo,
)

# A bare version id, as `kiln build` names version folders.
_VERSION_ID = re.compile(r"^[0-9a-f]{12}$")
# Classes a build summary names when label ids changed (the count is always given).
_LABEL_IDS_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class Version:
    """One opened version of a dataset.

    Attributes:
      path: The path as given.
      dataset_dir: The version folder.
      info: Its kiln.json (checksum checked).
      index_sha256: kiln.json's ``index_sha256`` (the record index's
        sha256), None if the version has no record index.
    """

    path: str
    dataset_dir: str
    info: DatasetInfo
    index_sha256: str | None = None

    @property
    def version(self) -> str:
        return self.info.version


def _limit(limit: float) -> str:
    """A threshold as the user typed it (``6.3333333``, ``10``)."""
    return f"{limit:.15g}"


def _beyond(value: float, limit: float, sign: str = "") -> str:
    """`value`, which crossed `limit`, with two decimals, or as many more as
    it takes (up to 6) for the line not to read "6.33 ... more than 6.33"."""
    for digits in range(2, 7):
        text = f"{value:{sign}.{digits}f}"
        if abs(float(text)) != abs(float(f"{limit:.{digits}f}")):
            break
    return text


def locate(path: str, relative_to: str | None = None) -> str:
    """The version folder `path` names.

    Args:
      path: A version folder (it holds kiln.json), a dataset folder
        ``<output>/<name>`` (its LATEST names the version), as
        `kiln.schemas.location.locate` finds them, or a bare version id
        (``3f2a9c1b0d4e``) of the dataset `relative_to` belongs to.
      relative_to: Another version folder or dataset folder, for bare ids.

    Raises:
      MetadataError: naming the path, when it is none of these.
    """
    if relative_to is not None and _VERSION_ID.match(path) and not exists(path):
        if _VERSION_ID.match(relative_to) and not exists(relative_to):
            raise MetadataError(
                f"{path} and {relative_to} are both bare version ids: give one of them as a "
                f"folder (the dataset folder <output>/<name>, or a version folder), and the "
                f"other's id is looked up beside it"
            )
        other = location.locate(relative_to)
        candidate = join(other.rstrip("/").rsplit("/", 1)[0], path)
        if exists(join(candidate, METADATA_FILENAME)):
            return candidate
        raise MetadataError(f"{path}: no version {path} beside {other}")
    return location.locate(path)


def open_version(path: str, relative_to: str | None = None) -> Version:
    """Opens the version `path` names (see `locate`) and reads its kiln.json.

    Raises:
      MetadataError: naming the file, if it is missing, malformed or edited.
    """
    dataset_dir = locate(path, relative_to)
    source = join(dataset_dir, METADATA_FILENAME)
    text = read_text(source)
    info = DatasetInfo.loads(text, source)  # checks the checksum
    data = json.loads(text)
    index_sha256 = data.get("index_sha256")
    return Version(str(path), dataset_dir, info, index_sha256 if index_sha256 else None)


# -- the records' identities --


# The class of records that carry no image label (label id -1: a detection
# or segmentation dataset without `label`). Not in any class list: such a
# record counts in its split's totals and in the rows of the classes its
# targets show (`RecordIdentity.counted_in`).
NO_CLASS = ""


def _class_name(names: Sequence[str], label: int) -> str:
    return NO_CLASS if label < 0 else names[label]


class RecordIdentity(NamedTuple):
    """What a record is, for a comparison: its key and content, where it is stored."""

    key: str
    sha256: str
    split: str
    label: str  # the class name; NO_CLASS for a record without an image label
    # A dataset with targets: the record index's ``inputs`` (its annotations
    # and the mask files' content), so an annotation-only edit is a change.
    # None where unknown (classification, or read from the shards).
    annotations: str | None = None
    # A dataset with targets: the names of the classes the image shows (its
    # label, labels, objects' classes and mask classes), the classes whose
    # kiln.json class_counts count it. None: its label only.
    classes: tuple[str, ...] | None = None

    @property
    def counted_in(self) -> tuple[str, ...]:
        """The classes whose rows count this record (as kiln.json's class_counts do)."""
        if self.classes is not None:
            return self.classes
        return () if self.label == NO_CLASS else (self.label,)


def _shard_ids(info: DatasetInfo) -> set[tuple[str, str, str]]:
    return {
        (split.name, shard.filename, shard.sha256)
        for split in info.splits.values()
        for shard in split.shards
    }


def index_problem(version: Version) -> str | None:
    """Why `version`'s record index cannot be read (missing, or not the
    bytes kiln.json records a sha256 of), or None when it can or the version
    has none. One pass over the file: for a caller that must know before it
    uses any of `records`' (which checks the sha256 only at the end)."""
    if version.index_sha256 is None:
        return None
    path = join(version.dataset_dir, INDEX_FILENAME)
    if not exists(path):
        return f"{path} is missing, but kiln.json records its sha256"
    digest = hashlib.sha256()
    with open_file(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != version.index_sha256:
        return (
            f"{path} does not match the sha256 kiln.json records for it "
            f"({version.index_sha256}): it was changed after the build"
        )
    return None


def records(
    version: Version, skip_shards: AbstractSet[tuple[str, str]] = frozenset()
) -> Iterator[RecordIdentity]:
    """Every record of `version` outside `skip_shards` (``(split, filename)``
    pairs), from its record index if it has one, else from its shards.

    Raises:
      MetadataError: the index does not match kiln.json's sha256, or a line
        of it is malformed.
    """
    if version.index_sha256 is not None:
        yield from _records_from_index(version, skip_shards)
    else:
        yield from _records_from_shards(version, skip_shards)


def _records_from_index(
    version: Version, skip_shards: AbstractSet[tuple[str, str]]
) -> Iterator[RecordIdentity]:
    path = join(version.dataset_dir, INDEX_FILENAME)
    if not exists(path):
        raise MetadataError(f"{path} is missing, but kiln.json records its sha256")
    names = version.info.class_names
    with_targets = version.info.targets is not None
    digest = hashlib.sha256()
    number = 0
    with open_file(path, "rb") as f:
        # islice, not readlines(hint): TensorFlow's GFile (gs://) takes no hint.
        while block := list(itertools.islice(f, _INDEX_BLOCK_LINES)):
            for raw in block:
                digest.update(raw)
            for row in _parsed_lines(path, number, block):
                number += 1
                try:
                    split, shard = str(row["split"]), str(row["shard"])
                    if (split, shard) in skip_shards:
                        continue
                    yield RecordIdentity(
                        str(row["key"]),
                        str(row["sha256"]),
                        split,
                        _class_name(names, int(row["label"])),
                        str(row["inputs"]) if with_targets else None,
                        tuple(names[int(c)] for c in row["targets"]["classes"])
                        if with_targets
                        else None,
                    )
                except (KeyError, TypeError, ValueError, IndexError) as e:
                    raise _bad_line(path, number, e) from None
    if digest.hexdigest() != version.index_sha256:
        raise MetadataError(
            f"{path} does not match the sha256 kiln.json records for it "
            f"({version.index_sha256}): it was changed after the build"
        )


# Lines of a record index parsed by one `json.loads` (`_parsed_lines`): a
# third less time than a call per line.
_INDEX_BLOCK_LINES = 1000


def _parsed_lines(path: str, before: int, block: list[bytes]) -> list[Any]:
    """The JSON values of `block`'s lines (lines ``before + 1`` on of
    `path`), parsed as one JSON array; line by line when that fails or does
    not give one value per line (a damaged line), so the error names it."""
    try:
        values = json.loads(b"[" + b",".join(block) + b"]")
        if isinstance(values, list) and len(values) == len(block):
            return values
    except ValueError:
        pass
    values = []
    for number, raw in enumerate(block, start=before + 1):
        try:
            values.append(json.loads(raw))
        except ValueError as e:
            raise _bad_line(path, number, e) from None
    return values


def _bad_line(path: str, number: int, error: Exception) -> MetadataError:
    return MetadataError(
        f"{path}:{number}: not a record index line ({type(error).__name__}: {error})"
    )


def _records_from_shards(
    version: Version, skip_shards: AbstractSet[tuple[str, str]]
) -> Iterator[RecordIdentity]:
    import tensorflow as tf

    from kiln.schemas.features import RECORD

    # A dataset whose targets have no image class (detection, segmentation,
    # multi-label) writes no label: its records are of no class (`NO_CLASS`).
    with_label = version.info.targets_config.label is not None
    names_read = ("key", "sha256", "label") if with_label else ("key", "sha256")
    features = [RECORD.feature(name) for name in names_read]
    spec = {feature.key: feature.parse_spec() for feature in features}
    names = version.info.class_names
    compression = "GZIP" if version.info.compression == "gzip" else ""
    for split in version.info.splits.values():
        files = [
            join(version.dataset_dir, shard.filename)
            for shard in split.shards
            if (split.name, shard.filename) not in skip_shards
        ]
        if not files:
            continue
        batches = tf.data.TFRecordDataset(
            files, compression_type=compression, buffer_size=read_buffer_bytes(files[0])
        ).batch(1024)
        for batch in batches.map(lambda serialized: tf.io.parse_example(serialized, spec)):
            keys, hashes, *read = (batch[feature.key].numpy() for feature in features)
            labels = read[0] if read else [-1] * len(keys)
            for key, content, label in zip(keys, hashes, labels, strict=True):
                yield RecordIdentity(
                    key.decode(), content.decode(), split.name, _class_name(names, int(label))
                )


# -- the comparison --


@dataclasses.dataclass
class CellChange:
    """How one split's records of one class (or all of them) changed.

    ``new == unchanged + changed + added + moved_in`` and
    ``old == unchanged + changed + removed + moved_out``.

    Attributes:
      old: Records in the old version.
      new: Records in the new version.
      added: Keys only the new version has.
      removed: Keys only the old version has.
      changed: Same key, same split and class, other content (sha256).
      moved_in: Keys that were in another split or class in the old version.
      moved_out: Keys that are in another split or class in the new version.
    """

    old: int = 0
    new: int = 0
    added: int = 0
    removed: int = 0
    changed: int = 0
    moved_in: int = 0
    moved_out: int = 0

    @property
    def unchanged(self) -> int:
        return self.new - self.changed - self.added - self.moved_in

    def to_json(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "unchanged": self.unchanged}


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a diff should stop a scheduled job (`kiln diff` flags).

    Attributes:
      max_share_shift: Largest allowed move of a class's share of the
        dataset, in percentage points (None: no limit).
      max_changed_percent: Largest allowed share of the old version's records
        that were added, removed, changed or moved, in percent (None: no
        limit).
      fail_on_vanished_class: A class that had examples and has none now is a
        violation.
      max_object_change: Largest allowed change of a class's object count
        (datasets with boxes), in percent of its old count (None: no limit;
        a class without objects before is not checked).
      fail_on_label_change: A class in both versions whose label id differs
        is a violation (a model trained on the old version would read the
        new one's labels wrongly).
      fail_on_config_change: Build config sections that differ (the
        transforms, the image size, the encoding...: records whose source
        did not change are then stored otherwise) are a violation.
      fail_on_vanished_split: A split that had examples and has none now (a
        source's split folder gone) is a violation: what a share or
        class limit does not see when the classes keep their shares.
      max_split_shrink: Largest allowed loss of a split's records, in
        percent of its old count (None: no limit; a vanished split lost 100).
    """

    max_share_shift: float | None = None
    max_changed_percent: float | None = None
    fail_on_vanished_class: bool = False
    max_object_change: float | None = None
    fail_on_label_change: bool = False
    fail_on_config_change: bool = False
    fail_on_vanished_split: bool = False
    max_split_shrink: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def any(self) -> bool:
        """Whether any threshold is set."""
        return self != Thresholds()


@dataclasses.dataclass
class VersionDiff:
    """The difference between two versions: see `to_json` for its fields."""

    old: Version
    new: Version
    records_from: str  # "identical", "index", "shards", or "index+shards"
    splits: dict[str, CellChange]
    cells: dict[tuple[str, str], CellChange]  # (split, class) -> change

    @property
    def class_names(self) -> list[str]:
        names = list(self.new.info.class_names)
        return names + [name for name in self.old.info.class_names if name not in names]

    @property
    def split_names(self) -> list[str]:
        usual = [name for name in ("train", "validation", "test") if name in self.splits]
        return usual + sorted(set(self.splits) - set(usual))

    def totals(self) -> CellChange:
        total = CellChange()
        for change in self.splits.values():
            _add_to(total, change)
        return total

    @property
    def moved(self) -> int:
        """Records whose key is in both versions, in another split or class."""
        return self.totals().moved_in

    def changed_percent(self) -> float:
        """Added, removed, changed and moved records, in percent of the old version's."""
        totals = self.totals()
        churn = totals.added + totals.removed + totals.changed + totals.moved_in
        if totals.old == 0:
            return 100.0 if churn else 0.0
        return 100.0 * churn / totals.old

    def class_shares(self) -> dict[str, dict[str, float | int]]:
        """Per class: its example count and share of the dataset (percent of
        the examples, which show it) in each version, and the shift in
        percentage points. One image may show several classes (targets), so
        a dataset's shares may add up to more than 100%."""
        old_counts = _class_totals(self.old.info)
        new_counts = _class_totals(self.new.info)
        old_total, new_total = _examples(self.old.info), _examples(self.new.info)
        shares: dict[str, dict[str, float | int]] = {}
        for name in self.class_names:
            old, new = old_counts.get(name, 0), new_counts.get(name, 0)
            old_share = 100.0 * old / old_total if old_total else 0.0
            new_share = 100.0 * new / new_total if new_total else 0.0
            shares[name] = {
                "old": old,
                "new": new,
                "old_share": round(old_share, 4),
                "new_share": round(new_share, 4),
                "shift_points": round(new_share - old_share, 4),
            }
        return shares

    def object_counts(self) -> dict[str, dict[str, Any]] | None:
        """Per class, its objects over every split (datasets with boxes) in
        each version, the change, and the change in percent of the old count
        (None when it had none): what a lost or doubled annotation export
        shows. None when neither version has boxes."""
        if self.old.info.objects is None and self.new.info.objects is None:
            return None
        old_counts, new_counts = _object_totals(self.old.info), _object_totals(self.new.info)
        counts: dict[str, dict[str, Any]] = {}
        for name in self.class_names:
            old, new = old_counts.get(name, 0), new_counts.get(name, 0)
            counts[name] = {
                "old": old,
                "new": new,
                "change": new - old,
                "change_percent": round(100.0 * (new - old) / old, 4) if old else None,
            }
        return counts

    def vanished_classes(self) -> list[str]:
        """Classes with examples in the old version and none in the new."""
        return [
            name for name, share in self.class_shares().items() if share["old"] and not share["new"]
        ]

    def vanished_splits(self) -> list[str]:
        """Splits with examples in the old version and none in the new (or
        no longer there)."""
        return [
            name for name in self.split_names if self.splits[name].old and not self.splits[name].new
        ]

    def label_ids_changed(self) -> list[str]:
        """Classes in both versions whose label id (index in class_names) differs."""
        old = {name: i for i, name in enumerate(self.old.info.class_names)}
        return [
            name
            for i, name in enumerate(self.new.info.class_names)
            if name in old and old[name] != i
        ]

    def config_changes(self) -> list[str]:
        """The build config's sections that differ between the versions
        (``transforms``, ``image``, ``encoding``...), and ``image_size`` when
        the stored size differs; the source's location is provenance, not
        config, so moving the data changes nothing here."""
        old, new = self.old.info, self.new.info
        sections = sorted(
            key
            for key in set(old.config) | set(new.config)
            if old.config.get(key) != new.config.get(key)
        )
        if old.image_size != new.image_size:
            sections.append("image_size")
        return sections

    def statistics_drift(self) -> dict[str, dict[str, Any]]:
        """Per split in both versions with statistics: old and new per-channel
        mean and std (0..255) and their drift (new - old)."""
        drift = {}
        for name in self.split_names:
            old = _split(self.old.info, name)
            new = _split(self.new.info, name)
            if old is None or new is None or old.statistics is None or new.statistics is None:
                continue
            if len(old.statistics.mean) != len(new.statistics.mean):
                continue  # the channels changed: nothing to compare
            drift[name] = {
                "old": {"mean": old.statistics.mean, "std": old.statistics.std},
                "new": {"mean": new.statistics.mean, "std": new.statistics.std},
                "mean_drift": _minus(new.statistics.mean, old.statistics.mean),
                "std_drift": _minus(new.statistics.std, old.statistics.std),
            }
        return drift

    def violations(self, thresholds: Thresholds) -> list[str]:
        """One line per threshold crossed (empty: the new version passes)."""
        found = []
        if thresholds.max_share_shift is not None:
            for name, share in self.class_shares().items():
                shift = float(share["shift_points"])
                if abs(shift) > thresholds.max_share_shift:
                    found.append(
                        f"class {name!r} share moved "
                        f"{_beyond(shift, thresholds.max_share_shift, '+')} points "
                        f"({share['old_share']:.2f}% -> {share['new_share']:.2f}%), "
                        f"more than --max-share-shift {_limit(thresholds.max_share_shift)}"
                    )
        if thresholds.max_changed_percent is not None:
            percent = self.changed_percent()
            if percent > thresholds.max_changed_percent:
                found.append(
                    f"{_beyond(percent, thresholds.max_changed_percent)}% of the records "
                    f"changed (added, removed, changed or moved), more than "
                    f"--max-changed-percent {_limit(thresholds.max_changed_percent)}"
                )
        if thresholds.fail_on_vanished_class:
            for name in self.vanished_classes():
                found.append(f"class {name!r} vanished: it has no example left")
        if thresholds.max_split_shrink is not None:
            for name in self.split_names:
                old, new = self.splits[name].old, self.splits[name].new
                shrink = 100 * (old - new) / old if old else 0.0
                if shrink > thresholds.max_split_shrink:
                    found.append(
                        f"split {name!r} has {new} records, {old} before: it shrank by "
                        f"{_beyond(shrink, thresholds.max_split_shrink)}%, more than "
                        f"--max-split-shrink {_limit(thresholds.max_split_shrink)}%"
                    )
        if thresholds.fail_on_vanished_split:
            for name in self.vanished_splits():
                found.append(
                    f"split {name!r} vanished: it has no example left "
                    f"({self.splits[name].old} before)"
                )
        if thresholds.max_object_change is not None:
            for name, count in (self.object_counts() or {}).items():
                percent = count["change_percent"]
                if percent is not None and abs(percent) > thresholds.max_object_change:
                    found.append(
                        f"class {name!r} has {count['new']} objects, {count['old']} before "
                        f"({_beyond(percent, thresholds.max_object_change, '+')}%), a change "
                        f"of more than --max-object-change {_limit(thresholds.max_object_change)}%"
                    )
        if thresholds.fail_on_label_change:
            old_ids = {name: i for i, name in enumerate(self.old.info.class_names)}
            for name in self.label_ids_changed():
                found.append(
                    f"class {name!r} changed label id, {old_ids[name]} -> "
                    f"{self.new.info.class_names.index(name)}"
                )
        if thresholds.fail_on_config_change:
            changes = self.config_changes()
            if changes:
                found.append(f"the build config changed: {', '.join(changes)}{self._sizes()}")
        return found

    def _sizes(self) -> str:
        old, new = self.old.info.image_size, self.new.info.image_size
        if old == new:
            return ""
        return f" (stored size {size_text(old)} -> {size_text(new)})"

    def to_json(self, thresholds: Thresholds | None = None) -> dict[str, Any]:
        """The diff as JSON-ready data (`kiln diff --json`, `kiln build --report`).

        Fields: ``old`` and ``new`` (path, dataset_dir, name, version,
        num_examples), ``records_from`` (where the records' keys and hashes
        were read: ``identical`` (same version, nothing read), ``index``,
        ``shards``), ``totals`` and ``splits`` (each a `CellChange`; splits
        also have ``classes``: class -> `CellChange`), ``changed_percent``,
        ``classes`` (`class_shares`), ``vanished_classes``,
        ``vanished_splits``,
        ``added_classes`` / ``removed_classes`` (in class_names),
        ``label_ids_changed``, ``config_changes`` (`config_changes`),
        ``image_size`` (old and new), ``statistics`` (`statistics_drift`),
        ``duplicates`` and ``dropped`` (old and new; dropped by reason and
        total), ``objects_dropped`` (the same for objects dropped from stored
        images) and ``objects`` (`object_counts`), both null without boxes,
        and with `thresholds`: ``thresholds`` and ``violations``.
        """
        old_info, new_info = self.old.info, self.new.info
        data: dict[str, Any] = {
            "old": _version_json(self.old),
            "new": _version_json(self.new),
            "records_from": self.records_from,
            "totals": self.totals().to_json(),
            "changed_percent": round(self.changed_percent(), 4),
            "splits": {
                name: {
                    **self.splits[name].to_json(),
                    "classes": {
                        label: self.cells[(name, label)].to_json()
                        for label in self.class_names
                        if (name, label) in self.cells
                    },
                }
                for name in self.split_names
            },
            "classes": self.class_shares(),
            "vanished_classes": self.vanished_classes(),
            "vanished_splits": self.vanished_splits(),
            "added_classes": [n for n in new_info.class_names if n not in old_info.class_names],
            "removed_classes": [n for n in old_info.class_names if n not in new_info.class_names],
            "label_ids_changed": self.label_ids_changed(),
            "config_changes": self.config_changes(),
            "image_size": {"old": old_info.image_size, "new": new_info.image_size},
            "statistics": self.statistics_drift(),
            "duplicates": {"old": old_info.duplicates, "new": new_info.duplicates},
            "dropped": _counts_before_after(old_info.dropped, new_info.dropped),
            "objects": self.object_counts(),
            # Objects removed from stored images (datasets with boxes).
            "objects_dropped": None
            if old_info.objects is None and new_info.objects is None
            else _counts_before_after(old_info.objects_dropped, new_info.objects_dropped),
        }
        if thresholds is not None:
            data["thresholds"] = thresholds.to_json()
            data["violations"] = self.violations(thresholds)
        return data

    def summary_lines(self) -> list[str]:
        """One or two lines for a build's summary: the record changes and
        the largest class-share shift (or that no share moved); then vanished
        splits and classes, label ids changed, config changes, drops, duplicates and the
        train split's mean drift, when any of them moved."""
        totals = self.totals()
        shares = self.class_shares()
        line = (
            f"changes since {self.old.version}: +{totals.added} added, "
            f"-{totals.removed} removed, {totals.changed} changed, "
            f"{totals.moved_in} moved ({self.changed_percent():.1f}% of {totals.old})"
        )
        if shares:
            name, share = max(
                shares.items(), key=lambda item: (abs(float(item[1]["shift_points"])), item[0])
            )
            if float(share["shift_points"]) == 0:
                # Naming the last class by name, "+0.0 points", reads as if it moved.
                line += "; class shares unchanged"
            else:
                line += (
                    f"; largest class-share shift: {name} {share['old_share']:.1f}% -> "
                    f"{share['new_share']:.1f}% ({float(share['shift_points']):+.1f} points)"
                )
        lines = [line]
        details = []
        splits = self.vanished_splits()
        if splits:
            details.append(
                "vanished splits: "
                + ", ".join(f"{name} ({self.splits[name].old} before)" for name in splits)
            )
        vanished = self.vanished_classes()
        if vanished:
            details.append(f"vanished classes: {', '.join(vanished)}")
        moved_ids = self.label_ids_changed()
        if moved_ids:
            # What a model trained on the old version reads wrongly; a class
            # added first in the sorted list moves every id (name a few).
            shown = ", ".join(moved_ids[:_LABEL_IDS_SHOWN])
            more = ", ..." if len(moved_ids) > _LABEL_IDS_SHOWN else ""
            details.append(f"label ids changed: {len(moved_ids)} class(es) ({shown}{more})")
        changes = self.config_changes()
        if changes:
            details.append(f"config changed: {', '.join(changes)}{self._sizes()}")
        old_dropped = sum(self.old.info.dropped.values())
        new_dropped = sum(self.new.info.dropped.values())
        if old_dropped != new_dropped:
            details.append(f"dropped {old_dropped} -> {new_dropped}")
        old_objects = sum(self.old.info.objects_dropped.values())
        new_objects = sum(self.new.info.objects_dropped.values())
        if old_objects != new_objects:
            details.append(f"objects dropped {old_objects} -> {new_objects}")
        if self.old.info.duplicates != self.new.info.duplicates:
            details.append(f"duplicates {self.old.info.duplicates} -> {self.new.info.duplicates}")
        drift = self.statistics_drift()
        if drift:
            name = "train" if "train" in drift else next(iter(drift))
            mean = drift[name]["mean_drift"]
            if any(abs(value) >= 0.005 for value in mean):
                details.append(f"{name} mean drift " + " ".join(f"{value:+.2f}" for value in mean))
        if details:
            lines.append("; ".join(details))
        return lines


def size_text(size: Any) -> str:
    """A stored image size, ``[height, width]`` or None, as ``32x32`` or ``varying``."""
    return "varying" if size is None else "x".join(str(v) for v in size)


def _split(info: DatasetInfo, name: str) -> SplitInfo | None:
    return info.splits.get(name)


def _minus(new: list[float], old: list[float]) -> list[float]:
    return [round(a - b, 6) for a, b in zip(new, old, strict=True)]


def _class_totals(info: DatasetInfo) -> dict[str, int]:
    return {
        name: sum(split.class_counts.get(name, 0) for split in info.splits.values())
        for name in info.class_names
    }


def _counts_before_after(old: Mapping[str, int], new: Mapping[str, int]) -> dict[str, Any]:
    """Counts by reason in both versions, and their totals."""
    return {
        "old": dict(sorted(old.items())),
        "new": dict(sorted(new.items())),
        "old_total": sum(old.values()),
        "new_total": sum(new.values()),
    }


def _object_totals(info: DatasetInfo) -> dict[str, int]:
    return {
        name: sum(split.classes[name].count for split in (info.objects or {}).values())
        for name in info.class_names
    }


def _examples(info: DatasetInfo) -> int:
    return sum(split.num_examples for split in info.splits.values())


def _version_json(version: Version) -> dict[str, Any]:
    return {
        "path": version.path,
        "dataset_dir": version.dataset_dir,
        "name": version.info.name,
        "version": version.version,
        "num_examples": _examples(version.info),
    }


def compare(old: Version, new: Version) -> VersionDiff:
    """The `VersionDiff` from `old` to `new`.

    Reads only the records of shards that differ between the versions (see
    the module docstring for where from).

    Raises:
      MetadataError: a record index does not match its kiln.json.
    """
    splits: dict[str, CellChange] = {}
    cells: dict[tuple[str, str], CellChange] = {}

    def split_cell(split: str) -> CellChange:
        return splits.setdefault(split, CellChange())

    def cell(split: str, label: str) -> CellChange:
        return cells.setdefault((split, label), CellChange())

    # A split counts its records; a class, the records that show it (one
    # image may show several classes, or none).
    for info, field in ((old.info, "old"), (new.info, "new")):
        for split in info.splits.values():
            change = split_cell(split.name)
            setattr(change, field, getattr(change, field) + split.num_examples)
            for label, count in split.class_counts.items():
                change = cell(split.name, label)
                setattr(change, field, getattr(change, field) + count)

    if old.version == new.version:
        records_from = "identical"
    else:
        # Identical shards hold identical records, with the same label ids:
        # the same classes only if the class lists are the same.
        same_classes = old.info.class_names == new.info.class_names
        shared = {
            (split, filename)
            for split, filename, _ in _shard_ids(old.info) & _shard_ids(new.info)
            if same_classes
        }
        sources = {"index" if v.index_sha256 else "shards" for v in (old, new)}
        records_from = "+".join(sorted(sources))
        before = {r.key: r for r in records(old, shared)}
        for record in records(new, shared):
            _count(split_cell, cell, before.pop(record.key, None), record)
        for record in before.values():
            _count(split_cell, cell, record, None)

    return VersionDiff(old, new, records_from, dict(sorted(splits.items())), cells)


def _count(
    split_cell: Callable[[str], CellChange],
    cell: Callable[[str, str], CellChange],
    old: RecordIdentity | None,
    new: RecordIdentity | None,
) -> None:
    """Counts one key's change (`old` or `new` None: added or removed) in its
    split's totals and in the rows of the classes its image shows.

    A record is moved when its split or image label changed (out of the old
    split and class, into the new), else changed when its content or
    annotations did. In a class's row, a record that shows the class on
    one side only (in that split) moved in or out of it; one that shows
    it on both sides counts as changed there when the record changed or
    moved.
    """
    if old is None or new is None:
        kind, record = ("added", new) if old is None else ("removed", old)
        if record is not None:
            _bump(split_cell(record.split), kind)
            for name in record.counted_in:
                _bump(cell(record.split, name), kind)
        return
    moved = (old.split, old.label) != (new.split, new.label)
    changed = old.sha256 != new.sha256 or _annotations_differ(old, new)
    if moved:
        split_cell(new.split).moved_in += 1
        split_cell(old.split).moved_out += 1
    elif changed:
        split_cell(new.split).changed += 1
    before = {(old.split, name) for name in old.counted_in}
    after = {(new.split, name) for name in new.counted_in}
    for place in after - before:
        cell(*place).moved_in += 1
    for place in before - after:
        cell(*place).moved_out += 1
    if moved or changed:
        for place in after & before:
            cell(*place).changed += 1


def _bump(change: CellChange, field: str) -> None:
    setattr(change, field, getattr(change, field) + 1)


def _annotations_differ(old: RecordIdentity, new: RecordIdentity) -> bool:
    """Known on both sides and different (a class whose id moved counts too:
    the annotations name classes by id)."""
    return None not in (old.annotations, new.annotations) and old.annotations != new.annotations


def _add_to(total: CellChange, change: CellChange) -> None:
    for field in dataclasses.fields(CellChange):
        setattr(total, field.name, getattr(total, field.name) + getattr(change, field.name))
