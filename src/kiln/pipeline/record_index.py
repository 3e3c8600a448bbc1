"""The record index: one line per stored record, written beside the shards as ``index.jsonl``.

What an incremental build (`incremental`) needs to reuse a record without
decoding its image, and what `kiln diff` needs to compare two versions by
key and content, without reading the shards: for every record, where it is
(split, shard file, position in the shard) and what went into it and came
out of it. One canonical JSON object per line (keys sorted, no spaces),
lines in shard order (splits sorted by name, shards by index, records by
their position), so the same records give the same bytes; kiln.json
records the file's sha256 (``index_sha256``). The fields:

=========== ==================================================================
split       the record's split
shard       the shard file's name
position    the record's place in the shard (0-based)
key         the record's key
sha256      sha256 (hex) of the source file's bytes
inputs      `inputs_fingerprint` of what the listing said about the file
label       the class id
height      stored image height, pixels
width       stored image width, pixels
pixels      height * width
sums        per-channel sum of the stored pixel values (exact integers)
squares     per-channel sum of their squares (exact integers)
targets     datasets with ``targets:`` only: what the split's statistics
            count of the record's targets (`statistics.TargetCounts`):
            ``classes`` (the class ids the image carries), ``objects``
            (``[class id, size]`` per stored object, size = sqrt(box area)
            in stored pixels; null without boxes), ``dropped`` (reason ->
            objects removed while the image was kept) and, when some
            were, ``dropped_objects`` (per object removed: ``object``, its
            index in the listed objects, ``reason`` and ``message``)
masks       records whose targets name mask files only: the sha256 (hex) of
            each mask file's bytes, in the order the targets name them
            (`kiln.pipeline.target_rows.mask_uris`), null for one that could
            not be read: what the next incremental build takes a mask
            file's sha256 from when its stamp is the one this build listed
            (`kiln.pipeline.incremental.JoinBase`), and what the up-to-date
            check compares a recently modified mask file with
=========== ==================================================================

``pixels``, ``sums``, ``squares`` and ``targets`` are the record's share of
the split's statistics (`statistics.PixelSums`, `statistics.ObjectSums`),
so statistics merged from reused and new records equal a full build's
exactly (a size is a float written as its shortest round-tripping decimal,
so it reads back as the same float).

For a dataset with targets, ``inputs`` covers the targets' content (mask
files by the sha256 of their bytes) and the class ids they use
(`kiln.pipeline.targets.TargetCodec.reuse_key`); ``masks`` is the same
sha256s in the clear (``inputs`` is a hash), so a mask file need not be
read again to learn them.

Inside the job a record's entry (`entry`: the fields that do not depend on
where the record lands) travels in the sorted runs right after the record;
`sharding.WriteShardFn` writes each shard's lines (`write_part`), and the
job's last step joins the parts in shard order (`join_parts`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from kiln.pipeline import storage, versioning
from kiln.pipeline.statistics import TargetCounts
from kiln.schemas import INDEX_FILENAME
from kiln.schemas.metadata import canonical_json

# The item field `incremental.JoinBase` sets on a listed file whose key has
# a base row and whose stamp (size, modification time and, locally, inode
# and ctime) is the one the base listed: the job takes its sha256 from the
# row instead of reading it (`images.ImageProcessor`).
STAMP_UNCHANGED = "stamp_unchanged"

# The item field `incremental.JoinBase` sets on a listed file whose key has
# a base row and whose targets' mask files the base listed:
# ``((uri, size, mtime, inode_ctime) or None, ...)``, per mask the base's
# targets name (`target_rows.mask_uris`; inode_ctime None for an object, or
# when the base listed none), None where its stamp is too recent to trust.
BASE_MASK_STAMPS = "base_mask_stamps"

# The item field `incremental.JoinBase` sets on a listed file that has no
# base row, whose stamp is the one the base listed, and that the base's job
# dropped as undecodable (a dataset without targets): ``(sha256, reason,
# message)`` as it dropped it. The job drops it again without reading it
# (`images.ImageProcessor`).
BASE_DROPPED = "base_dropped"

# The item field the image step sets (True) on a listed file whose base row
# it dropped because the row's shard (or the index) failed its check: the
# base had its record, which could not be used, so the file is processed
# again and counted as ``reprocessed``, not ``added`` (`images._ImageStepFn`).
BASE_UNTRUSTED = "base_untrusted"

# Listing fields that do not go into a record: where the file was read
# (`uri`), its stamp (size, modification time, inode and ctime) and those
# of its mask files (bytes are named by their sha256), the split the source named (a
# record's bytes do not depend on its split) and what the job attached (its
# base row, whether its stamp is the base's, its masks' stamps as the base
# listed them, how the base dropped it, whether its base row was untrusted,
# and the base rows it may have moved from: `moves`).
_NOT_RECORD_INPUTS = frozenset(
    {
        "uri",
        "size",
        "mtime",
        "inode_ctime",
        "mask_stamp",
        "split",
        "base",
        STAMP_UNCHANGED,
        BASE_MASK_STAMPS,
        BASE_DROPPED,
        BASE_UNTRUSTED,
        "moved_from",
    }
)
_COPY_CHUNK = 1 << 20


def inputs_fingerprint(item: Mapping[str, Any]) -> str:
    """What the listing says about a file that goes into its record (its key,
    class id, and whatever else a listing row carries, such as annotations),
    as a short hash: a record is reused only if this is unchanged."""
    return versioning.fingerprint(
        {name: value for name, value in item.items() if name not in _NOT_RECORD_INPUTS}
    )[:32]


def entry(
    *,
    key: str,
    sha256: str,
    inputs: str,
    label: int,
    height: int,
    width: int,
    pixels: int,
    sums: Sequence[int],
    squares: Sequence[int],
    targets: TargetCounts | None = None,
    masks: Sequence[str | None] | None = None,
) -> bytes:
    """The placement-free part of a record's index line, as canonical JSON bytes
    (`targets`: a dataset with targets, what its statistics count; `masks`:
    the sha256 of each mask file its targets name, None or empty when they
    name none)."""
    data: dict[str, Any] = {
        "key": key,
        "sha256": sha256,
        "inputs": inputs,
        "label": label,
        "height": height,
        "width": width,
        "pixels": pixels,
        "sums": list(sums),
        "squares": list(squares),
    }
    if targets is not None:
        data["targets"] = _targets_json(targets)
    if masks:
        data["masks"] = list(masks)
    return canonical_json(data).encode("utf-8")


def _targets_json(counts: TargetCounts) -> dict[str, Any]:
    data: dict[str, Any] = {
        "classes": list(counts.image_classes),
        "objects": [[c, s] for c, s in counts.objects] if counts.has_objects else None,
        "dropped": dict(counts.dropped),
    }
    if counts.dropped_objects:  # absent otherwise: the lines of earlier builds
        data["dropped_objects"] = [
            {"object": index, "reason": reason, "message": message}
            for index, reason, message in counts.dropped_objects
        ]
    return data


def _targets_from_json(data: Mapping[str, Any]) -> TargetCounts:
    objects = data["objects"]
    return TargetCounts(
        image_classes=tuple(int(c) for c in data["classes"]),
        has_objects=objects is not None,
        objects=tuple((int(c), float(s)) for c, s in objects or ()),
        dropped=tuple(sorted((str(r), int(n)) for r, n in data["dropped"].items())),
        dropped_objects=tuple(
            (int(d["object"]), str(d["reason"]), str(d["message"]))
            for d in data.get("dropped_objects", ())
        ),
    )


class IndexRow(NamedTuple):
    """One parsed line of ``index.jsonl``."""

    split: str
    shard: str
    position: int
    key: str
    sha256: str
    inputs: str
    label: int
    height: int
    width: int
    pixels: int
    sums: tuple[int, ...]
    squares: tuple[int, ...]
    targets: TargetCounts | None = None
    # The sha256 of each mask file the targets name, in their order (None:
    # one could not be read); None when they name none, or a line of a kiln
    # before it kept them.
    masks: tuple[str | None, ...] | None = None
    line: str = ""  # the line as read (`parse_line`)

    def reused_entry(self) -> bytes:
        """What the row's record, reused, carries into the new index: the
        line as read, where there is one (`part_bytes` replaces its placement,
        split, shard and position, and keeps the rest: the `entry` fields
        with the same values, and no re-serializing per record), else `entry`."""
        return self.line.encode("utf-8") if self.line else self.entry()

    def entry(self) -> bytes:
        """The row's `entry`: the placement-free part of its line."""
        return entry(
            key=self.key,
            sha256=self.sha256,
            inputs=self.inputs,
            label=self.label,
            height=self.height,
            width=self.width,
            pixels=self.pixels,
            sums=self.sums,
            squares=self.squares,
            targets=self.targets,
            masks=self.masks,
        )


def parse_line(line: str) -> IndexRow:
    """An ``index.jsonl`` line as an `IndexRow`.

    Raises:
      ValueError: the line is not an index row (bad JSON, a field missing or
        of the wrong type).
    """
    try:
        data = json.loads(line)
        return IndexRow(
            split=str(data["split"]),
            shard=str(data["shard"]),
            position=int(data["position"]),
            key=str(data["key"]),
            sha256=str(data["sha256"]),
            inputs=str(data["inputs"]),
            label=int(data["label"]),
            height=int(data["height"]),
            width=int(data["width"]),
            pixels=int(data["pixels"]),
            sums=tuple(int(v) for v in data["sums"]),
            squares=tuple(int(v) for v in data["squares"]),
            targets=_targets_from_json(data["targets"]) if "targets" in data else None,
            masks=_masks_from_json(data["masks"]) if "masks" in data else None,
            line=line.rstrip("\n"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"not a record index line ({type(e).__name__}: {e})") from None


def _masks_from_json(data: Any) -> tuple[str | None, ...]:
    if not isinstance(data, list):
        raise TypeError(f"masks is a {type(data).__name__}, not a list")
    return tuple(None if sha256 is None else str(sha256) for sha256 in data)


# Where the placement goes in an entry's canonical JSON (keys sorted):
# "position" between "pixels" and "sha256", "shard" and "split" between
# "sha256" and "squares". A comma followed by a quote only occurs between
# members (inside a string a quote is escaped) and between the hex strings
# of "masks", and every other member before "squares" is a number or a
# string, so the first match is the top level's.
_SHA256 = b',"sha256":'
_SQUARES = b',"squares":'
_POSITION = b',"position":'
_SHARD = b',"shard":'
_SPLIT = b',"split":'
_MEMBER = b',"'


def _placed(raw: bytes, position: int, shard_and_split: bytes) -> bytes | None:
    """`raw` (an `entry`, or a line as read: `IndexRow.reused_entry`) with the
    placement set, spliced into its canonical JSON; None when `raw` is not
    laid out as either (then `part_bytes` parses it)."""
    sha256 = raw.find(_SHA256)
    squares = raw.find(_SQUARES, sha256 + 1)
    if sha256 <= 0 or squares < 0:
        return None
    old_position = raw.find(_POSITION, 0, sha256)
    if old_position < 0:  # an entry: no placement yet
        if raw.count(_MEMBER, sha256 + 1, squares):
            return None
        head, middle = raw[:sha256], raw[sha256:squares]
    else:  # a line: position alone before sha256, shard and split alone before squares
        shard = raw.find(_SHARD, sha256, squares)
        if (
            shard < 0
            or raw.find(_SPLIT, shard, squares) < 0
            or raw.count(_MEMBER, old_position + 1, sha256)
            or raw.count(_MEMBER, sha256 + 1, squares) != 2
        ):
            return None
        head, middle = raw[:old_position], raw[sha256:shard]
    return b"".join(
        (head, _POSITION, str(position).encode(), middle, shard_and_split, raw[squares:], b"\n")
    )


def part_bytes(split: str, shard: str, entries: Iterable[bytes]) -> bytes:
    """A shard's lines of the index, from its records' entries in shard order.

    Each line is the entry's canonical JSON with the placement (split,
    shard, position) set: spliced into the entry's bytes (`_placed`), which
    gives the bytes parsing and serializing again gives, without the cost
    per record; an entry laid out otherwise is parsed.
    """
    shard_and_split = (
        _SHARD
        + json.dumps(shard, ensure_ascii=False).encode("utf-8")
        + _SPLIT
        + json.dumps(split, ensure_ascii=False).encode("utf-8")
    )
    lines = []
    for position, raw in enumerate(entries):
        line = _placed(raw, position, shard_and_split) if raw else None
        if line is None:
            data = json.loads(raw) if raw else {}
            data.update(split=split, shard=shard, position=position)
            line = (canonical_json(data) + "\n").encode("utf-8")
        lines.append(line)
    return b"".join(lines)


def write_part(path: str, temp_path: str, split: str, shard: str, entries: Sequence[bytes]) -> None:
    """Writes a shard's lines of the index to `path`, via `temp_path` (a
    retried shard leaves one complete part)."""
    with storage.create(temp_path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(part_bytes(split, shard, entries))
    FileSystems.rename([temp_path], [path])


class IndexSha256s(NamedTuple):
    """What `sha256s_of` found: the source files' sha256 (hex) by key, for
    the keys asked for that have a row, and the index file's own sha256
    (hex), to check against kiln.json's ``index_sha256``; `masks_by_key`:
    the rows' `IndexRow.masks`, for those that keep them."""

    by_key: dict[str, str]
    index_sha256: str
    masks_by_key: dict[str, tuple[str | None, ...]]


# Where a line's key is: "height" (a number) and "inputs" (a hex string) come
# before it, so the first match is the top level's; a comma followed by a
# quote only occurs between members, so the next one ends the key.
_KEY = b',"key":'


def sha256s_of(uri: str, keys: Collection[str]) -> IndexSha256s:
    """The source files' sha256 (and their mask files') that the index `uri` records for `keys`,
    streamed a chunk at a time: however large the index, what is held is a
    chunk and the rows of `keys`. A line is parsed only when its key is one
    of `keys` (or its key cannot be found by its layout).

    Raises:
      ValueError: a line asked for is not an index row.
      OSError, BeamIOError: the file cannot be read.
    """
    wanted = set(keys)
    found: dict[str, IndexRow] = {}
    digest = hashlib.sha256()
    tail = b""
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while chunk := f.read(_COPY_CHUNK):
            digest.update(chunk)
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                _note_sha256(line, wanted, found)
    if tail:
        _note_sha256(tail, wanted, found)
    return IndexSha256s(
        {key: row.sha256 for key, row in found.items()},
        digest.hexdigest(),
        {key: row.masks for key, row in found.items() if row.masks is not None},
    )


def _note_sha256(line: bytes, wanted: set[str], found: dict[str, IndexRow]) -> None:
    start = line.find(_KEY)
    end = line.find(b',"', start + len(_KEY)) if start > 0 else -1
    if end > 0:
        try:
            key = json.loads(line[start + len(_KEY) : end])
        except ValueError:
            key = None
        if isinstance(key, str) and key not in wanted:
            return
    if not line.strip():
        return
    row = parse_line(line.decode("utf-8"))
    if row.key in wanted:
        found[row.key] = row._replace(line="")


class JoinedIndex(NamedTuple):
    """What `join_parts` wrote: index.jsonl's sha256 (hex), and a row per
    object dropped from a stored image (`dropped_object_rows`), in index
    order."""

    sha256: str
    dropped_objects: list[dict[str, Any]]


# In a line whose record had objects dropped, and only there.
_DROPPED_SOME = b'"dropped":{"'


def join_parts(folder: str, parts: Sequence[str]) -> JoinedIndex:
    """Writes ``<folder>/index.jsonl`` from the shards' parts, in the order
    given (shard order), streaming, and gathers the dropped objects its
    lines name."""
    digest = hashlib.sha256()
    dropped: list[dict[str, Any]] = []
    target = FileSystems.join(folder, INDEX_FILENAME)
    with storage.create(target, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        for part in parts:
            tail = b""
            with FileSystems.open(part, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                while chunk := f.read(_COPY_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    # Most chunks name no dropped object: one search each.
                    data = tail + chunk
                    end = data.rfind(b"\n") + 1
                    if _DROPPED_SOME in data[:end]:
                        for line in data[:end].split(b"\n"):
                            if _DROPPED_SOME in line:
                                dropped += dropped_object_rows(parse_line(line.decode("utf-8")))
                    tail = data[end:]
    return JoinedIndex(digest.hexdigest(), dropped)


def dropped_object_rows(row: IndexRow) -> list[dict[str, Any]]:
    """The rows of ``dropped_objects.jsonl`` a record's index line gives: per
    object dropped from its image, ``split``, ``key``, ``object`` (its index
    in the listed objects), ``reason`` and ``message``, by index. A line of
    a build before kiln named them (a record reused from it) gives rows with
    ``object`` null, one per object its counts say was dropped."""
    if row.targets is None:
        return []
    rows = [
        {"split": row.split, "key": row.key, "object": index, "reason": reason, "message": message}
        for index, reason, message in row.targets.dropped_objects
    ]
    named: dict[str, int] = {}
    for _, reason, _ in row.targets.dropped_objects:
        named[reason] = named.get(reason, 0) + 1
    unnamed = "dropped by a kiln build that did not record which object"
    for reason, count in row.targets.dropped:
        rows += [
            {
                "split": row.split,
                "key": row.key,
                "object": None,
                "reason": reason,
                "message": unnamed,
            }
            for _ in range(count - named.get(reason, 0))
        ]
    return rows
