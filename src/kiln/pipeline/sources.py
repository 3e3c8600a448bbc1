"""Listing a build's input files: an image folder or a manifest.

Listing runs in the launcher, before the job, through Beam's `FileSystems`
(so local paths and gs:// work alike); an image folder on an object store
with ``listing: job`` is listed by a Beam job instead (`listing_job`), with
the rules of `folder_place` and `place_problem`. Listing first lets the launcher
compute the up-to-date stamp without starting Beam, know the class and split
names when it constructs the job, and refuse an empty source early. The job
reads the listing from a JSONL file (`Listing.write`), not from a list baked
into the job graph, so it scales to millions of files on Dataflow. Neither
holds the rows in memory: the manifest is read row by row and the rows go
to disk as they come (`kiln.pipeline.listing`).

- ``image_folder``: ``root/<class>/<image>``, or ``root/<split>/<class>/<image>``
  with ``splits.from_source``. Hidden files and folders (a name starting
  with '.') are skipped; every other file is an input (see
  `ImageFolderSource.root` for what is dropped, and why). The key of a file
  is its path relative to the root, with '/' separators.
- ``manifest``: CSV with a header ``path,label[,split]`` (other columns are
  ignored), or JSONL (``.jsonl``/``.json``) objects with those fields (an
  object that gives a key twice is a bad row). A
  relative path resolves against the manifest's folder; the key is the path
  as written (normalized), or the URI for an absolute one. With declared
  targets (``targets:``), a JSONL line also carries its objects, masks and
  extra columns, a CSV row its ``labels`` and extra columns
  (`kiln.pipeline.target_rows`); mask paths are confined like image paths.
  A line longer than `text_lines.MAX_LINE_BYTES` is never held: it is one
  ``line_too_long`` row, and the line numbers after it stay those of the file.

Label ids are stable: they index the config's ``source.classes`` in the
order it lists them (a semantic mask's pixel values are ids into it, in
the masks' order), else every label found, sorted. Every source reads a
class name by one rule (`target_rows.class_name`: stripped, refused when
empty or with a control character). Problems with single
files (a row that does not parse, a missing file, an unknown label, a file
outside the layout, a local path that is not a regular file) become
`DroppedFile` rows, never exceptions.

Limitation: on object stores, Beam's file matching treats ``*``, ``?`` and
``[`` in the image folder's root as glob characters. (A local folder is
walked directly, so that files Beam's listing would skip without a word,
such as broken symbolic links, are reported.)
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import functools
import json
import logging
import os
import posixpath
import re
import stat
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, NamedTuple, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.errors import ConfigError, first_line, unknown_names
from kiln.pipeline import box_convention, compressed, storage, target_rows, text_lines, voc
from kiln.pipeline.coco import (
    CocoFile,
    CocoFileError,
    CocoProblem,
    looks_like_coco,
    naming_annotations,
)
from kiln.pipeline.config_paths import ConfigPath
from kiln.pipeline.error_report import DroppedFile, as_text, is_unicode
from kiln.pipeline.listing import Candidate, Listing, ListingWriter, SourceFile
from kiln.pipeline.storage import is_remote
from kiln.pipeline.target_rows import AnnotationError
from kiln.pipeline.text_lines import LongLine
from kiln.schemas import CLASSIFICATION, SPLIT_NAME_PATTERN, TargetsConfig

if TYPE_CHECKING:
    from apache_beam.io.filesystem import FileMetadata

logger = logging.getLogger(__name__)

_SPLIT_NAME = re.compile(SPLIT_NAME_PATTERN)


def names_nothing(num_files: int, num_dropped: int, class_names: Sequence[str]) -> bool:
    """Whether a listing names nothing to build: a configuration error, not
    a build that stores no example.

    A source with no row or file at all (an empty manifest, a folder without
    class folders), or whose dropped files name no class, points at the wrong
    place. A source whose files were all dropped while listing (every row
    names a missing file) is bad input like any other: the job writes the
    error report, and ``errors.max_fraction`` and ``errors.allow_empty``
    decide, as for files dropped while decoding.
    """
    return not num_files and not (num_dropped and class_names)


class _SourceModel(BaseModel):
    """A kind of source: where the images come from, and how to list them."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    classes: list[str] | None = None
    """The class list, in id order: a label is its index in the list as written, and a
    semantic mask's pixel values index it too (list the classes in the masks' id order, e.g.
    `[background, road, car]`; a dataset with `targets.mask` must declare it: mask files name
    no classes, and the sorted names of the rows would match their ids by chance only). A name
    listed twice is an error. Files with other labels are dropped (`unknown_label`). An
    image_folder listed by the launcher must have a class folder for each class listed (an
    empty one will do: a class with no image yet), else the build stops before any work
    (`source.classes: 'squares' names no class folder of ROOT; did you mean 'square'?`). Default:
    every folder name (image_folder) or distinct label (manifest), sorted. Every class name
    read from a source (a class folder's name; a manifest's `label`, `labels` and objects'
    `class`, CSV and JSONL alike; a COCO category's or VOC object's name) follows one rule: an
    integer is its decimal text, a string is stripped of surrounding whitespace (`" cat "` is
    `cat`), and a name that is empty, only whitespace, or holds a control character (newline,
    tab, NUL: Unicode category Cc) drops its input (`bad_row`; `bad_name` for a class folder;
    a COCO category stops the build). The names listed here must already be in that form."""
    allowed_roots: list[ConfigPath] = []
    """More folders (or `gs://` prefixes) inputs may be read from. By default a source reads
    only below its own folder (the image folder, or the manifest's folder), after following
    symbolic links; anything else is dropped as `outside_source`, never read. Relative paths
    are relative to the config file's folder."""

    # The fields that say where the files are, not what they are: provenance,
    # kept out of the config's fingerprint (`BuildSpec.to_json`).
    LOCATION_FIELDS: ClassVar[tuple[str, ...]] = ("allowed_roots",)
    # The fields that say how the files are listed, not what they are nor
    # where: the same files give the same dataset either way, so they are
    # neither fingerprinted nor recorded (`BuildSpec.to_json`).
    LISTING_FIELDS: ClassVar[tuple[str, ...]] = ()
    # The location fields below which the job's workers read files (images,
    # mask files): on a distributed runner they must be reachable from them.
    WORKER_FIELDS: ClassVar[tuple[str, ...]] = ("allowed_roots",)

    @field_validator("classes")
    @classmethod
    def _class_names_as_data_names_them(cls, classes: list[str] | None) -> list[str] | None:
        """Refuses a name no input could carry: the rule of the names read from
        data (`target_rows.class_name`), which are stripped of whitespace."""
        first: dict[str, int] = {}
        for i, name in enumerate(classes or ()):
            try:
                read = target_rows.class_name(name, f"item {i}")
            except AnnotationError as e:
                raise ValueError(str(e)) from None
            if read != name:
                raise ValueError(
                    f"item {i}: {name!r} has surrounding whitespace; class names read "
                    f"from the source are stripped, so no input would be {name!r}"
                )
            if name in first:
                raise ValueError(
                    f"item {i}: {name!r} is listed twice (item {first[name]}); a class's id "
                    f"is its place in the list"
                )
            first[name] = i
        return classes

    def location(self) -> dict[str, Any]:
        """The location fields (`LOCATION_FIELDS`) as JSON: where this build read from."""
        return self.model_dump(mode="json", include=set(self.LOCATION_FIELDS))

    def location_paths(self) -> list[tuple[str, str]]:
        """Every path of `location`, with its field (``root``,
        ``allowed_roots[0]``, ``parts[1].images``)."""
        return list(_paths_in(self.location()))

    def worker_paths(self) -> list[tuple[str, str]]:
        """The paths below which the job's workers read files (`WORKER_FIELDS`),
        each with its field as `location_paths` names it."""
        found = [
            (self.WORKER_FIELDS.index(name), field, path)
            for field, path in self.location_paths()
            if (name := re.sub(r"\[\d+\]", "", field).rsplit(".", 1)[-1]) in self.WORKER_FIELDS
        ]
        return [(field, path) for _, field, path in sorted(found, key=lambda item: item[0])]

    def fingerprint_exclude(self) -> Any:
        """What the config's fingerprint leaves out of this source, as pydantic's
        ``exclude`` takes it: the location and listing fields (`BuildSpec.to_json`)."""
        return {*self.LOCATION_FIELDS, *self.LISTING_FIELDS}

    def list_files(
        self, *, splits_from_source: bool, targets: TargetsConfig = CLASSIFICATION
    ) -> Listing:
        """Lists the source's files; problems with single files become rows of
        `Listing.dropped`.

        Args:
          splits_from_source: Take each file's split from the source
            (``splits.from_source``).
          targets: What each file's row carries besides the image; a row
            whose targets are malformed is dropped as ``bad_row``.

        Returns:
          The listing, on disk until it is closed (`Listing.close`).

        Raises:
          ConfigError: the source cannot be read at all (the manifest is
            unreadable, a folder below an image folder's root cannot be
            listed: `storage.UnlistableFolder`) or names nothing to build
            (`names_nothing`), with the message naming the field, e.g.
            ``source.path: ...``; the caller adds the config's name.
        """
        try:
            listing = self._list(splits_from_source, targets)
        except storage.UnlistableFolder as e:
            raise ConfigError(
                f"{self.describe()}: {e.strerror}; nothing was built (its files would be "
                f"missing from the dataset without a word)"
            ) from None
        if names_nothing(listing.num_files, listing.num_dropped, listing.class_names):
            with listing:
                first = next(listing.dropped(), None)
            raise ConfigError(self.no_usable_image(listing.num_dropped, first))
        logger.info(
            "listed %d files (%d dropped) in %d classes",
            listing.num_files,
            listing.num_dropped,
            len(listing.class_names),
        )
        return listing

    def no_usable_image(self, num_dropped: int, first: DroppedFile | None) -> str:
        """The message for a listing without a file to process."""
        example = f", e.g. {first.key}: {first.message}" if first else ""
        return (
            f"{self.describe()}: no usable input image "
            f"({num_dropped} dropped while listing{example})"
        )

    def _list(self, splits_from_source: bool, targets: TargetsConfig) -> Listing:
        raise NotImplementedError

    def describe(self) -> str:
        """``source.<field>: <location>``, for messages."""
        raise NotImplementedError

    def resolved(self) -> _SourceModel:
        """The same source with its location absolute."""
        raise NotImplementedError

    def check(self, output_root: str) -> str | None:
        """What is wrong with the source's location for this output, or None."""
        raise NotImplementedError

    def location_problem(self, output_root: str) -> str | None:
        """`check`, with an object store that cannot be reached (no
        credentials, no network, no such bucket, access denied) as a problem
        of its own, ``source.root: gs://...: cannot reach it: <reason>``,
        found at once: Google credentials are looked up before the first
        request (`storage.check_credentials`), where Beam's client would
        retry for minutes.

        Raises:
          Exception: an error that does not say a store is unreachable
            (`storage.unreachable_reason`): a bug stays a bug.
        """
        try:
            for _, path in self.location_paths():
                storage.check_credentials(path)
            return self.check(output_root)
        except Exception as e:
            reason = storage.unreachable_reason(e)
            if reason is None:
                raise
            return f"{self.describe()}: cannot reach it: {reason}"


class ImageFolderSource(_SourceModel):
    """``root/<class>/<image>``, or ``root/<split>/<class>/<image>`` with
    ``splits.from_source``. Class names are the sorted folder names."""

    type: Literal["image_folder"]
    """`image_folder`: `root/<class>/<image>`, or `root/<split>/<class>/<image>` with
    `splits.from_source`; class names are the sorted folder names."""
    root: ConfigPath
    """The image folder: a local path (relative to the config file's folder) or
    `gs://bucket/prefix`. What is listed: a file or folder whose name starts with `.`
    (`.DS_Store`, `._IMG_1.jpg`, `.git/`) is skipped without a word and not counted. Every
    other file is an input, and one that is dropped counts against `errors.max_fraction`
    (5% by default): a file directly in `root` or in a subfolder of a class folder is
    `unexpected_location`; a file in a class folder is decoded whatever its name, so
    `Thumbs.db`, `desktop.ini` or `notes.txt` there is `not_an_image` (stage `decode`); a name
    that is not UTF-8 or holds a control character (a newline, a tab, an escape), or a class
    folder name that is not a class name (see `classes`), is `bad_name`, shown escaped.
    Symbolic links to files and folders are followed, within `root` and `allowed_roots` (else
    `outside_source`); a broken link, a named pipe or device, and a link to a folder that
    holds it (a loop: not entered) are `unreadable`. Without `classes`, a class folder with no
    file listed in it (empty, or only subfolders) is no class."""

    listing: Literal["launcher", "job"] = "launcher"
    """Where the objects are listed. `launcher`: by `kiln build` itself, before the job.
    `job` (a root on an object store only, e.g. `gs://`, `s3://`; not with `splits.stratify`):
    `kiln build` lists only the folders (class folders, and split folders with
    `splits.from_source`), and a short Beam job on the build's runner lists each folder's objects
    on the workers, stamps them and writes the build's listing; the same records, version and
    kiln.json. Worth it from some millions of objects on a wide fleet (docs/dataflow.md,
    "Listing at scale"). A manifest with `job` (on an object store; not with `targets:`,
    `splits.stratify` or a local `allowed_roots`): the job reads its rows and lists or asks
    for their objects on the workers (the launcher's rule per folder)."""

    LOCATION_FIELDS: ClassVar[tuple[str, ...]] = ("root", "allowed_roots")
    WORKER_FIELDS: ClassVar[tuple[str, ...]] = ("root", "allowed_roots")
    LISTING_FIELDS: ClassVar[tuple[str, ...]] = ("listing",)

    def _list(self, splits_from_source: bool, targets: TargetsConfig) -> Listing:
        # The config allows an image folder `label` targets only.
        return _list_image_folder(
            self.root,
            self.classes,
            splits_from_source,
            _Confinement.of(self.root, self.allowed_roots),
        )

    def describe(self) -> str:
        return f"source.root: {self.root}"

    def no_usable_image(self, num_dropped: int, first: DroppedFile | None) -> str:
        """With the folder the images seem to be in when they sit deeper
        than the layout (``root/all/flowers/<class>/<image>``)."""
        message = super().no_usable_image(num_dropped, first)
        if first is None or first.reason != "unexpected_location":
            return message
        depth = len(_SPLIT_LAYOUT.split("/")) if _SPLIT_LAYOUT in first.message else 2
        parts = first.key.split("/")
        if len(parts) <= depth:
            return message
        deeper = storage.join(self.root, *parts[: len(parts) - depth])
        message = f"{message}; if {deeper} holds that layout, make it source.root"
        if depth == 2 and len(parts) == 3 and parts[0].casefold() in _SPLIT_LIKE_NAMES:
            # root/train/<class>/<image> without splits.from_source: the
            # likelier meaning is a folder of splits, not one split's classes.
            message += f"; if {parts[0]!r} is a split, set splits.from_source: true"
        return message

    def resolved(self) -> ImageFolderSource:
        return self.model_copy(
            update={
                "root": storage.absolute(self.root),
                "classes": _copied(self.classes),
                "allowed_roots": _absolute_all(self.allowed_roots),
            }
        )

    def check(self, output_root: str) -> str | None:
        problem = _no_files_problem("source.root", self.root)
        if problem:
            return problem
        if storage.inside(output_root, self.root):
            return (
                f"output: {output_root} is inside the source folder {self.root}; "
                f"the next build would read its own output"
            )
        return None


class ManifestSource(_SourceModel):
    """A CSV (header ``path,label[,split]``) or JSONL (``{"path", "label"[, "split"]}``)
    file; ``.jsonl``/``.json`` means JSONL (compressed too: ``.jsonl.gz``), anything
    else CSV. Class names are
    `classes` if given (in its order), else the sorted distinct labels."""

    type: Literal["manifest"]
    """`manifest`: a CSV (header `path,label[,split]`) or JSONL file (`{"path", "label"[,
    "split"]}`; `.jsonl`/`.json` means JSONL). Either may be compressed, read by its suffix
    (`.gz`, `.bz2`, `.xz`, `.lzma`, `.deflate`, `.zst`): `manifest.jsonl.gz` is JSONL. A
    compressed file cut short, or one whose xz/lzma dictionary or zstd window is over 128 MiB
    (`xz -9` writes 64 MiB, `zstd --long` 128 MiB), is a config error."""
    path: ConfigPath
    """The manifest file (a local path relative to the config file's folder, or a `gs://`
    URI); relative image paths in it resolve against the manifest's own folder. A line may
    hold 16 MiB (16777216 bytes); a longer one (a file that is no manifest, a row with a huge
    embedded string) is read through without being kept and dropped as `line_too_long`,
    counted against `errors.max_fraction` (a CSV header that long is a config error). The
    file is read as UTF-8 (a BOM is dropped): a byte that is not is a config error naming its
    line (`manifest.csv: line 5 is not UTF-8 text (byte 0xe9: invalid continuation byte):
    save the manifest as UTF-8`), since a file saved in another encoding would make every
    row with such a byte a bad row."""

    listing: Literal["launcher", "job"] = "launcher"
    """Where the rows' objects are looked up. `launcher`: by `kiln build` itself, before the
    job. `job` (a manifest on an object store, e.g. `gs://`, `s3://`; not with `targets:` nor
    `splits.stratify`): a short Beam job on the build's runner reads the manifest's rows, lists
    or asks for their objects on the workers, stamps them and writes the build's listing; the
    same records, version and kiln.json (docs/dataflow.md, "Listing at scale")."""

    LOCATION_FIELDS: ClassVar[tuple[str, ...]] = ("path", "allowed_roots")
    # Relative image paths resolve against the manifest's folder.
    WORKER_FIELDS: ClassVar[tuple[str, ...]] = ("path", "allowed_roots")
    LISTING_FIELDS: ClassVar[tuple[str, ...]] = ("listing",)

    def _list(self, splits_from_source: bool, targets: TargetsConfig) -> Listing:
        try:
            return _list_manifest(
                self.path,
                self.classes,
                splits_from_source,
                manifest_confinement(self.path, self.allowed_roots),
                targets,
            )
        except ManifestError as e:
            raise ConfigError(f"source.path: {e}") from None

    def describe(self) -> str:
        return f"source.path: {self.path}"

    def no_usable_image(self, num_dropped: int, first: DroppedFile | None) -> str:
        """The message for a listing without a file to process, saying so when
        the manifest is a COCO instances file (`coco.looks_like_coco`): every
        line of it is dropped as a row, for want of a ``path``."""
        message = super().no_usable_image(num_dropped, first)
        if looks_like_coco(self.path):
            message += (
                "; it looks like a COCO instances file: use source.type: coco, with "
                "annotations: (this file) and images: (the images' folder), see "
                "docs/detection-sources.md"
            )
        return message

    def resolved(self) -> ManifestSource:
        return self.model_copy(
            update={
                "path": storage.absolute(self.path),
                "classes": _copied(self.classes),
                "allowed_roots": _absolute_all(self.allowed_roots),
            }
        )

    def check(self, output_root: str) -> str | None:
        if not storage.exists(self.path):
            return f"source.path: manifest not found: {self.path}"
        return None


SplitName = Annotated[str, Field(pattern=SPLIT_NAME_PATTERN)]

# The meanings of the fields of a COCO or VOC source (`_ObjectSource`), which
# a COCO source declares again, optional beside its `parts`.
_ANNOTATIONS_MEANING = """coco: the instances JSON file (e.g. \
`annotations/instances_train2017.json`), read item by item (three passes), never whole into \
memory; its declared category names, sorted, are the class list unless `classes` is given. It \
may be compressed as a manifest may (`instances.json.gz`: the same suffixes and limits). voc: \
the folder of XML files (e.g. `VOCdevkit/VOC2012/Annotations`), each `.xml` file below it one \
image. A local path (relative to the config file's folder) or `gs://...`. Required, but for a \
coco source that gives `parts` instead."""
_IMAGES_MEANING = """The folder the images' file names are relative to (coco: `file_name`, \
e.g. `train2017`; voc: `<filename>`, e.g. `VOCdevkit/VOC2012/JPEGImages`); images are read \
only below it (and `allowed_roots`). Required, but for a coco source that gives `parts` \
instead."""
_SPLIT_MEANING = """The split of every image (e.g. `train` for `instances_train2017.json`), \
for `splits.from_source`."""


class _ObjectSource(_SourceModel):
    """Objects annotated in their own files (`annotations`), beside the folder of the images
    (`images`): each image becomes a JSONL manifest row, its targets checked as a manifest
    line's are. A kind says how its annotations are read (`_rows`) and what makes them
    unreadable (`_annotations_problem`)."""

    annotations: ConfigPath = Field(description=_ANNOTATIONS_MEANING)
    images: ConfigPath = Field(description=_IMAGES_MEANING)
    split: SplitName | None = Field(None, description=_SPLIT_MEANING)

    LOCATION_FIELDS: ClassVar[tuple[str, ...]] = ("annotations", "images", "allowed_roots")
    # The annotations are read by the launcher, as it lists the source.
    WORKER_FIELDS: ClassVar[tuple[str, ...]] = ("images", "allowed_roots")

    def _list(self, splits_from_source: bool, targets: TargetsConfig) -> Listing:
        _check_split(self.split, splits_from_source)
        base = _folder(self.images)
        classes, rows = self._rows(targets, lambda p: _resolve(p, base))
        return _list_rows(
            rows,
            self.annotations,
            base,
            classes,
            splits_from_source,
            _Confinement.of(self.images, self.allowed_roots),
            targets,
        )

    def _rows(
        self, targets: TargetsConfig, resolve: Callable[[str], str]
    ) -> tuple[list[str] | None, Iterator[Row | _BadRow]]:
        """The class list (None: every class the rows name) and the images' rows, read as
        they are used; `resolve` makes an image or mask path absolute."""
        raise NotImplementedError

    def _annotations_problem(self) -> str | None:
        """Why `annotations` cannot be read (not found, empty), or None."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"source.annotations: {self.annotations}"

    def resolved(self) -> _ObjectSource:
        return self.model_copy(
            update={
                "annotations": storage.absolute(self.annotations),
                "images": storage.absolute(self.images),
                "classes": _copied(self.classes),
                "allowed_roots": _absolute_all(self.allowed_roots),
            }
        )

    def check(self, output_root: str) -> str | None:
        # Both parts at once: one run shows every path to fix.
        problems = [self._annotations_problem(), _check_images_folder(self.images, output_root)]
        return "; ".join(p for p in problems if p) or None


class CocoPart(BaseModel):
    """One instances file of a COCO dataset, its image folder and its split (`source.parts`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    annotations: ConfigPath
    """The instances JSON file, e.g. `annotations/instances_val2017.json`."""
    images: ConfigPath
    """The folder its images' `file_name` are relative to, e.g. `val2017`."""
    split: SplitName | None = None
    """The split of its images, e.g. `validation`, for `splits.from_source`."""


class CocoSource(_ObjectSource):
    """A COCO instances JSON file (`annotations`) and the folder of its images (`images`),
    read as a stream; each image becomes a JSONL manifest row (`kiln.pipeline.coco`). Or
    several such files (`parts`: COCO ships one per split, each with its own folder), read
    one after the other into one listing."""

    type: Literal["coco"]
    """`coco`: a COCO instances JSON file and its image folder: boxes (`[x, y, width, height]`
    becomes `[x_min, y_min, x_max, y_max]`), category names as classes, `iscrowd`, polygon and
    RLE segmentation, keypoints. Needs `targets.boxes`. See
    [detection-sources.md](detection-sources.md#coco)."""
    # Optional here: `parts` may give them instead (`_one_form`).
    annotations: ConfigPath | None = Field(  # type: ignore[assignment]
        None, description=_ANNOTATIONS_MEANING
    )
    images: ConfigPath | None = Field(None, description=_IMAGES_MEANING)  # type: ignore[assignment]
    parts: list[CocoPart] | None = None
    """coco: instead of `annotations`, `images` and `split`, one instances file per split with
    its own image folder, as COCO ships them: `[{annotations:
    annotations/instances_train2017.json, images: train2017, split: train}, {annotations:
    annotations/instances_val2017.json, images: val2017, split: validation}]`, one dataset.
    Keys are relative to the common parent folder of the parts' image folders
    (`train2017/<file_name>`); the class list is the union of the parts' declared
    category names, sorted (or `classes`); a category name whose keypoint names differ
    between two parts stops the build. With `splits.from_source` every part names its split.
    A file listed by two parts that share an image folder, with different splits, is a
    `duplicate_key`. See [detection-sources.md](detection-sources.md#coco)."""

    LOCATION_FIELDS: ClassVar[tuple[str, ...]] = (
        "annotations",
        "images",
        "allowed_roots",
        "parts",
    )

    @model_validator(mode="after")
    def _one_form(self) -> CocoSource:
        """One instances file (`annotations`, `images`) or `parts`: exactly one form."""
        single = [name for name in ("annotations", "images", "split") if getattr(self, name)]
        if self.parts == []:
            raise ValueError("parts lists no instances file; give one part per file")
        if self.parts is not None and single:
            raise ValueError(
                f"give either parts (one instances file per split) or {', '.join(single)} "
                f"(one instances file), not both; with parts, each part names its "
                f"annotations, images and split"
            )
        if self.parts is None:
            missing = [name for name in ("annotations", "images") if getattr(self, name) is None]
            if missing:
                raise ValueError(
                    f"a coco source needs annotations and images (one instances file), or "
                    f"parts (one instances file per split); {' and '.join(missing)} missing"
                )
        return self

    def _list(self, splits_from_source: bool, targets: TargetsConfig) -> Listing:
        if self.parts is not None:
            return self._list_parts(self.parts, splits_from_source, targets)
        # The file is read while the rows are listed: its problems surface there.
        try:
            return super()._list(splits_from_source, targets)
        except CocoFileError as e:
            raise ConfigError(f"source.annotations: {e}") from None

    def _coco_file(self, path: str, targets: TargetsConfig, name: str | None = None) -> CocoFile:
        keypoint_names = targets.keypoints.names if targets.keypoints is not None else None
        fields = sorted(targets.boxes.fields) if targets.boxes is not None else []
        return CocoFile(path, keypoint_names=keypoint_names, fields=fields, name=name)

    def _rows(
        self, targets: TargetsConfig, resolve: Callable[[str], str]
    ) -> tuple[list[str] | None, Iterator[Row | _BadRow]]:
        annotations = cast(str, self.annotations)  # given without parts (`_one_form`)
        coco = self._coco_file(annotations, targets)
        classes = self.classes or coco.class_names()
        if not classes:
            raise ConfigError(
                f"source.annotations: {annotations} declares no categories; "
                f"list the class names in source.classes"
            )
        return classes, _coco_rows(coco, self.split, targets, resolve)

    def _list_parts(
        self, parts: list[CocoPart], splits_from_source: bool, targets: TargetsConfig
    ) -> Listing:
        """The listing of every part's images, as if one file listed them all.

        The rows of each part go into one listing, one part after the other
        (their positions too, so that a key two parts list is ordered by
        part); an image's path becomes relative to the parts' common image
        folder, so that keys stay apart (``train2017/1.jpg``,
        ``val2017/1.jpg``), and a dropped row names its part's file.
        """
        first: dict[str, int] = {}
        for index, part in enumerate(parts):
            _check_split(part.split, splits_from_source, f"source.parts[{index}].split")
            other = first.setdefault(part.annotations, index)
            if other != index:  # its images would be listed twice, its problems reported twice
                raise ConfigError(
                    f"source.parts[{index}].annotations: {part.annotations} is the file of "
                    f"source.parts[{other}] too; list each instances file once"
                )
        folders = [_folder(part.images) for part in parts]
        base = _common_folder(folders)
        names = _distinct_names([part.annotations for part in parts])
        files = [
            self._coco_file(part.annotations, targets, name)
            for part, name in zip(parts, names, strict=True)
        ]
        declared = self._parts_class_names(files)  # checks the parts agree, with classes too
        classes = self.classes or declared
        if not classes:
            raise ConfigError(
                f"source.parts: {', '.join(part.annotations for part in parts)} declare no "
                f"categories; list the class names in source.classes"
            )

        def rows() -> Iterator[Row | _BadRow]:
            offset = 0
            for index, (part, coco, folder) in enumerate(zip(parts, files, folders, strict=True)):
                inside = _relative_folder(folder, base)
                count = 0
                try:
                    for row in _coco_rows(
                        coco, part.split, targets, lambda p, folder=folder: _resolve(p, folder)
                    ):
                        count += 1
                        row = dataclasses.replace(
                            row, line=offset + row.line, uri=row.uri or part.annotations
                        )
                        if isinstance(row, Row) and inside:
                            row = dataclasses.replace(row, path=_in_folder(inside, row.path))
                        yield row
                except CocoFileError as e:
                    raise ConfigError(f"source.parts[{index}].annotations: {e}") from None
                offset += count

        return _list_rows(
            rows(),
            self.describe(),
            base,
            classes,
            splits_from_source,
            _Confinement.of_folders(folders, self.allowed_roots),
            targets,
            file_of=lambda where: where.rsplit(":", 1)[0],
        )

    def _parts_class_names(self, files: list[CocoFile]) -> list[str]:
        """The union of the parts' declared category names, sorted.

        Raises:
          ConfigError: a part's categories are broken (`CocoFile.categories`),
            or two parts give one category name different keypoint names: an
            object's keypoints are read by its category's names, which would
            mean one thing in one part and another in the other.
        """
        keypoints: dict[str, tuple[int, tuple[str, ...]]] = {}  # name: first part, its keypoints
        for index, coco in enumerate(files):
            try:
                categories = coco.categories()
            except CocoFileError as e:
                raise ConfigError(f"source.parts[{index}].annotations: {e}") from None
            for category in categories.values():
                first, names = keypoints.setdefault(category.name, (index, category.keypoints))
                if first != index and names != category.keypoints:
                    raise ConfigError(
                        f"source.parts: category {category.name!r} has the keypoints "
                        f"{list(names)} in source.parts[{first}] ({files[first].name}) and "
                        f"{list(category.keypoints)} in source.parts[{index}] ({coco.name}); "
                        f"the parts of one dataset must name a category's keypoints alike"
                    )
        return sorted(keypoints)

    def _annotations_problem(self) -> str | None:
        # Given without parts (`_one_form`).
        return _coco_file_problem(cast(str, self.annotations), "source.annotations")

    def describe(self) -> str:
        if self.parts is None:
            return super().describe()
        return f"source.parts: {', '.join(part.annotations for part in self.parts)}"

    def resolved(self) -> CocoSource:
        if self.parts is None:
            return cast(CocoSource, super().resolved())
        parts = [
            part.model_copy(
                update={
                    "annotations": storage.absolute(part.annotations),
                    "images": storage.absolute(part.images),
                }
            )
            for part in self.parts
        ]
        return self.model_copy(
            update={
                "parts": parts,
                "classes": _copied(self.classes),
                "allowed_roots": _absolute_all(self.allowed_roots),
            }
        )

    def check(self, output_root: str) -> str | None:
        if self.parts is None:
            return super().check(output_root)
        problems = []
        for index, part in enumerate(self.parts):
            field = f"source.parts[{index}]"
            problems.append(_coco_file_problem(part.annotations, f"{field}.annotations"))
            problems.append(_check_images_folder(part.images, output_root, f"{field}.images"))
        return "; ".join(p for p in problems if p) or None

    def location(self) -> dict[str, Any]:
        """Without `parts` for one instances file (where it was before parts
        existed), and with the parts' files and folders only for parts."""
        if self.parts is None:
            return self.model_dump(mode="json", include={"annotations", "images", "allowed_roots"})
        return self.model_dump(
            mode="json",
            include={"allowed_roots": True, "parts": {"__all__": {"annotations", "images"}}},
        )

    def fingerprint_exclude(self) -> Any:
        """One instances file: as before `parts` existed (the same version).
        Parts: each part's split, not where its files are."""
        if self.parts is None:
            return {*self.LOCATION_FIELDS, *self.LISTING_FIELDS}
        return {
            "annotations": True,
            "images": True,
            "allowed_roots": True,
            "parts": {"__all__": {"annotations", "images"}},
        }


def _coco_file_problem(path: str, field: str) -> str | None:
    """Why an instances file cannot be read (a folder, not found), or None."""
    if _local_folder(path):
        return (
            f"{field}: {path} is a folder; a coco source reads one "
            f"instances JSON file (e.g. annotations/instances_train2017.json)"
        )
    if not storage.exists(path):
        return f"{field}: file not found: {path}"
    return None


def _common_folder(folders: list[str]) -> str:
    """The deepest folder that holds every one of `folders` (absolute local
    paths, or URIs of one bucket).

    Raises:
      ConfigError: they have none (local and remote, or two buckets).
    """
    if all(not is_remote(folder) for folder in folders):
        return os.path.commonpath(folders)
    split = [folder.rstrip("/").split("/") for folder in folders]
    # gs://bucket/a -> ["gs:", "", "bucket", "a"]: the scheme and bucket must agree.
    if any(is_remote(folder) != is_remote(folders[0]) for folder in folders) or any(
        parts[:3] != split[0][:3] for parts in split
    ):
        raise ConfigError(
            f"source.parts: the parts' image folders ({', '.join(folders)}) are not in one "
            f"bucket or file system; an image's key is its path below their common folder"
        )
    common = split[0]
    for parts in split[1:]:
        length = 0
        while length < min(len(common), len(parts)) and common[length] == parts[length]:
            length += 1
        common = common[:length]
    return "/".join(common)


def _relative_folder(folder: str, base: str) -> str:
    """`folder` relative to `base`, which holds it, with '/' separators ("" for `base`)."""
    if folder == base:
        return ""
    relative = folder[len(base) :] if is_remote(base) else os.path.relpath(folder, base)
    return relative.replace(os.sep, "/").strip("/")


def _in_folder(folder: str, path: str) -> str:
    """An image path of a part (relative to its own folder) relative to the
    parts' common folder; an absolute path or URI as it is."""
    if is_remote(path) or path.startswith("/"):
        return path
    return posixpath.join(folder, path.replace("\\", "/"))


def _distinct_names(paths: list[str]) -> list[str]:
    """The names of instances files in messages and keys: their paths below
    their common folder, so the base name when they share one
    (``instances_val2017.json``), else enough of the path to tell them apart
    (``valid/_annotations.coco.json``)."""
    names = [posixpath.basename(path.rstrip("/")) for path in paths]
    if len(set(names)) == len(names):
        return names
    try:
        common = _common_folder([_folder(posixpath.dirname(path)) for path in paths])
    except ConfigError:
        return paths
    return [
        posixpath.join(_relative_folder(_folder(posixpath.dirname(path)), common), name)
        for path, name in zip(paths, names, strict=True)
    ]


class VocSource(_ObjectSource):
    """A folder of Pascal VOC XML files (`annotations`) and the folder of their images
    (`images`); each file becomes a JSONL manifest row (`kiln.pipeline.voc`)."""

    type: Literal["voc"]
    """`voc`: a folder of Pascal VOC XML files, one per image: boxes (1-based inclusive pixel
    indices become `[xmin - 1, ymin - 1, xmax, ymax]`), object names as classes, `difficult`,
    `truncated`, `occluded`. Needs `targets.boxes`. See
    [detection-sources.md](detection-sources.md#pascal-voc)."""

    def _rows(
        self, targets: TargetsConfig, resolve: Callable[[str], str]
    ) -> tuple[list[str] | None, Iterator[Row | _BadRow]]:
        return self.classes, _voc_rows(self.annotations, self.split, targets, resolve)

    def _annotations_problem(self) -> str | None:
        if _local_file(self.annotations):
            return (
                f"source.annotations: {self.annotations} is a file; a voc source reads a "
                f"folder of XML files, one per image"
            )
        return _no_files_problem("source.annotations", self.annotations)


Source = Annotated[
    ImageFolderSource | ManifestSource | CocoSource | VocSource, Field(discriminator="type")
]
"""The ``source:`` section: one of the source kinds, chosen by its ``type``."""


def _check_split(split: str | None, splits_from_source: bool, field: str = "") -> None:
    if splits_from_source and split is None:
        if field:  # a part of a coco source
            raise ConfigError(
                f"{field}: splits.from_source takes every image's split from the source; "
                f"name the split of this part's images (e.g. split: validation)"
            )
        raise ConfigError(
            "source.split: splits.from_source takes every image's split from the source; "
            "name the split of this file's images (e.g. split: train)"
        )


def _no_files_problem(field: str, folder: str) -> str | None:
    """Why the folder a source field names holds nothing to list (not found,
    empty, or it or a folder below it cannot be listed), or None."""
    try:
        if storage.store_for(folder).has_files(folder):
            return None
    except storage.UnlistableFolder as e:
        return f"{field}: {e.strerror}"
    if not is_remote(folder) and os.path.isfile(folder):
        return f"{field}: {folder} is a file, not a folder"
    return f"{field}: folder not found or empty: {folder}"


def _local_folder(path: str) -> bool:
    return not is_remote(path) and os.path.isdir(path)


def _local_file(path: str) -> bool:
    return not is_remote(path) and os.path.isfile(path)


def _check_images_folder(images: str, output_root: str, field: str = "source.images") -> str | None:
    if _local_file(images):
        return f"{field}: {images} is a file, not the folder of the images"
    problem = _no_files_problem(field, images)
    if problem:
        return problem
    if storage.inside(output_root, images):
        return (
            f"output: {output_root} is inside the source folder {images}; "
            f"the next build would read its own output"
        )
    return None


def _folder(path: str) -> str:
    return path.rstrip("/") if is_remote(path) else os.path.abspath(path)


def _coco_rows(
    coco: CocoFile, split: str | None, targets: TargetsConfig, resolve
) -> Iterator[Row | _BadRow]:
    """A COCO file's images as manifest rows, its problems as bad rows.

    Crowd regions (``iscrowd`` 1: a group of objects under one RLE, which
    detectors and COCO's evaluation ignore rather than learn as one object)
    are stored as ordinary objects when ``iscrowd`` is not a declared field,
    and nothing in the records tells them apart: a warning says how many,
    once the file is read, and what to declare.
    """
    keeps_crowd = targets.boxes is not None and "iscrowd" in targets.boxes.fields
    crowd = 0
    for position, found in enumerate(coco.rows()):
        if isinstance(found, CocoProblem):
            yield _BadRow(position, found.entry, found.message, found.reason, found.where)
            continue
        if not keeps_crowd:
            crowd += sum(1 for item in found.row["objects"] if _is_crowd(item.get("iscrowd")))
        row = _annotated_row(position, found.where, found.row, split, targets, resolve)
        if isinstance(row, _BadRow):  # its object named by its annotation, as in the file
            row = dataclasses.replace(
                row, problem=naming_annotations(row.problem, found.annotations)
            )
        elif row.targets is not None:  # and so in the job's messages
            for item, named in zip(row.targets.get("objects", ()), found.annotations, strict=True):
                item[target_rows.ANNOTATION] = named
        yield row
    if crowd:
        logger.warning(
            "%s: %d annotation(s) are crowd regions (iscrowd 1), stored as ordinary objects: "
            "declare targets.boxes.fields: {iscrowd: int} to keep the flag, and skip them in "
            "training as COCO's evaluation does",
            coco.name,
            crowd,
        )


def _is_crowd(value: Any) -> bool:
    """Whether an annotation's ``iscrowd`` as written marks a crowd region (1, or
    another number that is not 0)."""
    return type(value) in (int, float) and value != 0


def _voc_rows(
    folder: str, split: str | None, targets: TargetsConfig, resolve
) -> Iterator[Row | _BadRow]:
    """A VOC folder's files as manifest rows, unreadable ones as bad rows."""
    for position, found in enumerate(voc.read_folder(folder)):
        if isinstance(found, voc.VocProblem):
            yield _BadRow(position, found.where, found.message, where=found.where, uri=found.uri)
            continue
        yield _annotated_row(
            position, found.where, found.row, split, targets, resolve, uri=found.uri
        )


def _annotated_row(
    position: int,
    where: str,
    row: dict,
    split: str | None,
    targets: TargetsConfig,
    resolve,
    uri: str | None = None,
) -> Row | _BadRow:
    """A COCO or VOC image's row, its targets checked as a JSONL line's are; `uri`:
    the file a bad row names (None: the source's file)."""
    text = json.dumps(row, sort_keys=True, separators=(",", ":"))
    try:
        row_targets = target_rows.row_targets(row, targets, resolve)
    except AnnotationError as e:
        return _BadRow(position, text, str(e), where=where, uri=uri)
    return Row(position, text, row["path"], "", split, row_targets, where)


def _paths_in(value: Any, field: str = "") -> Iterator[tuple[str, str]]:
    """The strings of a source's `location` (nested in lists and mappings),
    each with its field: ``allowed_roots[0]``, ``parts[1].images``."""
    if isinstance(value, str):
        yield field, value
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths_in(item, f"{field}[{index}]")
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _paths_in(item, f"{field}.{name}" if field else name)


def _copied(classes: list[str] | None) -> list[str] | None:
    return None if classes is None else list(classes)


def _absolute_all(paths: list[str]) -> list[str]:
    return sorted({storage.absolute(path) for path in paths})


class _RealPaths:
    """Local paths with their symbolic links followed, as `os.path.realpath`
    gives them, at one ``lstat`` per file rather than one per component of
    its path.

    A file that is not a link resolves to its folder's real path joined with
    its name, and the folder's real path is kept for the next file: a
    listing in key order goes folder by folder. A link (or a path that
    cannot be ``lstat``'ed, or ends in ``.`` or ``..``) is resolved whole.
    The last path's ``lstat``, when it is not a link, is kept: it is that
    path's ``os.stat`` too (`stat_of`), which the listing asks for next.
    Not thread-safe: one per listing.
    """

    def __init__(self):
        self._folder: str | None = None
        self._real_folder = ""
        self._last: tuple[str, os.stat_result] | None = None

    def resolve(self, path: str) -> str:
        self._last = None
        folder, name = os.path.split(path)
        if name in ("", ".", ".."):
            return os.path.realpath(path)
        try:
            status = os.lstat(path)
        except OSError:
            return os.path.realpath(path)
        if stat.S_ISLNK(status.st_mode):
            return os.path.realpath(path)
        self._last = (path, status)
        if folder != self._folder:
            self._folder, self._real_folder = folder, os.path.realpath(folder)
        return os.path.join(self._real_folder, name)

    def stat_of(self, path: str) -> os.stat_result | None:
        """The ``os.stat`` of `path` if it is the last path resolved and not
        a link (its ``lstat``, taken then); None otherwise."""
        last = self._last
        return last[1] if last is not None and last[0] == path else None


@dataclasses.dataclass(frozen=True)
class _Confinement:
    """Where a source's inputs may be read from: its own folder (an image
    folder's root, a manifest's folder) and ``source.allowed_roots``.

    Local paths are compared after following symbolic links, so a link (or a
    manifest row such as ``../../etc/passwd``) cannot reach outside; object
    store URIs by prefix (they have no links). Anything else is dropped with
    reason ``outside_source``, never read.
    """

    source_root: str
    roots: tuple[str, ...]
    real_paths: _RealPaths = dataclasses.field(default_factory=_RealPaths, compare=False)

    @classmethod
    def of(cls, source_root: str, allowed_roots: list[str]) -> _Confinement:
        roots = [source_root, *allowed_roots]
        return cls(source_root, tuple(_real(root) for root in roots))

    @classmethod
    def of_folders(cls, folders: list[str], allowed_roots: list[str]) -> _Confinement:
        """Below any of `folders` (the image folders of a coco source's parts)."""
        roots = [*dict.fromkeys(folders), *allowed_roots]
        return cls(" or ".join(dict.fromkeys(folders)), tuple(_real(root) for root in roots))

    def problem(self, uri: str) -> str | None:
        """Why `uri` may not be read, or None if it may."""
        resolved = uri.rstrip("/") if is_remote(uri) else self.real_paths.resolve(uri)
        if any(storage.inside(resolved, root) for root in self.roots):
            return None
        shown = f" (it resolves to {resolved})" if resolved != uri else ""
        return (
            f"outside the source folder {self.source_root}{shown}; "
            f"list its folder in source.allowed_roots to read it"
        )


def broken_link(uri: str) -> str | None:
    """Why a local path that confinement refused cannot be read anyway, if it
    is a symbolic link to nothing (a broken link is ``unreadable``, wherever
    it points: there is no folder to allow); None otherwise."""
    if is_remote(uri) or not os.path.islink(uri) or os.path.exists(uri):
        return None
    return f"a broken symbolic link (to {os.path.realpath(uri)}, which does not exist)"


def manifest_confinement(path: str, allowed_roots: list[str]) -> _Confinement:
    """Where a manifest's rows may point: its own folder and `allowed_roots`."""
    return _Confinement.of(path.rstrip("/").rsplit("/", 1)[0], allowed_roots)


def _real(path: str) -> str:
    return path.rstrip("/") if is_remote(path) else os.path.realpath(path)


class Misplaced(NamedTuple):
    """Why a file of an image folder is dropped: a `DroppedFile`'s reason and message."""

    reason: str
    message: str


_LAYOUT = "<class>/<image>"
_SPLIT_LAYOUT = "<split>/<class>/<image>"
# Folder names that say "split" when images sit one folder deeper than classes.
_SPLIT_LIKE_NAMES = frozenset(
    ["train", "training", "val", "valid", "validation", "dev", "eval", "test", "testing"]
)


def folder_place(key: str, from_source: bool) -> tuple[str, str | None] | Misplaced | None:
    """Where the file `key` (relative to an image folder's root) sits:
    ``(class name, split folder or None)``, `Misplaced` outside the layout
    or with a name that is not UTF-8 or holds a control character
    (`bad_name`, before the layout is checked) or a class folder name that
    `target_rows.class_name` refuses (`bad_name`), or None for a hidden path
    (a name starting with '.'), which is skipped. The class name is the
    class folder's name read as every class name is (`target_rows.class_name`:
    stripped of surrounding whitespace).

    The first of an image folder's two checks, before the class names are
    known; the launcher's listing and the listing job (`listing_job`) apply
    the same rules.

    An object whose name ends in '/' (``key`` empty for the root's own) is
    an object store's folder placeholder, skipped as a folder is: the Cloud
    Console's "Create folder", gcsfuse's ``mkdir`` and S3's console write
    one, and it stays when the folder's files are deleted. Read as a file,
    it was an ``empty`` drop (``unexpected_location`` for the root's), and
    it made its folder a class: a class folder emptied on the store stayed
    a class with no example, where a local folder emptied is no class.
    """
    if not key or key.endswith("/"):
        return None
    parts = key.split("/")
    if any(part.startswith(".") for part in parts):
        return None
    if not is_unicode(key) or target_rows.control_character(key) is not None:
        return _bad_name(parts, from_source)
    if len(parts) != (3 if from_source else 2):
        layout = _SPLIT_LAYOUT if from_source else _LAYOUT
        return Misplaced("unexpected_location", f"not in the layout root/{layout}")
    label = _class_folder(parts[-2])
    if isinstance(label, Misplaced):
        return label
    return label, parts[0] if from_source else None


@functools.lru_cache(maxsize=4096)  # per file, but a folder holds many
def _class_folder(name: str) -> str | Misplaced:
    """A class folder's class name, or why it is none (`bad_name`)."""
    try:
        return target_rows.class_name(name, "class folder name")
    except AnnotationError as e:
        return Misplaced("bad_name", str(e))


def _bad_name(parts: list[str], from_source: bool) -> Misplaced:
    """`bad_name` for a path whose file or folder names are not all UTF-8
    (a local name's undecodable bytes arrive as surrogate escapes, which no
    key, report or record can hold) or hold a control character (a newline,
    an escape: a key is a line of reports and a cell of tables), naming the
    first such name, shown as `error_report.as_text` shows it."""
    index, part = next(
        (i, part)
        for i, part in enumerate(parts)
        if not is_unicode(part) or target_rows.control_character(part) is not None
    )
    in_layout = len(parts) == (3 if from_source else 2)
    if index == len(parts) - 1:
        what = "file name"
    elif in_layout and index == len(parts) - 2:
        what = "class folder name"
    elif in_layout and from_source and index == 0:
        what = "split folder name"
    else:
        what = "folder name"
    control = target_rows.control_character(part)
    if not is_unicode(part) or control is None:
        return Misplaced("bad_name", f"{what} is not valid UTF-8: {as_text(part)}")
    if what == "class folder name":
        refused = _class_folder(part)  # the class name rule's own message
        if isinstance(refused, Misplaced):
            return refused
    return Misplaced(
        "bad_name", f"{what} holds a control character (U+{ord(control):04X}): {as_text(part)}"
    )


def place_problem(label: str, split: str | None, class_names: Collection[str]) -> Misplaced | None:
    """The second check of a file `folder_place` placed, once the class names
    are known: its split folder must be a split name, its class a class."""
    if split is not None and not _SPLIT_NAME.match(split):
        return Misplaced(
            "unexpected_location",
            f"split folder {split!r} is not a valid split name (letters, digits, '_')",
        )
    if label not in class_names:
        return Misplaced("unknown_label", f"class {label!r} is not in source.classes")
    return None


def _list_image_folder(
    root: str, classes: list[str] | None, from_source: bool, confinement: _Confinement
) -> Listing:
    root = root.rstrip("/")
    has_special_files = storage.store_for(root).has_special_files
    with ListingWriter() as writer:

        def drop(key, uri, reason, message):
            writer.drop(DroppedFile(key, "list", reason, uri, message), ["dropped", reason, key])

        for position, metadata in enumerate(_walk_files(root, from_source)):
            key = _relative(metadata.path, root)
            place = folder_place(key, from_source)
            if place is None:
                continue
            if isinstance(place, Misplaced):
                drop(key, metadata.path, place.reason, place.message)
                continue
            writer.add_candidate(
                Candidate(
                    key,
                    position,
                    metadata.path,
                    label=place[0],
                    split=place[1],
                    size=int(metadata.size_in_bytes),
                    mtime=float(metadata.last_updated_in_seconds),
                )
            )

        if classes:
            _check_class_folders(root, classes, writer.candidate_labels(), from_source)
        class_names = list(classes) if classes else writer.candidate_labels()
        label_ids = {name: i for i, name in enumerate(class_names)}
        for (found,) in writer.candidates():  # a folder lists each path once
            key, uri, split = found.key, found.uri, found.split
            misplaced = place_problem(found.label, split, label_ids)
            if misplaced:
                drop(key, uri, misplaced.reason, misplaced.message)
                continue
            outside = confinement.problem(uri)
            if outside:
                broken = broken_link(uri)
                if broken:
                    drop(key, uri, "unreadable", broken)
                else:
                    drop(key, uri, "outside_source", outside)
                continue
            # On an object store the listing holds every object's size and
            # time, and an object is always readable: no request per file.
            # A local file's stamp is its status's, identity and all.
            size, mtime, inode_ctime = found.size, found.mtime, None
            if has_special_files:
                try:
                    size, mtime, problem, inode_ctime = _file_status(uri)
                except OSError as e:  # vanished since listing, or a dangling symbolic link
                    problem = f"cannot stat the file: {e.strerror}"
                if problem:
                    drop(key, uri, "unreadable", problem)
                    continue
            writer.add_file(
                SourceFile(
                    key=key,
                    uri=uri,
                    label=label_ids[found.label],
                    split=split,
                    size=size,
                    mtime=mtime,
                    inode_ctime=inode_ctime,
                )
            )
        return writer.finish(class_names, from_source)


def _check_class_folders(
    root: str, classes: Sequence[str], labels: Sequence[str], from_source: bool
) -> None:
    """Refuses a declared class that names no class folder of the image
    folder: almost surely a typo (``squares`` for ``square``), whose folder's
    files the job would drop as ``unknown_label`` one by one, failing the
    build at its end. An empty class folder declares its class (a class with
    no image yet). `labels` are the classes of the files listed.

    Raises:
      ConfigError: naming each such class, with a did-you-mean.
    """
    missing = [name for name in classes if name not in set(labels)]
    if not missing:
        return
    store = storage.store_for(root)
    parents = [root]
    if from_source:
        parents = [storage.join(root, s) for s in store.children(root) if not s.startswith(".")]
    folders = set(labels)
    for parent in parents:
        for name in store.children(parent):
            found = None if name.startswith(".") else _class_folder(name)
            if isinstance(found, str):
                folders.add(found)
    missing = [name for name in missing if name not in folders]
    if not missing:
        return
    where = f"{root}/<split>" if from_source else root
    which = unknown_names(
        missing, folders, f"names no class folder of {where}", f"name no class folder of {where}"
    )
    raise ConfigError(f"source.classes: {which}")


def _walk_files(root: str, from_source: bool) -> Iterator[FileMetadata]:
    """Every file under `root`, hidden folders not entered, in no particular order.

    A file the store cannot stat (a dangling symbolic link) is listed with
    size 0 rather than skipped, so `_file_status` reports it with its reason
    instead of it vanishing without a word as in Beam's own local listing.
    Symbolic links to folders are followed where the layout has folders
    (split and class folders); a linked folder inside a class folder, where
    the layout has only images, is listed as one entry, not entered: it
    may lead anywhere (``/``), and its files would be misplaced anyway.
    """
    layout_folders = 2 if from_source else 1
    return storage.store_for(root).walk_tree(root, skip_hidden=True, links_above=layout_folders + 1)


def _file_status(uri: str) -> storage.FileStatus:
    """Size, modification time, why the path cannot be read as an image
    file (None if it can), and a local file's status-change identity; see
    `storage.Store.file_status`.

    Raises:
      OSError, BeamIOError: the path does not exist (or cannot be stat'ed).
    """
    return storage.store_for(uri).file_status(uri)


def _relative(path: str, root: str) -> str:
    if is_remote(root):
        relative = path[len(root) :]
    else:
        # Local listings come back with OS separators.
        relative = path[len(root) :].replace("\\", "/")
    return relative.lstrip("/")


class ManifestError(Exception):
    """The manifest as a whole cannot be used (unreadable, no header)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """A manifest row that parses (its checks come later)."""

    line: int
    text: str
    path: str
    label: str  # "" when the targets have no label
    split: str | None
    targets: dict | None = None  # `target_rows.row_targets`, None without targets:
    where: str | None = None  # for messages; None: ``<manifest>:<line>``
    # Without a split: the row's keys (a CSV's header), whose names close to
    # "split" the message of a missing split offers (``'splt' (misspelt?)``).
    columns: tuple[str, ...] = ()
    uri: str | None = None  # the file it comes from; None: the source's (a manifest's)


@dataclasses.dataclass(frozen=True)
class _BadRow:
    """A row that does not parse: dropped as `reason` (``bad_row`` unless said)."""

    line: int
    text: str
    problem: str
    reason: str = "bad_row"
    where: str | None = None  # for messages; None: ``<manifest>:<line>``
    uri: str | None = None  # the file it comes from; None: the source's (a manifest's)


def _list_manifest(
    path: str,
    classes: list[str] | None,
    from_source: bool,
    confinement: _Confinement,
    targets: TargetsConfig = CLASSIFICATION,
) -> Listing:
    rows, base = manifest_rows(path, targets)
    return _list_rows(rows, path, base, classes, from_source, confinement, targets)


def manifest_rows(
    path: str, targets: TargetsConfig = CLASSIFICATION
) -> tuple[Iterator[Row | _BadRow], str]:
    """The manifest's rows, parsed as they are read, and the folder their
    paths are relative to.

    Raises (while iterating):
      ManifestError: the manifest as a whole cannot be used.
    """
    name = posixpath.basename(path)
    lines = _manifest_lines(path)
    base = path.rsplit("/", 1)[0] if is_remote(path) else _local_dirname(path)
    with_targets = not targets.is_classification
    rows = (
        _jsonl_rows(lines, targets if with_targets else None, lambda p: _resolve(p, base))
        if is_jsonl(path)
        else _csv_rows(lines, name, targets if with_targets else None)
    )
    return rows, base


def is_jsonl(path: str) -> bool:
    """Whether the manifest `path` is JSONL: it ends in ``.jsonl`` or ``.json``,
    compressed too (``manifest.jsonl.gz``: `compressed.without_suffix`); else CSV."""
    return compressed.without_suffix(path).endswith((".jsonl", ".json"))


# A row dropped while listing: what the errors file says of it, and its
# part of its `Listing.dropped_entries` entry (`listing.dropped_entry`: for the
# version and the stamp).
DroppedRow = tuple[DroppedFile, Any]


def row_problem(row: Row | _BadRow, path: str, from_source: bool) -> DroppedRow | None:
    """Why a parsed row of the file `path` is dropped before its object is
    looked up (it does not parse, its path is not text, its split is missing
    or invalid), or None."""
    where = row.where or f"{posixpath.basename(path.rstrip('/'))}:{row.line}"
    uri = row.uri if row.uri is not None else path

    def drop(reason: str, message: str) -> DroppedRow:
        return DroppedFile(where, "list", reason, uri, message), ["dropped", reason, row.text]

    if isinstance(row, _BadRow):
        return drop(row.reason, row.problem)
    if not is_unicode(row.path):  # a JSON "\udce9": no key, record or report can hold it
        return drop(
            "bad_row", f"path: {_json_text(row.path)} is not valid Unicode text (a lone surrogate)"
        )
    control = target_rows.control_character(row.path)
    if control is not None:  # the key would be: a key is a line of reports and a cell of tables
        return drop(
            "bad_row",
            f"path: {_json_text(row.path)} holds a control character (U+{ord(control):04X})",
        )
    split = row.split if from_source else None
    if from_source and split is None:
        hint = target_rows.misspelt("split", row.columns)
        return drop("missing_split", f"splits.from_source needs a split for every row{hint}")
    if split is not None and not _SPLIT_NAME.match(split):
        return drop("bad_row", f"split {split!r} is not a valid split name (letters, digits, '_')")
    return None


def row_candidate(row: Row, base: str, from_source: bool) -> Candidate:
    """The candidate of a row `row_problem` keeps (without its targets)."""
    return Candidate(
        _manifest_key(row.path),
        row.line,
        _resolve(row.path, base),
        row.label,
        row.split if from_source else None,
        where=row.where,
    )


def _differing(group: list[Candidate]) -> str:
    """What the candidates of one key give differently: ``label``, ``split``,
    a target (``objects``, ``labels``, ``mask``) or an extra column
    (``extra.weather``), so a duplicate's message names what to reconcile."""
    fields = []
    if len({row.label for row in group}) > 1:
        fields.append("label")
    if len({row.split for row in group}) > 1:
        fields.append("split")
    targets = [json.loads(_meaning(row.targets) or "{}") for row in group]
    for name in sorted(set().union(*targets)):
        values = [entry.get(name) for entry in targets]
        if name == "extra" and all(isinstance(v, dict) or v is None for v in values):
            columns = sorted(set().union(*(v or {} for v in values)))
            fields += [
                f"extra.{column}"
                for column in columns
                if len({json.dumps((v or {}).get(column), sort_keys=True) for v in values}) > 1
            ]
        elif len({json.dumps(value, sort_keys=True) for value in values}) > 1:
            fields.append(name)
    return ", ".join(fields) or "labels, splits or targets"


def _meaning(targets: str | None) -> str | None:
    """A candidate's targets without what only names its objects' entries in
    their file (`target_rows.unnamed_text`): two COCO files listing one image
    with the same annotations under other ids say the same."""
    return targets and target_rows.unnamed_text(targets)


def group_problem(
    group: list[Candidate], label_ids: dict[str, int] | None, confinement: _Confinement
) -> DroppedRow | None:
    """Why the candidates of one key (in position order) are dropped before
    their object is looked up: listed with different meanings, an unknown
    label (`label_ids` None: targets without a label), outside the source.
    None if kept."""
    key, uri = group[0].key, group[0].uri
    if len(group) > 1 and len({(r.label, r.split, _meaning(r.targets)) for r in group}) > 1:
        if all(row.where is not None for row in group):  # a COCO or VOC file's entries
            listed_at = ", ".join(str(row.where) for row in group)
        else:
            listed_at = "lines " + ", ".join(str(row.position) for row in group)
        message = f"listed {len(group)} times with different {_differing(group)} ({listed_at})"
        return DroppedFile(key, "list", "duplicate_key", uri, message), [
            "dropped",
            "duplicate_key",
            key,
        ]
    label = group[0].label
    if label_ids is not None and label not in label_ids:
        message = f"label {label!r} is not in source.classes"
        return DroppedFile(key, "list", "unknown_label", uri, message), [
            "dropped",
            "unknown_label",
            [key, label],
        ]
    outside = confinement.problem(uri)
    if outside:
        return outside_row(key, uri, outside)
    return None


def outside_row(key: str, uri: str, problem: str) -> DroppedRow:
    return DroppedFile(key, "list", "outside_source", uri, problem), [
        "dropped",
        "outside_source",
        key,
    ]


def missing_row(
    key: str, uri: str, path: str, error: Exception, name: str | None = None
) -> DroppedRow:
    """A row whose file `error` says is not found; `name`: the listing file's
    name in the message (None: `path`'s base name)."""
    name = name or posixpath.basename(path.rstrip("/"))
    message = f"listed in {name} but not found ({first_line(error)})"
    return DroppedFile(key, "list", "missing", uri, message), ["dropped", "missing", key]


def object_not_found(uri: str) -> FileNotFoundError:
    """The error of an object no listing or metadata request found."""
    return FileNotFoundError(errno.ENOENT, "No such object", uri)


def _list_rows(
    rows: Iterator[Row | _BadRow],
    path: str,
    base: str,
    classes: list[str] | None,
    from_source: bool,
    confinement: _Confinement,
    targets: TargetsConfig,
    file_of: Callable[[str], str] | None = None,
) -> Listing:
    """The listing of a source's rows (a manifest's, or a COCO or VOC file's).

    Args:
      rows: The rows, parsed, in the source's order.
      path: The file the rows come from (named in dropped rows, but for rows
        that name their own file, `Row.uri`).
      base: The folder the rows' image paths are relative to.
      classes: The class list (``source.classes``, or a COCO file's
        categories); None: every class the rows name.
      file_of: The name of a row's file from its ``where`` (several files
        list the rows: a coco source's parts); None: `path`'s base name.
    """
    boxes = box_convention.BoxEvidence() if targets.boxes is not None else None
    with ListingWriter() as writer:
        statuses = _RowStatuses(writer, confinement)

        def drop(dropped: DroppedRow) -> None:
            writer.drop(*dropped)

        ignored_split = None  # a row's split, not asked for
        for row in rows:
            problem = row_problem(row, path, from_source)
            if problem:
                drop(problem)
                continue
            if not isinstance(row, Row):
                continue  # `row_problem` drops every bad row
            if ignored_split is None and row.split and not from_source:
                ignored_split = row
            candidate = row_candidate(row, base, from_source)
            statuses.note(candidate.uri)
            if row.targets is not None:
                if boxes is not None:  # every listed row's, whether its image is there or not
                    listed = target_rows.convention_boxes(row.targets)
                    boxes = boxes.merged(box_convention.count_listed(listed))
                writer.add_class_names(target_rows.class_names(row.targets))
                candidate = dataclasses.replace(
                    candidate, targets=target_rows.canonical(row.targets)
                )
                for _, mask in target_rows.mask_uris(row.targets):
                    statuses.note(mask)
            writer.add_candidate(candidate)
        if ignored_split is not None:
            where = ignored_split.where or f"{posixpath.basename(path)}:{ignored_split.line}"
            logger.warning(
                "%s: rows name a split (%s: %r) that the build does not use: the splits come "
                "from splits.fractions; splits.from_source: true takes the source's",
                path,
                where,
                ignored_split.split,
            )

        class_names = list(classes) if classes else writer.candidate_labels()
        label_ids = {label: i for i, label in enumerate(class_names)}
        statuses.resolve_objects()
        for group in writer.candidates():
            key, uri = group[0].key, group[0].uri
            problem = group_problem(
                group, None if targets.label is None else label_ids, confinement
            )
            if problem:
                drop(problem)
                continue
            label, split, row_targets = group[0].label, group[0].split, group[0].targets
            label_id = -1 if targets.label is None else label_ids[label]
            outside, mask_stamp = _mask_files(row_targets, confinement, statuses)
            if outside:
                drop(outside_row(key, uri, outside))
                continue
            try:
                size, mtime, problem_text, inode_ctime = statuses.status(uri)
            except Exception as e:  # OSError locally, FileNotFoundError or BeamIOError remotely
                listed_in = None
                if file_of is not None and group[0].where is not None:
                    listed_in = file_of(group[0].where)
                drop(missing_row(key, uri, path, e, listed_in))
                continue
            if problem_text:
                writer.drop(
                    DroppedFile(key, "list", "unreadable", uri, problem_text),
                    ["dropped", "unreadable", key],
                )
                continue
            writer.add_file(
                SourceFile(
                    key=key,
                    uri=uri,
                    label=label_id,
                    split=split,
                    size=size,
                    mtime=mtime,
                    targets=row_targets,
                    mask_stamp=mask_stamp,
                    inode_ctime=inode_ctime,
                )
            )
        return writer.finish(class_names, from_source, boxes)


# A folder whose rows name at most this many objects directly has them asked
# for one by one (a metadata request each); one naming more is listed. A
# listing page holds 1,000 objects and costs about one metadata request, but a
# folder's pages come one after another while requests run 8 at a time. At
# 1,000 the worst case of each choice is about 100 times the other's cost:
# 1,000 objects that fill their folder take 125 request times asked for, 1
# page listed; 1,001 objects in a folder of 10M take 10,000 pages listed, 125
# request times asked for.
_PER_ROW_MAX_OBJECTS = 1000


class _RowStatuses:
    """The size, time and problem of each file a source's rows name: a local
    path by one ``os.stat``, an object by a listing of its folder or by its
    own metadata request.

    An object store answers a listing of 1,000 objects in about the time of
    one object's metadata request, so a folder whose rows name many objects
    is listed once rather than asked for object by object (10M rows: 10M
    requests, a day one after another). But a listing is of the whole folder:
    a few rows out of a folder of millions are asked for one by one instead
    (`_PER_ROW_MAX_OBJECTS`). The objects the rows name are recorded under
    their folders as the rows are read (`note`); `resolve_objects` decides per
    folder, lists or asks (all on `storage.walk_prefixes`' threads), and puts
    the objects found into the listing's database, where `status` looks each
    row up.
    """

    def __init__(self, writer: ListingWriter, confinement: _Confinement):
        self._writer = writer
        self._confinement = confinement

    def note(self, uri: str) -> None:
        """Records a URI a row names under its folder (a local path needs none)."""
        if is_remote(uri) and not uri.endswith("/"):
            self._writer.add_named_object(uri)

    def resolve_objects(self) -> None:
        """Lists or asks for every recorded object (see the class docstring)."""
        listed, asked = self._plan()
        if not (listed or asked):
            return
        count = 0
        for metadata in storage.walk_prefixes((folder + "/" for folder in listed), asked):
            self._writer.add_object(
                metadata.path,
                int(metadata.size_in_bytes),
                float(metadata.last_updated_in_seconds),
            )
            count += 1
        logger.info(
            "found %d objects the rows name: %d folders listed, %d objects asked for one by one",
            count,
            len(listed),
            len(asked),
        )

    def _plan(self) -> tuple[list[str], list[str]]:
        """The folders to list and the objects to ask for one by one.

        A folder naming more than `_PER_ROW_MAX_OBJECTS` objects is listed,
        and its listing names every object below it (a prefix's listing is
        recursive), so the folders below it are neither listed nor asked for,
        whatever their counts. A folder naming fewer has its own objects
        asked for; a folder below it is decided on its own count. Folders
        outside the source's confinement, whose rows are dropped unread, are
        neither (and do not hide a folder below them that is inside).

        The objects to ask for are held in memory: at most
        `_PER_ROW_MAX_OBJECTS` per folder.
        """
        listed, asked_folders = lookup_plan(self._writer.named_object_folders(), self._confinement)
        asked = [uri for folder in asked_folders for uri in self._writer.named_objects_in(folder)]
        return listed, asked

    def status(self, uri: str) -> storage.FileStatus:
        """Size, modification time, why the path cannot be read as an image
        file (None if it can), and a local file's status-change identity;
        see `storage.Store.file_status`.

        Raises:
          OSError, BeamIOError: the path does not exist (or cannot be stat'ed).
        """
        if not is_remote(uri):
            # Confinement has just lstat'ed the row's image (`group_problem`).
            known = self._confinement.real_paths.stat_of(uri)
            return _file_status(uri) if known is None else storage.local_file_status(uri, known)
        found = self._writer.object_status(uri)
        if found is None:
            raise object_not_found(uri)
        return storage.FileStatus(found[0], found[1], None)  # plain objects only


def lookup_plan(
    folder_counts: list[tuple[str, int]], confinement: _Confinement
) -> tuple[list[str], list[str]]:
    """The folders to list and the folders whose objects are asked for one by
    one, from the number of objects the rows name directly in each folder,
    sorted so that the folders below a folder come right after it
    (`ListingWriter.named_object_folders`); see `_RowStatuses._plan`."""
    listed: list[str] = []
    asked: list[str] = []
    for folder, count in folder_counts:
        if confinement.problem(folder) is not None:
            continue
        if listed and folder.startswith(listed[-1] + "/"):
            continue  # the folders below a folder come right after it
        if count > _PER_ROW_MAX_OBJECTS:
            listed.append(folder)
        else:
            asked.append(folder)
    return listed, asked


def _mask_files(
    row_targets: str | None, confinement: _Confinement, statuses: _RowStatuses
) -> tuple[str | None, str | None]:
    """The mask files a row names: why one may not be read (or None), and
    their stamps (None: no mask file): ``[size, mtime]`` of each, and of a
    local one its status-change identity too (``[size, mtime,
    inode_ctime]``: `storage.inode_ctime`).

    A mask file that is missing is not dropped here: the job reports it as
    a bad annotation (``missing_mask``), under ``targets.bad_objects``.
    """
    if row_targets is None:
        return None, None
    stamps = []
    for field, uri in target_rows.mask_uris(json.loads(row_targets)):
        problem = confinement.problem(uri)
        if problem:
            return f"{field}: {problem}", None
        try:
            size, mtime, _, inode_ctime = statuses.status(uri)
        except Exception:  # missing: the job says so
            size, mtime, inode_ctime = -1, 0.0, None
        stamps.append([size, mtime] if inode_ctime is None else [size, mtime, inode_ctime])
    return None, (json.dumps(stamps) if stamps else None)


def _manifest_lines(path: str) -> Iterator[str | LongLine]:
    """The manifest's text line by line, read as it is used (`text_lines`):
    UTF-8 (a BOM dropped), lines ending at '\n' only (as `io.StringIO` splits
    them), a line longer than `text_lines.MAX_LINE_BYTES` as a `LongLine`. A
    compressed manifest (``.gz``, ...) is decompressed a piece at a time
    (`compressed.open_decompressed`), so the cap holds for it too.

    Raises:
      ManifestError: the file cannot be read or is not UTF-8.
    """
    try:
        f = compressed.open_decompressed(path)
    except Exception as e:  # any filesystem's I/O error
        raise ManifestError(f"cannot read manifest {path}: {first_line(e)}") from None
    with f:
        lines = text_lines.text_lines(f.read, text_lines.MAX_LINE_BYTES)
        number = 0  # lines read, each ended by a '\n'
        while True:
            try:
                line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                # The file's encoding, not one row's mistake: every row of a
                # file saved as Latin-1 would be a bad row. The line, so that
                # a stray byte in a large export can be found.
                byte = e.object[e.start] if e.start < len(e.object) else None
                shown = f"byte {byte:#04x}: " if byte is not None else ""
                raise ManifestError(
                    f"{path}: line {number + 1} is not UTF-8 text ({shown}{e.reason}): "
                    f"save the manifest as UTF-8"
                ) from None
            except Exception as e:  # any filesystem's I/O error
                raise ManifestError(f"cannot read manifest {path}: {first_line(e)}") from None
            number += 1
            yield line


@dataclasses.dataclass(frozen=True)
class _CsvRecord:
    """One record of a CSV file as `csv.reader` reads it (a quoted field may
    span lines), or what kept it from being read."""

    first_line: int
    last_line: int
    fields: list[str]
    error: str | None = None  # the csv module's message; `fields` is then []
    text: str = ""  # with `error` or `long_line`: the record's lines, for its row text
    # The first of its lines over the cap, and its number; `fields` is then [].
    long_line: tuple[int, LongLine] | None = None
    # With `error`: the line a quoted field starting on this record's one line
    # ran on to before the csv module refused it (0: it did not run on). The
    # lines after this one were read again as records of their own.
    runs_on: int = 0

    def bad_row(self, text: str, problem: str, reason: str = "bad_row") -> _BadRow:
        """The record as a bad row at its first line. A record over several
        lines says so: a quoted field that runs on, mostly an unterminated
        quote, swallows the lines after it, and its problem shows where
        the swallowed text ends."""
        if self.runs_on:
            problem += (
                f" at line {self.runs_on}, in a quoted field that starts on this line: an "
                f"unterminated quote? (lines {self.first_line + 1} to {self.runs_on} are read "
                f"as rows of their own)"
            )
        elif self.last_line > self.first_line:
            lines = self.last_line - self.first_line + 1
            problem += (
                f" (a quoted field runs on over {lines} lines, to line {self.last_line}: "
                f"an unterminated quote?)"
            )
        return _BadRow(self.first_line, text, problem, reason)

    def unread(self) -> _BadRow | None:
        """The record as a bad row if it could not be read: a line over the
        cap (``line_too_long``), or the csv module refused it."""
        if self.long_line is not None:
            number, long_line = self.long_line
            where = "" if number == self.first_line else f"line {number}: "
            return self.bad_row(self.text, where + _skipped(long_line), "line_too_long")
        if self.error is not None:
            return self.bad_row(self.text, f"not valid CSV: {self.error}")
        return None


def _skipped(long_line: LongLine) -> str:
    """The message of a manifest line over the cap (``line_too_long``)."""
    return f"{long_line.problem} (one row per line): skipped unread"


def _csv_records(lines: Iterator[str | LongLine]) -> Iterator[_CsvRecord]:
    """The CSV records of `lines`, with their line numbers.

    A record the csv module refuses (a field beyond its field size limit of
    128 KiB, a stray line break inside an unquoted field, text after a
    quoted field's closing quote) comes back with its error, and reading
    goes on at the next line: the reader starts each record afresh, after
    the lines it has already taken. A refused record of several lines is a
    quoted field that ran on, nearly always from an unterminated quote:
    left to run, it swallows the rows after it until a quote closes it and
    breaks CSV's rules (``"x"y``) or the file ends (the reader is strict,
    so neither passes as a field; a record of one line that only the strict
    reading refuses, ``"a" ,b``, is read leniently, as the csv module reads
    it by default). Its first line comes back with the error
    (`_CsvRecord.runs_on`) and the lines after it are read again, as the
    rows they are. A line over the cap (`LongLine`) ends the record it is
    in (`_CsvRecord.long_line`), whose quotes it may have closed, and a new
    reader starts after it.
    """
    lines = iter(lines)
    again: list[str] = []  # lines to read again, last first
    taken: list[str] = []
    number = 0  # of the lines taken
    long_lines: list[tuple[int, LongLine]] = []  # the one that ended the record, with its number

    def taking() -> Iterator[str]:
        nonlocal number
        while True:
            line = again.pop() if again else next(lines, None)
            if line is None:
                return
            number += 1
            if isinstance(line, LongLine):
                long_lines.append((number, line))
                taken.append(line.text + "\n")
                return  # the end of this reader's input
            taken.append(line)
            yield line

    reader = csv.reader(taking(), strict=True)
    last_line = 0
    while True:
        taken.clear()
        long_lines.clear()
        error = None
        try:
            fields = next(reader)
        except StopIteration:
            if not long_lines:
                return
        except csv.Error as e:
            error = str(e)
        if error is not None and not long_lines and len(taken) == 1:
            # Refused by the strict reading on its one line (``"a" ,b``, text
            # after a closing quote): read as the csv module reads it leniently,
            # as before; nothing ran on.
            try:
                fields, error = next(csv.reader(taken), []), None
            except csv.Error as e:
                error = str(e)
        if error is None and not long_lines:
            yield _CsvRecord(last_line + 1, number, fields)
        elif not long_lines and len(taken) > 1:
            spaced = _spaced_close(taken)
            if spaced is not None:
                yield _CsvRecord(last_line + 1, number, spaced)
            else:  # a quoted field ran on, then was refused
                ran_to = number
                number = last_line + 1
                again.extend(reversed(taken[1:]))
                text = taken[0].rstrip("\r\n")
                yield _CsvRecord(number, number, [], error, text, runs_on=ran_to)
                reader = csv.reader(taking(), strict=True)
        else:
            text = "".join(taken).rstrip("\r\n")
            long_line = long_lines[0] if long_lines else None
            yield _CsvRecord(last_line + 1, number, [], error, text, long_line)
        if long_lines:
            reader = csv.reader(taking(), strict=True)
        last_line = number


def _spaced_close(lines: list[str]) -> list[str] | None:
    """The fields of a record of several lines that the strict reading refused
    only for spaces or tabs after a closing quote (``"two\nlines" ,x``), read
    leniently as the csv module reads them by default; None when it refused
    something else (a quote that ran on)."""
    trimmed = re.sub(r'"[ \t]+(?=,|\r?\n|$)', '"', "".join(lines)).splitlines(keepends=True)
    try:
        if len(list(csv.reader(trimmed, strict=True))) != 1:
            return None
    except csv.Error:
        return None
    return next(csv.reader(lines), [])


def _csv_header(records: Iterator[_CsvRecord], name: str) -> list[str] | None:
    """The header's fields, or None for an empty file.

    Raises:
      ManifestError: the header is not valid CSV, or longer than a line may be.
    """
    header = next(records, None)
    if header is None:
        return None
    if header.long_line is not None:
        number, long_line = header.long_line
        raise ManifestError(f"{name}: line {number}: {long_line.problem}; not a CSV header")
    if header.error is not None:
        raise ManifestError(f"{name}: line {header.first_line}: not valid CSV: {header.error}")
    return header.fields


def _csv_rows(
    lines: Iterator[str | LongLine], name: str, targets: TargetsConfig | None = None
) -> Iterator[Row | _BadRow]:
    records = _csv_records(lines)
    header = _csv_header(records, name)
    if header is None:
        return
    columns = [c.strip().lower() for c in header]
    if targets is not None:
        return (yield from _csv_target_rows(records, header, columns, name, targets))
    if "path" not in columns or "label" not in columns:
        raise ManifestError(
            f"{name}: the first line must be a header naming the columns "
            f"path,label[,split]; got {','.join(header)!r}"
        )
    _check_read_once(columns, ("path", "label", "split"), header, name)
    index = {c: columns.index(c) for c in ("path", "label", "split") if c in columns}
    no_split = () if "split" in index else tuple(c for c in header if c.strip())
    for record in _full_records(records, len(columns)):
        if isinstance(record, _BadRow):
            yield record
            continue
        fields, line = record.fields, record.first_line
        text_line = ",".join(fields)
        path = fields[index["path"]].strip()
        label = fields[index["label"]].strip()
        split = fields[index["split"]].strip() if "split" in index else None
        if not path or not label:
            yield record.bad_row(text_line, "empty path or label")
            continue
        try:
            label = target_rows.class_name(label, "label")
        except AnnotationError as e:
            yield record.bad_row(text_line, str(e))
            continue
        yield Row(line, text_line, path, label, split or None, columns=no_split)


def _check_read_once(
    names: Sequence[str], read: Sequence[str], header: Sequence[str], name: str
) -> None:
    """Refuses a header that names a column kiln reads twice (``path,label,
    Label``): which one holds the labels is a guess.

    Raises:
      ManifestError: naming the column and where it is.
    """
    for column in read:
        places = [i + 1 for i, c in enumerate(names) if c == column]
        if len(places) > 1:
            raise ManifestError(
                f"{name}: the header names the column {column} {len(places)} times (columns "
                f"{', '.join(map(str, places))} of {','.join(header)!r}); keep one"
            )


def _full_records(records: Iterator[_CsvRecord], columns: int) -> Iterator[_CsvRecord | _BadRow]:
    """The records with a field per column; a record that could not be read
    or has another number of fields as a bad row; blank records skipped."""
    for record in records:
        unread = record.unread()
        if unread is not None:
            yield unread
            continue
        fields = record.fields
        if not fields or all(not f.strip() for f in fields):
            continue
        if len(fields) != columns:
            text_line = ",".join(fields)
            yield record.bad_row(text_line, f"expected {columns} fields, got {len(fields)}")
            continue
        yield record


def _csv_target_rows(
    records: Iterator[_CsvRecord],
    header: list[str],
    columns: list[str],
    name: str,
    targets: TargetsConfig,
) -> Iterator[Row | _BadRow]:
    """CSV rows with targets: label(s) and extra columns by name (see `target_rows`)."""
    # Extra columns keep the case of their declared names; the rest are lower case.
    names = [c if c in targets.extra else c.lower() for c in (h.strip() for h in header)]
    needed = ["path", *target_rows.csv_columns(targets)]
    missing = [c for c in needed if c not in names]
    if missing:
        raise ManifestError(
            f"{name}: the header must name the columns {','.join(needed)}[,split] "
            f"(targets:); missing {','.join(missing)}, got {','.join(header)!r}"
        )
    _check_read_once(names, [*needed, "split"], header, name)
    index = {c: names.index(c) for c in [*needed, "split"] if c in names}
    no_split = () if "split" in index else tuple(c for c in header if c.strip())
    for record in _full_records(records, len(columns)):
        if isinstance(record, _BadRow):
            yield record
            continue
        fields, line = record.fields, record.first_line
        text_line = ",".join(fields)
        cells = {c: fields[i] for c, i in index.items()}
        path = cells["path"].strip()
        label = cells["label"].strip() if targets.label is not None else ""
        if not path or (targets.label is not None and not label):
            yield record.bad_row(text_line, "empty path or label")
            continue
        try:
            if targets.label is not None:
                label = target_rows.class_name(label, "label")
            row_targets = target_rows.csv_row_targets(cells, targets)
        except AnnotationError as e:
            yield record.bad_row(text_line, str(e))
            continue
        split = cells.get("split", "").strip() or None
        yield Row(line, text_line, path, label, split, row_targets, columns=no_split)


def _jsonl_rows(
    lines: Iterator[str | LongLine],
    targets: TargetsConfig | None = None,
    resolve=lambda path: path,
) -> Iterator[Row | _BadRow]:
    for line, raw in _logical_lines(lines):
        if isinstance(raw, LongLine):
            yield _BadRow(line, raw.text, _skipped(raw), "line_too_long")
            continue
        if not raw.strip():
            continue
        try:
            row = json.loads(raw, object_pairs_hook=_object_of_distinct_keys)
        except json.JSONDecodeError as e:
            yield _BadRow(line, raw, f"not valid JSON: {e.msg}")
            continue
        except _DuplicateKey as e:
            yield _BadRow(line, raw, f"duplicate key {_json_text(e.key)} in a JSON object")
            continue
        except RecursionError:
            yield _BadRow(line, raw, "nested more deeply than Python reads")
            continue
        except ValueError as e:  # an integer of more than 4300 digits
            yield _BadRow(line, raw, f"holds a number too long to read ({first_line(e, 60)})")
            continue
        if not isinstance(row, dict):
            yield _BadRow(line, raw, "expected a JSON object")
            continue
        path, split = row.get("path"), row.get("split")
        if not isinstance(path, str) or not path:
            where = target_rows.misspelt("path", row) if "path" not in row else ""
            yield _BadRow(line, raw, f"'path' must be a non-empty string{where}")
            continue
        if targets is not None and targets.label is None:
            label = ""  # the dataset has no image class
        elif "label" not in row:
            where = target_rows.misspelt("label", row)
            yield _BadRow(line, raw, f"'label' is missing: expected a class name{where}")
            continue
        else:
            try:
                label = target_rows.class_name(row["label"], "'label'")
            except AnnotationError as e:
                yield _BadRow(line, raw, str(e))
                continue
        if split is not None and not isinstance(split, str):
            yield _BadRow(line, raw, "'split' must be a string")
            continue
        row_targets = None
        if targets is not None:
            try:
                row_targets = target_rows.row_targets(row, targets, resolve)
            except AnnotationError as e:
                yield _BadRow(line, raw, str(e))
                continue
        columns = () if split else tuple(key for key in row if isinstance(key, str))
        yield Row(line, raw, path, label, split or None, row_targets, columns=columns)


def _logical_lines(lines: Iterator[str | LongLine]) -> Iterator[tuple[int, str | LongLine]]:
    """The lines of a JSONL manifest with their numbers. A line ends at
    ``\n``, ``\r\n`` or ``\r`` (as Python's text files and the csv module
    read lines), never inside a JSON string: U+2028, U+2029 and U+0085,
    which JSON allows there unescaped (``json.dumps(..., ensure_ascii=False)``
    writes them so), are text. Line numbers count the same breaks, in a line
    over the cap as well (`LongLine.lines`)."""
    number = 1
    for text in lines:
        if isinstance(text, LongLine):
            yield number, text
            number += text.lines
            continue
        body = text[:-1] if text.endswith("\n") else text
        if body.endswith("\r"):
            body = body[:-1]
        for part in body.split("\r"):
            yield number, part
            number += 1


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _object_of_distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: `json` would keep the last of
    two values silently (``{"label": "dog", "label": "cat"}`` is a cat), as
    YAML would, and the config loader refuses that too.

    Raises:
      _DuplicateKey: naming the first key given twice.
    """
    row = dict(pairs)
    if len(row) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return row


def _json_text(value: str) -> str:
    """A string as JSON writes it, for messages: a lone surrogate as ``\\ud800``."""
    return json.dumps(value)


def _manifest_key(path: str) -> str:
    if is_remote(path) or path.startswith("/"):
        return path
    return posixpath.normpath(path.replace("\\", "/"))


def _resolve(path: str, base: str) -> str:
    if is_remote(path) or path.startswith("/"):
        return path
    relative = posixpath.normpath(path.replace("\\", "/"))
    if is_remote(base):
        return base + "/" + relative
    return os.path.normpath(os.path.join(base, relative))


def _local_dirname(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))
