"""The Beam job's graph: construction only, no running.

`construct` adds every step of a build to a `beam.Pipeline`; the launcher
(`kiln.pipeline.launcher`) runs it and publishes the result. Keeping the two
apart makes the graph testable on its own (the Dataflow dry-run test
translates it without running anything).

The job reads the listing the launcher wrote (or the listing job, with
``source.listing: job``: `listing_job`), and writes into the staging
folder: the shard files, ``errors.jsonl``, and ``.work/report.json`` (every
aggregate the launcher needs for `kiln.json`). The steps::

    ReadListing -> ParseListing ─┬─> (lists of listed files)
                                 └─> (dropped while listing)
    (lists of files) -> SpreadFiles -> ProcessImages ─┬─> (sorted runs of records)
                                                      ├─> (dropped: DroppedFile)
                                                      └─> (summary: one per bundle)
    (runs) -> WriteShards
           └-> FindDuplicates
    (summary) -> Summarize
    shards, summary, duplicates, all dropped -> WriteReports
                                (errors.jsonl, duplicates.jsonl, index.jsonl,
                                dropped_objects.jsonl with boxes, and the report)

``WriteReports`` also writes, into the work folder, what the launcher keeps
beside the version rather than in it: the sha256 of the files dropped
having been read (`up_to_date.write_dropped_sha256s`), and the files read
that were not as listed, when there are any (`stamp_disagreements`, from
the image steps' ``stamp_disagreements`` outputs).

With a base version to reuse records from (`incremental`), the files are
joined with the base's record index instead of spread (``JoinBase``), the
base's files are checked first (``VerifyBaseFiles``, which also finds where
each record of a base shard is), and the image step hands on the records it
reuses as byte ranges of the base's shards (`sharding.ReusedRun`), which
``WriteShards`` copies from there into the new shards (and the records
relabelled, a class added or removed having shifted their ids, which it
rewrites as it copies them: `relabel`). Files that may have moved (their
bytes are those of a base record whose key is gone: `moves`) are handed on,
joined with those records by sha256 (``JoinMoved``) and go through the
image step a second time (``ProcessMovedImages``), which rewrites the
matching records. One record of a gzip-compressed base cannot be read
alone: there both image steps hand on the files whose records they would
rewrite (moved, or relabelled where an id changes its varint width),
grouped by the base shard holding the record, and each such shard is
inflated once (``RewriteFromBaseShards``). ``WriteReports`` also joins the
shards' parts of the record index into ``index.jsonl``.

Per image, all the work is in `ProcessImages` (on a thread pool): the
listing holds several files per line, the records go straight into sorted
run files (`sharding.RunWriter`) and the statistics are added up per bundle
there, so no later Beam step handles single images (every step an element
passes through costs time on the bundle's thread). The steps after it
handle a few elements per run, shard or split.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from kiln.pipeline import (
    incremental,
    record_index,
    sharding,
    stamp_disagreements,
    storage,
    versioning,
)
from kiln.pipeline.box_convention import BoxEvidence
from kiln.pipeline.config import BuildSpec
from kiln.pipeline.duplicates import DuplicateGroup, FindDuplicates, write_duplicate_report
from kiln.pipeline.error_report import DroppedFile, write_dropped_objects, write_error_report
from kiln.pipeline.images import ImageProcessor, ProcessImages, RewriteFromBaseShards
from kiln.pipeline.listing import job_uri
from kiln.pipeline.publish import DROPPED_SHA256S_FILE, STAMP_DISAGREEMENTS_FILE
from kiln.pipeline.splits import SplitPolicy
from kiln.pipeline.statistics import Summary, SummaryCombineFn
from kiln.pipeline.targets import TargetCodec
from kiln.pipeline.up_to_date import write_dropped_sha256s
from kiln.schemas import ChannelStatistics, ObjectStatistics, ShardInfo

logger = logging.getLogger(__name__)

REPORT_FILENAME = "report.json"


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """Everything the job needs, decided by the launcher before it starts.

    Attributes:
      spec: The build spec (the validated, resolved config).
      class_names: Sorted class names.
      listing_uri: The listing JSONL file (`kiln.pipeline.listing.Listing.write`),
        or a pattern of the listing job's files (`listing_job`).
      staging_dir: Where shards and errors.jsonl go.
      work_dir: Where temp shards and the report go; deleted before publishing.
      image_threads: Threads per image-processing DoFn instance.
      progress_uri: A local file the job appends one byte to per processed
        file, for the launcher's progress display (`progress`); None: no count.
      base: The version to reuse records from (`incremental`), or None.
      num_files: Files listed (sizes the join with the base).
    """

    spec: BuildSpec
    class_names: tuple[str, ...]
    listing_uri: str
    staging_dir: str
    work_dir: str
    image_threads: int = 1
    progress_uri: str | None = None
    base: incremental.BaseFiles | None = None
    num_files: int = 0

    @property
    def temp_dir(self) -> str:
        return FileSystems.join(self.work_dir, "tmp")

    @property
    def report_uri(self) -> str:
        return FileSystems.join(self.work_dir, REPORT_FILENAME)

    @property
    def dropped_sha256s_uri(self) -> str:
        """The sha256 of the files the job dropped having read them
        (`up_to_date.write_dropped_sha256s`), kept with the version's file stamps."""
        return FileSystems.join(self.work_dir, DROPPED_SHA256S_FILE)

    @property
    def stamp_disagreements_uri(self) -> str:
        """The files the job read that were not as listed
        (`stamp_disagreements.write`: only when there were such files),
        kept with the version's file stamps."""
        return FileSystems.join(self.work_dir, STAMP_DISAGREEMENTS_FILE)


class _ParseListingFn(beam.DoFn):
    """Listing lines (JSON) -> lists of files (main) and DroppedFile
    (``dropped``), counted per reason like the files the job itself drops."""

    def process(self, line: str):
        row = json.loads(line)
        if "dropped" in row:
            dropped = DroppedFile.from_json(row["dropped"])
            Metrics.counter("kiln", f"dropped_{dropped.reason}").inc()
            yield beam.pvalue.TaggedOutput("dropped", dropped)
        else:
            files = row["files"]
            for file in files:
                file["uri"] = job_uri(file["uri"])
            yield files


def construct(pipeline: beam.Pipeline, plan: JobPlan) -> None:
    """Adds the build job's steps to `pipeline` (see the module docstring)."""
    config = plan.spec.config
    listing = (
        pipeline
        | "ReadListing" >> beam.io.ReadFromText(plan.listing_uri, validate=False)  # JSON line
        | "ParseListing" >> beam.ParDo(_ParseListingFn()).with_outputs("dropped", main="files")
        # files: [{key, uri, label, split, size}] (`listing.FILES_PER_LINE`; uri: `job_uri`);
        # dropped: DroppedFile
    )
    base_checks = None
    orphans = None
    if plan.base is None:
        # The listing is one file, read as one bundle; spread it so several
        # workers (and Dataflow's autoscaling) share the images.
        files = listing.files | "SpreadFiles" >> beam.Reshuffle()
        # [{key, uri, label, split, size}]
    else:
        base_checks = pipeline | "VerifyBaseFiles" >> incremental.VerifyBaseFiles(
            plan.base, threads=plan.image_threads
        )
        # (base file name, (problem or "", frames))
        joined = listing.files | "JoinBase" >> incremental.JoinBase(
            plan.base,
            incremental.bucket_count(plan.num_files),
            drop_again=config.targets is None,
        )
        # files: [{key, uri, label, split, size, base: IndexRow or None}], spread by bucket;
        # orphans: (sha256, IndexRow fields) of the base rows whose key is not listed
        files, orphans = joined.files, joined.orphans
    processor = ImageProcessor(
        plan.spec.chain,
        config.image,
        config.encoding,
        plan.class_names,
        SplitPolicy.from_config(config.splits),
        None
        if config.targets is None
        else TargetCodec(config.targets, plan.class_names, config.image.max_pixels),
        base_class_names=None if plan.base is None else plan.base.class_names,
    )

    def process_images(
        moved_digests: beam.PCollection | None = None,
        step: type[ProcessImages] = ProcessImages,
    ) -> ProcessImages:
        return step(
            processor,
            threads=plan.image_threads,
            runs_folder=plan.temp_dir,
            run_bytes=sharding.run_bytes(config.sharding),
            progress_path=plan.progress_uri,
            base=plan.base,
            base_checks=base_checks,
            moved_digests=moved_digests,
        )

    moved_digests = None
    if orphans is not None:
        moved_digests = (
            orphans
            | "PackOrphanDigests"
            >> beam.CombineGlobally(incremental.PackDigestsFn()).without_defaults()
        )  # bytes: the orphans' sorted 8-byte sha256 prefixes (or none)
    processed = files | "ProcessImages" >> process_images(moved_digests)
    runs = processed.runs  # SpilledRun: sorted runs of records, with their contents
    summaries = processed.summary
    dropped = (listing.dropped, processed.dropped) | "AllDropped" >> beam.Flatten()
    # DroppedFile
    all_disagreements = [processed.stamp_disagreements]  # StampDisagreement
    if plan.base is not None:
        moved_files = (processed.deferred, orphans) | "JoinMoved" >> incremental.JoinMoved(
            incremental.bucket_count(plan.num_files)
        )  # [{key, uri, ..., base, moved_from: (sha256, (IndexRow fields, ...))}]
        # The files that may have moved, through the same step again: their
        # records rewritten from the base's, or processed.
        moved = moved_files | "ProcessMovedImages" >> process_images()
        all_runs = [runs, processed.reused, moved.runs, moved.reused]
        all_summaries = [summaries, moved.summary]
        all_dropped = [dropped, moved.dropped]
        all_disagreements.append(moved.stamp_disagreements)
        if plan.base.compression is not None:
            # One record of a gzip base is not read alone: the files whose
            # records are rewritten from one (moved, or relabelled where an
            # id changes its varint width) were handed on, and each base
            # shard they want is read once.
            rewritten = (
                (processed.base_reads, moved.base_reads)
                | "AllBaseReads" >> beam.Flatten()  # (base shard, (position, sha256, file))
                | "RewriteFromBaseShards" >> process_images(step=RewriteFromBaseShards)
            )  # runs: SpilledRun; dropped: DroppedFile; summary: Summary per bundle
            all_runs.append(rewritten.runs)
            all_summaries.append(rewritten.summary)
            all_dropped.append(rewritten.dropped)
            all_disagreements.append(rewritten.stamp_disagreements)
        runs = tuple(all_runs) | "AllRuns" >> beam.Flatten()
        # SpilledRun, and ReusedRun: the records kept from the base, where they are in its shards
        summaries = tuple(all_summaries) | "AllSummaries" >> beam.Flatten()
        dropped = tuple(all_dropped) | "AllDroppedAndMoved" >> beam.Flatten()
    # A side input below: never an image step's own output. Beam's
    # BundleBasedDirectRunner adds every output of a bundle to the side input
    # of a step's FIRST output (`EvaluationContext._update_side_inputs_container`
    # reads `uncommitted_output_bundles[0]` only), so WriteReports got runs and
    # summaries among the disagreements; through a Flatten, it gets its own.
    disagreements = tuple(all_disagreements) | "AllStampDisagreements" >> beam.Flatten()
    shards = runs | "WriteShards" >> sharding.ShardRuns(
        plan.staging_dir,
        plan.temp_dir,
        config.name,
        config.sharding,
        plan.image_threads,
        # Rewrites the class ids of the records relabelled as they are copied.
        relabel=processor.frame_relabel,
    )  # (split, index, ShardInfo)
    # Without a default for empty input: no separate stage to make one; an
    # empty list stands for "no bundles" below.
    summary = (
        summaries | "Summarize" >> beam.CombineGlobally(SummaryCombineFn()).without_defaults()
    )  # Summary
    duplicates = runs | "FindDuplicates" >> FindDuplicates()  # DuplicateGroup
    base_side_inputs = {}
    if base_checks is not None:
        base_side_inputs["base_checks"] = beam.pvalue.AsList(base_checks)
    # The last step: one element, everything else as side inputs. Small
    # aggregates are summed here rather than by their own combining steps:
    # every step costs the job time to build, translate and run.
    _ = (
        pipeline
        | "StartReport" >> beam.Impulse()
        | "WriteReports"
        >> beam.Map(
            _write_reports,
            staging_dir=plan.staging_dir,
            report_uri=plan.report_uri,
            dropped_sha256s_uri=plan.dropped_sha256s_uri,
            stamp_disagreements_uri=plan.stamp_disagreements_uri,
            temp_dir=plan.temp_dir,
            objects=config.targets is not None and config.targets.boxes is not None,
            shards=beam.pvalue.AsList(shards),
            summary=beam.pvalue.AsList(summary),
            duplicates=beam.pvalue.AsList(duplicates),
            dropped=beam.pvalue.AsList(dropped),
            disagreements=beam.pvalue.AsList(disagreements),
            **base_side_inputs,
        )  # nothing: the reports and the record index in the staging folder, the job's
        # report in the work folder
    )


@dataclasses.dataclass(frozen=True)
class SplitReport:
    """What the job wrote for one split.

    Attributes:
      shards: The shard files, in index order.
      class_counts: Label id -> stored images of that class (with targets:
        images carrying the class, so an image may count for several).
      statistics: Per-channel pixel statistics of the stored images.
      images: Images stored in this split.
      objects: The split's objects (datasets with boxes), classes keyed by
        id as text.
      without_classes: Images stored in this split that carry no class
        (with targets and no label).
    """

    shards: tuple[ShardInfo, ...] = ()
    class_counts: Mapping[int, int] = dataclasses.field(default_factory=dict)
    statistics: ChannelStatistics | None = None
    images: int = 0
    objects: ObjectStatistics | None = None
    without_classes: int = 0

    @property
    def num_records(self) -> int:
        return sum(shard.num_records for shard in self.shards)

    @property
    def num_images(self) -> int:
        """Images the image step stored in this split (must equal `num_records`)."""
        return self.images


@dataclasses.dataclass(frozen=True)
class JobReport:
    """Everything a finished job tells the launcher, written to the work
    folder as JSON (`to_json`) by the job's last step.

    Attributes:
      splits: Split name -> `SplitReport`, for every split with records.
      files_read: Files the image step read (stored or dropped).
      dropped: Reason -> rows in errors.jsonl (dropped while listing or by the job).
      duplicates: Extra copies of identical content.
      duplicates_across_splits: Of those, copies in another split than the first.
      image_size: ``[height, width]`` if every stored image has that size.
      smallest_size: ``[least height, least width]`` of the stored images
        (of two images, maybe); None if none was stored.
      inputs_hash: Multiset hash of every file's version entry.
      errors_sha256: sha256 of the errors.jsonl written.
      duplicates_sha256: sha256 of the duplicates.jsonl written.
      index_sha256: sha256 of the index.jsonl written (`record_index`).
      dropped_objects_sha256: sha256 of the dropped_objects.jsonl written
        (datasets with boxes; empty otherwise).
      base_problems: Base file -> why it was not trusted (an incremental
        build; empty when every base file checked out, or without a base).
      boxes: What the boxes of the files decoded say about their convention
        (`box_convention.verdict`; zeros without boxes).
    """

    splits: Mapping[str, SplitReport]
    files_read: int
    dropped: Mapping[str, int]
    duplicates: int
    duplicates_across_splits: int
    image_size: list[int] | None
    inputs_hash: int
    errors_sha256: str
    duplicates_sha256: str
    index_sha256: str = ""
    dropped_objects_sha256: str = ""
    base_problems: Mapping[str, str] = dataclasses.field(default_factory=dict)
    boxes: BoxEvidence = BoxEvidence()
    smallest_size: list[int] | None = None

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def num_records(self) -> int:
        return sum(split.num_records for split in self.splits.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "splits": {
                name: {
                    "shards": [dataclasses.asdict(shard) for shard in split.shards],
                    "class_counts": {
                        str(label): count for label, count in sorted(split.class_counts.items())
                    },
                    "statistics": dataclasses.asdict(split.statistics)
                    if split.statistics
                    else None,
                    "images": split.images,
                    "objects": dataclasses.asdict(split.objects) if split.objects else None,
                    "without_classes": split.without_classes,
                }
                for name, split in sorted(self.splits.items())
            },
            "files_read": self.files_read,
            "dropped": dict(sorted(self.dropped.items())),
            "duplicates": self.duplicates,
            "duplicates_across_splits": self.duplicates_across_splits,
            "image_size": self.image_size,
            "smallest_size": self.smallest_size,
            "inputs_hash": format(self.inputs_hash, "064x"),
            "errors_sha256": self.errors_sha256,
            "duplicates_sha256": self.duplicates_sha256,
            "index_sha256": self.index_sha256,
            "dropped_objects_sha256": self.dropped_objects_sha256,
            "base_problems": dict(sorted(self.base_problems.items())),
            "boxes": self.boxes._asdict(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobReport:
        return cls(
            splits={
                name: SplitReport(
                    shards=tuple(ShardInfo(**shard) for shard in split["shards"]),
                    class_counts={
                        int(label): int(count) for label, count in split["class_counts"].items()
                    },
                    statistics=(
                        ChannelStatistics(**split["statistics"]) if split["statistics"] else None
                    ),
                    images=int(split["images"]),
                    objects=(
                        ObjectStatistics.from_json(split["objects"]) if split["objects"] else None
                    ),
                    without_classes=int(split["without_classes"]),
                )
                for name, split in data["splits"].items()
            },
            files_read=int(data["files_read"]),
            dropped={reason: int(count) for reason, count in data["dropped"].items()},
            duplicates=int(data["duplicates"]),
            duplicates_across_splits=int(data["duplicates_across_splits"]),
            image_size=data["image_size"],
            smallest_size=data.get("smallest_size"),
            inputs_hash=int(data["inputs_hash"], 16),
            errors_sha256=data["errors_sha256"],
            duplicates_sha256=data["duplicates_sha256"],
            index_sha256=data.get("index_sha256", ""),
            dropped_objects_sha256=data.get("dropped_objects_sha256", ""),
            base_problems=dict(data.get("base_problems", {})),
            boxes=BoxEvidence(**data.get("boxes", {})),
        )


def _write_reports(
    _,
    *,
    staging_dir: str,
    report_uri: str,
    dropped_sha256s_uri: str,
    temp_dir: str,
    shards,
    summary,
    duplicates: list[DuplicateGroup],
    dropped: list[DroppedFile],
    objects: bool = False,
    base_checks: Sequence[tuple[str, tuple[str, bytes]]] = (),
    stamp_disagreements_uri: str = "",
    disagreements: Sequence[stamp_disagreements.StampDisagreement] = (),
) -> None:
    errors = write_error_report(staging_dir, dropped)
    write_dropped_sha256s(dropped_sha256s_uri, dropped)
    if stamp_disagreements_uri:
        stamp_disagreements.write(stamp_disagreements_uri, disagreements)
    parts = [
        sharding.index_part_path(temp_dir, info.filename)
        for _, _, info in sorted(shards, key=lambda s: (s[0], s[1]))
    ]
    index = record_index.join_parts(staging_dir, parts)
    report = _assemble_report(
        shards=shards,
        summary=summary,
        duplicates=duplicates,
        dropped=errors.counts,
        errors_sha256=errors.sha256,
        duplicates_sha256=write_duplicate_report(staging_dir, duplicates),
        index_sha256=index.sha256,
        dropped_objects_sha256=(
            write_dropped_objects(staging_dir, index.dropped_objects) if objects else ""
        ),
        base_problems=incremental.untrusted(base_checks),
    )
    with storage.create(report_uri) as f:
        f.write(versioning.canonical_json(report.to_json()).encode("utf-8"))


def _assemble_report(
    *,
    shards,
    summary: list[Summary],
    duplicates: list[DuplicateGroup],
    dropped: dict[str, int],
    errors_sha256: str,
    duplicates_sha256: str,
    index_sha256: str = "",
    dropped_objects_sha256: str = "",
    base_problems: Mapping[str, str] | None = None,
) -> JobReport:
    # One summary, or none when no file reached the image step.
    merged = summary[0] if summary else Summary()
    shards_by_split: dict[str, list[ShardInfo]] = {}
    for split, _, info in sorted(shards, key=lambda s: (s[0], s[1])):
        shards_by_split.setdefault(split, []).append(info)
    counts: dict[str, dict[int, int]] = {}
    for (split, label), count in merged.class_counts.items():
        counts.setdefault(split, {})[label] = count
    statistics = merged.channel_statistics()
    names = sorted(set(shards_by_split) | set(counts) | set(statistics))
    return JobReport(
        splits={
            name: SplitReport(
                tuple(shards_by_split.get(name, ())),
                counts.get(name, {}),
                statistics.get(name),
                merged.images.get(name, 0),
                merged.objects[name].statistics() if name in merged.objects else None,
                merged.unclassed.get(name, 0),
            )
            for name in names
        },
        files_read=merged.files,
        dropped=dict(sorted(dropped.items())),
        duplicates=sum(group.extra_copies for group in duplicates),
        duplicates_across_splits=sum(
            group.extra_copies for group in duplicates if group.across_splits
        ),
        image_size=merged.image_size,
        smallest_size=merged.smallest_size,
        inputs_hash=merged.inputs_hash,
        errors_sha256=errors_sha256,
        duplicates_sha256=duplicates_sha256,
        index_sha256=index_sha256,
        dropped_objects_sha256=dropped_objects_sha256,
        base_problems=dict(base_problems or {}),
        boxes=merged.boxes,
    )


def read_report(uri: str) -> JobReport:
    """The report a finished job wrote (see `construct`)."""
    with FileSystems.open(uri) as f:
        return JobReport.from_json(json.loads(f.read().decode("utf-8")))
