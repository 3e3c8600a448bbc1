"""Reading a Pascal VOC annotation folder (one XML file per image) as manifest rows.

Each ``Annotations/<name>.xml`` names its image (``<filename>``) and lists
its objects::

    <annotation>
      <filename>2007_000027.jpg</filename>
      <object>
        <name>person</name> <truncated>0</truncated> <difficult>0</difficult>
        <bndbox><xmin>174</xmin><ymin>101</ymin><xmax>349</xmax><ymax>351</ymax></bndbox>
      </object>
    </annotation>

and becomes the row of the JSONL manifest with targets::

    {"path": "2007_000027.jpg",
     "objects": [{"bbox": [173, 100, 349, 351], "class": "person",
                  "difficult": 0, "truncated": 0}]}

VOC counts pixels from 1 and its boxes include their last pixel: pixel
column ``xmin`` is the box's first, ``xmax`` its last, so in kiln's
continuous coordinates (column i covers [i, i + 1), from 0) the box is
``[xmin - 1, ymin - 1, xmax, ymax]``. ``difficult``, ``truncated`` and
``occluded`` are 0 when absent; declare the ones to keep as
``targets.boxes.fields`` (e.g. ``{difficult: int, truncated: float}``):
only those are checked, against the declared type (`_flag`). They are all
a VOC object gives: the config refuses any other field (`FLAGS`).

``<size>`` (``<width>``, ``<height>``: the image's size as the annotation
tool saw it) is carried to the job as the row's `target_rows.DECLARED_SIZE`,
which drops an image of another size (``size_mismatch``); a size that is
absent, not a whole number or 0 is not checked.

A file that is not well-formed XML, lacks ``<filename>`` (a file whose
elements are in an XML namespace, ``<annotation xmlns="...">``, lacks them
all: the message says so), has an object without ``<bndbox>`` or a box
coordinate that is not a number is a `VocProblem` (``bad_row``); messages
name objects as a manifest's do, from 0 (``objects[0]: <xmin> must be a
number``). Files are
parsed with the standard library's expat parser, which (expat 2.4.1 and
later) refuses entity expansion bombs and never fetches external entities;
a file larger than `MAX_FILE_BYTES` is refused unread.
"""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
import pyexpat
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule
from kiln.pipeline import storage, target_rows

if TYPE_CHECKING:
    from apache_beam.io.filesystems import FileSystems
else:  # Beam on first use: validating a config needs none of it
    FileSystems = LazyModule("apache_beam.io.filesystems", "FileSystems")

MAX_FILE_BYTES = 4 * 1024 * 1024  # VOC files are a few KB
# The first expat that limits entity expansion (CVE-2013-0340, "billion laughs").
SAFE_EXPAT = (2, 4, 1)
# The per-object fields a VOC object gives (`targets.boxes.fields`).
FLAGS = ("difficult", "truncated", "occluded")


@dataclasses.dataclass(frozen=True)
class VocRow:
    """One annotation file as a manifest row.

    Attributes:
      where: The file's path relative to the annotation folder.
      uri: The file's path or URI (named in errors.jsonl if the row is dropped).
      row: The manifest row (``path``, ``objects``).
    """

    where: str
    uri: str
    row: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class VocProblem:
    """An annotation file that cannot become a row (``bad_row``): `where` and
    `uri` as a `VocRow`'s."""

    where: str
    uri: str
    message: str


def read_folder(folder: str) -> Iterator[VocRow | VocProblem]:
    """Every ``.xml`` file below `folder` (hidden ones skipped), as a row or a problem,
    in path order.

    A symbolic link to a folder inside `folder` is not entered (it can lead
    anywhere, ``/`` included): it is a problem of its own.
    """
    folder = folder.rstrip("/")
    store = storage.store_for(folder)
    paths, linked = [], set()
    for metadata in store.walk_tree(folder, skip_hidden=True, links_above=1):
        if metadata.path.lower().endswith(".xml"):
            paths.append(metadata.path)
        elif not metadata.size_in_bytes and os.path.islink(metadata.path):
            linked.add(metadata.path)
    for path in sorted([*paths, *linked]):
        where = posixpath.relpath(path.replace("\\", "/"), folder.replace("\\", "/"))
        if path in linked:
            yield VocProblem(
                where, path, "a linked folder: not entered (name the folder it links to instead)"
            )
            continue
        try:
            yield VocRow(where, path, parse(_read(path)))
        except _VocError as e:
            yield VocProblem(where, path, str(e))


class _VocError(Exception):
    pass


def _read(path: str) -> bytes:
    try:
        with FileSystems.open(path) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except Exception as e:  # any filesystem's I/O error
        raise _VocError(f"cannot read the file: {str(e).strip()[:200]}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _VocError(f"larger than {MAX_FILE_BYTES} bytes: not a VOC annotation")
    return data


def parse(data: bytes) -> dict[str, Any]:
    """One VOC annotation file's manifest row.

    Raises:
      _VocError: not well-formed XML, no ``<filename>``, an object without
        ``<bndbox>``, a box coordinate that is not a number.
    """
    if pyexpat.version_info < SAFE_EXPAT:
        raise RuntimeError(
            f"expat {pyexpat.EXPAT_VERSION} does not limit entity expansion; kiln reads VOC "
            f"files with expat {'.'.join(map(str, SAFE_EXPAT))} or later (a newer Python)"
        )
    try:
        root = ElementTree.fromstring(data)  # noqa: S314  (see the module docstring)
    except ElementTree.ParseError as e:
        raise _VocError(f"not well-formed XML: {e}") from None
    filename = (root.findtext("filename") or "").strip()
    if not filename:
        if root.tag.startswith("{"):  # every element's name is then in that namespace
            namespace = root.tag[1:].partition("}")[0]
            raise _VocError(
                f"<filename> is missing or empty: the file puts its elements in the XML "
                f"namespace {namespace!r} (an xmlns attribute), where VOC's have none; remove it"
            )
        raise _VocError("<filename> is missing or empty")
    objects = []
    for index, element in enumerate(root.iter("object")):
        where = f"objects[{index}]"
        found: dict[str, Any] = {"class": (element.findtext("name") or "").strip()}
        box = element.find("bndbox")
        if box is None:  # in VOC's words, not the row check's ("bbox: ... got null")
            raise _VocError(f"{where}: no <bndbox>")
        xmin, ymin, xmax, ymax = (
            _number(box.findtext(name), f"{where}: <{name}>")
            for name in ("xmin", "ymin", "xmax", "ymax")
        )
        found["bbox"] = [xmin - 1, ymin - 1, xmax, ymax]
        for flag in FLAGS:
            found[flag] = _flag(element.findtext(flag))
        objects.append(found)
    row: dict[str, Any] = {"path": filename, "objects": objects}
    width, height = (_size(root.findtext(f"size/{name}")) for name in ("width", "height"))
    if width and height:
        row[target_rows.DECLARED_SIZE] = {"width": width, "height": height, "by": "<size>"}
    return row


def _size(text: str | None) -> int | None:
    """A ``<size>`` side as a positive integer, or None (absent, not a whole
    number, or 0, which tools that could not read the image write)."""
    try:
        value = float((text or "").strip())
    except ValueError:
        return None
    return int(value) if value.is_integer() and value > 0 else None


def _flag(text: str | None) -> int | float | str:
    """A ``<difficult>``, ``<truncated>`` or ``<occluded>`` as written: an
    integer, else a number (converters from KITTI write a fraction
    truncated, ``0.00``), else its text; 0 when absent. Only a field the
    config declares is checked, against its declared type
    (`target_rows.row_targets`: ``expected an integer, got 0.5``); the
    others are not read."""
    text = (text or "0").strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def _number(text: str | None, where: str) -> float | int:
    text = (text or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise _VocError(f"{where} must be a number, got {text[:40]!r}") from None
    return int(value) if value.is_integer() else value
