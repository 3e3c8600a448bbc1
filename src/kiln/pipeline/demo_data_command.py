"""`kiln demo-data`: its options, and the call to `kiln.pipeline.demo_data`.

Apart from the generator, so that ``kiln demo-data --help`` imports neither
OpenCV nor NumPy: it answers at once, and on an install without the
pipeline extra (docs/cli.md).
"""

from __future__ import annotations

import argparse
import sys

from kiln import console
from kiln.pipeline.progress import DEFAULT_EVERY_SECONDS


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.epilog = """\
examples:
  kiln demo-data build/demo-data                 # what `make demo` builds from
  kiln demo-data /tmp/shapes --num-images 60 --no-broken
  kiln demo-data /tmp/photos --photos --num-images 2000   # benchmark input
  kiln demo-data build/demo-detection --targets   # detection + segmentation + keypoints
                                                  # (manifest.jsonl and instances.json)

exit codes:
  0  written
  1  a file could not be written (a read-only folder, a full disk)
  2  usage error: OUT holds files that are not an earlier demo folder, or a
     negative --num-images/--seed"""
    parser.add_argument(
        "out", metavar="OUT", help="folder to write (new, empty, or an earlier demo folder)"
    )
    parser.add_argument(
        "--num-images",
        type=int,
        default=None,
        help="good images to write (default 300; 60 with --targets)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--no-broken", action="store_true", help="leave out the deliberately broken files"
    )
    parser.add_argument(
        "--photos",
        action="store_true",
        help="write 800x600 photo-like JPEGs (for benchmarks) instead of small shapes",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=DEFAULT_EVERY_SECONDS,
        metavar="SECONDS",
        help="off a terminal, print a progress line every SECONDS (default: 30; 0: "
        "none); on a terminal one line is redrawn in place",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing on success (no progress, no summary); errors are still printed",
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="write scenes of shapes with boxes, masks and keypoints, as a JSONL manifest "
        "and a COCO instances file (what configs/demo-detection.yaml builds; default 60 "
        "images when --num-images is not given)",
    )


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    # Here, not at the top: `kiln demo-data --help` needs none of it (OpenCV, NumPy).
    from kiln.errors import Failure, UsageError
    from kiln.pipeline.demo_data import generate, generate_photos, other_demo
    from kiln.pipeline.progress import LoopProgress

    if args.photos and args.targets:
        raise UsageError("--photos and --targets write different datasets: choose one")
    if args.num_images is None:
        args.num_images = 60 if args.targets else 300
    if args.num_images < 0 or args.seed < 0:
        raise UsageError(
            f"--num-images and --seed must be >= 0, got {args.num_images} and {args.seed}"
        )
    if not args.progress_every >= 0:  # as kiln build's (NaN included): it was ignored
        raise UsageError(f"--progress-every must be 0 or more, got {args.progress_every}")
    shown = LoopProgress(
        args.num_images, prefix="kiln demo-data: ", unit="images", every=args.progress_every
    )
    progress = None if args.quiet else shown.update
    try:
        if args.targets:
            from kiln.pipeline import demo_targets

            written = demo_targets.generate(
                args.out,
                num_images=args.num_images,
                seed=args.seed,
                include_broken=not args.no_broken,
            )
            if not args.quiet:
                console.write(written.describe() + "\n", sys.stdout)
            return 0
        if args.photos:
            summary = generate_photos(
                args.out, num_images=args.num_images, seed=args.seed, progress=progress
            )
        else:
            summary = generate(
                args.out,
                num_images=args.num_images,
                seed=args.seed,
                include_broken=not args.no_broken,
                progress=progress,
            )
    except FileExistsError as e:
        raise UsageError(other_demo(args.out, args.targets) or str(e)) from None
    except OSError as e:  # a read-only folder, a full disk: no bug of kiln's (exit 70)
        where = e.filename if e.filename is not None else args.out
        raise Failure(f"cannot write {where}: {e.strerror or e}") from None
    finally:
        shown.close()
    if not args.quiet:
        console.write(summary.describe() + "\n", sys.stdout)
    return 0
