"""The error reports: one row per dropped input file, written as errors.jsonl,
and one per object dropped from a stored image, written as dropped_objects.jsonl.

Every field of a row is one line of text, escaped by `as_text` wherever the
row is made (`DroppedFile` does it), so a path that is not UTF-8 or a name
with a newline shows in errors.jsonl as ``caf\\xe9`` or ``\\n``.

A bad input file never fails the job. It becomes a `DroppedFile` row, is
counted per reason, and lands in ``errors.jsonl`` beside the shards, sorted so
the same inputs give the same bytes. Whether too many were dropped is decided
by the launcher (``errors.max_fraction``), after the job.

Stages and reasons (part of kiln's output format):

- ``list``: ``bad_row`` (a manifest row that does not parse, or a COCO or
  VOC entry), ``line_too_long`` (a manifest line longer than
  `kiln.pipeline.text_lines.MAX_LINE_BYTES`, read through but never held),
  ``dangling_annotation`` (an image id that COCO annotations
  name but the file's images lack: one row per missing image), ``missing`` (a
  manifest names a file that does not exist), ``unknown_label`` (not in the
  class list), ``unexpected_location`` (a file outside the folder layout),
  ``duplicate_key`` (a manifest lists one path with different labels or
  splits), ``missing_split`` (``splits.from_source`` but the row has none),
  ``unreadable`` (a local path that is not a regular file: a folder, a
  named pipe, a socket or a device; a broken symbolic link, or one to a
  folder that holds it, which is not followed), ``bad_name`` (an image folder's file
  whose name, or a folder's on its path, is not valid UTF-8 or holds a
  control character, or whose class folder's name is not a class name:
  only whitespace). A row whose image path holds a control character is a
  ``bad_row``.
- ``read``: ``unreadable`` (permission denied, I/O error, vanished since listing).
- ``decode``: the reasons of `kiln.transforms.decode.DecodeError` (``empty``,
  ``not_an_image``, ``unsupported_format``, ``corrupt``, ``too_many_pixels``,
  ``too_small``).
- ``transform``: ``transform_failed`` (a transform cannot apply to this
  image, e.g. smaller than a crop).
- ``encode``: ``encode_failed`` (``encoding.format`` cannot store the image
  the transforms produced: a side beyond JPEG's 65500 pixels or PNG's
  1000000, `kiln.transforms.encode.MAX_SIDE`, or the encoder failed; a
  dataset's mask too).
- ``targets``: a bad annotation (`kiln.pipeline.targets.REASONS`:
  ``bad_box``, ``unknown_class``, ``bad_keypoints``, ``missing_mask``,
  ``corrupt_mask``, ``mask_size_mismatch``, ``bad_polygon``,
  ``bad_segmentation``, ``box_mask_mismatch``, ``size_mismatch``).

``dropped_objects.jsonl`` (datasets with ``targets.boxes``): an object
removed while its image was stored is not a dropped file, so it is not in
errors.jsonl and not counted against ``errors.max_fraction``; kiln.json
counts it per split and reason (``objects.<split>.dropped``), and this file
names it: one row per object, in the record index's order (splits by name,
shards, records), then by object, one canonical JSON object per line with
``split``, ``key`` (as in errors.jsonl), ``object`` (its index in the
objects the source listed for the image), ``reason`` and ``message``. The
reasons: ``min_visibility`` (orientation and the offline transforms left
less of its box in the image than ``targets.boxes.min_visibility``, or
none), and under ``targets.bad_objects: drop_object`` the bad-annotation
reasons above.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from kiln.lazy_import import LazyModule
from kiln.pipeline import storage
from kiln.pipeline.target_rows import CONTROL_CHARACTERS
from kiln.schemas import DROPPED_OBJECTS_FILENAME, ERRORS_FILENAME

if TYPE_CHECKING:
    from apache_beam.io.filesystems import FileSystems
else:  # Beam on first use: validating a config needs none of it
    FileSystems = LazyModule("apache_beam.io.filesystems", "FileSystems")


def as_text(value: str) -> str:
    """`value` as one line of text UTF-8 can hold, for errors.jsonl and messages.

    What is not text is shown as a backslash escape: a local file name that
    is not UTF-8 arrives from the OS with its undecodable bytes as surrogate
    escapes (``b"caf\\xe9.jpg"`` as ``"caf\\udce9.jpg"``), shown as the bytes,
    ``caf\\xe9.jpg``; any other lone surrogate (a JSON manifest's
    ``"\\ud800"``) as ``\\ud800``. So is a control character (Unicode
    category Cc), which a terminal would act on or a line would break at:
    ``\\n``, ``\\r``, ``\\t``, and the others as ``\\x1b``. Any other text
    comes back unchanged, and so does what this returns: escaping twice
    changes nothing.
    """
    return CONTROL_CHARACTERS.sub(_escaped_control, unicode_text(value))


def unicode_text(value: str) -> str:
    """`value` with its lone surrogates shown as `as_text` shows them, and
    nothing else changed (control characters stay): the text a dropped row's
    version entry holds, which must stay what it was."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that is no byte's escape
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def is_unicode(value: str) -> bool:
    """Whether `value` is Unicode text: no lone surrogate (see `as_text`)."""
    return unicode_text(value) == value


_NAMED_CONTROLS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped_control(found: re.Match[str]) -> str:
    character = found.group()
    return _NAMED_CONTROLS.get(character) or f"\\x{ord(character):02x}"


@dataclasses.dataclass(frozen=True, order=True)
class DroppedFile:
    """One dropped input file. Field order is the report's sort order.

    `sha256`: the bytes the job dropped (hex), "" when it did not read them
    (dropped while listing, unreadable). Not in errors.jsonl: it is kept
    beside the version (`up_to_date.write_dropped_sha256s`), for the up-to-date check
    to verify a recently modified file it dropped (`up_to_date`).
    """

    key: str
    stage: str
    reason: str
    uri: str
    message: str
    sha256: str = dataclasses.field(default="", compare=False)

    def __post_init__(self):
        # Wherever a row is made (the listing, the job's steps), every field
        # is text errors.jsonl can hold, on one line: `as_text`.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            shown = as_text(value)
            if shown != value:
                object.__setattr__(self, field.name, shown)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "uri": self.uri,
            "stage": self.stage,
            "reason": self.reason,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> DroppedFile:
        return cls(row["key"], row["stage"], row["reason"], row["uri"], row["message"])


def render(rows: list[DroppedFile]) -> bytes:
    """The bytes of errors.jsonl: rows sorted, one canonical JSON object per line."""
    lines = [
        json.dumps(row.to_json(), sort_keys=True, ensure_ascii=False) + "\n" for row in sorted(rows)
    ]
    return "".join(lines).encode("utf-8")


class WrittenErrorReport(NamedTuple):
    """What `write_error_report` wrote: reason -> rows (sorted by reason),
    and the file's sha256 (hex), which kiln.json records."""

    counts: dict[str, int]
    sha256: str


def write_error_report(folder: str, rows: list[DroppedFile]) -> WrittenErrorReport:
    """Writes `rows` to ``<folder>/errors.jsonl``, sorted (an empty file for
    none); returns the counts per reason and the file's sha256.

    The job calls it once, in its last step, with every dropped row
    gathered there: fine for an error report, which `errors.max_fraction`
    keeps to a small part of the input. One small object write, so a retry
    rewrites the same bytes.
    """
    data = render(rows)
    with storage.create(FileSystems.join(folder, ERRORS_FILENAME)) as f:
        f.write(data)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.reason] = counts.get(row.reason, 0) + 1
    return WrittenErrorReport(dict(sorted(counts.items())), hashlib.sha256(data).hexdigest())


def write_dropped_objects(folder: str, rows: list[dict[str, Any]]) -> str:
    """Writes `rows` (`kiln.pipeline.record_index.dropped_object_rows`, in
    index order) to ``<folder>/dropped_objects.jsonl`` as they come (an empty
    file for none); returns the file's sha256 (hex)."""
    data = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)
    encoded = data.encode("utf-8")
    with storage.create(FileSystems.join(folder, DROPPED_OBJECTS_FILENAME)) as f:
        f.write(encoded)
    return hashlib.sha256(encoded).hexdigest()
