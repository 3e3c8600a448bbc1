"""The Beam pipeline flags of a build: parsed and checked before it does anything.

Beam checks most of its flags only as it submits the job: after kiln took
the dataset's lock and listed the source (minutes, for a large one), and as
exceptions kiln does not expect (exit 70). Some it never checks (a
``--dry_run`` that the runner ignores, so that the job runs for real), and
some it answers with the network (a missing ``--temp_location`` makes
Dataflow's runner look for, or create, a default bucket for two minutes).
`check_flags` and `check` do it first, in about a second (Beam asks
gcloud's config for a region when ``--region`` is missing): every problem
one line naming its flag (or the config's field), and exit 2 (`FlagsError`),
nothing done.

`check` reuses what Beam itself checks when a job starts (its
`PipelineOptionsValidator`), on a copy of the options, and adds what Beam
checks too late or not at all: the files the flags name, a dry run on a
runner that cannot do one, and what a Dataflow job needs (a staging
location on Cloud Storage, a region and container image of the right form,
kiln on the workers, and a source and output the workers can reach).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import importlib
import logging
import os
import re
from collections.abc import Sequence
from typing import NoReturn

from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
    WorkerOptions,
)
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln.errors import MAX_PROBLEMS_SHOWN, UsageError, quote
from kiln.pipeline import storage
from kiln.pipeline.config import BuildSpec

logger = logging.getLogger(__name__)

# kiln's local default runner (`kiln.pipeline.launcher`).
LOCAL_RUNNER = "FnApiRunner"

# The values of ``--dry_run`` (Beam's is a string flag: to Beam, any value
# given, "False" too, asks for a dry run).
_DRY_RUN_VALUES = {"true": True, "1": True, "false": False, "0": False}

# What a Dataflow job's staging location looks like, for messages.
_TEMP_LOCATION_EXAMPLE = "--temp_location=gs://my-bucket/tmp"

# A stand-in staging location for the copy of the options Beam's validator
# checks when the real one is wrong (already reported): with neither a
# valid --temp_location nor --staging_location, Beam's check looks for (or
# creates) a default bucket, which needs the network.
_STAND_IN_LOCATION = "gs://kiln-check/tmp"

# A Google Cloud region (europe-west1, northamerica-northeast2) and zone
# (europe-west1-b): Dataflow takes any text and refuses an unknown one only
# when the job is submitted, after the lock and the listing.
_REGION = re.compile(r"[a-z]+(?:-[a-z]+)+[0-9]+")
_ZONE = re.compile(rf"(?P<region>{_REGION.pattern})-[a-z]")

# A container image reference, as Docker's distribution/reference grammar
# has it: [HOST[:PORT]/]PATH[:TAG][@DIGEST]. PATH is lowercase components
# separated by "/"; a HOST component may hold uppercase letters and "-".
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_HOST_COMPONENT}(?:\.{_HOST_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
# Docker refuses a name (the reference without its tag and digest) longer than this.
_IMAGE_NAME_MAX_CHARS = 255
_IMAGE_FORM = (
    "[HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST], PATH in lowercase letters, digits and . _ - "
    "between slashes, e.g. europe-west1-docker.pkg.dev/my-project/kiln/kiln:0.1.0"
)


class FlagsError(UsageError):
    """Pipeline flags that cannot work with this build: exit 2, nothing done.

    Attributes:
      problems: One line per problem, each naming its flag (``--project:
        ...``) or the config's field (``source.root: ...``).
    """

    def __init__(self, problems: Sequence[str], runner: str):
        """One problem is the message; several are one line each under a
        line that counts them (at most `MAX_PROBLEMS_SHOWN`), as
        `ConfigError.of` lists a config's."""
        self.problems = tuple(problems)
        if len(problems) == 1:
            message = problems[0]
        else:
            shown = [f"  {problem}" for problem in problems[:MAX_PROBLEMS_SHOWN]]
            if len(problems) > MAX_PROBLEMS_SHOWN:
                shown.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
            head = f"{len(problems)} problems with the pipeline flags for {runner}:"
            message = "\n".join([head, *shown])
        super().__init__(message)


def check_flags(pipeline_args: Sequence[str], own_flags: Sequence[str] = ()) -> None:
    """Refuses flags that no registered `PipelineOptions` knows, flag values
    Beam cannot parse, unknown runners and ``--dry_run`` values that are
    neither true nor false.

    Beam itself only logs a warning for a flag it does not know and goes on
    without it: a misspelled ``--ouput`` or ``--quite`` would build into the
    config's output, or print, as if it had not been given. A value it
    cannot parse (``--max_num_workers=abc``) makes its argparse print its
    whole usage block (every option of every runner) before the error.

    Args:
      pipeline_args: The flags handed to Beam.
      own_flags: The calling command's own flags, offered as did-you-mean
        (``--image_threads`` -> ``--image-threads``).

    Raises:
      UsageError: one line naming the first unknown flag (with the closest
        known one), the flag whose value is wrong, the unknown runner, or
        the first argument that is neither a flag nor a flag's value;
        nothing was done.
    """
    args = list(pipeline_args)
    # The runner first: importing its module registers its own options
    # classes (FlinkRunnerOptions...), which Beam's parser then knows.
    runner_class(_beam_parser().parse_known_args(args)[0].runner)
    parser = _beam_parser()
    known, unknown = parser.parse_known_args(args)
    dry_run_value(known.dry_run)
    flags = [arg for arg in unknown if arg.startswith("-")]
    if flags:
        options = [option for action in parser._actions for option in action.option_strings]
        name = flags[0].split("=", 1)[0]
        close = difflib.get_close_matches(name, [*own_flags, *options], n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UsageError(
            f"unknown flag {name}: neither kiln nor Beam's pipeline options know it{hint} "
            f"(`kiln build --help` lists kiln's)"
        )
    if unknown:
        # Neither a flag nor a flag's value, which Beam would drop without a
        # word: a second config (`--config a.yaml b.yaml` builds only a.yaml),
        # or a value after an on/off flag (`--streaming false` turns it on).
        raise UsageError(
            f"unexpected argument {unknown[0]!r}: kiln build takes no positional argument "
            f"(the config is --config FILE, one per build; an on/off flag such as "
            f"--save_main_session takes no value)"
        )


def _beam_parser() -> argparse.ArgumentParser:
    """Beam's own parser, with every registered options class added (the
    hook gets it just before Beam parses nothing with it), whose errors
    raise `UsageError` instead of printing the usage block and exiting."""
    parsers: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    parser = parsers[0]
    parser.error = _flag_value_error  # type: ignore[method-assign]
    return parser


def _flag_value_error(message: str) -> NoReturn:
    hint = ": --dry_run=True or --dry_run=False" if "--dry_run" in message else ""
    raise UsageError(f"{message} (a Beam pipeline option{hint})")


def runner_class(runner: str | None) -> type:
    """The class of the runner `runner` names (None: kiln's local default),
    its module imported.

    Raises:
      UsageError: if Beam knows no such runner, or its module cannot be
        imported (a missing extra); nothing was done.
    """
    module, _, name = _runner_path(runner).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError as e:
        raise UsageError(f"--runner {runner}: cannot import {module} ({e})") from None
    if not isinstance(found, type):
        raise UsageError(f"--runner: {module} has no runner class {name!r}")
    return found


def runner_name(runner: str | None) -> str:
    """The name of the runner `runner` names, as Beam lists it
    (``dataflow`` -> ``DataflowRunner``; None: kiln's local default).

    Raises:
      UsageError: if Beam knows no such runner.
    """
    return _runner_path(runner).rsplit(".", 1)[-1]


def _runner_path(runner: str | None) -> str:
    """The module and class name of the runner `runner` names."""
    runner = runner or LOCAL_RUNNER
    if "." in runner:  # a runner class by its full name
        return runner
    # Beam accepts a known runner's name in any case, with or without "Runner".
    wanted = {runner.lower(), runner.lower() + "runner"}
    paths = [p for p in StandardOptions.ALL_KNOWN_RUNNERS if p.rsplit(".", 1)[1].lower() in wanted]
    if not paths:
        known = StandardOptions.KNOWN_RUNNER_NAMES
        close = difflib.get_close_matches(runner, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"--runner: unknown runner {runner!r}; {hint}known: {', '.join(known)}")
    return paths[0]


def dry_run_value(value: object) -> bool:
    """What a ``--dry_run`` value asks: True for ``True``/``true``/``1``,
    False for ``False``/``false``/``0`` (or the flag not given).

    Raises:
      UsageError: any other value.
    """
    if isinstance(value, bool) or value is None:
        return bool(value)
    found = _DRY_RUN_VALUES.get(str(value).strip().lower())
    if found is None:
        raise UsageError(
            f"--dry_run={value}: expected True (translate the job, run nothing) or False"
        )
    return found


def is_dataflow(runner: type) -> bool:
    """Whether `runner` is Dataflow's runner (or one built on it): the only
    runner that translates a job without running it (``--dry_run``), and
    the one whose workers are remote machines."""
    return any(cls.__name__ == "DataflowRunner" for cls in runner.__mro__)


def submits_job(runner: type) -> bool:
    """Whether `runner` hands the job to a service that runs it apart from
    this process (Dataflow's, or a portable runner's job service: Flink,
    Spark): its ``run`` only submits the job, and a job that fails, fails
    later, as its result is waited for. The local runners run the whole
    job inside ``run``."""
    return any(cls.__name__ in ("DataflowRunner", "PortableRunner") for cls in runner.__mro__)


def check(options: PipelineOptions, spec: BuildSpec) -> None:
    """Everything about `options` that can be known before a build starts,
    for the runner they name and the build `spec` describes.

    On every runner: ``--dry_run=True`` only where the runner honours it
    (Dataflow: any other would run the job, and the local runner would
    publish it), that the files ``--setup_file``, ``--requirements_file``,
    ``--extra_package`` and a local ``--sdk_location`` name exist, and what
    Beam's `PipelineOptionsValidator` says of the options when the job
    starts. On Dataflow also: a staging location on Cloud Storage
    (``--temp_location`` or ``--staging_location``), regions, zones and a
    container image of their form (`_dataflow_forms`), a way to install
    kiln on the workers, and a source and output that are not local paths.

    Raises:
      FlagsError: every problem, one line each.
    """
    given = options.view_as(StandardOptions).runner
    runner, name = runner_class(given), runner_name(given)
    dataflow = is_dataflow(runner)
    problems: list[str] = []
    if dry_run_value(options.view_as(TestOptions).dry_run) and not dataflow:
        publish = " and publish the dataset" if name in StandardOptions.LOCAL_RUNNERS else ""
        problems.append(
            f"--dry_run=True: only DataflowRunner translates a job without running it; "
            f"{name} would run the job{publish} (drop --dry_run, or check the job with "
            f"--runner=DataflowRunner --dry_run=True)"
        )
    problems += _missing_files(options)
    staging_problems = _dataflow_staging_location(options) if dataflow else []
    problems += staging_problems
    problems += _beam_validation(options, runner if dataflow else None, bool(staging_problems))
    if dataflow:
        problems += _dataflow_forms(options)
        problems += _dataflow_packaging(options)
        problems += _dataflow_locations(spec)
    if problems:
        raise FlagsError(problems, name)
    if dataflow:
        _warn_requirements_without_kiln(options)


def _missing_files(options: PipelineOptions) -> list[str]:
    """The files the flags name that are not there. Beam looks for them when
    it stages the job's dependencies, after the listing (even for a dry run),
    and reports them as a failed job."""
    setup = options.view_as(SetupOptions)
    problems = []
    for flag, path in (
        ("--setup_file", setup.setup_file),
        ("--requirements_file", setup.requirements_file),
        *(("--extra_package", package) for package in setup.extra_packages or ()),
    ):
        if path is None or storage.is_remote(path) or os.path.isfile(path):
            continue
        problems.append(f"{flag}: no such file: {_from_here(path)}")
    if setup.setup_file is not None and os.path.isfile(setup.setup_file):
        name = os.path.basename(setup.setup_file)
        if name not in ("setup.py", "pyproject.toml"):
            problems.append(
                f"--setup_file: {setup.setup_file} is not a setup.py or pyproject.toml "
                f"(Beam builds the package that file describes)"
            )
    location = setup.sdk_location
    if location not in (None, "default", "container") and not storage.is_remote(location):
        if not os.path.exists(location):
            problems.append(f"--sdk_location: no such file or folder: {_from_here(location)}")
    return problems


def _from_here(path: str) -> str:
    """`path`, with the folder a relative one is relative to (Beam's: the current one)."""
    if os.path.isabs(path):
        return path
    return f"{path} (in the current folder, {os.getcwd()})"


def _dataflow_staging_location(options: PipelineOptions) -> list[str]:
    """Dataflow stages the job (and its temporary files) under
    ``--temp_location`` (or ``--staging_location``), which must be on Cloud
    Storage. With neither valid, Beam's validator asks Cloud Storage for a
    default bucket, or creates one (about two minutes offline): refused here."""
    google = options.view_as(GoogleCloudOptions)
    validator = PipelineOptionsValidator(options, None)
    temp = validator.validate_gcs_path(google, "temp_location")
    staging = validator.validate_gcs_path(google, "staging_location")
    if not temp or not staging:
        return []
    if google.temp_location is None and google.staging_location is None:
        why = "neither is given"
    else:
        why = _one_line((temp if google.temp_location is not None else staging)[0])
    return [
        f"--temp_location: Dataflow needs --temp_location (or --staging_location) on "
        f"gs://, e.g. {_TEMP_LOCATION_EXAMPLE}: {why}"
    ]


def _beam_validation(
    options: PipelineOptions, dataflow_runner: type | None, stand_in_location: bool
) -> list[str]:
    """What Beam's `PipelineOptionsValidator` says when the job starts
    (`beam.Pipeline.run`, as a ValueError), each line naming its flag.

    On a copy: the validator fills in what it can (a default region from
    gcloud's config, the staging location from the temp location). The
    copy is a dry run, so that the validator does not ask Cloud Storage
    about the buckets' soft-delete policy (Beam asks again when the job is
    submitted); with `stand_in_location`, the staging location's problem is
    already reported, and the copy gets a valid one so that the validator
    does not look for a default bucket.
    """
    checked = copy.deepcopy(options)
    checked.view_as(TestOptions).dry_run = True
    if stand_in_location:
        checked.view_as(GoogleCloudOptions).temp_location = _STAND_IN_LOCATION
    runner = dataflow_runner() if dataflow_runner is not None else None
    errors = PipelineOptionsValidator(checked, runner).validate()
    flags = _flags_by_dest()
    return [_naming_its_flag(_one_line(error), flags) for error in errors]


def _flags_by_dest() -> dict[str, str]:
    """Each option's flag by its name in Beam's options (``labels`` -> ``--label``)."""
    flags: dict[str, str] = {}
    for action in _beam_parser()._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                flags.setdefault(action.dest, option)
    return flags


# Beam's validator names an option by its name in the options (``option:
# project``, ``Invalid job_name (...)``, ``num_workers (3) cannot exceed``),
# or, for the project, in words.
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _naming_its_flag(error: str, flags: dict[str, str]) -> str:
    """Beam's `error` as ``--flag: <error>``, unless it names its flags itself."""
    if re.search(r"(?:^|\s)--[a-z]", error):
        return error
    if error.startswith("Invalid Project ID"):
        return f"--project: {error}"
    after_option = re.search(r"option:? ([A-Za-z][A-Za-z0-9_]*)", error)
    names = [after_option.group(1)] if after_option else []
    names += [name for name in _OPTION_NAME.findall(error) if "_" in name]
    for name in names:
        if name in flags:
            return f"{flags[name]}: {error}"
    return error


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _dataflow_forms(options: PipelineOptions) -> list[str]:
    """The Dataflow flags whose form is known, given in another: a region
    or zone that is no Google Cloud region's or zone's name, and a container
    image that is no image reference. Dataflow (or its workers, pulling the
    image) would refuse them only when the job is submitted or started,
    minutes later; a dry run would take them."""
    google = options.view_as(GoogleCloudOptions)
    worker = options.view_as(WorkerOptions)
    problems = []
    for flag, region in (("--region", google.region), ("--worker_region", worker.worker_region)):
        if region is not None and not _REGION.fullmatch(region):
            zone = _ZONE.fullmatch(region)
            hint = f" ({region} is a zone, in region {zone['region']})" if zone else ""
            problems.append(
                f"{flag}: {quote(region)} is not a Google Cloud region: expected lowercase "
                f"words and a number joined by hyphens, e.g. europe-west1{hint}"
            )
    for flag, zone_name in (("--worker_zone", worker.worker_zone), ("--zone", worker.zone)):
        if zone_name is not None and not _ZONE.fullmatch(zone_name):
            problems.append(
                f"{flag}: {quote(zone_name)} is not a Google Cloud zone: expected a region "
                f"and a letter, e.g. europe-west1-b"
            )
    for flag, image in (
        ("--sdk_container_image", worker.sdk_container_image),
        ("--worker_harness_container_image", worker.worker_harness_container_image),
    ):
        if image is not None and not _is_image_reference(image):
            problems.append(
                f"{flag}: {quote(image)} is not a container image reference: expected {_IMAGE_FORM}"
            )
    return problems


def _is_image_reference(image: str) -> bool:
    """Whether `image` is a container image reference (`_IMAGE`), its name
    no longer than Docker takes."""
    if not _IMAGE.fullmatch(image):
        return False
    name = image.split("@", 1)[0]
    last = name.rfind(":")
    if last > name.rfind("/"):  # a tag, not a host's port
        name = name[:last]
    return len(name) <= _IMAGE_NAME_MAX_CHARS


def _dataflow_packaging(options: PipelineOptions) -> list[str]:
    """Dataflow's workers start from Beam's SDK image, which has no kiln,
    unless the job names a way to install it: a container image with kiln
    (the Dockerfile's), or a package Beam installs on every worker
    (``--setup_file``, ``--extra_package``, a ``--requirements_file``).
    Without one, every image-processing step would fail on the workers
    (``No module named 'kiln'``), minutes into the job."""
    worker = options.view_as(WorkerOptions)
    setup = options.view_as(SetupOptions)
    if (
        worker.sdk_container_image
        or worker.worker_harness_container_image
        or setup.setup_file
        or setup.extra_packages
        or setup.requirements_file
    ):
        return []
    return [
        "--sdk_container_image: Dataflow's workers need kiln: give the image built from "
        "kiln's Dockerfile (--sdk_container_image=IMAGE --sdk_location=container), or "
        "--setup_file=./setup.py with --requirements_file, or --extra_package "
        "(docs/dataflow.md)"
    ]


def _warn_requirements_without_kiln(options: PipelineOptions) -> None:
    """Logs a warning when a ``--requirements_file`` is the only way the
    job names to install kiln on Dataflow's workers and no line of it names
    kiln (a ``kiln`` requirement, or a file or URL of a kiln package). It
    may still install kiln as another package's dependency, so this is not
    refused; the usual mistake is the worker requirements of
    docs/dataflow.md without the ``--setup_file`` they go with."""
    worker = options.view_as(WorkerOptions)
    setup = options.view_as(SetupOptions)
    path = setup.requirements_file
    if (
        path is None
        or storage.is_remote(path)
        or worker.sdk_container_image
        or worker.worker_harness_container_image
        or setup.setup_file
        or setup.extra_packages
    ):
        return
    if _may_install_kiln(path, set()):
        return
    logger.warning(
        "--requirements_file: %s names no kiln package, and no --setup_file, --extra_package "
        "or --sdk_container_image installs kiln: unless one of its packages depends on kiln, "
        "every image step will fail on the workers (No module named 'kiln'; docs/dataflow.md)",
        path,
    )


# Options of a requirements file that take a value and install nothing.
_VALUE_OPTIONS = (
    "-c",
    "--constraint",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "--trusted-host",
    "--no-binary",
    "--only-binary",
)


def _may_install_kiln(path: str, seen: set[str]) -> bool:
    """Whether a requirements file names kiln: a requirement named kiln,
    a package file or URL whose name starts with kiln, an editable or
    unreadable entry (kiln cannot tell: taken as yes), following ``-r``."""
    real = os.path.realpath(path)
    if real in seen:
        return False
    seen.add(real)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return True
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        option, _, value = line.replace("=", " ", 1).partition(" ")
        if option in ("-r", "--requirement"):
            included = os.path.join(os.path.dirname(path), value.strip())
            if _may_install_kiln(included, seen):
                return True
            continue
        if option in ("-e", "--editable"):
            return True
        if option in _VALUE_OPTIONS or line.startswith("-"):
            continue
        try:
            name = Requirement(line).name
        except InvalidRequirement:  # a file, folder or URL of a package
            file_name = os.path.basename(line.rstrip("/")).split("#")[0]
            name = re.split(r"[-_.]", file_name, maxsplit=1)[0]
        if canonicalize_name(name) == "kiln":
            return True
    return False


def _dataflow_locations(spec: BuildSpec) -> list[str]:
    """Dataflow's workers read the images and write the shards: a local
    source or output (a folder of the machine that runs `kiln build`) is
    not theirs to reach."""
    source = spec.config.source
    places = [(f"source.{field}", path) for field, path in source.worker_paths()]
    problems = [
        f"{key}: {path} is a local path: on Dataflow the workers read the images there, "
        f"so it must be on Cloud Storage (gs://...)"
        for key, path in places
        if not storage.is_remote(path)
    ]
    if not storage.is_remote(spec.output_root):
        problems.append(
            f"output: {spec.output_root} is a local path: on Dataflow the workers write the "
            f"dataset there, so it must be on Cloud Storage (gs://...)"
        )
    return problems
