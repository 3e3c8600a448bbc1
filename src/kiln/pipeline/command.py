"""`kiln build`: build a dataset from a config with the Beam job.

Locally (Beam's local batch engine, every core; no download, no service)::

    kiln build --config configs/demo.yaml
    kiln build --config configs/demo.yaml --output /tmp/datasets
    kiln build --config configs/demo.yaml \
        --direct_num_workers=2 --direct_running_mode=multi_processing
    python -m kiln.pipeline --config configs/demo.yaml
    kiln build --config configs/demo.yaml --quiet --report build/report.json   # for schedulers
    kiln build --config configs/demo.yaml --keep 3          # then delete all but 3 versions
    kiln build --config configs/demo.yaml --max-changed-percent 10   # a publish gate
    kiln build --config configs/demo.yaml --full            # reuse nothing of LATEST
    kiln build --config configs/demo.yaml --rehash          # read every file, trust no stamp

On Dataflow (the source and output in gs://; needs ``pip install 'kiln[gcp]'``
and a container image built from the Dockerfile, see its header)::

    kiln build --config configs/photos.yaml \\
        --runner=DataflowRunner --project=my-project --region=europe-west1 \\
        --temp_location=gs://my-bucket/tmp \\
        --sdk_container_image=europe-west1-docker.pkg.dev/my-project/kiln/kiln:0.1.0 \\
        --sdk_location=container

A build reuses the records of LATEST (or ``--base VERSION``) whose source
files and processing are unchanged, without decoding them, and processes
only new and changed files: the result is byte-identical to a build from
scratch. A file whose size and modification time are those the base
listed is not even read (as make and rsync trust them): ``--rehash`` reads
and hashes every file. The summary says how many records were reused, or
why none was.

kiln's own flags are below; every other flag goes to Beam's PipelineOptions
unchanged (a flag neither knows is a usage error, with a did-you-mean). The
whole config is validated before Beam or TensorFlow is imported, so a
mistake costs well under a second. The command prints where the dataset is
and a summary; a local build also shows its progress (files done of total,
rate, time left) on stderr: one line redrawn on a terminal, a plain line
every ``--progress-every`` seconds elsewhere. Exit codes: 0 built or up to
date; 1 the build failed (nothing published) or the new version crossed the
publish gate (kept in its folder, LATEST unchanged); 2 bad config or usage;
3 busy; 70 an internal error (a bug: one line naming the file that holds
the traceback; nothing published); 73 built or up to date, but the
``--report`` file could not be written; 130 interrupted, 143 terminated by
SIGTERM (nothing published).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
import signal
import sys
import time
from typing import TYPE_CHECKING

from kiln import console, gate_flags, native_logs
from kiln.errors import (
    REPORT_PROBLEM,
    Busy,
    DryRun,
    KilnError,
    ReportNotWritten,
    UsageError,
    also_not_written,
    interruption,
    unexpected,
)
from kiln.pipeline import interrupts

if TYPE_CHECKING:
    from kiln.pipeline.launcher import BuildResult

# The modules that validate and build are imported by `run`: `kiln build
# --help` needs none of them (nor NumPy, OpenCV and pydantic, which they import).

logger = logging.getLogger(__name__)


def _plain(text: str) -> str:
    """The module docstring's examples as --help prints them: no reStructuredText markup."""
    return text.replace("::\n", ":\n").replace("``", "`")


EPILOG = (
    "examples:\n\n"
    + _plain(__doc__[__doc__.index("Locally") : __doc__.index("kiln's own flags")].rstrip())
    + """

exit codes:
  0  built, or already up to date (or a dry run: --dry_run=True on Dataflow)
  1  the build failed (the Beam job failed, the runner could not submit it to
     Dataflow or a job service, the boxes look written in another convention,
     or more than errors.max_fraction of the files were dropped):
     nothing was published, LATEST is unchanged; or
     the new version crossed a publish-gate threshold: it is kept in its
     folder, LATEST is unchanged
  2  bad config or usage (one line naming the field or flag; nothing was done)
  3  another build of the same dataset holds its lock (nothing was done; --wait)
  70  internal error: an exception kiln does not expect (a bug, in kiln or a
      plugin): one line naming it and the file that holds its traceback
      (--report has it too; --verbose prints it); nothing was published
  73  the build succeeded (published, or up to date), but the --report file
      could not be written: one line saying both (a report path found
      unwritable before the build is exit 2, nothing done; after a failed
      build, its own code stands, its line saying the report was not written)
  130  interrupted (Ctrl-C): nothing was published, LATEST is unchanged
  143  terminated (SIGTERM, from a scheduler): handled as Ctrl-C"""
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "kiln build --config FILE [--output ROOT] [--image-threads N] [--quiet] "
        "[--progress-every SECONDS] [--report FILE] [--keep N] [--wait SECONDS] "
        "[--base VERSION | --full] [--rehash] [publish gate flags] [Beam pipeline options...]"
    )
    parser.epilog = EPILOG
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the build config (YAML), e.g. configs/demo.yaml (required)",
    )
    parser.add_argument(
        "--output",
        metavar="ROOT",
        help="output root, overriding the config's `output` "
        "(the dataset goes to ROOT/<name>/<version>/)",
    )
    parser.add_argument(
        "--image-threads",
        type=int,
        metavar="N",
        help="threads per image-processing worker (default: every core "
        "on a local runner, 1 on Dataflow, which runs a process per core)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing when the build succeeds: no progress, no summary and "
        "no warnings (--report lists them); errors still go to stderr, one line",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="off a terminal (logs, cron, CI), print a plain progress line every "
        "SECONDS (default: 30; 0: none); on a terminal one line is redrawn in place",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="write the end-of-build summary as JSON to FILE (also when the "
        "build fails; status running while it runs), for schedulers; local path or "
        "gs://. Checked before the build: a folder, or a place that cannot be "
        "written, is exit 2",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if another build of the same dataset holds its lock, wait up to "
        "SECONDS for it to release it (default: exit 3 at once)",
    )
    parser.add_argument(
        "--base",
        metavar="VERSION",
        help="reuse the unchanged records of this published version, by id or by its "
        "folder (default: the one LATEST names); only new and changed files are processed",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="build from scratch: reuse no record of a published version",
    )
    parser.add_argument(
        "--rehash",
        action="store_true",
        help="read and hash every source file to find those that changed, also when "
        "the dataset looks up to date (default: a file with the size and modification "
        "time the base listed is not read)",
    )
    parser.add_argument(
        "--keep",
        type=int,
        metavar="N",
        help="after publishing (or finding the dataset up to date), delete all "
        "but the N most recently published versions; never the one LATEST "
        "names (default: keep all)",
    )
    gate = parser.add_argument_group(
        "publish gate",
        "kiln diff's thresholds, checked against the version LATEST names before "
        "LATEST may name the new one. A version that crosses one is kept in its "
        "folder, unpublished, and the build exits 1 (LATEST unchanged).",
    )
    gate_flags.add_arguments(gate, crossing="do not publish")


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    started = time.monotonic()
    quiet = args.quiet and not getattr(args, "verbose", False)
    # Once LATEST names the new version, a Ctrl-C or SIGTERM waits until the
    # summary and the report are written (`kiln.pipeline.interrupts`).
    with interrupts.held_once_published() as held:
        result = _run(args, extra_argv, quiet, started)
    if held and result is not None:
        logger.info(
            "%s came after %s version %s was published: the build had finished",
            signal.Signals(held[0]).name,
            result.info.name,
            result.version,
        )
    return 0


def _run(
    args: argparse.Namespace, extra_argv: list[str], quiet: bool, started: float
) -> BuildResult | None:
    """The build, its summary and its report; None for a dry run."""
    from kiln.pipeline import build_report

    with _Warnings(silence=quiet) as warnings:
        try:
            build = _build_quietly if quiet else _build
            result = build(args, extra_argv, warnings.messages)
        except DryRun as e:  # --dry_run=True: translated, not submitted, nothing published
            _report(
                args, build_report.dry_run(str(e), time.monotonic() - started), warnings.messages
            )
            if not args.quiet:
                console.write(f"kiln build: {e.label}: {e}\n", sys.stdout)
            return None
        except _UnwritableReport:  # nowhere to write that: printed by kiln.cli
            raise
        except KilnError as e:  # printed by kiln.cli, with its exit code
            # A publish gate failure's `gate` (`launcher.GateError.gate_report`),
            # without importing the launcher (Beam) for a config error.
            gate = getattr(e, "gate_report", None)
            report = build_report.failed(str(e), e.exit_code, time.monotonic() - started, gate)
            if isinstance(e, Busy) and args.running_report_found is not None:
                # The report of the build that holds the lock (running, or
                # killed since): this run did nothing, and a scheduler that
                # reads `busy` there would lose track of that build.
                _restore_report(args.report, args.running_report_found)
            else:
                _report(args, report, warnings.messages, failure=e)
            raise
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: printed by kiln.cli
            what, code = interruption(e)
            report = build_report.interrupted(what, code, time.monotonic() - started)
            _report(args, report, warnings.messages, failure=e)
            raise
        except Exception as e:  # a bug: printed by kiln.cli, with the traceback saved
            report = build_report.internal_error(e, time.monotonic() - started)
            _report(args, report, warnings.messages, failure=e)
            raise
        # LATEST names the version (or named it already: up to date): the
        # build is done, and a Ctrl-C or SIGTERM has nothing left to stop.
        interrupts.published()
        if not args.quiet:
            # A reader that went away (`| head`), or a stdout that cannot be
            # written (a full disk), does not keep the report from being
            # written, nor change the build's exit code (`kiln.console`).
            console.write(summary(result) + "\n", sys.stdout)
        report = build_report.succeeded(result, time.monotonic() - started)
        _report(args, report, warnings.messages, result)
    return result


def usage_error(argv: list[str], message: str) -> str:
    """Writes the ``usage_error`` report of a command line argparse refused
    (``--keep two``, ``--wait`` without its value: `kiln.cli` calls this
    before it exits 2, as `run` never runs), if `argv` (the arguments after
    ``build``) gives ``--report``, so that the last run's report does not
    stay; `message` is the line's, after its label. Returns
    `kiln.errors.also_not_written`'s end of that line: '' or why the report
    could not be written."""
    path = _report_flag(argv)
    if path is None:
        return ""
    from kiln.pipeline import build_report

    error = UsageError(message)
    # Nothing ran: no time to report.
    report = build_report.failed(str(error), error.exit_code, 0.0)
    _report(argparse.Namespace(report=path), report, [], failure=error)
    return also_not_written(error)


def _report_flag(argv: list[str]) -> str | None:
    """The FILE of the last ``--report FILE`` or ``--report=FILE`` in `argv`,
    or of an abbreviation of it that names no other flag of kiln's (argparse
    takes ``--rep FILE`` too), read without the parser, which refused
    `argv`; None if there is none before ``--``, or it has no value."""
    others = [flag for flag in _own_flags() if flag != "--report"]
    found = None
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        flag, equals, value = arg.partition("=")
        if not (
            flag.startswith("--")
            and "--report".startswith(flag)
            and (flag == "--report" or not any(o.startswith(flag) for o in others))
            and len(flag) > 2
        ):
            continue
        if not equals:  # the next argument, unless argparse would take it for a flag
            following = argv[index + 1 : index + 2]
            value = following[0] if following and not following[0].startswith("-") else ""
        found = value or None
    return found


class _UnwritableReport(UsageError):
    """``--report`` names a file that cannot be written (found before the build)."""


class _Warnings(logging.Handler):
    """The warnings logged while a build runs (by kiln or a library), for
    the report's ``warnings``.

    With `silence` (``--quiet``), the console's log handlers print none of
    them: a quiet build that succeeds prints nothing at all (cron mails any
    output), and one that fails prints only its one line. The report keeps
    them either way.
    """

    def __init__(self, silence: bool) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self._silence = silence
        self._silenced: list[logging.Handler] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # a malformed log call must not fail the build
            self.handleError(record)

    @staticmethod
    def _drop(record: logging.LogRecord) -> bool:
        return False

    def __enter__(self) -> _Warnings:
        root = logging.getLogger()
        if self._silence:
            self._silenced = list(root.handlers)
            for handler in self._silenced:
                handler.addFilter(self._drop)
        root.addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        for handler in self._silenced:
            handler.removeFilter(self._drop)
        self._silenced = []


# What Python prints when Beam's stager builds the --setup_file package with
# `python -m build` and cannot run the `build` module: it is not installed
# (``/usr/bin/python3: No module named build``), or a `build/` folder beside
# setup.py, where the stager runs it, hides the installed one
# (``...: No module named build.__main__; 'build' is a package and cannot be
# directly executed``). The stager then builds it with ``setup.py sdist``.
# Were that to fail too, the build fails with its own line.
_STAGER_WITHOUT_BUILD = re.compile(
    rb"\S*: No module named build"
    rb"(\.__main__; 'build' is a package and cannot be directly executed)?$"
)


def _build_quietly(
    args: argparse.Namespace, extra_argv: list[str], warnings: list[str]
) -> BuildResult:
    """`_build` for ``--quiet``, with what image libraries write to stderr
    kept off it (`native_logs.IMAGE_LIBRARY_LINES`): libpng and libjpeg print
    warnings about the files they read, and Beam's worker processes inherit
    the capture. So is the line of Beam's stager trying ``python -m build``
    (`_STAGER_WITHOUT_BUILD`). Every other line is written back when the
    build ends, before `kiln.cli` prints the failure line, if any. What was
    dropped is logged as a warning, which the report keeps and the console
    does not."""
    dropped = native_logs.DroppedLines()
    staged = native_logs.DroppedLines()
    try:
        with native_logs.filtered_stderr(native_logs.IMAGE_LIBRARY_LINES) as dropped:
            with native_logs.filtered_stderr(_STAGER_WITHOUT_BUILD) as staged:
                return _build(args, extra_argv, warnings)
    finally:
        if dropped.count:
            logger.warning(
                "--quiet hid %d line(s) that image libraries wrote to stderr (they name no "
                "file; a file they could not read is in errors.jsonl), the first: %s",
                dropped.count,
                dropped.first,
            )
        if staged.count:
            logger.warning(
                "--quiet hid the line Python wrote as Beam's stager tried `python -m build` "
                "for --setup_file (%s); the stager then builds the package with `setup.py "
                "sdist`",
                staged.first,
            )


def _build(args: argparse.Namespace, extra_argv: list[str], warnings: list[str]) -> BuildResult:
    """Validates the flags and the config, then builds.

    `warnings` is the list the run collects the logged warnings in, for
    the ``running`` report written once the config checks out.
    """
    if args.config is None:
        raise UsageError(_missing_config(extra_argv))
    if args.image_threads is not None and args.image_threads < 1:
        raise UsageError(f"--image-threads must be at least 1, got {args.image_threads}")
    # `not >= 0`, not `< 0`: NaN (`--wait nan`, which float() reads) is neither.
    if not args.progress_every >= 0:
        raise UsageError(f"--progress-every must be 0 or more, got {args.progress_every}")
    if not args.wait >= 0:
        raise UsageError(f"--wait must be 0 or more, got {args.wait:g}")
    try:
        gate = gate_flags.values(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    from kiln.pipeline import build_report, storage
    from kiln.pipeline import config as config_module

    # The pipeline flags configure this process's access to object stores
    # too (s3:// takes its endpoint and credentials only from them), from
    # the config check's look at the source on.
    storage.use_pipeline_options(extra_argv)
    if args.report:
        # Before anything is done: a report that cannot be written would
        # otherwise turn a published build into a failed run at its end.
        problem = build_report.destination_problem(args.report)
        if problem:
            raise _UnwritableReport(
                f"--report {args.report}: cannot write it: {problem}; nothing was done"
            )
    # The whole config first, before Beam and TensorFlow are imported: a
    # mistake is reported in a fraction of a second.
    spec = config_module.load(args.config, output=args.output)
    config_module.check_output_folders(spec)
    args.running_report_found = None
    if args.report:
        args.running_report_found = _running_report(args.report)
        # Replaced when the build ends, whatever the end: one that never
        # comes (SIGKILL, the OOM killer, a lost VM) leaves `running`, not
        # the previous run's success, for a scheduler to read.
        _write_report(
            args.report,
            {
                **build_report.running(spec.name, spec.dataset_root, args.config),
                "warnings": list(warnings),
            },
            problem_ends_build=True,
        )
    # Beam lists the source; TensorFlow is imported only if the job runs
    # (`launcher`), so a source found up to date costs a listing.
    from kiln.pipeline import launcher
    from kiln.schemas.version_diff import Thresholds

    launcher.check_pipeline_args(extra_argv, own_flags=_own_flags())
    return launcher.build(
        spec,
        extra_argv,
        image_threads=args.image_threads,
        show_progress=not args.quiet,
        progress_every=args.progress_every,
        keep=args.keep,
        wait=args.wait,
        base=args.base,
        full=args.full,
        gate=Thresholds(**gate),
        rehash=args.rehash,
    )


def _missing_config(extra_argv: list[str]) -> str:
    """What ``kiln build`` without ``--config`` says: given a YAML file as a
    positional argument (``kiln build my.yaml``), the command to type instead."""
    given = next(
        (
            arg
            for arg in extra_argv
            if not arg.startswith("-") and arg.lower().endswith((".yaml", ".yml"))
        ),
        None,
    )
    if given is None:
        return "--config FILE is required: the build config, e.g. --config configs/demo.yaml"
    return (
        f"--config FILE is required: the config is not a positional argument; "
        f"run kiln build --config {given}"
    )


def _own_flags() -> list[str]:
    """`kiln build`'s own option strings, for the did-you-mean of an unknown flag."""
    parser = argparse.ArgumentParser(add_help=False)
    configure_parser(parser)
    return [option for action in parser._actions for option in action.option_strings]


def _report(
    args: argparse.Namespace,
    report: dict,
    warnings: list[str],
    result: BuildResult | None = None,
    failure: BaseException | None = None,
) -> None:
    """Writes the report ``--report`` names, if any.

    Raises:
      ReportNotWritten: it could not be written after the build `result`
        succeeded (which the message says). After a build that ended with
        the exception `failure`, the build's own exit code stands (1, 70,
        130...: nothing was published, which 73 would hide), and why the
        report could not be written is set on `failure` for the end of the
        one line `kiln.cli` prints of it (`kiln.errors.REPORT_PROBLEM`):
        under ``--quiet`` a logged error would not show, and the report
        left at ``running`` would say nothing of this run's end.
    """
    if not args.report:
        return
    try:
        _write_report(args.report, {**report, "warnings": list(warnings)})
    except _ReportFailed as e:
        if result is not None:  # published, but the scheduler would not hear of it
            raise ReportNotWritten(f"{e}; {_succeeded(result)}") from None
        if failure is None:
            logger.error("%s", e)
        else:
            setattr(failure, REPORT_PROBLEM, str(e))


def _running_report(path: str) -> dict | None:
    """The report at `path` if it is a ``running`` one (another build's,
    under way or killed), else None (none, another status, or unreadable:
    then this run's report replaces it as usual)."""
    from kiln.pipeline import storage

    try:
        text = storage.read_text(path)
        report = None if text is None else json.loads(text)
    except Exception:  # not a report: replaced by this run's
        return None
    return report if isinstance(report, dict) and report.get("status") == "running" else None


def _restore_report(path: str, report: dict) -> None:
    """Puts back the ``running`` `report` a busy run found at `path`."""
    from kiln.pipeline import build_report

    try:
        build_report.write(path, report)
    except Exception as e:
        logger.error("--report %s: cannot put back the running build's report: %s", path, e)


class _ReportFailed(Exception):
    """The report could not be written (the message says why)."""


def _write_report(path: str, report: dict, problem_ends_build: bool = False) -> None:
    """Writes `report` to `path` (``--report``), atomically.

    Raises:
      _UnwritableReport: it could not be written and `problem_ends_build`
        (the ``running`` report: nothing was done yet).
      _ReportFailed: it could not be written (otherwise).
    """
    from kiln.pipeline import build_report, storage

    try:
        build_report.write(path, report)
    except Exception as e:
        if isinstance(e, OSError):
            # The report's own path: the OS error may name the temp file it was written to.
            reason = storage.describe_os_error(e)
            if e.filename is not None:
                reason = e.strerror or reason
        else:  # an object store's error
            reason = storage.unreachable_reason(e) or unexpected(e)
        problem = f"--report {path}: cannot write it: {reason}"
        if problem_ends_build:
            raise _UnwritableReport(f"{problem}; nothing was done") from None
        raise _ReportFailed(problem) from None


def _succeeded(result: BuildResult) -> str:
    """What a build that succeeded did, for a line that must say it."""
    what = "was up to date" if result.up_to_date else "was published"
    latest = (
        "LATEST names it"
        if result.latest_set_by_hand is None
        else f"LATEST names {result.latest_set_by_hand}, set by hand"
    )
    return (
        f"the build succeeded: {result.info.name} version {result.version} {what} "
        f"({result.dataset_dir}; {latest})"
    )


def summary(result: BuildResult) -> str:
    """The end-of-build summary the command prints."""
    from kiln.schemas import DROPPED_OBJECTS_FILENAME, ERRORS_FILENAME, share_text

    info = result.info
    if result.up_to_date:
        head = f"kiln build: {info.name} is up to date: version {result.version}"
    else:
        head = f"kiln build: built {info.name} version {result.version}"
    if result.latest_set_by_hand is None:
        lines = [head, f"  dataset: {result.dataset_dir}  (LATEST -> {result.version})"]
    else:
        lines = [
            head,
            f"  dataset: {result.dataset_dir}",
            f"  LATEST -> {result.latest_set_by_hand}, set by hand after {result.version} was "
            f"published: left as is (write {result.version} into LATEST to publish it again)",
        ]
    width = max([len("split")] + [len(name) for name in info.splits])
    shares = {name: share_text(*share) for name, share in info.split_shares().items()}
    lines.append(f"  {'split':<{width}}  {'examples':>8}  {'shards':>6}  share")
    for name, share in shares.items():
        split = info.splits[name]
        lines.append(f"  {name:<{width}}  {split.num_examples:>8}  {len(split.shards):>6}  {share}")
    if (info.config.get("splits") or {}).get("stratify"):
        deviation = info.largest_class_deviation() or 0.0
        lines.append(
            f"  stratified: every class within {deviation:.2f} examples of its share per split"
        )
    dropped = sum(info.dropped.values())
    if dropped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(info.dropped.items()))
        lines.append(
            f"  dropped: {dropped} ({reasons}); "
            f"see {result.dataset_dir.rstrip('/')}/{ERRORS_FILENAME}"
        )
    else:
        lines.append("  dropped: 0")
    objects = info.objects_dropped
    if objects:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in objects.items())
        lines.append(
            f"  objects dropped from stored images: {sum(objects.values())} ({reasons}); "
            f"see {result.dataset_dir.rstrip('/')}/{DROPPED_OBJECTS_FILENAME}"
        )
    duplicates = f"  duplicates: {info.duplicates}"
    if result.duplicates_across_splits:
        duplicates += (
            f" ({result.duplicates_across_splits} in a different split than "
            f"their first copy: the source's splits leak)"
        )
    lines.append(duplicates)
    if result.incremental is not None:
        lines.append(result.incremental.summary_line())
    if result.changes is not None:
        lines.extend(f"  {line}" for line in result.changes.summary_lines())
    if result.pruned:
        lines.append(f"  pruned: {len(result.pruned)} old version(s): {', '.join(result.pruned)}")
    if result.previous_version is None and not result.up_to_date:
        # The dataset's first version: where to look next (README, "Quick start").
        root = result.dataset_root
        shell = shlex.quote(root)
        if root.startswith("s3://"):  # TensorFlow reads no s3:// (docs/dataflow.md, S3)
            version = f"{root.rstrip('/')}/{result.version}"
            lines.append(
                f"  next: TensorFlow has no s3:// filesystem: copy the version to local disk or "
                f"gs:// (aws s3 sync {shlex.quote(version)} {shlex.quote(result.version)}), "
                f"then kiln inspect, kiln preview and kiln.reader.load read the copy"
            )
            return "\n".join(lines)
        lines.append(
            f"  next: kiln inspect {shell}; kiln preview {shell} -o preview.png; train with "
            f'kiln.reader.load({json.dumps(root, ensure_ascii=False)}, "train", '
            f"batch_size=64, seed=1)"
        )
    return "\n".join(lines)
