"""What a built dataset holds, as a readable summary or JSON: the library behind `kiln inspect`.

Reads only the metadata a build wrote (`kiln.json`, `errors.jsonl`,
`duplicates.jsonl`, `dropped_objects.jsonl`; the rows of the last three
are streamed, by `write_json` and `render` alike) through
`kiln.reader`'s path resolution, so it works on local and gs:// paths and
in a reader-only install (TensorFlow and NumPy; no Beam, no OpenCV). No
shard is opened: `kiln verify` checks the shards against the metadata.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from collections.abc import Iterable, Iterator
from typing import Any

from kiln import console
from kiln.reader import info as read_info
from kiln.schemas import (
    DROPPED_OBJECTS_FILENAME,
    DUPLICATES_FILENAME,
    ERRORS_FILENAME,
    DatasetInfo,
    MetadataError,
    ordered_splits,
    share_text,
)
from kiln.schemas.leftovers import leftovers
from kiln.schemas.location import exists, incomplete_versions, is_remote, join, locate, open_file
from kiln.schemas.tfds_metadata import missing_tfds_files, tfds_files, unsupported_reason

# Rows of errors.jsonl shown per drop reason, and of duplicates.jsonl, in the
# text summary (JSON has all).
EXAMPLES_PER_REASON = 3
DUPLICATE_EXAMPLES = 3


@dataclasses.dataclass(frozen=True)
class ReportRows:
    """The rows of a report file of a version (errors.jsonl,
    duplicates.jsonl, dropped_object.jsonl), read from the file a row at a
    time each time it is iterated: memory does not grow with the rows.

    Raises (when iterated):
      MetadataError: naming the line that is not a JSON object.
    """

    path: str

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter_jsonl(self.path)


def inspect_dataset(path: str, stream: bool = False) -> dict[str, Any]:
    """The summary of the dataset at `path`, as JSON-ready data.

    Args:
      path: A version folder, or ``<output>/<name>`` (follows LATEST), as
        `kiln.reader.locate` accepts.
      stream: Give ``errors``, ``duplicate_groups`` and ``dropped_objects``
        as `ReportRows`, which read their file again each time they are
        iterated, instead of lists: for `write_json` and `render`, whose
        memory then does not grow with the rows. Every row is read once here all the same
        (for the ``warnings``), so a bad line raises before anything is
        written.

    Returns:
      A dict with: ``path`` (as given), ``dataset_dir`` (the version folder),
      ``name``, ``version``, ``kiln_version``, ``format_version``,
      ``config_fingerprint``, ``source``, ``encoding`` (format, quality,
      channels, image_size, smallest_size, compression), ``splits`` (per split: examples,
      shards, bytes, each shard's file, records and bytes, class counts,
      statistics), ``class_names``, ``class_counts`` (over all splits),
      ``transforms``, ``augment``, ``dropped`` (reason -> count, from
      kiln.json), ``errors`` (every errors.jsonl row, or None if the file is
      missing), ``duplicates`` (extra copies, from kiln.json),
      ``duplicate_groups`` (every duplicates.jsonl row: ``sha256``, ``keys``
      sorted, ``splits`` (the split of each key); None if the file is
      missing, as in datasets of format 1), ``tfds`` (whether TFDS metadata
      is present, every file of it), ``tfds_unsupported`` (without it: why
      TFDS cannot read the dataset, a file of it missing included, or None:
      a build older than kiln's TFDS metadata),
      ``targets`` (the declared targets from kiln.json, None for a
      classification dataset), ``objects`` (per split: per class object
      count and size statistics, images without objects, objects dropped
      by reason; None without boxes) and ``warnings`` (inconsistencies
      found between the files), ``incomplete_versions`` (when `path` is
      the dataset folder: its version folders without kiln.json, which the
      next build deletes; `kiln.schemas.location.incomplete_versions`),
      ``staging_folders`` (when `path` is the dataset folder: the staging
      folders in it, each with ``path``, ``num_files``, ``num_bytes`` and
      ``modified``, a Unix time) and ``lock`` (when there are any: whether
      a build holds the dataset's lock now, ``held``, ``text`` and
      ``holder``, else None; `kiln.schemas.leftovers`).

    Raises:
      MetadataError: naming the path, if it is not a complete kiln dataset.
    """
    dataset_dir = locate(path)
    metadata = read_info(dataset_dir)
    tfds, tfds_unsupported = _tfds_readable(dataset_dir, metadata)
    rows = report_rows if stream else read_jsonl
    errors = rows(join(dataset_dir, ERRORS_FILENAME))
    duplicate_groups = rows(join(dataset_dir, DUPLICATES_FILENAME))
    dropped_objects = rows(join(dataset_dir, DROPPED_OBJECTS_FILENAME))
    splits = {}
    shares = metadata.split_shares()
    for name in split_order(metadata):
        split = metadata.splits[name]
        splits[name] = {
            "num_examples": split.num_examples,
            "share": shares[name][0],
            "requested_share": shares[name][1],
            "num_shards": len(split.shards),
            "num_bytes": sum(shard.num_bytes for shard in split.shards),
            "shards": [
                {"filename": s.filename, "num_records": s.num_records, "num_bytes": s.num_bytes}
                for s in split.shards
            ],
            "class_counts": dict(split.class_counts),
            "images_without_classes": split.images_without_classes,
            "statistics": None
            if split.statistics is None
            else {
                "pixels": split.statistics.count,
                "mean": list(split.statistics.mean),
                "std": list(split.statistics.std),
            },
        }
    class_counts = {
        name: sum(split.class_counts.get(name, 0) for split in metadata.splits.values())
        for name in metadata.class_names
    }
    return {
        "path": str(path),
        "dataset_dir": dataset_dir,
        "name": metadata.name,
        "version": metadata.version,
        "kiln_version": metadata.kiln_version,
        "format_version": metadata.format_version,
        "config_fingerprint": metadata.config_fingerprint,
        # The location is provenance (older datasets kept it in the config).
        "source": _source_with_location(
            metadata.config.get("source") or {}, metadata.provenance.get("source", {})
        ),
        "encoding": {
            "format": metadata.encoding.get("format"),
            "quality": metadata.encoding.get("quality"),
            "channels": metadata.channels,
            "image_size": metadata.image_size,
            "smallest_size": metadata.smallest_size,
            "compression": metadata.compression,
        },
        "splits": splits,
        "class_names": list(metadata.class_names),
        "class_counts": class_counts,
        "transforms": metadata.config.get("transforms", []),
        "augment": list(metadata.augment),
        "stratified": bool((metadata.config.get("splits") or {}).get("stratify")),
        "largest_class_deviation": metadata.largest_class_deviation(),
        "dropped": dict(sorted(metadata.dropped.items())),
        "errors": errors,
        "duplicates": metadata.duplicates,
        "duplicate_groups": duplicate_groups,
        "tfds": tfds,
        "tfds_unsupported": tfds_unsupported,
        "targets": metadata.targets,
        "objects": None
        if metadata.objects is None
        else {
            name: dataclasses.asdict(metadata.objects[name])
            for name in split_order(metadata)
            if name in metadata.objects
        },
        "dropped_objects": dropped_objects,
        "incomplete_versions": incomplete_versions(path),
        **leftovers(path).to_json(),
        "warnings": (
            consistency_warnings(metadata, errors)
            + duplicate_warnings(metadata, duplicate_groups)
            + dropped_object_warnings(metadata, dropped_objects)
        ),
    }


def _tfds_readable(dataset_dir: str, metadata: DatasetInfo) -> tuple[bool, str | None]:
    """Whether the version has its TFDS metadata (all of it: TFDS cannot read
    it without any one file), and if not, why TFDS cannot read it (None: a
    build older than kiln's TFDS metadata, which wrote none)."""
    reason = unsupported_reason(metadata)
    if reason is not None:
        return False, reason
    missing = missing_tfds_files(tfds_files(metadata), lambda name: exists(join(dataset_dir, name)))
    if missing is None:
        return False, None
    if not missing:
        return True, None
    return False, (
        f"{', '.join(missing)} missing beside the other TFDS files (kiln build --rehash "
        f"with the build's config writes it again)"
    )


def split_order(metadata: DatasetInfo) -> list[str]:
    """Split names in the order people read them: train, validation, test, then the rest."""
    return ordered_splits(metadata.splits)


def read_jsonl(path: str) -> list[dict[str, Any]] | None:
    """The rows of a report file (errors.jsonl, duplicates.jsonl), or None if it does not exist.

    Raises:
      MetadataError: naming the line that is not a JSON object.
    """
    return list(iter_jsonl(path)) if exists(path) else None


def report_rows(path: str) -> ReportRows | None:
    """`read_jsonl`'s rows as `ReportRows` (read as they are iterated), or
    None if the file does not exist."""
    return ReportRows(path) if exists(path) else None


def iter_jsonl(path: str) -> Iterator[dict[str, Any]]:
    """The rows of an existing report file, read one line at a time.

    Raises:
      MetadataError: naming the line that is not a JSON object.
    """
    with open_file(path, "rb") as f:
        # Lines end at b"\n" only (not at U+2028 and friends, which a JSON
        # string may hold, as str.splitlines would).
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise MetadataError(f"{path}:{number}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise MetadataError(f"{path}:{number}: expected a JSON object per line")
            yield row


def write_json(summary: dict[str, Any], out: console.Writer) -> None:
    """Writes `summary` to `out` as ``json.dump(summary, out, indent=2,
    sort_keys=True)`` does, character for character, with the rows of its
    `ReportRows` values (`inspect_dataset` with ``stream=True``) written
    as they are read: one row in memory at a time."""
    out.write("{")
    for index, key in enumerate(sorted(summary)):
        out.write(("," if index else "") + "\n  " + json.dumps(key) + ": ")
        value = summary[key]
        if isinstance(value, ReportRows):
            _write_rows(value, out)
        else:
            out.write(_nested(json.dumps(value, indent=2, sort_keys=True), "  "))
    out.write("\n}" if summary else "}")


def _write_rows(rows: Iterable[dict[str, Any]], out: console.Writer) -> None:
    """A list of rows at the summary's second level, as `json.dump` indents it."""
    empty = True
    for row in rows:
        out.write(("[" if empty else ",") + "\n    ")
        out.write(_nested(json.dumps(row, indent=2, sort_keys=True), "    "))
        empty = False
    out.write("[]" if empty else "\n  ]")


def _nested(text: str, indent: str) -> str:
    """`json.dumps` output moved in by `indent` (a JSON string holds no raw newline)."""
    return text.replace("\n", "\n" + indent)


def consistency_warnings(metadata: DatasetInfo, errors: Iterable[dict] | None) -> list[str]:
    """Where errors.jsonl (rows from `read_jsonl`) and kiln.json's drop counts disagree."""
    warnings = []
    if errors is None:
        if metadata.dropped:
            warnings.append(
                f"{ERRORS_FILENAME} is missing, but kiln.json counts "
                f"{sum(metadata.dropped.values())} dropped file(s)"
            )
        return warnings
    from_rows: dict[str, int] = {}
    for row in errors:
        reason = str(row.get("reason"))
        from_rows[reason] = from_rows.get(reason, 0) + 1
    if from_rows != metadata.dropped:
        warnings.append(
            f"{ERRORS_FILENAME} has {dict(sorted(from_rows.items()))} dropped "
            f"by reason, kiln.json says {dict(sorted(metadata.dropped.items()))}"
        )
    return warnings


def duplicate_warnings(metadata: DatasetInfo, groups: Iterable[dict] | None) -> list[str]:
    """Where duplicates.jsonl (rows from `read_jsonl`) and kiln.json's
    ``duplicates`` count disagree."""
    if groups is None:
        if metadata.duplicates_sha256 is not None:
            return [f"{DUPLICATES_FILENAME} is missing, but kiln.json records its sha256"]
        return []  # format 1 wrote no duplicates report
    extra = count = 0
    for group in groups:
        count += 1
        if isinstance(group.get("keys"), list) and group["keys"]:
            extra += len(group["keys"]) - 1
    if extra != metadata.duplicates:
        return [
            f"{DUPLICATES_FILENAME} lists {extra} extra copies in {count} group(s), "
            f"kiln.json counts {metadata.duplicates}"
        ]
    return []


def dropped_object_warnings(metadata: DatasetInfo, rows: Iterable[dict] | None) -> list[str]:
    """Where dropped_objects.jsonl (rows from `read_jsonl`) and kiln.json's
    per-split counts of dropped objects (``objects.<split>.dropped``) disagree."""
    if rows is None:
        if metadata.dropped_objects_sha256 is not None:
            return [f"{DROPPED_OBJECTS_FILENAME} is missing, but kiln.json records its sha256"]
        return []  # no boxes, or built before kiln wrote it
    from_rows: dict[str, dict[str, int]] = {}
    for row in rows:
        counts = from_rows.setdefault(str(row.get("split")), {})
        reason = str(row.get("reason"))
        counts[reason] = counts.get(reason, 0) + 1
    stated = {
        split: dict(objects.dropped)
        for split, objects in (metadata.objects or {}).items()
        if objects.dropped
    }
    if from_rows == stated:
        return []
    return [
        f"{DROPPED_OBJECTS_FILENAME} has {_sorted_counts(from_rows)} dropped objects by split "
        f"and reason, kiln.json says {_sorted_counts(stated)}"
    ]


def _sorted_counts(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {split: dict(sorted(c.items())) for split, c in sorted(counts.items())}


# --- text -----------------------------------------------------------------------------


def render(summary: dict[str, Any]) -> str:
    """The readable multi-line summary `kiln inspect` prints."""
    lines = [
        f"{summary['name']}  version {summary['version']}  "
        f"(kiln {summary['kiln_version']}, format {summary['format_version']})"
    ]
    encoding = summary["encoding"]
    if encoding["image_size"] is not None:
        size = "x".join(str(v) for v in encoding["image_size"])
    elif encoding.get("smallest_size") is not None:
        height, width = encoding["smallest_size"]
        size = f"varying sizes (least height {height}, least width {width})"
    else:
        size = "varying sizes"
    stored = encoding["format"] + (
        f" quality {encoding['quality']}" if encoding["quality"] is not None else ""
    )
    lines += [
        f"  folder:    {summary['dataset_dir']}",
        f"  source:    {_source_text(summary['source'])}",
        f"  stored as: {stored}, {encoding['channels']} channel(s), {size}, "
        f"{encoding['compression'] or 'uncompressed'} shards",
        f"  config:    fingerprint {summary['config_fingerprint'][:16]}",
        "",
    ]
    lines += _splits_table(summary["splits"])
    if summary["largest_class_deviation"] is not None:
        # Without stratify the gap is chance, not a fault: say so, and what balances it.
        how = "stratified" if summary["stratified"] else "split by hash, not stratified"
        lines.append(
            f"  {how}: every class within {summary['largest_class_deviation']:.2f} examples "
            f"of its share per split"
            + ("" if summary["stratified"] else " (splits.stratify: true balances them)")
        )
    lines.append("")
    lines += _classes_table(summary)
    lines.append("")
    lines += _target_lines(summary)
    lines += _statistics_lines(summary["splits"])
    lines.append("")
    lines.append("offline transforms (applied once, at build time):")
    lines += [f"  - {_op_text(spec)}" for spec in summary["transforms"]] or ["  (none)"]
    lines.append("default augmentation (random, every epoch, train split; kiln.reader):")
    lines += [f"  - {_op_text(spec)}" for spec in summary["augment"]] or ["  (none)"]
    lines.append("")
    lines += _dropped_lines(summary)
    lines += _duplicate_lines(summary)
    lines.append(
        "TFDS: "
        + (
            # The version folder itself: TFDS does not follow LATEST, so the
            # <output>/<name> a user just inspected is the folder it cannot read.
            f"readable with tfds.builder_from_directory({summary['dataset_dir']!r})"
            if summary["tfds"]
            else f"not readable: {summary['tfds_unsupported']}"
            if summary.get("tfds_unsupported")
            else "no TFDS metadata (built by a kiln older than its TFDS support)"
        )
    )
    incomplete = summary.get("incomplete_versions")
    if incomplete:
        lines.append(incomplete_versions_line(incomplete))
    lines += staging_lines(summary.get("staging_folders") or [], summary.get("lock"))
    for warning in summary["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def incomplete_versions_line(folders: list[str]) -> str:
    """The line `kiln inspect` and `kiln verify` print about a dataset
    folder's incomplete version folders (`incomplete_versions`)."""
    return (
        f"incomplete version folder(s), no kiln.json (left by an interrupted build or "
        f"prune; never read; the next kiln build deletes them): {', '.join(folders)}"
    )


def staging_lines(
    folders: list[dict[str, Any]], lock: dict[str, Any] | None, now: float | None = None
) -> list[str]:
    """The lines `kiln inspect` and `kiln verify` print about a dataset
    folder's staging folders (`Leftovers.to_json`): one per folder, with its
    size and age, then whether a build holds the lock and what to do."""
    if not folders:
        return []
    now = time.time() if now is None else now
    lines = ["staging folder(s) of builds that did not finish (never read):"]
    for folder in folders:
        age = _age_text(now - folder["modified"])
        lines.append(
            f"  {folder['path']}  {folder['num_files']} file(s), "
            f"{_bytes_text(folder['num_bytes'])}, last written {age} ago"
        )
    held = None if lock is None else lock["held"]
    state = "" if lock is None else lock["text"]
    if held:
        lines.append(
            f"  {state}; leave them: it deletes those of earlier builds itself, its own "
            f"when it ends"
        )
        return lines
    remove = _remove_command([folder["path"] for folder in folders])
    who = (
        f"{state}: left by a build that was killed, or kept for its errors.jsonl by one that "
        f"dropped too many files"
        if held is False
        else f"{state}; if no build of the dataset is running, they were left by one that was "
        f"killed, or kept for its errors.jsonl by one that dropped too many files"
    )
    lines.append(
        f"  {who}. The next kiln build of the dataset deletes them; to free the space now, "
        f"while no build runs: {remove}"
    )
    return lines


def _remove_command(folders: list[str]) -> str:
    """The shell command that deletes these staging folders (by name: a
    pattern would match a build that starts meanwhile)."""
    paths = " ".join(shlex.quote(path) for path in folders)
    if not is_remote(folders[0]):
        return f"rm -r {paths}"
    if folders[0].startswith("gs://"):
        return f"gcloud storage rm -r {paths}"
    return f"delete {paths}"


def _age_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 5 min``, ``2 days 4 h``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} day{'s' if days > 1 else ''} {hours} h"


def _target_lines(summary: dict[str, Any]) -> list[str]:
    """The declared targets and, with boxes, objects per class and their sizes."""
    targets = summary.get("targets")
    if not targets:
        return []
    kinds = [
        kind
        for kind in ("label", "labels", "boxes", "mask", "instance_masks", "keypoints")
        if targets.get(kind) is not None
    ]
    if targets.get("extra"):
        kinds.append("extra (" + ", ".join(sorted(targets["extra"])) + ")")
    lines = [f"targets: {', '.join(kinds)}; bad objects: {targets.get('bad_objects')}"]
    objects = summary.get("objects")
    if not objects:
        return [*lines, ""]
    edges = next(iter(objects.values()))["size_edges"]
    width = max([len("class")] + [console.width(name) for name in summary["class_names"]])
    lines.append(
        f"  {'class':<{width}}  {'objects':>8}  {'size mean':>9}  {'min':>6}  {'max':>6}  "
        f"sizes (sqrt(area), stored pixels) from {', '.join(f'{e:g}' for e in edges)}"
    )
    for name in summary["class_names"]:
        entries = [split["classes"].get(name) for split in objects.values()]
        entries = [e for e in entries if e and e["count"]]
        count = sum(e["count"] for e in entries)
        if not count:
            lines.append(f"  {console.pad(name, width)}  {0:>8}")
            continue
        mean = sum(e["size_mean"] * e["count"] for e in entries) / count
        histogram = [sum(e["size_histogram"][i] for e in entries) for i in range(len(edges))]
        lines.append(
            f"  {console.pad(name, width)}  {count:>8}  {mean:>9.1f}  "
            f"{min(e['size_min'] for e in entries):>6.1f}  "
            f"{max(e['size_max'] for e in entries):>6.1f}  {histogram}"
        )
    for split_name, split in objects.items():
        dropped = ", ".join(f"{reason} {n}" for reason, n in split["dropped"].items())
        most = split.get("most_objects")
        lines.append(
            f"  {split_name}: {split['images_without_objects']} image(s) without objects"
            + ("" if most is None else f", at most {most} in one image")
            + (f"; objects dropped: {dropped}" if dropped else "")
        )
    return [*lines, *_dropped_object_lines(summary), ""]


def _dropped_object_lines(summary: dict[str, Any]) -> list[str]:
    """Examples of the objects removed from stored images, per reason."""
    counts, examples = _examples_by_reason(summary.get("dropped_objects") or ())
    if not counts:
        return []
    lines = [f"  objects dropped from stored images (rows in {DROPPED_OBJECTS_FILENAME}):"]
    for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"    {reason}  {count}")
        for row in examples[reason]:
            lines.append(f"      {row.get('key')} ({row.get('split')}): {row.get('message')}")
        if count > EXAMPLES_PER_REASON:
            lines.append(f"      ... {count - EXAMPLES_PER_REASON} more")
    return lines


def _examples_by_reason(
    rows: Iterable[dict[str, Any]],
) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]]]:
    """The rows counted by ``reason``, and the first `EXAMPLES_PER_REASON`
    of each in the order of their keys' numbers (``m.csv:6`` before
    ``m.csv:16``: the file sorts keys as text), a key's dropped objects in
    their order (``objects[1]`` before ``objects[3]``): one pass, holding no more
    rows than that (the rows may be `ReportRows`, read from their file as
    they are iterated)."""
    counts: dict[str, int] = {}
    kept: dict[str, list[tuple[tuple[list[tuple[int, Any]], int], dict[str, Any]]]] = {}
    for row in rows:
        reason = str(row.get("reason"))
        counts[reason] = counts.get(reason, 0) + 1
        shown = kept.setdefault(reason, [])
        key = (_natural_key(str(row.get("key"))), _object_index(row))
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append((key, row))
            continue
        last = max(range(len(shown)), key=lambda i: shown[i][0])
        if key < shown[last][0]:
            shown[last] = (key, row)
    examples = {
        reason: [row for _, row in sorted(shown, key=lambda entry: entry[0])]
        for reason, shown in kept.items()
    }
    return counts, examples


def _object_index(row: dict[str, Any]) -> int:
    """A dropped_objects.jsonl row's ``object`` (-1 for none: a row of an
    earlier kiln, or of errors.jsonl)."""
    index = row.get("object")
    return index if isinstance(index, int) and not isinstance(index, bool) else -1


def _natural_key(key: str) -> list[tuple[int, Any]]:
    """``m.csv:16`` as ``[(1, "m.csv:"), (0, 16)]``: numbers compare as numbers."""
    return [
        (0, int(part)) if part.isdecimal() else (1, part)
        for part in re.split(r"(\d+)", key)
        if part
    ]


def _source_with_location(config: dict[str, Any], location: dict[str, Any]) -> dict[str, Any]:
    """The source as configured, with where it was read from: a coco source's
    parts each with its split (config) and its files (provenance)."""
    source = {**config, **location}
    parts, located = config.get("parts"), location.get("parts")
    if isinstance(parts, list) and isinstance(located, list) and len(parts) == len(located):
        source["parts"] = [
            {**part, **where} if isinstance(part, dict) and isinstance(where, dict) else where
            for part, where in zip(parts, located, strict=True)
        ]
    return source


def _source_text(source: dict[str, Any] | None) -> str:
    if not source:
        return "(unknown)"
    location = source.get("root") or source.get("path")
    if location is None and source.get("annotations"):  # coco, voc: where each part is
        location = f"{source['annotations']} (images in {source.get('images')})"
    if location is None and isinstance(source.get("parts"), list):  # coco, one file per split
        location = ", ".join(
            f"{part.get('annotations')} (images in {part.get('images')}"
            + (f", split {part['split']})" if part.get("split") else ")")
            for part in source["parts"]
            if isinstance(part, dict)
        )
    return f"{source.get('type')} {location or ''}".rstrip()


def _splits_table(splits: dict[str, Any]) -> list[str]:
    width = max([len("total")] + [len(name) for name in splits])
    shares = {
        name: share_text(split["share"], split["requested_share"]) for name, split in splits.items()
    }
    share_width = max([len("share")] + [len(text) for text in shares.values()])
    lines = [
        f"  {'split':<{width}}  {'examples':>8}  {'shards':>6}  {'share':<{share_width}}  "
        f"{'size':>10}  shard sizes"
    ]
    for name, split in splits.items():
        sizes = [shard["num_bytes"] for shard in split["shards"]]
        spread = (
            (
                _bytes_text(sizes[0])
                if len(set(sizes)) == 1
                else f"{_bytes_text(min(sizes))} .. {_bytes_text(max(sizes))}"
            )
            if sizes
            else "-"
        )
        lines.append(
            f"  {name:<{width}}  {split['num_examples']:>8}  {split['num_shards']:>6}  "
            f"{shares[name]:<{share_width}}  {_bytes_text(split['num_bytes']):>10}  {spread}"
        )
    lines.append(
        f"  {'total':<{width}}  {sum(s['num_examples'] for s in splits.values()):>8}  "
        f"{sum(s['num_shards'] for s in splits.values()):>6}  {'':<{share_width}}  "
        f"{_bytes_text(sum(s['num_bytes'] for s in splits.values())):>10}"
    )
    return lines


def _classes_table(summary: dict[str, Any]) -> list[str]:
    splits = summary["splits"]
    names = summary["class_names"]
    title = f"classes ({len(names)})"
    without = [splits[split]["images_without_classes"] for split in splits]
    # The images no class row counts: a multi-label or detection dataset's negatives.
    no_class = "(no class)" if any(count is not None for count in without) else ""
    width = max(
        [len(title) - 2, len(no_class), len("total")] + [console.width(name) for name in names]
    )
    columns = list(splits) + ["total"]
    widths = [max(len(column), 6) for column in columns]
    header = "  ".join(f"{column:>{w}}" for column, w in zip(columns, widths, strict=True))
    lines = [f"{title:<{width + 2}}  {header}"]
    for label, name in enumerate(names):
        counts = [splits[split]["class_counts"].get(name, 0) for split in splits]
        counts.append(summary["class_counts"][name])
        cells = "  ".join(f"{count:>{w}}" for count, w in zip(counts, widths, strict=True))
        lines.append(f"  {console.pad(name, width)}  {cells}  (label {label})")
    if no_class:
        counts = [count or 0 for count in without]
        counts.append(sum(counts))
        cells = "  ".join(f"{count:>{w}}" for count, w in zip(counts, widths, strict=True))
        lines.append(f"  {no_class:<{width}}  {cells}  (images with no class)")
    return lines


def _statistics_lines(splits: dict[str, Any]) -> list[str]:
    lines = ["pixel statistics per channel (0..255 scale; normalize=True uses train's):"]
    width = max(len(name) for name in splits) if splits else 0
    for name, split in splits.items():
        stats = split["statistics"]
        if stats is None:
            lines.append(f"  {name:<{width}}  (none)")
            continue
        mean = " ".join(f"{v:6.2f}" for v in stats["mean"])
        std = " ".join(f"{v:6.2f}" for v in stats["std"])
        lines.append(f"  {name:<{width}}  mean {mean}   std {std}")
    return lines


def _dropped_lines(summary: dict[str, Any]) -> list[str]:
    dropped = summary["dropped"]
    total = sum(dropped.values())
    if not total:
        return ["dropped: 0"]
    lines = [f"dropped: {total} file(s), by reason (rows in {ERRORS_FILENAME}):"]
    examples = _examples_by_reason(summary["errors"] or ())[1]
    width = max(len(reason) for reason in dropped)
    for reason, count in sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {reason:<{width}}  {count:>5}")
        shown = examples.get(reason, [])
        for row in shown:
            lines.append(f"      {row.get('key')}: {row.get('message')}")
        if count > len(shown) and shown:
            lines.append(f"      ... {count - len(shown)} more")
    return lines


def _duplicate_lines(summary: dict[str, Any]) -> list[str]:
    groups, shown = 0, list[dict[str, Any]]()
    for group in summary["duplicate_groups"] or ():
        groups += 1
        if len(shown) < DUPLICATE_EXAMPLES:
            shown.append(group)
    rows = f" (rows in {DUPLICATES_FILENAME}):" if groups else ""
    lines = [
        f"duplicates: {summary['duplicates']} source file(s) with the same content as another{rows}"
    ]
    for group in shown:
        copies = [
            f"{key} ({split})"
            for key, split in zip(group.get("keys") or [], group.get("splits") or [], strict=False)
        ]
        lines.append(f"      {' = '.join(copies)}")
    if groups > DUPLICATE_EXAMPLES:
        lines.append(f"      ... {groups - DUPLICATE_EXAMPLES} more group(s)")
    return lines


def _op_text(spec: Any) -> str:
    """``name: param=value, ...`` for a transform or augmentation list entry."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict) and len(spec) == 1:
        name, params = next(iter(spec.items()))
        shown = ", ".join(
            f"{key}={_value_text(value)}"
            for key, value in (params or {}).items()
            if value is not None
        )
        return f"{name}: {shown}" if shown else name
    return json.dumps(spec, sort_keys=True)


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return str(value)


def _bytes_text(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
