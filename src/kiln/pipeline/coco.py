"""Reading a COCO instances JSON as manifest rows, streaming: no whole-file `json.load`.

A COCO file (``instances_train2017.json`` is 450 MB and 860,000 annotations)
holds three arrays that must be joined: ``images`` (id, file name),
``annotations`` (image id, category id, box, segmentation, keypoints) and
``categories`` (id, name, keypoint names), in any order (the official files
put ``categories`` last). `CocoFile.rows` never holds an array in memory:

1. ``categories`` are read first (a few hundred entries at most: the one
   array kept in memory), in a pass that also checks the top-level keys.
2. ``images`` and then ``annotations`` are read item by item (ijson's C
   parser, one pass of the file per array) into a private temporary SQLite
   database (`kiln.pipeline.listing.scratch_database`), annotations
   as compact JSON keyed by their image id.
3. A merge join walks both tables in image id order: one image's
   annotations at a time in memory, linear in the number of rows (SQLite's
   sorts spill to disk), never one lookup per pair.

A UTF-8 byte order mark at the start of the file (Windows tools write one)
is skipped: ijson alone would refuse the file as not JSON.

Three passes over the file cost less CPU than one pass that builds the
items in Python from ijson's events (measured in BENCHMARKS.md); the price
is reading the file three times, which on an object store means three
downloads.

Each image becomes one row in the format of the JSONL manifest with targets
(docs/configuration.md), so the same validation applies to both::

    {"path": "000000000139.jpg",
     "objects": [{"bbox": [x_min, y_min, x_max, y_max], "class": "person", "iscrowd": 0,
                  "segmentation": [[x, y, ...]] or {"size": [h, w], "counts": ...},
                  "keypoints": [x, y, v, ...]}]}

- ``bbox``: COCO's ``[x, y, width, height]`` becomes ``[x, y, x + width, y +
  height]`` (pixels of the frame ``targets.annotations_frame`` names: the
  file as stored, by default). A negative width or height makes a reversed
  box, and a zero one a point or a line, which the job refuses (``bad_box``,
  per object as any bad box); the object also carries the box as written
  (`target_rows.AS_WRITTEN`), so the message shows what the file says, naming
  the annotation as every message of the job about one object does:
  ``objects[1] (annotations[5], id 6).bbox: [120, 10, -40, 30] has a negative
  width or height ([x, y, width, height])``. An annotation without a box of
  four numbers makes its image a `CocoProblem` (``bad_row``, as the row
  validation would), whose message gives the box as written and names the
  annotation (``objects[2] (annotations[5], id 6).bbox: expected 4 numbers
  [x, y, width, height], got [0, 0, 5]``).
- ``width``, ``height`` of the image entry (the size the annotation tool
  saw), when both are positive whole numbers: carried to the job as the
  row's `target_rows.DECLARED_SIZE`, which drops an image of another size
  in the frame the annotations are drawn on (``size_mismatch``,
  ``targets.annotations_frame``). Absent or 0, the size is not checked.
- ``class``: the category's name. An annotation whose ``category_id`` is not
  declared in ``categories`` gets the class ``undeclared category_id <id>``,
  which is in no class list: the row validation reports it as an unknown
  class, and ``targets.bad_objects`` decides whether it drops the object or
  the image, as for any bad object.
- ``iscrowd``: as written, 0 when absent.
- the other declared per-object fields (``targets.boxes.fields``, e.g.
  ``area``): as written; absent from an annotation, the row validation
  reports them missing.
- ``segmentation``: polygons and RLE (compressed or not) as written; the job
  rasterizes them. An empty list means no segmentation and is left out.
- ``keypoints`` (only when keypoint names are asked for): COCO's keypoints
  are pixel indices, so a labelled one (v > 0) moves to its pixel's centre:
  ``[10, 4, 2]`` becomes ``[10.5, 4.5, 2]`` (as detectron2 reads them), the
  continuous coordinates of boxes and polygons. Then reordered by name
  from the category's ``keypoints`` list into the asked order; a name the
  category lacks is ``[0, 0, 0]`` (not labelled). A category without names
  takes the annotation's triplets in order. If categories name their
  keypoints and an asked name is none of them, the file is refused
  (`CocoFileError`, with a did-you-mean): that keypoint would be "not
  labelled" in every object. An annotation
  whose list is not one triplet per name of its category makes its image a
  `CocoProblem` (``bad_row``, naming the annotation): triplets are matched
  to names by position, so they would be stored under other names.

A category's name is a class name as `target_rows.class_name` reads it
(stripped; refused if empty or with a control character). A broken
``categories`` entry (no id, no usable name, keypoints that are not a list
of names) or an id declared twice with another name or keypoints is a
`CocoFileError`: the categories are the class list, and the build stops
before any work. An exact repeat of an entry is ignored.

Images without annotations are rows with no objects. What cannot become a
row is a `CocoProblem`: an image id that annotations name but ``images``
does not declare (``dangling_annotation``: one problem per missing image,
naming its annotations, as it stands for one missing input image), an image
or annotation entry that lacks its ids or file name, a repeated image id,
an image with an annotation whose box is not four numbers or whose
keypoints do not match its category's names (``bad_row``).

A JSON object that gives a key twice (``{"bbox": [...], "bbox": [...]}``),
which JSON parsers read as its last value without a word, is refused as
the JSONL manifest refuses it (`_DuplicateKeys`, noted as ijson builds the
items): an image entry that does is a ``bad_row``, and so is an image with
an annotation that does (naming it); a ``categories`` entry that does, or a
key given twice at the top level (two ``images`` arrays), is a
`CocoFileError`, found in the first pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import operator
import posixpath
import re
from collections.abc import Iterator, Sequence
from typing import Any

import ijson

from kiln.errors import first_line, unknown_names
from kiln.pipeline import compressed, target_rows
from kiln.pipeline.listing import as_blob, from_blob, scratch_database

logger = logging.getLogger(__name__)

# Rows buffered in memory between inserts into the scratch database.
_BATCH = 10_000
# Annotations a message names one by one, at most.
_NAMED = 10
# Keypoint names a message lists, at most.
_NAMED_KEYPOINTS = 40
# SQLite's integers are signed 64-bit.
_MAX_ID = 2**63 - 1

UNDECLARED_CATEGORY = "undeclared category_id {}"
"""The class an annotation gets when its category is not declared (see the module docstring)."""


# How much of a file `looks_like_coco` reads: COCO's first keys (info,
# licenses) are short, and its arrays start within the first few KB.
_SNIFF_BYTES = 64 << 10
_BOM = b"\xef\xbb\xbf"
_COCO_ARRAY = re.compile(rb'"(?:images|annotations)"\s*:\s*\[')


def looks_like_coco(path: str) -> bool:
    """Whether the file `path` (compressed too, `compressed.without_suffix`)
    is named ``*.json`` and starts like a COCO instances file: a JSON object
    with an ``images`` or ``annotations`` array among its first
    `_SNIFF_BYTES` bytes. Reads only those, never the whole file; a file
    that cannot be read does not look like one."""
    if not compressed.without_suffix(path).lower().endswith(".json"):
        return False
    try:
        with compressed.open_decompressed(path) as f:
            head = f.read(_SNIFF_BYTES)
    except Exception:  # any filesystem's or decompressor's error: no hint, not a new error
        logger.debug("could not read the start of %s", path, exc_info=True)
        return False
    return head.lstrip(_BOM + b" \t\r\n").startswith(b"{") and bool(_COCO_ARRAY.search(head))


class CocoFileError(Exception):
    """The file as a whole cannot be used: unreadable, not JSON, no ``images`` array,
    a broken or ambiguous ``categories`` entry (the class list)."""


@dataclasses.dataclass(frozen=True)
class CocoRow:
    """One image of the file, as a manifest row.

    Attributes:
      where: ``<file>:images[<index>]``, for messages.
      row: The manifest row (``path``, ``objects``; see the module docstring).
      annotations: Each object's annotation as messages name it
        (``annotations[5], id 6``), in the order of ``objects``
        (`naming_annotations`); the listing hands them on to the job's
        messages as each object's `target_rows.ANNOTATION`.
    """

    where: str
    row: dict[str, Any]
    annotations: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CocoProblem:
    """An entry of the file that cannot become (part of) a row.

    Attributes:
      where: ``<file>:annotations[<index>]`` or ``<file>:images[<index>]``
        (for a missing image, its first annotation's).
      reason: ``dangling_annotation`` or ``bad_row``.
      message: What is wrong, for errors.jsonl.
      entry: The entry as written (canonical JSON text): what it contributes
        to the build's version, whatever its position in the file. For a
        missing image, ``{"annotations": [...]}``: its annotations' entries,
        sorted.
    """

    where: str
    reason: str
    message: str
    entry: str


@dataclasses.dataclass(frozen=True)
class Category:
    """A declared category: its name and keypoint names (empty if it has none)."""

    name: str
    keypoints: tuple[str, ...]


class CocoFile:
    """A COCO instances JSON file, read as a stream (see the module docstring).

    Args:
      path: Local path or URI of the JSON file.
      keypoint_names: The keypoints to put in each object, in this order;
        None leaves keypoints out of the rows.
      fields: Per-object fields (``targets.boxes.fields``) to pass on from
        each annotation that has them (``iscrowd`` always is, 0 when absent).
      name: The file's name in messages and in the keys of its problems
        (``<name>:images[<i>]``); None: its base name. Files of one source
        whose base names are alike (``train/_annotations.coco.json``,
        ``valid/_annotations.coco.json``) need longer names to stay apart.
    """

    def __init__(
        self,
        path: str,
        *,
        keypoint_names: Sequence[str] | None = None,
        fields: Sequence[str] = (),
        name: str | None = None,
    ):
        self.path = path
        self.name = posixpath.basename(path.rstrip("/")) if name is None else name
        self.keypoint_names = None if keypoint_names is None else tuple(keypoint_names)
        self.fields = tuple(name for name in fields if name != "iscrowd")
        self._categories: dict[Any, Category] | None = None

    def categories(self) -> dict[Any, Category]:
        """The declared categories by id (read once, on first use).

        Two ids of one name (as a class name reads: stripped, NFC) are one
        class, and their annotations one class's: allowed (a file merged from
        two exports), but logged as a warning, as a merge no one meant (two
        categories whose names differ only in spaces) would otherwise pass
        silently.

        Raises:
          CocoFileError: the file cannot be read or parsed, or an entry of
            ``categories`` is broken (no id or name, keypoints that are not a
            list of names) or declares an id again with another name or
            keypoints: the class list would be ambiguous. An exact repeat is
            ignored.
        """
        if self._categories is None:
            categories: dict[Any, Category] = {}
            first_index: dict[Any, int] = {}
            named: dict[str, Any] = {}  # a class name: the first category id of that name
            for index, (item, repeated) in enumerate(self._categories_and_top_level()):
                where = f"{self.name}:categories[{index}]"
                if repeated is not None:
                    raise CocoFileError(f"{where}: {_duplicate_message(repeated)}")
                category = _category(item)
                if isinstance(category, str):
                    raise CocoFileError(f"{where}: {category}")
                category_id, found = category
                if category_id not in categories:
                    categories[category_id], first_index[category_id] = found, index
                    other = named.setdefault(found.name, category_id)
                    if other != category_id:
                        logger.warning(
                            "%s: category id %s has the name %r of category id %s "
                            "(categories[%d]): their annotations are one class",
                            where,
                            json.dumps(category_id),
                            found.name,
                            json.dumps(other),
                            first_index[other],
                        )
                    continue
                first = first_index[category_id]
                if found != categories[category_id]:
                    raise CocoFileError(
                        f"{where}: category id {json.dumps(category_id)} is declared twice "
                        f"(also categories[{first}])"
                    )
                logger.info("%s: the same category as categories[%d], ignored", where, first)
            self._categories = categories
        return self._categories

    def class_names(self) -> list[str]:
        """The declared category names, sorted and distinct: the class list."""
        return sorted({category.name for category in self.categories().values()})

    def rows(self) -> Iterator[CocoRow | CocoProblem]:
        """Every image as a row (sorted by image id), and every problem.

        Raises:
          CocoFileError: the file cannot be read or parsed (also midway:
            a file cut short is not half read), its categories are broken
            (`categories`), or they name keypoints and one asked is none of them.
        """
        categories = self.categories()
        self._check_keypoint_names(categories)
        with _Spill() as spill:
            yield from self._spill_images(spill)
            yield from self._spill_annotations(spill)
            spill.flush()
            yield from self._join(spill, categories)

    def _check_keypoint_names(self, categories: dict[Any, Category]) -> None:
        """Refuses an asked keypoint name that no category has, where categories
        name their keypoints: that keypoint of every object would be "not
        labelled" (a typo, ``centre`` for ``center``, drops it silently)."""
        if self.keypoint_names is None:
            return
        names = list(dict.fromkeys(k for c in categories.values() for k in c.keypoints))
        unknown = [name for name in self.keypoint_names if name not in names]
        if not names or not unknown:
            return
        shown = ", ".join(names[:_NAMED_KEYPOINTS])
        if len(names) > _NAMED_KEYPOINTS:
            shown += f", ... ({len(names)} in all)"
        if len(unknown) == len(self.keypoint_names):
            raise CocoFileError(
                f"{self.name}: no category has any of the keypoints targets.keypoints.names "
                f"asks for ({', '.join(self.keypoint_names)}); its categories' keypoints are "
                f"{shown}"
            )
        which = unknown_names(
            list(unknown), names, "is a keypoint of no category", "are keypoints of no category"
        )
        raise CocoFileError(
            f"{self.name}: targets.keypoints.names: {which} (its categories' keypoints are {shown})"
        )

    # --- reading ------------------------------------------------------------------

    def _items(self, array: str) -> Iterator[tuple[Any, str | None]]:
        """The items of a top-level array, one at a time (an absent array has
        none), each with the first key it gives twice in one of its objects
        (None if none: see `_DuplicateKeys`)."""
        duplicates = _DuplicateKeys()
        with self._open() as f:
            for item in ijson.items(f, f"{array}.item", use_float=True, map_type=duplicates.type):
                yield item, duplicates.given_twice(item)

    def _categories_and_top_level(self) -> Iterator[tuple[Any, str | None]]:
        """`_items` of ``categories``, in a pass that also refuses a top-level
        key given twice (two ``images`` arrays would be read as one, and a
        whole-file parser keeps the last): ijson's events filtered to the
        top level and ``categories`` in C, so Python sees only those few.

        Raises:
          CocoFileError: a top-level key is given twice, once the pass is done.
        """
        duplicates = _DuplicateKeys()
        top_level: list[str] = []
        with self._open() as f:
            # A small read buffer: ijson's C parser makes the events of a
            # whole buffer before Python sees one, each with its prefix, so a
            # buffer of 64 KiB of "[" would hold 64 Ki prefixes of up to 320
            # KB (gigabytes) before `_refusing_deep_nesting` could refuse it.
            events, copy = itertools.tee(ijson.parse(f, use_float=True, buf_size=_BUFFER_BYTES))
            prefixes, lengths = itertools.tee(map(_PREFIX, copy))
            heads = map(_PREFIX_HEAD, prefixes)
            kept = itertools.compress(
                events,
                map(
                    operator.or_,
                    map(_KEPT_HEADS.__contains__, heads),
                    map(bool, map(_PAST_MAX_PREFIX, lengths)),
                ),
            )
            items = ijson.items(
                _noting_top_level_keys(_refusing_deep_nesting(kept, self.path), top_level),
                "categories.item",
                map_type=duplicates.type,
            )
            for item in items:
                yield item, duplicates.given_twice(item)
        repeated = next((key for key, count in _counts(top_level) if count > 1), None)
        if repeated is not None:
            raise CocoFileError(
                f"{self.path}: the top-level key {json.dumps(repeated)} is given twice; "
                f"a JSON object's keys must be distinct"
            )

    @contextlib.contextmanager
    def _open(self) -> Iterator[Any]:
        """The file, open for one pass; its read and parse errors as `CocoFileError`."""
        try:
            f = compressed.open_decompressed(self.path)  # a .json.gz too, in bounded memory
        except Exception as e:  # any filesystem's I/O error
            raise CocoFileError(f"cannot read {self.path}: {first_line(e)}") from None
        with f:
            try:
                # A UTF-8 byte order mark, as Windows tools write, is no JSON: skipped.
                head = f.read(len(_BOM))
                yield _TokenGuard(f, self.path, b"" if head == _BOM else head)
            except ijson.JSONError as e:
                raise CocoFileError(f"{self.path}: not valid JSON ({first_line(e)})") from None
            except CocoFileError:
                raise
            except Exception as e:  # any filesystem's I/O error midway
                raise CocoFileError(f"cannot read {self.path}: {first_line(e)}") from None

    def _spill_images(self, spill: _Spill) -> Iterator[CocoProblem]:
        found_any = False
        for index, (item, repeated) in enumerate(self._items("images")):
            found_any = True
            where = f"{self.name}:images[{index}]"
            if repeated is not None:
                yield CocoProblem(where, "bad_row", _duplicate_message(repeated), _canonical(item))
                continue
            image_id = item.get("id") if isinstance(item, dict) else None
            file_name = item.get("file_name") if isinstance(item, dict) else None
            if not _is_id(image_id):
                yield CocoProblem(
                    where, "bad_row", "'id' must be an integer or a string", _canonical(item)
                )
                continue
            if not isinstance(file_name, str) or not file_name:
                yield CocoProblem(
                    where, "bad_row", "'file_name' must be a non-empty string", _canonical(item)
                )
                continue
            spill.add_image(image_id, index, file_name, _compact(item), _declared_size(item))
        if not found_any:
            raise CocoFileError(f"{self.path}: no 'images' array, or an empty one")

    def _spill_annotations(self, spill: _Spill) -> Iterator[CocoProblem]:
        for index, (item, repeated) in enumerate(self._items("annotations")):
            image_id = item.get("image_id") if isinstance(item, dict) else None
            if not _is_id(image_id):
                yield CocoProblem(
                    f"{self.name}:annotations[{index}]",
                    "bad_row",
                    "'image_id' must be an integer or a string",
                    _canonical(item),
                )
                continue
            # An annotation that gives a key twice makes its image a bad row
            # (in `_join`, as a box that is not four numbers does).
            annotation_id = item.get("id")
            spill.add_annotation(
                image_id,
                annotation_id if _is_id(annotation_id) else None,
                index,
                _compact(item),
                repeated,
            )

    def _join(
        self, spill: _Spill, categories: dict[Any, Category]
    ) -> Iterator[CocoRow | CocoProblem]:
        """The merge join of images and annotations, both in image id order."""
        annotations = spill.annotations()
        pending = next(annotations, None)
        previous_id: Any = None
        first_index = -1
        for image_id, index, file_name, entry, size in spill.images():
            where = f"{self.name}:images[{index}]"
            if previous_id is not None and _order(image_id) == _order(previous_id):
                yield CocoProblem(
                    where,
                    "bad_row",
                    f"image id {image_id!r} is also the id of images[{first_index}]",
                    _canonical(json.loads(entry)),
                )
                continue
            previous_id, first_index = image_id, index
            # Annotations of ids below this image's have no image.
            while pending is not None and _order(pending[0]) < _order(image_id):
                problem, pending = self._dangling(pending, annotations)
                yield problem
            objects: list[dict] = []
            object_annotations: list[str] = []
            bad_box: str | None = None
            while pending is not None and _order(pending[0]) == _order(image_id):
                annotation = json.loads(pending[2])
                if bad_box is None and pending[3] is not None:
                    named = _named(annotation, pending[1])
                    bad_box = f"objects[{len(objects)}] ({named}): {_duplicate_message(pending[3])}"
                if bad_box is None:
                    bad_box = _bbox_problem(annotation, len(objects), pending[1])
                if bad_box is None and self.keypoint_names is not None:
                    bad_box = _keypoints_problem(annotation, len(objects), pending[1], categories)
                objects.append(self._object(annotation, pending[1], categories))
                object_annotations.append(_named(annotation, pending[1]))
                pending = next(annotations, None)
            row: dict[str, Any] = {"path": file_name, "objects": objects}
            if bad_box is not None:
                yield CocoProblem(where, "bad_row", bad_box, _canonical(row))
                continue
            if size is not None:
                row[target_rows.DECLARED_SIZE] = {
                    "width": size[0],
                    "height": size[1],
                    "by": "images[].width/height",
                }
            yield CocoRow(where, row, tuple(object_annotations))
        while pending is not None:
            problem, pending = self._dangling(pending, annotations)
            yield problem

    def _dangling(
        self, first: _Annotation, annotations: Iterator[_Annotation]
    ) -> tuple[CocoProblem, _Annotation | None]:
        """The one problem of a missing image: `first` and the annotations after it
        that name the same image id (consecutive, in image id order); and the
        annotation after them."""
        image_id = first[0]
        indexes, entries = [], []
        pending: _Annotation | None = first
        while pending is not None and _order(pending[0]) == _order(image_id):
            indexes.append(pending[1])
            entries.append(_canonical(json.loads(pending[2])))
            pending = next(annotations, None)
        indexes.sort()  # in file order (they come in id order)
        shown = ", ".join(f"annotations[{index}]" for index in indexes[:_NAMED])
        if len(indexes) > _NAMED:
            shown += f", ... (the first {_NAMED})"
        count = "1 annotation" if len(indexes) == 1 else f"{len(indexes)} annotations"
        problem = CocoProblem(
            f"{self.name}:annotations[{indexes[0]}]",
            "dangling_annotation",
            f"image_id {json.dumps(image_id)} is not the id of any entry of 'images'; "
            f"named by {count}: {shown}",
            # The entries, not their positions: sorted, as a reordered file is the same.
            '{"annotations":[' + ",".join(sorted(entries)) + "]}",
        )
        return problem, pending

    def _object(
        self, annotation: dict[str, Any], index: int, categories: dict[Any, Category]
    ) -> dict:
        category_id = annotation.get("category_id")
        category = categories.get(category_id) if _is_id(category_id) else None
        found: dict[str, Any] = {
            "class": category.name
            if category is not None
            else UNDECLARED_CATEGORY.format(json.dumps(category_id))
        }
        if "bbox" in annotation:
            found["bbox"] = _corners(annotation["bbox"])
            if _not_positive_size(annotation["bbox"]):
                # The job refuses the box (bad_box); its message shows it as written.
                # Named as every object is (`target_rows.ANNOTATION`), not here:
                # the name is no part of the version, the box is.
                found[target_rows.AS_WRITTEN] = {"bbox": annotation["bbox"]}
        found["iscrowd"] = annotation.get("iscrowd", 0)
        for name in self.fields:
            if name in annotation:
                found[name] = annotation[name]
        segmentation = annotation.get("segmentation")
        if segmentation is not None and segmentation != []:
            found["segmentation"] = segmentation
        if self.keypoint_names is not None:
            found["keypoints"] = _keypoints(
                annotation.get("keypoints"),
                category.keypoints if category is not None else (),
                self.keypoint_names,
            )
        return found


def _category(item: Any) -> tuple[Any, Category] | str:
    """A categories entry's (id, category), or what is wrong with it."""
    if not isinstance(item, dict):
        return "expected a JSON object"
    category_id, name, keypoints = item.get("id"), item.get("name"), item.get("keypoints", [])
    if not _is_id(category_id):
        return "'id' must be an integer or a string"
    if not isinstance(name, str) or not name:
        return "'name' must be a non-empty string"
    try:  # the class list: the rule of every class name read from data
        name = target_rows.class_name(name, "'name'")
    except target_rows.AnnotationError as e:
        return str(e)
    if not isinstance(keypoints, list) or not all(isinstance(k, str) for k in keypoints):
        return "'keypoints' must be a list of names"
    return category_id, Category(name, tuple(keypoints))


def _declared_size(item: dict[str, Any]) -> tuple[int, int] | None:
    """An image entry's ``(width, height)``, when both are positive whole
    numbers (``640`` or ``640.0``); None otherwise: not checked."""
    found = []
    for name in ("width", "height"):
        value: Any = item.get(name)
        if not _is_number(value) or not float(value).is_integer() or value <= 0:
            return None
        found.append(int(value))
    return found[0], found[1]


def _bbox_problem(annotation: dict[str, Any], number: int, index: int) -> str | None:
    """What is wrong with an annotation's box as written (not four numbers), naming
    the object, the annotation and its id; None if nothing."""
    bbox = annotation.get("bbox")
    if type(bbox) is list and len(bbox) == 4 and all(map(_is_number, bbox)):
        return None
    got = _shown(bbox) if "bbox" in annotation else "no 'bbox'"
    return (
        f"objects[{number}] ({_named(annotation, index)}).bbox: expected 4 numbers "
        f"[x, y, width, height], got {got}"
    )


def _keypoints_problem(
    annotation: dict[str, Any], number: int, index: int, categories: dict[Any, Category]
) -> str | None:
    """What is wrong with an annotation's keypoints list as written (not one
    ``[x, y, v]`` triplet per keypoint name of its category), naming the
    object, the annotation and its id; None if nothing (or if its category
    names no keypoints: the row validation then checks the length against
    the asked names).

    Triplets are matched to names by position: with one too few or too many,
    every keypoint after the gap would be stored under another name."""
    found = annotation.get("keypoints")
    category_id = annotation.get("category_id")
    category = categories.get(category_id) if _is_id(category_id) else None
    if category is None or not category.keypoints or not isinstance(found, list):
        return None
    if len(found) == 3 * len(category.keypoints):
        return None
    names = ", ".join(category.keypoints[:_NAMED_KEYPOINTS])
    if len(category.keypoints) > _NAMED_KEYPOINTS:
        names += ", ..."
    return (
        f"objects[{number}] ({_named(annotation, index)}).keypoints: {len(found)} numbers, "
        f"expected {3 * len(category.keypoints)} ([x, y, v] for each of the "
        f"{len(category.keypoints)} keypoints of category {json.dumps(category_id)}, "
        f"{category.name!r}: {names})"
    )


def naming_annotations(message: str, annotations: Sequence[str]) -> str:
    """A message of the row validation about a `CocoRow`'s object
    (``objects[0].area: missing ...``) with the object's annotation named, as
    this module's own messages name it (``objects[0] (annotations[2], id
    3).area: ...``): an image's objects are in annotation id order, not the
    file's, so "objects[0]" alone would point to the image's first annotation
    in the file, which may be another. `annotations`: `CocoRow.annotations`.
    A message about no one object is returned as it is."""
    return target_rows.renamed(message, [{target_rows.ANNOTATION: a} for a in annotations])


def _named(annotation: dict[str, Any], index: int) -> str:
    """``annotations[5], id 6``: an annotation as messages name it."""
    named = f"annotations[{index}]"
    if _is_id(annotation.get("id")):
        named += f", id {json.dumps(annotation['id'])}"
    return named


def _not_positive_size(bbox: Any) -> bool:
    """Whether a box of four numbers has a negative or zero width or height."""
    return (
        type(bbox) is list
        and len(bbox) == 4
        and all(map(_is_number, bbox))
        and (bbox[2] <= 0 or bbox[3] <= 0)
    )


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _corners(bbox: Any) -> Any:
    """COCO's ``[x, y, width, height]`` as ``[x_min, y_min, x_max, y_max]``;
    anything but four numbers as written."""
    if type(bbox) is not list or len(bbox) != 4:
        return bbox
    x, y, width, height = bbox
    if _is_number(x) and _is_number(y) and _is_number(width) and _is_number(height):
        return [x, y, x + width, y + height]
    return bbox


def _keypoints(found: Any, category_names: tuple[str, ...], wanted: tuple[str, ...]) -> Any:
    """The annotation's ``[x, y, v]`` triplets in the order of `wanted`, labelled
    ones moved to their pixel's centre (`_pixel_centres`)."""
    if found is None:
        return [0] * (3 * len(wanted))
    if not isinstance(found, list) or (category_names and len(found) != 3 * len(category_names)):
        return found  # as written: a bad row (`_keypoints_problem`, the row validation)
    found = _pixel_centres(found)
    if not category_names:
        return found  # in order: the row validation checks its length
    by_name = {name: found[3 * i : 3 * i + 3] for i, name in enumerate(category_names)}
    out: list[Any] = []
    for name in wanted:
        out.extend(by_name.get(name, [0, 0, 0]))
    return out


def _pixel_centres(found: list) -> list:
    """COCO's keypoints are pixel indices (integers in ``[0, width - 1]``), kiln's
    are continuous coordinates whose pixel ``i`` spans ``[i, i + 1)``: a labelled
    keypoint (v > 0) marking pixel ``i`` is at ``i + 0.5``, as detectron2's
    ``load_coco_json`` reads them. Unlabelled triplets, and a list that is not
    triplets of numbers (the row validation reports it), are left as written."""
    if len(found) % 3 or not all(map(_is_number, found)):
        return found
    out = list(found)
    for start in range(0, len(out), 3):
        if out[start + 2] > 0:
            out[start] += 0.5
            out[start + 1] += 0.5
    return out


def _is_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -_MAX_ID <= value <= _MAX_ID
    return isinstance(value, str)


def _is_number(value: Any) -> bool:
    # ijson gives int and float (use_float); bool is an int subclass, not a number here.
    return type(value) is float or type(value) is int


def _order(image_id: Any) -> tuple[int, Any]:
    """Image ids in SQLite's order: integers before strings."""
    return (1, image_id) if isinstance(image_id, str) else (0, image_id)


def _canonical(item: Any) -> str:
    return json.dumps(item, sort_keys=True, separators=(",", ":"), default=_json_default)


def _compact(item: Any) -> str:
    """JSON text for the spill: quicker than `_canonical` (no key sorting, one encoder)."""
    return _COMPACT.encode(item)


# json.dumps builds a new encoder per call when given any option.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _json_default(value: Any) -> Any:
    raise TypeError(f"not JSON: {value!r}")


# The most bytes one token may hold (a string, a number) and one run of
# spaces that is read with something else. A COCO file's are names, numbers
# and RLE strings, far shorter; see `_TokenGuard`.
_MAX_RUN_BYTES = 1 << 20
_DELIMITERS = tuple(bytes([c]) for c in b'",:[]{}')
_QUOTE = b'"'
_BACKSLASH = 0x5C


class _TokenGuard:
    """A COCO file read for ijson, refusing a token of more than `_MAX_RUN_BYTES`.

    yajl, ijson's C parser, lexes a token again from its start whenever a
    read ends inside it, so a token's cost grows with its square: a 20 MB
    string took 0.8 s, an 80 MB one 11.5 s, and a 100 MB ``file_name`` (a
    file that embeds an image, a corrupt one) did not finish in 10 minutes.
    Such a token is refused once it passes the cap, in a fraction of a
    second, whatever it holds: the guard follows whether each read ends
    inside a string (the parity of the unescaped quotes before it, counted
    with `bytes.count`, so a read costs a few passes in C), and measures a
    string from its opening quote, commas, brackets and escaped quotes
    included. Outside strings a run is what lies after the last delimiter
    (``"``, ``,``, ``:``, brackets, braces): a number, a literal or spaces.
    Reads of spaces alone between tokens do not count (yajl does not lex
    them again).

    Raises (from `read`):
      CocoFileError: such a token; its message names the file.
    """

    def __init__(self, f: Any, path: str, head: bytes = b""):
        self._f = f
        self._path = path
        self._head = head  # bytes read from `f` before, read first
        self._run = 0  # bytes of the token the last read ended in
        self._in_string = False  # whether the last read ended inside a string
        self._backslashes = 0  # backslashes that ended the last read

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            chunk = self._f.read(size)
        elif 0 <= size <= len(self._head):
            chunk, self._head = self._head[:size], self._head[size:]
        else:
            chunk = self._head + self._f.read(size - len(self._head) if size > 0 else -1)
            self._head = b""
        quotes = _unescaped_quotes(chunk, self._backslashes)
        if quotes % 2:
            self._in_string = not self._in_string
        if self._in_string:
            opening = _last_unescaped_quote(chunk, self._backslashes) if quotes else -1
            self._run = len(chunk) - opening - 1 if opening >= 0 else self._run + len(chunk)
        else:
            last = max(chunk.rfind(delimiter) for delimiter in _DELIMITERS)
            if last >= 0:
                self._run = len(chunk) - last - 1
            elif chunk.strip():  # spaces alone between tokens cost yajl nothing
                self._run += len(chunk)
        stripped = chunk.rstrip(b"\\")
        trailing = len(chunk) - len(stripped)
        self._backslashes = trailing if stripped or not chunk else self._backslashes + trailing
        if self._run > _MAX_RUN_BYTES:
            raise CocoFileError(
                f"{self._path}: a token of more than {_MAX_RUN_BYTES} bytes "
                f"(a string, number or space run this long is not a COCO file's)"
            )
        return chunk


def _unescaped_quotes(chunk: bytes, backslashes: int) -> int:
    """How many of `chunk`'s quotes are not escaped, the chunk following
    `backslashes` backslashes. A quote is escaped by an odd run of
    backslashes before it: with ``c[k]`` the number of quotes after at least
    ``k`` backslashes (``bytes.count`` of k backslashes and a quote: these
    never overlap, each ends at its own quote), the escaped ones are
    ``c[1] - c[2] + c[3] - ...``."""
    total = chunk.count(_QUOTE)
    if not total or (not backslashes and _BACKSLASH not in chunk):  # most reads: no escapes
        return total
    escaped, sign, k = 0, 1, 1
    while True:
        count = chunk.count(b"\\" * k + _QUOTE)
        if not count:
            break
        escaped += sign * count
        sign, k = -sign, k + 1
    # A quote among the first bytes, after backslashes that ended the last read.
    if backslashes:
        lead = len(chunk) - len(chunk.lstrip(b"\\"))
        if lead < len(chunk) and chunk[lead] == _QUOTE[0]:
            before = (lead % 2) == 1  # as counted above, from this chunk alone
            after = ((lead + backslashes) % 2) == 1
            escaped += int(after) - int(before)
    return total - escaped


def _last_unescaped_quote(chunk: bytes, backslashes: int) -> int:
    """The position of `chunk`'s last unescaped quote, or -1."""
    end = len(chunk)
    while True:
        position = chunk.rfind(_QUOTE, 0, end)
        if position < 0:
            return -1
        start = position
        while start > 0 and chunk[start - 1] == _BACKSLASH:
            start -= 1
        run = position - start + (backslashes if start == 0 else 0)
        if run % 2 == 0:
            return position
        end = position


# A spilled annotation: (image id, position, entry, a key it gives twice or None).
_Annotation = tuple[Any, int, str, "str | None"]

# ijson's parse events (prefix, event, value): the first 10 characters of the
# prefix, "" at the top level and "categories" in that array (or a key that
# starts so: `ijson.items` picks the array itself).
_PREFIX = operator.itemgetter(0)
_PREFIX_HEAD = operator.itemgetter(slice(0, len("categories")))
_KEPT_HEADS = frozenset({"", "categories"})
# Events whose prefix is longer than this are passed to Python too, which
# refuses them (`_refusing_deep_nesting`): "annotations.item.segmentation.item"
# is 35 characters.
_MAX_PREFIX = 4096
_PAST_MAX_PREFIX = operator.itemgetter(slice(_MAX_PREFIX, _MAX_PREFIX + 1))
_BUFFER_BYTES = 1024


def _refusing_deep_nesting(events: Iterator[tuple], path: str) -> Iterator[tuple]:
    """`events`, passed on, refused from the first whose prefix is longer
    than `_MAX_PREFIX` characters: ijson keeps the prefix of every open
    level, so a file nested 100,000 levels deep (200 KB of ``[``) would take
    tens of gigabytes of prefixes; a COCO file is a few levels deep.

    Raises:
      CocoFileError: naming the file and what is wrong.
    """
    for event in events:
        if len(event[0]) > _MAX_PREFIX:
            raise CocoFileError(
                f"{path}: nested too deeply (the path of keys to a value is longer than "
                f"{_MAX_PREFIX} characters: {event[0][:60]}...); a COCO file is a few levels deep"
            )
        yield event


def _noting_top_level_keys(events: Iterator[tuple], keys: list[str]) -> Iterator[tuple]:
    """`events`, passed on, with every top-level key appended to `keys`."""
    for event in events:
        if event[1] == "map_key" and event[0] == "":
            keys.append(event[2])
        yield event


def _counts(keys: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


def _duplicate_message(key: str) -> str:
    """The words of the JSONL manifest's bad row for the same problem."""
    return f"duplicate key {json.dumps(key)} in a JSON object"


class _DuplicateKeys:
    """What ijson's object builder notes about keys given twice.

    Python's `json` and ijson alike keep the last of two values of a key
    (``{"bbox": [...], "bbox": [...]}``), silently; the JSONL manifest
    refuses such an object, and so does a COCO file. `type` is the mapping
    type ijson builds objects with (``map_type``): a dict whose item
    assignment notes a key already there. ijson's C parser builds a few
    items ahead of the one it yields, so what is noted is kept per object,
    and `given_twice` looks for the objects of one item only when something
    was noted: a file without duplicates costs one dict lookup per key.
    """

    def __init__(self):
        found: dict[int, tuple[dict, str]] = {}  # id(object): (object, the first key repeated)

        class _Object(dict):
            __slots__ = ()

            def __setitem__(self, key, value):
                if key in self and id(self) not in found:
                    found[id(self)] = (self, key)
                dict.__setitem__(self, key, value)

        self.type = _Object
        self._found = found

    def given_twice(self, item: Any) -> str | None:
        """A key that an object of `item` (it or one inside it) gives twice, or None."""
        if not self._found:
            return None
        repeated = None
        stack = [item]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                noted = self._found.pop(id(value), None)
                if noted is not None and repeated is None:
                    repeated = noted[1]
                stack.extend(reversed(list(value.values())))
            elif isinstance(value, list):
                stack.extend(reversed(value))
        return repeated


class _Spill:
    """The images and annotations of one file in a scratch SQLite database."""

    def __init__(self):
        self._connection = scratch_database()
        self._connection.executescript(
            """
            CREATE TABLE images (id, position INTEGER, file_name BLOB, entry BLOB,
                                 width INTEGER, height INTEGER);
            CREATE TABLE annotations (image_id, id, position INTEGER, entry BLOB,
                                      duplicate BLOB);
            """
        )
        self._connection.execute("BEGIN")
        self._images: list[tuple] = []
        self._annotations: list[tuple] = []

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc) -> None:
        self._connection.close()

    def add_image(
        self,
        image_id: Any,
        position: int,
        file_name: str,
        entry: str,
        size: tuple[int, int] | None = None,
    ) -> None:
        """`size`: the image's declared ``(width, height)`` (`_declared_size`), or None."""
        width, height = size if size is not None else (None, None)
        self._images.append((image_id, position, as_blob(file_name), as_blob(entry), width, height))
        if len(self._images) >= _BATCH:
            self.flush()

    def add_annotation(
        self,
        image_id: Any,
        annotation_id: Any,
        position: int,
        entry: str,
        duplicate: str | None = None,
    ) -> None:
        """`annotation_id`: the annotation's ``id`` (an integer or a string), or
        None; `duplicate`: a key the annotation gives twice (`_DuplicateKeys`),
        or None."""
        self._annotations.append(
            (
                image_id,
                annotation_id,
                position,
                as_blob(entry),
                None if duplicate is None else as_blob(duplicate),
            )
        )
        if len(self._annotations) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if self._images:
            self._connection.executemany(
                "INSERT INTO images VALUES (?, ?, ?, ?, ?, ?)", self._images
            )
            self._images.clear()
        if self._annotations:
            self._connection.executemany(
                "INSERT INTO annotations VALUES (?, ?, ?, ?, ?)", self._annotations
            )
            self._annotations.clear()

    def images(self) -> Iterator[tuple[Any, int, str, str, tuple[int, int] | None]]:
        """(id, position, file name, entry, declared (width, height) or None), by id
        then position."""
        for image_id, position, file_name, entry, width, height in self._connection.execute(
            "SELECT id, position, file_name, entry, width, height FROM images ORDER BY id, position"
        ):
            size = None if width is None else (width, height)
            yield image_id, position, from_blob(file_name), from_blob(entry), size

    def annotations(self) -> Iterator[_Annotation]:
        """(image id, position, entry, key given twice or None), by image id,
        then annotation id (an image's objects in the same order however a tool
        ordered the array: a file exported again is the same input; integers
        before strings, those without an id last), then position in the file."""
        for image_id, position, entry, duplicate in self._connection.execute(
            "SELECT image_id, position, entry, duplicate FROM annotations "
            "ORDER BY image_id, id IS NULL, id, position"
        ):
            yield (
                image_id,
                position,
                from_blob(entry),
                None if duplicate is None else from_blob(duplicate),
            )
