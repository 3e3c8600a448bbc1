"""An image folder on an object store listed by a Beam job (``source.listing: job``).

The launcher's listing (`sources`) costs one core of Python per object
(some 10 to 30 minutes for 10M objects, docs/dataflow.md "Listing at
scale"), before any worker starts. Here the launcher lists only the folder
structure (`plan`: one delimiter listing of the root, and of each split
folder with ``splits.from_source``), and a short job lists the objects of
each class folder on the workers, one element per folder::

    FolderPrefixes -> SpreadPrefixes -> ListPrefixes -> PlaceFiles ─┬─> (candidates)
    FolderStrays ──────────────────────────────────────┘            └─> (misplaced)
    (candidates) -> ClassNames (unless source.classes)
    (candidates), class names -> CheckFiles ─┬─> (files) -> GroupFiles -> WriteListing
                                             ├─> (dropped) ──────────────┘
                                             └─> (stamp entries) -> Summarize -> WriteSummary

It applies the launcher's rules (`sources.folder_place`,
`sources.place_problem`) and writes what the launcher's listing would
write: the build job's listing (``listing-*.jsonl``, lines of
`listing.FILES_PER_LINE` files and one line per dropped file) and a
`ListedInJob` summary (``summary.json``): counts, class and split names, and
the stamp's and version's hashes of the listing's entries, combined in the
job (`versioning.combine_hashes` is a sum, so the order in which workers
list does not matter). The same files give the same stamp, version and
records as a listing by the launcher.

What stays on the launcher is the folder structure and the summary: no row
per object, in memory or on disk. The launcher checks the stamp against the
published versions before it starts the build job, which reads the listing
files (`launcher.build`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam

from kiln.pipeline import storage, versioning
from kiln.pipeline.error_report import DroppedFile
from kiln.pipeline.listing import FILES_PER_LINE, SourceFile
from kiln.pipeline.sources import Misplaced, folder_place, place_problem

logger = logging.getLogger(__name__)

LISTING_PREFIX = "listing"
SUMMARY_FILENAME = "summary.json"
# Marks a listing's failure in the job's error, for the launcher's one line.
CANNOT_LIST = "cannot list "


class SourceListingError(Exception):
    """A folder of the source could not be listed (missing rights, the store
    refused): ``cannot list <prefix>: <the store's words>``."""


@dataclasses.dataclass(frozen=True)
class ListingJobPlan:
    """What the listing job lists and where it writes, decided by the launcher.

    Attributes:
      root: The image folder (an object store URI), without a trailing '/'.
      from_source: ``splits.from_source``: files sit in ``<split>/<class>/``.
      classes: ``source.classes``, sorted; None: every class folder found.
      prefixes: The folders listed by the job, one element each ('/'-ended).
      strays: Objects the launcher's folder listing found above the class
        folders: outside the layout (or hidden), whatever their size.
      listing_dir: Where the job writes the listing and its summary.
    """

    root: str
    from_source: bool
    classes: tuple[str, ...] | None
    prefixes: tuple[str, ...]
    strays: tuple[str, ...]
    listing_dir: str

    @property
    def listing_pattern(self) -> str:
        """The build job's input: every file the listing job wrote."""
        return storage.join(self.listing_dir, f"{LISTING_PREFIX}-*.jsonl")

    @property
    def summary_uri(self) -> str:
        return storage.join(self.listing_dir, SUMMARY_FILENAME)


def plan(
    root: str, from_source: bool, classes: Sequence[str] | None, listing_dir: str
) -> ListingJobPlan:
    """Lists the folder structure of the image folder `root` (on the launcher).

    One delimiter listing of the root (and of each split folder with
    `from_source`) gives the class folders for the job to list, and the few
    objects above them. Hidden folders are not listed. On a store without a
    delimiter listing (`storage.folder_level`) the job lists the whole root
    as one element: still off the launcher, but on one worker.
    """
    root = root.rstrip("/")
    top = storage.folder_level(root + "/")
    if top is None:
        logger.info("listing %s in the job as one prefix (the store lists no folders)", root)
        return ListingJobPlan(root, from_source, _sorted(classes), (root + "/",), (), listing_dir)
    strays, folders = top
    if from_source:
        split_folders, folders = _visible(folders), []
        for split_folder in split_folders:
            objects, below = storage.folder_level(split_folder) or ([], [])
            strays = [*strays, *objects]
            folders += below
    prefixes = _visible(folders)
    logger.info("the listing job lists %d folders of %s", len(prefixes), root)
    return ListingJobPlan(
        root, from_source, _sorted(classes), tuple(prefixes), tuple(strays), listing_dir
    )


def _visible(folders: list[str]) -> list[str]:
    return [f for f in folders if not storage.basename(f.rstrip("/")).startswith(".")]


def _sorted(classes: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(sorted(set(classes))) if classes else None


@dataclasses.dataclass(frozen=True)
class ListedInJob:
    """What the launcher holds of a listing the job made: its summary.

    The same questions as `listing.Listing` answers for the launcher, from a
    few numbers and names; the rows are in the listing job's files.

    Attributes:
      class_names: Sorted class names; a label is an index into it.
      split_names: Sorted split names of the files (``splits.from_source``), else None.
      num_files: The images to process.
      num_dropped: Files dropped while listing.
      stamp_hash: The multiset hash of every listing entry, for the stamp.
      dropped_hash: The multiset hash of the dropped files' entries, for the version.
      first_dropped: The first dropped file by key, for messages; None if none.
      listing_uri: The listing's files, as a pattern (the build job's input).
    """

    class_names: list[str]
    split_names: list[str] | None
    num_files: int
    num_dropped: int
    stamp_hash: int
    dropped_hash: int
    first_dropped: DroppedFile | None
    listing_uri: str

    @property
    def total(self) -> int:
        """Listed inputs: the files to process plus those already dropped."""
        return self.num_files + self.num_dropped

    def listing_hash(self) -> int:
        return self.stamp_hash

    def dropped_entries_hash(self) -> int:
        return self.dropped_hash

    def to_json(self) -> dict[str, Any]:
        return {
            "class_names": self.class_names,
            "split_names": self.split_names,
            "num_files": self.num_files,
            "num_dropped": self.num_dropped,
            "stamp_hash": format(self.stamp_hash, "064x"),
            "dropped_hash": format(self.dropped_hash, "064x"),
            "first_dropped": self.first_dropped.to_json() if self.first_dropped else None,
            "listing_uri": self.listing_uri,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ListedInJob:
        first = data["first_dropped"]
        return cls(
            class_names=list(data["class_names"]),
            split_names=None if data["split_names"] is None else list(data["split_names"]),
            num_files=int(data["num_files"]),
            num_dropped=int(data["num_dropped"]),
            stamp_hash=int(data["stamp_hash"], 16),
            dropped_hash=int(data["dropped_hash"], 16),
            first_dropped=None if first is None else DroppedFile.from_json(first),
            listing_uri=data["listing_uri"],
        )


def read_summary(listing_plan: ListingJobPlan) -> ListedInJob:
    """The summary a finished listing job wrote."""
    text = storage.read_text(listing_plan.summary_uri)
    if text is None:
        raise FileNotFoundError(f"the listing job wrote no {listing_plan.summary_uri}")
    return ListedInJob.from_json(json.loads(text))


class _ListPrefixFn(beam.DoFn):
    """A folder prefix -> ``(uri, size, mtime)`` of every object under it,
    page by page as the store returns them."""

    def process(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        try:
            for metadata in storage.list_prefix(prefix):
                yield (
                    metadata.path,
                    int(metadata.size_in_bytes),
                    float(metadata.last_updated_in_seconds),
                )
        except Exception as e:  # Beam's BeamIOError, the client's HTTP error...
            problem = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SourceListingError(f"{CANNOT_LIST}{prefix}: {problem[:300]}") from e


class _PlaceFileFn(beam.DoFn):
    """``(uri, size, mtime)`` -> a candidate ``(key, uri, class, split, size,
    mtime)``, or a `DroppedFile` (``misplaced``) outside the layout; hidden
    paths are skipped (`sources.folder_place`)."""

    def __init__(self, root: str, from_source: bool):
        self._root = root
        self._from_source = from_source

    def process(self, listed: tuple[str, int, float]):
        uri, size, mtime = listed
        key = uri[len(self._root) :].lstrip("/")
        place = folder_place(key, self._from_source)
        if place is None:
            return
        if isinstance(place, Misplaced):
            yield beam.pvalue.TaggedOutput(
                "misplaced", DroppedFile(key, "list", place.reason, uri, place.message)
            )
            return
        yield key, uri, place[0], place[1], size, mtime


class _ClassNamesFn(beam.CombineFn):
    """Candidates' class names -> the sorted distinct ones."""

    def create_accumulator(self) -> set[str]:
        return set()

    def add_input(self, accumulator: set[str], label: str) -> set[str]:
        accumulator.add(label)
        return accumulator

    def merge_accumulators(self, accumulators) -> set[str]:
        return set().union(*accumulators)

    def extract_output(self, accumulator: set[str]) -> list[str]:
        return sorted(accumulator)


class _CheckFileFn(beam.DoFn):
    """A candidate -> the build job's row of a file (`SourceFile.to_json`), or
    a `DroppedFile` (``dropped``); and its stamp entry's hash with its split
    (``entries``: ``(split, hash)``)."""

    def __init__(self) -> None:
        self._class_names: list[str] | None = None
        self._label_ids: dict[str, int] = {}

    def process(self, candidate: tuple, class_names: list[str]):
        if class_names is not self._class_names:  # the side input: once per bundle at most
            self._class_names = class_names
            self._label_ids = {name: i for i, name in enumerate(class_names)}
        key, uri, label, split, size, mtime = candidate
        problem = place_problem(label, split, self._label_ids)
        if problem:
            yield beam.pvalue.TaggedOutput(
                "dropped", DroppedFile(key, "list", problem.reason, uri, problem.message)
            )
            return
        # `listing.Listing.stamp_entries` of an image folder's file.
        entry = ["file", key, label, split, size, mtime]
        yield beam.pvalue.TaggedOutput("entries", (split, versioning.entry_hash(entry)))
        file = SourceFile(key, uri, self._label_ids[label], split, size, mtime)
        yield file.to_json()


@dataclasses.dataclass
class _Tally:
    """The listing summary's accumulator (`_SummaryFn`)."""

    files: int = 0
    dropped: int = 0
    splits: set[str] = dataclasses.field(default_factory=set)
    stamp_hash: int = 0
    dropped_hash: int = 0
    first_dropped: DroppedFile | None = None


class _SummaryFn(beam.CombineFn):
    """Stamp entries of files ``(split, hash)`` and dropped files
    (`DroppedFile`) -> their `_Tally`: counts, splits, multiset hashes."""

    def create_accumulator(self) -> _Tally:
        return _Tally()

    def add_input(self, tally: _Tally, item) -> _Tally:
        if isinstance(item, DroppedFile):
            # `listing.Listing.dropped_entries` of an image folder's file.
            value = versioning.entry_hash(["dropped", item.reason, item.key])
            tally.dropped += 1
            tally.dropped_hash = versioning.combine_hashes([tally.dropped_hash, value])
            if tally.first_dropped is None or item < tally.first_dropped:
                tally.first_dropped = item
        else:
            split, value = item
            tally.files += 1
            if split is not None:
                tally.splits.add(split)
        tally.stamp_hash = versioning.combine_hashes([tally.stamp_hash, value])
        return tally

    def merge_accumulators(self, tallies) -> _Tally:
        merged = _Tally()
        for tally in tallies:
            merged.files += tally.files
            merged.dropped += tally.dropped
            merged.splits |= tally.splits
            merged.stamp_hash = versioning.combine_hashes([merged.stamp_hash, tally.stamp_hash])
            merged.dropped_hash = versioning.combine_hashes(
                [merged.dropped_hash, tally.dropped_hash]
            )
            firsts = [d for d in (merged.first_dropped, tally.first_dropped) if d is not None]
            merged.first_dropped = min(firsts, default=None)
        return merged

    def extract_output(self, tally: _Tally) -> _Tally:
        return tally


def _files_line(files: list[dict[str, Any]]) -> str:
    return json.dumps({"files": sorted(files, key=lambda f: f["key"])}, sort_keys=True)


def _dropped_line(dropped: DroppedFile) -> str:
    return json.dumps({"dropped": dropped.to_json()}, sort_keys=True)


def _write_summary(tally: _Tally, class_names: list[str], *, listing_plan: ListingJobPlan) -> None:
    summary = ListedInJob(
        class_names=class_names,
        split_names=sorted(tally.splits) if listing_plan.from_source else None,
        num_files=tally.files,
        num_dropped=tally.dropped,
        stamp_hash=tally.stamp_hash,
        dropped_hash=tally.dropped_hash,
        first_dropped=tally.first_dropped,
        listing_uri=listing_plan.listing_pattern,
    )
    storage.write_text(listing_plan.summary_uri, json.dumps(summary.to_json(), sort_keys=True))


def construct(pipeline: beam.Pipeline, listing_plan: ListingJobPlan) -> None:
    """Adds the listing job's steps to `pipeline` (see the module docstring)."""
    listed = (
        pipeline
        | "FolderPrefixes" >> beam.Create(listing_plan.prefixes)  # folder prefix
        # Create makes one bundle: spread the folders so workers list them side by side.
        | "SpreadPrefixes" >> beam.Reshuffle()
        | "ListPrefixes" >> beam.ParDo(_ListPrefixFn())  # (uri, size, mtime)
    )
    strays = pipeline | "FolderStrays" >> beam.Create(
        [(uri, 0, 0.0) for uri in listing_plan.strays]  # outside the layout: never a file
    )
    placed = (
        (listed, strays)
        | "AllListed" >> beam.Flatten()
        | "PlaceFiles"
        >> beam.ParDo(_PlaceFileFn(listing_plan.root, listing_plan.from_source)).with_outputs(
            "misplaced", main="candidates"
        )
    )
    # candidates: (key, uri, class, split, size, mtime); misplaced: DroppedFile
    if listing_plan.classes is None:
        class_names = (
            placed.candidates
            | "ClassNames" >> beam.Map(lambda candidate: candidate[2])
            | "DistinctClasses" >> beam.CombineGlobally(_ClassNamesFn())
        )  # [class name]
    else:
        class_names = pipeline | "ClassNames" >> beam.Create([list(listing_plan.classes)])
    checked = placed.candidates | "CheckFiles" >> beam.ParDo(
        _CheckFileFn(), class_names=beam.pvalue.AsSingleton(class_names)
    ).with_outputs("dropped", "entries", main="files")
    # files: {key, uri, label, split, size}; dropped: DroppedFile; entries: (split, hash)
    dropped = (placed.misplaced, checked.dropped) | "AllDropped" >> beam.Flatten()  # DroppedFile
    file_lines = (
        checked.files
        | "GroupFiles"
        >> beam.BatchElements(min_batch_size=FILES_PER_LINE, max_batch_size=FILES_PER_LINE)
        | "FileLines" >> beam.Map(_files_line)
    )  # {"files": [...]} as JSON
    dropped_lines = dropped | "DroppedLines" >> beam.Map(_dropped_line)  # {"dropped": ...}
    _ = (
        (file_lines, dropped_lines)
        | "AllLines" >> beam.Flatten()
        | "WriteListing"
        >> beam.io.WriteToText(
            storage.join(listing_plan.listing_dir, LISTING_PREFIX), file_name_suffix=".jsonl"
        )
    )
    _ = (
        (checked.entries, dropped)
        | "AllEntries" >> beam.Flatten()
        | "Summarize" >> beam.CombineGlobally(_SummaryFn())  # _Tally
        | "WriteSummary"
        >> beam.Map(
            _write_summary,
            class_names=beam.pvalue.AsSingleton(class_names),
            listing_plan=listing_plan,
        )
    )
