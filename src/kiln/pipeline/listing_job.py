"""An image folder or a manifest on an object store listed by a Beam job
(``source.listing: job``).

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

A manifest (`construct_manifest`) is read in the job instead: its rows
checked by the launcher's rules (`sources.row_problem`, `group_problem`),
their objects listed by folder or asked for one by one
(`sources.lookup_plan`) and joined to the rows; the same writing steps
(`_write`) give the same files, summary and stamp.

What stays on the launcher is the folder structure (none for a manifest)
and the summary: no row per object, in memory or on disk. The launcher checks the stamp against the
published versions before it starts the build job, which reads the listing
files (`launcher.build`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from kiln.errors import first_line
from kiln.pipeline import storage, versioning
from kiln.pipeline.error_report import DroppedFile
from kiln.pipeline.listing import (
    FILES_PER_LINE,
    Candidate,
    SourceFile,
    dropped_entry,
    folder_order,
)
from kiln.pipeline.sources import (
    DroppedRow,
    ManifestError,
    Misplaced,
    Row,
    folder_place,
    group_problem,
    lookup_plan,
    manifest_confinement,
    manifest_rows,
    missing_row,
    object_not_found,
    place_problem,
    row_candidate,
    row_problem,
)

if TYPE_CHECKING:
    from apache_beam.io.filesystem import FileMetadata

logger = logging.getLogger(__name__)

LISTING_PREFIX = "listing"
SUMMARY_FILENAME = "summary.json"
# Marks a listing's failure in the job's error, for the launcher's one line.
CANNOT_LIST = "cannot list "


class SourceListingError(Exception):
    """A folder of the source could not be listed (missing rights, the store
    refused): ``cannot list <prefix>: <the store's words>``."""


@dataclasses.dataclass(frozen=True)
class _Written:
    """Where a listing job writes: the build's listing and its summary."""

    listing_dir: str
    from_source: bool

    @property
    def listing_pattern(self) -> str:
        """The build job's input: every file the listing job wrote."""
        return storage.join(self.listing_dir, f"{LISTING_PREFIX}-*.jsonl")

    @property
    def summary_uri(self) -> str:
        return storage.join(self.listing_dir, SUMMARY_FILENAME)


@dataclasses.dataclass(frozen=True)
class ListingJobPlan(_Written):
    """What the listing job lists and where it writes, decided by the launcher.

    Attributes:
      root: The image folder (an object store URI), without a trailing '/'.
      from_source: ``splits.from_source``: files sit in ``<split>/<class>/``.
      classes: ``source.classes``, in its order; None: every class folder found.
      prefixes: The folders listed by the job, one element each ('/'-ended).
      strays: Objects the launcher's folder listing found above the class
        folders: outside the layout (or hidden), whatever their size.
      listing_dir: Where the job writes the listing and its summary.
    """

    root: str = ""
    classes: tuple[str, ...] | None = None
    prefixes: tuple[str, ...] = ()
    strays: tuple[str, ...] = ()


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
        return ListingJobPlan(listing_dir, from_source, root, _declared(classes), (root + "/",), ())
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
        listing_dir, from_source, root, _declared(classes), tuple(prefixes), tuple(strays)
    )


def _visible(folders: list[str]) -> list[str]:
    return [f for f in folders if not storage.basename(f.rstrip("/")).startswith(".")]


def _declared(classes: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(classes) if classes else None


@dataclasses.dataclass(frozen=True)
class ListedInJob:
    """What the launcher holds of a listing the job made: its summary.

    The same questions as `listing.Listing` answers for the launcher, from a
    few numbers and names; the rows are in the listing job's files.

    Attributes:
      class_names: The class names (`source.classes`, or those found, sorted); a
        label is an index into it.
      split_names: Sorted split names of the files (``splits.from_source``), else None.
      num_files: The images to process.
      num_dropped: Files dropped while listing.
      stamp_hash: The multiset hash of every listing entry, for the stamp.
      dropped_hash: The multiset hash of the dropped files' entries, for the version.
      first_dropped: The first dropped file by key, for messages; None if none.
      listing_uri: The listing's files, as a pattern (the build job's input).
      newest_mtime: The latest modification time of the files listed (0.0:
        none), as `listing.Listing.newest_mtime`.
    """

    class_names: list[str]
    split_names: list[str] | None
    num_files: int
    num_dropped: int
    stamp_hash: int
    dropped_hash: int
    first_dropped: DroppedFile | None
    listing_uri: str
    newest_mtime: float = 0.0

    @property
    def total(self) -> int:
        """Listed inputs: the files to process plus those already dropped."""
        return self.num_files + self.num_dropped

    def listing_hash(self) -> int:
        return self.stamp_hash

    def files_modified_since(self, since: float) -> Iterator[SourceFile]:
        """The images to process last modified at or after `since` (seconds
        since the epoch), as `listing.Listing.files_modified_since`, in no
        particular order: the listing job's files read line by line.

        Raises:
          OSError, ValueError, BeamIOError: a listing file cannot be read or
            holds a line that is not a listing line.
        """
        found = FileSystems.match([self.listing_uri])[0].metadata_list
        for path in sorted(metadata.path for metadata in found):
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                for line in f:
                    for row in json.loads(line).get("files", ()):
                        if float(row["mtime"]) >= since:
                            yield SourceFile(
                                key=row["key"],
                                uri=row["uri"],
                                label=row["label"],
                                split=row["split"],
                                size=row["size"],
                                mtime=float(row["mtime"]),
                            )

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
            "newest_mtime": self.newest_mtime,
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
            newest_mtime=float(data["newest_mtime"]),
        )


def read_summary(listing_plan: _Written) -> ListedInJob:
    """The summary a finished listing job wrote."""
    text = storage.read_text(listing_plan.summary_uri)
    if text is None:
        raise FileNotFoundError(f"the listing job wrote no {listing_plan.summary_uri}")
    return ListedInJob.from_json(json.loads(text))


class _ListPrefixFn(beam.DoFn):
    """A folder prefix -> ``(uri, size, mtime)`` of every object under it,
    page by page as the store returns them."""

    def process(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        yield from _found(prefix, lambda: storage.list_prefix(prefix))


def _found(
    what: str, listing: Callable[[], Iterable[FileMetadata]]
) -> Iterator[tuple[str, int, float]]:
    """``(uri, size, mtime)`` of each object `listing` finds (a listing of `what`)."""
    try:
        for metadata in listing():
            yield (
                metadata.path,
                int(metadata.size_in_bytes),
                float(metadata.last_updated_in_seconds),
            )
    except Exception as e:  # Beam's BeamIOError, the client's HTTP error...
        raise SourceListingError(f"{CANNOT_LIST}{what}: {first_line(e, 300)}") from e


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
            yield beam.pvalue.TaggedOutput("misplaced", _folder_dropped(key, uri, place))
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
    (``entries``: ``(split, hash, mtime)``)."""

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
            yield beam.pvalue.TaggedOutput("dropped", _folder_dropped(key, uri, problem))
            return
        yield from _file_outputs(
            SourceFile(key, uri, self._label_ids[label], split, size, mtime), label
        )


def _folder_dropped(key: str, uri: str, problem: Misplaced) -> DroppedRow:
    """An image folder's file dropped while listing, with its
    `listing.Listing.dropped_entries` entry."""
    return DroppedFile(key, "list", problem.reason, uri, problem.message), [
        "dropped",
        problem.reason,
        key,
    ]


def _file_outputs(file: SourceFile, label: str) -> Iterator[Any]:
    """A file to process: its row of the build job's listing, and its stamp
    entry's hash with its split and its modification time (``entries``:
    ``(split, hash, mtime)``)."""
    # `listing.Listing.stamp_entries` of a file without targets.
    entry = ["file", file.key, label, file.split, file.size, file.mtime]
    yield beam.pvalue.TaggedOutput(
        "entries", (file.split, versioning.entry_hash(entry), file.mtime)
    )
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
    newest_mtime: float = 0.0


class _SummaryFn(beam.CombineFn):
    """Stamp entries of files ``(split, hash, mtime)`` and dropped files
    (`DroppedRow`: the file and its entry) -> their `_Tally`: counts,
    splits, multiset hashes, the newest modification time."""

    def create_accumulator(self) -> _Tally:
        return _Tally()

    def add_input(self, tally: _Tally, item) -> _Tally:
        if isinstance(item[0], DroppedFile):
            dropped, entry = item
            value = versioning.entry_hash(dropped_entry(dropped, entry))  # as the launcher's
            tally.dropped += 1
            tally.dropped_hash = versioning.combine_hashes([tally.dropped_hash, value])
            if tally.first_dropped is None or dropped < tally.first_dropped:
                tally.first_dropped = dropped
        else:
            split, value, mtime = item
            tally.files += 1
            tally.newest_mtime = max(tally.newest_mtime, mtime)
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
            merged.newest_mtime = max(merged.newest_mtime, tally.newest_mtime)
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


def _dropped_line(dropped: DroppedRow) -> str:
    return json.dumps({"dropped": dropped[0].to_json()}, sort_keys=True)


def _write_summary(tally: _Tally, class_names: list[str], *, listing_plan: _Written) -> None:
    summary = ListedInJob(
        class_names=class_names,
        split_names=sorted(tally.splits) if listing_plan.from_source else None,
        num_files=tally.files,
        num_dropped=tally.dropped,
        stamp_hash=tally.stamp_hash,
        dropped_hash=tally.dropped_hash,
        first_dropped=tally.first_dropped,
        listing_uri=listing_plan.listing_pattern,
        newest_mtime=tally.newest_mtime,
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
    # files: {key, uri, label, split, size}; dropped: DroppedRow; entries: (split, hash, mtime)
    dropped = (placed.misplaced, checked.dropped) | "AllDropped" >> beam.Flatten()  # DroppedRow
    _write(listing_plan, checked.files, checked.entries, dropped, class_names)


def _write(
    listing_plan: _Written,
    files: beam.PCollection,
    entries: beam.PCollection,
    dropped: beam.PCollection,
    class_names: beam.PCollection,
) -> None:
    """The listing job's last steps: the build's listing from the files'
    rows (`SourceFile.to_json`) and the dropped rows (`DroppedRow`), and
    the summary from them, the stamp entries ``(split, hash, mtime)`` and the class
    names (one list)."""
    file_lines = (
        files
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
        (entries, dropped)
        | "AllEntries" >> beam.Flatten()
        | "Summarize" >> beam.CombineGlobally(_SummaryFn())  # _Tally
        | "WriteSummary"
        >> beam.Map(
            _write_summary,
            class_names=beam.pvalue.AsSingleton(class_names),
            listing_plan=listing_plan,
        )
    )


# Marks a manifest that cannot be used in the job's error (the launcher's
# ``source.path: <problem>``).
MANIFEST_PROBLEM = "manifest problem: "
# Objects asked for per element of ``AskObjects`` (on `storage.walk_prefixes`' threads).
_ASKED_PER_BATCH = 64


@dataclasses.dataclass(frozen=True)
class ManifestListingPlan(_Written):
    """A manifest (``source.type: manifest``) whose rows a listing job reads
    and whose objects it looks up (`construct_manifest`).

    Attributes:
      path: The manifest (an object store URI).
      classes: ``source.classes``, sorted; None: every label the rows name.
      allowed_roots: ``source.allowed_roots``.
    """

    path: str = ""
    classes: tuple[str, ...] | None = None
    allowed_roots: tuple[str, ...] = ()


def manifest_plan(
    path: str,
    from_source: bool,
    classes: Sequence[str] | None,
    allowed_roots: Sequence[str],
    listing_dir: str,
) -> ManifestListingPlan:
    return ManifestListingPlan(
        listing_dir, from_source, path, _declared(classes), tuple(allowed_roots)
    )


class _ReadRowsFn(beam.DoFn):
    """The manifest's URI -> its rows as candidates (`listing.Candidate`),
    or a `DroppedRow` (``dropped``) for a row `sources.row_problem` drops.

    The manifest is read and parsed as one stream (CSV fields may span
    lines; JSONL line numbers count every line break), on one worker."""

    def __init__(self, from_source: bool):
        self._from_source = from_source

    def process(self, path: str):
        try:
            rows, base = manifest_rows(path)
            for row in rows:
                problem = row_problem(row, path, self._from_source)
                if problem:
                    yield beam.pvalue.TaggedOutput("dropped", problem)
                elif isinstance(row, Row):
                    yield row_candidate(row, base, self._from_source)
        except ManifestError as e:
            raise SourceListingError(f"{MANIFEST_PROBLEM}{e}") from None


def _named_folder(candidate: Candidate) -> Iterator[str]:
    """The folder of the object a row names (`ListingWriter.add_named_object`)."""
    uri = candidate.uri
    if storage.is_remote(uri) and not uri.endswith("/"):
        yield uri.rsplit("/", 1)[0]


def _lookups(
    folder_counts: list[tuple[str, int]], confinement: Any
) -> tuple[list[str], frozenset[str]]:
    """The folders to list and those whose objects are asked for
    (`sources.lookup_plan`, the launcher's rule)."""
    listed, asked = lookup_plan(sorted(folder_counts, key=folder_order), confinement)
    return listed, frozenset(asked)


class _CheckRowsFn(beam.DoFn):
    """``(key, candidates)`` -> ``(uri, (key, label, label id, split))`` to
    look up, or a `DroppedRow` (``dropped``: `sources.group_problem`)."""

    def __init__(self, confinement: Any):
        self._confinement = confinement
        self._class_names: list[str] | None = None
        self._label_ids: dict[str, int] = {}

    def process(self, keyed: tuple[str, list[Candidate]], class_names: list[str]):
        if class_names is not self._class_names:  # the side input: once per bundle at most
            self._class_names = class_names
            self._label_ids = {name: i for i, name in enumerate(class_names)}
        label_ids = self._label_ids
        group = sorted(keyed[1], key=lambda candidate: candidate.position)
        problem = group_problem(group, label_ids, self._confinement)
        if problem:
            yield beam.pvalue.TaggedOutput("dropped", problem)
            return
        first = group[0]
        yield first.uri, (first.key, first.label, label_ids[first.label], first.split)


def _asked(uri: str, lookups: tuple[list[str], frozenset[str]]) -> bool:
    """Whether the object `uri` is asked for (its folder is not listed)."""
    return storage.is_remote(uri) and not uri.endswith("/") and uri.rsplit("/", 1)[0] in lookups[1]


class _AskObjectsFn(beam.DoFn):
    """A batch of object URIs -> ``(uri, size, mtime)`` of each that exists."""

    def process(self, uris: list[str]) -> Iterator[tuple[str, int, float]]:
        yield from _found(
            f"{uris[0]} (and {len(uris) - 1} more)", lambda: storage.walk_prefixes((), uris)
        )


class _JoinFn(beam.DoFn):
    """``(uri, {"rows": [...], "found": [(size, mtime)]})`` -> each row's
    file (`_file_outputs`), or a `DroppedRow` (``dropped``) for a missing object."""

    def __init__(self, path: str):
        self._path = path

    def process(self, joined: tuple[str, dict[str, list]]):
        uri, sides = joined
        found = sides["found"]
        for key, label, label_id, split in sides["rows"]:
            if not found:
                problem = missing_row(key, uri, self._path, object_not_found(uri))
                yield beam.pvalue.TaggedOutput("dropped", problem)
                continue
            size, mtime = found[0]
            yield from _file_outputs(SourceFile(key, uri, label_id, split, size, mtime), label)


def construct_manifest(pipeline: beam.Pipeline, listing_plan: ManifestListingPlan) -> None:
    """Adds the steps of a manifest's listing job to `pipeline`::

        Manifest -> ReadRows ─┬─> (candidates) ─┬─> NamedFolders -> CountFolders -> Lookups
                              │                 ├─> ClassNames (unless source.classes)
                              │                 └─> KeyRows -> GroupRows -> CheckRows ─┐
                              └─> (dropped)                                           │
        Lookups -> ListedFolders -> SpreadFolders -> ListFolders ─┐                     │
        (checked) -> AskedObjects -> BatchAsked -> AskObjects ────┴─> JoinRows <─ (checked)
        JoinRows ─> (files, entries, dropped) -> WriteListing, Summarize -> WriteSummary

    The launcher's rules throughout (`sources.row_problem`, `group_problem`,
    `lookup_plan`, `missing_row`): the same listing, stamp and version.
    """
    confinement = manifest_confinement(listing_plan.path, list(listing_plan.allowed_roots))
    read = (
        pipeline
        | "Manifest" >> beam.Create([listing_plan.path])
        | "ReadRows"
        >> beam.ParDo(_ReadRowsFn(listing_plan.from_source)).with_outputs(
            "dropped", main="candidates"
        )
    )
    candidates = read.candidates | "SpreadRows" >> beam.Reshuffle()  # Candidate
    if listing_plan.classes is None:
        class_names = (
            candidates
            | "ClassNames" >> beam.Map(lambda candidate: candidate.label)
            | "DistinctClasses" >> beam.CombineGlobally(_ClassNamesFn())
        )  # [class name]
    else:
        class_names = pipeline | "ClassNames" >> beam.Create([list(listing_plan.classes)])
    lookups = (
        candidates
        | "NamedFolders" >> beam.FlatMap(_named_folder)
        | "CountFolders" >> beam.combiners.Count.PerElement()
        | "AllFolders" >> beam.combiners.ToList()
        | "Lookups" >> beam.Map(_lookups, confinement)
    )  # ([folder listed], [folder whose objects are asked for])
    checked = (
        candidates
        | "KeyRows" >> beam.Map(lambda candidate: (candidate.key, candidate))
        | "GroupRows" >> beam.GroupByKey()
        | "CheckRows"
        >> beam.ParDo(
            _CheckRowsFn(confinement), class_names=beam.pvalue.AsSingleton(class_names)
        ).with_outputs("dropped", main="rows")
    )  # rows: (uri, (key, label, label id, split)); dropped: DroppedRow
    listed = (
        lookups
        | "ListedFolders" >> beam.FlatMap(lambda plan: [folder + "/" for folder in plan[0]])
        | "SpreadFolders" >> beam.Reshuffle()
        | "ListFolders" >> beam.ParDo(_ListPrefixFn())
    )  # (uri, size, mtime)
    asked = (
        checked.rows
        | "AskedObjects"
        >> beam.FlatMap(
            lambda row, plan: [row[0]] if _asked(row[0], plan) else [],
            beam.pvalue.AsSingleton(lookups),
        )
        | "DistinctAsked" >> beam.Distinct()
        | "BatchAsked" >> beam.BatchElements(max_batch_size=_ASKED_PER_BATCH)
        | "AskObjects" >> beam.ParDo(_AskObjectsFn())
    )  # (uri, size, mtime)
    found = (
        (listed, asked)
        | "AllFound" >> beam.Flatten()
        | "KeyFound" >> beam.Map(lambda item: (item[0], (item[1], item[2])))
    )
    joined = (
        {"rows": checked.rows, "found": found}
        | "JoinRows" >> beam.CoGroupByKey()
        | "LookUpRows"
        >> beam.ParDo(_JoinFn(listing_plan.path)).with_outputs("dropped", "entries", main="files")
    )
    dropped = (read.dropped, checked.dropped, joined.dropped) | "AllDropped" >> beam.Flatten()
    _write(listing_plan, joined.files, joined.entries, dropped, class_names)
