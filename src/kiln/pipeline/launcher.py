"""Runs a build: config, listing, the Beam job, then metadata and publishing.

`build` is the library entry point (`kiln build` and the tests call it)::

    from kiln.pipeline import build
    result = build("configs/demo.yaml")                    # local runner
    result = build(config_dict, ["--direct_num_workers=2",
                                 "--direct_running_mode=multi_processing"])
    print(result.dataset_dir, result.info.splits["train"].num_examples)

A build, as `build` tells it: validate the config into a `BuildSpec` (a
bad config raises `ConfigError` before anything else happens); take the
dataset's lock and check ``base`` (a version that is not there is a
`UsageError` even when the dataset is up to date); list the
source and stamp the listing; if a complete version was already built from
this stamp (the files modified as its build started read and found as its
records: `up_to_date`), point LATEST at it and stop (``up_to_date``,
without starting Beam), unless someone pointed LATEST at another version by hand after that
version was published: a rollback stands until the inputs or config change.
Otherwise, inside a `publish.PublishTransaction`: run the job
(`job.construct`) into the staging folder, read its typed `job.JobReport`,
refuse too many dropped files (`BuildError`; the staging folder is kept
with its errors.jsonl only, until the next build), refuse an augment list
the reader would refuse on the stored images' size when only the job could
know it, or, when their sizes vary, a crop larger than the smallest of
them (`BuildError`), derive the content-addressed version
(`versioning`) and the `DatasetInfo`, warn about classes and splits
without an example and split names that look misspelt, and commit (kiln.json last, LATEST
last of all). With ``keep``, prune all but the newest versions.

The local default runner is Beam's FnApiRunner, the batch engine inside the
DirectRunner, set up exactly as the DirectRunner sets it up. It is chosen
explicitly because the DirectRunner of Beam 2.77 first tries the
PrismRunner, which downloads a binary from GitHub. Every pipeline option
(``--direct_num_workers``, ``--direct_running_mode``, ``--runner``...) is
passed through unchanged.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import difflib
import functools
import gc
import inspect
import json
import logging
import os
import posixpath
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, NoReturn

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
    TypeOptions,
)
from apache_beam.runners.runner import PipelineState

import kiln
from kiln.errors import DryRun, Failure, UsageError, did_you_mean, quote_text, unexpected
from kiln.pipeline import (
    box_convention,
    images,
    incremental,
    job,
    listing_job,
    pipeline_flags,
    progress,
    publish,
    sources,
    splits,
    storage,
    target_rows,
    up_to_date,
    versioning,
)
from kiln.pipeline import config as config_module
from kiln.pipeline.config import BuildSpec
from kiln.pipeline.lock import DatasetLock
from kiln.pipeline.splits import SplitPolicy
from kiln.registry import ListError
from kiln.schemas import (
    ERRORS_FILENAME,
    ClassObjects,
    DatasetInfo,
    MetadataError,
    ObjectStatistics,
    SplitInfo,
    ordered_splits,
    schema_for,
    version_diff,
)
from kiln.schemas.metadata import OBJECT_SIZE_EDGES

logger = logging.getLogger(__name__)

# What the launcher holds of the source's listing: every row on disk (its own
# listing), or the summary of a listing job's (``source.listing: job``).
SourceListing = sources.Listing | listing_job.ListedInJob

LOCAL_RUNNER = pipeline_flags.LOCAL_RUNNER
_FN_API_RUNNER_NAMES = ("fnapirunner", "apache_beam.runners.portability.fn_api_runner.fnapirunner")


class BuildError(Failure):
    """The build ran but failed (the job failed, too many inputs were dropped).

    Nothing was published. The CLI prints the message and exits 1.
    """


class JobNotSubmitted(BuildError):
    """The runner could not submit the job (`pipeline_flags.submits_job`):
    no credentials, the service refused it, or could not be reached. No
    worker ran; nothing was published. The CLI prints the message and exits 1.
    """


class GateError(BuildError):
    """The new version crossed the publish gate (`build`'s ``gate``): it is
    complete in its folder, but LATEST still names the version it was
    compared with.

    Attributes:
      version: The new version, kept in its folder.
      violations: One line per threshold crossed.
      previous: The version LATEST names, that it was compared with.
      changes: The comparison (`kiln diff --json`'s document), or None when
        the versions could not be compared.
    """

    def __init__(
        self,
        message: str,
        version: str,
        violations: Sequence[str] = (),
        previous: str | None = None,
        changes: dict | None = None,
    ):
        super().__init__(message)
        self.version = version
        self.violations = list(violations)
        self.previous = previous
        self.changes = changes

    @property
    def gate_report(self) -> dict:
        """The ``gate`` of the build's ``--report`` (`build_report.failed`)."""
        return {
            "version": self.version,
            "violations": self.violations,
            "previous_version": self.previous,
            "changes": self.changes,
        }


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What a build produced.

    Attributes:
      dataset_dir: The version folder (``<output>/<name>/<version>``).
      version: The version id, which LATEST now names (unless `latest_set_by_hand`).
      info: The dataset's metadata (its `kiln.json`).
      up_to_date: True if nothing was built: the inputs and config had
        already been built into `version`.
      duplicates_across_splits: Extra copies of identical content that sit
        in a different split than the first copy (possible only when splits
        come from the source); 0 when up to date.
      counters: Beam counters of the run (files_read, images_decoded,
        records_written, dropped_<reason>...); empty when up to date.
      pruned: Versions deleted by ``keep``, newest first.
      incremental: How the build used a base version (`incremental`): the
        records reused and processed, or why it built from scratch; None
        when up to date. Provenance of this run, never in kiln.json.
      previous_version: The version LATEST named before this build, or None.
      changes: What changed from `previous_version` to `version`
        (`kiln.schemas.version_diff`); None if LATEST named no other version
        before, or if the comparison failed (logged: the build stands), or
        if LATEST was left as set by hand.
      latest_set_by_hand: The version LATEST names, left as it was because
        someone pointed LATEST at it by hand after `version` had been
        published (a rollback: `publish.DatasetRoot.latest_set_by_hand`);
        None when LATEST names `version`.
    """

    dataset_dir: str
    version: str
    info: DatasetInfo
    up_to_date: bool
    duplicates_across_splits: int = 0
    counters: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pruned: tuple[str, ...] = ()
    incremental: incremental.IncrementalReport | None = None
    previous_version: str | None = None
    changes: version_diff.VersionDiff | None = None
    latest_set_by_hand: str | None = None

    @property
    def dataset_root(self) -> str:
        """``<output>/<name>``, which readers may open to follow LATEST."""
        return self.dataset_dir.rstrip("/").rsplit("/", 1)[0]


def check_pipeline_args(pipeline_args: Sequence[str], own_flags: Sequence[str] = ()) -> None:
    """Refuses unknown flags, values Beam cannot parse and unknown runners
    (`pipeline_flags.check_flags`).

    Raises:
      UsageError: one line naming the flag; nothing was done.
    """
    pipeline_flags.check_flags(pipeline_args, own_flags)


def pipeline_options(pipeline_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options from the command line, with kiln's local default runner."""
    options = PipelineOptions(list(pipeline_args))
    standard = options.view_as(StandardOptions)
    pipeline_flags.runner_class(standard.runner)
    if not standard.runner:
        standard.runner = LOCAL_RUNNER
    # As Beam's runners read it: True or False, not the flag's text (to
    # Beam, "False" would ask for a dry run).
    test = options.view_as(TestOptions)
    test.dry_run = pipeline_flags.dry_run_value(test.dry_run)
    setup = options.view_as(SetupOptions)
    if setup.requirements_file and setup.requirements_cache is None and is_dry_run(options):
        # A dry run submits nothing, yet Beam's stager would first `pip
        # download` every requirement into its cache (minutes, or a failed
        # dry run without the package index): the file alone is staged.
        setup.requirements_cache = "skip"  # Beam's stager.SKIP_REQUIREMENTS_CACHE
    # The job's graph is kiln's own and fixed (user code runs inside its
    # steps, not as steps); Beam's construction-time type inference over it
    # catches nothing and costs start-up time on every build.
    options.view_as(TypeOptions).pipeline_type_check = False
    return options


def is_dry_run(options: PipelineOptions) -> bool:
    """Whether `options` ask for a dry run (Beam's ``--dry_run=True``, which
    Dataflow's runner honours by translating the job without submitting it;
    `build` refuses it on any other runner, `pipeline_flags.check`)."""
    dry_run = pipeline_flags.dry_run_value(options.view_as(TestOptions).dry_run)
    runner = options.view_as(StandardOptions).runner
    return dry_run and pipeline_flags.is_dataflow(pipeline_flags.runner_class(runner))


def check_dry_run(options: PipelineOptions, what: str) -> None:
    """Raises `DryRun` if `options` ask for a dry run (`is_dry_run`): call
    it once the job was run, before reading anything the job would have
    written."""
    if is_dry_run(options):
        runner = pipeline_flags.runner_name(options.view_as(StandardOptions).runner)
        raise DryRun(f"{what} was translated for {runner} and not submitted; nothing was published")


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
    return fn_runner.FnApiRunner(
        provision_info=fn_runner.ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
        )
    )


# Beam's state sampler (a thread per bundle timing the steps) sleeps up to
# 200 ms between samples, and ending a bundle joins that thread: every
# bundle of the local runner then waits up to 200 ms for nothing (a few
# tenths of a second per build, most of an incremental build's slack). In
# kiln's own process the sampling period is 5 ms while a job runs (on
# Dataflow the workers keep theirs).
LOCAL_SAMPLING_PERIOD_MS = 5


@contextlib.contextmanager
def _short_state_sampling(options: PipelineOptions) -> Iterator[None]:
    """While a job runs in this process: Beam's state sampler wakes every
    `LOCAL_SAMPLING_PERIOD_MS` (see there); its default is restored after."""
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    defaults = init.__defaults__
    if not is_local_runner(options) or defaults is None or len(defaults) != 1:
        yield  # another runner, or a Beam whose sampler takes other arguments
        return
    init.__defaults__ = (LOCAL_SAMPLING_PERIOD_MS,)
    try:
        yield
    finally:
        init.__defaults__ = defaults


# Beam asks the same questions many times while it builds, translates and
# starts a job, each answer costly and fixed for the object asked about:
# a DoFn's state and timer specs (`userstate.get_dofn_specs`: an
# inspect.signature of every method of the DoFn, each time Beam builds,
# validates or translates its step), a view of the pipeline options
# (`PipelineOptions.view_as`: a fresh argparse parser of every registered
# option, for every step applied), and a function's signature
# (`decorators.get_signature`: ~3,000 inspect.signature calls a build, of
# ~120 functions, mostly DoFn's own methods; ~25 ms). Together over a tenth
# of a second of every build's start. While kiln builds and runs a job,
# each is worked out once per object.
@contextlib.contextmanager
def _beam_lookups_once() -> Iterator[None]:
    """While the job is built and run: `userstate.get_dofn_specs` answers
    from a cache per DoFn object, `PipelineOptions.view_as` from one per
    options object and view class, `decorators.get_signature` from one per
    function (a bound method's is its function's, whatever it is bound to);
    Beam's own functions are restored after.

    A view shares its options' values (Beam's views all do), so handing
    out the same view twice changes nothing a caller sees; a signature is
    immutable, and a bound method's is its function's without the first
    parameter (`inspect.signature` does not look at what it is bound to).
    """
    from apache_beam.transforms import core, ptransform, userstate, util
    from apache_beam.typehints import decorators

    get_specs = userstate.get_dofn_specs
    view_as = PipelineOptions.view_as
    get_signature = decorators.get_signature
    # Beam's modules that call it by a name of their own.
    signature_users: list[Any] = [
        module
        for module in (decorators, core, ptransform, util)
        if getattr(module, "get_signature", None) is get_signature
    ]
    # id -> (the object, its answer): the object is held so its id is not reused.
    specs: dict[int, tuple[Any, tuple[Any, Any]]] = {}
    views: dict[tuple[int, type], tuple[Any, Any]] = {}
    signatures: dict[tuple[bool, int], tuple[Any, inspect.Signature]] = {}

    def get_dofn_specs(dofn):
        known = specs.get(id(dofn))
        if known is None or known[0] is not dofn:
            known = specs[id(dofn)] = (dofn, get_specs(dofn))
        state_specs, timer_specs = known[1]
        return set(state_specs), set(timer_specs)  # the caller's own sets, as before

    def cached_view_as(options, cls):
        known = views.get((id(options), cls))
        if known is None or known[0] is not options:
            known = views[(id(options), cls)] = (options, view_as(options, cls))
        return known[1]

    def cached_signature(func):
        bound = inspect.ismethod(func)
        held = func.__func__ if bound else func
        known = signatures.get((bound, id(held)))
        if known is None or known[0] is not held:
            known = signatures[(bound, id(held))] = (held, get_signature(func))
        return known[1]

    userstate.get_dofn_specs = get_dofn_specs
    PipelineOptions.view_as = cached_view_as  # type: ignore[method-assign]
    for module in signature_users:
        module.get_signature = cached_signature
    try:
        yield
    finally:
        userstate.get_dofn_specs = get_specs
        PipelineOptions.view_as = view_as  # type: ignore[method-assign]
        for module in signature_users:
            module.get_signature = get_signature


def make_plan(
    spec: BuildSpec,
    listing: SourceListing,
    staging_dir: str,
    options: PipelineOptions,
    image_threads: int | None = None,
    base: incremental.BaseFiles | None = None,
) -> job.JobPlan:
    """The job plan for a listing, staged under `staging_dir`.

    Args:
      image_threads: Threads per image DoFn; None: `default_image_threads`.
      base: The version to reuse records from, or None (`incremental`).
    """
    work_dir = storage.join(staging_dir, publish.WORK_FOLDER)
    if isinstance(listing, listing_job.ListedInJob):
        listing_uri = listing.listing_uri  # written by the listing job
    else:
        listing_uri = storage.join(work_dir, "listing.jsonl")  # written by `_run_job`
    return job.JobPlan(
        spec=spec,
        class_names=tuple(listing.class_names),
        listing_uri=listing_uri,
        staging_dir=staging_dir,
        work_dir=work_dir,
        image_threads=image_threads or default_image_threads(options),
        base=base,
        num_files=listing.num_files,
    )


def construct_pipeline(plan: job.JobPlan, options: PipelineOptions) -> beam.Pipeline:
    """A `beam.Pipeline` holding the build job, not yet run."""
    pipeline = beam.Pipeline(runner=_runner_for(options), options=options)
    job.construct(pipeline, plan)
    return pipeline


def build(
    config: str | os.PathLike | Mapping[str, Any] | BuildSpec,
    pipeline_args: Sequence[str] = (),
    *,
    output: str | None = None,
    image_threads: int | None = None,
    show_progress: bool = False,
    progress_every: float = progress.DEFAULT_EVERY_SECONDS,
    keep: int | None = None,
    wait: float = 0.0,
    base: str | None = None,
    full: bool = False,
    gate: version_diff.Thresholds | None = None,
    rehash: bool = False,
) -> BuildResult:
    """Builds (or finds up to date) the dataset a config describes.

    Args:
      config: A YAML file path, the parsed mapping, or a `BuildSpec`.
      pipeline_args: Beam pipeline options, e.g. ``["--direct_num_workers=2"]``.
      output: Overrides the config's output root.
      image_threads: Threads per image-processing DoFn instance; None: every
        core on a local runner, 1 on a distributed one (`default_image_threads`).
      show_progress: Show the progress (files done of total, rate, time
        left) on stderr while the job runs, local runners only (`progress`):
        one line redrawn on a terminal, else a plain line every
        `progress_every` seconds (0: none).
      keep: After publishing (or finding the dataset up to date), delete all
        but the `keep` most recently published versions; never the one
        LATEST names. None keeps every version. A failure to prune is
        logged, not raised: the dataset is published.
      wait: Seconds to wait while another build of the dataset holds its
        lock (`lock.DatasetLock`); 0 raises `Busy` at once.
      base: The published version to reuse unchanged records from
        (`incremental`), by id or by its folder; None: the one LATEST
        names, if any.
      full: Build from scratch, reusing nothing.
      rehash: Read and hash every listed file, also those whose stamps
        (size, modification time, a local file's inode and ctime) are those
        the base listed (by default their sha256 is taken from the base's
        record index: `incremental.JoinBase`), and never find the dataset
        up to date by the inputs' stamp, which trusts the same stamps: the
        job runs, and publishes the same version again if no file's bytes
        changed.
      gate: Thresholds (as `kiln diff` takes them) the new version must pass
        against the version LATEST names before LATEST may name it; None,
        or none set, publishes whatever the build made. A version that
        crosses one stays in its folder, unnamed (`GateError`). Without a
        LATEST there is nothing to compare with: the first build publishes.

    Returns:
      The `BuildResult`; LATEST names its version.

    Raises:
      ConfigError: the config or an argument is invalid (nothing was done).
      UsageError: a pipeline flag is unknown or cannot work with this
        runner and config (`pipeline_flags.FlagsError`, one line per
        problem): checked before the lock and the listing, nothing was done.
      UsageError: ``base`` names no complete version of the dataset
        (checked under the lock before the listing, up to date or not).
      Busy: another build of the dataset is running (nothing was done).
      DryRun: the pipeline options ask for a dry run (``--dry_run=True``
        on Dataflow): the job was translated, not submitted, without a lock
        and without writing anything to the output (`_translate_only`).
      BuildError: the job failed, dropped too many inputs, did not account
        for every listed file, stored nothing, or a file could not be
        written (nothing was published).
      GateError: the new version crossed the `gate` (LATEST is unchanged).
    """
    _check_keep(keep)
    if base is not None and full:
        raise UsageError("--base and --full exclude each other: --full reuses no version")
    # The launcher's own file access (the config check, listing, lock,
    # publishing) with the same filesystem options as the job's workers.
    storage.use_pipeline_options(pipeline_args)
    spec = _spec(config, output)
    base = _base_id(spec.dataset_root, base)
    _check_file_name_encoding(spec)
    check_pipeline_args(pipeline_args)
    config_module.check_output_folders(spec)
    options = pipeline_options(pipeline_args)
    # Before anything is done: Beam checks most flags only as the job starts.
    pipeline_flags.check(options, spec)
    if is_dry_run(options):
        _translate_only(
            spec, options, image_threads=image_threads, base=base, full=full, rehash=rehash
        )
    try:
        with DatasetLock(spec.dataset_root, wait=wait) as held:
            # Before the listing and the up-to-date check: a --base that names
            # no version fails the first run, not the first one with changes.
            _check_base(publish.DatasetRoot(spec.dataset_root), base)
            # The listing's rows are on disk until the build ends, failed or not.
            with _listed(spec, options) as listing:
                return _build_locked(
                    spec,
                    listing,
                    options,
                    held,
                    image_threads=image_threads,
                    show_progress=show_progress,
                    progress_every=progress_every,
                    keep=keep,
                    base=base,
                    full=full,
                    gate=gate,
                    rehash=rehash,
                )
    except OSError as e:  # a full disk, a read-only or unwritable output...
        raise BuildError(f"{storage.describe_os_error(e)}; nothing was published") from e


def _translate_only(
    spec: BuildSpec,
    options: PipelineOptions,
    *,
    image_threads: int | None,
    base: str | None,
    full: bool,
    rehash: bool = False,
) -> NoReturn:
    """A dry run (`is_dry_run`): the job the build would run, translated
    for its runner and not submitted, touching nothing of the output.

    It takes no lock and writes nothing (no staging folder, no listing
    file, no LATEST), so it needs no write access, cannot be busy and
    cannot disturb a build that is running; nor does it delete what failed
    builds left (that is for the lock's holder). It reads the output only
    for the version whose records the job would reuse (LATEST's, or
    ``--base``'s, and its kiln.json: their files are steps of the job);
    with ``full`` it reads nothing of the output. It translates the job
    whether or not the dataset is up to date; its message says which, and
    what a build would do (`_outlook`; with ``full``, without reading the
    output: a build from scratch).

    Raises:
      DryRun: always, once the job (or, with ``source.listing: job``, the
        listing job, whose summary the build job is made from) was translated.
      UsageError: the output cannot be reached to read the version to reuse
        (naming ``--full``, which does without it), or no ``--base`` version.
      ConfigError: the source cannot be listed.
    """
    dataset = publish.DatasetRoot(spec.dataset_root)
    # The output first: the source's listing may take a while.
    try:
        if not full:
            storage.check_credentials(dataset.path)
        previous = None if full else dataset.latest()
        _check_base(dataset, base)
        choice = incremental.choose_base(
            dataset.path, dataset.read_info, previous, base, spec.to_json(), full
        )
        choice = _with_file_stamps(dataset, choice, rehash)
    except Exception as e:  # the first access to the output
        reason = storage.unreachable_reason(e)
        if reason is None:
            raise
        raise UsageError(
            f"{dataset.path}: cannot reach it: {reason}; a dry run reads LATEST and that "
            f"version's kiln.json to translate the job that reuses its records (--full "
            f"translates a build from scratch without reading the output); nothing was done"
        ) from e
    _log_base(choice)
    with _listed(spec, options) as listing:
        _warn_about_shard_counts(spec, listing)
        processing = incremental.processing_fingerprint(spec.to_json())
        stamp = versioning.stamp_of(
            spec.fingerprint, _listing_hash(spec, listing), processing=processing
        )
        plan = make_plan(
            spec, listing, dataset.new_staging_dir(stamp), options, image_threads, choice.base
        )
        built = None if full or rehash else _built_from(dataset, stamp, listing)
        try:
            _run_job(plan, listing, options, show_progress=False, progress_every=0)
        except DryRun as e:
            raise DryRun(f"{e} ({_outlook(listing, choice, built, full)})") from None
    raise AssertionError("a dry run's job ends in DryRun (_check_finished)")


def _built_from(dataset: publish.DatasetRoot, stamp: str, listing: SourceListing) -> str | None:
    """The complete version already built from the input stamp `stamp`, or
    None: what a build finds up to date (`up_to_date.check`)."""
    info = up_to_date.check(dataset, stamp, listing).info
    return info.version if info is not None else None


def _outlook(
    listing: SourceListing, choice: incremental.BaseChoice, built: str | None, full: bool
) -> str:
    """What a real build would do, as a dry run finds it (for its one line)."""
    if built is not None:
        return f"up to date: a build would run no job and point LATEST at version {built}"
    files = f"{listing.num_files} listed file{'' if listing.num_files == 1 else 's'}"
    if full:
        return (
            f"a build would process all {files} from scratch, unless the dataset is up to "
            f"date: with --full the dry run reads nothing of the output"
        )
    if choice.base is None:
        return f"a build would process all {files}, from scratch: {choice.reason}"
    return (
        f"a build would run the job over {files}, reusing the unchanged records of "
        f"version {choice.version}"
    )


@contextlib.contextmanager
def _listed(spec: BuildSpec, options: PipelineOptions) -> Iterator[SourceListing]:
    """The source's listing until the build ends: by the launcher, or by a
    listing job (``source.listing: job``, `listing_job`) whose files are
    deleted at the end. Call it holding the dataset's lock, or for a dry
    run (`is_dry_run`: its listing job writes nothing, so nothing is
    cleaned or deleted).

    Raises:
      ConfigError: the source cannot be listed, or holds no usable image.
      BuildError: the listing job failed otherwise.
    """
    source = spec.config.source
    if not (
        isinstance(source, (sources.ImageFolderSource, sources.ManifestSource))
        and source.listing == "job"
    ):
        with spec.list_source() as listing:
            _check_split_names(spec, listing.split_names)
            yield listing
        return
    dry_run = is_dry_run(options)
    listing_dir = publish.DatasetRoot(spec.dataset_root).new_listing_dir(clean=not dry_run)
    try:
        listed = list_in_job(spec, options, listing_dir)
        _check_split_names(spec, listed.split_names)
        yield listed
    finally:
        if not dry_run:  # a dry run's listing job wrote nothing there
            _delete_listing_dir(listing_dir)


def _delete_listing_dir(listing_dir: str) -> None:
    try:
        storage.delete_tree(listing_dir)
    except Exception:  # keep the build's own outcome; the next build deletes it
        logger.warning("could not delete the listing folder %s", listing_dir, exc_info=True)


def _check_split_names(spec: BuildSpec, names: Sequence[str] | None) -> None:
    """Refuses split names from the source (``splits.from_source``) that
    differ only in case: ``Train`` beside ``train`` is a typo that would
    make a split of its own.

    Raises:
      ConfigError: naming the config and the names.
    """
    by_folded: dict[str, list[str]] = {}
    for name in names or ():
        by_folded.setdefault(name.casefold(), []).append(name)
    clashes = [sorted(group) for group in by_folded.values() if len(group) > 1]
    if clashes:
        listed = "; ".join(" and ".join(repr(name) for name in group) for group in clashes)
        raise spec.error(
            f"{spec.config.source.describe()}: the source names splits that differ only in "
            f"case ({listed}): each would be a split of its own; name them alike"
        )


def list_in_job(
    spec: BuildSpec, options: PipelineOptions, listing_dir: str
) -> listing_job.ListedInJob:
    """Lists the source in a listing job (`listing_job`) on the runner
    `options` name, which writes its files into `listing_dir` (the caller
    deletes them): an image folder's folders are listed here and their
    objects in the job; a manifest's rows are read and their objects looked
    up in the job.

    Raises:
      ConfigError: the source is neither an image folder nor a manifest,
        cannot be listed or read, or names nothing to build (`sources.names_nothing`).
      BuildError: the listing job failed otherwise.
    """
    source = spec.config.source
    from_source = spec.config.splits.from_source
    listing_plan: listing_job.ListingJobPlan | listing_job.ManifestListingPlan
    with _beam_lookups_once():
        pipeline = beam.Pipeline(runner=_runner_for(options), options=options)
        if isinstance(source, sources.ImageFolderSource):
            listing_plan = listing_job.plan(source.root, from_source, source.classes, listing_dir)
            listing_job.construct(pipeline, listing_plan)
            logger.info("running the listing job over %d folders", len(listing_plan.prefixes))
        elif isinstance(source, sources.ManifestSource):
            listing_plan = listing_job.manifest_plan(
                source.path, from_source, source.classes, source.allowed_roots, listing_dir
            )
            listing_job.construct_manifest(pipeline, listing_plan)
            logger.info("running the listing job over the rows of %s", source.path)
        else:
            raise spec.error(
                f"{source.describe()}: only an image_folder or a manifest is listed in a job"
            )
        try:
            state = _run_pipeline(pipeline, options, what="the listing job")[1]
        except JobNotSubmitted:
            raise
        except Exception as e:  # a worker's error, re-raised by the runner
            problem = _listing_problem(e)
            if problem and problem.startswith(listing_job.MANIFEST_PROBLEM):
                # The launcher's words for a manifest it cannot use.
                raise spec.error(
                    f"source.path: {problem[len(listing_job.MANIFEST_PROBLEM) :]}"
                ) from e
            if problem:
                raise spec.error(f"{source.describe()}: {problem}") from e
            raise BuildError(
                f"the listing job failed writing under {listing_dir}: {_job_error(e)}; "
                f"nothing was published"
            ) from e
    _check_finished(options, state, "the listing job")
    listing = listing_job.read_summary(listing_plan)
    if sources.names_nothing(listing.num_files, listing.num_dropped, listing.class_names):
        raise spec.error(source.no_usable_image(listing.num_dropped, listing.first_dropped))
    logger.info(
        "listed %d files (%d dropped) in %d classes in the job",
        listing.num_files,
        listing.num_dropped,
        len(listing.class_names),
    )
    return listing


def _listing_problem(error: BaseException) -> str | None:
    """``cannot list <prefix>: <why>`` (or ``manifest problem: <why>``) if
    `error` (or its cause) is a `listing_job.SourceListingError`, however
    the runner wrapped it."""
    return _marked_line(error, listing_job.CANNOT_LIST, listing_job.MANIFEST_PROBLEM)


def _marked_line(error: BaseException, *markers: str) -> str | None:
    """The first line of `error`'s message (or its causes') holding one of
    `markers`, from the marker on, without Beam's ``[while running ...]``:
    a worker's error of kiln's own, however the runner wrapped it (a worker
    process's error arrives as the text of its traceback)."""
    cause: BaseException | None = error
    while cause is not None:
        for line in str(cause).splitlines():
            for marker in markers:
                start = line.find(marker)
                if start >= 0:
                    return line[start:].split(" [while running", 1)[0].strip()
        cause = cause.__cause__ or cause.__context__
    return None


def _build_locked(
    spec: BuildSpec,
    listing: SourceListing,
    options: PipelineOptions,
    held: DatasetLock,
    *,
    image_threads: int | None,
    show_progress: bool,
    progress_every: float,
    keep: int | None,
    base: str | None = None,
    full: bool = False,
    gate: version_diff.Thresholds | None = None,
    rehash: bool = False,
) -> BuildResult:
    _warn_about_shard_counts(spec, listing)
    _check_listed_box_convention(spec, listing)
    dataset = publish.DatasetRoot(spec.dataset_root)
    previous = dataset.latest()
    check_gate = _publish_gate(dataset, previous, gate)
    no_latest = None if previous is not None else dataset.latest_names_none()
    if no_latest is not None:
        logger.warning(
            "%s, though version(s) were published (%s): nothing to reuse records from or "
            "compare with; this build makes LATEST name the version it publishes (write one "
            "of those into LATEST to go back to it)",
            no_latest,
            ", ".join(dataset.published_versions()),
        )
    # The config refuses stratify with a listing by the job (`ListedInJob`).
    if spec.config.splits.stratify and isinstance(listing, sources.Listing):
        _stratify(spec, listing, dataset, previous)
    processing = incremental.processing_fingerprint(spec.to_json())
    stamp = versioning.stamp_of(
        spec.fingerprint, _listing_hash(spec, listing), processing=processing
    )

    # --rehash trusts no stamp, the inputs' as a whole included: an object
    # rewritten with its size and update time as listed is found. --full
    # trusts no published file: an unchanged dataset is built again, and
    # its published version repaired where damaged (`PublishTransaction.commit`).
    built = None if rehash or full else up_to_date.check(dataset, stamp, listing, refresh=True).info
    if built is not None and _damaged_before_named(dataset, built, previous):
        built = None  # the job makes it again, and its files are repaired
    if built is not None:
        dataset.clean_leftovers()
        by_hand = dataset.latest_set_by_hand(built.version)  # a rollback stands
        changes = None
        if by_hand is None:
            latest = _latest_now(dataset, previous)  # a rollback since it was read
            if latest != previous:
                previous, check_gate = latest, _publish_gate(dataset, latest, gate)
            if check_gate is not None and built.version != previous:
                check_gate(dataset.version_dir(built.version))
            # Before LATEST names it (`_comparing_first`).
            changes = _changes(dataset, previous, built.version)
            held.check()
            dataset.name_latest(built.version)
        logger.info("up to date: %s", built.version)
        _warn_about_vanished_splits(changes)
        return BuildResult(
            dataset.version_dir(built.version),
            built.version,
            built,
            up_to_date=True,
            previous_version=previous,
            changes=changes,
            pruned=_prune(dataset, keep, stamp),
            latest_set_by_hand=by_hand,
        )

    choice = incremental.choose_base(
        dataset.path, dataset.read_info, previous, base, spec.to_json(), full
    )
    choice = _with_file_stamps(dataset, choice, rehash)
    _log_base(choice)
    # Before the job reads any file: the next build trusts only stamps older
    # than this (`incremental.RACY_SECONDS`).
    started = time.time()
    with publish.PublishTransaction(dataset, stamp) as transaction:
        plan = make_plan(
            spec, listing, transaction.staging_dir, options, image_threads, choice.base
        )
        if show_progress and is_local_runner(options):
            plan = dataclasses.replace(plan, progress_uri=progress.counting_path(plan.work_dir))
        report, counters = _run_job(plan, listing, options, show_progress, progress_every)
        _check_accounted(listing, report)
        # Before the dropped files: boxes in another convention are the
        # reason many of them were dropped, and say what to change.
        _check_box_convention(spec, report, transaction)
        if _more_than(report.dropped_total, listing.total, spec.config.errors.max_fraction):
            transaction.keep_staging(only=[ERRORS_FILENAME])
            raise BuildError(
                _too_many_dropped(
                    report, listing.total, spec.config.errors.max_fraction, transaction.staging_dir
                )
            )
        if report.num_records == 0 and not spec.config.errors.allow_empty:
            transaction.keep_staging(only=[ERRORS_FILENAME])
            raise BuildError(
                f"no example was stored (all {listing.total} input files were "
                f"dropped); an empty dataset is published only with "
                f"errors.allow_empty: true. "
                f"{_first_dropped(report, transaction.staging_dir)}The rows are in "
                f"{transaction.staging_dir.rstrip('/')}/{ERRORS_FILENAME}"
            )
        _check_augment_fits(spec, report)
        info = dataset_info(spec, listing, report, _version(spec, processing, listing, report))
        _warn_about_empty_classes(info)
        _warn_about_numbers_sorted_as_text(spec, info.class_names)
        _warn_about_empty_splits(spec, info)
        _warn_about_split_names(spec, info)
        held.check()
        compared: list[version_diff.VersionDiff | None] = []
        # What LATEST names as the version is about to be published: the
        # version the build started from, unless it was set by hand meanwhile.
        named: list[str | None] = []
        target = transaction.commit(
            info,
            gate=_comparing_first(
                _gate_against_latest(dataset, previous, check_gate, gate, named),
                lambda: _changes(dataset, named[-1], info.version),
                compared,
                still_held=held.check,
            ),
            listing_files=_listing_files(plan),
            listed_from=started,
            dropped_sha256s=plan.dropped_sha256s_uri,
            stamp_disagreements=plan.stamp_disagreements_uri,
            checked=_checked_files(choice, info.version, report.base_problems),
        )
    by_hand = dataset.latest_set_by_hand(info.version)  # a rollback stands
    # Compared before LATEST named it (none when a rollback stood: not named).
    changes = compared[0] if compared and by_hand is None else None
    _warn_about_vanished_splits(changes)
    return BuildResult(
        dataset_dir=target,
        version=info.version,
        info=info,
        up_to_date=False,
        duplicates_across_splits=report.duplicates_across_splits,
        counters=counters,
        previous_version=named[-1] if named else previous,
        changes=changes,
        pruned=_prune(dataset, keep, stamp),
        incremental=incremental.IncrementalReport.from_run(choice, counters, report.base_problems),
        latest_set_by_hand=by_hand,
    )


def _damaged_before_named(
    dataset: publish.DatasetRoot, built: DatasetInfo, previous: str | None
) -> bool:
    """Whether the version the inputs' stamp found, which LATEST is about to
    name, has files that are not what its kiln.json records (logged as a
    warning naming them).

    A plain build trusts the version LATEST names (`kiln verify` checks
    it). Not one LATEST is about to name: a version the publish gate held
    back, or one a build stopped just before LATEST, sat unpublished in its
    folder, where a shard can have been deleted or damaged since; named as
    up to date, every reader of LATEST would get it so. Checked like the
    base of an incremental job (every file hashed), only when LATEST would
    move. A damaged one is built again, and `publish.PublishTransaction.commit`
    replaces its damaged files with the job's copy, as ``--rehash`` does.
    """
    if built.version == previous or dataset.latest_set_by_hand(built.version) is not None:
        return False  # LATEST names it, or stays as set by hand
    folder = dataset.version_dir(built.version)
    damaged = publish.damaged_files(dataset.store, folder, built)
    if not damaged:
        return False
    logger.warning(
        "version %s, which these inputs were built into, is damaged (%s): it is built again "
        "and repaired before LATEST may name it",
        built.version,
        "; ".join(damaged[name] for name in sorted(damaged)),
    )
    return True


def _base_id(dataset_root: str, base: str | None) -> str | None:
    """``--base`` as a version id: given as a version folder of the dataset
    (``out/photos/3f2a9c1b0d4e``), its name.

    Raises:
      UsageError: `base` is a path to a folder outside the dataset folder.
    """
    if base is None or ("/" not in base and os.sep not in base):
        return base
    remote = storage.is_remote(base) or storage.is_remote(dataset_root)
    parent, name = (posixpath if remote else os.path).split(base.rstrip("/" + os.sep))
    same = (
        parent.rstrip("/") == dataset_root.rstrip("/")
        if remote
        else (os.path.abspath(parent) == os.path.abspath(dataset_root))
    )
    if not same:
        raise UsageError(
            f"--base {base}: not a version folder of {dataset_root}: --base takes the id of "
            f"one of its versions (the name of its folder, e.g. --base {name})"
        )
    return name


def _checked_files(
    choice: incremental.BaseChoice, version: str, problems: Mapping[str, str]
) -> dict[str, str]:
    """The files of `version` the job already hashed against its kiln.json
    (name -> problem, "" when it matched): its base's, when the base is
    that version (a rebuild of the same inputs), else none."""
    if choice.base is None or choice.base.version != version:
        return {}
    return {name: problems.get(name, "") for name, _ in choice.base.files}


def _check_base(dataset: publish.DatasetRoot, base: str | None) -> None:
    if base is not None and not dataset.is_complete(base):
        raise UsageError(f"--base {base}: no complete version {base} in {dataset.path}")


def _with_file_stamps(
    dataset: publish.DatasetRoot, choice: incremental.BaseChoice, rehash: bool
) -> incremental.BaseChoice:
    """`choice` with the listing its base was built from, whose files'
    stamps the job trusts (`incremental.JoinBase`), but those its job found
    otherwise as it read them (`stamp_disagreements`); without one
    (``--rehash``, a base built before kiln kept them, an output that
    cannot be listed), with the reason every file is read and hashed; and
    the files its job dropped, those it dropped as undecodable dropped again
    unread where their stamps are unchanged (`incremental.dropped_again`)."""
    if choice.base is None:
        return choice
    if rehash:
        return choice.with_stamps((), "--rehash")
    try:
        stamps = dataset.file_stamps(choice.base.version)
        listed_from = dataset.file_stamps_listed_from(choice.base.version) if stamps else None
        disagreements = dataset.stamp_disagreements(choice.base.version)
        if not (stamps and dataset.store.exists(disagreements)):
            disagreements = ""
        dropped = dataset.dropped_sha256s(choice.base.version)
        if not (stamps and dataset.store.exists(dropped)):
            dropped = ""
    except Exception as e:  # never fails the build: the files are hashed
        logger.warning(
            "cannot list the file stamps of base %s: %s", choice.base.version, _last_line(e)
        )
        return choice.with_stamps(
            (), f"the file stamps of base {choice.base.version} cannot be listed"
        )
    if not stamps or listed_from is None:
        logger.info(
            "base %s keeps no file stamps: every file is read and hashed", choice.base.version
        )
        return choice.with_stamps(
            (),
            f"base {choice.base.version} keeps no file stamps (built by an older kiln, or "
            f"{publish.FILE_STAMPS_FOLDER}/{choice.base.version} was deleted)",
        )
    return choice.with_stamps(
        stamps, listed_from=listed_from, disagreements=disagreements, dropped=dropped
    )


def _listing_files(plan: job.JobPlan) -> list[str]:
    """The files of the job's listing (the launcher's one, or a listing
    job's), to keep with the version (`publish.DatasetRoot.record_file_stamps`);
    none if they cannot be found (logged: the next build reads every file)."""
    try:
        return sorted(m.path for m in FileSystems.match([plan.listing_uri])[0].metadata_list)
    except Exception as e:
        logger.warning("cannot find the job's listing %s: %s", plan.listing_uri, _last_line(e))
        return []


def _log_base(choice: incremental.BaseChoice) -> None:
    if choice.base is None:
        logger.info("building from scratch: %s", choice.reason)
    else:
        logger.info("reusing unchanged records of version %s", choice.version)


def _publish_gate(
    dataset: publish.DatasetRoot, previous: str | None, thresholds: version_diff.Thresholds | None
) -> Callable[[str], None] | None:
    """The check a new version's folder must pass before LATEST names it
    (`build`'s ``gate``), or None where there is nothing to check."""
    if thresholds is None or not thresholds.any:
        return None
    no_latest = None if previous is not None else dataset.latest_names_none()
    if previous is None and no_latest is None:
        return None  # the first version: nothing to compare with

    def check(version_dir: str) -> None:
        version = version_dir.rstrip("/").rsplit("/", 1)[-1]
        if version == previous:
            return
        if previous is None:
            others = [v for v in dataset.published_versions() if v != version]
            if not others:  # the one version published is this one: as before
                return
            raise GateError(
                f"the publish gate cannot compare with LATEST's version: {no_latest}, "
                f"though version(s) were published ({', '.join(others)}); version {version} "
                f"is in {version_dir} but was not published: repair LATEST (write the "
                f"version to compare with into it), or build without the gate flags",
                version,
            )
        try:
            diff = version_diff.compare(
                version_diff.open_version(dataset.version_dir(previous)),
                version_diff.open_version(version_dir),
            )
        except MetadataError as e:
            raise GateError(
                f"the publish gate cannot compare with LATEST's version {previous} ({e}); "
                f"version {version} is in {version_dir} but was not published: repair "
                f"LATEST, or build without the gate flags",
                version,
                previous=previous,
            ) from None
        violations = diff.violations(thresholds)
        if violations:
            raise GateError(
                f"version {version} crossed the publish gate against LATEST ({previous}): "
                + "; ".join(violations)
                + f". It is in {version_dir} but was not published (LATEST still names "
                f"{previous}); compare with `kiln diff {previous} {version_dir}`, and build "
                f"without the gate flags to publish it",
                version,
                violations,
                previous=previous,
                changes=diff.to_json(),
            )

    return check


def _latest_now(dataset: publish.DatasetRoot, previous: str | None) -> str | None:
    """The version LATEST names now. When it is not `previous`, the one it
    named when the build read it, someone wrote LATEST by hand while the
    build ran (a rollback; under the lock no build did): logged as a warning."""
    now = dataset.latest()
    if now != previous:
        logger.warning(
            "LATEST was changed while this build ran (it named %s, now %s): the new version "
            "is compared with %s before LATEST may name it",
            previous or "no version",
            now or "no version",
            now or "nothing",
        )
    return now


def _gate_against_latest(
    dataset: publish.DatasetRoot,
    previous: str | None,
    check_gate: Callable[[str], None] | None,
    thresholds: version_diff.Thresholds | None,
    named: list[str | None],
) -> Callable[[str], None] | None:
    """The publish gate of a build that ran its job: against the version
    LATEST names when the gate is checked, not only when the build began.

    A job runs for minutes or hours; a rollback by hand meanwhile (LATEST
    written back to an older version, as README's "Rolling back" does) must
    be what the new version is compared with, as for a build started after
    it: compared with the version LATEST named before, a version that crosses
    the thresholds against the one readers are back on was published over
    the rollback. Appends the version compared with to `named` (for the
    report's `previous_version` and `changes`).
    """

    def check(version_dir: str) -> None:
        current = _latest_now(dataset, previous)
        gate_now = (
            check_gate if current == previous else _publish_gate(dataset, current, thresholds)
        )
        named.append(current)
        if gate_now is not None:
            gate_now(version_dir)

    return check


def _comparing_first(
    gate: Callable[[str], None] | None,
    compare: Callable[[], version_diff.VersionDiff | None],
    compared: list[version_diff.VersionDiff | None],
    *,
    still_held: Callable[[], None],
) -> Callable[[str], None]:
    """The check `publish.PublishTransaction.commit` runs before LATEST names
    the new version: the publish `gate`, if any, then the comparison with the
    previous version for the summary and the report (`_changes`), appended
    to `compared`, and last `still_held` (`DatasetLock.check`): on an object
    store the version's copy and the comparison take minutes on a large
    dataset, long enough for a stalled build's lock to be broken and taken
    by the next build, which must then be the one that writes LATEST.

    Compared before, not after: the comparison reads both versions' record
    indexes, seconds for a large dataset, and a Ctrl-C or SIGTERM then
    (exit 130 or 143, "nothing was published") must find LATEST as it was,
    the complete version left for the next build to publish as up to date.
    After LATEST was written it exited 143 with the new version published.
    """

    def check(version_dir: str) -> None:
        if gate is not None:
            gate(version_dir)
        compared.append(compare())
        still_held()

    return check


def _changes(
    dataset: publish.DatasetRoot, previous: str | None, version: str
) -> version_diff.VersionDiff | None:
    """The diff from the version LATEST named before the build, or None.

    A previous version that cannot be read (removed by hand, damaged) does
    not fail a build that published: the summary just has no diff line, and
    one warning line names the problem (the traceback is logged at DEBUG,
    for ``--verbose``). A previous version whose kiln.json the build found
    damaged was warned about then (`publish.DatasetRoot.read_info`): not again.
    """
    if previous is None or previous == version or dataset.found_damaged(previous):
        return None
    try:
        return version_diff.compare(
            version_diff.open_version(dataset.version_dir(previous)),
            version_diff.open_version(dataset.version_dir(version)),
        )
    except Exception as e:
        logger.warning(
            "could not compare with the previous version %s: %s", previous, _last_line(e)
        )
        logger.debug("comparing with %s failed", previous, exc_info=True)
        return None


def _stratify(
    spec: BuildSpec, listing: sources.Listing, dataset: publish.DatasetRoot, latest: str | None
) -> None:
    """Assigns every listed file its split, class by class (``splits.stratify``):
    the files LATEST holds keep theirs. By image label (`splits.stratify_class`),
    or, for targets without one, by the classes of an image's ``labels`` and
    objects (`splits.stratify_class_sets`).

    Raises:
      BuildError: LATEST's records cannot be read; assigning afresh would
        move files between splits (test images into train).
    """
    policy = SplitPolicy.from_config(spec.config.splits)
    fractions = dict(policy.fractions or ())
    previous = _previous_splits(spec, dataset, latest)

    def draw(key: str) -> float:
        return policy.draw(key, "")

    targets = spec.config.targets
    try:
        if targets is not None and targets.label is None:
            class_ids = {name: i for i, name in enumerate(listing.class_names)}

            def classes_of(text: str | None) -> tuple[int, ...]:
                names = target_rows.class_names(json.loads(text)) if text else ()
                return tuple(sorted({class_ids[n] for n in names if n in class_ids}))

            listing.assign_splits_by_class_sets(draw, classes_of, fractions, previous)
        else:
            assign_class = functools.partial(splits.stratify_class, fractions)
            listing.assign_splits(draw, assign_class, previous)
    except MetadataError as e:
        raise BuildError(
            f"splits.stratify keeps the splits of LATEST ({latest}), which cannot be read: "
            f"{e}; repair it, or point LATEST at a readable version"
        ) from e


def _previous_splits(
    spec: BuildSpec, dataset: publish.DatasetRoot, latest: str | None
) -> Iterator[tuple[str, str]]:
    """``(key, split)`` of every record of LATEST, if it was split with the
    same ``splits`` config (another config draws afresh, as it does without
    ``stratify``)."""
    if latest is None:
        return
    base = version_diff.open_version(dataset.version_dir(latest))
    if base.info.config.get("splits") != spec.to_json()["splits"]:
        logger.info("LATEST (%s) was split with another splits config: assigning afresh", latest)
        return
    # A record index deleted or damaged by hand (`kiln verify` fails) is
    # what --full and --rehash repair: the splits are in the shards too, each
    # record in its split's. Refusing here, every build of the dataset failed,
    # the repair included.
    problem = version_diff.index_problem(base)
    if problem is not None:
        logger.warning(
            "splits.stratify: the record index of LATEST (%s) cannot be read (%s): the "
            "splits of its records are read from its shards",
            latest,
            problem,
        )
        base = dataclasses.replace(base, index_sha256=None)
        try:
            for record in version_diff.records(base):
                yield record.key, record.split
        except Exception as e:  # a shard cut short, deleted: TensorFlow's errors
            raise MetadataError(f"{problem}; nor can its shards: {_last_line(e)}") from e
        return
    for record in version_diff.records(base):
        yield record.key, record.split


def _check_keep(keep: int | None) -> None:
    if keep is not None and keep < 1:
        raise UsageError(f"--keep must be at least 1 (LATEST's version), got {keep}")


def _check_file_name_encoding(spec: BuildSpec) -> None:
    """Refuses a local source where Python decodes file names otherwise than as UTF-8.

    Keys, class names and so the version are made of file names read as
    UTF-8. Under a locale whose encoding is not UTF-8 (Latin-1, or C with
    Python's UTF-8 mode and locale coercion turned off), Python decodes the
    same bytes otherwise: the same files would give other keys and another
    version, or be dropped as `bad_name`. Object stores name objects in UTF-8
    whatever the locale.

    Raises:
      UsageError: naming the encoding and the remedy.
    """
    encoding = sys.getfilesystemencoding()
    if codecs.lookup(encoding).name == "utf-8":
        return
    local = [
        field
        for field, place in spec.config.source.location_paths()
        if not storage.is_remote(place)
    ]
    if local:
        raise UsageError(
            f"source.{local[0]} is local and Python reads local file names as {encoding}, not "
            "UTF-8 (the locale's encoding): the same files would give other keys and another "
            "version; run kiln with PYTHONUTF8=1, or in a UTF-8 locale (LC_ALL=C.UTF-8)"
        )


def _spec(
    config: str | os.PathLike | Mapping[str, Any] | BuildSpec, output: str | None
) -> BuildSpec:
    if not isinstance(config, BuildSpec):
        return config_module.load(config, output=output)
    if output is not None:
        raise UsageError(
            "output= applies to a config file or mapping; a BuildSpec "
            "already has its output root (config.load(..., output=...))"
        )
    return config


def _run_job(
    plan: job.JobPlan,
    listing: SourceListing,
    options: PipelineOptions,
    show_progress: bool,
    progress_every: float,
) -> tuple[job.JobReport, dict[str, int]]:
    """Writes the listing (unless a listing job did, or the job is only
    translated: `is_dry_run`), runs the job to completion (`_job_heap`) and
    reads its report."""
    with _job_heap():
        if isinstance(listing, sources.Listing) and not is_dry_run(options):
            listing.write(plan.listing_uri)
        with _beam_lookups_once():
            pipeline = construct_pipeline(plan, options)
            logger.info("running the build job for %d files", listing.num_files)
            display = progress.display(
                plan.progress_uri, listing.num_files, enabled=show_progress, every=progress_every
            )
            try:
                result, state = _run_pipeline(pipeline, options, display, "the Beam job")
            except JobNotSubmitted:
                raise
            except Exception as e:  # a worker's error, re-raised by the runner with its traceback
                aborted = _marked_line(e, images.TRANSFORM_ABORTED)
                if aborted:  # a bug in a transform: an internal error (exit 70), not a failure
                    raise images.TransformAborted(f"{aborted}; nothing was published") from e
                raise BuildError(
                    f"the Beam job failed writing under {plan.staging_dir}: "
                    f"{_job_error(e)}; nothing was published"
                ) from e
        _check_finished(options, state, "the job")
        return job.read_report(plan.report_uri), _counters(result)


def _check_finished(options: PipelineOptions, state: str | None, what: str) -> None:
    """Raises unless the job `what` ran to completion.

    Raises:
      DryRun: the options asked for a dry run (`check_dry_run`).
      BuildError: the runner reports another end state than done.
    """
    check_dry_run(options, what)
    if state not in (None, PipelineState.DONE):
        raise BuildError(f"{what} ended in state {state}")


@contextlib.contextmanager
def _job_heap() -> Iterator[None]:
    """TensorFlow imported (the job encodes records with it), here and not
    before: a build that finds its source up to date never needs it. Then
    everything alive (TensorFlow and Beam: millions of objects) is kept out
    of the garbage collector's reach while the job runs, so that a full
    collection does not walk them all, several times a build, on the job's
    thread; unfrozen after, so a process that runs several builds keeps
    nothing alive that it would otherwise collect."""
    import tensorflow  # noqa: F401

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _run_pipeline(
    pipeline: beam.Pipeline,
    options: PipelineOptions,
    display: contextlib.AbstractContextManager | None = None,
    what: str = "the job",
) -> tuple[Any, str | None]:
    """Runs `pipeline` (`what`, for messages) to completion, within
    `display`: its result and end state.

    Raises:
      JobNotSubmitted: the runner hands its jobs to a service
        (`pipeline_flags.submits_job`) and could not submit this one.
      KeyboardInterrupt: on Ctrl-C (or `kiln.errors.Terminated` on SIGTERM,
        under the command line), which Beam re-raises as a step's RuntimeError.
      Exception: a worker's error, as the runner re-raises it.
    """
    interruption = _Interruption()
    result = None
    try:
        with interruption, _short_state_sampling(options), display or contextlib.nullcontext():
            try:
                result = pipeline.run()
            except Exception as e:
                if interruption.seen is None:
                    _raise_if_not_submitted(options, what, e)
                raise
            return result, result.wait_until_finish()
    except KeyboardInterrupt:
        _cancel(result)
        raise
    except Exception:
        if interruption.seen is not None:
            _cancel(result)
            # A fresh one: Beam appends the step's name to the one it re-raised.
            raise type(interruption.seen)() from None
        raise


def _raise_if_not_submitted(options: PipelineOptions, what: str, error: Exception) -> None:
    """Raises `JobNotSubmitted` if `error`, raised by ``pipeline.run()``,
    means that the runner could not submit the job: on a runner that only
    submits it there (`pipeline_flags.submits_job`), where a worker's error
    would come later, from ``wait_until_finish``. On a local runner, which
    runs the whole job in ``run()``, returns."""
    given = options.view_as(StandardOptions).runner
    if not pipeline_flags.submits_job(pipeline_flags.runner_class(given)):
        return
    raise JobNotSubmitted(
        f"{what} could not be submitted to {pipeline_flags.runner_name(given)}: "
        f"{_submit_error(error).rstrip(' .')}; no worker ran, nothing was published"
    ) from error


def _submit_error(error: BaseException) -> str:
    """`_last_line` of why a runner could not submit a job, unless the
    runner's own last line already quotes that OS error with what it was
    doing: Prism's "Unable to fetch remote prism binary at <url>: <urlopen
    error [Errno 111] Connection refused>" over a bare "Connection refused",
    which says neither that the launcher downloads the runner nor from where."""
    line = _last_line(error)
    lines = [text.strip() for text in str(error).splitlines() if text.strip()]
    own = lines[-1][:500] if lines else ""
    reason = line.rsplit(": ", 1)[-1]
    return own if own != line and reason and reason in own else line


def _cancel(result: Any) -> None:
    """Cancels a job that runs apart from this process (Dataflow, a portable
    runner's job service), after a Ctrl-C or SIGTERM: the staging folder it
    writes into is deleted on the way out, and a job left running would bill
    on, and race the retry a scheduler starts. The local runner's job (no
    result yet while it runs) ends with this process."""
    if result is None:
        return
    try:
        result.cancel()
    except Exception as e:  # a runner without cancel, or the service gone
        logger.warning("could not cancel the job (%s): it may still be running", _last_line(e))
    else:
        logger.info("cancelled the job")


class _Interruption:
    """Notes a Ctrl-C (SIGINT) or, where the command line handles it, a
    SIGTERM while the job runs, then interrupts as before.

    The KeyboardInterrupt (or `kiln.errors.Terminated`) is raised wherever
    the main thread is; inside a step, Beam re-raises it as a RuntimeError
    naming the step, which would read as a failed job (exit 1) instead of an
    interrupted one (exit 130, 143). Only in the main thread (the only one
    Python delivers signals to), over whatever handler was there (Python's
    default raises KeyboardInterrupt on SIGINT); a SIGTERM without a Python
    handler (Python's default: the process ends) is left alone.
    """

    def __init__(self) -> None:
        self.seen: KeyboardInterrupt | None = None
        self._previous: dict[int, Any] = {}
        self._excepthook: Any = None  # while `_quiet_about_killed_workers` stands in

    def __enter__(self) -> _Interruption:
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)
            if callable(signal.getsignal(signal.SIGTERM)):
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._interrupt)
        return self

    def _interrupt(self, signum, frame) -> None:
        previous = self._previous.get(signum)
        if self.seen is None and self._excepthook is None:
            # In place before the first kill: a worker's thread that notices
            # its death at once (a busy machine) raised under Python's own
            # hook, two tracebacks above the one line.
            self._excepthook = threading.excepthook
            threading.excepthook = _quiet_about_killed_workers(self._excepthook)
            if not _stop_sdk_workers():
                threading.excepthook, self._excepthook = self._excepthook, None
        try:
            if callable(previous):
                previous(signum, frame)
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            self.seen = e
            raise

    def __exit__(self, *exc_info) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._excepthook is not None:
            # The threads that ran the killed workers raise when they notice:
            # the quiet hook stays until they have (on a busy machine, after
            # the job's own shutdown), or a few seconds have passed.
            for thread in threading.enumerate():
                if thread.name == "run_worker" and thread is not threading.current_thread():
                    thread.join(_STOPPED_WORKER_THREAD_SECONDS)
            threading.excepthook, self._excepthook = self._excepthook, None


_SDK_WORKER_MODULE = b"apache_beam.runners.worker.sdk_worker_main"
# How long an interrupted build waits for the threads of its killed Beam
# workers to notice (`_Interruption.__exit__`).
_STOPPED_WORKER_THREAD_SECONDS = 10.0


def _stop_sdk_workers() -> bool:
    """Kills the Beam SDK worker processes this process started (the local
    runner's ``--direct_running_mode=multi_processing``, a portable runner's
    subprocess workers), on a Ctrl-C or SIGTERM sent to this process alone
    (a scheduler's, `timeout`'s, ``kill``): Beam's shutdown waits for its
    workers, which did not get the signal and run on, so the build would
    never end and would keep its lock. A Ctrl-C in a terminal reaches them
    too; then there is nothing left to kill. Their work was for the staging
    folder, which is deleted on the way out. Linux only (``/proc``).
    Whether it killed one."""
    try:
        parents: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    status = f.read()
            except OSError:  # ended meanwhile
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            parent = int(status[status.rindex(b")") + 2 :].split()[1])
            parents.setdefault(parent, []).append(int(entry))
    except (OSError, ValueError, IndexError):  # no /proc: not Linux
        return False
    below, stack = [], list(parents.get(os.getpid(), ()))
    while stack:
        pid = stack.pop()
        below.append(pid)
        stack.extend(parents.get(pid, ()))
    killed = False
    for pid in below:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
            if _SDK_WORKER_MODULE in command:
                os.kill(pid, signal.SIGKILL)
                killed = True
                logger.debug("stopped the SDK worker process %d", pid)
        except OSError:  # ended meanwhile, or not ours to kill
            continue
    return killed


def _quiet_about_killed_workers(previous: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A `threading.excepthook` that passes over what Beam's thread running
    a worker process raises when `_stop_sdk_workers` killed it ("Worker
    subprocess exited with return code -9", a traceback on stderr under the
    one line an interrupted build prints); `previous` for anything else."""

    def hook(args: Any) -> None:
        if args.thread is not None and args.thread.name == "run_worker":
            logger.debug("a stopped worker's thread: %s", args.exc_value)
            return
        previous(args)

    return hook


def _warn_about_shard_counts(spec: BuildSpec, listing: SourceListing) -> None:
    """Warns of shard counts that cannot be what was meant: more shards than
    files, or (``splits.from_source``, whose names only the listing knows; the
    config refuses them with ``splits.fractions``) a count for a split the
    source does not have, which shards nothing."""
    fixed = spec.config.sharding.num_shards
    counts = fixed.values() if isinstance(fixed, Mapping) else [fixed] if fixed else []
    if any(count > listing.num_files for count in counts):
        logger.warning(
            "sharding.num_shards asks for more shards than the %d files listed; "
            "a split gets at most one shard per record",
            listing.num_files,
        )
    if isinstance(fixed, Mapping) and listing.split_names is not None:
        splits = listing.split_names
        for split in sorted(set(fixed) - set(splits)):
            logger.warning(
                "sharding.num_shards.%s: the source has no split %r%s (its splits: %s); "
                "that count is not used",
                split,
                split,
                did_you_mean(split, splits),
                ", ".join(splits) or "none",
            )


def _warn_about_numbers_sorted_as_text(spec: BuildSpec, class_names: Sequence[str]) -> None:
    """Class names found (not declared) that are all integers sort as text
    (``0, 1, 10, 11, 2``), so the id of class ``2`` is not 2: worth a line,
    since a model's outputs are read by id. Declaring ``source.classes`` in
    numeric order makes each id its number."""
    if spec.config.source.classes is not None or len(class_names) < 2:
        return
    if not all(_INTEGER_NAME.fullmatch(name) for name in class_names):
        return
    numeric = sorted(class_names, key=int)
    if list(class_names) != numeric:
        shown = ", ".join(class_names[:12]) + (", ..." if len(class_names) > 12 else "")
        logger.warning(
            "the class names are numbers, sorted as text (%s): a class's label id is its "
            "place in that order, not its number; to make them equal, declare source.classes "
            "in numeric order ([%s])",
            shown,
            ", ".join(numeric[:12]) + (", ..." if len(numeric) > 12 else ""),
        )


_INTEGER_NAME = re.compile(r"-?[0-9]+")


def _warn_about_empty_classes(info: DatasetInfo) -> None:
    # Kept as classes (label ids are indices into the sorted names: dropping
    # one would shift every id after it), but worth a line in the cron mail.
    empty = [
        name
        for name in info.class_names
        if not any(split.class_counts.get(name) for split in info.splits.values())
    ]
    if empty:
        logger.warning(
            "class(es) with no example (no file listed, or every one dropped): %s; they keep "
            "their label ids",
            ", ".join(empty),
        )


def _warn_about_empty_splits(spec: BuildSpec, info: DatasetInfo) -> None:
    """One warning naming the splits the build stored no example in, which
    `kiln.reader.load` cannot read: too few images for a split's fraction (each
    image draws its split by a hash), or every file a source's split lists
    dropped. Not for an empty dataset (``errors.allow_empty``), which is
    empty as asked."""
    total = sum(split.num_examples for split in info.splits.values())
    empty = [name for name in ordered_splits(info.splits) if not info.splits[name].num_examples]
    if not empty or not total:
        return
    fractions = spec.config.splits.fractions
    if fractions is None:  # splits.from_source
        named = ", ".join(empty)
        why = "every file the source lists in it was dropped (errors.jsonl names them)"
        remedy = "fix or add its files"
    else:
        named = ", ".join(f"{name} ({fractions.get(name, 0.0):.0%})" for name in empty)
        why = (
            f"{total} example{' is' if total == 1 else 's are'} too few for "
            f"{'its share' if len(empty) == 1 else 'their shares'} of splits.fractions"
        )
        remedy = "add images, or raise its fraction"
    logger.warning(
        "split(s) with no example: %s: %s; kiln.reader.load cannot read an empty split: %s",
        named,
        why,
        remedy,
    )


# The split names a typo is most often of (`_warn_about_split_names`).
USUAL_SPLIT_NAMES = ("train", "validation", "test")
# How close a name must be to another to be taken for its misspelling
# (difflib's ratio: ``tarin``/``train`` 0.8, ``tset``/``test`` 0.75, while
# ``valid``/``validation`` 0.67 and ``val``/``validation`` 0.46 are names of
# their own), and how much smaller than that other split it must be.
_CLOSE_NAME_RATIO = 0.75
_MUCH_SMALLER = 10


def _warn_about_vanished_splits(changes: version_diff.VersionDiff | None) -> None:
    """One warning naming the splits the version LATEST named before had
    examples in and the new one has none in: with ``splits.from_source``, a
    split folder gone from the source (`_warn_about_empty_splits` sees only
    the splits the source still lists). ``--fail-on-vanished-split`` makes
    it a publish gate."""
    if changes is None:
        return
    vanished = changes.vanished_splits()
    if vanished:
        logger.warning(
            "split(s) with no example left, that version %s had: %s; a training job that "
            "reads them fails (--fail-on-vanished-split keeps such a version from LATEST)",
            changes.old.version,
            ", ".join(f"{name} ({changes.splits[name].old} before)" for name in vanished),
        )


def _warn_about_split_names(spec: BuildSpec, info: DatasetInfo) -> None:
    """A warning per split of the source (``splits.from_source``) whose name
    looks like a misspelling of another: close to the name of a split at
    least `_MUCH_SMALLER` times its size (``tarin``, 1 example, beside
    ``train``), or to a usual name (`USUAL_SPLIT_NAMES`) the dataset lacks
    while the split is that much smaller than the largest. Not refused: a
    small split of its own may be intended. (Names that differ only in case
    are refused before the job: `_check_split_names`.)"""
    if not spec.config.splits.from_source:
        return
    sizes = {name: split.num_examples for name, split in info.splits.items()}
    largest = max(sizes.values(), default=0)
    for name in ordered_splits(info.splits):
        candidates = [
            other for other in dict.fromkeys([*sizes, *USUAL_SPLIT_NAMES]) if other != name
        ]
        for close in difflib.get_close_matches(name, candidates, n=3, cutoff=_CLOSE_NAME_RATIO):
            if close in sizes:
                if sizes[name] * _MUCH_SMALLER > sizes[close]:
                    continue
                beside = f"split {close!r} has {sizes[close]}"
            elif sizes[name] * _MUCH_SMALLER <= largest:
                beside = f"this dataset has no split {close!r}"
            else:
                continue
            logger.warning(
                "split %r (%d example%s) looks like a misspelling of %r (%s): %s names it; "
                "if it is a typo, correct it there",
                name,
                sizes[name],
                "" if sizes[name] == 1 else "s",
                close,
                beside,
                spec.config.source.describe(),
            )
            break


def _last_line(error: BaseException) -> str:
    """The one line that says what went wrong: an OS error's own words, else
    the last line of the message (runners put the worker's traceback first)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return storage.describe_os_error(cause)
        cause = cause.__cause__ or cause.__context__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:500]


# What Beam's DataflowRunner raises for a job that ended other than done
# (`DataflowPipelineResult.wait_until_finish`): the state, then the worker's
# error message it found in the job's log, or None if it found none.
_DATAFLOW_END = re.compile(r"Dataflow pipeline failed\. State: (\w+), Error:\s*(\S.*)?\Z", re.S)


def _job_error(error: BaseException) -> str:
    """`_last_line` of a worker's error that a runner re-raised, except where
    the runner had none to give. Dataflow reports a job that ended without an
    error message in its log (cancelled in the Cloud Console or with gcloud,
    or failed before any worker logged one) as ``Error: None``, which would
    read as the worker's last line: "...: None; nothing was published"."""
    ended = _DATAFLOW_END.search(str(error))
    if ended is None or ended.group(2) not in (None, "None"):
        return _last_line(error)
    state = ended.group(1)
    if state == "CANCELLED":
        return (
            "the job was cancelled on Dataflow, not by kiln (in the Cloud Console or with "
            "gcloud dataflow jobs cancel)"
        )
    return f"the job ended in state {state} on Dataflow with no error in its log (see its logs)"


def _check_accounted(listing: SourceListing, report: job.JobReport) -> None:
    """Every listed file was stored or dropped, and every stored image is in a shard.

    Anything else means the job lost or invented inputs (its listing was
    deleted under it, a runner dropped a bundle, a shard write was lost):
    publishing would give a wrong, possibly empty dataset with exit 0.

    Raises:
      BuildError: naming the counts that disagree.
    """
    problems = []
    if report.files_read != listing.num_files:
        problems.append(
            f"the image step read {report.files_read} of the {listing.num_files} listed files"
        )
    for name, split in sorted(report.splits.items()):
        if split.num_records != split.num_images:
            problems.append(
                f"split {name}: the shards hold {split.num_records} records "
                f"but {split.num_images} images were stored"
            )
    stored = sum(split.num_images for split in report.splits.values())
    if stored + report.dropped_total != listing.total:
        problems.append(
            f"{stored} stored + {report.dropped_total} dropped != {listing.total} listed"
        )
    if problems:
        raise BuildError(
            "the job did not account for every input file ("
            + "; ".join(problems)
            + "); nothing was published"
        )


def _version(
    spec: BuildSpec, processing: str, listing: SourceListing, report: job.JobReport
) -> str:
    """The content-addressed version: the config, the processing fingerprint
    and every input's entry."""
    inputs_hash = versioning.combine_hashes(
        [report.inputs_hash, listing.dropped_entries_hash(), _class_names_hash(spec, listing)]
    )
    return versioning.version_name(spec.fingerprint, inputs_hash, processing=processing)


def _listing_hash(spec: BuildSpec, listing: SourceListing) -> int:
    """The multiset hash the up-to-date stamp takes from the listing: its
    entries and the class list (`_class_names_hash`)."""
    return versioning.combine_hashes([listing.listing_hash(), _class_names_hash(spec, listing)])


def _class_names_hash(spec: BuildSpec, listing: SourceListing) -> int:
    """What the class list adds to the stamp and the version where neither
    the config nor every file entry holds it: a COCO file's categories or a
    VOC folder's object names, without ``source.classes`` (a category no
    annotation uses, a class only a dropped file names, shifts every class
    id: `listing.Listing.class_names_hash`). 0 for other sources, whose
    versions are the same whichever lists them (`ListedInJob` cannot say
    which classes its files name)."""
    source = spec.config.source
    if source.classes or not isinstance(source, sources.CocoSource | sources.VocSource):
        return 0
    if not isinstance(listing, sources.Listing):  # only image folders and manifests list in a job
        return 0
    return listing.class_names_hash()


def _prune(dataset: publish.DatasetRoot, keep: int | None, stamp: str) -> tuple[str, ...]:
    """``--keep``: `publish.DatasetRoot.prune`, `stamp` (the build's input
    stamp) kept; a failure is a warning, the build succeeded."""
    if keep is None:
        return ()
    try:
        return tuple(dataset.prune(keep, current_stamp=stamp))
    except Exception as e:  # e.g. permission denied on one file: the build itself succeeded
        logger.warning("could not prune old versions of %s: %s", dataset.path, _last_line(e))
        logger.debug("pruning %s failed", dataset.path, exc_info=True)
        return ()


def _check_listed_box_convention(spec: BuildSpec, listing: SourceListing) -> None:
    """`_check_box_convention` on the boxes as listed, before the job reads
    an image (`box_convention.count_listed`): a dataset whose boxes are
    normalized or ``[x, y, width, height]`` stops before it costs a build,
    and one already built is not called up to date. Only a finding that
    stops the build: warnings come from the job's count, which has the
    images' sizes.

    Raises:
      BuildError: naming the convention and what to change.
    """
    # A listing by the job has no targets (`ListedInJob`).
    if not isinstance(listing, sources.Listing) or listing.box_evidence is None:
        return
    if not spec.config.errors.check_box_convention:
        return
    finding = box_convention.verdict(listing.box_evidence, listed=True)
    if finding is not None and finding.certain:
        raise BuildError(
            _box_convention_problem(finding, "found listing the source, before any image was read")
        )


def _check_box_convention(
    spec: BuildSpec, report: job.JobReport, transaction: publish.PublishTransaction
) -> None:
    """Stops the build when its boxes as a whole look written in another
    convention (`box_convention.verdict`), unless
    ``errors.check_box_convention`` is off; short of proof, a warning.

    Raises:
      BuildError: naming the convention and what to change.
    """
    finding = box_convention.verdict(report.boxes)
    if finding is None:
        return
    if not finding.certain:
        logger.warning("%s", finding.message)
        return
    if not spec.config.errors.check_box_convention:
        logger.warning("%s (errors.check_box_convention is off: built anyway)", finding.message)
        return
    transaction.keep_staging(only=[ERRORS_FILENAME])
    raise BuildError(
        f"{_box_convention_problem(finding)}. The dropped files are in "
        f"{transaction.staging_dir.rstrip('/')}/{ERRORS_FILENAME}"
    )


def _check_augment_fits(spec: BuildSpec, report: job.JobReport) -> None:
    """Stops the build when its stored augment list does not fit the images
    the job stored: a crop larger than their one size, which the reader
    would refuse, or, when their sizes vary, larger than the smallest of
    them, which would fail training at the first such image.

    The config checks the list before the job (`config.check_augment`) with
    the stored size when the transforms fix it; when they do not (no resize
    to an exact size, crop or letterbox at the end), only the job's report
    knows the stored sizes. The reader (`load`) would refuse the list on the
    published dataset, against ``image_size`` when every image has one size
    and against ``smallest_size`` (the least height and the least width
    stored, which every image has at least) when they vary; the build
    checks the list against the same size first. Publishing a dataset whose
    own default list `load` refuses would waste more than the job: every
    training run on it.

    Raises:
      BuildError: naming the op, its size and the stored size.
    """
    if not spec.augment:
        return
    if report.image_size is not None:
        height, width = report.image_size
        size = report.image_size
        stored = f"the images the job stored (all {height}x{width})"
    elif report.smallest_size is not None:
        height, width = report.smallest_size
        size = report.smallest_size
        stored = (
            f"the smallest images the job stored (their sizes vary: the least height "
            f"{height}, the least width {width})"
        )
    else:
        return
    from kiln import reader

    augmentations = reader.validate(spec.augment)
    try:
        config_module.check_augment(spec.config, augmentations, size, stored=stored)
    except ListError as e:
        raise BuildError(
            f"{e}; kiln.reader.load would refuse this augment list on the dataset, so "
            f"nothing was published. Make the crop smaller, or end "
            f"the transforms with a fixed size (resize: {{size: ...}}, center_crop, "
            f"letterbox) so that the config check finds this before the job"
        ) from None
    if report.image_size is None:
        return  # `load` checks your own ops on test images then, as the config did
    try:
        # Your own ops, on the size `load` checks them with (the config's
        # check guessed one where the transforms do not fix it).
        config_module.check_first_use(spec.config, augmentations, report.image_size)
    except ListError as e:
        raise BuildError(
            f"{e}; on {stored}, kiln.reader.load would refuse this augment list, so nothing "
            f"was published"
        ) from None


def _box_convention_problem(finding: box_convention.Finding, when: str = "") -> str:
    return (
        f"{finding.message}; {when + '; ' if when else ''}nothing was published "
        f"(errors.check_box_convention: false builds them as they are)"
    )


def _more_than(dropped: int, total: int, max_fraction: float) -> bool:
    """Whether `dropped` of `total` is more than `max_fraction`, as the
    config writes it (``0.29``: 29 of 100 is not more), in exact arithmetic:
    in floats, ``0.29 * 100`` is 28.999999999999996."""
    return Fraction(dropped, max(total, 1)) > Fraction(repr(max_fraction))


def _too_many_dropped(report: job.JobReport, total: int, max_fraction: float, staging: str) -> str:
    dropped = report.dropped_total
    reasons = ", ".join(
        f"{reason}: {count}"
        for reason, count in sorted(report.dropped.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return (
        f"dropped {dropped} of {total} input files ({dropped / total:.1%}), more than "
        f"errors.max_fraction {max_fraction:.1%} ({reasons}); nothing was published. "
        f"{_first_dropped(report, staging)}"
        f"The rows are in {staging.rstrip('/')}/{ERRORS_FILENAME}"
    )


# How much of a dropped file's message the failure line quotes.
_QUOTED_MESSAGE_CHARACTERS = 300


def _first_dropped(report: job.JobReport, staging: str) -> str:
    """``"The first <reason>: <key>: <message>. "`` for the reason that
    dropped the most files, from the staging folder's errors.jsonl: a
    build that drops most of its files usually drops them all for one
    mistake (manifest paths relative to another folder than the
    manifest's), which its row shows. ``""`` if the file cannot be read."""
    if not report.dropped:
        return ""
    reason = min(report.dropped.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    path = f"{staging.rstrip('/')}/{ERRORS_FILENAME}"
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for line in f:
                row = json.loads(line)
                if row.get("reason") == reason:
                    message = str(row.get("message", "")).replace("\n", " ")
                    message = quote_text(message, _QUOTED_MESSAGE_CHARACTERS)
                    return f"The first {reason}: {row.get('key')}: {message}. "
    except Exception as e:  # the failure line is worth more than its example
        logger.debug("could not read %s for an example: %s", path, unexpected(e))
    return ""


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


def dataset_info(
    spec: BuildSpec, listing: SourceListing, report: job.JobReport, version: str
) -> DatasetInfo:
    """The `kiln.json` contents for a finished job's report."""
    config = spec.config
    policy_splits = list(config.splits.fractions or listing.split_names or [])
    splits = {}
    for name in sorted(set(policy_splits) | set(report.splits)):
        split = report.splits.get(name, job.SplitReport())
        counts = {label: 0 for label in listing.class_names}
        for label_id, count in split.class_counts.items():
            counts[listing.class_names[label_id]] = count
        splits[name] = SplitInfo(
            name=name,
            num_examples=split.num_records,
            shards=list(split.shards),
            class_counts=counts,
            statistics=split.statistics,
            # Every image of a classification dataset has its label.
            images_without_classes=split.without_classes if spec.targets.label is None else None,
        )
    data = spec.to_json()
    objects = None
    if spec.targets.boxes is not None:
        objects = {
            name: _named_objects(report.splits.get(name, job.SplitReport()), listing.class_names)
            for name in splits
        }
    return DatasetInfo(
        name=config.name,
        version=version,
        kiln_version=kiln.__version__,
        format_version=kiln.FORMAT_VERSION,
        config=data,
        config_fingerprint=spec.fingerprint,
        schema=schema_for(config.targets).to_json(),
        class_names=list(listing.class_names),
        encoding=dict(data["encoding"]),
        channels=config.image.channels,
        image_size=report.image_size,
        compression=None if config.sharding.compression == "none" else config.sharding.compression,
        splits=splits,
        augment=list(spec.augment),
        duplicates=report.duplicates,
        dropped=dict(report.dropped),
        errors_sha256=report.errors_sha256,
        duplicates_sha256=report.duplicates_sha256,
        index_sha256=report.index_sha256,
        dropped_objects_sha256=report.dropped_objects_sha256 or None,
        processing=incremental.processing(data),
        targets=None if config.targets is None else config.targets.to_json(),
        objects=objects,
        provenance=spec.provenance(),
        smallest_size=report.smallest_size if report.image_size is None else None,
    ).sealed()


def _named_objects(split: job.SplitReport, class_names: list[str]) -> ObjectStatistics:
    """A split's object statistics keyed by class name, every class listed."""
    found = split.objects or ObjectStatistics(classes={}, images_without_objects=0, dropped={})
    empty = ClassObjects(0, 0.0, 0.0, 0.0, [0] * len(OBJECT_SIZE_EDGES))
    return ObjectStatistics(
        classes={
            name: found.classes.get(str(class_id), empty)
            for class_id, name in enumerate(class_names)
        },
        images_without_objects=found.images_without_objects,
        dropped=found.dropped,
        size_edges=found.size_edges,
        most_objects=found.most_objects or 0,
    )
