"""The job's side of targets: one image's annotations in, record features out.

`TargetCodec` turns the targets a source listed for an image (canonical
JSON, `kiln.pipeline.target_rows`) into `kiln.transforms.Targets` in the
pixels they are drawn on, the source file's as stored or upright (`load`,
`TargetCodec.frame`): it reads and decodes mask files, rasterizes polygons
and RLE (`kiln.transforms.segmentation_to_mask`), maps class names to ids,
and checks what needs the image. After EXIF
orientation and the offline transforms have moved them with the image
(`kiln.transforms.orient_targets`, `Chain.apply`), `features` normalizes
them to the stored image and returns the record's target features and what
the job counts about them.

Bad annotations raise `BadAnnotation` with a reason (errors.jsonl's
``targets`` stage), or, under ``bad_objects: drop_object``, drop the object
and are counted in kiln.json:

==================== =====================================================
reason               what
==================== =====================================================
bad_box              a coordinate is NaN or infinite, x_max < x_min or
                     y_max < y_min, zero width or height (a point or a
                     line), the box lies outside the image or
                     reaches more than `FAR_OUTSIDE` of its size beyond it
unknown_class        a class (object, label or labels) not in the class list,
                     or a semantic mask pixel that is neither a class id nor
                     the ignore value
bad_keypoints        a labelled keypoint with a NaN or infinite coordinate,
                     or more than `FAR_OUTSIDE` of the image's size beyond it
                     (nearer, outside the image, it is kept as not visible)
missing_mask         a mask file that cannot be read
corrupt_mask         a mask file that does not decode, is lossy (JPEG, lossy
                     WebP, AVIF, JPEG 2000) or is not one channel of at most
                     8 bits (`transforms.decode_mask_file`)
mask_size_mismatch   a mask (file or RLE) whose size differs from its image
bad_polygon          a polygon with fewer than 3 points or odd coordinates
bad_segmentation     an RLE that does not decode
box_mask_mismatch    an instance mask whose pixels' box overlaps its
                     object's box by an IoU below `MIN_BOX_MASK_IOU`, or
                     an empty one under a box that covers pixel centres,
                     larger than `BOX_MASK_TOLERANCE` on a side
size_mismatch        the size the annotations declare for the image
                     (`target_rows.DECLARED_SIZE`: COCO's width and height,
                     VOC's ``<size>``) is not its size in the frame they
                     are drawn on (`check_declared_size`)
==================== =====================================================

Annotations are drawn on the file's stored pixels (``targets.annotations_frame:
stored``, the default: the EXIF orientation moves them with the image) or
on the image as viewers show it (``upright``: the orientation moves the
pixels only). `TargetCodec.frame` gives the decoded image as the
annotations see it, so the rest of the job (loading at its size, then
`kiln.transforms.orient_targets`) serves both.

The semantic mask and image-level labels always drop the image: there is
no object to drop instead.

Mask files are read at most once per image, before its pixels are decoded
(`TargetCodec.read`): their sha256 names them in the targets' *content*
(`ListedTargets.content`, the listed targets with every mask path replaced
by its file's sha256), which is both the file's version entry and part of
the key an incremental build reuses a record by (`TargetCodec.reuse_key`),
and their bytes are what `TargetCodec.load` decodes. In an incremental
build a mask file whose path and stamp (size, modification time and, for a
local file, inode and ctime) are those the base version listed for the
image is not read: its sha256 is the one the base's record index keeps
(`MaskFiles.read`'s ``base``, from `kiln.pipeline.incremental.base_masks`),
as an image file's is taken from its row. If the record is then reused
(or relabelled, or moved) its bytes are never needed; if the image is
processed after all, the masks not read are read then
(`TargetCodec.completed`), and the content follows their bytes as read.
Each mask file read is compared with its listed stamp (one listed as not
found that is found, or the reverse, or another size or time:
`MaskFiles.disagreements`, `kiln.pipeline.stamp_disagreements`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from kiln import transforms
from kiln.errors import first_line
from kiln.pipeline import box_convention, stamp_disagreements, storage, target_rows
from kiln.pipeline.box_convention import FAR_OUTSIDE
from kiln.pipeline.statistics import TargetCounts
from kiln.schemas import TargetsConfig
from kiln.transforms.encode import MAX_SIDE

REASONS = (
    "bad_box",
    "unknown_class",
    "bad_keypoints",
    "missing_mask",
    "corrupt_mask",
    "mask_size_mismatch",
    "bad_polygon",
    "bad_segmentation",
    "box_mask_mismatch",
    "size_mismatch",
)
# An instance mask and its object's box disagree when the box around the
# mask's pixels overlaps the object's box by less than this IoU and one of
# their sides differs by more than BOX_MASK_TOLERANCE pixels (rasterizing a
# tiny object's polygon moves its sides by up to a pixel each).
MIN_BOX_MASK_IOU = 0.5
BOX_MASK_TOLERANCE = 2.0
# kiln.json's count of objects the transforms left too little of.
MIN_VISIBILITY = "min_visibility"
# A per-object column of the job's own: the object's index in the listed
# objects, so a dropped object is named by it (never stored in a record).
SOURCE_INDEX = "_listed_index"


class BadAnnotation(Exception):
    """An annotation the job cannot use; `reason` is one of `REASONS`.

    `located` is the message naming where the files are (errors.jsonl's,
    beside the image's URI), `str(e)` the same without their folders: what
    a dropped object's record keeps, since a record's bytes and index line
    do not depend on where the data is.
    """

    def __init__(self, reason: str, message: str, located: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.located = message if located is None else located

    def __reduce__(self):
        return BadAnnotation, (self.reason, str(self), self.located)


class MaskFiles:
    """The bytes of the mask files an image's targets name, read once; or,
    for those whose stamps an incremental build trusts, their sha256 alone.

    Args:
      contents: URI -> the file's bytes, or why it could not be read
        (text: a missing mask is a bad annotation only where it is used,
        see `data`).
      unread: URI -> the sha256 of a file not read (its stamp is the one
        the base version listed: `read`).
      reads: How many files were read to make it (`read_count`).
      listed: URI -> ``(size, mtime)`` as listed (`read`'s ``stamps``).
      seen: URI -> ``(size, mtime)`` of a file read as its read found it
        (`storage.input_stamp`), or None: not found. Compared with
        `listed` by `disagreements`.
    """

    def __init__(
        self,
        contents: Mapping[str, bytes | str],
        unread: Mapping[str, str] | None = None,
        reads: int = 0,
        listed: Mapping[str, stamp_disagreements.Stamp] | None = None,
        seen: Mapping[str, stamp_disagreements.Seen | None] | None = None,
    ):
        self._contents = dict(contents)
        self._sha256 = {
            uri: hashlib.sha256(data).hexdigest()
            for uri, data in self._contents.items()
            if isinstance(data, bytes)
        }
        self._unread = {
            uri: sha256 for uri, sha256 in (unread or {}).items() if uri not in contents
        }
        self._reads = reads
        self._listed = dict(listed or {})
        self._seen = dict(seen or {})

    @classmethod
    def read(
        cls,
        row: Mapping[str, Any],
        stamps: Sequence[Sequence[Any]] | None = None,
        base: Mapping[str, tuple[int, float, str | None, str]] | None = None,
    ) -> MaskFiles:
        """Reads every mask file the targets `row` names (each once), but
        those `base` vouches for.

        Args:
          row: The targets.
          stamps: ``[size, mtime]`` of each mask file `row` names (a
            local one's ``[size, mtime, inode_ctime]``), in
            `target_rows.mask_uris` order, as listed now
            (`listing.SourceFile.mask_stamp`).
          base: URI -> ``(size, mtime, inode_ctime, sha256)`` of the mask
            files the base version listed for the image, their sha256 as
            its record index keeps them
            (`kiln.pipeline.incremental.base_masks`). A file listed now with
            that size, modification time and status-change identity (a time
            of 0 or less is no stamp; a local file the base listed without
            its identity is read) is not read: its sha256 is the base's.
        """
        named = list(target_rows.mask_uris(row))
        listed: dict[str, stamp_disagreements.Stamp] = {}
        if stamps is None or len(stamps) != len(named):
            stamps = [(-1, 0.0)] * len(named)  # none to compare: every file is read
        else:
            for (_, uri), stamp in zip(named, stamps, strict=True):
                listed.setdefault(uri, (int(stamp[0]), float(stamp[1])))
        unread: dict[str, str] = {}
        for (_, uri), stamp in zip(named, stamps, strict=True):
            size, mtime = stamp[0], float(stamp[1])
            inode_ctime = stamp[2] if len(stamp) > 2 else None
            found = (base or {}).get(uri)
            if found is not None and mtime > 0 and (size, mtime, inode_ctime) == found[:3]:
                unread.setdefault(uri, found[3])
        contents, seen = _read_files((uri for _, uri in named), skip=unread)
        return cls(contents, unread=unread, reads=len(contents), listed=listed, seen=seen)

    def completed(self) -> MaskFiles:
        """The same files with those not read (`unread_count`) read now."""
        if not self._unread:
            return self
        contents, seen = _read_files(self._unread, skip=self._contents)
        return MaskFiles(
            {**self._contents, **contents},
            reads=self._reads + len(contents),
            listed=self._listed,
            seen={**self._seen, **seen},
        )

    def disagreements(self, key: str) -> list[stamp_disagreements.StampDisagreement]:
        """The files read that were not as listed (`stamp_disagreements.compare`),
        for the image of `key`; none when the listing gave no stamps."""
        found = (
            stamp_disagreements.compare(key, uri, self._listed.get(uri), seen, mask=True)
            for uri, seen in self._seen.items()
        )
        return [disagreement for disagreement in found if disagreement is not None]

    @property
    def read_count(self) -> int:
        """Mask files read (opened; whether they could be read or not)."""
        return self._reads

    @property
    def unread_count(self) -> int:
        """Mask files not read: their sha256 is the base's."""
        return len(self._unread)

    def sha256s(self, row: Mapping[str, Any]) -> tuple[str | None, ...] | None:
        """The sha256 of each mask file the targets `row` names, in their
        order (None: it could not be read), or None when they name none:
        the record index's ``masks`` (`record_index.entry`)."""
        found = tuple(
            self._sha256.get(uri) or self._unread.get(uri) for _, uri in target_rows.mask_uris(row)
        )
        return found or None

    def data(self, uri: str, where: str) -> bytes:
        """The bytes of the mask file at `uri`.

        Raises:
          BadAnnotation: ``missing_mask``, it could not be read.
          ValueError: it was not read (`completed` reads it).
        """
        if uri in self._unread:
            raise ValueError(f"{where}: the mask file {uri} was not read")
        found = self._contents.get(uri, "not read")
        if isinstance(found, str):
            name = _base_name(uri)
            raise BadAnnotation(
                "missing_mask",
                f"{where}: cannot read {name}: {found.replace(uri, name)}",
                located=f"{where}: cannot read {uri}: {found}",
            )
        return found

    def content_name(self, uri: str) -> str:
        """How the targets' content names a mask file: its bytes' sha256, or
        its base name if it could not be read (never where it is)."""
        return self._sha256.get(uri) or self._unread.get(uri) or _base_name(uri)


def _read_files(
    uris: Iterable[str], skip: Container[str]
) -> tuple[dict[str, bytes | str], dict[str, stamp_disagreements.Seen | None]]:
    """The bytes of each of `uris` not in `skip` (each once), or why it could
    not be read; and what each read found of the file's size and
    modification time (`storage.input_stamp`; None: not found), to compare
    with the listing's (a file that exists and cannot be read: nothing)."""
    contents: dict[str, bytes | str] = {}
    seen: dict[str, stamp_disagreements.Seen | None] = {}
    for uri in uris:
        if uri in contents or uri in skip:
            continue
        try:
            with storage.open_input(uri) as f:  # never blocks on a named pipe
                data = f.read()
                seen[uri] = storage.input_stamp(f, uri, len(data))
            contents[uri] = data
        except Exception as e:  # any I/O error: missing, permission, network
            contents[uri] = first_line(e)
            if storage.is_missing_input(e):
                seen[uri] = None
    return contents, seen


@dataclasses.dataclass(frozen=True)
class ListedTargets:
    """An image's targets as the listing gave them, with their mask files read.

    Attributes:
      row: The targets (`target_rows.row_targets`), mask files by URI.
      masks: The mask files they name.
      content: Canonical JSON of `row` with every mask file named by its
        `MaskFiles.content_name`: what the targets add to the file's version
        entry, so the version follows the masks' content, not where they are.
    """

    row: Mapping[str, Any]
    masks: MaskFiles
    content: str

    @property
    def mask_sha256s(self) -> tuple[str | None, ...] | None:
        """The record index's ``masks`` (`MaskFiles.sha256s`)."""
        return self.masks.sha256s(self.row)


@dataclasses.dataclass(frozen=True)
class LoadedTargets:
    """One image's targets as loaded, in the pixels of the annotations' frame
    (`TargetCodec.frame`: the source file's stored pixels by default).

    Attributes:
      geometry: Boxes, per-object columns (``classes``, fields),
        keypoints, masks; None for a dataset without geometric targets.
      labels: Class ids of ``labels`` (ascending, distinct), or None.
      extra: The extra columns, or None.
      dropped: The bad objects dropped (``bad_objects: drop_object``):
        ``(index in the listed objects, reason, message)``, by index.
      wheres: How messages name each listed object
        (`target_rows.object_where`).
    """

    geometry: transforms.Targets | None
    labels: np.ndarray | None
    extra: Mapping[str, Any] | None
    dropped: tuple[tuple[int, str, str], ...]
    wheres: tuple[str, ...] = ()


class TargetCodec:
    """Loads, checks and encodes an image's targets. Pure and thread-safe.

    Args:
      targets: The dataset's declared targets.
      class_names: The class list (a class id indexes it).
      max_pixels: Mask files with more pixels are refused before decoding
        (``image.max_pixels``).
    """

    def __init__(self, targets: TargetsConfig, class_names: Sequence[str], max_pixels: int):
        self._targets = targets
        self._class_ids = {name: i for i, name in enumerate(class_names)}
        self._max_pixels = max_pixels
        self._drop_object = targets.bad_objects == "drop_object"
        keypoints = targets.keypoints
        self._mirror_order = None if keypoints is None else keypoints.mirror_order()

    @property
    def config(self) -> TargetsConfig:
        return self._targets

    def check_declared_size(self, listed: ListedTargets, decoded: transforms.DecodedImage) -> None:
        """Refuses an image whose size in the annotations' frame (stored, or
        upright: ``annotations_frame``) is not the size they declare
        (`target_rows.DECLARED_SIZE`; nothing to check without one): boxes
        drawn on another frame, or on the image before it was resized, would
        be stored silently wrong.

        Raises:
          BadAnnotation: ``size_mismatch``, naming both sizes and, when the
            declared size is the image's in the other frame, the setting to change.
        """
        declared: Mapping[str, Any] | None = listed.row.get(target_rows.DECLARED_SIZE)
        size = None if declared is None else target_rows.declared_size(declared)
        if declared is None or size is None:
            return
        stored_height, stored_width = decoded.stored_size
        stored = (stored_width, stored_height)
        upright = stored if decoded.orientation < 5 else (stored_height, stored_width)
        frame = self._targets.annotations_frame
        expected, other = (stored, upright) if frame == "stored" else (upright, stored)
        if size == expected:
            return
        said = f"the annotations declare the image {size[0]}x{size[1]} (WxH, {declared['by']})"
        read = "as stored" if frame == "stored" else "upright"  # where the frame reads them
        if size == other:
            setting = "upright" if frame == "stored" else "stored"
            drawn = "upright" if frame == "stored" else "as stored"
            message = (
                f"{said}, its size {drawn}: set targets.annotations_frame: {setting} (the "
                f"annotations were drawn on the image {drawn}; {_frames(decoded)}, and "
                f"targets.annotations_frame: {frame} reads them on the image {read})"
            )
        else:
            message = (
                f"{said}, but it is {expected[0]}x{expected[1]} {read} ({_frames(decoded)}): "
                f"resized after it was annotated, or the annotations are another image's; "
                f"their coordinates would not fit it"
            )
        raise BadAnnotation("size_mismatch", message)

    def frame(self, decoded: transforms.DecodedImage) -> transforms.DecodedImage:
        """`decoded` as the annotations see it: itself (``annotations_frame:
        stored``), or (``upright``) with its upright size as its stored size and
        no orientation, so that annotations drawn upright are loaded at that
        size and not moved by the orientation, while its pixels were."""
        if self._targets.annotations_frame == "stored" or decoded.orientation == 1:
            return decoded
        return decoded._replace(
            orientation=1, stored_size=transforms.decode_scale.upright_size(decoded)
        )

    def box_evidence(
        self, listed: ListedTargets, height: int, width: int
    ) -> box_convention.BoxEvidence | None:
        """What the listed boxes of an image whose stored pixels are
        ``height x width`` say about their convention (None without boxes)."""
        if self._targets.boxes is None:
            return None
        return box_convention.count(target_rows.convention_boxes(listed.row), height, width)

    def read(
        self,
        text: str,
        stamps: Sequence[Sequence[Any]] | None = None,
        base: Mapping[str, tuple[int, float, str | None, str]] | None = None,
    ) -> ListedTargets:
        """The listed targets (canonical JSON, `target_rows.canonical`) with
        the mask files they name read, but those whose `stamps` are `base`'s
        (`MaskFiles.read`)."""
        row = json.loads(text)
        masks = MaskFiles.read(row, stamps, base)
        return ListedTargets(row, masks, _content(row, masks))

    def completed(self, listed: ListedTargets) -> ListedTargets:
        """`listed` with the mask files `read` did not read read now, its
        content following their bytes as read (`load` needs every file)."""
        masks = listed.masks.completed()
        if masks is listed.masks:
            return listed
        return ListedTargets(listed.row, masks, _content(listed.row, masks))

    def reuse_key(self, listed: ListedTargets, class_ids: Mapping[str, int] | None = None) -> str:
        """What of the targets decides the record's target features besides
        the image and the processing config: their content (masks by
        sha256) and the class id of every class name they use (ids follow
        the class list, which a new class elsewhere can shift); with a
        semantic mask also the class list's length, which decides which of
        its pixel values are class ids (counted, kept) and which drop it.

        `class_ids`: another class list's ids (name -> id) to compute the
        key with: a base version's (`kiln.pipeline.relabel`)."""
        ids = self._class_ids if class_ids is None else class_ids
        names = target_rows.class_names(listed.row)
        key: dict[str, Any] = {
            "targets": listed.content,
            "class_ids": {name: ids.get(name) for name in names},
        }
        if self._targets.mask is not None:
            key["num_classes"] = len(ids)
        return json.dumps(
            key,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )

    def load(
        self, listed: ListedTargets, height: int, width: int, orientation: int = 1
    ) -> LoadedTargets:
        """The targets of an image whose pixels in the annotations' frame
        (`frame`) are ``height x width``; `orientation`: the file's EXIF
        orientation, which a mask of another size is reported with.

        Raises:
          BadAnnotation: the image must be dropped (see the module docstring).
        """
        try:
            return self._load(listed, height, width, orientation)
        except BadAnnotation as e:
            frame = self._targets.annotations_frame
            raise _with_orientation(e, orientation, frame, height, width) from None

    def _load(
        self, listed: ListedTargets, height: int, width: int, orientation: int
    ) -> LoadedTargets:
        row = listed.row
        dropped: list[tuple[int, str, str]] = []
        labels = None
        if self._targets.labels is not None:
            ids = {self._class_id(name, "labels") for name in row["labels"]}
            labels = np.array(sorted(ids), dtype=np.int64)
        geometry = None
        wheres: tuple[str, ...] = ()
        if self._targets.geometric:
            mask = None
            if self._targets.mask is not None:
                mask = self._mask_pixels(listed.masks, row["mask"], "mask", height, width)
                self._check_mask_classes(mask, row["mask"], self._targets.mask.ignore_value)
            objects = row.get("objects", [])
            wheres = tuple(target_rows.object_where(i, item) for i, item in enumerate(objects))
            kept = []
            for index, (item, where) in enumerate(zip(objects, wheres, strict=True)):
                try:
                    kept.append(self._object(item, where, height, width, listed.masks))
                    kept[-1]["index"] = index
                except BadAnnotation as e:
                    if not self._drop_object:
                        raise
                    frame = self._targets.annotations_frame
                    e = _with_orientation(e, orientation, frame, height, width)
                    dropped.append((index, e.reason, str(e)))
            geometry = self._geometry(kept, mask, height, width)
        return LoadedTargets(
            geometry=geometry,
            labels=labels,
            extra=row.get("extra"),
            dropped=tuple(dropped),
            wheres=wheres,
        )

    def features(
        self,
        loaded: LoadedTargets,
        moved: transforms.Targets | None,
        label: int | None,
        height: int,
        width: int,
    ) -> tuple[dict[str, Any], TargetCounts]:
        """The record's target features and what the job counts about them.

        Args:
          loaded: From `load`.
          moved: ``loaded.geometry`` after orientation and the transforms, in
            the stored image's pixels (None without geometric targets).
          label: The image's class id, if the dataset has ``label``.
          height, width: The stored image's size.
        """
        targets = self._targets
        fields: dict[str, Any] = {}
        classes: set[int] = set() if label is None else {label}
        if loaded.labels is not None:
            fields["labels"] = loaded.labels
            classes.update(int(c) for c in loaded.labels)
        objects: tuple[tuple[int, float], ...] = ()
        dropped = list(loaded.dropped)
        if moved is not None:
            fields.update(self._geometry_features(moved, height, width))
            if targets.mask is not None and moved.mask is not None:
                histogram = np.bincount(moved.mask.ravel(), minlength=256).tolist()
                classes.update(targets.mask.classes_shown(histogram, len(self._class_ids)))
            if targets.boxes is not None:
                object_classes = moved.objects["classes"].astype(np.int64)
                classes.update(int(c) for c in object_classes)
                sizes = np.sqrt(
                    (moved.boxes[:, 2] - moved.boxes[:, 0])
                    * (moved.boxes[:, 3] - moved.boxes[:, 1])
                )
                objects = tuple(
                    (int(c), float(s)) for c, s in zip(object_classes, sizes, strict=True)
                )
                if moved.dropped_objects:
                    dropped += self._left_too_little(loaded, moved)
        if loaded.extra is not None:
            fields.update(loaded.extra)
        counts: dict[str, int] = {}
        for _, reason, _ in dropped:
            counts[reason] = counts.get(reason, 0) + 1
        return fields, TargetCounts(
            image_classes=tuple(sorted(classes)),
            has_objects=targets.boxes is not None,
            objects=objects,
            dropped=tuple(sorted(counts.items())),
            dropped_objects=tuple(sorted(dropped)),
        )

    def _left_too_little(
        self, loaded: LoadedTargets, moved: transforms.Targets
    ) -> list[tuple[int, str, str]]:
        """The objects orientation and the transforms dropped (`MIN_VISIBILITY`),
        by their index in the listed objects (`SOURCE_INDEX`)."""
        if loaded.geometry is None or self._targets.boxes is None:
            return []
        left = set(moved.objects[SOURCE_INDEX].tolist())
        threshold = self._targets.boxes.min_visibility
        return [
            (
                index,
                MIN_VISIBILITY,
                f"{loaded.wheres[index]}: too little of its box is left in the stored image "
                f"after orientation and the transforms (less than boxes.min_visibility "
                f"{threshold:g} of its area, or none)",
            )
            for index in loaded.geometry.objects[SOURCE_INDEX].tolist()
            if index not in left
        ]

    # --- loading -----------------------------------------------------------------------

    def _class_id(self, name: str, where: str) -> int:
        class_id = self._class_ids.get(name)
        if class_id is None:
            raise BadAnnotation(
                "unknown_class", f"{where}: class {name!r} is not in the class list"
            )
        return class_id

    def _object(
        self, item: Mapping[str, Any], where: str, height: int, width: int, masks: MaskFiles
    ) -> dict[str, Any]:
        box = [float(v) for v in item["bbox"]]
        _check_box(box, where, height, width, item.get(target_rows.AS_WRITTEN))
        out: dict[str, Any] = {
            "box": box,
            "class": self._class_id(item["class"], f"{where}.class"),
            "fields": item.get("fields", {}),
        }
        if "keypoints" in item:
            points = np.asarray(item["keypoints"], dtype=np.float64).reshape(-1, 3)
            labelled = points[:, 2] > 0
            broken = labelled & ~np.isfinite(points[:, :2]).all(axis=1)
            far = labelled & ~broken & _far_outside(points, height, width)
            if broken.any() or far.any():
                raise BadAnnotation(
                    "bad_keypoints",
                    self._keypoints_problem(where, points, broken | far, far, height, width),
                )
            points[~labelled, :2] = 0.0
            out["keypoints"] = points
        if self._targets.instance_masks is not None:
            if "mask" in item:
                out["mask"] = (
                    self._mask_pixels(masks, item["mask"], f"{where}.mask", height, width) > 0
                ).astype(np.uint8)
            else:
                out["mask"] = _rasterize(
                    item["segmentation"], f"{where}.segmentation", height, width
                )
            _check_box_mask(box, out["mask"], where)
        return out

    def _geometry(
        self, kept: list[dict[str, Any]], mask: np.ndarray | None, height: int, width: int
    ) -> transforms.Targets:
        targets = self._targets
        count = len(kept)
        objects: dict[str, np.ndarray] = {}
        if targets.boxes is not None:
            objects["classes"] = np.array([o["class"] for o in kept], dtype=np.int64)
            objects[SOURCE_INDEX] = np.array([o["index"] for o in kept], dtype=np.int64)
            for name, kind in sorted(targets.boxes.fields.items()):
                dtype = np.int64 if kind == "int" else np.float64
                objects[name] = np.array([o["fields"][name] for o in kept], dtype=dtype)
        keypoints = None
        if targets.keypoints is not None:
            k = len(targets.keypoints.names)
            keypoints = np.stack([o["keypoints"] for o in kept]) if kept else np.zeros((0, k, 3))
        instance_masks = None
        if targets.instance_masks is not None:
            instance_masks = (
                np.stack([o["mask"] for o in kept])
                if kept
                else np.zeros((0, height, width), np.uint8)
            )
        return transforms.Targets(
            boxes=np.array([o["box"] for o in kept], dtype=np.float64).reshape(count, 4),
            objects=objects,
            keypoints=keypoints,
            mask=mask,
            instance_masks=instance_masks,
            mirror_order=self._mirror_order,
        )

    def _keypoints_problem(
        self,
        where: str,
        points: np.ndarray,
        broken: np.ndarray,
        far: np.ndarray,
        height: int,
        width: int,
    ) -> str:
        """``objects[0].keypoints: nose (index 0) is labelled (visibility 2) but at
        [nan, 12.0]``, naming every such keypoint (`broken`), and saying where the
        image is for those far outside it (`far`)."""
        names = self._targets.keypoints.names if self._targets.keypoints is not None else []
        found = []
        for index in np.flatnonzero(broken):
            name = f"{names[index]} (index {index})" if index < len(names) else f"index {index}"
            x, y, visibility = points[index].tolist()
            problem = f"{name} is labelled (visibility {visibility:g}) but at [{x}, {y}]"
            if far[index]:
                problem += (
                    f", more than {FAR_OUTSIDE:.0%} of the {width}x{height} (WxH) image's size "
                    f"beyond it"
                )
            found.append(problem)
        return f"{where}.keypoints: {'; '.join(found)}"

    def _mask_pixels(
        self, masks: MaskFiles, uri: str, where: str, height: int, width: int
    ) -> np.ndarray:
        """A mask file's pixels (``height x width`` uint8).

        Raises:
          BadAnnotation: naming the mask file by its base name (its full
            path in ``located``, for errors.jsonl).
        """
        data = masks.data(uri, where)
        named = f"{where} ({_base_name(uri)})"
        try:
            mask = _decode_mask(data, named, self._max_pixels)
            if mask.shape != (height, width):
                raise BadAnnotation(
                    "mask_size_mismatch",
                    f"{named}: the mask is {mask.shape[0]}x{mask.shape[1]} (HxW) but its "
                    f"image is {height}x{width}",
                )
        except BadAnnotation as e:
            located = f"{where} ({uri})" + str(e)[len(named) :]
            raise BadAnnotation(e.reason, str(e), located=located) from None
        return mask

    def _check_mask_classes(self, mask: np.ndarray, uri: str, ignore: int | None) -> None:
        """Refuses a semantic mask with a pixel value that is neither a class id
        (an index into the class list) nor the ignore value: a model with a
        logit per class cannot learn it, and a loss fails or turns NaN on it.

        Raises:
          BadAnnotation: ``unknown_class``, naming the values and the class
            list's length.
        """
        num_classes = len(self._class_ids)
        if int(mask.max(initial=0)) < num_classes:
            return
        counts = np.bincount(mask.ravel(), minlength=256)
        unknown = [v for v in range(num_classes, 256) if counts[v] and v != ignore]
        if not unknown:
            return
        shown = ", ".join(str(v) for v in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
        ids = f"0..{num_classes - 1}" if num_classes else "none"
        ignored = "" if ignore is None else f" nor the ignore value {ignore}"
        problem = (
            f"pixel value(s) {shown} are not class ids (the class list has {num_classes} "
            f"classes: {ids}){ignored}; list every class the masks use in source.classes"
        )
        raise BadAnnotation(
            "unknown_class",
            f"mask ({_base_name(uri)}): {problem}",
            located=f"mask ({uri}): {problem}",
        )

    # --- encoding ----------------------------------------------------------------------

    def _geometry_features(
        self, moved: transforms.Targets, height: int, width: int
    ) -> dict[str, Any]:
        targets = self._targets
        fields: dict[str, Any] = {}
        if targets.boxes is not None:
            fields["boxes"] = moved.normalized_boxes(height, width)
            fields["classes"] = moved.objects["classes"].astype(np.int64)
            for name, kind in sorted(targets.boxes.fields.items()):
                column = moved.objects[name]
                fields[name] = column.astype(np.int64 if kind == "int" else np.float32)
        if targets.keypoints is not None and moved.keypoints is not None:
            points, visibility = moved.normalized_keypoints(height, width)
            fields["keypoints"] = points
            fields["keypoint_visibility"] = visibility
        if targets.mask is not None and moved.mask is not None:
            fields["mask"] = _encode_mask(moved.mask, targets.mask.encoding)
        if targets.instance_masks is not None and moved.instance_masks is not None:
            fields["instance_masks"] = [_encode_png(m) for m in moved.instance_masks]
        return fields


def _frames(decoded: transforms.DecodedImage) -> str:
    """``the file is stored 64x48 with EXIF orientation 6, 48x64 upright`` (WxH)."""
    height, width = decoded.stored_size
    if decoded.orientation == 1:
        return f"the file is stored {width}x{height}, without EXIF orientation"
    upright_height, upright_width = transforms.decode_scale.upright_size(decoded)
    return (
        f"the file is stored {width}x{height} with EXIF orientation {decoded.orientation}, "
        f"{upright_width}x{upright_height} upright"
    )


def _with_orientation(
    error: BadAnnotation, orientation: int, frame: str, height: int, width: int
) -> BadAnnotation:
    """A ``mask_size_mismatch`` of an image (``height x width`` in the frame
    `frame`) whose file has an EXIF orientation other than 1, saying so and
    what the image is in the other frame; any other error as it is."""
    if error.reason != "mask_size_mismatch" or orientation == 1:
        return error
    other = "upright" if frame == "stored" else "stored"
    other_height, other_width = (width, height) if orientation >= 5 else (height, width)
    note = (
        f" {'as stored' if frame == 'stored' else 'upright'} (targets.annotations_frame: "
        f"{frame}); the file has EXIF orientation "
        f"{orientation}: {other} it is {other_height}x{other_width} (HxW); masks drawn on "
        f"the image {'as viewers show it' if other == 'upright' else 'as stored'} need "
        f"targets.annotations_frame: {other}"
    )
    return BadAnnotation(error.reason, str(error) + note, located=error.located + note)


def location_free(text: str) -> str:
    """Listed targets with every mask file named by its base name only, for the
    version entry of a file dropped before its masks were read (the others'
    entry names them by content: `ListedTargets.content`), so the same data
    under another root gives the same version."""
    return _content(json.loads(text), MaskFiles({}))


def _content(row: Mapping[str, Any], masks: MaskFiles) -> str:
    content = copy.deepcopy(target_rows.unnamed(row))
    if "mask" in content:
        content["mask"] = masks.content_name(content["mask"])
    for item in content.get("objects", ()):
        if "mask" in item:
            item["mask"] = masks.content_name(item["mask"])
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _base_name(uri: str) -> str:
    return uri.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _check_box(
    box: list[float],
    where: str,
    height: int,
    width: int,
    written: Mapping[str, Any] | None = None,
) -> None:
    """Refuses a box that is not a box of the image (`written`: the box as its
    source file writes it, `target_rows.AS_WRITTEN`)."""
    x_min, y_min, x_max, y_max = box
    if not all(math.isfinite(v) for v in box):
        raise BadAnnotation("bad_box", f"{where}.bbox: {box} has a NaN or infinite coordinate")
    if (x_max < x_min or y_max < y_min) and written is not None:
        shown = json.dumps(written["bbox"])
        raise BadAnnotation(
            "bad_box",
            f"{where}.bbox: {shown} has a negative width or height ([x, y, width, height])",
        )
    if x_max < x_min or y_max < y_min:
        raise BadAnnotation(
            "bad_box",
            f"{where}.bbox: {box} has x_max < x_min or y_max < y_min "
            f"(expected [x_min, y_min, x_max, y_max])",
        )
    if x_max == x_min or y_max == y_min:
        # A point or a line: no area to learn from, and trainers that check
        # (torchvision's detection models) refuse the whole batch for it.
        if written is not None:
            shown = json.dumps(written["bbox"])
            raise BadAnnotation(
                "bad_box",
                f"{where}.bbox: {shown} has zero width or height ([x, y, width, height])",
            )
        raise BadAnnotation("bad_box", f"{where}.bbox: {box} has zero width or height")
    if not box_convention.lies_inside(box, height, width):
        raise BadAnnotation(
            "bad_box",
            f"{where}.bbox: {box} lies outside the {width}x{height} (WxH) image "
            f"(more than {FAR_OUTSIDE:.0%} of its size beyond it, or not inside at all)",
        )


def _far_outside(points: np.ndarray, height: int, width: int) -> np.ndarray:
    """Per ``[x, y, v]`` point: whether it lies beyond the ``height x width`` image
    by more than `FAR_OUTSIDE` of its size, the slack a box has (`_check_box`).
    A labelled point there is no point of the image (a point in another frame
    or convention), not one the image's edge cut off; nearer, a point outside
    the image is kept as not visible (`kiln.transforms.Targets.clipped`)."""
    x, y = points[:, 0], points[:, 1]
    slack_x, slack_y = FAR_OUTSIDE * width, FAR_OUTSIDE * height
    return (x < -slack_x) | (x > width + slack_x) | (y < -slack_y) | (y > height + slack_y)


def _check_box_mask(box: list[float], mask: np.ndarray, where: str) -> None:
    """Refuses a box that does not enclose its instance mask's pixels, and an
    empty mask under a box that covers pixel centres (a polygon or mask of
    nothing in the image: outside it, or of another image). An empty mask
    under a box that covers no pixel centre is a sub-pixel object's: its
    polygon covers no centre either, so it is kept; so is one under a box of
    at most `BOX_MASK_TOLERANCE` pixels a side, the slack a tiny object's
    box has around its mask's pixels (a box drawn loose around a speck)."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        tiny = max(box[2] - box[0], box[3] - box[1]) <= BOX_MASK_TOLERANCE
        if not tiny and _covers_pixel_centres(box, *mask.shape):
            shown = "[" + ", ".join(f"{v:g}" for v in box) + "]"
            raise BadAnnotation(
                "box_mask_mismatch",
                f"{where}: its instance mask is empty but its box {shown} covers pixel centres "
                f"(a polygon or mask outside the image, or of another image)",
            )
        return
    columns = np.flatnonzero(mask.any(axis=0))
    tight = [int(columns[0]), int(rows[0]), int(columns[-1]) + 1, int(rows[-1]) + 1]
    if max(abs(a - b) for a, b in zip(box, tight, strict=True)) <= BOX_MASK_TOLERANCE:
        return
    iou = _iou(box, tight)
    if iou < MIN_BOX_MASK_IOU:
        shown = "[" + ", ".join(f"{v:g}" for v in box) + "]"
        raise BadAnnotation(
            "box_mask_mismatch",
            f"{where}: its box {shown} and the box of its instance mask's pixels {tight} "
            f"overlap by an IoU of {iou:.2f}, less than {MIN_BOX_MASK_IOU:g} (a box or mask "
            f"of another object, or a box in another convention)",
        )


def _covers_pixel_centres(box: list[float], height: int, width: int) -> bool:
    """Whether ``[x_min, y_min, x_max, y_max]`` holds the centre ``(i + 0.5, j +
    0.5)`` of a pixel of a ``height x width`` image strictly inside it: what a
    polygon of the box would fill (strictly, so a centre on its edge, which
    rasterizers may leave out, does not count)."""

    def covers(low: float, high: float, size: int) -> bool:
        first = max(math.floor(low - 0.5) + 1, 0)  # the first pixel whose centre is above `low`
        return first < size and first + 0.5 < high

    x_min, y_min, x_max, y_max = box
    return covers(x_min, x_max, width) and covers(y_min, y_max, height)


def _iou(a: list[float], b: list[int]) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    overlap = max(width, 0.0) * max(height, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - overlap
    return overlap / union if union > 0 else 0.0


def _rasterize(segmentation: Any, where: str, height: int, width: int) -> np.ndarray:
    if isinstance(segmentation, dict) and list(segmentation.get("size", [])) != [height, width]:
        h, w = segmentation.get("size", [0, 0])
        raise BadAnnotation(
            "mask_size_mismatch",
            f"{where}: the RLE is {h}x{w} (HxW) but its image is {height}x{width}",
        )
    try:
        return transforms.segmentation_to_mask(segmentation, height, width)
    except transforms.SegmentationError as e:
        reason = "bad_polygon" if isinstance(segmentation, list) else "bad_segmentation"
        raise BadAnnotation(reason, f"{where}: {e}") from None


def _decode_mask(data: bytes, where: str, max_pixels: int) -> np.ndarray:
    """A mask file's bytes as ``H x W`` uint8 class ids, as written
    (`transforms.decode_mask_file`: no colour conversion, palette indices,
    low bit depths unscaled, lossy formats refused)."""
    try:
        return transforms.decode_mask_file(data, max_pixels)
    except transforms.MaskFileError as e:
        raise BadAnnotation("corrupt_mask", f"{where}: {e}") from None


# How masks are written as PNG. The reader decodes one per element, so these
# settings are for decoding speed: no row filter and deflate's default
# strategy. OpenCV's defaults (the Sub filter and run-length-only deflate:
# every match a copy of the previous byte) made `tf.io.decode_png` of a
# 224x224 box mask cost ~220 us, about as much as the JPEG's crop decode;
# these take it to ~80 us, and the files to about a third of the size.
_PNG_PARAMS = (
    cv2.IMWRITE_PNG_COMPRESSION,
    6,
    cv2.IMWRITE_PNG_FILTER,
    cv2.IMWRITE_PNG_FILTER_NONE,
    cv2.IMWRITE_PNG_STRATEGY,
    cv2.IMWRITE_PNG_STRATEGY_DEFAULT,
)


def _encode_png(mask: np.ndarray) -> bytes:
    """A uint8 mask as a single-channel PNG, written for fast decoding (`_PNG_PARAMS`).

    Raises `transforms.EncodeError` for a mask PNG cannot hold (beside a raw
    image wider or taller than PNG's limit): the build drops the file."""
    height, width = mask.shape[:2]
    if max(height, width) > MAX_SIDE["png"]:
        raise transforms.EncodeError(
            f"the mask to store is {width}x{height} (WxH), more than the {MAX_SIDE['png']} "
            f"pixels per side that png can hold; make the image smaller with the transforms"
        )
    ok, encoded = cv2.imencode(".png", np.ascontiguousarray(mask, dtype=np.uint8), _PNG_PARAMS)
    if not ok:
        raise transforms.EncodeError("OpenCV could not encode a mask as PNG")
    return encoded.tobytes()


def _encode_mask(mask: np.ndarray, encoding: str) -> bytes:
    """The semantic mask as its dataset stores it (`MaskTarget.encoding`): a PNG
    (`_encode_png`), or raw: its bytes, one per pixel in row-major order."""
    if encoding == "raw":
        return np.ascontiguousarray(mask, dtype=np.uint8).tobytes()
    return _encode_png(mask)
