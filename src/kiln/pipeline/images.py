"""The heavy step: read, hash, decode, transform and encode each input image.

`ImageProcessor` does the work for one file and is plain Python (testable
without Beam). `ProcessImagesFn` runs it on a thread pool, a few files in
flight per thread: reading, hashing (hashlib), decoding, resizing and
encoding (OpenCV) all release the GIL, so threads in one process use several
cores without the cost of Beam's multi-process mode (pickling every image
between processes). How many threads is the launcher's decision (`kiln build --image-threads`,
see `kiln.pipeline.launcher.default_image_threads`): every core on a local
run; one on Dataflow, which already runs one SDK process per vCPU. The
records go straight into sorted runs for the shard writer
(`sharding.RunWriter`), not one by one through further Beam steps.

With a base version (`incremental`), each listed file arrives with its row
of the base's record index (``base``); a file whose sha256 and listing
inputs match it (with targets: the annotations, the sha256 of every mask
file they name and the class ids they use, `targets.TargetCodec.reuse_key`)
is not decoded (nor read, when its stamp is the one the base listed: its
size, modification time and, a local file's, inode and ctime; its sha256
is then the row's, `incremental.STAMP_UNCHANGED`;
nor its mask files, likewise: `incremental.base_masks`):
its record is copied from the base's shard by the shard
writer (a `sharding.ReusedRun` on the ``reused`` output, per base shard per
bundle: where its frame is in the base shard, found by the base's check),
and its statistics come from the row. A file whose sha256 matches and whose
listing inputs match with the base's class ids (a class added or removed
shifted them) is not decoded either: its record is copied so too, marked
to have its class ids rewritten by the shard writer as it copies it
(`relabel.FrameRelabel`); only where an id changes its varint width is its
base record read here (`_base_record`) and rewritten with this build's
class ids (`relabel`), into the runs like a new record. A file whose key
found no such record but whose bytes are a record's the base no longer
lists under its key (it moved: `moves`) is handed on (``deferred``) to be
joined with those records by sha256; the same step, run again on what the
join gives (each file with the base rows of its bytes under
``moved_from``), rewrites the matching record's key and class ids, or
processes the file. A gzip-compressed base's record is not read alone:
both steps hand such a file on (``base_reads``, with where the record is)
and `RewriteFromBaseShardsFn` runs it again with the record, reading each
base shard once.

Every file read (an image, a mask file) is compared, as it is read, with
the size and modification time its listing gave (the open file's fstat: no
request, no stat more); one that changed between the listing and the read
is logged as a warning and handed on (``stamp_disagreements``), kept beside
the version so that the next build trusts neither the version nor that
file's stamp (`stamp_disagreements`). A file not read is not compared.

Bad files never raise: each becomes a `DroppedFile` on the ``dropped``
output, counted per reason (an Exception a transform raises, a plugin's
too, drops its file as ``transform_failed``). What a transform raises that
is not an Exception (``sys.exit()``, a KeyboardInterrupt of its own, a
BaseException) is no file's problem: it stops the job as a
`TransformAborted`, which the launcher reports as an internal error naming
the transform. What the job counts about every file (its
entry in the dataset version, and each stored image's split, class, size
and pixel sums) is added up per bundle into one `statistics.Summary` on the
``summary`` output, instead of sending each image through a Beam step per
statistic.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import os
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from kiln import transforms
from kiln.errors import unexpected
from kiln.pipeline import (
    moves,
    record_index,
    stamp_disagreements,
    storage,
    target_rows,
    versioning,
)
from kiln.pipeline.box_convention import BoxEvidence
from kiln.pipeline.error_report import DroppedFile
from kiln.pipeline.incremental import (
    BASE_DROPPED,
    BASE_MASK_STAMPS,
    STAMP_UNCHANGED,
    BaseFiles,
    BaseShard,
    base_masks,
    frame_starts,
)
from kiln.pipeline.listing import read_uri
from kiln.pipeline.pixel_budget import PixelBudget
from kiln.pipeline.progress import FileCounter
from kiln.pipeline.record_index import IndexRow
from kiln.pipeline.relabel import FrameRelabel, Relabel
from kiln.pipeline.sharding import ReusedRun, RunWriter, sort_key
from kiln.pipeline.splits import SplitPolicy
from kiln.pipeline.statistics import PixelSums, Summary, TargetCounts, pixel_sums
from kiln.pipeline.targets import (
    BadAnnotation,
    ListedTargets,
    MaskFiles,
    TargetCodec,
    location_free,
)
from kiln.schemas import INDEX_FILENAME, RECORD, schema_for
from kiln.transforms import opencv_log

if TYPE_CHECKING:
    from kiln.pipeline.config import EncodingConfig, ImageConfig

logger = logging.getLogger(__name__)

DROPPED = "dropped"
SUMMARY = "summary"
REUSED = "reused"
DEFERRED = "deferred"
BASE_READS = "base_reads"
STAMP_DISAGREEMENTS = "stamp_disagreements"
# Marks a `TransformAborted` in the job's error, however the runner wrapped
# it (a worker process's error arrives as text), for the launcher's one line.
TRANSFORM_ABORTED = "stopped the job: "


class TransformAborted(Exception):
    """A transform raised what is not an Exception (SystemExit,
    KeyboardInterrupt, a BaseException of its own): a bug in it, not a bad
    file, so the job stops rather than dropping the file. The message
    starts with `TRANSFORM_ABORTED`, then names the transform, its module
    and line, what it raised and the file (`_aborted`). A real Ctrl-C
    raised inside a transform arrives so too; the launcher, which saw the
    signal, reports it as an interruption."""


class ProcessedImage(NamedTuple):
    """One image, stored: the serialized record and what the job counts."""

    key: str
    label: int
    split: str  # from the source, or drawn by the `SplitPolicy`
    sha256: str  # hex sha256 of the source file's bytes
    record: bytes  # serialized tf.train.Example (the dataset's `kiln.schemas.Schema`)
    height: int
    width: int
    pixel_sums: PixelSums
    index_entry: bytes = b""  # its `record_index.entry`
    targets: TargetCounts | None = None  # datasets with targets: what `Summary` counts


class Reuse(NamedTuple):
    """Where a reused record is in the base: its shard file and position."""

    shard: str
    position: int


class Outcome(NamedTuple):
    """What processing one file produced: an image or a dropped row, and
    the file's entry hash for the version. A reused image (`reused` set)
    has no record bytes: they are copied from the base (with `relabelled`,
    and its class ids rewritten as they are: `relabel.FrameRelabel`)."""

    image: ProcessedImage | None
    dropped: DroppedFile | None
    entry_hash: int
    reused: Reuse | None = None
    # Datasets with boxes: what the listed boxes say about their convention
    # (None for a file not decoded: unread, undecodable, reused or relabelled).
    boxes: BoxEvidence | None = None
    # The record is the base's with this build's class ids (`relabel`): not decoded.
    relabelled: bool = False
    # The record is a base record of the same bytes under another key, rewritten (`moves`).
    moved: bool = False
    # The file's sha256, when it is handed on to be matched with the base
    # records it may have moved from (`moves`), or, with `wanted`, to be
    # rewritten from that base record once its shard is read (a gzip base):
    # nothing else is set then.
    deferred: str | None = None
    wanted: Reuse | None = None
    # Stored or dropped without the file being read: its stamp is the
    # base's (`incremental.STAMP_UNCHANGED`), its sha256 the base row's; or
    # dropped as the base dropped the same bytes (`incremental.BASE_DROPPED`).
    unread: bool = False
    # Mask files its targets name that were read, and that were not (their
    # stamps the base's, their sha256 the base row's: `incremental.base_masks`).
    masks_read: int = 0
    masks_not_read: int = 0
    # The file and mask files it read that were not as listed (`stamp_disagreements`).
    disagreements: tuple[stamp_disagreements.StampDisagreement, ...] = ()


class ImageProcessor:
    """Turns one listed file into a stored record. Pure and thread-safe.

    Args:
      chain: The offline transforms.
      image: The ``image`` config (channels, max_pixels, min_size).
      encoding: The ``encoding`` config (format, quality).
      class_names: Sorted class names (label id -> name, for the version).
      splits: Assigns each stored image its split.
      targets: Loads and encodes the targets of a dataset with ``targets:``;
        None for classification (the records of `kiln.schemas.RECORD`).
      base_class_names: An incremental build's base version's class names:
        when they differ from `class_names`, records whose class ids alone
        changed are rewritten from the base's (`relabel`), not decoded; a
        moved file's record is rewritten with them (`moves`).
    """

    def __init__(
        self,
        chain: transforms.Chain,
        image: ImageConfig,
        encoding: EncodingConfig,
        class_names: Sequence[str],
        splits: SplitPolicy,
        targets: TargetCodec | None = None,
        base_class_names: Sequence[str] | None = None,
    ):
        self._chain = chain
        self._codec = targets
        self._schema = RECORD if targets is None else schema_for(targets.config)
        self._splits = splits
        self._channels = image.channels
        self._max_pixels = image.max_pixels
        self._min_size = image.min_size
        self._scaled_decode = image.jpeg_scaled_decode
        self._format = encoding.format
        self._quality = encoding.quality
        self._class_names = list(class_names)
        self._relabel = None
        # The base's ids -> this build's, for moved files: also when the lists
        # are the same (then it maps each id to itself).
        self._base_ids = None
        if base_class_names is not None:
            self._base_ids = Relabel(base_class_names, self._class_names, self._schema)
        self._same_classes = base_class_names is None or list(base_class_names) == self._class_names
        if (
            base_class_names is not None
            and list(base_class_names) != self._class_names
            and (targets is None or targets.config.mask is None)
        ):
            self._relabel = Relabel(base_class_names, self._class_names, self._schema)
        # Relabelled records keep their length: their ids are rewritten where
        # the shard writer copies their frames, not here.
        self._frame_relabel = None if self._relabel is None else self._relabel.frame_relabel()

    @property
    def frame_relabel(self) -> FrameRelabel | None:
        """What the shard writer rewrites relabelled records' class ids with
        (`sharding.ShardRuns`); None when they are rewritten here, or none is."""
        return self._frame_relabel

    def __call__(
        self,
        item: Mapping[str, Any],
        before_decoding: Callable[[int], None] | None = None,
        read_base: Callable[[str, int], bytes | None] | None = None,
        moved_candidate: Callable[[str], bool] | None = None,
        read_later: bool = False,
        read_sha256: str | None = None,
    ) -> Outcome:
        """`before_decoding`: see `transforms.decode_image`. `read_base`: a
        base record's bytes by shard and position, or None when it cannot
        be read (then the file is processed): for relabelling (`relabel`)
        and moved files (`moves`). `read_later`: instead of reading the
        base record the file's record would be rewritten from, hand the
        file on with where that record is (`Outcome.wanted`), to be run
        again with the record once its shard is read (a gzip-compressed
        base: `RewriteFromBaseShardsFn`). `moved_candidate`: whether a
        sha256 may be a base record's that moved: then a file no base
        record of its key serves is handed on (`Outcome.deferred`), not
        decoded.

        A file handed on is not read again unless no base record serves
        it: an item with ``moved_from`` (`incremental.JoinMoved`: its
        sha256, as read before, and the base rows of that sha256 whose keys
        are no longer listed), or given its `read_sha256` as read before.
        Nor is a file whose stamp is the one the base listed (size,
        modification time, a local file's inode and ctime:
        `incremental.STAMP_UNCHANGED`): its sha256 is its base
        row's, and it is read only if no base record serves it
        (`Outcome.unread` says it was not). The same holds for each mask
        file its targets name whose path and stamp are those the base
        listed (`incremental.base_masks`; counted in
        `Outcome.masks_read` and `Outcome.masks_not_read`). A file of a
        dataset without targets that the base dropped as undecodable, its
        stamp the one the base listed (`incremental.BASE_DROPPED`), is
        dropped again as the base dropped it, unread.

        Each file read (the image, a mask file) is compared as it is read
        with what the listing said of it: those that disagree are in
        `Outcome.disagreements` (`stamp_disagreements`)."""
        reads = _Reads(item)
        outcome = self._outcome(
            item, before_decoding, read_base, moved_candidate, read_later, read_sha256, reads
        )
        if reads.masks is not None:
            outcome = outcome._replace(
                masks_read=reads.masks.read_count, masks_not_read=reads.masks.unread_count
            )
        disagreements = reads.disagreements()
        if disagreements:
            outcome = outcome._replace(disagreements=disagreements)
        trusted = item.get(STAMP_UNCHANGED) or item.get(BASE_DROPPED)
        if trusted and not reads.files and outcome.deferred is None:
            return outcome._replace(unread=True)
        return outcome

    def _outcome(
        self,
        item: Mapping[str, Any],
        before_decoding: Callable[[int], None] | None,
        read_base: Callable[[str, int], bytes | None] | None,
        moved_candidate: Callable[[str], bool] | None,
        read_later: bool,
        read_sha256: str | None,
        reads: _Reads,
    ) -> Outcome:
        """`__call__`'s work; notes in `reads` each time it reads the file,
        and the mask files as last read."""
        key, uri, label = item["key"], read_uri(item["uri"]), int(item["label"])
        split = item.get("split")
        listed_text: str | None = item.get("targets")

        def entry(sha256: str | None, targets: str | None) -> int:
            name = self._class_names[label] if label >= 0 else None
            data = versioning.file_entry(key, name, split, sha256)
            return versioning.entry_hash(data if targets is None else [*data, targets])

        def unreadable(e: Exception) -> Outcome:
            # Its targets as listed, without where its masks are (not read).
            unread = None if listed_text is None else location_free(listed_text)
            return Outcome(
                None, DroppedFile(key, "read", "unreadable", uri, _describe(e)), entry(None, unread)
            )

        moved_from: tuple[str, Sequence[Any]] | None = item.get("moved_from")
        base: record_index.IndexRow | None = item.get("base")
        data: bytes | None = None
        dropped_before: tuple[str, str, str] | None = item.get(BASE_DROPPED)
        if dropped_before is not None and self._codec is None and base is None:
            # The bytes the base dropped as undecodable (its stamp the one
            # the base listed), and the same processing: the same drop.
            sha256, reason, message = dropped_before
            return Outcome(
                None,
                DroppedFile(key, "decode", reason, uri, message, sha256=sha256),
                entry(sha256, None),
            )
        if moved_from is not None:
            sha256 = moved_from[0]
        elif read_sha256 is not None:
            sha256 = read_sha256
        elif base is not None and item.get(STAMP_UNCHANGED):
            # The stamp the base listed: its bytes are taken to be the
            # base's, as the up-to-date stamp takes them.
            sha256 = base.sha256
        else:
            try:
                data = reads.read(uri)
            except Exception as e:  # permission denied, vanished, network: any I/O error
                return unreadable(e)
            sha256 = hashlib.sha256(data).hexdigest()
        listed = None
        inputs = record_index.inputs_fingerprint(item)
        if self._codec is not None and listed_text is not None:
            # Masks are read before the image is decoded: their sha256 is part
            # of the version entry and of the reuse key. Those whose stamps
            # are the base's are not: their sha256 is the base row's.
            known = {}
            if base is not None:
                known = base_masks(item.get(BASE_MASK_STAMPS, ()), base.masks)
            listed = reads.masks_of(self._codec.read(listed_text, item.get("mask_stamp"), known))
            inputs = record_index.inputs_fingerprint(
                dict(item, targets=self._codec.reuse_key(listed))
            )
        content = None if listed is None else listed.content

        evidence: BoxEvidence | None = None

        def drop(stage: str, reason: str, message: str) -> Outcome:
            return Outcome(
                None,
                DroppedFile(key, stage, reason, uri, message, sha256=sha256),
                entry(sha256, content),
                boxes=evidence,
            )

        if (
            base is not None
            and base.sha256 == sha256
            and base.inputs == inputs
            and (base.targets is None) == (self._codec is None)
        ):
            # Same bytes, same listing inputs (with targets: same annotations,
            # mask files and class ids), same processing (the launcher checked
            # the base's fingerprint): the record is the base's. Its index
            # line too, but for a base line that keeps no mask sha256s (a
            # kiln before kept them): a build from scratch writes them.
            masks = None if listed is None else listed.mask_sha256s
            counts = _named_now(base.targets, listed)
            index_entry = (
                base.reused_entry()
                if base.masks == masks and counts is base.targets
                else base._replace(masks=masks, targets=counts, line="").entry()
            )
            return Outcome(
                ProcessedImage(
                    key,
                    label,
                    self._splits.assign(key, sha256, split),
                    sha256,
                    b"",
                    base.height,
                    base.width,
                    PixelSums(base.pixels, base.sums, base.squares),
                    index_entry,
                    counts,
                ),
                None,
                entry(sha256, content),
                Reuse(base.shard, base.position),
            )

        def rewritten(rows: Sequence[IndexRow], moved: bool) -> Outcome | None:
            """The record of the first of the base `rows` that can be read,
            rewritten with this build's key and class ids (relabelled, or
            moved), stored as it comes; or the file handed on to read it
            later. None: no row serves."""
            for row in rows:
                if read_later:
                    return Outcome(
                        None, None, 0, deferred=sha256, wanted=Reuse(row.shard, row.position)
                    )
                serialized = read_base(row.shard, row.position) if read_base else None
                found = None if serialized is None else self._rewrite(serialized, row, label, key)
                if found is None:
                    continue
                record, counts = found
                sums = PixelSums(row.pixels, row.sums, row.squares)
                stored = self._stored(
                    item, label, sha256, inputs, record, row.height, row.width, sums, counts, listed
                )
                return Outcome(
                    stored, None, entry(sha256, content), relabelled=not moved, moved=moved
                )
            return None

        reads_base = read_base is not None or read_later
        if base is not None and base.sha256 == sha256 and reads_base:
            relabelled = self._relabelled(item, listed, label, base)
            if relabelled and self._relabel is not None and self._frame_relabel is not None:
                # Copied from the base like a reused record, its ids
                # rewritten in the copy; what it counts is this build's.
                sums = PixelSums(base.pixels, base.sums, base.squares)
                counts = self._relabel.counts(base.targets)
                stored = self._stored(
                    item, label, sha256, inputs, b"", base.height, base.width, sums, counts, listed
                )
                return Outcome(
                    stored,
                    None,
                    entry(sha256, content),
                    Reuse(base.shard, base.position),
                    relabelled=True,
                )
            outcome = rewritten(relabelled, moved=False)
            if outcome is not None:
                return outcome
        if moved_from is not None and reads_base:
            rows = [IndexRow(*row) for row in moved_from[1]]
            outcome = rewritten(self._moved(item, listed, label, sha256, rows), moved=True)
            if outcome is not None:
                return outcome
        elif moved_candidate is not None and moved_candidate(sha256):
            return Outcome(None, None, 0, deferred=sha256)

        if data is None:  # handed on or trusted, and no base record served it: read it now
            try:
                data = reads.read(uri)
            except Exception as e:
                return unreadable(e)
            sha256 = hashlib.sha256(data).hexdigest()  # changed since, if it differs
        if self._codec is not None and listed is not None and listed.masks.unread_count:
            # Decoded: the masks not read are needed, and their content is
            # what they hold now (changed since, if it differs).
            listed = reads.masks_of(self._codec.completed(listed))
            inputs = record_index.inputs_fingerprint(
                dict(item, targets=self._codec.reuse_key(listed))
            )
            content = listed.content

        try:
            decoded = self._decode(data, before_decoding)
        except transforms.DecodeError as e:
            return drop("decode", e.reason, str(e))
        orientation = decoded.orientation  # the file's, for messages

        loaded = None
        if self._codec is not None:
            if listed is None:
                listed = self._codec.read("{}")
            try:
                # Before the box evidence: boxes of an image whose declared
                # size says they are in another frame say nothing of their order.
                self._codec.check_declared_size(listed, decoded)
            except BadAnnotation as e:
                return drop("targets", e.reason, e.located)
            # Annotations drawn upright: the image as they see it (`TargetCodec.frame`).
            decoded = self._codec.frame(decoded)
            # Before the per-object checks: a box they refuse is evidence too.
            evidence = self._codec.box_evidence(listed, *decoded.stored_size)
            try:
                loaded = self._codec.load(listed, *decoded.stored_size, orientation=orientation)
            except BadAnnotation as e:
                return drop("targets", e.reason, e.located)

        moved = None
        decoded_size = transforms.decode_scale.upright_size(decoded)
        try:
            if loaded is None or loaded.geometry is None:
                chain = self._chain
                if decoded.reduction > 1:
                    # Resized to the size the full decode gets, not to what the
                    # first resize would make of the reduced size (rounded otherwise).
                    chain = transforms.decode_scale.with_resize_to(chain, *decoded_size)
                image = chain(decoded.image)
            else:
                image, moved = self._apply(decoded, loaded.geometry)
            _check_output(image, self._channels)
        except Exception as e:  # TransformError, or a plugin's own failure
            return drop("transform", "transform_failed", _describe(e))
        except BaseException as e:  # sys.exit() in a plugin: not this file's problem
            raise TransformAborted(_aborted(e, uri)) from e

        height, width, channels = image.shape
        fields: dict[str, Any] = {
            "height": height,
            "width": width,
            "channels": channels,
            "key": key,
            "sha256": sha256,
        }
        if label >= 0:
            fields["label"] = label
        counts = None
        try:
            fields["image"] = transforms.encode_image(
                image, format=self._format, quality=self._quality
            )
            if self._codec is not None and loaded is not None:
                target_fields, counts = self._codec.features(
                    loaded, moved, label if label >= 0 else None, height, width
                )
                fields.update(target_fields)
        except transforms.EncodeError as e:  # too large for the format (a mask's too)
            resized = ""
            if (height, width) != decoded_size:
                resized = f"; the transforms made it from {decoded_size[1]}x{decoded_size[0]}"
            return drop("encode", "encode_failed", f"{e}{resized}")
        sums = pixel_sums(image)
        record = self._schema.encode(fields)
        return Outcome(
            self._stored(item, label, sha256, inputs, record, height, width, sums, counts, listed),
            None,
            entry(sha256, content),
            boxes=evidence,
        )

    def _stored(
        self,
        item: Mapping[str, Any],
        label: int,
        sha256: str,
        inputs: str,
        record: bytes,
        height: int,
        width: int,
        sums: PixelSums,
        counts: TargetCounts | None,
        listed: ListedTargets | None,
    ) -> ProcessedImage:
        """A record to store (encoded here, or relabelled), with its split
        and its entry in the record index (`listed`: the targets, whose
        mask files' sha256s it keeps)."""
        key = item["key"]
        counts = _named_now(counts, listed)
        return ProcessedImage(
            key,
            label,
            self._splits.assign(key, sha256, item.get("split")),
            sha256,
            record,
            height,
            width,
            sums,
            record_index.entry(
                key=key,
                sha256=sha256,
                inputs=inputs,
                label=label,
                height=height,
                width=width,
                pixels=sums.pixels,
                sums=sums.sums,
                squares=sums.squares,
                targets=counts,
                masks=None if listed is None else listed.mask_sha256s,
            ),
            counts,
        )

    def _relabelled(
        self,
        item: Mapping[str, Any],
        listed: ListedTargets | None,
        label: int,
        base: IndexRow,
    ) -> list[IndexRow]:
        """``[base]``, the base's row of a file with the same bytes, when its
        record is to be rewritten with this build's class ids (`_rewrite`);
        empty when its listing inputs differ by more than class ids, or it
        cannot be relabelled (`relabel`: then the file is processed)."""
        relabel = self._relabel
        if relabel is None or (base.targets is None) != (self._codec is None):
            return []
        names = [] if label < 0 else [self._class_names[label]]
        if listed is not None:
            names += target_rows.class_names(listed.row)
        if not relabel.covers(names):
            return []
        # The listing inputs as the base computed them: with its class ids.
        as_base = dict(item, label=relabel.base_label(label))
        if listed is not None and self._codec is not None:
            as_base["targets"] = self._codec.reuse_key(listed, relabel.base_ids)
        if record_index.inputs_fingerprint(as_base) != base.inputs:
            return []
        return [base]

    def _moved(
        self,
        item: Mapping[str, Any],
        listed: ListedTargets | None,
        label: int,
        sha256: str,
        rows: Sequence[IndexRow],
    ) -> list[IndexRow]:
        """The base rows a file that moved may have its record rewritten
        from (`_rewrite`), in the order they are tried: those of `rows`
        (`moves.candidates`) of the same bytes whose listing inputs equal
        the file's with the key and class id replaced by the row's (and
        with targets, its annotations' class ids by the base's). Empty when
        none can serve (`moves`: then the file is processed)."""
        ids = self._base_ids
        if ids is None:
            return []
        codec = self._codec
        if codec is not None and codec.config.mask is not None and not self._same_classes:
            return []  # a semantic mask's pixel values are ids of the list (`relabel`)
        names = [] if listed is None else target_rows.class_names(listed.row)
        if not ids.covers(names):
            return []
        base_targets = None
        if listed is not None and codec is not None:
            base_targets = codec.reuse_key(listed, ids.base_ids)
        name = self._class_names[label] if label >= 0 else None
        serving = []
        for row in moves.candidates(rows, sha256):
            if (row.targets is None) != (codec is None):
                continue
            if codec is not None and ids.base_name(row.label) != name:
                continue  # the image's class is among the classes its statistics count
            as_base = dict(item, key=row.key, label=row.label)
            if base_targets is not None:
                as_base["targets"] = base_targets
            if record_index.inputs_fingerprint(as_base) == row.inputs:
                serving.append(row)
        return serving

    def _rewrite(
        self, serialized: bytes, row: IndexRow, label: int, key: str
    ) -> tuple[bytes, TargetCounts | None] | None:
        """The base's record of `row` (relabelled: of the file's own key;
        moved: of another) as the record of `key` with this build's class
        ids, and its statistics counts; None when it is not the record the
        index says (then the next row is tried, or the file processed)."""
        ids = self._base_ids
        if ids is None:
            return None
        try:
            record = ids.record(serialized, label, key, base_key=row.key)
        except (KeyError, ValueError):  # not the record the index says (SchemaError is one)
            return None
        return record, ids.counts(row.targets)

    def _decode(
        self, data: bytes, before_decoding: Callable[[int], None] | None
    ) -> transforms.DecodedImage:
        """The upright image, the EXIF orientation that made it upright
        (targets annotated on the stored pixels need it), the stored size,
        and the factor a JPEG was decoded smaller by (``jpeg_scaled_decode``)."""
        reduction = None
        if self._scaled_decode:
            reduction = functools.partial(transforms.decode_scale.jpeg_reduction, self._chain)
        return transforms.decode_with_orientation(
            data,
            channels=self._channels,
            max_pixels=self._max_pixels,
            min_size=self._min_size,
            before_decoding=before_decoding,
            jpeg_reduction=reduction,
        )

    def _apply(
        self, decoded: transforms.DecodedImage, geometry: transforms.Targets
    ) -> tuple[np.ndarray, transforms.Targets]:
        """Moves targets annotated on the stored pixels with the EXIF
        orientation (already applied to the image), the reduction of a JPEG
        decoded smaller, and the transforms."""
        if self._codec is None:
            raise ValueError("a dataset without targets has no geometry to move")
        targets = self._codec.config
        min_visibility = targets.boxes.min_visibility if targets.boxes is not None else 0.0
        fill = 0
        if targets.mask is not None and targets.mask.ignore_value is not None:
            fill = targets.mask.ignore_value
        if decoded.reduction > 1:
            return transforms.decode_scale.apply_reduced(
                self._chain, decoded, geometry, min_visibility=min_visibility, mask_fill=fill
            )
        geometry = transforms.orient_targets(geometry, decoded.orientation, *decoded.stored_size)
        return self._chain.apply(
            decoded.image, geometry, min_visibility=min_visibility, mask_fill=fill
        )


class _Reads:
    """What `ImageProcessor` read of one listed file (`item`): its URI each
    time it read the file, what each read found of the file that the
    listing did not say, and the mask files as last read."""

    def __init__(self, item: Mapping[str, Any]) -> None:
        self.files: list[str] = []
        self.masks: MaskFiles | None = None
        self._item = item
        self._found: list[stamp_disagreements.StampDisagreement] = []

    def read(self, uri: str) -> bytes:
        """The file's bytes (`_read`), noted, and compared with its listed
        size and modification time (`stamp_disagreements.compare`).

        Raises:
          Exception: any I/O error of the read (the file vanished: noted).
        """
        self.files.append(uri)
        key = self._item["key"]
        listed = stamp_disagreements.listed_stamp(self._item.get("size"), self._item.get("mtime"))
        try:
            data, seen = _read(uri)
        except Exception as e:
            if storage.is_missing_input(e):
                self._note(stamp_disagreements.compare(key, uri, listed, None))
            raise
        self._note(stamp_disagreements.compare(key, uri, listed, seen))
        return data

    def _note(self, found: stamp_disagreements.StampDisagreement | None) -> None:
        if found is not None:
            self._found.append(found)

    def masks_of(self, listed: ListedTargets) -> ListedTargets:
        """Notes `listed`'s mask files; returns `listed`."""
        self.masks = listed.masks
        return listed

    def disagreements(self) -> tuple[stamp_disagreements.StampDisagreement, ...]:
        """The files read (the file, its mask files) that were not as listed."""
        masks = [] if self.masks is None else self.masks.disagreements(self._item["key"])
        return tuple(dict.fromkeys([*self._found, *masks]))


def _likely_reused(item: Mapping[str, Any]) -> bool:
    moved_from = item.get("moved_from")
    return item.get("base") is not None or bool(moved_from and moved_from[1])


def _read(uri: str) -> tuple[bytes, stamp_disagreements.Seen]:
    """A file's bytes, and its size and modification time as the read found
    them (`storage.input_stamp`: no request, no stat more)."""
    with storage.open_input(uri) as f:
        data = f.read()
        return data, storage.input_stamp(f, uri, len(data))


def _check_output(image: Any, channels: int) -> None:
    if not (
        isinstance(image, np.ndarray)
        and image.dtype == np.uint8
        and image.ndim == 3
        and image.shape[2] == channels
        and image.shape[0] > 0
        and image.shape[1] > 0
    ):
        described = (
            f"{image.dtype} array of shape {image.shape}"
            if isinstance(image, np.ndarray)
            else type(image).__name__
        )
        raise transforms.TransformError(
            f"the transforms returned a {described}; expected uint8 HxWx{channels}"
        )


def _aborted(error: BaseException, uri: str) -> str:
    """`TransformAborted`'s message: ``stopped the job: offline transform
    'name' (module 'm', m.py, line 9) raised SystemExit: 0 on <uri>``.
    The transform is the innermost `transforms.Transform` in the traceback
    (none: the chain's own code raised), its line the innermost frame in its
    function's file."""
    name = None
    tb = error.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, transforms.Transform):
            name = owner.name
        tb = tb.tb_next
    what = "a transform"
    if name is not None:
        function = transforms.get(name)
        where = [f"module {function.__module__!r}"]
        filename = getattr(getattr(function, "__code__", None), "co_filename", None)
        lines = [
            f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == filename
        ]
        if filename and lines:
            where.append(f"{os.path.basename(filename)}, line {lines[-1]}")
        what = f"offline transform {name!r} ({', '.join(where)})"
    return f"{TRANSFORM_ABORTED}{what} raised {unexpected(error)} on {uri}"


def _named_now(counts: TargetCounts | None, listed: ListedTargets | None) -> TargetCounts | None:
    """`counts` (a record's, perhaps kept from the base) with its dropped
    objects' messages naming each object as this build's listing does
    (`target_rows.renamed`): the base's file may have written the same
    annotations in another order. `counts` itself when nothing changes."""
    if counts is None or listed is None or not counts.dropped_objects:
        return counts
    objects = listed.row.get("objects", ())
    dropped = tuple(
        (index, reason, target_rows.renamed(message, objects))
        for index, reason, message in counts.dropped_objects
    )
    return counts if dropped == counts.dropped_objects else counts._replace(dropped_objects=dropped)


def _describe(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class _ImageStepFn(beam.DoFn):
    """What the image steps share (`ProcessImagesFn`, `RewriteFromBaseShardsFn`):
    the per-file work (`ImageProcessor`), the thread pool, the sorted runs
    the records go into, the per-bundle `Summary` and the counters; and
    `_take`, which counts each finished file and stores, drops or hands it
    on. Subclasses define `process`, for their kind of element.
    """

    # Whether the files whose records would be rewritten from a record of a
    # compressed base are handed on (`BASE_READS`) rather than read here.
    HANDS_ON_BASE_READS = True

    IN_FLIGHT_PER_THREAD = 2
    # Pixels being decoded at once across the threads (`PixelBudget`): about
    # 1.5 GB of 8-bit RGB work, or one image up to image.max_pixels alone.
    PIXELS_IN_FLIGHT = 2**27

    def __init__(
        self,
        processor: ImageProcessor,
        threads: int,
        runs_folder: str,
        run_bytes: int,
        progress_path: str | None = None,
        base: BaseFiles | None = None,
    ):
        self._processor = processor
        self._base = base
        # One record of a compressed base is not read alone: the files whose
        # records would be rewritten from one are handed on (`BASE_READS`).
        self._read_later = (
            self.HANDS_ON_BASE_READS and base is not None and base.compression is not None
        )
        self._threads = max(1, int(threads))
        self._runs = RunWriter(runs_folder, run_bytes)
        self._counter = FileCounter(progress_path) if progress_path else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._opencv_threads: int | None = None
        self._opencv_log_level: int | None = None
        # Tasks on the pool: future -> (files, window, timestamp), in submission order.
        self._pending: dict[concurrent.futures.Future, tuple] = {}
        self._summary = Summary()
        # Per base shard and whether relabelled: the reused records'
        # ReusedRun entries and contents.
        self._reuse: dict[tuple[str, bool], tuple[list, list]] = {}
        self._base_checks: Mapping[str, tuple[str, bytes]] = {}
        self._frames: dict[str, Any] = {}  # base shard -> `incremental.frame_starts`
        self._read = Metrics.counter("kiln", "files_read")
        self._decoded = Metrics.counter("kiln", "images_decoded")
        self._bytes = Metrics.counter("kiln", "bytes_read")
        self._reused = Metrics.counter("kiln", "records_reused")
        self._relabelled = Metrics.counter("kiln", "records_relabelled")
        self._moved = Metrics.counter("kiln", "records_moved")
        self._digests: moves.Digests | None = None
        self._changed = Metrics.counter("kiln", "images_changed")
        self._added = Metrics.counter("kiln", "images_added")
        self._reprocessed = Metrics.counter("kiln", "images_reprocessed")
        self._not_trusted = Metrics.counter("kiln", "records_not_trusted")
        self._not_read = Metrics.counter("kiln", "files_not_read")
        self._dropped_again = Metrics.counter("kiln", "files_dropped_again")
        self._masks_read = Metrics.counter("kiln", "masks_read")
        self._masks_not_read = Metrics.counter("kiln", "masks_not_read")
        self._shards_read = Metrics.counter("kiln", "base_shards_read")
        self._disagreed = Metrics.counter("kiln", "stamp_disagreements")

    def setup(self):
        # The parallelism is across images (this pool; on Dataflow, a worker
        # process per vCPU): OpenCV splitting single calls over every core
        # as well would oversubscribe them. Restored in teardown.
        self._opencv_threads = transforms.set_opencv_threads(1)
        if opencv_log.ENV not in os.environ:  # the user's level wins
            # OpenCV logs a line, naming no file, about some files it fails
            # on or warns about (TIFF errors, an encoder's refusal). Every
            # file it fails on is in errors.jsonl with its key and the
            # reason; the lines would only bury a build's own output. Only
            # the lines before an abort are kept. Restored in teardown.
            self._opencv_log_level = transforms.set_opencv_log_level(opencv_log.FATAL)
        if self._threads > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="kiln-image"
            )
            self._budget = PixelBudget(self.PIXELS_IN_FLIGHT)
        if self._counter is not None:
            self._counter.open()

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._counter is not None:
            self._counter.close()
        if self._opencv_threads is not None:
            transforms.set_opencv_threads(self._opencv_threads)
            self._opencv_threads = None
        if self._opencv_log_level is not None:
            transforms.set_opencv_log_level(self._opencv_log_level)
            self._opencv_log_level = None

    def start_bundle(self):
        self._pending = {}  # a failed bundle's leftovers are dropped
        self._runs.reset()
        self._summary = Summary()
        self._reuse = {}
        self._frames = {}

    def finish_bundle(self):
        while self._pending:
            yield from self._take_done(wait=True)
        yield from self._runs.flush()
        if self._counter is not None:
            self._counter.flush()
        # The job runs in the global window (it never windows its data).
        yield beam.pvalue.TaggedOutput(
            SUMMARY, WindowedValue(self._summary, MIN_TIMESTAMP, (GlobalWindow(),))
        )
        base = self._base
        for (shard, relabelled), (entries, contents) in sorted(self._reuse.items()):
            if base is None:
                raise ValueError("records reused without a base")
            order = sorted(range(len(entries)), key=lambda i: entries[i][:2])
            run = ReusedRun(
                FileSystems.join(base.folder, shard),
                base.compression,
                tuple(entries[i] for i in order),
                tuple(contents[i] for i in order),
                relabelled,
            )
            yield beam.pvalue.TaggedOutput(
                REUSED, WindowedValue(run, MIN_TIMESTAMP, (GlobalWindow(),))
            )
        self._reuse = {}

    def _starts(self, shard: str):
        """Where the base shard's frames start (`incremental.frame_starts`)."""
        starts = self._frames.get(shard)
        if starts is None:
            _, frames = self._base_checks.get(shard, ("", b""))
            starts = self._frames[shard] = frame_starts(frames)
        return starts

    def _base_shard(self, shard: str) -> BaseShard:
        """A reader of the base's `shard`, at the frames its check found."""
        if self._base is None:
            raise ValueError("a base shard read without a base")
        return BaseShard(
            FileSystems.join(self._base.folder, shard), self._base.compression, self._starts(shard)
        )

    def _take_done(self, wait: bool):
        """Takes every finished file; with `wait`, waits for at least one first."""
        if wait:
            concurrent.futures.wait(self._pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in [future for future in self._pending if future.done()]:
            task, window, timestamp = self._pending.pop(future)
            for item, outcome in zip(task, future.result(), strict=True):
                yield from self._take(item, outcome, window, timestamp)

    def _take(self, item: Mapping[str, Any], outcome: Outcome, window, timestamp):
        """Counts one finished file and stores or drops it. Outputs carry the
        input's window and timestamp themselves (they may leave in a later
        `process` call or in `finish_bundle`). A deferred file is counted
        where it is processed (`incremental.JoinMoved`); its mask files
        are counted as read where they are (a deferred file's, again where
        it is processed). A file read that was not as listed is logged and
        handed on (`STAMP_DISAGREEMENTS`) wherever it was read."""
        for found in outcome.disagreements:
            self._disagreed.inc()
            logger.warning(
                "%s: the next build reads it again and does not take this version as up to date",
                found.describe(),
            )
            yield beam.pvalue.TaggedOutput(
                STAMP_DISAGREEMENTS, WindowedValue(found, timestamp, (window,))
            )
        if outcome.masks_read:
            self._masks_read.inc(outcome.masks_read)
        if outcome.masks_not_read and outcome.wanted is None and outcome.deferred is None:
            self._masks_not_read.inc(outcome.masks_not_read)
        if outcome.wanted is not None:
            shard, position = outcome.wanted
            # (base shard, (position, sha256, file)): `RewriteFromBaseShards`.
            waiting = (shard, (position, outcome.deferred, item))
            yield beam.pvalue.TaggedOutput(BASE_READS, WindowedValue(waiting, timestamp, (window,)))
            return
        if outcome.deferred is not None:
            yield beam.pvalue.TaggedOutput(
                DEFERRED, WindowedValue((outcome.deferred, item), timestamp, (window,))
            )
            return
        self._summary.add(outcome.entry_hash, outcome.image, outcome.boxes)
        if self._counter is not None:
            self._counter.add()
        if outcome.unread:
            # Dropped again as the base dropped it, or its record reused.
            (self._not_read if outcome.image is not None else self._dropped_again).inc()
        elif outcome.dropped is None or outcome.dropped.stage != "read":
            self._read.inc()
            self._bytes.inc(int(item.get("size", 0)))
        if outcome.dropped is not None:
            Metrics.counter("kiln", f"dropped_{outcome.dropped.reason}").inc()
            yield beam.pvalue.TaggedOutput(
                DROPPED, WindowedValue(outcome.dropped, timestamp, (window,))
            )
            return
        image = outcome.image
        if image is None:
            raise ValueError("an Outcome holds an image or a dropped file, never neither")
        if outcome.reused is not None:
            (self._relabelled if outcome.relabelled else self._reused).inc()
            shard, position = outcome.reused
            starts = self._starts(shard)
            start = starts[position]
            entries, contents = self._reuse.setdefault((shard, outcome.relabelled), ([], []))
            # Plain tuples: Beam's coder writes them without pickling.
            entries.append(
                (
                    image.split,
                    sort_key(image.key),
                    start,
                    starts[position + 1] - start,
                    image.index_entry,
                )
            )
            contents.append((image.sha256, image.key))
            return
        if outcome.relabelled:
            self._relabelled.inc()
        elif outcome.moved:
            self._moved.inc()
        else:
            if "base" in item:  # an incremental build: say why this one was processed
                if item["base"] is not None:
                    self._changed.inc()
                elif item.get(record_index.BASE_UNTRUSTED):  # in the base, but not usable
                    self._reprocessed.inc()
                else:
                    self._added.inc()
            self._decoded.inc()
        if self._runs.add(
            window,
            image.split,
            sort_key(image.key),
            image.record,
            image.sha256,
            image.key,
            image.index_entry,
        ):
            yield from self._runs.flush()


class ProcessImagesFn(_ImageStepFn):
    """Groups of listed files -> sorted runs of their records (`SpilledRun`);
    tagged outputs ``dropped`` (DroppedFile), ``summary`` (one `Summary`
    per bundle), ``reused`` (a `sharding.ReusedRun` per base shard the
    bundle reuses records of, and one more per base shard it relabels
    records of as they are copied), the last two emitted when the bundle
    finishes (a retried bundle's outputs, summary and runs included, are
    discarded with it), ``deferred``: ``(sha256, file)`` for the files
    that may have moved (`moves`), to be joined with the base's records of
    their bytes and processed by this DoFn again (`incremental.JoinMoved`),
    and ``base_reads``: with a gzip-compressed base, ``(base shard,
    (position, sha256, file))`` for the files whose record is rewritten
    from that base record (moved, or relabelled where an id changes its
    varint width: `relabel`), read shard by shard (`RewriteFromBaseShards`);
    and ``stamp_disagreements``: each file read (an image, a mask file)
    that was not as the listing stamped it
    (`stamp_disagreements.StampDisagreement`, also logged as a warning).

    With a base, the ``base_checks`` side input maps each base file to the
    problem its check found ("" when none) and, for a shard, where its
    records' frames are (`incremental.VerifyBaseFiles`): the records of a
    shard that failed are processed, and none is reused if the index
    failed. The ``moved_digests`` side input, when given, holds the
    `moves.digest_prefix` of every base record whose key is no longer
    listed: a file of those bytes is deferred.

    Each input element is a list of listed files (the listing has several
    per line), and each stored image goes straight into a `RunWriter`, so
    no Beam step sees single images: every step an element passes through
    costs time on the bundle's thread, which holds the GIL the image
    threads need too.

    With one thread, each file is processed in `process`. With more, files
    are handed to a thread pool as they arrive (an element's files with a
    base row as one task, every other file as a task of its own), at most
    `IN_FLIGHT_PER_THREAD` tasks per thread, and their results are taken as
    they complete, in whatever order (the rest at the end of the bundle).
    Every thread stays busy across elements, unlike processing a batch at a
    time, where threads idle at the end of every batch; a file that takes
    long (an image decoded among records reused from a base) does not hold
    back the files after it, as it would if results were taken in input
    order; and files that are only hashed pay the hand-over to the pool
    once per element. The order results are taken in changes nothing
    written: runs are sorted, the summary merges in any order, and the
    reports are sorted.

    The pool is created in `setup`, once per DoFn instance (Beam reuses
    instances across bundles). Counters are incremented on the bundle's
    thread: Beam's metrics belong to the thread that runs the bundle.
    """

    def process(
        self,
        files: Sequence[Mapping[str, Any]],
        window=beam.DoFn.WindowParam,
        timestamp=beam.DoFn.TimestampParam,
        base_checks: Mapping[str, tuple[str, bytes]] | None = None,
        moved_digests: bytes | None = None,
    ):
        if moved_digests is not None and self._digests is None:
            # The same for every element of the job: wrapped once per instance.
            self._digests = moves.Digests(moved_digests)
        if base_checks is not None:
            # Kept for results taken later in the bundle (finish_bundle has
            # no side inputs); the same for every element of the job.
            self._base_checks = base_checks
            files = [self._trusted(item, base_checks) for item in files]
        if self._pool is None:
            for item in files:
                outcome = self._processor(
                    item,
                    read_base=self._base_reader(),
                    moved_candidate=self._moved_candidate(),
                    read_later=self._read_later,
                )
                yield from self._take(item, outcome, window, timestamp)
            return
        # A file with a base row is most likely reused: hashed, not decoded,
        # a fraction of a millisecond (a file with rows it may have moved
        # from, rewritten: not even hashed). The element's such files go to
        # the pool as one task, so the hand-over (a queue, a future, waking
        # this thread) is paid once for them, not per file; every other file
        # is a task of its own (decoded: milliseconds each, spread over the threads).
        likely_reused = [item for item in files if _likely_reused(item)]
        tasks = [[item] for item in files if not _likely_reused(item)]
        if likely_reused:
            tasks.append(likely_reused)
        limit = self.IN_FLIGHT_PER_THREAD * self._threads
        for task in tasks:
            self._pending[self._pool.submit(self._process_in_budget, task)] = (
                task,
                window,
                timestamp,
            )
            yield from self._take_done(wait=len(self._pending) > limit)

    def _trusted(
        self, item: Mapping[str, Any], checks: Mapping[str, tuple[str, bytes]]
    ) -> Mapping[str, Any]:
        """The item, without its base row if the base's index or the row's
        shard failed its check, or the shard has no record at the row's
        position (then the image is processed); with ``moved_from``, only
        the rows that pass the same checks."""
        if item.get("base") is not None and not self._trusted_row(item["base"], checks):
            self._not_trusted.inc()
            # Its stamps say nothing without the row: the file and its masks are read.
            item = {
                name: value
                for name, value in item.items()
                if name not in (STAMP_UNCHANGED, BASE_MASK_STAMPS)
            }
            item["base"] = None
            item[record_index.BASE_UNTRUSTED] = True
        moved_from = item.get("moved_from")
        if moved_from is not None:
            sha256, rows = moved_from
            rows = tuple(row for row in rows if self._trusted_row(IndexRow(*row), checks))
            item = dict(item, moved_from=(sha256, rows))
        return item

    def _trusted_row(self, row: IndexRow, checks: Mapping[str, tuple[str, bytes]]) -> bool:
        index_problem, _ = checks.get(INDEX_FILENAME, ("", b""))
        shard_problem, _ = checks.get(row.shard, ("missing from the base's kiln.json", b""))
        return (
            not index_problem
            and not shard_problem
            and 0 <= row.position < len(self._starts(row.shard)) - 1
        )

    def _process_in_budget(self, task: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        # On a pool thread: a file's pixels count from its header check to
        # the end of its encoding.
        outcomes = []
        read_base = self._base_reader()
        moved_candidate = self._moved_candidate()
        for item in task:
            with self._budget.reservation() as reservation:
                outcomes.append(
                    self._processor(
                        item,
                        before_decoding=reservation.acquire,
                        read_base=read_base,
                        moved_candidate=moved_candidate,
                        read_later=self._read_later,
                    )
                )
        return outcomes

    def _moved_candidate(self) -> Callable[[str], bool] | None:
        """`ImageProcessor`'s ``moved_candidate``: None without the orphans'
        digests (the second pass: `incremental.JoinMoved`)."""
        if not self._digests or self._base is None:
            return None
        return self._digests.__contains__

    def _base_reader(self) -> Callable[[str, int], bytes | None] | None:
        """`ImageProcessor`'s ``read_base``: None without a base, or with a
        compressed one (one record is not read alone: the files are handed
        on, ``read_later``, and each shard read once, `RewriteFromBaseShards`)."""
        if self._base is None or self._read_later:
            return None
        return self._base_record

    def _base_record(self, shard: str, position: int) -> bytes | None:
        """The record at `position` of the base's `shard` (uncompressed),
        read from the frame the base's check found, or None when it cannot
        be read or its frame is not intact. Only rows `_trusted`
        passed get here: their shard's frames are known."""
        with self._base_shard(shard) as reader:
            return reader.record(position)


class RewriteFromBaseShardsFn(_ImageStepFn):
    """``(base shard, [(position, sha256, file)])`` -> what `ProcessImagesFn`
    gives (runs, ``dropped``, ``summary``): the files whose records are
    rewritten from a record of a gzip-compressed base (moved, or relabelled
    where an id changes its varint width: `relabel`), handed on by the
    image steps (`BASE_READS`) because one record of such a shard cannot be
    read without inflating it from its start.

    Each element is one base shard and every file that wants a record of
    it: the shard is read once (`incremental.BaseShard`), its records in
    ascending position, each file run through the same `ImageProcessor`
    again with the record it wants as ``read_base`` (the file is not read
    again: its sha256 is as the first pass read it). A record that cannot
    be read (the shard changed or vanished since its check) is None: that
    file is processed from its source, as with an uncompressed base. The
    files are processed on the bundle's thread, in shard order: most are
    only rewritten (a record parsed and serialized again, a fraction of a
    millisecond), and the shards are spread over the workers by the
    grouping.
    """

    # This step is where the records are read.
    HANDS_ON_BASE_READS = False

    def process(
        self,
        shard_and_files: tuple[str, Iterable[tuple[int, str, Mapping[str, Any]]]],
        window=beam.DoFn.WindowParam,
        timestamp=beam.DoFn.TimestampParam,
        base_checks: Mapping[str, tuple[str, bytes]] | None = None,
    ):
        shard, files = shard_and_files
        if base_checks is not None:
            self._base_checks = base_checks
        # By position: one pass over the shard (by key too, so the order is fixed).
        wanted = sorted(files, key=lambda file: (file[0], file[2]["key"]))
        self._shards_read.inc()
        with self._base_shard(shard) as reader:
            for position, sha256, item in wanted:
                outcome = self._processor(
                    item, read_base=_only(reader, shard, position), read_sha256=sha256
                )
                yield from self._take(item, outcome, window, timestamp)


def _only(reader: BaseShard, shard: str, position: int) -> Callable[[str, int], bytes | None]:
    """`ImageProcessor`'s ``read_base`` for a file handed on with the base
    record it wants: that record, from `reader`; any other is None."""

    def read_base(name: str, at: int) -> bytes | None:
        return reader.record(at) if (name, at) == (shard, position) else None

    return read_base


class ProcessImages(beam.PTransform):
    """Lists of listed files (dicts) -> sorted runs of their records
    (`sharding.SpilledRun`, written to `runs_folder`), with ``dropped``,
    ``summary``, ``reused``, ``deferred``, ``base_reads`` and
    ``stamp_disagreements`` outputs (a DoOutputsTuple: ``result.runs``,
    ``result.dropped``, ``result.summary``, ``result.reused``,
    ``result.deferred``, ``result.base_reads``: files for
    `RewriteFromBaseShards`, from a gzip base only,
    ``result.stamp_disagreements``: the files read that were not as
    listed; merge the partial summaries with `statistics.SummaryCombineFn`).

    Args:
      processor: The per-file work.
      threads: Threads per DoFn instance.
      runs_folder: Where the runs go (the job's temp folder).
      run_bytes: Records per run at most, in bytes (`sharding.run_bytes`).
      progress_path: A local file to count finished files in (`progress`), or None.
      base: The base version to reuse records from (`incremental`), or None.
      base_checks: With a base: PCollection[(base file, (problem or "",
        frames))] (`incremental.VerifyBaseFiles`); None without a base.
      moved_digests: With a base: a PCollection of one bytes value (or
        none), `incremental.PackDigestsFn` of the base records whose key is
        no longer listed; files of those bytes go to ``deferred``. None:
        nothing is deferred (the second pass).
    """

    def __init__(
        self,
        processor: ImageProcessor,
        threads: int,
        runs_folder: str,
        run_bytes: int,
        progress_path: str | None = None,
        base: BaseFiles | None = None,
        base_checks: beam.PCollection | None = None,
        moved_digests: beam.PCollection | None = None,
    ):
        super().__init__()
        self._fn_args = (
            processor,
            max(1, int(threads)),
            runs_folder,
            run_bytes,
            progress_path,
            base,
        )
        self._base_checks = base_checks
        self._moved_digests = moved_digests

    def expand(self, files):
        side_inputs: dict[str, Any] = {}
        if self._base_checks is not None:
            side_inputs["base_checks"] = beam.pvalue.AsDict(self._base_checks)
        if self._moved_digests is not None:
            # One bytes value, 8 bytes per orphan (`incremental.PackDigestsFn`);
            # none when no base record's key is gone.
            side_inputs["moved_digests"] = beam.pvalue.AsSingleton(
                self._moved_digests, default_value=b""
            )
        return (
            files
            | "DecodeTransformEncode"
            >> beam.ParDo(ProcessImagesFn(*self._fn_args), **side_inputs).with_outputs(
                DROPPED, SUMMARY, REUSED, DEFERRED, BASE_READS, STAMP_DISAGREEMENTS, main="runs"
            )
            # runs: SpilledRun; dropped: DroppedFile; summary: Summary per bundle;
            # reused: ReusedRun per base shard per bundle; deferred: (sha256, file);
            # base_reads: (base shard, (position, sha256, file)), a gzip base's;
            # stamp_disagreements: StampDisagreement
        )


class RewriteFromBaseShards(ProcessImages):
    """``(base shard, (position, sha256, file))`` from the image steps'
    `BASE_READS` outputs -> sorted runs of the rewritten records, with
    ``dropped``, ``summary`` and ``stamp_disagreements`` outputs as
    `ProcessImages` (a DoOutputsTuple): grouped by base shard, each shard read once
    (`RewriteFromBaseShardsFn`, on one thread). Only a build with a
    gzip-compressed base hands files on so. Takes the image steps'
    arguments (`ProcessImages`); ``base`` and ``base_checks`` are needed.
    """

    def expand(self, waiting):
        if self._base_checks is None:
            raise ValueError("records are read from base shards without the base's checks")
        processor, _, runs_folder, run_bytes, progress_path, base = self._fn_args
        return (
            waiting
            | "GroupByBaseShard" >> beam.GroupByKey()  # (shard, [(position, sha256, file)])
            | "ReadBaseShards"
            >> beam.ParDo(
                RewriteFromBaseShardsFn(processor, 1, runs_folder, run_bytes, progress_path, base),
                base_checks=beam.pvalue.AsDict(self._base_checks),
            ).with_outputs(DROPPED, SUMMARY, STAMP_DISAGREEMENTS, main="runs")
            # runs: SpilledRun; dropped: DroppedFile; summary: Summary per bundle;
            # stamp_disagreements: StampDisagreement
        )
