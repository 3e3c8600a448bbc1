"""What a dataset's records carry besides the image: the ``targets:`` declaration.

One model serves three readers: the build config validates the YAML
``targets:`` section with it, `kiln.schemas.schema_for` assembles the record
features from it, and ``kiln.json`` stores it resolved (`DatasetInfo.targets`)
so the reader knows the kinds, keypoint names, flip pairs, minimum
visibility, ignore value and field types without the config::

    targets:
      label: {}                     # one class per image (today's classification)
      labels: {}                    # several class names per image
      boxes:
        min_visibility: 0.25        # a box keeping less of its area after a crop is dropped
        fields: {iscrowd: int}      # per-object columns: int | float
      mask: {ignore_value: 255}     # semantic segmentation: class id per pixel
                                    # (encoding: png (default) | raw)
      instance_masks: {}            # one 0/1 mask per object (needs boxes)
      keypoints:                    # named points per object (needs boxes)
        names: [nose, left_eye, right_eye]
        flip_pairs: [[left_eye, right_eye]]
      extra: {weather: string, altitude: float}   # per-image columns
      bad_objects: drop_image       # or drop_object

Without ``targets:`` a dataset carries ``label`` only, as before the section
existed, and its records keep the same bytes.

Plain Python and pydantic: the reader imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

# A per-object field or an extra column becomes part of a feature key and a
# Python name (`objects/<field>`, `extra/<name>`).
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Python names of record features (`kiln.schemas.features`), the keys the
# reader's targets dict uses, and the manifest's own keys: an extra column or
# an object field named like one of them would be ambiguous.
RESERVED_NAMES = frozenset(
    {
        "image",
        "height",
        "width",
        "channels",
        "key",
        "sha256",
        "label",
        "labels",
        "boxes",
        "classes",
        "keypoints",
        "keypoint_visibility",
        "mask",
        "instance_masks",
        "num_objects",
        "objects",
        "path",
        "split",
    }
)
# The key of the element seeds in the reader's elements that carry them (the
# model-side layer's input, batch ops). Not a reserved name (datasets built
# with such an extra column stay readable): `kiln build` refuses the column.
SEED_KEY = "augment_seed"
# Keys of one object in a JSONL manifest line.
OBJECT_KEYS = frozenset({"bbox", "class", "keypoints", "mask", "segmentation"})

FieldName = Annotated[str, Field(pattern=NAME_PATTERN)]
# Geometric kinds: they move with every geometric transform.
GEOMETRIC_KINDS = ("boxes", "mask", "instance_masks", "keypoints")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class LabelTarget(_Model):
    """One class per image: the image folder's class folder, or the manifest's `label`."""


class LabelsTarget(_Model):
    """Several classes per image (multi-label)."""

    separator: str = Field("|", min_length=1, max_length=1)
    """In a CSV manifest, the `labels` column holds the class names joined by this character,
    e.g. `cat|dog` (an empty cell: no class). JSONL manifests give a list: `["cat", "dog"]`."""


class BoxesTarget(_Model):
    """Objects with a box and a class each."""

    min_visibility: Annotated[float, Field(ge=0, le=1)] = 0.25
    """After a geometric transform (offline crop or pad, online crop), a box keeping less than
    this fraction of its area inside the image is dropped, with everything else of its object,
    and counted in kiln.json; 0 keeps every box that keeps any area."""
    fields: dict[FieldName, Literal["int", "float"]] = {}
    """Per-object columns read from each object of a JSONL line, e.g. `{iscrowd: int}`:
    stored as `objects/<name>`, one value per box. A coco source reads them from each
    annotation (any key, e.g. `area`; `iscrowd` is 0 when absent); a voc source gives
    `difficult`, `truncated` and `occluded` only (0 when absent). Stored as written: the
    transforms move boxes, not these values (a COCO `area` stays in the source file's
    pixels after a resize; compute areas from the stored boxes or masks)."""

    @pydantic.field_validator("fields")
    @classmethod
    def _field_names(cls, fields):
        for name in fields:
            if name in RESERVED_NAMES or name in OBJECT_KEYS:
                raise ValueError(f"{name!r} is a reserved name; choose another field name")
        return fields


class MaskTarget(_Model):
    """Semantic segmentation: a class id per pixel of the stored image, one byte each."""

    ignore_value: Annotated[int, Field(ge=0, le=255)] | None = 255
    """The pixel value that means "not labelled" (losses skip it); other values are class
    ids. Also what pixels added by padding get. null: none; pixels added by padding (and by
    the reader's rotation, zoom and erasing) then get 0, the first class."""
    encoding: Literal["png", "raw"] = "png"
    """How each record stores the mask: `png` (single-channel PNG: compact, a few KB for a
    224x224 mask) or `raw` (one byte per pixel, row-major, height*width bytes: 49 KB for
    224x224, but the reader decodes it about 10x cheaper per image, ~10 us instead of ~120
    us of PNG inflate; records are larger, so a shuffle buffer of the same memory holds fewer
    of them). Instance masks are PNG either way."""

    def classes_shown(self, histogram: Sequence[int], num_classes: int) -> list[int]:
        """The class ids a mask shows, ascending, from its pixel values'
        histogram (``histogram[v]``: how many pixels have value v). An image
        with a mask counts in ``class_counts`` for each, so a class seen only
        in masks (the background, say) has examples. The ignore value and
        values at or above `num_classes` are not class ids."""
        return [
            value
            for value in range(min(num_classes, len(histogram)))
            if histogram[value] and value != self.ignore_value
        ]


class InstanceMasksTarget(_Model):
    """A 0/1 mask per object (a PNG path, a polygon or COCO RLE per object); needs `boxes`."""


class KeypointsTarget(_Model):
    """Named points per object with COCO visibility (0 unlabelled, 1 hidden, 2 visible);
    needs `boxes`."""

    names: list[FieldName] = Field(min_length=1)
    """The keypoint names in the order each object lists its points, e.g.
    `[nose, left_eye, right_eye]`."""
    flip_pairs: list[tuple[FieldName, FieldName]] = []
    """Pairs of names that swap under any mirror image, e.g. `[[left_eye, right_eye]]`: the
    reader's flips, a `warp` that mirrors, and in the build a mirroring EXIF orientation (2, 4,
    5, 7) of a photo annotated in its stored frame and a user transform whose map mirrors.
    Stored in the order of `names` (`[[right_eye, left_eye]]` is the same config, the same
    version)."""

    @pydantic.field_validator("flip_pairs", mode="before")
    @classmethod
    def _pairs_not_names(cls, pairs: Any) -> Any:
        # `flip_pairs: [left, right]` (one pair without its brackets) would
        # otherwise be two "expected a valid tuple" lines.
        if isinstance(pairs, list) and pairs and all(isinstance(name, str) for name in pairs):
            shown = "[" + ", ".join(pairs) + "]"
            hint = f"; did you mean [{shown}]?" if len(pairs) == 2 else ""
            raise ValueError(f"a list of [left, right] pairs, got {shown}{hint}")
        return pairs

    @pydantic.field_validator("flip_pairs")
    @classmethod
    def _in_names_order(
        cls, pairs: list[tuple[str, str]], info: pydantic.ValidationInfo
    ) -> list[tuple[str, str]]:
        # A pair swaps, so [[b, a]] and [[a, b]] (and pairs in any order) are
        # one config: stored in the order of `names`, they get one fingerprint
        # and one version. Unknown names are left for `_names_known` to report.
        position = {name: index for index, name in enumerate(info.data.get("names") or ())}
        if not all(name in position for pair in pairs for name in pair):
            return pairs
        ordered = [
            (left, right) if position[left] <= position[right] else (right, left)
            for left, right in pairs
        ]
        return sorted(ordered, key=lambda pair: position[pair[0]])

    @pydantic.model_validator(mode="after")
    def _names_known(self):
        if len(set(self.names)) != len(self.names):
            raise ValueError("names: each keypoint name may appear once")
        seen: set[str] = set()
        for left, right in self.flip_pairs:
            for name in (left, right):
                if name not in self.names:
                    raise ValueError(f"flip_pairs: {name!r} is not one of names {self.names}")
                if name in seen:
                    raise ValueError(f"flip_pairs: {name!r} is in more than one pair")
                seen.add(name)
            if left == right:
                raise ValueError(f"flip_pairs: {left!r} is paired with itself")
        return self

    def mirror_order(self) -> tuple[int, ...] | None:
        """The keypoints' order in a mirror image (each flip pair swapped), or
        None without flip pairs (`kiln.transforms.Targets.mirror_order`)."""
        if not self.flip_pairs:
            return None
        index = {name: i for i, name in enumerate(self.names)}
        order = list(range(len(self.names)))
        for left, right in self.flip_pairs:
            order[index[left]], order[index[right]] = index[right], index[left]
        return tuple(order)


class TargetsConfig(_Model):
    """What each record carries besides the image. Absent: `label` only."""

    label: LabelTarget | None = None
    """One class per image: `{}`."""
    labels: LabelsTarget | None = None
    """Several classes per image (multi-label): `{}`."""
    boxes: BoxesTarget | None = None
    """Objects: a box `[x_min, y_min, x_max, y_max]` (pixels of the source file) and a class
    each."""
    mask: MaskTarget | None = None
    """Semantic segmentation mask per image: `{}` or `{ignore_value: 255}`."""
    instance_masks: InstanceMasksTarget | None = None
    """A mask per object: `{}`. Needs `boxes`."""
    keypoints: KeypointsTarget | None = None
    """Named keypoints per object. Needs `boxes`."""
    extra: dict[FieldName, Literal["int", "float", "string"]] = {}
    """Per-image columns taken from the manifest by name with their type, e.g.
    `{weather: string, altitude: float}`: stored as `extra/<name>`. A name is a Python
    identifier, and not one of the record's or the reader's own keys (`image`, `key`, `label`,
    `boxes`, `path`, `split`, ... and `augment_seed`, the element seeds the model-side layer
    and batch ops take): those are refused, naming the column."""
    bad_objects: Literal["drop_image", "drop_object"] = "drop_image"
    """What one bad object annotation (a reversed or non-finite box, a class not in the class
    list, a polygon with fewer than 3 points, ...) drops: the whole image (`drop_image`, the
    default: an object removed from the annotations stays in the pixels and teaches the model
    it is background) or only that object (`drop_object`)."""
    annotations_frame: Literal["stored", "upright"] = "stored"
    """Which pixels the boxes, keypoints and masks are drawn on: `stored` (the default), the
    file's pixels as stored, moved with the EXIF orientation as the image is turned upright; or
    `upright`, the image as viewers show it, the EXIF orientation applied (what CVAT, Label
    Studio, Roboflow export; detectron2 and mmdetection read COCO so): the orientation moves the
    pixels only. A size the annotations declare (COCO `images[].width/height`, VOC `<size>`)
    must be the image's size in this frame, or the image is dropped (`size_mismatch`)."""

    @pydantic.model_validator(mode="after")
    def _relations(self):
        if not (self.label or self.labels or self.boxes or self.mask):
            raise ValueError("declare at least one of label, labels, boxes, mask")
        for kind in ("instance_masks", "keypoints"):
            if getattr(self, kind) is not None and self.boxes is None:
                raise ValueError(f"{kind} needs boxes (one box and class per object)")
        for name in self.extra:
            if name in RESERVED_NAMES:
                raise ValueError(f"extra: {name!r} is a reserved name; choose another column")
        return self

    @property
    def kinds(self) -> tuple[str, ...]:
        """The declared kinds, in a fixed order."""
        order = ("label", "labels", "boxes", "mask", "instance_masks", "keypoints")
        return tuple(kind for kind in order if getattr(self, kind) is not None) + (
            ("extra",) if self.extra else ()
        )

    @property
    def geometric(self) -> tuple[str, ...]:
        """The declared kinds that move with geometric transforms."""
        return tuple(kind for kind in GEOMETRIC_KINDS if getattr(self, kind) is not None)

    @property
    def is_classification(self) -> bool:
        """Only `label`: the records of a build without ``targets:``."""
        return self.kinds == ("label",)

    def to_json(self) -> dict:
        """The resolved declaration, as ``kiln.json`` stores it (``annotations_frame``
        only when ``upright``: a declaration without it keeps its kiln.json and fingerprint)."""
        data = self.model_dump(mode="json")
        if self.annotations_frame == "stored":
            del data["annotations_frame"]
        return data


CLASSIFICATION = TargetsConfig(label=LabelTarget())
"""The targets of a build without a ``targets:`` section."""
