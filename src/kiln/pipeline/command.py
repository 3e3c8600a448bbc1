"""`kiln build`: build a dataset from a config with the Beam job.

Locally (Beam's local batch engine, every core; no download, no service)::

    kiln build --config configs/demo.yaml
    kiln build --config configs/demo.yaml --output /tmp/datasets
    kiln build --config configs/demo.yaml \
        --direct_num_workers=2 --direct_running_mode=multi_processing
    python -m kiln.pipeline --config configs/demo.yaml
    kiln build --config configs/demo.yaml --quiet --report build/report.json   # for schedulers
    kiln build --config configs/demo.yaml --keep 3          # then delete all but 3 versions

On Dataflow (the source and output in gs://; needs ``pip install 'kiln[gcp]'``
and a container image built from the Dockerfile, see its header)::

    kiln build --config configs/photos.yaml \\
        --runner=DataflowRunner --project=my-project --region=europe-west1 \\
        --temp_location=gs://my-bucket/tmp \\
        --sdk_container_image=europe-west1-docker.pkg.dev/my-project/kiln/kiln:0.1.0 \\
        --sdk_location=container

kiln's own flags are below; every other flag goes to Beam's PipelineOptions
unchanged. The command prints where the dataset is and a summary; on a
terminal, a local build also shows its progress (files done of total, rate,
time left) on stderr. Exit codes: 0 built or up to date; 1 the build failed
(nothing published); 2 bad config or usage.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from kiln.errors import KilnError, UsageError
from kiln.pipeline import build_report
from kiln.pipeline.launcher import BuildResult, build
from kiln.schemas import ERRORS_FILENAME
from kiln.schemas.metadata import fraction_text

EPILOG = (
    "examples:\n\n"
    + __doc__[__doc__.index("Locally") : __doc__.index("kiln's own flags")].rstrip()
    + """

exit codes:
  0  built, or already up to date
  1  the build failed (the Beam job failed, or more than errors.max_fraction of
     the files were dropped): nothing was published, LATEST is unchanged
  2  bad config or usage (one line naming the field; nothing was done)
  3  another build of the same dataset is running (nothing was done; --wait)"""
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "kiln build --config FILE [--output ROOT] [--quiet] [--report FILE] "
        "[--keep N] [--wait SECONDS] [Beam pipeline options...]"
    )
    parser.epilog = EPILOG
    parser.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="the build config (YAML), e.g. configs/demo.yaml",
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
        help="print no progress and no summary (errors still go to stderr); "
        "progress is only shown on a terminal anyway",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="write the end-of-build summary as JSON to FILE (also when the "
        "build fails), for schedulers; local path or gs://",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if another build of the same dataset is running, wait up to "
        "SECONDS for it to finish (default: exit 3 at once)",
    )
    parser.add_argument(
        "--keep",
        type=int,
        metavar="N",
        help="after publishing (or finding the dataset up to date), delete all "
        "but the N most recently published versions; never the one LATEST "
        "names (default: keep all)",
    )


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    # Move everything alive so far (TensorFlow and Beam: millions of
    # objects) out of the garbage collector's reach while the build runs: a
    # full collection would otherwise walk them all, several times a build,
    # on the job's thread. Unfrozen after, so a process
    # that runs several builds (kiln.cli.main in a scheduler) keeps nothing
    # alive that it would otherwise collect.
    gc.freeze()
    try:
        return _run(args, extra_argv)
    finally:
        gc.unfreeze()


def _run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    started = time.monotonic()
    try:
        if args.image_threads is not None and args.image_threads < 1:
            raise UsageError(f"--image-threads must be at least 1, got {args.image_threads}")
        result = build(
            args.config,
            extra_argv,
            output=args.output,
            image_threads=args.image_threads,
            show_progress=not args.quiet and sys.stderr.isatty(),
            keep=args.keep,
            wait=args.wait,
        )
    except KilnError as e:  # printed by kiln.cli, with its exit code
        _report(args, build_report.failed(str(e), e.exit_code, time.monotonic() - started))
        raise
    if not args.quiet:
        print(summary(result))
    _report(args, build_report.succeeded(result, time.monotonic() - started))
    return 0


def _report(args: argparse.Namespace, report: dict) -> None:
    if args.report:
        build_report.write(args.report, report)


def summary(result: BuildResult) -> str:
    """The end-of-build summary the command prints."""
    info = result.info
    if result.up_to_date:
        head = f"kiln build: {info.name} is up to date: version {result.version}"
    else:
        head = f"kiln build: built {info.name} version {result.version}"
    lines = [head, f"  dataset: {result.dataset_dir}  (LATEST -> {result.version})"]
    width = max([len("split")] + [len(name) for name in info.splits])
    lines.append(f"  {'split':<{width}}  {'examples':>8}  {'shards':>6}  fraction (requested)")
    fractions = info.split_fractions()
    for name in sorted(info.splits):
        split = info.splits[name]
        lines.append(
            f"  {name:<{width}}  {split.num_examples:>8}  {len(split.shards):>6}  "
            f"{fraction_text(*fractions[name])}"
        )
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
    duplicates = f"  duplicates: {info.duplicates}"
    if result.duplicates_across_splits:
        duplicates += (
            f" ({result.duplicates_across_splits} in a different split than "
            f"their first copy: the source's splits leak)"
        )
    lines.append(duplicates)
    if result.changes is not None:
        lines.extend(f"  {line}" for line in result.changes.summary_lines())
    if result.pruned:
        lines.append(f"  pruned: {len(result.pruned)} old version(s): {', '.join(result.pruned)}")
    return "\n".join(lines)
