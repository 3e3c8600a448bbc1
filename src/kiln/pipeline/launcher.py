"""Runs a build: config, listing, the Beam job, then metadata and publishing.

`build` is the library entry point (`kiln build` and the tests call it)::

    from kiln.pipeline import build
    result = build("configs/demo.yaml")                    # local runner
    result = build(config_dict, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    print(result.dataset_dir, result.info.splits["train"].num_examples)

What it does, in order:

1. Validate the config (`config.load`); a bad config raises `ConfigError`
   before anything else happens.
2. List the source (`sources.list_source`) and compute the input stamp. If
   a complete version was already built from this listing and config,
   point LATEST at it and return (``up_to_date``) without starting Beam
   (deleting what a killed build left behind, as every build does).
3. Delete stale staging folders, create a new one, write the listing there,
   construct the job (`job.construct`) and run it to completion.
4. Read the job's report. If more than ``errors.max_fraction`` of the inputs
   were dropped, fail (`BuildError`) and publish nothing; the staging folder
   is kept for its errors.jsonl until the next build cleans it up.
5. Derive the content-addressed version (`versioning`), write `kiln.json`
   last, move the folder into place and replace LATEST (`publish`).
6. With ``keep``, prune all but the newest versions (never LATEST's).

The local default runner is Beam's FnApiRunner, the batch engine inside the
DirectRunner, set up exactly as the DirectRunner sets it up. It is chosen
explicitly because the DirectRunner of Beam 2.77 first tries the
PrismRunner, which downloads a binary from GitHub. Every pipeline option
(``--direct_num_workers``, ``--direct_running_mode``, ``--runner``...) is
passed through unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.runners.runner import PipelineState

import kiln
from kiln.pipeline import config as config_module
from kiln.pipeline import job, progress, publish, sources, versioning
from kiln.pipeline.config import ResolvedConfig
from kiln.pipeline.tfds_export import write_tfds_metadata
from kiln.schemas import (
    ERRORS_FILENAME,
    METADATA_FILENAME,
    RECORD,
    ChannelStatistics,
    DatasetInfo,
    ShardInfo,
    SplitInfo,
)

logger = logging.getLogger(__name__)

LOCAL_RUNNER = "FnApiRunner"
_FN_API_RUNNER_NAMES = ("fnapirunner", "apache_beam.runners.portability.fn_api_runner.fnapirunner")


class BuildError(Exception):
    """The build ran but failed (the job failed, too many inputs were dropped).

    Nothing was published. The CLI prints the message and exits 1.
    """


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What a build produced.

    Attributes:
      dataset_dir: The version folder (``<output>/<name>/<version>``).
      version: The version id, which LATEST now names.
      info: The dataset's metadata (its `kiln.json`).
      up_to_date: True if nothing was built: the inputs and config had
        already been built into `version`.
      duplicates_across_splits: Extra copies of identical content that sit
        in a different split than the first copy (possible only when splits
        come from the source); 0 when up to date.
      counters: Beam counters of the run (files_read, images_decoded,
        records_written, dropped_<reason>...); empty when up to date.
      pruned: Versions deleted by ``keep``, newest first.
    """

    dataset_dir: str
    version: str
    info: DatasetInfo
    up_to_date: bool
    duplicates_across_splits: int = 0
    counters: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pruned: tuple[str, ...] = ()

    @property
    def dataset_root(self) -> str:
        """``<output>/<name>``, which readers may open to follow LATEST."""
        return self.dataset_dir.rstrip("/").rsplit("/", 1)[0]


def pipeline_options(pipeline_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options from the command line, with kiln's local default runner."""
    options = PipelineOptions(list(pipeline_args))
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = LOCAL_RUNNER
    # The job's graph is kiln's own and fixed (user code runs inside its
    # steps, not as steps); Beam's construction-time type inference over it
    # catches nothing and costs ~0.1 s of every build.
    options.view_as(TypeOptions).pipeline_type_check = False
    return options


def is_local_runner(options: PipelineOptions) -> bool:
    runner = (options.view_as(StandardOptions).runner or LOCAL_RUNNER).rsplit(".", 1)[-1]
    return runner in StandardOptions.LOCAL_RUNNERS


def default_image_threads(options: PipelineOptions) -> int:
    """Threads per image DoFn when ``--image-threads`` is not given.

    Locally, the cores divided among the runner's worker processes (OpenCV
    releases the GIL, so threads in one process use every core). On a
    distributed runner, one: Dataflow already runs one SDK process per vCPU,
    more threads would only oversubscribe the cores.
    """
    if not is_local_runner(options):
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    direct = options.view_as(DirectOptions)
    workers = direct.direct_num_workers or cores
    if direct.direct_running_mode == "in_memory":
        workers = 1  # in_memory runs bundles one at a time whatever the worker count
    return max(1, cores // workers)


def _runner_for(options: PipelineOptions):
    """The runner instance to use, or None to let Beam create it by name."""
    name = (options.view_as(StandardOptions).runner or "").lower()
    if name not in _FN_API_RUNNER_NAMES:
        return None
    # As the DirectRunner builds it: workers get the pipeline options through
    # the provision info (needed by e.g. FileSystems on gs:// in subprocesses).
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def make_plan(resolved: ResolvedConfig, listing: sources.Listing, staging_dir: str,
              options: PipelineOptions, image_threads: int | None = None) -> job.JobPlan:
    """The job plan for a listing, staged under `staging_dir`.

    Args:
      image_threads: Threads per image DoFn; None: `default_image_threads`.
    """
    work_dir = FileSystems.join(staging_dir, publish.WORK_FOLDER)
    threads = image_threads or default_image_threads(options)
    return job.JobPlan(
        config=resolved.data,
        chain=resolved.chain,
        class_names=tuple(listing.class_names),
        listing_uri=FileSystems.join(work_dir, "listing.jsonl"),
        staging_dir=staging_dir,
        work_dir=work_dir,
        image_threads=threads,
    )


def construct_pipeline(plan: job.JobPlan, options: PipelineOptions) -> beam.Pipeline:
    """A `beam.Pipeline` holding the build job, not yet run."""
    pipeline = beam.Pipeline(runner=_runner_for(options), options=options)
    job.construct(pipeline, plan)
    return pipeline


def build(
    config: str | os.PathLike | Mapping[str, Any] | ResolvedConfig,
    pipeline_args: Sequence[str] = (),
    *,
    output: str | None = None,
    image_threads: int | None = None,
    show_progress: bool = False,
    keep: int | None = None,
) -> BuildResult:
    """Builds (or finds up to date) the dataset a config describes.

    Args:
      config: A YAML file path, the parsed mapping, or a `ResolvedConfig`.
      pipeline_args: Beam pipeline options, e.g. ``["--direct_num_workers=2"]``.
      output: Overrides the config's output root.
      image_threads: Threads per image-processing DoFn instance; None: every
        core on a local runner, 1 on a distributed one (`default_image_threads`).
      show_progress: Redraw a progress line (files done of total, rate, time
        left) on stderr while the job runs; local runners only (`progress`).
      keep: After publishing (or finding the dataset up to date), delete all
        but the `keep` most recently published versions; never the one
        LATEST names. None keeps every version. A failure to prune is
        logged, not raised: the dataset is published.

    Returns:
      The `BuildResult`; LATEST names its version.

    Raises:
      ConfigError: the config is invalid (nothing was done).
      BuildError: the job failed or dropped too many inputs (nothing was
        published).
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    if isinstance(config, ResolvedConfig):
        if output is not None:
            raise ValueError("output= applies to a config file or mapping; a ResolvedConfig "
                             "already has its output root (config.load(..., output=...))")
        resolved = config
    else:
        resolved = config_module.load(config, output=output)
    options = pipeline_options(pipeline_args)
    listing = sources.list_source(resolved)
    stamp = versioning.stamp(resolved.fingerprint, listing.stamp_entries())
    root = resolved.dataset_root

    existing = publish.stamped_version(root, stamp)
    if existing is not None:
        publish.clean_stale_staging(root)
        if publish.latest_version(root) != existing:
            publish.record_published(root, existing)
            publish.point_latest(root, existing)
        logger.info("up to date: %s", existing)
        directory = publish.version_dir(root, existing)
        return BuildResult(directory, existing, read_info(directory), up_to_date=True,
                           pruned=_prune(root, keep))

    publish.clean_stale_staging(root)
    staging = publish.new_staging_dir(root, stamp)
    plan = make_plan(resolved, listing, staging, options, image_threads)
    if show_progress and is_local_runner(options):
        plan = dataclasses.replace(plan, progress_uri=progress.counting_path(plan.work_dir))
    keep_staging = False
    try:
        listing.write(plan.listing_uri)
        pipeline = construct_pipeline(plan, options)
        logger.info("running the build job for %d files", len(listing.files))
        with progress.display(plan.progress_uri, len(listing.files), enabled=show_progress):
            result = pipeline.run()
            state = result.wait_until_finish()
        if state not in (None, PipelineState.DONE):
            raise BuildError(f"the Beam job ended in state {state}")
        counters = _counters(result)
        report = job.read_report(plan.report_uri)

        dropped = sum(report["dropped"].values())
        max_fraction = resolved.data["errors"]["max_fraction"]
        if dropped > max_fraction * listing.total:
            keep_staging = True
            raise BuildError(_too_many_dropped(dropped, listing.total, max_fraction,
                                               report["dropped"], staging))

        inputs_hash = versioning.combine_hashes(
            [int(report["inputs_hash"], 16)]
            + [versioning.entry_hash(entry) for entry in listing.dropped_entries]
        )
        version = versioning.version_name(resolved.fingerprint, inputs_hash)
        info = dataset_info(resolved, listing, report, version)
        publish.delete_tree(plan.work_dir)
        write_tfds_metadata(staging, info)  # TFDS-readable too (dataset_info.json, features.json)
        # kiln.json last: its presence marks the folder complete.
        publish.write_text(FileSystems.join(staging, METADATA_FILENAME), info.dumps())

        target = publish.version_dir(root, version)
        if publish.is_complete(target):
            # Same content and config as an existing version (e.g. the files
            # were touched): same bytes, keep the published copy.
            logger.info("version %s already exists; reusing it", version)
            publish.delete_tree(staging)
        else:
            publish.move_into_place(staging, target)
        publish.record_stamp(root, stamp, version)
        publish.record_published(root, version)
        publish.point_latest(root, version)  # last of all
    except BaseException:
        if not keep_staging:
            try:
                publish.delete_tree(staging)
            except Exception:  # keep the original error; the next build cleans up
                logger.warning("could not delete the staging folder %s", staging, exc_info=True)
        raise
    return BuildResult(
        dataset_dir=target,
        version=version,
        info=info,
        up_to_date=False,
        duplicates_across_splits=int(report["duplicates_across_splits"]),
        counters=counters,
        pruned=_prune(root, keep),
    )


def _prune(root: str, keep: int | None) -> tuple[str, ...]:
    if keep is None:
        return ()
    try:
        return tuple(publish.prune_versions(root, keep))
    except Exception:  # e.g. permission denied on one file: the build itself succeeded
        logger.warning("could not prune old versions of %s", root, exc_info=True)
        return ()


def _too_many_dropped(dropped: int, total: int, max_fraction: float,
                      by_reason: Mapping[str, int], staging: str) -> str:
    reasons = ", ".join(f"{reason}: {count}" for reason, count in
                        sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])))
    return (
        f"dropped {dropped} of {total} input files ({dropped / total:.1%}), more than "
        f"errors.max_fraction {max_fraction:.1%} ({reasons}); nothing was published. "
        f"The rows are in {staging.rstrip('/')}/{ERRORS_FILENAME}"
    )


def _counters(result) -> dict[str, int]:
    try:
        metrics = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("kiln"))
    except Exception:  # some runners (a dry run) have no metrics
        return {}
    counters: dict[str, int] = {}
    for counter in metrics.get("counters", []):
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + int(value)
    return dict(sorted(counters.items()))


def dataset_info(resolved: ResolvedConfig, listing: sources.Listing,
                 report: Mapping[str, Any], version: str) -> DatasetInfo:
    """The `kiln.json` contents for a finished job's report."""
    data = resolved.data
    policy_splits = list(data["splits"]["fractions"]) if data["splits"].get("fractions") \
        else list(listing.split_names or [])
    split_names = sorted(set(policy_splits) | set(report["splits"]))
    splits = {}
    for name in split_names:
        entry = report["splits"].get(name, {"shards": [], "class_counts": {}, "statistics": None})
        shards = [ShardInfo(**shard) for shard in entry["shards"]]
        counts = {label: 0 for label in listing.class_names}
        for label_id, count in entry["class_counts"].items():
            counts[listing.class_names[int(label_id)]] = int(count)
        stats = entry["statistics"]
        splits[name] = SplitInfo(
            name=name,
            num_examples=sum(shard.num_records for shard in shards),
            shards=shards,
            class_counts=counts,
            statistics=ChannelStatistics(**stats) if stats else None,
        )
    encoding = data["encoding"]
    compression = data["sharding"]["compression"]
    return DatasetInfo(
        name=data["name"],
        version=version,
        kiln_version=kiln.__version__,
        format_version=kiln.FORMAT_VERSION,
        config=data,
        config_fingerprint=resolved.fingerprint,
        schema=RECORD.to_json(),
        class_names=list(listing.class_names),
        encoding={"format": encoding["format"], "quality": encoding["quality"]},
        channels=int(data["image"]["channels"]),
        image_size=report["image_size"],
        compression=None if compression == "none" else compression,
        splits=splits,
        augment=list(data["augment"]),
        duplicates=int(report["duplicates"]),
        dropped=dict(report["dropped"]),
    )


def read_info(directory: str) -> DatasetInfo:
    """The `DatasetInfo` of a complete version folder."""
    path = FileSystems.join(directory, METADATA_FILENAME)
    text = publish.read_text(path)
    if text is None:
        raise BuildError(f"{path} is missing")
    return DatasetInfo.loads(text, source=path)
