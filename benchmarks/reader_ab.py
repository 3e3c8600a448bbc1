"""The reader's cost of targets: another revision's `kiln.reader` and this one's, side by side.

    python -m benchmarks.reader_ab main                    # 1000 images, 4 processes a side
    python -m benchmarks.reader_ab HEAD~2 --processes 6 --pairs 4
    python -m benchmarks.reader_ab HEAD --quick            # checks the harness (tiny corpus)

The number measured is make bench's targets row (`reader_bench`): the
per-image cost of (b), the default augmentation, with boxes and a class
mask (`reader_bench.build_target_dataset`) against (b) on the same JPEGs
without them. Each process measures (b) and (b) with targets in pairs,
alternating which goes first, in fresh pipelines as make bench does; the
processes of the two revisions alternate, each importing its own ``src``
(the other revision checked out with ``git worktree add --detach`` into the
scratch folder, removed after). The datasets, the corpus and the harness
are this checkout's.

It reports, per revision, medians of images per second and of the cost
ratio of each pair, in wall time (make bench's measure) and in CPU time of
the process per image (all its threads), which a busy shared machine
disturbs much less than wall time. Nothing here is a test; make bench keeps
the absolute numbers (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks import corpus, machine, reader_bench, revision_ab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FULL_CORPUS = corpus.CorpusSpec(parts=2, per_part=500)
QUICK_CORPUS = corpus.CorpusSpec(parts=2, per_part=8, width=160, height=120)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_pair_member(dataset_dir: str, batch_size: int, batches: int) -> tuple[float, float]:
    """``(images per second, CPU microseconds per image)`` of (b) on one
    dataset, in a fresh pipeline (as `reader_bench.measure_variant`)."""
    import gc

    # (b): kiln.reader.load with the dataset's stored augmentation, as make bench reads it.
    dataset = reader_bench.TARGET_VARIANTS[0].make(dataset_dir, "jpeg", batch_size)
    iterator = iter(dataset)
    for _ in range(reader_bench.WARMUP_BATCHES):
        next(iterator)
    cpu, start = _cpu_seconds(), time.perf_counter()
    images = 0
    for _ in range(batches):
        batch, _ = next(iterator)
        images += int(batch.shape[0])
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    del iterator, dataset
    gc.collect()
    return images / wall, 1e6 * cpu / images


def worker(plain: str, targets: str, pairs: int, batch_size: int, batches: int) -> dict:
    """One process's pairs: ``{"kiln": where kiln came from, "plain": [...], "targets": [...]}``."""
    import kiln

    out: dict = {"kiln": kiln.__file__, "plain": [], "targets": []}
    for index in range(pairs):
        order = ["plain", "targets"] if index % 2 == 0 else ["targets", "plain"]
        for name in order:
            directory = plain if name == "plain" else targets
            out[name].append(measure_pair_member(directory, batch_size, batches))
    return out


def summary(runs: list[dict]) -> dict[str, float]:
    """Medians over every pair of a revision's processes."""
    pairs = [pair for run in runs for pair in zip(run["plain"], run["targets"], strict=True)]
    return {
        "pairs": len(pairs),
        "plain_images_per_second": statistics.median(p[0] for p, _ in pairs),
        "targets_images_per_second": statistics.median(t[0] for _, t in pairs),
        "wall_cost": statistics.median(p[0] / t[0] for p, t in pairs),
        "cpu_cost": statistics.median(t[1] / p[1] for p, t in pairs),
        "plain_cpu_us": statistics.median(p[1] for p, _ in pairs),
        "targets_cpu_us": statistics.median(t[1] for _, t in pairs),
    }


def _datasets(scratch: str, images: int, quick: bool) -> tuple[str, str]:
    source = corpus.ensure(
        os.path.join(scratch, "corpus"),
        QUICK_CORPUS if quick else FULL_CORPUS,
        workers=1 if quick else machine.usable_cores(),
    )
    manifest = source.manifest(images)
    output = os.path.join(scratch, "datasets")
    plain = reader_bench.build_datasets(manifest, output, encodings=("jpeg",))["jpeg"]
    return plain, reader_bench.build_target_dataset(manifest, output)


def compare(
    revision: str,
    *,
    images: int,
    processes: int,
    pairs: int,
    batch_size: int,
    batches: int,
    scratch: str,
    quick: bool,
    log=print,
) -> dict[str, dict[str, float]]:
    """Medians per side: ``{revision: {...}, "this": {...}}`` (see `summary`)."""
    os.makedirs(scratch, exist_ok=True)
    plain, targets = _datasets(scratch, images, quick)
    runs: dict[str, list[dict]] = {revision: [], "this": []}
    with revision_ab.revision_src(revision, scratch) as other_src:
        sides = {revision: other_src, "this": os.path.join(ROOT, "src")}
        for index in range(processes):
            order = list(sides) if index % 2 == 0 else list(reversed(sides))
            for side in order:
                result = os.path.join(scratch, f"pairs-{index}.json")
                arguments = [plain, targets, str(pairs), str(batch_size), str(batches), result]
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([sides[side], ROOT]))
                subprocess.run(
                    [sys.executable, "-m", "benchmarks.reader_ab", "--worker", *arguments],
                    env=env,
                    check=True,
                    cwd=ROOT,
                )
                with open(result) as f:
                    run = json.load(f)
                if not run["kiln"].startswith(sides[side]):
                    raise RuntimeError(f"{side}: measured {run['kiln']}, not {sides[side]}")
                runs[side].append(run)
                costs = [p[0] / t[0] for p, t in zip(run["plain"], run["targets"], strict=True)]
                log(
                    f"process {index + 1} {side}: wall cost {', '.join(f'{c:.3f}' for c in costs)}"
                    f"; load average {machine.load_average()}"
                )
    return {side: summary(measured) for side, measured in runs.items()}


def report(revision: str, medians: dict[str, dict[str, float]]) -> str:
    lines = [
        f"{'':10} {'pairs':>5} {'(b) img/s':>10} {'targets':>8} {'wall cost':>10} "
        f"{'(b) cpu us':>10} {'targets':>8} {'cpu cost':>9}"
    ]
    for side in (revision, "this"):
        m = medians[side]
        lines.append(
            f"{side[:10]:10} {m['pairs']:5d} {m['plain_images_per_second']:10.0f} "
            f"{m['targets_images_per_second']:8.0f} {m['wall_cost']:9.3f}x "
            f"{m['plain_cpu_us']:10.0f} {m['targets_cpu_us']:8.0f} {m['cpu_cost']:8.3f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reader_ab", description=__doc__.split("\n")[0]
    )
    parser.add_argument("revision", nargs="?", help="the git revision to compare with, e.g. main")
    parser.add_argument("--images", type=int, default=None, help="images per dataset (1000)")
    parser.add_argument("--processes", type=int, default=None, help="processes per side (4)")
    parser.add_argument("--pairs", type=int, default=None, help="pairs per process (3)")
    parser.add_argument("--quick", action="store_true", help="16 tiny images, batches of 8")
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "build", "bench-reader-ab"), help="scratch folder"
    )
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.worker:
        plain, targets, pairs, batch_size, batches, result = args.worker
        out = worker(plain, targets, int(pairs), int(batch_size), int(batches))
        with open(result, "w") as f:
            json.dump(out, f)
        return 0
    if not args.revision:
        parser.error("the revision to compare with is required")
    images = args.images or (16 if args.quick else 1000)
    batch_size = 8 if args.quick else reader_bench.BATCH_SIZE
    batches = 2 if args.quick else reader_bench.TARGET_VARIANTS[0].batches
    load_before = machine.load_average()
    medians = compare(
        args.revision,
        images=images,
        processes=args.processes or (1 if args.quick else 4),
        pairs=args.pairs or (1 if args.quick else 3),
        batch_size=batch_size,
        batches=batches,
        scratch=os.path.abspath(args.out),
        quick=args.quick,
    )
    print(
        f"{images} images, batches of {batch_size}, medians of pairs; load average "
        f"{load_before} before, {machine.load_average()} after"
    )
    print(report(args.revision, medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
