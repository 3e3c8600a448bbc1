"""Incremental builds: reuse a published version's records instead of decoding their images again.

A nightly rebuild of a dataset where a few percent of the files changed
should cost a few percent of a full build. When a published version (the
*base*: LATEST, or ``kiln build --base VERSION``) was built with the same
processing, a record whose source file has the same bytes (sha256) and the
same listing inputs (key, class id: `record_index.inputs_fingerprint`) as
in the base is copied from the base's shards without decoding; only new and
changed files are decoded, transformed and encoded, and files gone from the
source are gone from the new version. A record whose listing inputs differ
only by class ids (a class added or removed shifted them) is copied so
too, its ids rewritten in the copy by the shard writer, not decoded
(`relabel`); the record of a file that moved to another key (renamed,
moved to another folder or class, listed under another path) is read from
the base's shard and rewritten with its key (`moves`).
The result is byte-identical to a from-scratch build of the same inputs
and config, kiln.json included: the records are the same bytes, the shards
are cut and ordered by the same rules, and the statistics are merged from
the exact per-record sums in the base's record index (`record_index`).

**The reuse key** of a record is (sha256 of the image file, listing
inputs); with ``targets:`` the listing inputs also hold the image's
annotations as listed (canonical JSON: boxes, classes, fields, keypoints,
polygons/RLE, labels, extras), every mask file they name by the sha256 of
its bytes (read, not decoded, unless its stamp is the base's: see "File
stamps"; a mask edited in place is noticed, a mask moved with its image is
not a change), the class id of
every class name they use, and with a semantic mask the class list's length
(`targets.TargetCodec.reuse_key`); the base's
index row carries what the object statistics count of the record (classes,
object sizes, dropped objects), so per-class object counts and size
histograms merge exactly too. Which base was used is provenance of
the run, not of the dataset: it is in the build's summary and ``--report``
(`BuildResult.incremental`), never in kiln.json.

**Processing fingerprint** (`processing_fingerprint`): what decides a
record's bytes given its source file: the ``image``, ``transforms``,
``encoding`` (and ``targets``) sections of the resolved config, the plugins
named and their modules' files, the record schema (its layout, not the
features' descriptions), `kiln.FORMAT_VERSION`, `PROCESSING_VERSION` and
OpenCV's version (its codecs and resizers write the pixels). It leaves out
where the files are (``source``), the splits (a reused record may move to
another split: its bytes do not change), sharding, augmentation and error
handling. kiln.json records it (``processing``).

A base is not used, and the build says why in its summary, when
(`choose_base`): ``--full`` asks for a from-scratch build; there is no
published version; its kiln.json is missing or damaged; it records no
record index or processing fingerprint (built by an older kiln); its
processing version or fingerprint differs. Inside the job each base file is
checked against the sha256 kiln.json records (`VerifyBaseFiles`): the
records of a shard that differs are processed from their source files
instead, and a damaged index means no record is reused. Plugin transforms
are part of the fingerprint by name, parameters and the sha256 of the
named modules' files (`plugin_sources`): an edit there makes a new version
built from scratch. Code they import from elsewhere is not: after changing
it, change a parameter (or its default); ``--full`` does not help, the
unchanged stamp finds the published version up to date.

**File stamps**: a file is not read to learn its sha256 when its key and
stamp are those the base listed (the listing the base was built from is
kept in ``<output>/<name>/.file-stamps/<version>/``,
`publish.DatasetRoot.file_stamps`): its sha256 is its base row's, trusted
as the launcher's up-to-date stamp trusts the same stamps (`JoinBase`
joins the listing by key with the files and rows; ``--rehash`` leaves it
out, and a base kept without one has every file read). It is read after
all if no base record serves it (its listing inputs changed), and so is a
file whose modification time is no older than the base build's start
(`RACY_SECONDS`), and a file (or mask file) that the base's job, reading
it, found not as its listing stamped it: changed between the listing and
the read (kept beside the listing, `publish.STAMP_DISAGREEMENTS_FILE`;
`JoinBase` leaves those stamps out, counted ``base_stamps_disagreed``; a
record of them that cannot be read leaves out every stamp:
`stamp_disagreements`).

A stamp is what the listing learns without reading the file: its size
and modification time and, for a local file, as git's index keeps them,
its inode number and status-change time (ctime, in nanoseconds:
``inode_ctime``, `storage.inode_ctime`), compared for equality only. Size
and modification time alone miss two same-size files swapped by renames
(``mv a t; mv b a; mv t b``) and a file replaced by a same-size copy with
its time restored (``cp -p``, ``tar x``, ``rsync -a``, ``touch -r``):
either gives the key another inode, or the inode a new ctime, which no
call can set back. A file whose identity differs from the one the base
listed is read and hashed; its record is still reused when its sha256 is
unchanged, so a ``chmod`` or a ``touch -r`` to the same time costs one
read, never a decode. On an object store (gs://, s3://) a stamp is the
object's size and update time, which every write changes. A base whose
listing lines predate the identity (written by an older kiln) is not
trusted for local files: each is read once, and the new build's listing,
kept for the next, has it. (The racy rule stays on the modification time:
a file replaced twice within one tick of the clock that dates ctime, the
first time just before the base build listed it, with its modification
time restored both times, is the one change left to ``--rehash``.)

Mask files are trusted the same way. Their sha256 is in the reuse key and
the version, so a build needs it for every image; the base's record index
keeps it (`IndexRow.masks`, per mask file the targets name), and the
listing keeps each mask file's stamp (size, modification time, and a
local one's ``inode_ctime``) beside the targets that name it
(``mask_stamp``: `listing.SourceFile`). `JoinBase` hands each file with a
base row that keeps mask sha256s the stamps the base listed for its masks
(`BASE_MASK_STAMPS`, by path, those too recent left out); a mask file
listed now with the same path and stamp is not read, its sha256 the row's
(`base_masks`, `targets.MaskFiles.read`). If the record is then processed
after all, the masks are read then (the pixels need them), their sha256 as
read. A base whose rows keep no mask sha256s (built by a kiln before
them) or whose listing is not kept has every mask read; its reused
records' index lines are written with the sha256s, as a build from
scratch writes them.

In the job (`job.construct`), with a base::

    base files -> VerifyBaseFiles ─────────────────────┐ (side input: problems, frames)
    listed files ─┐                                    v
    base index ───┤                                    │
    base listing ─┴─> JoinBase (by key) ─┬─> ProcessImages ─┬─> runs of new records
                                         │     ^            ├─> reused records (ReusedRun)
                                         │     │ (digests)  └─> deferred ─┐
                                         └─> orphans ───────> JoinMoved (by sha256)
                                                                          v
                                                 ProcessMovedImages ─> runs of moved records
    all runs -> WriteShards (copies the reused records' frames from the base shards)

The orphans are the base's rows whose key is no longer listed; a file whose
key found no reusable row but whose sha256 is an orphan's (by its first 8
bytes: the side input, one packed bytes value, `PackDigestsFn`) is
deferred, joined with the orphans of its sha256, and its record rewritten
from the matching one (`moves`).

An uncompressed base's record to rewrite (moved, or relabelled where an
id changes its varint width: `relabel`) is read where its frame is
(`BaseShard`: a seek and a read). One record of a gzip-compressed base
cannot be read without inflating its shard from the start, so there the
image steps hand on each file whose record would be rewritten so with
where that record is, the files are grouped by base shard, and each such
shard is inflated once, its wanted records read in ascending position
(`images.RewriteFromBaseShards`, with the same `BaseShard`): one pass per
shard, whatever the number of records wanted from it.

The check that hashes each base shard also finds where each of its records'
TFRecord frames starts (`_FrameScanner`), so the image step hands a reused
record on as a byte range of a base shard (`sharding.ReusedRun`), and the
shard writer copies those bytes straight into the new shard (checking each
frame's length and CRCs) next to the new records from the sorted runs: a
reused record is read once, never decoded, re-framed or written to a run.
From a gzip base the shard writer streams them (`open_base_shard`, as
`BaseShard` reads): one forward inflate of each base shard per new shard
that copies from it, holding the records copied, never the base shard
(`sharding.read_reused`).
Sharding, duplicates and the index are decided by the same steps as in a
full build. Everything is read through Beam's FileSystems inside the job:
the launcher reads only the base's kiln.json. The frames reach every
image-step worker as a side input, 8 bytes per base record, and so do the
orphans' digests, 8 bytes per orphan.
"""

from __future__ import annotations

import array
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import logging
import math
import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam
import cv2
from apache_beam.io.filesystem import CompressedFile, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import kiln
from kiln.pipeline import (
    moves,
    record_index,
    stamp_disagreements,
    storage,
    target_rows,
    tfrecord,
    versioning,
)
from kiln.pipeline.listing import FILES_PER_LINE
from kiln.registry import import_plugin
from kiln.schemas import INDEX_FILENAME, RECORD, DatasetInfo

logger = logging.getLogger(__name__)

# Bump whenever a kernel's output can change for the same input and config
# (decoding, a transform, encoding, pixel statistics, targets): records of
# versions built before are then never reused, and the same inputs get
# another version name (it hashes the processing fingerprint).
# 2: masks are written as PNG without a row filter (decoding speed).
PROCESSING_VERSION = 2

# Bump when what the job counts about a semantic mask changes (the record
# index keeps each record's counted classes): only datasets with a `mask`
# target then get another fingerprint, and rebuild once from scratch.
# 1: an image counts in class_counts for the classes its mask shows.
MASK_COUNTS_VERSION = 1

# Bump when how boxes follow instance masks changes: only datasets with an
# `instance_masks` target then get another fingerprint and rebuild once.
# 1: a box that a transform cuts (clips) or turns is tightened to its moved
#    instance mask's pixels (`kiln.transforms.targets.tightened`).
INSTANCE_BOXES_VERSION = 1

# Bump when how a COCO file's keypoints are read changes: only datasets
# with a COCO source and a `keypoints` target then get another fingerprint
# (so another version name and stamp: an unchanged source is built again)
# and rebuild once from scratch.
# 1: labelled COCO keypoints are pixel indices, moved to their pixel's
#    centre (+ 0.5: `kiln.pipeline.coco`).
COCO_KEYPOINTS_VERSION = 1

# Bump when how the masks of a JPEG decoded reduced (`image.jpeg_scaled_decode`)
# follow it changes: only datasets with the option and a `mask` or
# `instance_masks` target then get another fingerprint and rebuild once.
# 1: turned upright pixel for pixel before the one resampling, as the full
#    decode's are (`decode_scale.apply_reduced`): the masks of photos with a
#    mirroring EXIF orientation no longer differ from the full path's where
#    an output pixel's centre falls between two stored pixels.
REDUCED_MASKS_VERSION = 1

# Bump when how `resize` and `letterbox` pick pixels with `interpolation:
# nearest` changes: only datasets whose transforms use it then get another
# fingerprint and rebuild once.
# 1: the image copies the input pixel its masks copy (the masks' index
#    arithmetic, `geometry.resize_indices`), not OpenCV's INTER_NEAREST_EXACT,
#    which picked a neighbour of it at some rows and columns.
NEAREST_RESIZE_VERSION = 1

# Bump when how a user transform's declared geometry (`CoordinateMap`, built
# in the plugin's code) moves targets changes: only datasets with plugins
# and targets that a transform moves then get another fingerprint and
# rebuild once.
# 1: `CoordinateMap.from_pixel_index_matrix` shifts by ``0.5 - 0.5 * (xx +
#    xy)``: it shifted by the opposite, so the targets of an OpenCV mirror or
#    half turn landed 2 pixels from their pixels (and of a 90-degree turn 2
#    pixels along one axis; of other angles up to 1.4).
USER_GEOMETRY_VERSION = 1

# Bump when how keypoints follow a mirror image changes: only datasets with
# keypoints and flip pairs then get another fingerprint and rebuild once.
# 1: a map that mirrors (an EXIF orientation of a photo annotated in its
#    stored frame, a user transform's flip) swaps each flip pair's keypoints,
#    as the reader's flips do.
MIRRORED_KEYPOINTS_VERSION = 1

# Config sections that decide a record's bytes (see the module docstring).
_PROCESSING_SECTIONS = ("image", "transforms", "encoding", "targets", "plugins")

_CHUNK_BYTES = 1 << 20


def processing_fingerprint(config: Mapping[str, Any]) -> str:
    """The processing fingerprint of a resolved config (`BuildSpec.to_json`).

    A function of how records are made, not of where the files are: the
    source's location, the splits, sharding, augmentation and error
    handling are left out (see the module docstring).
    """
    data = {
        "processing_version": PROCESSING_VERSION,
        "format_version": kiln.FORMAT_VERSION,
        "opencv": cv2.__version__,
        "schema": RECORD.layout_json(),
        "config": {name: config.get(name) for name in _PROCESSING_SECTIONS},
    }
    if _has_mask(config):
        data["mask_counts_version"] = MASK_COUNTS_VERSION
    if _has_instance_masks(config):
        data["instance_boxes_version"] = INSTANCE_BOXES_VERSION
    if _has_coco_keypoints(config):
        data["coco_keypoints_version"] = COCO_KEYPOINTS_VERSION
    if _has_reduced_masks(config):
        data["reduced_masks_version"] = REDUCED_MASKS_VERSION
    if _has_nearest_resize(config):
        data["nearest_resize_version"] = NEAREST_RESIZE_VERSION
    if _has_user_geometry(config):
        data["user_geometry_version"] = USER_GEOMETRY_VERSION
    if _has_flip_pairs(config):
        data["mirrored_keypoints_version"] = MIRRORED_KEYPOINTS_VERSION
    if config.get("plugins"):
        data["plugin_sources"] = plugin_sources(config["plugins"])
    return versioning.fingerprint(data)


def plugin_sources(modules: Sequence[str]) -> dict[str, str]:
    """The sha256 of each plugin module's file (its source), by module name.

    A plugin's transforms write the pixels as kiln's own code does, so its
    code is part of the processing fingerprint: an edit to a module the
    config's ``plugins:`` names makes a new version, built without reusing
    records. Only the named modules' own files are read (not what they
    import): for code elsewhere, change a parameter (see the module
    docstring). The modules are imported already (the config checked them).
    """
    out = {}
    for module in modules:
        if module not in sys.modules:  # the config imports them; a caller that did not
            problem = import_plugin(module)
            if problem:
                raise ValueError(f"plugins: {problem}")
        path = getattr(sys.modules[module], "__file__", None)
        if not path:  # a namespace package: no file of its own
            out[module] = ""
            continue
        with open(path, "rb") as f:
            out[module] = hashlib.sha256(f.read()).hexdigest()
    return out


def _has_mask(config: Mapping[str, Any]) -> bool:
    return (config.get("targets") or {}).get("mask") is not None


def _has_instance_masks(config: Mapping[str, Any]) -> bool:
    return (config.get("targets") or {}).get("instance_masks") is not None


def _has_coco_keypoints(config: Mapping[str, Any]) -> bool:
    source, targets = config.get("source") or {}, config.get("targets") or {}
    return source.get("type") == "coco" and targets.get("keypoints") is not None


def _has_nearest_resize(config: Mapping[str, Any]) -> bool:
    return any(
        isinstance(entry, Mapping)
        and isinstance(entry.get(name), Mapping)
        and entry[name].get("interpolation") == "nearest"
        for entry in config.get("transforms") or ()
        for name in ("resize", "letterbox")
    )


def _has_flip_pairs(config: Mapping[str, Any]) -> bool:
    keypoints = (config.get("targets") or {}).get("keypoints") or {}
    return bool(keypoints.get("flip_pairs"))


def _has_user_geometry(config: Mapping[str, Any]) -> bool:
    targets = config.get("targets") or {}
    moved = ("boxes", "mask", "instance_masks", "keypoints")
    return bool(config.get("plugins")) and any(targets.get(kind) is not None for kind in moved)


def _has_reduced_masks(config: Mapping[str, Any]) -> bool:
    targets = config.get("targets") or {}
    masks = targets.get("mask") is not None or targets.get("instance_masks") is not None
    return bool((config.get("image") or {}).get("jpeg_scaled_decode")) and masks


def processing(config: Mapping[str, Any]) -> dict[str, Any]:
    """kiln.json's ``processing`` block for a resolved config: with a semantic
    mask also ``mask_counts`` (`MASK_COUNTS_VERSION`), which tells `kiln
    verify` how the dataset's class_counts were counted; with instance masks
    ``instance_boxes`` (`INSTANCE_BOXES_VERSION`), with a COCO source and
    keypoints ``coco_keypoints`` (`COCO_KEYPOINTS_VERSION`), with
    ``image.jpeg_scaled_decode`` and masks ``reduced_masks``
    (`REDUCED_MASKS_VERSION`), with a nearest-neighbour `resize` or
    `letterbox` ``nearest_resize`` (`NEAREST_RESIZE_VERSION`), with plugins and
    targets that transforms move ``user_geometry`` (`USER_GEOMETRY_VERSION`),
    with keypoint flip pairs ``mirrored_keypoints``
    (`MIRRORED_KEYPOINTS_VERSION`): each names why a base built before is not
    reused."""
    out = {"version": PROCESSING_VERSION, "fingerprint": processing_fingerprint(config)}
    if _has_mask(config):
        out["mask_counts"] = MASK_COUNTS_VERSION
    if _has_instance_masks(config):
        out["instance_boxes"] = INSTANCE_BOXES_VERSION
    if _has_coco_keypoints(config):
        out["coco_keypoints"] = COCO_KEYPOINTS_VERSION
    if _has_reduced_masks(config):
        out["reduced_masks"] = REDUCED_MASKS_VERSION
    if _has_nearest_resize(config):
        out["nearest_resize"] = NEAREST_RESIZE_VERSION
    if _has_user_geometry(config):
        out["user_geometry"] = USER_GEOMETRY_VERSION
    if _has_flip_pairs(config):
        out["mirrored_keypoints"] = MIRRORED_KEYPOINTS_VERSION
    return out


@dataclasses.dataclass(frozen=True)
class BaseFiles:
    """A trusted-looking base version, as the job needs it.

    Attributes:
      version: The base version's name.
      folder: Its folder (``<output>/<name>/<version>``).
      files: ``(file name, sha256)`` of its shards and its record index,
        as its kiln.json records them: the job checks each before use.
      compression: Its shards' compression (None or "gzip").
      class_names: Its class names, in id order: a record whose class ids alone
        changed is relabelled (`kiln.pipeline.relabel`).
      stamps: The files of the listing it was built from, as the dataset
        keeps them (`publish.DatasetRoot.file_stamps`): a file listed now
        with the stamp listed there (size, modification time, a local
        file's inode and ctime) is not read, its sha256 taken from its base
        row (`JoinBase`). Empty: every file is
        read and hashed (``--rehash``, or a base kept without them).
      stamps_before: Only a modification time before it is trusted: the
        time the build that listed them started, less `RACY_SECONDS`.
      disagreements: The files its job read that were not as listed
        (`publish.STAMP_DISAGREEMENTS_FILE`), or "" when there were none:
        their listed stamps are not trusted (`JoinBase`).
      dropped: The key, sha256 and reason of each file its job read and
        dropped (`publish.DROPPED_SHA256S_FILE`), or "" when none is kept:
        a file listed now with the stamp the base listed that the base
        dropped as undecodable is dropped again without being read
        (`dropped_again`).
    """

    version: str
    folder: str
    files: tuple[tuple[str, str], ...]
    compression: str | None
    class_names: tuple[str, ...] = ()
    stamps: tuple[str, ...] = ()
    # Stamps at or after this time (seconds since the epoch) are not trusted
    # (`RACY_SECONDS`): the build that listed them started just after it.
    stamps_before: float = 0.0
    disagreements: str = ""
    dropped: str = ""

    @property
    def index_uri(self) -> str:
        return storage.join(self.folder, INDEX_FILENAME)


@dataclasses.dataclass(frozen=True)
class BaseChoice:
    """The launcher's decision: the base to reuse records from, or why none.

    Attributes:
      base: The base, or None (a from-scratch build).
      version: The version considered (None: there was none).
      reason: Why it is not used ("" when it is).
      hashed_all: Why every listed file is read and hashed rather than
        trusting the stamps the base listed (`BaseFiles.stamps`); "" when
        they are trusted, or no base is used.
    """

    base: BaseFiles | None
    version: str | None = None
    reason: str = ""
    hashed_all: str = ""

    def with_stamps(
        self,
        stamps: Sequence[str],
        hashed_all: str = "",
        *,
        listed_from: float = 0.0,
        disagreements: str = "",
        dropped: str = "",
    ) -> BaseChoice:
        """This choice with the base's listing files to trust stamps from
        (`BaseFiles.stamps`; `listed_from`: when the build that listed them
        started; `disagreements`: the file of those not to trust,
        `BaseFiles.disagreements`; `dropped`: the files its job dropped,
        `BaseFiles.dropped`), or, with none, the reason every file is
        read."""
        if self.base is None:
            return self
        base = dataclasses.replace(
            self.base,
            stamps=tuple(stamps),
            stamps_before=listed_from - RACY_SECONDS,
            disagreements=disagreements if stamps else "",
            dropped=dropped if stamps else "",
        )
        return dataclasses.replace(self, base=base, hashed_all="" if stamps else hashed_all)


# The parts of kiln's own processing that a dataset's kiln.json versions
# (`processing`), and what each is, for the reason a base is not reused.
_KILN_CHANGES = (
    ("mask_counts", "mask class counting"),
    ("instance_boxes", "instance-mask box handling"),
    ("coco_keypoints", "COCO keypoint reading"),
    ("reduced_masks", "reduced-decode mask resampling"),
    ("nearest_resize", "nearest-neighbour resize"),
    ("user_geometry", "user transform geometry"),
    ("mirrored_keypoints", "mirrored keypoint"),
)


def choose_base(
    dataset_root: str,
    read_info,
    latest: str | None,
    requested: str | None,
    config: Mapping[str, Any],
    full: bool,
) -> BaseChoice:
    """Which published version to reuse records from (see the module docstring).

    Args:
      dataset_root: ``<output>/<name>``.
      read_info: Version name -> its checked `DatasetInfo`, or None when
        missing or damaged (`publish.DatasetRoot.read_info`).
      latest: The version LATEST names, or None.
      requested: ``--base VERSION``, or None for LATEST.
      config: The new build's resolved config (`BuildSpec.to_json`).
      full: ``--full``: no base.
    """
    version = requested or latest
    if full:
        return BaseChoice(None, version, "--full asks for a from-scratch build")
    if version is None:
        return BaseChoice(None, None, "no published version to reuse")
    info: DatasetInfo | None = read_info(version)
    if info is None:
        return BaseChoice(None, version, "its kiln.json is missing or damaged")
    wanted = processing(config)
    if info.processing is None or info.index_sha256 is None:
        return BaseChoice(
            None, version, "it records no record index (built by an older kiln): processed all"
        )
    if info.processing.get("version") != wanted["version"]:
        return BaseChoice(
            None,
            version,
            f"it was built with kiln processing version {info.processing.get('version')}, "
            f"this kiln's is {wanted['version']}",
        )
    for name, what in _KILN_CHANGES:
        if name in wanted and info.processing.get(name, 0) != wanted[name]:
            return BaseChoice(
                None,
                version,
                f"it was built with kiln's {what} version {info.processing.get(name, 0)}, "
                f"this kiln's is {wanted[name]}",
            )
    if info.processing.get("fingerprint") != wanted["fingerprint"]:
        return BaseChoice(
            None,
            version,
            "its processing differs (image, transforms, encoding, targets, plugins or OpenCV "
            "version)",
        )
    files = tuple(
        (shard.filename, shard.sha256) for split in info.splits.values() for shard in split.shards
    ) + ((INDEX_FILENAME, info.index_sha256),)
    folder = storage.join(dataset_root, version)
    return BaseChoice(
        BaseFiles(version, folder, files, info.compression, tuple(info.class_names)), version
    )


# --- in the job --------------------------------------------------------------------


def bucket_count(num_files: int) -> int:
    """Buckets the listed files and the base's rows are joined in: about one
    listing line's worth of files each."""
    return max(1, math.ceil(num_files / FILES_PER_LINE))


def _bucket(key: str, buckets: int) -> int:
    # CRC-32: spread as evenly over the buckets as a sha256 (within one
    # bucket's worth on real keys), in a tenth of its time: the join takes
    # it three times per file. Only the grouping depends on it, never the output.
    return zlib.crc32(key.encode("utf-8")) % buckets


class _FrameScanner:
    """Finds where each TFRecord frame starts in bytes fed in pieces."""

    def __init__(self) -> None:
        self.starts = array.array("Q")
        self._next = 0  # where the next frame starts
        self._seen = 0  # bytes fed so far
        self._tail = b""  # fed bytes from the last unread header on, when it was cut

    def feed(self, data: bytes) -> None:
        if self._tail:
            data = self._tail + data
            offset = self._seen - len(self._tail)
        else:
            offset = self._seen
        self._seen = offset + len(data)
        while self._next + tfrecord.HEADER_SIZE <= self._seen:
            self.starts.append(self._next)
            (length,) = tfrecord.LENGTH.unpack_from(data, self._next - offset)
            self._next += tfrecord.HEADER_SIZE + length + tfrecord.FOOTER_SIZE
        self._tail = data[self._next - offset :] if self._next < self._seen else b""

    def frames(self) -> bytes:
        """Each frame's start and, last, the end, as `array.array("Q")` bytes.

        Raises:
          ValueError: the bytes do not end where a frame ends.
        """
        if self._next != self._seen:
            raise ValueError(f"a truncated record at byte {self.starts[-1] if self.starts else 0}")
        return (self.starts + array.array("Q", [self._next])).tobytes()


def frame_starts(frames: bytes) -> array.array:
    """`BaseFileCheck` frames bytes as an array: record ``i``'s frame is
    ``[starts[i], starts[i + 1])``."""
    starts = array.array("Q")
    starts.frombytes(frames)
    return starts


# A gzip base shard is inflated this many compressed bytes at a time. Beam's
# default read size (16 MB) makes its read buffer hold a few times that: for
# a shard writer thread or an image step reading a base shard, tens of MB.
_INFLATE_READ_BYTES = 1 << 20


def open_base_shard(uri: str, compression: str | None) -> Any:
    """A base shard opened to read its uncompressed bytes (where `frame_starts`
    and `sharding.ReusedRun` offsets point): a plain file as it is, a gzip
    one through Beam's `CompressedFile`, which inflates as it is read.

    Reading a gzip shard at ascending offsets is one forward pass (a forward
    seek inflates and drops what it skips; a backward one starts over from
    the file's start), holding the read buffer (about `_INFLATE_READ_BYTES`
    of compressed bytes, inflated) and what is read, never the shard. The
    one reader of base shards: `BaseShard` and `sharding.read_reused` use it.
    """
    raw = FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED)
    if compression != "gzip":
        return raw
    return CompressedFile(raw, CompressionTypes.GZIP, read_size=_INFLATE_READ_BYTES)


class BaseShard:
    """Reads records of one base shard by position, the file opened once.

    Where each record's frame is comes from the base's check (`frame_starts`).
    Records asked for in ascending position cost one pass over the file
    whatever their number: an uncompressed shard is read by a seek and a
    read per record; a gzip-compressed one is inflated once from its start
    as the positions go up (`open_base_shard`), holding a read buffer and
    one record, never the shard. A position asked for again is served from the
    last read; an earlier one would inflate from the start again, so
    callers sort what they want by position.

    `record` never raises: a record that cannot be read or whose frame is
    not intact is None (its file is then processed from its source), and
    after a read error every later one is None too.

    Args:
      uri: The base shard file.
      compression: Its compression (None or "gzip": `BaseFiles.compression`).
      starts: Its `frame_starts`.
    """

    def __init__(self, uri: str, compression: str | None, starts: array.array):
        self._uri = uri
        self._compression = compression
        self._starts = starts
        self._file: Any = None
        self._failed = False
        self._last: tuple[int, bytes | None] | None = None

    def __enter__(self) -> BaseShard:
        return self

    def __exit__(self, *exc_info) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def record(self, position: int) -> bytes | None:
        """The serialized record at `position`, or None (see the class docstring)."""
        if self._last is not None and self._last[0] == position:
            return self._last[1]
        record = self._read(position)
        self._last = (position, record)
        return record

    def _read(self, position: int) -> bytes | None:
        if self._failed or not 0 <= position < len(self._starts) - 1:
            return None
        start, end = self._starts[position], self._starts[position + 1]
        try:
            if self._file is None:
                self._file = open_base_shard(self._uri, self._compression)
            self._file.seek(start)
            framed = self._file.read(end - start)
        except Exception as e:  # vanished, unreadable, not gzip: processed from the files
            self._failed = True
            logger.warning(
                "cannot read the records of base shard %s: %s: %s", self._uri, type(e).__name__, e
            )
            return None
        if not tfrecord.is_frame(framed):
            return None
        return bytes(tfrecord.unframe(framed))


def _check_file(
    name_and_sha256: tuple[str, str], folder: str, compression: str | None
) -> tuple[str, tuple[str, bytes]]:
    """(file name, expected sha256) -> (file name, (problem or "", frames)):
    a shard's frames are where each of its records starts and where the
    last ends, in its uncompressed bytes (`frame_starts`), found while it
    is hashed; the index's are empty."""
    name, expected = name_and_sha256
    digest = hashlib.sha256()
    scanner = None if name == INDEX_FILENAME else _FrameScanner()
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if compression == "gzip" else None
    # Why a gzip shard does not inflate: told only if its sha256 matches (a
    # damaged shard is named by its sha256, which says more).
    not_gzip: zlib.error | None = None
    try:
        with FileSystems.open(
            FileSystems.join(folder, name), compression_type=CompressionTypes.UNCOMPRESSED
        ) as f:
            while chunk := f.read(_CHUNK_BYTES):
                digest.update(chunk)
                if scanner is None or not_gzip is not None:
                    continue
                try:
                    scanner.feed(inflate.decompress(chunk) if inflate is not None else chunk)
                except zlib.error as e:
                    not_gzip = e
    except Exception as e:  # missing, unreadable: not trusted
        return name, (f"{name} cannot be read ({type(e).__name__})", b"")
    if digest.hexdigest() != expected:
        return name, (f"{name}: sha256 differs from the base's kiln.json", b"")
    if scanner is None:
        return name, ("", b"")
    try:
        if not_gzip is not None:
            raise not_gzip
        if inflate is not None:
            scanner.feed(inflate.flush())
        return name, ("", scanner.frames())
    except (ValueError, zlib.error) as e:  # as recorded, yet not kiln's framing
        return name, (f"{name}: not a TFRecord file ({e})", b"")


def _check_files(
    names_and_sha256: list[tuple[str, str]], folder: str, compression: str | None, threads: int
) -> list[tuple[str, tuple[str, bytes]]]:
    """`_check_file` of each file, on up to `threads` threads at once
    (hashing, inflating and reading release the GIL), in the given order."""
    check = functools.partial(_check_file, folder=folder, compression=compression)
    threads = min(threads, len(names_and_sha256))
    if threads <= 1:
        return [check(file) for file in names_and_sha256]
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="kiln-base") as pool:
        return list(pool.map(check, names_and_sha256))


class VerifyBaseFiles(beam.PTransform):
    """The base's shards and index checked against their recorded sha256:
    PCollection[(file name, (problem or "", frames))], one per file (a
    `BaseFileCheck`: the frames say where each record of a shard is, so
    the image step can hand reused records to the shard writer as byte
    ranges of the base's shards).

    Args:
      threads: Files hashed at once by a worker (`JobPlan.image_threads`:
        the image step's threads, idle while the base is checked).
    """

    def __init__(self, base: BaseFiles, threads: int = 1):
        super().__init__()
        self._base = base
        self._threads = max(1, threads)

    # The files go in groups of up to this many, each hashed by a worker's
    # threads (`_check_files`). A base of one group (a few shards) is
    # checked in the step that lists it: a reshuffle to spread the groups
    # over workers is a stage of its own (a shuffle the local runner runs
    # as a separate bundle) and buys nothing for one group. More groups are
    # spread, so a base of many shards is hashed on several workers.
    FUSED_FILES = 16

    def expand(self, pipeline):
        files = list(self._base.files)
        groups = [files[i : i + self.FUSED_FILES] for i in range(0, len(files), self.FUSED_FILES)]
        return (
            pipeline
            | "ListBaseFiles" >> beam.Create(groups, reshuffle=len(groups) > 1)  # [(name, sha256)]
            | "HashBaseFiles"
            >> beam.FlatMap(
                _check_files,
                folder=self._base.folder,
                compression=self._base.compression,
                threads=self._threads,
            )
            # (name, (problem or "", frames))
        )


# What `JoinBase` groups by bucket: a listed file, a base index row, and a
# file's stamp as the base listed it.
_FILE, _ROW, _STAMP = 0, 1, 2
# And a file whose stamp the base listed that its job found otherwise as it
# read it (`BaseFiles.disagreements`): that stamp is not trusted.
_DISAGREED = 3
# And a file the base's job read and dropped as undecodable (`dropped_again`).
_DROPPED = 4

DROPPED_AGAIN_STAGES = frozenset({"decode"})
"""The stages at which a file the base's job dropped is dropped again,
unread, when its stamp is the one the base listed (`dropped_again`): a
file that does not decode (empty, not an image, corrupt, too many pixels,
too small) gives the same reason and message for the same bytes and the
same processing (the base's fingerprint is this build's), as the record of
the same bytes is the same. Not the others: a ``read`` failure may pass
(permission, network), a ``transform`` failure may be a plugin's passing
one, and a dataset with targets (which `JoinBase` is not asked to drop
again for) checks its annotations and masks, not only the image's bytes."""

RACY_SECONDS = 2.0
"""How close to the start of the build that listed it a file's modification
time may be and still be trusted: not at all. Such a file may have been
rewritten after that build read it, within the same tick of the file
system's clock (two seconds on FAT, a few milliseconds on ext4), so with
the same size and modification time as listed: its stamp cannot tell (git
calls such index entries "racily clean"). It is read and hashed instead.
A file modified just before a build is read again by the next one; older
files are trusted. The inputs' stamp (the launcher's up-to-date check)
has the same blind spot: there such files are read and compared with the
version's record index (`up_to_date`)."""

STAMP_UNCHANGED = record_index.STAMP_UNCHANGED  # what `JoinBase` marks a trusted file with
BASE_DROPPED = record_index.BASE_DROPPED  # how the base dropped an unchanged file: `dropped_again`
BASE_MASK_STAMPS = record_index.BASE_MASK_STAMPS  # its mask files' stamps as the base listed them


def _files_by_bucket(files, buckets: int):
    for item in files:
        yield _bucket(item["key"], buckets), (_FILE, item)


def _rows_by_bucket(line: str, buckets: int):
    try:
        row = record_index.parse_line(line)
    except ValueError:
        # A damaged index fails its sha256 check: nothing is reused then.
        Metrics.counter("kiln", "base_index_bad_lines").inc()
        return
    # As a plain tuple: Beam's coder writes that without pickling (an
    # IndexRow it would pickle, class and all, several times slower).
    yield _bucket(row.key, buckets), (_ROW, tuple(row))


def _stamps_by_bucket(uri: str, buckets: int, before: float):
    """A file of the listing the base was built from (`BaseFiles.stamps`:
    lines of ``{"files": [...]}``, and of dropped rows, which list no file)
    -> ``(bucket, (2, (key, (size, mtime, inode_ctime) or None, masks)))``
    per file it lists: its stamp if its modification time is before
    `before` (`RACY_SECONDS`; the others are counted,
    ``base_stamps_too_recent``, and their files read), and ``masks``: per
    mask file its targets name, ``(uri, size, mtime, inode_ctime)``
    likewise (None when too recent: counted, ``base_mask_stamps_too_recent``).
    ``inode_ctime`` is None where the line has none (an object's, or a line
    written by a kiln before it listed them). A file with nothing to trust
    is left out.

    Never fails the build: a line that is not such a listing line is
    counted (``base_stamps_bad_lines``) and passed over, a file that
    cannot be read is logged and counted (``base_stamps_unreadable``); the
    files whose stamps are not found so are read and hashed."""
    try:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for line in f:
                stamps = _listed_stamps(line)
                if stamps is None:
                    Metrics.counter("kiln", "base_stamps_bad_lines").inc()
                    continue
                for key, size, mtime, inode_ctime, listed_masks in stamps:
                    stamp: FileStamp | None = (size, mtime, inode_ctime)
                    if mtime >= before:
                        Metrics.counter("kiln", "base_stamps_too_recent").inc()
                        stamp = None
                    masks = tuple(
                        None if mask is None or mask[2] >= before else mask for mask in listed_masks
                    )
                    too_recent = sum(mask is None for mask in masks)
                    if too_recent:
                        Metrics.counter("kiln", "base_mask_stamps_too_recent").inc(too_recent)
                    if stamp is None and too_recent == len(masks):
                        continue
                    yield _bucket(key, buckets), (_STAMP, (key, stamp, masks))
    except Exception as e:  # vanished, unreadable: its files are hashed
        Metrics.counter("kiln", "base_stamps_unreadable").inc()
        logger.warning(
            "cannot read the base's file stamps %s (%s): the files it lists are read and hashed",
            uri,
            type(e).__name__,
        )


def _disagreements_by_bucket(uri: str, buckets: int):
    """The base's stamp disagreements (`BaseFiles.disagreements`) ->
    ``(bucket, (3, (key, uri, mask)))`` per file its job read that was not
    as listed: `_attach_base` trusts no such stamp. Never fails the build:
    if the file cannot be read (or a line is damaged), every bucket gets
    ``(3, None)``, and no stamp of the base is trusted (counted,
    ``base_disagreements_unreadable``): every file is read."""
    try:
        for found in stamp_disagreements.read(uri):
            yield _bucket(found.key, buckets), (_DISAGREED, (found.key, found.uri, found.mask))
    except Exception as e:  # vanished, unreadable, damaged: trust no stamp
        Metrics.counter("kiln", "base_disagreements_unreadable").inc()
        logger.warning(
            "cannot read the base's stamp disagreements %s (%s): every file is read and hashed",
            uri,
            type(e).__name__,
        )
        for bucket in range(buckets):
            yield bucket, (_DISAGREED, None)


def dropped_again(uri: str, buckets: int):
    """The base's dropped files (`BaseFiles.dropped`: lines of ``{"key",
    "sha256", "stage", "reason", "message"}``) -> ``(bucket, (4, (key,
    (sha256, reason, message))))`` per file dropped at one of
    `DROPPED_AGAIN_STAGES`: `_attach_base` marks such a file listed now
    with the stamp the base listed (`BASE_DROPPED`), and the image step
    drops it again as the base did without reading it. The rows of the
    other stages are passed over, as are lines written by a kiln before
    they kept the reason (their files are read).

    Never fails the build: if the file cannot be read, or a line is
    damaged, nothing is dropped unread (counted, ``base_drops_unreadable``):
    every such file is read, as without the file."""
    found: list[tuple[str, tuple[str, str, str]]] = []
    try:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for number, line in enumerate(f, start=1):
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"line {number} is not a JSON object")
                key, sha256 = row.get("key"), row.get("sha256")
                if not (isinstance(key, str) and isinstance(sha256, str)):
                    raise ValueError(f"line {number} holds no key and sha256")
                reason, message = row.get("reason"), row.get("message")
                if (
                    row.get("stage") in DROPPED_AGAIN_STAGES
                    and isinstance(reason, str)
                    and isinstance(message, str)
                ):
                    found.append((key, (sha256, reason, message)))
    except Exception as e:  # vanished, unreadable, damaged: the files are read
        Metrics.counter("kiln", "base_drops_unreadable").inc()
        logger.warning(
            "cannot read the files base dropped %s (%s): those listed are read again",
            uri,
            type(e).__name__,
        )
        return
    for key, dropped in found:
        yield _bucket(key, buckets), (_DROPPED, (key, dropped))


def _distrust(
    stamps: dict[str, FileStamp | None],
    mask_stamps: dict[str, MaskStamps],
    disagreed: Mapping[str, set[tuple[str, bool]]] | None,
) -> None:
    """Leaves out of a bucket's base stamps (`_attach_base`) those the
    base's job found otherwise as it read the file (`disagreed`: key ->
    ``(uri, mask)``; None: all of them), counted (``base_stamps_disagreed``)."""
    if disagreed is None:
        Metrics.counter("kiln", "base_stamps_disagreed").inc(len(stamps))
        stamps.clear()
        mask_stamps.clear()
        return
    for key, files in disagreed.items():
        if any(not mask for _, mask in files) and stamps.get(key) is not None:
            Metrics.counter("kiln", "base_stamps_disagreed").inc()
            stamps[key] = None
        masks = {uri for uri, mask in files if mask}
        listed = mask_stamps.get(key, ())
        left_out = [i for i, stamp in enumerate(listed) if stamp is not None and stamp[0] in masks]
        if left_out:
            Metrics.counter("kiln", "base_stamps_disagreed").inc(len(left_out))
            mask_stamps[key] = tuple(
                None if i in left_out else stamp for i, stamp in enumerate(listed)
            )


def _listed_stamps(
    line: bytes,
) -> list[tuple[str, int, float, str | None, MaskStamps]] | None:
    """``(key, size, mtime, inode_ctime, masks)`` of each file a listing
    line lists (none for a dropped row's line), or None when the line is
    not a listing line; ``inode_ctime`` None when the line has none,
    ``masks``: `_listed_mask_stamps`."""
    try:
        row = json.loads(line)
        if not isinstance(row, dict):
            return None
        if "files" not in row:
            return [] if "dropped" in row else None
        stamps = []
        for file in row["files"]:
            key, size, mtime = file["key"], file["size"], file["mtime"]
            inode_ctime = file.get("inode_ctime")
            if not (
                isinstance(key, str)
                and _is_size(size)
                and _is_time(mtime)
                and (inode_ctime is None or isinstance(inode_ctime, str))
            ):
                return None
            stamps.append((key, size, float(mtime), inode_ctime, _listed_mask_stamps(file)))
        return stamps
    except (ValueError, TypeError, KeyError):  # not JSON, not a listing line
        return None


# A file's stamp as listed: ``(size, mtime, inode_ctime)``; inode_ctime
# (`storage.inode_ctime`) None for an object, or in a listing line written
# by a kiln before it listed them.
FileStamp = tuple[int, float, str | None]

# Per mask file a listed file's targets name (`target_rows.mask_uris`):
# ``(uri, size, mtime, inode_ctime)`` as listed, or None (not to be trusted).
MaskStamps = tuple[tuple[str, int, float, str | None] | None, ...]


def _listed_mask_stamps(file: Mapping[str, Any]) -> MaskStamps:
    """``(uri, size, mtime, inode_ctime)`` of each mask file a listed
    file's targets name, from its listing line (``targets`` and
    ``mask_stamp``: see `listing.SourceFile`; inode_ctime None where a
    stamp has none); empty for a line without them (no mask file, or
    written by a kiln before it listed them) or whose stamps do not match
    its targets (then its masks are read)."""
    listed = file.get("mask_stamp")
    if not isinstance(listed, list) or not isinstance(file.get("targets"), str):
        return ()
    uris = [uri for _, uri in target_rows.mask_uris(json.loads(file["targets"]))]
    if len(uris) != len(listed):
        return ()
    masks = []
    for uri, stamp in zip(uris, listed, strict=True):
        if not (
            isinstance(uri, str)
            and isinstance(stamp, list)
            and len(stamp) in (2, 3)
            and _is_size(stamp[0])
            and _is_time(stamp[1])
            and (len(stamp) == 2 or isinstance(stamp[2], str))
        ):
            return ()
        masks.append((uri, stamp[0], float(stamp[1]), stamp[2] if len(stamp) == 3 else None))
    return tuple(masks)


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def base_masks(
    stamps: MaskStamps, sha256s: Sequence[str | None] | None
) -> dict[str, tuple[int, float, str | None, str]]:
    """What the base vouches for of a file's mask files: URI -> ``(size,
    mtime, inode_ctime, sha256)``, from the mask stamps the base listed for its key
    (`record_index.BASE_MASK_STAMPS`, `JoinBase`) and the sha256s its
    record keeps of the same masks, in the same order (`IndexRow.masks`).
    Empty when the row keeps none (a base built before kiln kept them) or
    they do not pair up. A mask file the base could not read, whose stamp
    is too recent, or that the base lists twice with two stamps is left
    out: it is read (`targets.MaskFiles.read`)."""
    if not stamps or sha256s is None or len(stamps) != len(sha256s):
        return {}
    found: dict[str, tuple[int, float, str | None, str] | None] = {}
    for stamp, sha256 in zip(stamps, sha256s, strict=True):
        if stamp is None or sha256 is None:
            continue
        uri, size, mtime, inode_ctime = stamp
        value = (size, mtime, inode_ctime, sha256)
        found[uri] = value if found.get(uri, value) == value else None
    return {uri: value for uri, value in found.items() if value is not None}


def _stamp_unchanged(item: Mapping[str, Any], base_stamp: FileStamp | None) -> bool:
    """Whether a listed file's size, modification time and status-change
    identity (``inode_ctime``, a local file's) are `base_stamp`, those the
    base listed for its key. A modification time of 0 or less is no stamp
    (a store that gives none): never trusted. A local file the base listed
    without its identity (a kiln before it listed them) is not trusted
    either: it is read once, and the build's own listing has it."""
    mtime = item.get("mtime")
    if base_stamp is None or mtime is None or float(mtime) <= 0:
        return False
    return (item.get("size"), float(mtime), item.get("inode_ctime")) == base_stamp


ORPHANS = "orphans"


def _attach_base(bucket_and_values):
    """One bucket's files, each with its base row (None if new) under
    ``base``, `STAMP_UNCHANGED` set where the row's file has the stamp
    (`_stamp_unchanged`) the base listed, and `BASE_MASK_STAMPS` where
    the row keeps its mask files' sha256s and the base listed their stamps;
    tagged ``orphans``, ``(sha256, row fields)`` of each base row whose key
    is not listed (what a moved file may be served by: `moves`).
    `BASE_DROPPED` is set on a file without a base row that has the stamp
    the base listed and that the base's job dropped as undecodable
    (`dropped_again`)."""
    _, values = bucket_and_values
    rows: dict[str, record_index.IndexRow] = {}
    # Key -> (size, mtime, inode_ctime) as the base listed it; None for a
    # key listed twice with two stamps, or too recent (neither is trusted).
    stamps: dict[str, FileStamp | None] = {}
    # Key -> its mask files' stamps as the base listed them (`MaskStamps`):
    # none trusted for a key listed twice with two.
    mask_stamps: dict[str, MaskStamps] = {}
    # Key -> (uri, mask) of the files whose stamps the base's job found
    # otherwise (`_DISAGREED`); None: trust none of the bucket's stamps.
    disagreed: dict[str, set[tuple[str, bool]]] | None = {}
    # Key -> (sha256, reason, message) as the base's job dropped it; None
    # for a key dropped twice otherwise (not trusted).
    dropped: dict[str, tuple[str, str, str] | None] = {}
    files = []
    for kind, value in values:
        if kind == _ROW:
            row = record_index.IndexRow(*value)
            rows[row.key] = row
        elif kind == _DISAGREED:
            if value is None or disagreed is None:
                disagreed = None
            else:
                key, uri, mask = value
                disagreed.setdefault(key, set()).add((uri, mask))
        elif kind == _STAMP:
            key, stamp, masks = value
            stamps[key] = stamp if stamps.get(key, stamp) == stamp else None
            mask_stamps[key] = masks if mask_stamps.get(key, masks) == masks else ()
        elif kind == _DROPPED:
            key, how = value
            how = tuple(how)
            dropped[key] = how if dropped.get(key, how) == how else None
        else:
            files.append(value)
    if disagreed != {}:
        _distrust(stamps, mask_stamps, disagreed)
    out = []
    for item in files:
        key = item["key"]
        found = rows.pop(key, None)
        attached = dict(item, base=found)
        if found is not None and _stamp_unchanged(item, stamps.get(key)):
            attached[STAMP_UNCHANGED] = True
        if found is not None and found.masks is not None and mask_stamps.get(key):
            attached[BASE_MASK_STAMPS] = mask_stamps[key]
        how = dropped.get(key)
        if found is None and how is not None and _stamp_unchanged(item, stamps.get(key)):
            attached[BASE_DROPPED] = how
        out.append(attached)
    if rows:
        Metrics.counter("kiln", "records_deleted").inc(len(rows))
    for row in rows.values():
        # Without the line as read: a moved record gets an index entry of its own.
        yield beam.pvalue.TaggedOutput(ORPHANS, (row.sha256, tuple(row._replace(line=""))))
    if out:
        yield out


class JoinBase(beam.PTransform):
    """Lists of listed files -> lists of the same files, each with its base
    index row (or None) under ``base``: joined by key in `buckets` buckets,
    which also spreads the files over the workers. A DoOutputsTuple:
    ``files``, and ``orphans``: ``(sha256, row fields)`` of the base rows
    whose key is not listed (`JoinMoved`).

    The stamps the base listed (`BaseFiles.stamps`, its listing's lines)
    join in the same buckets: a file with a base row whose size,
    modification time and (a local file's) inode and ctime are those the
    base listed for its key gets `STAMP_UNCHANGED`, and the image step takes its sha256 from the row
    without reading it (as the launcher's up-to-date stamp trusts them).
    Bounded memory: a bucket holds about one listing line's worth of
    files, rows and stamps; no worker holds the base's stamps as a whole.

    With `drop_again` (a dataset without targets), the files the base's job
    dropped as undecodable join likewise (`dropped_again`): one listed now
    with the stamp the base listed is marked `BASE_DROPPED`, and dropped
    again without being read."""

    # Up to this many listing files (the launcher's one, a listing job's
    # few) are read in the step that lists them (see `VerifyBaseFiles`).
    FUSED_STAMP_FILES = 16

    def __init__(self, base: BaseFiles, buckets: int, drop_again: bool = False):
        super().__init__()
        self._base = base
        self._buckets = buckets
        self._drop_again = drop_again

    def expand(self, files):
        buckets = self._buckets
        listed = files | "FilesByBucket" >> beam.FlatMap(_files_by_bucket, buckets=buckets)
        rows = (
            files.pipeline
            | "ReadBaseIndex" >> beam.io.ReadFromText(self._base.index_uri, validate=False)
            | "RowsByBucket" >> beam.FlatMap(_rows_by_bucket, buckets=buckets)
        )
        merged = [listed, rows]
        stamps = list(self._base.stamps)
        if stamps and self._base.disagreements:
            merged.append(
                files.pipeline
                | "ListBaseDisagreements" >> beam.Create([self._base.disagreements])  # uri
                | "DisagreementsByBucket" >> beam.FlatMap(_disagreements_by_bucket, buckets=buckets)
            )
        if stamps:
            merged.append(
                files.pipeline
                | "ListBaseStamps"
                >> beam.Create(stamps, reshuffle=len(stamps) > self.FUSED_STAMP_FILES)  # uri
                | "StampsByBucket"
                >> beam.FlatMap(_stamps_by_bucket, buckets=buckets, before=self._base.stamps_before)
            )
        if stamps and self._drop_again and self._base.dropped:
            merged.append(
                files.pipeline
                | "ListBaseDrops" >> beam.Create([self._base.dropped])  # uri
                | "DropsByBucket" >> beam.FlatMap(dropped_again, buckets=buckets)
            )
        return (
            tuple(merged)
            | "MergeFilesAndRows" >> beam.Flatten()
            # (bucket, (0, file), (1, IndexRow fields), (2, (key, stamp, masks))
            # or (3, (key, uri, mask) or None), or (4, (key, (sha256, reason, message))))
            | "GroupByBucket" >> beam.GroupByKey()
            | "AttachBase" >> beam.FlatMap(_attach_base).with_outputs(ORPHANS, main="files")
            # files: [{key, uri, ..., base, stamp_unchanged?}]; orphans: (sha256, IndexRow fields)
        )


class PackDigestsFn(beam.CombineFn):
    """Orphans ``(sha256, row fields)`` -> one `moves.pack` of their
    `moves.digest_prefix`: the side input that decides which files are
    deferred (`moves.Digests` wraps it as it is), 8 bytes per orphan on
    every worker that reads it, not a Python int each. The accumulators are
    `array.array("Q")` (8 bytes a prefix, and pickled as their bytes where
    a runner moves them between workers); the output is sorted, so the same
    orphans give the same bytes in any order and on any runner."""

    def create_accumulator(self) -> array.array:
        return array.array("Q")

    def add_input(self, accumulator: array.array, orphan: tuple[str, tuple]) -> array.array:
        accumulator.append(moves.digest_prefix(orphan[0]))
        return accumulator

    def merge_accumulators(self, accumulators) -> array.array:
        merged = array.array("Q")
        for accumulator in accumulators:
            merged.extend(accumulator)
        return merged

    def extract_output(self, accumulator: array.array) -> bytes:
        return moves.pack(accumulator)


def _by_sha256_bucket(sha256_and_value: tuple[str, Any], kind: int, buckets: int):
    sha256, value = sha256_and_value
    return _bucket(sha256, buckets), (kind, (sha256, value))


def _attach_moved(bucket_and_values):
    """One bucket's deferred files, each with the orphans of its sha256 under
    ``moved_from``: ``(sha256, (row fields, ...))``, maybe empty (a
    `moves.Digests` false positive: the file is processed)."""
    _, values = bucket_and_values
    rows: dict[str, list[tuple]] = {}
    files = []
    for kind, (sha256, value) in values:
        if kind:
            rows.setdefault(sha256, []).append(value)
        else:
            files.append((sha256, value))
    out = [dict(item, moved_from=(sha256, tuple(rows.get(sha256, ())))) for sha256, item in files]
    if out:
        yield out


class JoinMoved(beam.PTransform):
    """(deferred files, orphans) -> lists of the deferred files, each with the
    base rows it may have moved from under ``moved_from`` (`moves`): joined
    by sha256 in `buckets` buckets.

    Input: a pair of PCollections, ``(sha256, file)`` from the image step's
    ``deferred`` output and ``(sha256, row fields)`` from `JoinBase`'s
    ``orphans``."""

    def __init__(self, buckets: int):
        super().__init__()
        self._buckets = buckets

    def expand(self, deferred_and_orphans):
        deferred, orphans = deferred_and_orphans
        buckets = self._buckets
        files = deferred | "DeferredBySha256" >> beam.Map(
            _by_sha256_bucket, kind=0, buckets=buckets
        )
        rows = orphans | "OrphansBySha256" >> beam.Map(_by_sha256_bucket, kind=1, buckets=buckets)
        return (
            (files, rows)
            | "MergeDeferredAndOrphans" >> beam.Flatten()  # (bucket, (kind, (sha256, value)))
            | "GroupBySha256Bucket" >> beam.GroupByKey()
            | "AttachMovedFrom" >> beam.FlatMap(_attach_moved)  # [{key, ..., moved_from}]
        )


def untrusted(checks: Sequence[tuple[str, tuple[str, bytes]]]) -> dict[str, str]:
    """File name -> problem, for the base files that failed their check
    (`VerifyBaseFiles`'s output)."""
    return {name: problem for name, (problem, _) in checks if problem}


@dataclasses.dataclass(frozen=True)
class IncrementalReport:
    """How a build used its base: for the summary and ``--report``.

    Attributes:
      base: The version considered as base (None: there was none).
      used: Whether records were reused from it (or could have been: every
        file changed is still "used").
      reason: Why the base was not used, or what of it was not trusted.
      reused: Records copied from the base without decoding.
      relabelled: Records rewritten from the base's with new class ids (a
        class added or removed shifted them), without decoding
        (`kiln.pipeline.relabel`).
      moved: Records rewritten from the base's record of the same bytes
        under another key (the file moved; with new class ids too, if it
        changed class or the class list changed), without decoding
        (`kiln.pipeline.moves`). Their old keys count in `deleted`.
      processed: Files read and processed (decoded, or dropped).
      dropped_again: Files dropped as the base dropped them, not read: the
        base's job dropped them as undecodable and their stamps are those
        it listed (`dropped_again`); not in `processed`.
      added: Of those, files stored that the base did not have.
      changed: Of those, files stored whose bytes or listing inputs changed.
      reprocessed: Of those, files stored whose base record could not be
        used: its shard (or the record index) is missing, unreadable or not
        what the base's kiln.json says (`reason` names it), so the file was
        processed again, changed or not. Not new: the base had them. (The
        rest of `processed` was dropped: unreadable, corrupt...)
      deleted: Base records whose file is no longer listed.
      not_read: Of the records reused, relabelled or moved, those whose
        file was not read: its stamp (size, modification time, a local
        file's inode and ctime) is the one the base listed, so its sha256
        was taken from the base's record index (`JoinBase`; ``kiln build
        --rehash`` reads every file).
      masks_not_read: Mask files their targets name that were not read
        likewise: their sha256 was taken from the base's record
        (`base_masks`).
      hashed_all: Why every file was read and hashed instead ("" when the
        base's stamps were trusted, or no base was used).
    """

    base: str | None
    used: bool
    reason: str = ""
    reused: int = 0
    relabelled: int = 0
    moved: int = 0
    processed: int = 0
    dropped_again: int = 0
    added: int = 0
    changed: int = 0
    reprocessed: int = 0
    deleted: int = 0
    not_read: int = 0
    masks_not_read: int = 0
    hashed_all: str = ""

    @classmethod
    def from_run(
        cls, choice: BaseChoice, counters: Mapping[str, int], problems: Mapping[str, str]
    ) -> IncrementalReport:
        reused = counters.get("records_reused", 0)
        relabelled = counters.get("records_relabelled", 0)
        moved = counters.get("records_moved", 0)
        dropped_again = counters.get("files_dropped_again", 0)
        reason = choice.reason
        if choice.base is not None and problems:
            shown = "; ".join(problems[name] for name in sorted(problems)[:3])
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            reason = f"not trusted, its records processed instead: {shown}{more}"
        return cls(
            base=choice.version,
            used=choice.base is not None,
            reason=reason,
            reused=reused,
            relabelled=relabelled,
            moved=moved,
            # Files dropped again are in neither: not read, not processed.
            processed=counters.get("files_read", 0)
            + counters.get("files_not_read", 0)
            - reused
            - relabelled
            - moved,
            dropped_again=dropped_again,
            added=counters.get("images_added", 0),
            changed=counters.get("images_changed", 0),
            reprocessed=counters.get("images_reprocessed", 0),
            deleted=counters.get("records_deleted", 0),
            not_read=counters.get("files_not_read", 0),
            masks_not_read=counters.get("masks_not_read", 0),
            hashed_all=choice.hashed_all if choice.base is not None else "",
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary_line(self) -> str:
        """One line for the build's summary."""
        if not self.used:
            if self.base is None:
                return f"  full build: {self.reason}"
            return f"  full build: base {self.base} not used: {self.reason}"
        dropped = self.processed - self.added - self.changed - self.reprocessed
        reprocessed = f"{self.reprocessed} reprocessed, " if self.reprocessed else ""
        relabelled = f"relabelled {self.relabelled}, " if self.relabelled else ""
        moved = f"moved {self.moved}, " if self.moved else ""
        line = (
            f"  incremental from {self.base}: reused {self.reused}, {relabelled}{moved}processed "
            f"{self.processed} ({self.added} new, {self.changed} changed, {reprocessed}"
            f"{dropped} dropped), "
            f"{self.deleted} gone"
        )
        if self.dropped_again:
            again = self.dropped_again
            line += f"\n  dropped again as the base dropped them: {again} files, not read"
        if self.reason:
            line += f"\n  base {self.reason}"
        if self.hashed_all:
            line += f"\n  every file read and hashed: {self.hashed_all}"
        elif self.not_read or self.masks_not_read:
            masks = f" and {self.masks_not_read} mask files" if self.masks_not_read else ""
            line += (
                f"\n  not read: {self.not_read} files{masks}, their stamps those the base "
                f"listed (--rehash reads them)"
            )
        return line
