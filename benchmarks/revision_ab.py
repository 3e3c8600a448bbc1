"""Does a change make the build slower? Another revision's `kiln build` and this one, side by side.

    python -m benchmarks.revision_ab 41bf21c                 # 2000 images, 5 rounds, 1 thread
    python -m benchmarks.revision_ab HEAD~3 --image-threads 0 --rounds 7   # local defaults
    python -m benchmarks.revision_ab HEAD --quick            # checks the harness (tiny corpus)

The other revision is checked out with ``git worktree add --detach`` into
the scratch folder (removed after); only its ``src`` is used: the harness,
the corpus and the measured work (`benchmarks.build_bench`) are this
checkout's, so both sides run the same command on the same files. Each
round measures the plain loop A, the other revision and this checkout, in
alternating order (a burst of load from elsewhere hits all alike), every
build in its own process.

It reports medians of wall time and of the work's CPU time (all threads).
On a shared machine wall time swings by tens of percent with the
neighbours' load, while CPU time moves much less: read the CPU ratio for
"more work per image", the wall ratio for "less parallel". Nothing here is
a test; `make bench` keeps the absolute numbers (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from benchmarks import build_bench, corpus, machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FULL_CORPUS = corpus.CorpusSpec(parts=2, per_part=1000)
QUICK_CORPUS = corpus.CorpusSpec(parts=2, per_part=4, width=160, height=120)


@contextlib.contextmanager
def revision_src(revision: str, scratch: str) -> Iterator[str]:
    """`revision`'s ``src`` folder, checked out with ``git worktree add
    --detach`` into a folder of `scratch` for the ``with`` block, then
    removed with its worktree entry (also used by `benchmarks.reader_ab`)."""
    git = shutil.which("git")
    if git is None:
        raise SystemExit("comparing with another revision needs git on PATH")
    checkout = tempfile.mkdtemp(prefix="revision-", dir=scratch)
    subprocess.run(
        [git, "-C", ROOT, "worktree", "add", "--detach", "--force", checkout, revision],
        check=True,
        capture_output=True,
    )
    try:
        yield os.path.join(checkout, "src")
    finally:
        subprocess.run(
            [git, "-C", ROOT, "worktree", "remove", "--force", checkout], capture_output=True
        )
        shutil.rmtree(checkout, ignore_errors=True)


def _variants(other_src: str, image_threads: int) -> dict[str, tuple[str | None, dict]]:
    """Name -> (kiln's src folder, or None for this checkout's; build_bench spec)."""
    args = [] if image_threads == 0 else ["--image-threads", str(image_threads)]
    opencv = {"opencv_threads": 1} if image_threads == 1 else {}
    kiln = {"kind": "kiln", "args": args, **opencv}
    return {
        "A": (None, {"kind": "baseline", "opencv_threads": 1}),
        "other": (other_src, kiln),
        "this": (None, kiln),
    }


def compare(
    revision: str, *, images: int, rounds: int, image_threads: int, scratch: str, quick: bool
) -> dict[str, dict[str, float]]:
    """Medians per variant: ``{"A"|"other"|"this": {"wall": s, "cpu": s}}``."""
    os.makedirs(scratch, exist_ok=True)
    source = corpus.ensure(
        os.path.join(scratch, "corpus"),
        QUICK_CORPUS if quick else FULL_CORPUS,
        workers=1 if quick else machine.usable_cores(),
    )
    manifest = source.manifest(images)
    with revision_src(revision, scratch) as other_src:
        variants = _variants(other_src, image_threads)
        runs: dict[str, list[build_bench.BuildRun]] = {name: [] for name in variants}
        for round_number in range(rounds):
            order = list(variants) if round_number % 2 == 0 else list(reversed(variants))
            for name in order:
                src, spec = variants[name]
                run = build_bench.measure(dict(spec, manifest=manifest), scratch, kiln_src=src)
                expected = src or os.path.join(ROOT, "src")
                if run.kiln_module is not None and not run.kiln_module.startswith(expected):
                    raise RuntimeError(f"{name}: measured {run.kiln_module}, not {expected}")
                runs[name].append(run)
    return {
        name: {
            "wall": statistics.median(run.seconds for run in measured),
            "cpu": statistics.median(run.work_cpu_seconds or 0.0 for run in measured),
        }
        for name, measured in runs.items()
    }


def summary(revision: str, medians: dict[str, dict[str, float]]) -> str:
    lines = [f"{'':8} {'wall s':>8} {'cpu s':>8} {'A/x wall':>9} {'A/x cpu':>8}"]
    for name, label in (("A", "A"), ("other", revision[:8]), ("this", "this")):
        wall, cpu = medians[name]["wall"], medians[name]["cpu"]
        lines.append(
            f"{label:8} {wall:8.4f} {cpu:8.4f} "
            f"{medians['A']['wall'] / wall:8.3f}x {medians['A']['cpu'] / cpu:7.3f}x"
        )
    other, this = medians["other"], medians["this"]
    lines.append(
        f"this / {revision[:8]}: wall {this['wall'] / other['wall']:.3f}x, "
        f"cpu {this['cpu'] / other['cpu']:.3f}x (above 1: this checkout is slower)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.revision_ab", description=__doc__.split("\n")[0]
    )
    parser.add_argument("revision", help="the git revision to compare with, e.g. HEAD~3")
    parser.add_argument("--images", type=int, default=None, help="images per build (2000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (5)")
    parser.add_argument(
        "--image-threads",
        type=int,
        default=1,
        help="kiln build --image-threads; 0 for the local default (one per core). Default 1",
    )
    parser.add_argument("--quick", action="store_true", help="8 tiny images, one round")
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "build", "bench-ab"), help="scratch folder"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    images = args.images or (8 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 5)
    medians = compare(
        args.revision,
        images=images,
        rounds=rounds,
        image_threads=args.image_threads,
        scratch=os.path.abspath(args.out),
        quick=args.quick,
    )
    print(f"{images} images, {rounds} rounds, medians; load average {machine.load_average()}")
    print(summary(args.revision, medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
