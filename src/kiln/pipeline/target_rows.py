"""A manifest row's targets: checked for structure while listing, carried as canonical JSON.

A source reads each image's annotations from its row (a JSONL manifest
line, a CSV row, or a COCO image with its annotations, converted to the
same row) and calls `row_targets`: it checks the structure of what the
dataset declares (`kiln.schemas.TargetsConfig`), resolves mask paths and
returns the targets as a plain dict, which travels through the listing and
to the job as one canonical JSON text (`canonical`). What needs the image
(sizes, boxes inside it, class ids) is checked by the job
(`kiln.pipeline.targets`).

A JSONL row with targets (the keys of undeclared kinds are ignored)::

    {"path": "images/1.jpg", "split": "train", "label": "cat", "labels": ["cat", "dog"],
     "objects": [{"bbox": [x_min, y_min, x_max, y_max], "class": "cat", "iscrowd": 0,
                  "keypoints": [x1, y1, v1, x2, y2, v2, ...],
                  "mask": "masks/1_0.png"}],          # or "segmentation": polygons or RLE
     "mask": "masks/1.png", "weather": "sunny", "altitude": 12.5}

The targets dict: ``labels`` (class names, sorted, each once), ``objects`` (each with
``bbox``, ``class``, ``fields``, and ``keypoints``, ``mask`` (a URI) or
``segmentation`` when declared), ``mask`` (a URI) and ``extra`` (name ->
value), each present only when declared.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from kiln.errors import close_names, quote
from kiln.registry import is_integer, is_number
from kiln.schemas import TargetsConfig

_KIND_TEXT = {"int": "an integer", "float": "a number", "string": "a string"}
# What a value must be, in messages: a float column takes finite numbers only.
_EXPECTED = {**_KIND_TEXT, "float": "a finite number"}
# A CSV cell of an int or float column: a number as JSON writes it (no "_"
# separators, no "0x"), the float's "inf" and "nan" refused as not finite.
_CSV_INT = re.compile(r"[+-]?[0-9]+")
_CSV_FLOAT = re.compile(
    r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)", re.I
)

# What the records store (`kiln.schemas`): int64 for int columns, float32 for
# float ones. A value outside them is a bad row while listing; let through, an
# integer stops the whole job (Int64List refuses it) and a float becomes inf.
_INT64_RANGE = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = 3.4028234663852886e38


AS_WRITTEN = "bbox as written"
"""An object's key (never a field name: it has spaces) for a box the source
converted, as its file writes it: ``{"bbox": [x, y, width, height]}``, so
that the job's message about a bad box shows what the file says (a coco
source's box of negative or zero width or height; the object's annotation
is named by `ANNOTATION`, as every object's is)."""


DECLARED_SIZE = "size as declared"
"""A row's key (never a column name: it has spaces) for the image's size as
the source's annotations declare it (COCO's ``images[].width/height``, VOC's
``<size>``): ``{"width": 640, "height": 480, "by": "images[].width/height"}``,
``by`` naming where the source writes it, for messages. Carried in the
targets to the job, which compares it with the decoded image's size in the
frame the annotations are drawn on (`kiln.pipeline.targets`,
``targets.annotations_frame``). Only a source that reads sizes writes it, and
only when they are positive integers: a row without it is not checked."""


ANNOTATION = "annotation as named"
"""An object's key (never a field name: it has spaces) naming the entry of
its source file it comes from, as messages name it: ``annotations[5], id 6``
(a coco source, whose image's objects are in annotation id order, not the
file's, so "objects[2]" alone would not find it). Carried to the job, whose
messages about the object name it (`object_where`); not part of what the
object means (`unnamed`): the same annotations written in another order keep
their records, their version and their duplicates' agreement."""

_NAMED = re.compile(
    r"objects\[([0-9]+)\]( \(annotations\[[0-9]+\](, id (-?[0-9]+|\"([^\"\\]|\\.)*\"))?\))?"
)


def object_where(index: int, item: Mapping[str, Any]) -> str:
    """``objects[2]``, or ``objects[2] (annotations[5], id 6)`` for an object
    its source names (`ANNOTATION`): how messages about it begin."""
    named = item.get(ANNOTATION)
    return f"objects[{index}]" if not isinstance(named, str) else f"objects[{index}] ({named})"


def unnamed(row_targets: Mapping[str, Any]) -> dict[str, Any]:
    """`row_targets` without the objects' `ANNOTATION`: what they mean."""
    out = dict(row_targets)
    if any(ANNOTATION in item for item in out.get("objects", ())):
        out["objects"] = [
            {k: v for k, v in item.items() if k != ANNOTATION} for item in out["objects"]
        ]
    return out


# In canonical JSON (sorted keys) an object's `ANNOTATION` is its first key.
# A JSON string holds no bare quote, so the pattern cannot match inside one.
_ANNOTATION_TEXT = re.compile(r'"annotation as named":"(?:[^"\\]|\\.)*",')


def unnamed_text(text: str) -> str:
    """`canonical` targets without the objects' `ANNOTATION`: the text of
    their `unnamed` targets, without parsing it (the up-to-date stamp takes
    every listed file's)."""
    return _ANNOTATION_TEXT.sub("", text) if ANNOTATION in text else text


def renamed(message: str, objects: Sequence[Mapping[str, Any]]) -> str:
    """A message about one object (``objects[2] (annotations[5], id 6): ...``,
    kept from an earlier build) naming it as `objects` name it now
    (`object_where`): a record reused from a file written in another order."""
    match = _NAMED.match(message)
    if match is None or int(match.group(1)) >= len(objects):
        return message
    index = int(match.group(1))
    return object_where(index, objects[index]) + message[match.end() :]


class AnnotationError(ValueError):
    """A row's annotations do not have the declared structure; the message names
    the field, e.g. ``objects[2].bbox: expected 4 numbers, got 3``."""


def row_targets(
    row: Mapping[str, Any], targets: TargetsConfig, resolve: Callable[[str], str]
) -> dict[str, Any]:
    """The declared targets of one manifest row, structurally checked.

    Args:
      row: The row as parsed from JSON (a JSONL line, or a COCO image
        converted to one).
      targets: The dataset's declared targets.
      resolve: Turns a path written in the row (relative to the manifest's
        folder, or absolute) into the URI to read; the caller checks the
        URIs are confined (`mask_uris`).

    Raises:
      AnnotationError: naming the field that is missing or malformed.
    """
    out: dict[str, Any] = {}
    if targets.labels is not None:
        labels = _required(row, "labels", "a list of class names ([] for none)")
        if not isinstance(labels, list):
            raise AnnotationError(f"'labels' must be a list of class names, got {_kind(labels)}")
        out["labels"] = _label_set(
            class_name(label, f"labels[{i}]") for i, label in enumerate(labels)
        )
    if targets.boxes is not None:
        objects = _required(row, "objects", 'a list of objects ("objects": [] for none)')
        if not isinstance(objects, list):
            raise AnnotationError(f"'objects' must be a list, got {_kind(objects)}")
        out["objects"] = [
            _object(item, f"objects[{i}]", targets, resolve) for i, item in enumerate(objects)
        ]
    if targets.mask is not None:
        mask = _required(row, "mask", "the path of the image's mask PNG")
        out["mask"] = resolve(_path(mask, "mask"))
    if targets.extra:
        out["extra"] = {
            name: _extra(_required(row, name, f"{_KIND_TEXT[kind]} (targets.extra)"), name, kind)
            for name, kind in sorted(targets.extra.items())
        }
    declared: Any = row.get(DECLARED_SIZE)
    size = declared_size(declared) if isinstance(declared, dict) else None
    if size is not None:
        by = declared.get("by")
        out[DECLARED_SIZE] = {
            "width": size[0],
            "height": size[1],
            "by": by if isinstance(by, str) else "the annotations",
        }
    return out


def declared_size(declared: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(width, height)`` of a `DECLARED_SIZE` value, or None if either is not
    a positive integer (a tool that could not read the image writes 0)."""
    width: Any = declared.get("width")
    height: Any = declared.get("height")
    if is_integer(width) and is_integer(height) and width > 0 and height > 0:
        return int(width), int(height)
    return None


def csv_row_targets(fields: Mapping[str, str], targets: TargetsConfig) -> dict[str, Any]:
    """The declared targets of one CSV row (label(s) and extra columns only).

    Args:
      fields: Column name -> cell text.

    Raises:
      AnnotationError: naming the column.
    """
    out: dict[str, Any] = {}
    if targets.labels is not None:
        text = fields["labels"].strip()
        parts = [part.strip() for part in text.split(targets.labels.separator)] if text else []
        if any(not part for part in parts):
            raise AnnotationError(
                f"labels: empty class name in {text!r} "
                f"(names joined by {targets.labels.separator!r})"
            )
        out["labels"] = _label_set(class_name(part, "labels") for part in parts)
    if targets.extra:
        out["extra"] = {
            name: _extra_text(fields[name], name, kind)
            for name, kind in sorted(targets.extra.items())
        }
    return out


def csv_columns(targets: TargetsConfig) -> list[str]:
    """The CSV columns the targets need besides ``path`` (and ``split``)."""
    columns = ["label"] if targets.label is not None else []
    if targets.labels is not None:
        columns.append("labels")
    return columns + sorted(targets.extra)


def canonical(row_targets: Mapping[str, Any]) -> str:
    """The targets as the listing stores them: canonical JSON (sorted keys, no
    spaces, non-finite numbers as Python's ``NaN``/``Infinity``, which the job
    reports as bad boxes)."""
    text = json.dumps(row_targets, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate: a mask path below a local folder whose name is
        # not UTF-8 (rows whose own values hold one are bad rows). As JSON's
        # escape (\udce9): text that UTF-8, Beam's coders and the stamp hold.
        # Every other targets' text stays what it was, and so their versions.
        text = json.dumps(row_targets, sort_keys=True, separators=(",", ":"))
    return text


def class_names(row_targets: Mapping[str, Any]) -> Iterator[str]:
    """Every class name the targets use (labels and objects' classes)."""
    yield from row_targets.get("labels", ())
    for item in row_targets.get("objects", ()):
        yield item["class"]


def convention_boxes(row_targets: Mapping[str, Any]) -> Iterator[list[float]]:
    """The boxes of the objects, as listed, that say in which convention the
    source writes boxes (`kiln.pipeline.box_convention`): all but those a
    source has already turned into kiln's corners from its own convention
    (a COCO box of negative or zero width or height: `AS_WRITTEN`)."""
    for item in row_targets.get("objects", ()):
        if AS_WRITTEN not in item:
            yield item["bbox"]


def mask_uris(row_targets: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(field, uri)`` of every mask file the targets name."""
    if "mask" in row_targets:
        yield "mask", row_targets["mask"]
    for i, item in enumerate(row_targets.get("objects", ())):
        if "mask" in item:
            yield f"objects[{i}].mask", item["mask"]


def _object(
    item: Any, where: str, targets: TargetsConfig, resolve: Callable[[str], str]
) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise AnnotationError(f"{where}: expected an object ({{...}}), got {_kind(item)}")
    bbox = item.get("bbox")
    if "bbox" not in item:
        raise AnnotationError(
            f"{where}.bbox: missing: every object needs 4 numbers [x_min, y_min, x_max, y_max]"
        )
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(map(is_number, bbox)):
        raise AnnotationError(
            f"{where}.bbox: expected 4 numbers [x_min, y_min, x_max, y_max], got {_short(bbox)}"
        )
    out: dict[str, Any] = {
        "bbox": [float(v) for v in bbox],
        "class": class_name(item.get("class"), f"{where}.class"),
    }
    fields = {}
    declared = targets.boxes.fields if targets.boxes is not None else {}
    for name, kind in sorted(declared.items()):
        if name not in item:
            raise AnnotationError(f"{where}.{name}: missing (targets.boxes.fields)")
        # As an extra column: a value the record cannot hold (NaN, beyond
        # float32 or int64) is a bad row, not a stored NaN or inf.
        fields[name] = _extra(item[name], f"{where}.{name}", kind)
    out["fields"] = fields
    written = item.get(AS_WRITTEN)
    if (
        isinstance(written, dict)
        and isinstance(written.get("bbox"), list)
        and len(written["bbox"]) == 4
        and all(map(is_number, written["bbox"]))
    ):
        out[AS_WRITTEN] = {"bbox": written["bbox"]}
    if targets.keypoints is not None:
        count = len(targets.keypoints.names)
        points = item.get("keypoints")
        if "keypoints" not in item:
            raise AnnotationError(
                f"{where}.keypoints: missing (targets.keypoints): {3 * count} numbers, x, y, "
                f"visibility for each of {count} keypoints (all 0 for an object none of whose "
                f"keypoints is labelled)"
            )
        if (
            not isinstance(points, list)
            or len(points) != 3 * count
            or not all(map(is_number, points))
        ):
            raise AnnotationError(
                f"{where}.keypoints: expected {3 * count} numbers (x, y, visibility for each of "
                f"{count} keypoints), got {_short(points)}"
            )
        for k in range(count):
            if points[3 * k + 2] not in (0, 1, 2):
                raise AnnotationError(
                    f"{where}.keypoints: visibility of {targets.keypoints.names[k]!r} must be "
                    f"0, 1 or 2, got {_short(points[3 * k + 2])}"
                )
        out["keypoints"] = [float(v) for v in points]
    if targets.instance_masks is not None:
        has_mask, has_segmentation = "mask" in item, "segmentation" in item
        if has_mask == has_segmentation:
            raise AnnotationError(
                f"{where}: give either 'mask' (a PNG path) or 'segmentation' (polygons or RLE)"
            )
        if has_mask:
            out["mask"] = resolve(_path(item["mask"], f"{where}.mask"))
        else:
            out["segmentation"] = _segmentation(item["segmentation"], f"{where}.segmentation")
    return out


def _segmentation(value: Any, where: str) -> Any:
    if isinstance(value, list):
        for i, polygon in enumerate(value):
            if not isinstance(polygon, list) or not all(map(is_number, polygon)):
                raise AnnotationError(f"{where}[{i}]: expected a list of numbers x1, y1, x2, ...")
        return value
    if isinstance(value, dict):
        size, counts = value.get("size"), value.get("counts")
        if (
            not isinstance(size, list)
            or len(size) != 2
            or not all(is_integer(v) and v > 0 for v in size)
        ):
            raise AnnotationError(f"{where}.size: expected [height, width], got {_short(size)}")
        if not (
            isinstance(counts, str)
            or (isinstance(counts, list) and all(is_integer(v) and v >= 0 for v in counts))
        ):
            raise AnnotationError(
                f"{where}.counts: expected a compressed RLE string or a list of run lengths"
            )
        if isinstance(counts, str):
            _unicode(counts, f"{where}.counts")
        return {"size": [int(v) for v in size], "counts": counts}
    raise AnnotationError(
        f"{where}: expected polygons [[x1, y1, ...], ...] or RLE {{size, counts}}, "
        f"got {_kind(value)}"
    )


def _extra(value: Any, name: str, kind: str) -> Any:
    if kind == "int":
        if not is_integer(value):
            raise AnnotationError(f"{name}: expected an integer, got {_short(value)}")
        return _int64(int(value), name)
    if kind == "float":
        if not is_number(value) or not math.isfinite(_as_float(value)):
            raise AnnotationError(f"{name}: expected {_EXPECTED[kind]}, got {_short(value)}")
        return _float32(float(value), name)
    if not isinstance(value, str):
        raise AnnotationError(f"{name}: expected a string, got {_short(value)}")
    return _unicode(value, name)


def _extra_text(text: str, name: str, kind: str) -> Any:
    if kind == "string":
        return text
    text = text.strip()
    value: int | float | None = None
    # As JSON writes numbers: Python's int() and float() also take "1_000".
    if kind == "int" and _CSV_INT.fullmatch(text):
        value = int(text)
    elif kind == "float" and _CSV_FLOAT.fullmatch(text):
        value = float(text)
    if value is None or (kind == "float" and not math.isfinite(value)):
        raise AnnotationError(f"{name}: expected {_EXPECTED[kind]}, got {text!r}")
    return _int64(value, name) if isinstance(value, int) else _float32(value, name)


def _int64(value: int, where: str) -> int:
    low, high = _INT64_RANGE
    if not low <= value <= high:
        raise AnnotationError(
            f"{where}: {_short(value)} does not fit the record's 64-bit integer ({low} to {high})"
        )
    return value


def _float32(value: float, where: str) -> float:
    if abs(value) > _FLOAT32_MAX:
        raise AnnotationError(
            f"{where}: {value!r} does not fit the record's float32 "
            f"(at most {_FLOAT32_MAX:.7g} in magnitude)"
        )
    return value


def _label_set(names: Iterable[str]) -> list[str]:
    """An image's labels as the set they are: sorted, each once. The record
    stores the sorted class ids, so an export that lists them in another order
    (or one twice) must not make a new version, re-process the image, or make
    two rows of one image disagree (`duplicate_key`)."""
    return sorted(set(names))


def _required(row: Mapping[str, Any], name: str, what: str) -> Any:
    if name not in row:
        raise AnnotationError(f"'{name}' is missing: expected {what}{misspelt(name, row)}")
    return row[name]


def misspelt(name: str, row: Iterable[Any]) -> str:
    """``"; the row has 'objcts' (misspelt?)"`` for the keys of a JSONL row
    (or a CSV's columns) close to the missing key `name`, or ``""``: a row's
    unknown keys are not read (extra columns are named in the config), so a
    misspelt key shows only as the key it was meant to be, missing, in every
    row."""
    keys = [key for key in row if isinstance(key, str)]
    close = close_names(name, keys)
    if not close:
        return ""
    return f"; the row has {' and '.join(quote(key) for key in close)} (misspelt?)"


def class_name(value: Any, where: str) -> str:
    """A class name as read from data: every source's one rule, for a
    manifest's ``label``, ``labels`` and objects' ``class`` (JSONL and CSV
    alike), COCO category names and VOC object names.

    An integer is its decimal text (``3`` is the class ``"3"``). A string
    is stripped of surrounding whitespace (`str.strip`, as a CSV cell is),
    and refused when that leaves it empty, when it holds a control
    character (Unicode category Cc: newline, tab, NUL...) or a lone
    surrogate, or when it is longer than `MAX_CLASS_NAME` characters: a
    class name is a line of the labels files, a cell of ``kiln inspect``'s
    table and an entry of kiln.json (a folder's name has at most 255 bytes;
    a manifest's label of megabytes is a broken row, not a class). It is
    then put in Unicode normalization form
    NFC: "café" written with a combining accent (as macOS names folders) and
    with a precomposed "é" (as most tools write text) are one class, not
    two that print alike.

    Raises:
      AnnotationError: naming `where`, e.g. ``objects[2].class is empty``.
    """
    if is_integer(value):
        return str(value)
    if not isinstance(value, str):
        raise AnnotationError(f"{where}: expected a class name, got {_short(value)}")
    name = value.strip()
    if not value:
        raise AnnotationError(f"{where} is empty")
    if not name:
        raise AnnotationError(f"{where} is only whitespace: {_short(value)}")
    if len(name) > MAX_CLASS_NAME:
        raise AnnotationError(
            f"{where} is {len(name)} characters long, more than a class name's "
            f"{MAX_CLASS_NAME}: {_short(name)}"
        )
    _unicode(name, where)
    control = control_character(name)
    if control is not None:
        raise AnnotationError(
            f"{where} holds a control character (U+{ord(control):04X}): {_short(value)}"
        )
    return unicodedata.normalize("NFC", name)


# The longest class name, in characters (see `class_name`).
MAX_CLASS_NAME = 1024

# Unicode's category Cc, exactly: C0 controls, DEL and C1 controls.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_character(text: str) -> str | None:
    """The first control character (Unicode category Cc) in `text`, or None."""
    found = CONTROL_CHARACTERS.search(text)
    return found.group() if found else None


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise AnnotationError(f"{where}: expected a path, got {_short(value)}")
    return _unicode(value, where)


def _unicode(text: str, where: str) -> str:
    """`text`, if it is Unicode text: a JSON string can hold a lone surrogate
    (``"\\ud800"``), which no record, listing hash or report can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise AnnotationError(
            f"{where}: {_short(text)} is not valid Unicode text (a lone surrogate)"
        ) from None
    return text


def _as_float(value: Any) -> float:
    """A JSON number as a float; an integer beyond float's range is infinite."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _kind(value: Any) -> str:
    return type(value).__name__ if value is not None else "null"


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
